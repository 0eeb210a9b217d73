#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into fuzz/corpus/<target>/ (stdlib only).

Seeds are small real files (the labelme-examples data that scripts/setup installs) and hand-made
malformed ones: truncated, huge lengths, negative or overflowing offsets, wrong dtypes, shape/size
mismatches. Rerun after changing it; the output is committed (kept well under 2 MB in total).
"""
import json
import os
import shutil
import struct
import sys
import zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
EX = "/usr/share/doc/labelme-examples/examples"


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def real(path):
    with open(os.path.join(EX, path), "rb") as f:
        return f.read()


# ---------------------------------------------------------------- safetensors
def st(header, data=b"", hlen=None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


def safetensors():
    t = "safetensors"
    f32 = struct.pack("<4f", 1, -2, 3.5, 0)
    put(t, "valid_f32", st({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, f32))
    put(t, "valid_mixed", st({"__metadata__": {"format": "pt"},
                              "a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                              "b": {"dtype": "F16", "shape": [1, 1], "data_offsets": [4, 6]},
                              "c": {"dtype": "I64", "shape": [1], "data_offsets": [6, 14]},
                              "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [14, 14]}}, bytes(range(14))))
    put(t, "valid_scalar", st({"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}, f32[:4]))
    ok = {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    put(t, "truncated_data", st(ok, f32[:9]))
    put(t, "truncated_header", st(ok, f32)[:20])
    put(t, "short_file", b"\x05\x00\x00")
    put(t, "header_len_zero", st(b"", b"", 0))
    put(t, "header_len_huge", st(ok, f32, 0xFFFFFFFFFFFFFFFF))
    put(t, "header_len_past_end", st(ok, f32, 1000))
    put(t, "negative_offset", st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}, f32))
    put(t, "overflow_offset", st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [18446744073709551612, 18446744073709551616]}}, f32))
    put(t, "reversed_offsets", st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}}, f32))
    put(t, "overlap", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, f32[:12]))
    put(t, "hole", st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                       "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, f32[:12]))
    put(t, "trailing_bytes", st(ok, f32 + b"xx"))
    put(t, "shape_mismatch", st({"a": {"dtype": "F32", "shape": [3, 2], "data_offsets": [0, 16]}}, f32))
    put(t, "shape_overflow", st({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}}))
    put(t, "shape_negative", st({"a": {"dtype": "F32", "shape": [-1, -16], "data_offsets": [0, 16]}}, f32))
    put(t, "shape_float", st({"a": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 16]}}, f32))
    put(t, "wrong_dtype", st({"a": {"dtype": "F33", "shape": [4], "data_offsets": [0, 16]}}, f32))
    put(t, "unreadable_dtype", st({"a": {"dtype": "F8_E4M3", "shape": [16], "data_offsets": [0, 16]}}, f32))
    put(t, "dup_keys", b'\x38\x00\x00\x00\x00\x00\x00\x00' + b'{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"a":1}    '[:56] + f32[:4])
    put(t, "not_object", st([1, 2, 3]))
    put(t, "bad_json", st(b'{"a": {"dtype": "F32", "shape": [1', f32))
    put(t, "metadata_not_string", st({"__metadata__": {"k": 1}}, b""))
    put(t, "extra_field", st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 0}}, f32[:4]))


# ---------------------------------------------------------------- PNG
def chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png(w, h, depth, ctype, rows, plte=None, trns=None, interlace=0, ihdr_w=None, ihdr_h=None):
    sig = b"\x89PNG\r\n\x1a\n"
    out = sig + chunk(b"IHDR", struct.pack(">IIBBBBB", ihdr_w or w, ihdr_h or h, depth, ctype, 0, 0, interlace))
    if plte:
        out += chunk(b"PLTE", plte)
    if trns:
        out += chunk(b"tRNS", trns)
    raw = b"".join(b"\x00" + r for r in rows)
    return out + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def pngs(t, mask):
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
    w, h = 5, 3
    for ctype in (0, 2, 3, 4, 6):
        for depth in (1, 2, 4, 8, 16):
            if (ctype in (2, 4, 6) and depth < 8) or (ctype == 3 and depth == 16):
                continue
            bits = w * channels[ctype] * depth
            rows = [bytes((17 * (x + y)) & 0xFF for x in range((bits + 7) // 8)) for y in range(h)]
            plte = bytes(range(48)) if ctype == 3 else None
            put(t, f"c{ctype}_d{depth}", png(w, h, depth, ctype, rows, plte))
    rows8 = [bytes([y, y + 1, y + 2, 200, 255]) for y in range(h)]
    put(t, "palette_trns", png(w, h, 8, 3, rows8, bytes(range(256)) * 3, b"\x00\x80"))
    put(t, "gray_interlaced", png(w, h, 8, 0, rows8, interlace=1))
    put(t, "huge_dims", png(w, h, 8, 0, rows8, ihdr_w=65535, ihdr_h=65535))
    put(t, "zero_width", png(w, h, 8, 0, rows8, ihdr_w=0))
    put(t, "dims_mismatch", png(w, h, 8, 0, rows8, ihdr_h=40))
    good = png(w, h, 8, 0, rows8)
    put(t, "truncated_idat", good[:len(good) - 20])
    put(t, "truncated_ihdr", good[:20])
    put(t, "bad_crc", good[:29] + b"\x00" + good[30:])
    put(t, "palette_index_out_of_range", png(w, h, 8, 3, [bytes([250] * w)] * h, bytes(range(12))))
    if mask:
        put(t, "voc_class", real("instance_segmentation/data_dataset_voc/SegmentationClassPNG/2011_000025.png"))
        put(t, "voc_object", real("instance_segmentation/data_dataset_voc/SegmentationObjectPNG/2011_000003.png"))
        # .npy masks take the other branch of read_label_map.
        put(t, "npy_i4", npy("<i4", (2, 3), struct.pack("<6i", 0, 1, 2, 255, 0, 1)))
        put(t, "npy_u1", npy("|u1", (3, 2), bytes([0, 1, 2, 3, 4, 255])))
        put(t, "npy_b1", npy("|b1", (2, 2), bytes([0, 1, 1, 0])))
        put(t, "npy_i8_big", npy("<i8", (1, 2), struct.pack("<2q", 1 << 40, -1)))
        put(t, "npy_3d", npy("<i4", (1, 1, 2), struct.pack("<2i", 0, 1)))
        put(t, "npy_f4", npy("<f4", (1, 2), struct.pack("<2f", 0.5, 1)))
        put(t, "npy_empty", npy("<i4", (0, 5), b""))
        put(t, "npy_huge_shape", npy("|u1", (1 << 20, 1 << 20), b""))
    else:
        put(t, "voc_class", real("instance_segmentation/data_dataset_voc/SegmentationClassPNG/2011_000025.png"))


# ---------------------------------------------------------------- JPEG
def jpegs():
    t = "jpeg"
    a = real("primitives/primitives.jpg")
    b = real("instance_segmentation/data_dataset_voc/SegmentationObjectVisualization/2011_000006.jpg")
    put(t, "primitives", a)
    put(t, "voc_vis", b)
    put(t, "truncated_half", a[: len(a) // 2])
    put(t, "truncated_header", a[:300])
    put(t, "corrupt_scan", a[:2000] + bytes(64) + a[2064:4000])
    put(t, "soi_only", b"\xff\xd8\xff")
    # SOF0 claiming 65500 x 65500 (over the pixel limit) after the original tables.
    i = a.find(b"\xff\xc0")
    if i > 0:
        put(t, "huge_sof", a[: i + 5] + struct.pack(">HH", 65500, 65500) + a[i + 9:])
        put(t, "zero_sof", a[: i + 5] + struct.pack(">HH", 0, 16) + a[i + 9:])


# ---------------------------------------------------------------- npy
def npy(descr, shape, data, version=(1, 0), header=None, hlen=None):
    if header is None:
        s = "(" + "".join(f"{d}, " for d in shape).rstrip(" ") + ")" if len(shape) != 1 else f"({shape[0]},)"
        header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, s)
    h = header.encode() + b"\n"
    if version[0] == 1:
        return b"\x93NUMPY" + bytes(version) + struct.pack("<H", len(h) if hlen is None else hlen) + h + data
    return b"\x93NUMPY" + bytes(version) + struct.pack("<I", len(h) if hlen is None else hlen) + h + data


def npys():
    t = "npy"
    put(t, "f4_2x3", npy("<f4", (2, 3), struct.pack("<6f", *range(6))))
    put(t, "f2", npy("<f2", (3,), struct.pack("<3e", 1, -2, 65504)))
    put(t, "f8", npy("<f8", (2,), struct.pack("<2d", 1e300, -0.0)))
    put(t, "i1", npy("|i1", (4,), bytes([0, 127, 128, 255])))
    put(t, "i2", npy("<i2", (2,), struct.pack("<2h", -32768, 7)))
    put(t, "u8", npy("<u8", (1,), struct.pack("<Q", 2 ** 64 - 1)))
    put(t, "b1", npy("|b1", (2, 1), b"\x00\x01"))
    put(t, "scalar", npy("<i4", (), struct.pack("<i", 42)))
    put(t, "v2", npy("<i4", (1,), struct.pack("<i", 1), version=(2, 0)))
    put(t, "v3_utf8", npy("<i4", (1,), struct.pack("<i", 1), version=(3, 0)))
    put(t, "real_header_truncated",
        real("semantic_segmentation/data_dataset_voc/SegmentationClass/2011_000003.npy")[:4096])
    put(t, "fortran", npy("<f4", (1,), b"\0" * 4, header="{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }"))
    put(t, "big_endian", npy(">f4", (1,), b"\0" * 4))
    put(t, "wrong_dtype", npy("<c8", (1,), b"\0" * 8))
    put(t, "object_dtype", npy("|O", (1,), b"\0" * 8))
    put(t, "shape_mismatch", npy("<f4", (3, 3), b"\0" * 16))
    put(t, "shape_overflow", npy("<f4", (2 ** 40, 2 ** 40, 2 ** 40), b""))
    put(t, "shape_negative", npy("<f4", (1,), b"", header="{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }"))
    put(t, "shape_long_digits", npy("<f4", (1,), b"", header="{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,), }"))
    put(t, "header_len_huge", npy("<f4", (1,), b"\0" * 4, hlen=0xFFFF))
    put(t, "header_len_huge_v2", npy("<f4", (1,), b"\0" * 4, version=(2, 0), hlen=0xFFFFFFFF))
    put(t, "no_newline", b"\x93NUMPY\x01\x00\x04\x00{}  ")
    put(t, "unterminated", npy("<f4", (1,), b"", header="{'descr': '<f4"))
    put(t, "unknown_key", npy("<f4", (1,), b"", header="{'descr': '<f4', 'x': 1, 'shape': (), }"))
    put(t, "bad_version", b"\x93NUMPY\x09\x00\x04\x00{}  \n")
    put(t, "magic_only", b"\x93NUMPY")


# ---------------------------------------------------------------- COCO
def cocos():
    t = "coco"
    put(t, "labelme_annotations", real("instance_segmentation/data_dataset_coco/annotations.json"))
    img = [{"id": 1, "file_name": "a.jpg", "width": 4, "height": 3}]
    cats = [{"id": 0, "name": "_background_"}, {"id": 5, "name": "cat"}]
    def doc(anns, images=img, categories=cats):
        return json.dumps({"images": images, "categories": categories, "annotations": anns})
    put(t, "polygon", doc([{"id": 1, "image_id": 1, "category_id": 5, "segmentation": [[0, 0, 4, 0, 4, 3, 0.5, 2.5]]}]))
    put(t, "rle_list", doc([{"id": 1, "image_id": 1, "category_id": 5, "iscrowd": 1,
                             "segmentation": {"size": [3, 4], "counts": [2, 5, 5]}}]))
    put(t, "rle_string", doc([{"id": 1, "image_id": 1, "category_id": 5, "iscrowd": 1,
                               "segmentation": {"size": [3, 4], "counts": "25=0"}}]))
    put(t, "rle_bad_sum", doc([{"image_id": 1, "category_id": 5, "segmentation": {"size": [3, 4], "counts": [2, 5]}}]))
    put(t, "rle_negative", doc([{"image_id": 1, "category_id": 5, "segmentation": {"size": [3, 4], "counts": [-1, 13]}}]))
    put(t, "rle_string_bad", doc([{"image_id": 1, "category_id": 5, "segmentation": {"size": [3, 4], "counts": "oooooooooooooo"}}]))
    put(t, "rle_size_mismatch", doc([{"image_id": 1, "category_id": 5, "segmentation": {"size": [4, 3], "counts": [12]}}]))
    put(t, "polygon_odd", doc([{"image_id": 1, "category_id": 5, "segmentation": [[0, 0, 1, 1, 2]]}]))
    put(t, "polygon_outside", doc([{"image_id": 1, "category_id": 5, "segmentation": [[0, 0, 1e9, 0, 0, 1e308]]}]))
    put(t, "polygon_nan", '{"images":[{"id":1,"file_name":"a","width":2,"height":2}],"annotations":'
                          '[{"image_id":1,"category_id":1,"segmentation":[[0,0,1,NaN,1,1]]}]}')
    put(t, "huge_image", doc([], images=[{"id": 1, "file_name": "a", "width": 1 << 40, "height": 1 << 40}]))
    put(t, "negative_size", doc([], images=[{"id": 1, "file_name": "a", "width": -4, "height": 3}]))
    put(t, "dup_image", doc([], images=img + img))
    put(t, "missing_image", doc([{"image_id": 9, "category_id": 5, "segmentation": []}]))
    put(t, "category_range", doc([{"image_id": 1, "category_id": 4294967296, "segmentation": []}], categories=[]))
    put(t, "wrong_types", '{"images": {"id": 1}, "annotations": "x"}')
    put(t, "truncated", doc([])[:40])
    put(t, "not_json", "\x00\xff{")


# ---------------------------------------------------------------- CLI strings
def strings():
    for s in ["full", "causal", "window:64,64", "window:8", "window:0,0", "chunk:64", "blocks:0.5",
              "blocks:0.25@64", "blocks:1@1", "window:-1,3", "window:1e300", "window:nan", "chunk:0",
              "blocks:0@128", "blocks:2", "window:", "window:3,", ":", "", "causal:1", "chunk:1e9",
              "blocks:0.5@0", "window:9223372036854775807"]:
        put("pattern_spec", "s%02d" % len(os.listdir(os.path.join(ROOT, "pattern_spec"))) if os.path.isdir(
            os.path.join(ROOT, "pattern_spec")) else "s00", s)
    for s in ["ariadne", "mimo", "full+sink", "4x(4xR+ 3xC+ F)", "3x(F 4xR+ 4xC+) F", "32xF", "R-C_Q W F+",
              "((R))", "2x(2x(2xR))", "1025xR", "0xR", "4x", "4x ", "(", ")", "()", "R)", "4xZ", "x",
              "1024x(1024xR)", "((((((((((((((((((((R))))))))))))))))))))", "99999999999999999999xR"]:
        d = os.path.join(ROOT, "schedule")
        put("schedule", "s%02d" % (len(os.listdir(d)) if os.path.isdir(d) else 0), s)


# ---------------------------------------------------------------- CLI command lines
def cli_options():
    # fuzz_cli_options: one command line per seed, words separated by NUL bytes, against its table.
    lines = [
        [], ["--tokens", "256"], ["--tokens=256"], ["--tokens", "256abc"], ["--tokens"], ["--tokens", "--json"],
        ["--tokens", "99999999999999999999"], ["--tokens", "-1"], ["--tokens", "1", "--tokens", "2"],
        ["--heads", "-4"], ["--heads", "4294967298"], ["--ids", "1,2,3"], ["--ids", "1,,3"], ["--ids", ","],
        ["--tau", "0.9"], ["--tau", "0.9x"], ["--tau", "0"], ["--tau", "nan"], ["--tau", "1e-320"],
        ["--scale", "inf"], ["--scale", "-1e308"], ["--depth", "0,0.5,1"], ["--depth", "1.5"],
        ["--json"], ["--json", "no"], ["--json", "false"], ["--json", "maybe"], ["--json=yes"], ["--json="],
        ["--stage-times", "0"], ["--backend", "cuda"], ["--backend", "gpu"], ["--method", "dense,rr,oracle"],
        ["--method", "rr,"], ["--grid", "4x8"], ["--grid", "4294967300x8"], ["--grid", "99999999999x8"],
        ["--grid", "0x8"], ["--grid", "4X8"], ["--grid", "x"], ["--grids", "1x1,4096x4096"],
        ["--heatmap-layers", "3"], ["--mode"], ["--mode", "some"], ["--mode", "--json"],
        ["--protect", "sink+diagonal"], ["--protect", "a!b"], ["--name", ""], ["--name", "a b"],
        ["--weights", "/nonexistent/w.safetensors"], ["--weights", "/dev/null"], ["--weights", "/"],
        ["--image", ".,/"], ["--image", "/nonexistent"],
        ["--threads", "100000"], ["--threads", "0"], ["--threads", "16"], ["--tokn", "3"], ["--", "3"], ["-x"],
        ["positional"], ["--tokens", "1", "--tau", "0.5", "--method", "rr,xattn", "--grid", "2x3", "--json"],
    ]
    for i, words in enumerate(lines):
        put("cli_options", "s%02d" % i, b"\0".join(w.encode() for w in words))


def gstr(b):
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, tensors, version=3, align=32, tensor_count=None, kv_count=None):
    """A GGUF file: kvs = [(key, type, encoded value)], tensors = [(name, dims, type, data)]."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if tensor_count is None else tensor_count,
                                 len(kvs) if kv_count is None else kv_count)
    for key, vtype, value in kvs:
        head += gstr(key) + struct.pack("<I", vtype) + value
    data, infos = b"", b""
    for name, dims, ttype, blob in tensors:
        data += b"\0" * (-len(data) % align)
        infos += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", ttype, len(data))
        data += blob
    body = head + infos
    return body + b"\0" * (-len(body) % align) + data


def ggufs():
    t = "gguf"
    f32 = struct.pack("<4f", 1, -2, 3.5, 0)
    q8 = struct.pack("<e", 0.5) + bytes(range(32))           # one q8_0 block: f16 scale + 32 int8
    q4_1 = struct.pack("<ee", 0.25, -1.0) + bytes(range(16))  # one q4_1 block: scale, min, 16 bytes
    kvs = [(b"general.architecture", 8, gstr(b"llama")), (b"llama.block_count", 4, struct.pack("<I", 2)),
           (b"llama.rope.freq_base", 6, struct.pack("<f", 1e5)),
           (b"tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2) + gstr(b"a") + gstr(b"b"))]
    ok = gguf(kvs, [(b"w", [2, 2], 0, f32), (b"q", [32], 8, q8), (b"m", [32], 3, q4_1)])
    put(t, "valid", ok)
    put(t, "valid_v2_align64", gguf(kvs + [(b"general.alignment", 4, struct.pack("<I", 64))],
                                    [(b"w", [2, 2], 0, f32)], version=2, align=64))
    put(t, "truncated", ok[: len(ok) // 2])
    put(t, "bad_magic", b"GGUX" + ok[4:])
    put(t, "bad_version", gguf(kvs, [], version=9))
    put(t, "huge_kv_count", gguf(kvs, [], kv_count=1 << 62))
    put(t, "huge_tensor_count", gguf(kvs, [], tensor_count=1 << 62))
    put(t, "huge_string", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 60) + b"k")
    put(t, "bad_value_type", gguf([(b"k", 99, b"\0" * 8)], []))
    put(t, "nested_array", gguf([(b"k", 9, struct.pack("<IQ", 9, 1) + struct.pack("<IQ", 4, 1) + b"\1\0\0\0")], []))
    put(t, "unknown_tensor_type", gguf(kvs, [(b"w", [4], 77, f32)]))
    put(t, "shape_overflow", gguf(kvs, [(b"w", [1 << 40, 1 << 40], 0, f32)]))
    put(t, "data_past_end", gguf(kvs, [(b"w", [64], 0, f32)]))
    put(t, "bad_alignment", gguf(kvs + [(b"general.alignment", 4, struct.pack("<I", 3))], [(b"w", [4], 0, f32)]))


if __name__ == "__main__":
    if os.path.isdir(ROOT):
        shutil.rmtree(ROOT)
    safetensors()
    pngs("png", mask=False)
    pngs("mask_png", mask=True)
    jpegs()
    npys()
    cocos()
    strings()
    cli_options()
    ggufs()
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(ROOT) for f in fs)
    print(f"corpus: {total} bytes", file=sys.stderr)
