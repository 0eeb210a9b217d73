// PNG (libpng) and JPEG (libjpeg) decoding, PNG writing.
//
// Both libraries report fatal errors by longjmp. The rule kept here: every setjmp lives in a small
// C-style function whose locals are trivially destructible and whose state sits in a heap context
// owned by the C++ caller; the caller throws ariadne::Error only after that function returned, and
// RAII guards destroy the library structs. No longjmp ever skips a C++ destructor.
#include "ariadne/image.hpp"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

#include <jpeglib.h>
#include <png.h>

#include "ariadne/error.hpp"
#include "ariadne/file.hpp"

namespace ariadne {

namespace {

// Images are at most 2^28 pixels; no compressed file needs more than 1 GiB.
std::vector<uint8_t> read_file(const std::string& path) { return read_input_file(path, uint64_t(1) << 30); }

bool is_png(const uint8_t* d, size_t n) { return n >= 8 && png_sig_cmp(d, 0, 8) == 0; }
bool is_jpeg(const uint8_t* d, size_t n) { return n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF; }

void check_size(const std::string& name, uint64_t w, uint64_t h) {
  ARIADNE_CHECK(w > 0 && h > 0, name, ": image has size ", w, "x", h);
  ARIADNE_CHECK(w * h <= uint64_t(kMaxImagePixels), name, ": image of ", w, "x", h,
                " pixels exceeds the limit of ", kMaxImagePixels, " pixels");
}

// ---------------------------------------------------------------- PNG
// rgb: any PNG to 8-bit RGB. indexed: one 8-bit channel of palette indices or gray values (16-bit
// gray reduced to its high byte). values: the same at full depth, 16-bit gray kept whole.
enum class PngMode { rgb, indexed, values };

struct PngCtx {
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  PngMode mode = PngMode::rgb;
  png_structp png = nullptr;
  png_infop info = nullptr;
  char msg[256] = {};
  bool wrong_type = false;  // indexed mode on a colour or alpha image
  uint32_t width = 0, height = 0;
  int channels = 0;
  int sample_bytes = 1;  // after the transforms: 2 for 16-bit values mode
  size_t rowbytes = 0;
};

void png_on_error(png_structp p, png_const_charp m) {
  auto* c = static_cast<PngCtx*>(png_get_error_ptr(p));
  std::snprintf(c->msg, sizeof c->msg, "%s", m);
  png_longjmp(p, 1);
}
void png_on_warning(png_structp, png_const_charp) {}  // warnings (e.g. unknown chunks) are benign

void png_read_mem(png_structp p, png_bytep out, size_t n) {
  auto* c = static_cast<PngCtx*>(png_get_io_ptr(p));
  if (n > c->size - c->pos) png_error(p, "unexpected end of file (truncated PNG)");
  std::memcpy(out, c->data + c->pos, n);
  c->pos += n;
}

// Reads the header and installs the transforms of the mode. C-style frame (see the file comment).
bool png_header(PngCtx* c) {
  if (setjmp(png_jmpbuf(c->png))) return false;
  png_set_read_fn(c->png, c, png_read_mem);
  // Dimension limits checked by libpng itself before any allocation.
  png_set_user_limits(c->png, 1u << 16, 1u << 16);
  png_read_info(c->png, c->info);
  const int type = png_get_color_type(c->png, c->info);
  const int depth = png_get_bit_depth(c->png, c->info);
  if (c->mode == PngMode::rgb) {
    if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(c->png);
    if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(c->png);
    if (type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(c->png);
    if (type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(c->png);
  } else {
    if (type != PNG_COLOR_TYPE_PALETTE && type != PNG_COLOR_TYPE_GRAY) {
      c->wrong_type = true;
      return true;
    }
    if (depth < 8) png_set_packing(c->png);  // one value per byte, unscaled
  }
  if (depth == 16 && c->mode != PngMode::values) png_set_strip_16(c->png);
  png_set_interlace_handling(c->png);
  png_read_update_info(c->png, c->info);
  c->sample_bytes = png_get_bit_depth(c->png, c->info) == 16 ? 2 : 1;
  c->width = png_get_image_width(c->png, c->info);
  c->height = png_get_image_height(c->png, c->info);
  c->channels = png_get_channels(c->png, c->info);
  c->rowbytes = png_get_rowbytes(c->png, c->info);
  return true;
}

bool png_body(PngCtx* c, png_bytep* rows) {
  if (setjmp(png_jmpbuf(c->png))) return false;
  png_read_image(c->png, rows);
  png_read_end(c->png, nullptr);
  return true;
}

// Decoded rows, [height, width, channels] samples of sample_bytes each (16-bit ones big-endian,
// as PNG stores them).
struct PngPixels {
  int width = 0, height = 0, channels = 0, sample_bytes = 1;
  std::vector<uint8_t> bytes;
};

PngPixels decode_png_pixels(const uint8_t* data, size_t size, const std::string& name, PngMode mode) {
  auto c = std::make_unique<PngCtx>();
  c->data = data;
  c->size = size;
  c->mode = mode;
  c->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, c.get(), png_on_error, png_on_warning);
  ARIADNE_CHECK(c->png, name, ": cannot create a PNG decoder");
  c->info = png_create_info_struct(c->png);
  struct Guard {
    PngCtx* c;
    ~Guard() { png_destroy_read_struct(&c->png, c->info ? &c->info : nullptr, nullptr); }
  } guard{c.get()};
  ARIADNE_CHECK(c->info, name, ": cannot create a PNG decoder");
  ARIADNE_CHECK(png_header(c.get()), name, ": corrupt PNG (", c->msg, ")");
  ARIADNE_CHECK(!c->wrong_type, name, ": a mask PNG must be gray or palette (single channel), this one has colour or alpha");
  check_size(name, c->width, c->height);
  const int want = mode == PngMode::rgb ? 3 : 1;
  const int sb = mode == PngMode::values ? c->sample_bytes : 1;
  ARIADNE_CHECK(c->channels == want && c->rowbytes == size_t(c->width) * size_t(want) * size_t(sb), name,
                ": PNG decoded to ", c->channels, " channels, expected ", want);
  PngPixels px;
  px.width = int(c->width);
  px.height = int(c->height);
  px.channels = want;
  px.sample_bytes = sb;
  px.bytes.resize(size_t(c->height) * c->rowbytes);
  std::vector<png_bytep> rows(c->height);
  for (uint32_t y = 0; y < c->height; ++y) rows[y] = px.bytes.data() + size_t(y) * c->rowbytes;
  ARIADNE_CHECK(png_body(c.get(), rows.data()), name, ": corrupt PNG (", c->msg, ")");
  return px;
}

Image decode_png(const uint8_t* data, size_t size, const std::string& name, PngMode mode) {
  PngPixels px = decode_png_pixels(data, size, name, mode);
  Image img;
  img.width = px.width;
  img.height = px.height;
  img.channels = px.channels;
  img.pixels = std::move(px.bytes);
  return img;
}

// ---------------------------------------------------------------- JPEG
struct JpegCtx {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr err{};
  std::jmp_buf jmp{};
  char msg[JMSG_LENGTH_MAX] = {};
  int warnings = 0;
  bool created = false;
};

void jpeg_on_error(j_common_ptr ci) {
  auto* c = reinterpret_cast<JpegCtx*>(ci->client_data);
  ci->err->format_message(ci, c->msg);
  std::longjmp(c->jmp, 1);
}
// Warnings from libjpeg are corrupt-data reports (e.g. a truncated scan filled with gray): the
// first one is kept and turned into an error after decoding. Trace messages (level > 0) are ignored.
void jpeg_on_message(j_common_ptr ci, int level) {
  auto* c = reinterpret_cast<JpegCtx*>(ci->client_data);
  if (level < 0 && c->warnings++ == 0) ci->err->format_message(ci, c->msg);
}

bool jpeg_header(JpegCtx* c, const uint8_t* data, size_t size) {
  if (setjmp(c->jmp)) return false;
  jpeg_create_decompress(&c->cinfo);
  c->created = true;
  jpeg_mem_src(&c->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&c->cinfo, TRUE);
  c->cinfo.out_color_space = JCS_RGB;
  return true;
}

bool jpeg_body(JpegCtx* c, uint8_t* out, size_t stride) {
  if (setjmp(c->jmp)) return false;
  jpeg_start_decompress(&c->cinfo);
  while (c->cinfo.output_scanline < c->cinfo.output_height) {
    JSAMPROW row = out + size_t(c->cinfo.output_scanline) * stride;
    jpeg_read_scanlines(&c->cinfo, &row, 1);
  }
  jpeg_finish_decompress(&c->cinfo);
  return true;
}

Image decode_jpeg(const uint8_t* data, size_t size, const std::string& name) {
  auto c = std::make_unique<JpegCtx>();
  c->cinfo.err = jpeg_std_error(&c->err);
  c->err.error_exit = jpeg_on_error;
  c->err.emit_message = jpeg_on_message;
  c->cinfo.client_data = c.get();
  struct Guard {
    JpegCtx* c;
    ~Guard() {
      if (c->created) jpeg_destroy_decompress(&c->cinfo);
    }
  } guard{c.get()};
  ARIADNE_CHECK(jpeg_header(c.get(), data, size), name, ": corrupt JPEG (", c->msg, ")");
  ARIADNE_CHECK(c->cinfo.jpeg_color_space != JCS_CMYK && c->cinfo.jpeg_color_space != JCS_YCCK, name,
                ": CMYK JPEGs are not supported; convert the image to RGB");
  check_size(name, c->cinfo.image_width, c->cinfo.image_height);
  Image img;
  img.width = int(c->cinfo.image_width);
  img.height = int(c->cinfo.image_height);
  img.channels = 3;
  img.pixels.resize(size_t(img.width) * size_t(img.height) * 3);
  ARIADNE_CHECK(jpeg_body(c.get(), img.pixels.data(), size_t(img.width) * 3), name, ": corrupt JPEG (", c->msg, ")");
  ARIADNE_CHECK(c->cinfo.output_width == c->cinfo.image_width && c->cinfo.output_components == 3, name,
                ": JPEG decoded to an unexpected shape");
  ARIADNE_CHECK(c->warnings == 0, name, ": corrupt JPEG data (", c->msg, ")");
  return img;
}

}  // namespace

Image decode_image(const uint8_t* data, size_t size, const std::string& name) {
  if (is_png(data, size)) return decode_png(data, size, name, PngMode::rgb);
  if (is_jpeg(data, size)) return decode_jpeg(data, size, name);
  detail::fail(name, ": not a PNG or JPEG file (unknown signature, ", size, " bytes)");
}

Image read_image(const std::string& path) {
  return with_path_errors(path, "read the image", [&] {
    const std::vector<uint8_t> buf = read_file(path);
    return decode_image(buf.data(), buf.size(), path);
  });
}

Image read_png_indexed(const std::string& path) {
  return with_path_errors(path, "read the mask", [&] {
    const std::vector<uint8_t> buf = read_file(path);
    ARIADNE_CHECK(is_png(buf.data(), buf.size()), path, ": not a PNG file (mask files must be PNG)");
    return decode_png(buf.data(), buf.size(), path, PngMode::indexed);
  });
}

PngValues decode_png_values(const uint8_t* data, size_t size, const std::string& name) {
  ARIADNE_CHECK(is_png(data, size), name, ": not a PNG file (mask files must be PNG)");
  const PngPixels px = decode_png_pixels(data, size, name, PngMode::values);
  PngValues v;
  v.width = px.width;
  v.height = px.height;
  v.bit_depth = px.sample_bytes == 2 ? 16 : 8;
  const size_t n = size_t(px.width) * size_t(px.height);
  v.values.resize(n);
  if (px.sample_bytes == 2)
    for (size_t i = 0; i < n; ++i) v.values[i] = uint16_t((px.bytes[2 * i] << 8) | px.bytes[2 * i + 1]);
  else
    for (size_t i = 0; i < n; ++i) v.values[i] = px.bytes[i];
  return v;
}

PngValues read_png_values(const std::string& path) {
  return with_path_errors(path, "read the mask", [&] {
    const std::vector<uint8_t> buf = read_file(path);
    return decode_png_values(buf.data(), buf.size(), path);
  });
}

void write_png(const std::string& path, const Image& image) {
  ARIADNE_CHECK(image.channels == 1 || image.channels == 3 || image.channels == 4, path,
                ": cannot write a PNG of ", image.channels, " channels (1, 3 or 4)");
  check_size(path, uint64_t(image.width < 0 ? 0 : image.width), uint64_t(image.height < 0 ? 0 : image.height));
  ARIADNE_CHECK(image.pixels.size() == size_t(image.width) * size_t(image.height) * size_t(image.channels), path,
                ": image has ", image.pixels.size(), " bytes, expected width·height·channels = ",
                size_t(image.width) * size_t(image.height) * size_t(image.channels));
  // The simplified write API keeps its setjmp internal and reports failure as a return value.
  png_image pi;
  std::memset(&pi, 0, sizeof pi);
  pi.version = PNG_IMAGE_VERSION;
  pi.width = png_uint_32(image.width);
  pi.height = png_uint_32(image.height);
  pi.format = image.channels == 1 ? PNG_FORMAT_GRAY : image.channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
  // Encoded in memory, then written atomically (a failed write leaves an existing file as it was).
  png_alloc_size_t bytes = 0;
  int ok = png_image_write_to_memory(&pi, nullptr, &bytes, 0, image.pixels.data(), 0, nullptr);
  std::vector<uint8_t> encoded;
  if (ok) {
    encoded.resize(size_t(bytes));
    ok = png_image_write_to_memory(&pi, encoded.data(), &bytes, 0, image.pixels.data(), 0, nullptr);
  }
  const std::string msg = pi.message;
  png_image_free(&pi);
  ARIADNE_CHECK(ok, path, ": cannot encode PNG (", msg, ")");
  write_file_atomic(path, encoded.data(), size_t(bytes));
}

}  // namespace ariadne
