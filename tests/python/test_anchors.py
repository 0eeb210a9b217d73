"""Tests of the benchmark case list (bench/casespec.py), scripts/bench-report and, where torch is
installed, bench/anchors.py's smoke mode. Only the standard library and pytest are required:
the torch test is skipped without torch (CI has none; the GPU run checks anchors on the device).

    python3 -m pytest tests/python
"""

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import casespec as cs  # noqa: E402


def load_report():
    path = os.path.join(ROOT, "scripts", "bench-report")
    loader = importlib.machinery.SourceFileLoader("bench_report", path)
    spec = importlib.util.spec_from_loader("bench_report", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def brute_pairs(pattern, n):
    p = cs.Pattern(pattern)
    return sum(p.allowed(q, k) for q in range(n) for k in range(n))


@pytest.mark.parametrize("pattern", ["full", "causal", "window:64,64", "window:3,0", "window:0,5",
                                     "window:100,2", "chunk:64", "chunk:7"])
@pytest.mark.parametrize("n", [1, 2, 5, 63, 64, 65, 130, 200])
def test_allowed_pairs_match_brute_force(pattern, n):
    assert cs.allowed_pairs(pattern, n) == brute_pairs(pattern, n)


def test_blocks_pairs_and_count():
    # 4 blocks of 128: 10 causal blocks; F = 0.5 keeps floor(5.5) = 5: the 4 diagonal ones + 1.
    assert cs.blocks_kept_count(512, 0.5) == 5
    assert cs.allowed_pairs("blocks:0.5", 512) == 4 * 128 * 129 // 2 + 1 * 128 * 128
    # Never fewer than the diagonal, never more than the causal blocks.
    assert cs.blocks_kept_count(512, 0.01) == 4
    assert cs.allowed_pairs("blocks:1.0", 1024) == cs.allowed_pairs("causal", 1024)


def test_flops_of_the_issue_targets():
    # 896^2 full stack: 4 N^2 d H x 32 layers = 2.749 TFLOP (6.85 ms of cuDNN = 401 TFLOP/s).
    assert cs.stack_flops({"side": 896, "schedule": "full", "batch": 1}) == 4 * 4096 ** 2 * 80 * 16 * 32
    ariadne = cs.stack_flops({"side": 896, "schedule": "ariadne", "batch": 1})
    assert ariadne == 4 * 80 * 16 * (4 * 4096 ** 2 + 28 * cs.allowed_pairs("window:64,64", 4096))
    case = {"batch": 1, "tokens": 4096, "heads_q": 16, "heads_kv": 16, "dim": 80, "pattern": "full"}
    assert cs.attention_flops(case) == 4 * 4096 * 4096 * 80 * 16


def test_case_file_is_valid_and_complete():
    cases = cs.load_cases(os.path.join(ROOT, "bench", "cases.json"))
    ids = {c["id"] for c in cases}
    for n in (1024, 4096, 16384):
        for b in (1, 8):
            for s in ("full", "win64", "win64-sink", "chunk64"):
                assert f"vit-n{n}-b{b}-{s}" in ids
    for s in ("full", "chunk", "ariadne"):
        assert f"stack-{s}-896" in ids
    for n in (8192, 32768, 131072):
        assert f"llm-n{n}-causal" in ids
    for n in (32768, 131072):
        for f in ("0.1", "0.25", "0.5"):
            assert f"llm-n{n}-blocks{f}" in ids


@pytest.mark.parametrize("bad, field", [
    ({"pattern": "window:64"}, "pattern"),
    ({"sink": "logit"}, "sink"),
    ({"heads_kv": 3}, "heads_q"),
    ({"tokens": 1000, "pattern": "blocks:0.1"}, "tokens"),
    ({"dtype": "fp16"}, "dtype"),
    ({"batch": 0}, "batch"),
])
def test_bad_cases_name_the_field(bad, field):
    case = {"id": "x", "batch": 1, "tokens": 1024, "heads_q": 16, "heads_kv": 8, "dim": 80,
            "pattern": "full", "sink": "none", "dtype": "bf16"}
    case.update(bad)
    with pytest.raises(cs.CaseError, match=field):
        cs.validate(case)


def test_orders_are_permutations_and_windows_match_qwen():
    # SPEC C.1: a 14 x 16 patch grid gives cu_window_seqlens [0, 64, 128, 176, 224].
    assert cs.window_seqlens(14, 16) == [0, 64, 128, 176, 224]
    for kind in ("row", "col", "window"):
        perm = cs.order_permutation(kind, 14, 16)
        assert sorted(perm) == list(range(224))
        inv = cs.inverse(perm)
        assert [perm[inv[i]] for i in range(224)] == list(range(224))
    assert cs.order_permutation("row", 4, 4) == list(range(16))
    # 2 x 2 units: column order visits unit (0,0), (1,0), (0,1), (1,1), keeping each unit's 4 tokens.
    assert cs.order_permutation("col", 4, 4) == [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]
    # The first window of a 16 x 16 grid holds units (0..3, 0..3) in raster order.
    win = cs.order_permutation("window", 16, 16)
    assert win[:8] == [0, 1, 2, 3, 4, 5, 6, 7] and win[16:20] == [32, 33, 34, 35]


def test_stack_schedules():
    ari = cs.stack_layers("ariadne")
    assert len(ari) == 32
    assert [i for i, l in enumerate(ari) if l[0] == "full"] == [7, 15, 23, 31]
    assert [l[2] for l in ari[:8]] == ["row"] * 4 + ["col"] * 3 + [None]
    assert all(l[1] == "denominator" for l in ari if l[0] != "full")
    chunk = cs.stack_layers("chunk")
    assert [i for i, l in enumerate(chunk) if l[0] == "full"] == [7, 15, 23, 31]
    assert sum(l[0] == "chunk:64" for l in chunk) == 28


def write(path, data):
    with open(path, "w") as f:
        json.dump(data, f)


def test_report_table_ratios_and_markers(tmp_path):
    rep = load_report()
    anchors = [{"id": "env", "env": {"gpu": "G", "driver": "D", "torch": "T", "cudnn": 91900}},
               {"id": "vit-n4096-b1-full", "impl": "sdpa_cudnn", "ms": 0.2, "tflops": 400.0, "note": ""},
               {"id": "vit-n4096-b1-full", "impl": "flex", "ms": 0.4, "tflops": 200.0, "note": ""},
               {"id": "llm-n32768-blocks0.1", "impl": "sdpa_cudnn", "ms": None, "tflops": None,
                "note": "unsupported: no block-sparse"},
               {"id": "stack-full-896", "impl": "sdpa_cudnn", "ms": 6.0, "tflops": 458.0, "note": ""}]
    ours = [{"id": "vit-n4096-b1-full", "impl": "ariadne", "ms": 0.1, "tflops": 800.0, "note": ""},
            {"id": "stack-ariadne-896", "impl": "ariadne", "ms": 1.5, "tflops": 279.0, "note": ""}]
    write(tmp_path / "a.json", anchors)
    write(tmp_path / "o.json", ours)
    results = tmp_path / "RESULTS.md"
    # Sentinels no real history row contains (the report copies bench/history.md in).
    results.write_text("# Results\n\nSENTINEL-OUTSIDE\n\n<!-- gpu-table:begin -->\nSENTINEL-STALE-TABLE\n"
                       "<!-- gpu-table:end -->\nSENTINEL-TAIL\n")
    assert rep.main(["--anchors", str(tmp_path / "a.json"), "--ours", str(tmp_path / "o.json"),
                     "--results", str(results)]) == 0
    text = results.read_text()
    # The whole file is written: text outside the marked parts (old chapters) does not survive.
    assert "SENTINEL" not in text
    assert text.count("<!-- gpu-table:begin -->") == 1
    row = [line for line in text.splitlines() if line.startswith("| vit-n4096-b1-full")][0]
    assert "2.00×" in row and "4.00×" in row        # 0.2 / 0.1 and 0.4 / 0.1
    assert "cuDNN 9.19.0" in text and "driver D" in text
    assert "4.00× faster" in text                    # stack: 6.0 / 1.5
    assert "unsupported: no block-sparse" in text
    # A second run replaces the section instead of adding one.
    assert rep.main(["--anchors", str(tmp_path / "a.json"), "--results", str(results)]) == 0
    assert results.read_text().count("<!-- gpu-table:begin -->") == 1


def test_report_like_for_like_table(tmp_path):
    # ariadne's single-call time (timed as the anchors are) gets its own ratio beside the graph one.
    rep = load_report()
    anchors = [{"id": "vit-n4096-b1-win64", "impl": "flex", "ms": 0.04, "tflops": 70.0, "note": ""},
               {"id": "vit-n4096-b1-win64", "impl": "sdpa_flash", "ms": 0.05, "tflops": 60.0, "note": ""},
               {"id": "stack-full-896", "impl": "sdpa_cudnn", "ms": 6.0, "tflops": 458.0, "note": ""}]
    ours = [{"id": "vit-n4096-b1-win64", "impl": "ariadne", "ms": 0.02, "ms_single": 0.025, "tflops": 1.0},
            {"id": "vit-n1024-b1-full", "impl": "ariadne", "ms": 0.01, "tflops": 1.0},
            {"id": "stack-ariadne-896", "impl": "ariadne", "ms": 1.2, "ms_single": 1.5, "tflops": 1.0}]
    write(tmp_path / "a.json", anchors)
    write(tmp_path / "o.json", ours)
    assert rep.main(["--anchors", str(tmp_path / "a.json"), "--ours", str(tmp_path / "o.json"),
                     "--results", str(tmp_path / "R.md")]) == 0
    text = (tmp_path / "R.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| vit-n4096-b1-win64 | 0.0200 | 0.0250")]
    assert len(rows) == 1 and "2.00× / 1.60×" in rows[0]                  # 0.04 / 0.02, 0.04 / 0.025
    assert "graph / graph" not in text                                    # no anchor has ms_graph
    assert "| vit-n1024-b1-full | 0.0100 |" not in text                   # no ms_single: no row
    # The main table takes the single calls (like for like): 0.025 ms and 0.04 / 0.025.
    main = [line for line in text.splitlines() if line.startswith("| vit-n4096-b1-win64 | B1")][0]
    assert "0.0250" in main and main.endswith("| 1.60× (Flex) |") and "0.0200" not in main  # FA2: 0.05 / 0.025
    stack = [line for line in text.splitlines() if line.startswith("- ariadne schedule")][0]
    assert "1.500 ms as single calls" in stack and "4.00× faster" in stack and "1.200 ms: 5.00×" in stack


def test_report_graph_against_graph(tmp_path, capsys):
    # Anchors timed as graph replays too (anchors.py --graph): a graph-against-graph ratio per case.
    rep = load_report()
    anchors = [{"id": "vit-n4096-b1-win64", "impl": "flex_b64", "ms": 0.04, "ms_graph": 0.036, "tflops": 1.0},
               {"id": "vit-n4096-b1-win64", "impl": "sdpa_flash", "ms": 0.05, "ms_graph": 0.03, "tflops": 1.0},
               {"id": "stack-full-896", "impl": "sdpa_cudnn", "ms": 6.0, "ms_graph": 6.6, "tflops": 1.0}]
    ours = [{"id": "vit-n4096-b1-win64", "impl": "ariadne", "ms": 0.02, "ms_single": 0.025, "tflops": 1.0},
            {"id": "stack-ariadne-896", "impl": "ariadne", "ms": 1.2, "ms_single": 1.5, "tflops": 1.0}]
    write(tmp_path / "a.json", anchors)
    write(tmp_path / "o.json", ours)
    assert rep.main(["--anchors", str(tmp_path / "a.json"), "--ours", str(tmp_path / "o.json"), "--print"]) == 0
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.startswith("| vit-n4096-b1-win64 | 0.0200")][0]
    # best single call: flex_b64 0.04 (2.00× / 1.60×); best graph replay: FA2 0.03, 0.03 / 0.02 = 1.50×
    assert "2.00× / 1.60×" in row and "0.0300 (SDPA flash (FA2)) | 1.50× |" in row
    stack = [line for line in out.splitlines() if line.startswith("- ariadne schedule")][-1]
    assert "graph replays (6.600 ms): 5.50×" in stack                       # 6.6 / 1.2
    write(tmp_path / "bad.json", [{"id": "x", "impl": "flex", "ms": 0.1, "ms_graph": -1}])
    assert rep.main(["--anchors", str(tmp_path / "bad.json"), "--print"]) == 2
    assert "'ms_graph' must be a positive number" in capsys.readouterr().err


def test_report_memory_floor_table(tmp_path, capsys):
    # The floor table: ariadne's and the best anchor's times over the case's memory floor, both clocks.
    rep = load_report()
    anchors = [{"id": "vit-n4096-b1-win64", "impl": "flex_b64", "ms": 0.04, "ms_graph": 0.036, "tflops": 1.0},
               {"id": "vit-n4096-b1-win64", "impl": "sdpa_flash", "ms": 0.05, "ms_graph": 0.03, "tflops": 1.0}]
    ours = [{"id": "vit-n4096-b1-win64", "impl": "ariadne", "ms": 0.02, "ms_single": 0.025, "tflops": 1.0,
             "ms_floor": 0.012, "ms_floor_single": 0.0125, "floor_mb": 41.94},
            {"id": "vit-n1024-b1-win64", "impl": "ariadne", "ms": 0.01, "ms_single": 0.012, "tflops": 1.0}]
    write(tmp_path / "a.json", anchors)
    write(tmp_path / "o.json", ours)
    assert rep.main(["--anchors", str(tmp_path / "a.json"), "--ours", str(tmp_path / "o.json"), "--print"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| vit-n4096-b1-win64 | 41.9 MB")]
    # ours 0.025 / 0.0125 and 0.02 / 0.012; best single flex_b64 0.04 / 0.0125, best graph FA2 0.03 / 0.012
    assert rows == ["| vit-n4096-b1-win64 | 41.9 MB | 0.0125 / 0.0120 | 2.00 / 1.67 | 3.20 / 2.50 (Flex 64x64) |"]
    assert "| vit-n1024-b1-win64 | " not in "\n".join(l for l in out.splitlines() if "MB |" in l)  # no floor: no row
    write(tmp_path / "bad.json", [dict(ours[0], ms_floor=0)])
    assert rep.main(["--anchors", str(tmp_path / "a.json"), "--ours", str(tmp_path / "bad.json"), "--print"]) == 2
    assert "'ms_floor' must be a positive number" in capsys.readouterr().err


def test_report_rejects_bad_input(tmp_path, capsys):
    rep = load_report()
    write(tmp_path / "bad.json", [{"id": "x", "impl": "flex", "ms": -1}])
    assert rep.main(["--anchors", str(tmp_path / "bad.json"), "--print"]) == 2
    assert "'ms' must be a positive number" in capsys.readouterr().err
    write(tmp_path / "a.json", [])
    assert rep.main(["--anchors", str(tmp_path / "a.json"), "--ours", str(tmp_path / "none.json"),
                     "--print"]) == 2
    half = tmp_path / "R.md"
    half.write_text("<!-- gpu-table:begin -->\n")
    assert rep.main(["--anchors", str(tmp_path / "a.json"), "--results", str(half)]) == 2
    assert "only one of the markers" in capsys.readouterr().err


def estimate_records():
    common = {"kind": "estimate", "method": "rr", "block": 128, "tau": 0.95, "ms_dense": 200.0,
              "attention_kernel": "wgmma", "ms_sampling": 0.1, "ms_selection": 0.4, "ms_host_overhead": 0.3}
    return [dict(common, id="rr-n131072-s8", tokens=131072, stride=8, ms_estimate=8.0, ms_scoring=7.0,
                 ms_estimate_pooled=7.5, ms_attention=92.0, ms_total=100.0, ms_total_pooled=99.5, density=0.391),
            dict(common, id="rr-n32768-s8", tokens=32768, stride=8, ms_estimate=0.8, ms_scoring=0.5,
                 ms_attention=4.2, ms_total=5.0, ms_dense=12.0, density=0.351, mass_recall=0.9215, block_f1=0.509),
            {"id": "rr-n32768-s8", "kind": "estimate-scoring", "scoring": "mma3e", "ms_estimate": 0.9,
             "ms_scoring": 0.6, "vs_mma3_max_score_diff": 1.5e-7, "vs_mma3_rows_differ": 1, "rows": 8192}]


def test_report_estimate_table(tmp_path, capsys):
    # The block-sparse prefill table: every total against our dense kernel and each dense anchor.
    rep = load_report()
    write(tmp_path / "e.json", estimate_records())
    write(tmp_path / "ea.json", [{"id": "env", "env": {"gpu": "G", "date": "D0", "cudnn": 91900}},
                                 {"id": "llm-n131072-causal", "impl": "sdpa_cudnn", "ms": 250.0, "tflops": 1.0},
                                 {"id": "llm-n131072-causal", "impl": "sdpa_flash", "ms": 400.0, "tflops": 1.0},
                                 {"id": "llm-n32768-causal", "impl": "sdpa_cudnn", "ms": 15.0, "tflops": 1.0}])
    assert rep.main(["--estimate", str(tmp_path / "e.json"), "--estimate-anchors", str(tmp_path / "ea.json"),
                     "--print"]) == 0
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.startswith("| rr-n131072-s8 | 8.000")][0]
    # dense 200 / 100, cuDNN 250 / 100 (pooled 250 / 99.5), FA2 400 / 100
    assert "| 2.00× | 2.50× (2.51×) | 4.00× (4.02×) |" in row and "92.00 (wgmma)" in row
    short = [line for line in out.splitlines() if line.startswith("| rr-n32768-s8 | 0.800")][0]
    assert "| 2.40× | 3.00× | — |" in short and short.endswith("| 0.351 | 0.9215 | 0.509 |")  # no FA2 at 32K
    assert "Measured D0 on G" in out and "cuDNN 9.19.0" in out
    # A second scoring kernel on the same case: its own times and its differences to the first.
    assert "| rr-n32768-s8 | mma3e | 0.900 (0.600) | 1.5e-07 against mma3, 1 of 8192 |" in out
    write(tmp_path / "bad.json", [dict(estimate_records()[0], ms_total=0)])
    assert rep.main(["--estimate", str(tmp_path / "bad.json"), "--print"]) == 2
    assert "'ms_total' must be a positive number" in capsys.readouterr().err


def test_report_decode_table(tmp_path, capsys):
    # The decode table: bandwidth against the copy floor, each SDPA anchor's ratio, rr decode; an
    # anchor that refused the shape says so; a row without a positive time is refused by name.
    rep = load_report()
    ours = [dict(context=8192, batch=1, heads=32, kv_heads=8, head_dim=128, page=64, kv_bytes=32 << 20, sets=8,
                 ms_dense=0.02, dense_tbps=1.6777, ms_copy=0.03, copy_tbps=2.2369, dense_vs_copy=0.75, ms_floor=0.016,
                 tau=0.9,
                 density=0.125, ms_select=3.0, ms_sparse=0.005, sparse_speedup=4.0, sparse_out_rel_err=0.0123),
            dict(context=131072, batch=8, kv_bytes=4 << 30, ms_dense=1.0, dense_tbps=4.295, copy_tbps=4.24)]
    write(tmp_path / "d.json", ours)
    write(tmp_path / "da.json", {"env": {"gpu": "G", "date": "D1", "cudnn": 91900},
                                 "rows": [dict(impl="sdpa_cudnn", context=8192, batch=1, ms=0.05, tbps=0.67),
                                          dict(impl="sdpa_flash", context=8192, batch=1, unsupported="no"),
                                          dict(impl="flex", context=8192, batch=1, ms=0.1, tbps=0.34),
                                          dict(impl="sdpa_cudnn", context=131072, batch=8, ms=0.9, tbps=4.77)]})
    assert rep.main(["--decode", str(tmp_path / "d.json"), "--decode-anchors", str(tmp_path / "da.json"),
                     "--print"]) == 0
    out = capsys.readouterr().out
    short = [line for line in out.splitlines() if line.startswith("| 8192 | 1 |")][0]
    assert short == ("| 8192 | 1 | 32 | 0.0200 | 1.68 | 2.24 | 0.75 | 0.0160 | 0.80 | 3.12× | 0.0500 (0.67) | unsupported "
                     "| 0.1000 (0.34) | 2.50× | — | 5.00× | 0.90 | 0.125 | 0.0050 | 4.00× | 0.0123 |")
    long = [line for line in out.splitlines() if line.startswith("| 131072 | 8 |")][0]
    assert "| 4096 | 1.0000 | 4.29 | 4.24 | 1.01 | — | — | — | 0.9000 (4.77) | — | — | 0.90× | — | — | — |" in long
    assert "Measured D1 on G" in out and "cuDNN 9.19.0" in out
    write(tmp_path / "bad.json", [dict(ours[1], ms_dense=0)])
    assert rep.main(["--decode", str(tmp_path / "bad.json"), "--print"]) == 2
    assert "row 0: 'ms_dense' must be a positive number" in capsys.readouterr().err
    # Written into RESULTS.md between its markers; a later run without --decode keeps it.
    results, history = tmp_path / "R.md", tmp_path / "h.md"
    history.write_text("| date | change | figures |\n| --- | --- | --- |\n")
    args = ["--results", str(results), "--history", str(history)]
    assert rep.main(["--decode", str(tmp_path / "d.json")] + args) == 0
    text = results.read_text()
    assert "<!-- decode-table:begin -->" in text and "| 8192 | 1 | 32 | 0.0200 |" in text
    write(tmp_path / "e.json", estimate_records())
    assert rep.main(["--estimate", str(tmp_path / "e.json")] + args) == 0
    assert "| 8192 | 1 | 32 | 0.0200 |" in results.read_text()


def test_report_llm_decode_table(tmp_path, capsys):
    # The whole-step table: rows of several files in order, each speedup kernel by kernel / graph, the
    # machine line from the decode anchors of the same run; a row without a positive time is refused
    # by name; written between its markers and kept by a later run without --llm-decode.
    rep = load_report()
    row = dict(shape="smollm2-135m", context=8192, steps=64, tau=0.9, ms_graph_dense=2.0, ms_eager_dense=5.0,
               ms_graph_rr=2.5, ms_eager_rr=4.0, rr_density=0.8688, captures_dense=1, captures_rr=2)
    write(tmp_path / "l1.json", [row])
    write(tmp_path / "l2.json", [dict(row, shape="llama-1b", ms_eager_dense=3.0)])
    write(tmp_path / "d.json", [dict(context=8192, batch=1, kv_bytes=32 << 20, ms_dense=0.02, dense_tbps=1.6777,
                                     copy_tbps=2.2369)])
    write(tmp_path / "da.json", {"env": {"gpu": "G", "date": "D2", "driver": "580"}, "rows": []})
    assert rep.main(["--llm-decode", str(tmp_path / "l1.json"), str(tmp_path / "l2.json"), "--decode",
                     str(tmp_path / "d.json"), "--decode-anchors", str(tmp_path / "da.json"), "--print"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| smollm2-135m") or line.startswith("| llama-1b")]
    tail = " | 2.500 | 4.000 | 1.60× | 0.90 | 0.869 | 1 / 2 |"
    assert lines == ["| smollm2-135m | 8192 | 64 | 2.000 | 5.000 | 2.50×" + tail,
                     "| llama-1b | 8192 | 64 | 2.000 | 3.000 | 1.50×" + tail]
    assert "Measured D2 on G (driver 580)" in out
    write(tmp_path / "bad.json", [dict(row, ms_graph_rr=0)])
    assert rep.main(["--llm-decode", str(tmp_path / "bad.json"), "--print"]) == 2
    assert "row 0: 'ms_graph_rr' must be a positive number" in capsys.readouterr().err
    results, history = tmp_path / "R.md", tmp_path / "h.md"
    history.write_text("| date | change | figures |\n| --- | --- | --- |\n")
    args = ["--results", str(results), "--history", str(history)]
    assert rep.main(["--llm-decode", str(tmp_path / "l1.json")] + args) == 0
    assert "<!-- llm-decode-table:begin -->" in results.read_text()
    assert rep.main(["--decode", str(tmp_path / "d.json")] + args) == 0
    assert "| smollm2-135m | 8192 | 64 | 2.000 |" in results.read_text()


def test_report_writes_the_whole_file_and_keeps_history(tmp_path):
    # RESULTS.md is written whole: the generated parts, the kept part copied as it stands, and the
    # headline history from bench/history.md; a part without inputs in this call stays as it was.
    rep = load_report()
    write(tmp_path / "a.json", [{"id": "vit-n4096-b1-full", "impl": "sdpa_cudnn", "ms": 0.2, "tflops": 1.0}])
    write(tmp_path / "o.json", [{"id": "vit-n4096-b1-full", "impl": "ariadne", "ms": 0.1, "tflops": 1.0}])
    write(tmp_path / "e.json", estimate_records())
    history = tmp_path / "history.md"
    history.write_text("# Headline figures over time\n\nHow to add a row.\n\n| date | change | figures |\n"
                       "| --- | --- | --- |\n| 2026-11-29 | first kernel | full 0.59× cuDNN |\n")
    results = tmp_path / "RESULTS.md"
    results.write_text("# Old\n\n## Seventh session (2026-11-30): a dated chapter\n\nnotes\n\n"
                       "<!-- kept:begin -->\n### CPU table\n\n| a | b |\n|---|---|\n| 1 | 2 |\n<!-- kept:end -->\n")
    args = ["--results", str(results), "--history", str(history)]
    assert rep.main(["--anchors", str(tmp_path / "a.json"), "--ours", str(tmp_path / "o.json"),
                     "--estimate", str(tmp_path / "e.json"), "--source", "device-check on abc1234"] + args) == 0
    text = results.read_text()
    assert "dated chapter" not in text and "notes" not in text and "# Old" not in text
    assert "<!-- kept:begin -->\n### CPU table\n\n| a | b |\n|---|---|\n| 1 | 2 |\n<!-- kept:end -->" in text
    assert "<!-- history:begin -->\n| date | change | figures |\n| --- | --- | --- |\n" \
           "| 2026-11-29 | first kernel | full 0.59× cuDNN |\n<!-- history:end -->" in text
    assert "How to add a row" not in text                      # only the table is copied
    assert text.count("Produced by: device-check on abc1234.") == 2
    order = [text.index(m) for m in ("<!-- gpu-table:begin", "<!-- estimate-table:begin", "<!-- kept:begin",
                                     "<!-- history:begin")]
    assert order == sorted(order)
    first = text
    # A GPU-only run keeps the estimate table; a new history row appears on the next write.
    with open(history, "a") as f:
        f.write("| 2026-11-30 | second kernel | full 1.17× cuDNN |\n")
    assert rep.main(["--anchors", str(tmp_path / "a.json"), "--ours", str(tmp_path / "o.json")] + args) == 0
    text = results.read_text()
    est = lambda t: t[t.index("<!-- estimate-table:begin"):t.index("<!-- estimate-table:end")]
    assert est(text) == est(first) and "| rr-n131072-s8 | 8.000 (7.000)" in est(text)
    assert "| 2026-11-30 | second kernel | full 1.17× cuDNN |\n<!-- history:end -->" in text
    assert "Produced by: device-check on abc1234." in est(text) and text.count("Produced by:") == 1
    # Writing again with the same inputs gives the same file.
    again = text
    assert rep.main(["--anchors", str(tmp_path / "a.json"), "--ours", str(tmp_path / "o.json")] + args) == 0
    assert results.read_text() == again


def test_report_rejects_a_history_without_table(tmp_path, capsys):
    rep = load_report()
    write(tmp_path / "a.json", [])
    (tmp_path / "h.md").write_text("# no table here\n")
    assert rep.main(["--anchors", str(tmp_path / "a.json"), "--results", str(tmp_path / "R.md"),
                     "--history", str(tmp_path / "h.md")]) == 2
    assert "has no markdown table" in capsys.readouterr().err
    half = tmp_path / "R2.md"
    half.write_text("<!-- kept:begin -->\nx\n")
    assert rep.main(["--anchors", str(tmp_path / "a.json"), "--results", str(half)]) == 2
    assert "only one of the markers <!-- kept:begin -->" in capsys.readouterr().err


def test_committed_results_carry_every_part():
    # bench/RESULTS.md as committed: the four parts once each, no dated chapters.
    with open(os.path.join(ROOT, "bench", "RESULTS.md")) as f:
        text = f.read()
    for name in ("gpu-table", "estimate-table", "backward-table", "decode-table", "kept", "history"):
        assert text.count(f"<!-- {name}:begin -->") == 1 and text.count(f"<!-- {name}:end -->") == 1
    assert "session" not in text.lower().replace("device-session-check", "")


def test_anchors_smoke_on_cpu(tmp_path):
    """The whole anchor script on tiny shapes: every implementation against the fp32 reference,
    block masks against create_block_mask, pair counts against dense masks. Slow (~2 min)."""
    pytest.importorskip("torch")
    if os.environ.get("ARIADNE_SKIP_TORCH_SMOKE"):
        pytest.skip("ARIADNE_SKIP_TORCH_SMOKE set")
    out = tmp_path / "smoke.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "anchors.py"), "--device", "cpu",
                        "--smoke", "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = json.loads(out.read_text())
    assert recs[0]["id"] == "env"
    assert all(x["ms"] is not None or "block-sparse" in x["note"] for x in recs[1:])


def test_decode_anchors_smoke_on_cpu(tmp_path):
    """bench/anchors_decode.py on tiny CPU shapes: every anchor (SDPA, compiled FlexAttention with
    one query row) runs, is timed and matches the float64 reference; an unknown anchor is refused."""
    pytest.importorskip("torch")
    if os.environ.get("ARIADNE_SKIP_TORCH_SMOKE"):
        pytest.skip("ARIADNE_SKIP_TORCH_SMOKE set")
    script = os.path.join(ROOT, "bench", "anchors_decode.py")
    out = tmp_path / "decode.json"
    r = subprocess.run([sys.executable, script, "--smoke", "--out", str(out), "--contexts", "300", "--batches", "1,2",
                        "--heads", "4", "--kv-heads", "2", "--head-dim", "64"], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert {x["impl"] for x in doc["rows"]} == {"sdpa_cudnn", "sdpa_flash", "flex"} and len(doc["rows"]) == 6
    for x in doc["rows"]:
        assert x["ms"] > 0 and x["rel_err"] < 1e-5, x
    r = subprocess.run([sys.executable, script, "--smoke", "--out", str(out), "--impls", "flex,fa3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "unknown anchor 'fa3'" in r.stderr


def _mutated_run(tmp_path, monkeypatch, mutate, only, impls):
    """Runs anchors.main in-process on smoke cases after `mutate(anchors)`; returns its exit code."""
    torch = pytest.importorskip("torch")
    import anchors
    monkeypatch.setattr(anchors, "_MASK_MODS", {})
    mutate(anchors, torch, monkeypatch)
    return anchors.main(["--device", "cpu", "--smoke", "--only", only, "--impls", impls,
                         "--out", str(tmp_path / "m.json")])


def _swap_window(anchors, torch, mp):
    orig = anchors.mask_mod_for

    def swapped(p):
        if p.kind != "window":
            return orig(p)
        left, right = p.right, p.left
        return lambda b, h, q, k: (q - k <= left) & (k - q <= right)
    mp.setattr(anchors, "mask_mod_for", swapped)


def _sink_sign(anchors, torch, mp):
    def wrong(o, lse, s):
        return (o.float() * torch.sigmoid(s[None, :, None] - lse)[..., None]).to(o.dtype)
    mp.setattr(anchors, "_sink_correct_c", wrong)


def _lse_base2(anchors, torch, mp):
    orig = anchors._varlen_emulated

    def base2(*a, **k):
        o, lse = orig(*a, **k)
        return o, lse / 0.6931471805599453
    mp.setattr(anchors, "_varlen_emulated", base2)


def _one_block(anchors, torch, mp):
    orig = anchors.block_classes

    def flipped(spec, bs, kept):
        c = orig(spec, bs, kept).clone()
        if spec.pattern.kind == "blocks":
            c[:, 3, 0] = 2 - c[:, 3, 0]
        return c
    mp.setattr(anchors, "block_classes", flipped)


@pytest.mark.parametrize("mutate, only, impls", [
    (_swap_window, "smoke-win", "flex"),
    (_sink_sign, "smoke-win-sink", "sdpa_cudnn,sdpa_flash"),
    (_lse_base2, "smoke-win-sink", "sdpa_flash"),
    (_one_block, "smoke-blocks", "flex"),
])
def test_anchor_check_catches_misconfiguration(tmp_path, monkeypatch, mutate, only, impls):
    """A misconfigured anchor must fail its fp32 check instead of producing a (fast) time."""
    if os.environ.get("ARIADNE_SKIP_TORCH_SMOKE"):
        pytest.skip("ARIADNE_SKIP_TORCH_SMOKE set")
    assert _mutated_run(tmp_path, monkeypatch, mutate, only, impls) == 1
    recs = json.loads((tmp_path / "m.json").read_text())[1:]
    assert recs and all("WRONG RESULT" in r["note"] for r in recs if r["id"] == only)
