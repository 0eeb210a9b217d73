// .npy reader and writer (format in include/ariadne/npy.hpp). The header is a Python literal;
// rather than a general parser, a small tokenizer accepts exactly what NumPy writes (and
// reasonable hand-written variants: either quote style, any spacing, trailing commas).
#include "ariadne/npy.hpp"

#include <cctype>
#include <cstring>
#include <limits>

#include "ariadne/error.hpp"
#include "ariadne/file.hpp"
#include "ariadne/tensor.hpp"

namespace ariadne {

namespace {

// Cursor over the header dict text.
struct HeaderParser {
  const std::string& text;
  const std::string& file;
  size_t pos = 0;

  [[noreturn]] void fail(const std::string& what) const {
    detail::fail(file, ": header: ", what, " (at character ", pos, " of \"", text, "\")");
  }
  void skip_space() {
    while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  }
  bool accept(char c) {
    skip_space();
    if (pos < text.size() && text[pos] == c) {
      ++pos;
      return true;
    }
    return false;
  }
  void expect(char c, const char* what) {
    if (!accept(c)) fail(std::string("expected '") + c + "' " + what);
  }
  std::string string_literal(const char* what) {
    skip_space();
    if (pos >= text.size() || (text[pos] != '\'' && text[pos] != '"')) fail(std::string("expected a quoted ") + what);
    const char q = text[pos++];
    const size_t end = text.find(q, pos);
    if (end == std::string::npos) fail(std::string("unterminated ") + what);
    std::string s = text.substr(pos, end - pos);
    pos = end + 1;
    return s;
  }
  bool boolean() {
    skip_space();
    if (text.compare(pos, 4, "True") == 0) {
      pos += 4;
      return true;
    }
    if (text.compare(pos, 5, "False") == 0) {
      pos += 5;
      return false;
    }
    fail("'fortran_order' must be True or False");
  }
  std::vector<int64_t> shape_tuple() {
    expect('(', "to open 'shape'");
    std::vector<int64_t> shape;
    while (!accept(')')) {
      skip_space();
      const size_t start = pos;
      while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
      if (pos == start) fail("'shape' entry " + std::to_string(shape.size()) + " is not a non-negative integer");
      if (pos - start > 18) fail("'shape' entry " + std::to_string(shape.size()) + " is too large");
      shape.push_back(std::stoll(text.substr(start, pos - start)));
      if (pos < text.size() && text[pos] == 'L') ++pos;  // Python 2 longs
      if (!accept(',')) {
        expect(')', "to close 'shape'");
        break;
      }
    }
    return shape;
  }
};

uint32_t read_le(const uint8_t* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

int64_t NpyArray::numel() const { return checked_numel(shape, name, ": shape"); }

std::vector<float> NpyArray::to_float() const {
  const int64_t n = numel();
  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* p = data.data();
  for (int64_t i = 0; i < n; ++i, p += itemsize) {
    float v = 0;
    if (kind == 'f' && itemsize == 4) {
      std::memcpy(&v, p, 4);
    } else if (kind == 'f' && itemsize == 2) {
      uint16_t h;
      std::memcpy(&h, p, 2);
      v = f16_to_float(h);
    } else if (kind == 'f' && itemsize == 8) {
      double d;
      std::memcpy(&d, p, 8);
      v = float(d);
    } else if (kind == 'u' || kind == 'b') {
      uint64_t u = 0;
      std::memcpy(&u, p, size_t(itemsize));
      v = float(u);
    } else {  // signed, sign-extend from itemsize bytes
      int64_t s = 0;
      std::memcpy(&s, p, size_t(itemsize));
      const int shift = 64 - 8 * itemsize;
      v = float((s << shift) >> shift);
    }
    out[size_t(i)] = v;
  }
  return out;
}

std::vector<int32_t> NpyArray::to_int32() const {
  ARIADNE_CHECK(kind != 'f', name, ": dtype ", descr, " is a float type, expected an integer or bool array");
  const int64_t n = numel();
  std::vector<int32_t> out(static_cast<size_t>(n));
  const uint8_t* p = data.data();
  for (int64_t i = 0; i < n; ++i, p += itemsize) {
    int64_t v = 0;
    if (kind == 'i') {
      std::memcpy(&v, p, size_t(itemsize));
      const int shift = 64 - 8 * itemsize;
      v = (v << shift) >> shift;
    } else {
      uint64_t u = 0;
      std::memcpy(&u, p, size_t(itemsize));
      ARIADNE_CHECK(u <= uint64_t(std::numeric_limits<int32_t>::max()), name, ": element ", i, " is ", u,
                    ", outside the int32 range");
      v = int64_t(u);
    }
    ARIADNE_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(), name,
                  ": element ", i, " is ", v, ", outside the int32 range");
    out[size_t(i)] = int32_t(v);
  }
  return out;
}

NpyArray parse_npy(const uint8_t* data, size_t size, const std::string& name) {
  static const uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  ARIADNE_CHECK(size >= 10 && std::memcmp(data, kMagic, 6) == 0, name,
                ": magic: not a .npy file (expected the bytes \\x93NUMPY at the start)");
  const int major = data[6], minor = data[7];
  ARIADNE_CHECK((major == 1 || major == 2 || major == 3) && minor == 0, name, ": version: ", major, ".", minor,
                ", expected 1.0, 2.0 or 3.0");
  const int len_bytes = major == 1 ? 2 : 4;
  ARIADNE_CHECK(size >= size_t(8 + len_bytes), name, ": header length: file ends after ", size, " bytes");
  const size_t header_len = read_le(data + 8, len_bytes);
  const size_t data_start = size_t(8 + len_bytes) + header_len;
  ARIADNE_CHECK(data_start <= size, name, ": header length: ", header_len, " bytes, but the file has only ",
                size - size_t(8 + len_bytes), " after the length field");
  const std::string text(reinterpret_cast<const char*>(data + 8 + len_bytes), header_len);
  ARIADNE_CHECK(!text.empty() && text.back() == '\n', name, ": header: does not end with a newline");

  NpyArray a;
  a.name = name;
  HeaderParser hp{text, name};
  bool have_descr = false, have_order = false, have_shape = false, fortran = false;
  hp.expect('{', "to open the header dict");
  while (!hp.accept('}')) {
    const std::string key = hp.string_literal("key");
    hp.expect(':', "after a key");
    if (key == "descr") {
      a.descr = hp.string_literal("'descr' value");
      have_descr = true;
    } else if (key == "fortran_order") {
      fortran = hp.boolean();
      have_order = true;
    } else if (key == "shape") {
      a.shape = hp.shape_tuple();
      have_shape = true;
    } else {
      hp.fail("unknown key '" + key + "', expected only 'descr', 'fortran_order', 'shape'");
    }
    if (!hp.accept(',')) {
      hp.expect('}', "to close the header dict");
      break;
    }
  }
  ARIADNE_CHECK(have_descr, name, ": header: missing key 'descr'");
  ARIADNE_CHECK(have_order, name, ": header: missing key 'fortran_order'");
  ARIADNE_CHECK(have_shape, name, ": header: missing key 'shape'");
  ARIADNE_CHECK(!fortran, name, ": fortran_order: True is not supported, expected a C-order array (save it with "
                "numpy.ascontiguousarray)");

  // descr: byte order, kind, item size.
  const std::string& d = a.descr;
  ARIADNE_CHECK(d.size() >= 3 && (d[0] == '<' || d[0] == '|' || d[0] == '=' || d[0] == '>'), name, ": descr '", d,
                "': expected a simple dtype such as '<f4'");
  a.kind = d[1];
  const std::string digits = d.substr(2);
  ARIADNE_CHECK(digits == "1" || digits == "2" || digits == "4" || digits == "8", name, ": descr '", d,
                "': item size must be 1, 2, 4 or 8 bytes");
  a.itemsize = std::stoi(digits);
  const bool ok_kind = (a.kind == 'f' && a.itemsize >= 2) || a.kind == 'i' || a.kind == 'u' ||
                       (a.kind == 'b' && a.itemsize == 1);
  ARIADNE_CHECK(ok_kind, name, ": descr '", d, "': supported dtypes are f2, f4, f8, i1-i8, u1-u8 and b1");
  ARIADNE_CHECK(d[0] != '>' || a.itemsize == 1, name, ": descr '", d,
                "': big-endian data is not supported, expected little-endian ('<')");

  // Size: the product of the shape must match the bytes after the header exactly. Zero-size
  // arrays too must not overflow in the product of their other entries (checked_numel).
  const int64_t n = checked_numel(a.shape, name, ": shape");
  const size_t expected = size_t(checked_mul(n, a.itemsize, name, ": data size (elements · item size)"));
  ARIADNE_CHECK(size - data_start == expected, name, ": data size: the shape and dtype need ", expected,
                " bytes after the header, the file has ", size - data_start);
  a.data.assign(data + data_start, data + size);
  return a;
}

NpyArray read_npy(const std::string& path) {
  return with_path_errors(path, "read the array", [&] {
    const std::vector<uint8_t> bytes = read_input_file(path);  // refuses FIFOs, directories, devices
    return parse_npy(bytes.data(), bytes.size(), path);
  });
}

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  const int64_t n = checked_numel(shape, path, ": shape");
  const size_t bytes = size_t(checked_mul(n, 4, path, ": data size"));
  ARIADNE_CHECK(n == 0 || data != nullptr, path, ": no data for ", n, " elements");
  for (size_t i = 0; i < shape.size(); ++i)
    header += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? ", " : "");
  if (!shape.empty() && header.back() == ' ') header.pop_back();
  header += "), }";
  // Pad with spaces so that the data starts on a 64-byte boundary (10 bytes of preamble).
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  ARIADNE_CHECK(header.size() <= 0xffff, path, ": shape of ", shape.size(), " entries does not fit a version 1.0 header");
  const uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, uint8_t(header.size() & 0xff),
                           uint8_t(header.size() >> 8)};
  // Atomic: a failed write leaves an existing file at `path` as it was.
  write_file_atomic(path, [&](const WriteFn& write) {
    write(pre, 10);
    write(header.data(), header.size());
    if (bytes) write(data, bytes);
  });
}

}  // namespace ariadne
