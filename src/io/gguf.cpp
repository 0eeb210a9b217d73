// Memory-mapped GGUF reader, dequantizers and a small writer (format: include/ariadne/gguf.hpp).
#include "ariadne/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "ariadne/error.hpp"
#include "ariadne/file.hpp"
#include "ariadne/tensor.hpp"

namespace ariadne {

namespace {

// Nesting of arrays of arrays beyond this is a hostile file (recursion depth), not a model.
constexpr int kMaxArrayDepth = 8;

bool add_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  if (b > std::numeric_limits<uint64_t>::max() - a) return true;
  *out = a + b;
  return false;
}
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return true;
  *out = a * b;
  return false;
}

// Smallest encoded size of one value of a type: bounds array counts against the remaining bytes
// before anything is allocated. 0 for an unknown type.
uint64_t min_value_bytes(uint32_t t) {
  switch (GgufValueType(t)) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::boolean: return 1;
    case GgufValueType::u16: case GgufValueType::i16: return 2;
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::f32: return 4;
    case GgufValueType::u64: case GgufValueType::i64: case GgufValueType::f64: return 8;
    case GgufValueType::string: return 8;   // the length
    case GgufValueType::array: return 12;   // element type + count
  }
  return 0;
}

// Sequential reader over the file's bytes; every read checks what remains.
class Cursor {
 public:
  Cursor(const uint8_t* p, uint64_t n, const std::string& name) : p_(p), n_(n), name_(name) {}
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return n_ - pos_; }
  void need(uint64_t bytes, const std::string& what) const {
    ARIADNE_CHECK(bytes <= left(), name_, ": ", what, ": needs ", bytes, " bytes at offset ", pos_, " but only ",
                  left(), " remain (truncated file?)");
  }
  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // The next n bytes (already checked with need()).
  const uint8_t* take(uint64_t n) {
    const uint8_t* q = p_ + pos_;
    pos_ += n;
    return q;
  }
  std::string string(const std::string& what) {
    const uint64_t len = read<uint64_t>(what + " (string length)");
    need(len, what + " (string of " + std::to_string(len) + " bytes)");
    std::string s(reinterpret_cast<const char*>(p_ + pos_), size_t(len));
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* p_;
  uint64_t n_;
  uint64_t pos_ = 0;
  const std::string& name_;
};

// Bytes of one stored element of a fixed-size type (0 for string and array).
uint64_t fixed_value_bytes(GgufValueType t) {
  return t == GgufValueType::string || t == GgufValueType::array ? 0 : min_value_bytes(uint32_t(t));
}

// Values created so far (keys and elements of arrays of arrays), against kGgufMaxValues.
struct Budget {
  uint64_t values = 0;
  void take(const std::string& file, const std::string& what) {
    ARIADNE_CHECK(++values <= kGgufMaxValues, file, ": ", what, ": the metadata holds more than ", kGgufMaxValues,
                  " values (keys and nested array elements; a model has a few dozen): corrupt or hostile file");
  }
};

GgufValue read_value(Cursor& c, uint32_t type, const std::string& what, const std::string& file, int depth,
                     Budget& budget) {
  GgufValue v;
  ARIADNE_CHECK(min_value_bytes(type) != 0, file, ": ", what, ": unknown value type ", type, " (expected 0..12)");
  v.type = GgufValueType(type);
  switch (v.type) {
    case GgufValueType::u8: v.i = c.read<uint8_t>(what); break;
    case GgufValueType::i8: v.i = c.read<int8_t>(what); break;
    case GgufValueType::u16: v.i = c.read<uint16_t>(what); break;
    case GgufValueType::i16: v.i = c.read<int16_t>(what); break;
    case GgufValueType::u32: v.i = c.read<uint32_t>(what); break;
    case GgufValueType::i32: v.i = c.read<int32_t>(what); break;
    case GgufValueType::i64: v.i = c.read<int64_t>(what); break;
    case GgufValueType::u64:
      v.u = c.read<uint64_t>(what);
      v.i = v.u > uint64_t(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max() : int64_t(v.u);
      break;
    case GgufValueType::f32: v.f = c.read<float>(what); break;
    case GgufValueType::f64: v.f = c.read<double>(what); break;
    case GgufValueType::boolean: {
      const uint8_t b = c.read<uint8_t>(what);
      ARIADNE_CHECK(b <= 1, file, ": ", what, ": bool byte is ", int(b), ", expected 0 or 1");
      v.i = b;
      break;
    }
    case GgufValueType::string: v.str = c.string(what); break;
    case GgufValueType::array: {
      ARIADNE_CHECK(depth < kMaxArrayDepth, file, ": ", what, ": arrays nested deeper than ", kMaxArrayDepth);
      const uint32_t et = c.read<uint32_t>(what + " (array element type)");
      ARIADNE_CHECK(min_value_bytes(et) != 0, file, ": ", what, ": unknown array element type ", et,
                    " (expected 0..12)");
      const uint64_t count = c.read<uint64_t>(what + " (array count)");
      uint64_t min_bytes = 0;
      ARIADNE_CHECK(!mul_overflows(count, min_value_bytes(et), &min_bytes) && min_bytes <= c.left(), file, ": ",
                    what, ": array count ", count, " of ", gguf_value_type_name(GgufValueType(et)),
                    " cannot fit in the ", c.left(), " bytes that remain (truncated file or corrupt count)");
      v.item_type = GgufValueType(et);
      if (const uint64_t eb = fixed_value_bytes(v.item_type); eb != 0) {
        // Numbers and bools: the stored bytes as they are (min_bytes = count · eb was checked above).
        const uint8_t* p = c.take(min_bytes);
        v.raw.assign(p, p + min_bytes);
        if (v.item_type == GgufValueType::boolean)
          for (uint64_t k = 0; k < count; ++k)
            ARIADNE_CHECK(v.raw[size_t(k)] <= 1, file, ": ", what, "[", k, "]: bool byte is ", int(v.raw[size_t(k)]),
                          ", expected 0 or 1");
      } else if (v.item_type == GgufValueType::string) {
        v.ends.reserve(size_t(count));
        for (uint64_t k = 0; k < count; ++k) {
          // Labels built only on failure: a vocabulary has 10^5 strings.
          if (c.left() < 8) c.need(8, what + "[" + std::to_string(k) + "] (string length)");
          const uint64_t len = c.read<uint64_t>(what);
          if (c.left() < len) c.need(len, what + "[" + std::to_string(k) + "] (string of " + std::to_string(len) + " bytes)");
          const uint8_t* p = c.take(len);
          v.blob.append(reinterpret_cast<const char*>(p), size_t(len));
          v.ends.push_back(v.blob.size());
        }
      } else {
        v.items.reserve(size_t(count));
        for (uint64_t k = 0; k < count; ++k) {
          const std::string wk = what + "[" + std::to_string(k) + "]";
          budget.take(file, wk);
          v.items.push_back(read_value(c, et, wk, file, depth + 1, budget));
        }
      }
      break;
    }
  }
  if (v.type != GgufValueType::u64 && v.is_integer()) v.u = uint64_t(v.i);
  return v;
}

struct Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr != nullptr && addr != MAP_FAILED) munmap(addr, size);
  }
};

float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_float(h);
}

}  // namespace

const char* gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8: return "u8";
    case GgufValueType::i8: return "i8";
    case GgufValueType::u16: return "u16";
    case GgufValueType::i16: return "i16";
    case GgufValueType::u32: return "u32";
    case GgufValueType::i32: return "i32";
    case GgufValueType::f32: return "f32";
    case GgufValueType::boolean: return "bool";
    case GgufValueType::string: return "string";
    case GgufValueType::array: return "array";
    case GgufValueType::u64: return "u64";
    case GgufValueType::i64: return "i64";
    case GgufValueType::f64: return "f64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::u8: case GgufValueType::i8: case GgufValueType::u16: case GgufValueType::i16:
    case GgufValueType::u32: case GgufValueType::i32: case GgufValueType::u64: case GgufValueType::i64:
    case GgufValueType::boolean:
      return true;
    default:
      return false;
  }
}

size_t GgufValue::size() const {
  ARIADNE_CHECK(type == GgufValueType::array, "GGUF value: size() of a ", gguf_value_type_name(type),
                ", expected an array");
  if (item_type == GgufValueType::string) return ends.size();
  if (item_type == GgufValueType::array) return items.size();
  return raw.size() / size_t(fixed_value_bytes(item_type));
}

namespace {
// Element k of a numeric array, as its stored type.
template <class T>
T element(const GgufValue& v, size_t k) {
  T x;
  std::memcpy(&x, v.raw.data() + k * sizeof(T), sizeof(T));
  return x;
}
void check_element(const GgufValue& v, size_t k, bool numeric) {
  ARIADNE_CHECK(k < v.size(), "GGUF array: element ", k, " out of range (", v.size(), " elements)");
  ARIADNE_CHECK(!numeric || fixed_value_bytes(v.item_type) != 0, "GGUF array: elements are ",
                gguf_value_type_name(v.item_type), ", expected numbers");
}
}  // namespace

int64_t GgufValue::int_at(size_t k) const {
  check_element(*this, k, true);
  switch (item_type) {
    case GgufValueType::u8: case GgufValueType::boolean: return element<uint8_t>(*this, k);
    case GgufValueType::i8: return element<int8_t>(*this, k);
    case GgufValueType::u16: return element<uint16_t>(*this, k);
    case GgufValueType::i16: return element<int16_t>(*this, k);
    case GgufValueType::u32: return element<uint32_t>(*this, k);
    case GgufValueType::i32: return element<int32_t>(*this, k);
    case GgufValueType::i64: return element<int64_t>(*this, k);
    case GgufValueType::u64: {
      const uint64_t u = element<uint64_t>(*this, k);
      return u > uint64_t(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max() : int64_t(u);
    }
    case GgufValueType::f32: return int64_t(element<float>(*this, k));
    case GgufValueType::f64: return int64_t(element<double>(*this, k));
    default: break;
  }
  return 0;
}

uint64_t GgufValue::uint_at(size_t k) const {
  check_element(*this, k, true);
  if (item_type == GgufValueType::u64) return element<uint64_t>(*this, k);
  return uint64_t(int_at(k));
}

double GgufValue::float_at(size_t k) const {
  check_element(*this, k, true);
  if (item_type == GgufValueType::f32) return element<float>(*this, k);
  if (item_type == GgufValueType::f64) return element<double>(*this, k);
  return double(int_at(k));
}

std::string_view GgufValue::str_at(size_t k) const {
  check_element(*this, k, false);
  ARIADNE_CHECK(item_type == GgufValueType::string, "GGUF array: elements are ", gguf_value_type_name(item_type),
                ", expected strings");
  const size_t b = k == 0 ? 0 : size_t(ends[k - 1]);
  return std::string_view(blob).substr(b, size_t(ends[k]) - b);
}

const char* ggml_type_name(GgmlType t) {
  switch (t) {
    case GgmlType::f32: return "F32";
    case GgmlType::f16: return "F16";
    case GgmlType::q4_0: return "Q4_0";
    case GgmlType::q4_1: return "Q4_1";
    case GgmlType::q8_0: return "Q8_0";
  }
  return "unknown";
}

int64_t ggml_block_values(GgmlType t) {
  return (t == GgmlType::f32 || t == GgmlType::f16) ? 1 : 32;
}

int64_t ggml_block_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::f32: return 4;
    case GgmlType::f16: return 2;
    case GgmlType::q4_0: return 18;
    case GgmlType::q4_1: return 20;
    case GgmlType::q8_0: return 34;
  }
  return 0;
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;  // bounded when the file was parsed
  return n;
}
int64_t GgufTensor::rows() const { return row_length() == 0 ? 0 : numel() / row_length(); }

void ggml_dequantize(GgmlType type, const uint8_t* src, int64_t n, float* dst) {
  const int64_t bv = ggml_block_values(type), bb = ggml_block_bytes(type);
  ARIADNE_CHECK(bb != 0 && n % bv == 0, "ggml_dequantize: ", n, " values of type ", uint32_t(type),
                " are not whole blocks of ", bv);
  const int64_t blocks = n / bv;
  switch (type) {
    case GgmlType::f32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case GgmlType::f16:
      for (int64_t i = 0; i < n; ++i) dst[i] = half(src + 2 * i);
      return;
    case GgmlType::q8_0:
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* p = src + b * bb;
        const float d = half(p);
        for (int i = 0; i < 32; ++i) dst[b * 32 + i] = d * float(int8_t(p[2 + i]));
      }
      return;
    case GgmlType::q4_0:
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* p = src + b * bb;
        const float d = half(p);
        for (int i = 0; i < 16; ++i) {
          dst[b * 32 + i] = d * float(int(p[2 + i] & 15) - 8);
          dst[b * 32 + 16 + i] = d * float(int(p[2 + i] >> 4) - 8);
        }
      }
      return;
    case GgmlType::q4_1:
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* p = src + b * bb;
        const float d = half(p), m = half(p + 2);
        for (int i = 0; i < 16; ++i) {
          dst[b * 32 + i] = d * float(p[4 + i] & 15) + m;
          dst[b * 32 + 16 + i] = d * float(p[4 + i] >> 4) + m;
        }
      }
      return;
  }
}

GgufFile GgufFile::open(const std::string& path) {
  uint64_t size = 0;
  const int fd = open_input_file(path, &size);  // refuses FIFOs, directories, devices
  auto map = std::make_shared<Mapping>();
  map->size = size_t(size);
  if (map->size > 0) map->addr = mmap(nullptr, map->size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  ARIADNE_CHECK(map->size == 0 || map->addr != MAP_FAILED, path, ": cannot map (", std::strerror(e), ")");
  GgufFile f = with_path_errors(path, "read the GGUF metadata",
                                [&] { return parse(static_cast<const uint8_t*>(map->addr), map->size, path); });
  f.mapping_ = map;
  return f;
}

GgufFile GgufFile::parse(const uint8_t* data, size_t size, const std::string& name) {
  GgufFile f;
  f.path_ = name;
  Cursor c(data, size, f.path_);
  const uint32_t magic = c.read<uint32_t>("header: magic");
  ARIADNE_CHECK(magic == 0x46554747u, name, ": header: magic is 0x", std::hex, magic, std::dec,
                ", expected \"GGUF\" (not a GGUF file)");
  f.version_ = c.read<uint32_t>("header: version");
  ARIADNE_CHECK(f.version_ == 2 || f.version_ == 3, name, ": header: version ", f.version_, ", expected 2 or 3");
  const uint64_t n_tensors = c.read<uint64_t>("header: tensor_count");
  const uint64_t n_kv = c.read<uint64_t>("header: metadata_kv_count");
  // Each kv takes at least a key length, a type and one byte; each tensor info at least 8+4+8+4+8.
  uint64_t need = 0;
  ARIADNE_CHECK(!mul_overflows(n_kv, 13, &need) && need <= c.left(), name, ": header: metadata_kv_count ", n_kv,
                " cannot fit in the ", c.left(), " bytes that remain (truncated file or corrupt count)");
  Budget budget;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string where = "metadata entry " + std::to_string(i);
    budget.take(name, where);
    std::string key = c.string(where + " key");
    const uint32_t type = c.read<uint32_t>("metadata '" + key + "' value type");
    GgufValue v = read_value(c, type, "metadata '" + key + "'", name, 0, budget);
    ARIADNE_CHECK(f.kv_.count(key) == 0, name, ": metadata key '", key, "' appears twice");
    f.kv_.emplace(std::move(key), std::move(v));
  }
  if (f.has("general.alignment")) {
    const GgufValue& a = f.kv_.at("general.alignment");
    ARIADNE_CHECK(a.type == GgufValueType::u32, name, ": metadata 'general.alignment' is ",
                  gguf_value_type_name(a.type), ", expected u32");
    ARIADNE_CHECK(a.i > 0 && (a.i & (a.i - 1)) == 0, name, ": metadata 'general.alignment' is ", a.i,
                  ", expected a power of two");
    f.alignment_ = uint64_t(a.i);
  }
  ARIADNE_CHECK(!mul_overflows(n_tensors, 32, &need) && need <= c.left(), name, ": header: tensor_count ",
                n_tensors, " cannot fit in the ", c.left(), " bytes that remain (truncated file or corrupt count)");
  f.tensors_.reserve(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.string("tensor info " + std::to_string(i) + " name");
    const std::string what = "tensor '" + t.name + "'";
    const uint32_t nd = c.read<uint32_t>(what + " n_dims");
    ARIADNE_CHECK(nd >= 1 && nd <= 4, name, ": ", what, ": n_dims is ", nd, ", expected 1..4");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t dim = c.read<uint64_t>(what + " dims");
      ARIADNE_CHECK(dim >= 1 && !mul_overflows(numel, dim, &numel) && numel <= (uint64_t(1) << 62), name, ": ",
                    what, ": dim ", d, " is ", dim, ", the element count must be positive and below 2^62");
      t.dims.push_back(int64_t(dim));
    }
    const uint32_t type = c.read<uint32_t>(what + " type");
    t.type = GgmlType(type);
    ARIADNE_CHECK(ggml_block_bytes(t.type) != 0, name, ": ", what, ": ggml type ", type,
                  " is not supported (F32=0, F16=1, Q4_0=2, Q4_1=3, Q8_0=8)");
    const int64_t bv = ggml_block_values(t.type);
    ARIADNE_CHECK(t.dims[0] % bv == 0, name, ": ", what, ": row length ", t.dims[0], " is not a multiple of the ",
                  ggml_type_name(t.type), " block of ", bv);
    // 2^62 F32 elements are 2^64 bytes: the size wrapped to 0 and passed the bounds check below.
    t.bytes = checked_mul_u64(numel / uint64_t(bv), uint64_t(ggml_block_bytes(t.type)), name, ": ", what,
                              ": byte size (", numel, " values of ", ggml_type_name(t.type), ")");
    ARIADNE_CHECK(t.bytes <= uint64_t(std::numeric_limits<int64_t>::max()), name, ": ", what, ": byte size ",
                  t.bytes, " exceeds 2^63");
    t.offset = c.read<uint64_t>(what + " offset");
    ARIADNE_CHECK(t.offset % f.alignment_ == 0, name, ": ", what, ": offset ", t.offset,
                  " is not a multiple of the alignment ", f.alignment_);
    ARIADNE_CHECK(f.index_.count(t.name) == 0, name, ": tensor '", t.name, "' appears twice");
    f.index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }
  // The data section starts at the next multiple of the alignment.
  uint64_t start = 0;
  ARIADNE_CHECK(!add_overflows(c.pos(), f.alignment_ - 1, &start), name, ": data section start overflows");
  start -= start % f.alignment_;
  ARIADNE_CHECK(start <= size || n_tensors == 0, name, ": data section would start at ", start,
                " past the end of the file (", size, " bytes)");
  f.data_start_ = start;
  const uint64_t data_bytes = start <= size ? size - start : 0;
  for (GgufTensor& t : f.tensors_) {
    uint64_t end = 0;
    ARIADNE_CHECK(!add_overflows(t.offset, t.bytes, &end) && end <= data_bytes, name, ": tensor '", t.name,
                  "': offset ", t.offset, " + ", t.bytes, " bytes runs past the end of the data (", data_bytes,
                  " bytes)");
    t.data = data + start + t.offset;
  }
  return f;
}

const GgufValue& GgufFile::value(const std::string& key) const {
  auto it = kv_.find(key);
  ARIADNE_CHECK(it != kv_.end(), path_, ": metadata key '", key, "' is missing");
  return it->second;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = value(key);
  ARIADNE_CHECK(v.is_integer() && v.type != GgufValueType::boolean, path_, ": metadata '", key, "' is ",
                gguf_value_type_name(v.type), ", expected an integer");
  ARIADNE_CHECK(v.type != GgufValueType::u64 || v.u <= uint64_t(std::numeric_limits<int64_t>::max()), path_,
                ": metadata '", key, "' is ", v.u, ", too large");
  return v.i;
}
int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}
double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = value(key);
  if (v.is_float()) return v.f;
  return double(get_int(key));
}
double GgufFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}
bool GgufFile::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const GgufValue& v = value(key);
  ARIADNE_CHECK(v.type == GgufValueType::boolean, path_, ": metadata '", key, "' is ", gguf_value_type_name(v.type),
                ", expected bool");
  return v.i != 0;
}
std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = value(key);
  ARIADNE_CHECK(v.type == GgufValueType::string, path_, ": metadata '", key, "' is ", gguf_value_type_name(v.type),
                ", expected string");
  return v.str;
}
std::vector<std::string> GgufFile::get_strings(const std::string& key) const {
  const GgufValue& v = value(key);
  ARIADNE_CHECK(v.type == GgufValueType::array && v.item_type == GgufValueType::string, path_, ": metadata '", key,
                "' is ", gguf_value_type_name(v.type), ", expected an array of strings");
  std::vector<std::string> out;
  out.reserve(v.size());
  for (size_t k = 0; k < v.size(); ++k) out.emplace_back(v.str_at(k));
  return out;
}
std::vector<int64_t> GgufFile::get_ints(const std::string& key) const {
  const GgufValue& v = value(key);
  GgufValue probe;
  probe.type = v.item_type;
  ARIADNE_CHECK(v.type == GgufValueType::array && probe.is_integer(), path_, ": metadata '", key, "' is ",
                gguf_value_type_name(v.type), ", expected an array of integers");
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t k = 0; k < v.size(); ++k) out.push_back(v.int_at(k));
  return out;
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  auto it = index_.find(name);
  ARIADNE_CHECK(it != index_.end(), path_, ": tensor '", name, "' is missing");
  return tensors_[it->second];
}

std::vector<float> GgufFile::to_float(const GgufTensor& t) const {
  std::vector<float> out(size_t(t.numel()));
  ggml_dequantize(t.type, t.data, t.numel(), out.data());
  return out;
}

void GgufFile::rows_to_float(const GgufTensor& t, int64_t row0, int64_t n, float* out) const {
  ARIADNE_CHECK(row0 >= 0 && n >= 0 && row0 <= t.rows() - n, path_, ": tensor '", t.name, "': rows [", row0, ", ",
                row0 + n, ") out of range (", t.rows(), " rows)");
  const int64_t row_bytes = t.row_length() / ggml_block_values(t.type) * ggml_block_bytes(t.type);
  ggml_dequantize(t.type, t.data + row0 * row_bytes, n * t.row_length(), out);
}

// ---- writer ----

namespace {

template <class T>
void put(std::vector<uint8_t>& b, T v) {
  const size_t at = b.size();
  b.resize(at + sizeof(T));
  std::memcpy(b.data() + at, &v, sizeof(T));
}
void put_string(std::vector<uint8_t>& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
void put_value(std::vector<uint8_t>& b, const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::u8: put<uint8_t>(b, uint8_t(v.i)); break;
    case GgufValueType::i8: put<int8_t>(b, int8_t(v.i)); break;
    case GgufValueType::u16: put<uint16_t>(b, uint16_t(v.i)); break;
    case GgufValueType::i16: put<int16_t>(b, int16_t(v.i)); break;
    case GgufValueType::u32: put<uint32_t>(b, uint32_t(v.i)); break;
    case GgufValueType::i32: put<int32_t>(b, int32_t(v.i)); break;
    case GgufValueType::u64: put<uint64_t>(b, v.u); break;
    case GgufValueType::i64: put<int64_t>(b, v.i); break;
    case GgufValueType::f32: put<float>(b, float(v.f)); break;
    case GgufValueType::f64: put<double>(b, v.f); break;
    case GgufValueType::boolean: put<uint8_t>(b, v.i ? 1 : 0); break;
    case GgufValueType::string: put_string(b, v.str); break;
    case GgufValueType::array:
      put<uint32_t>(b, uint32_t(v.item_type));
      put<uint64_t>(b, v.size());
      if (v.item_type == GgufValueType::array) {
        for (const GgufValue& x : v.items) put_value(b, x);
      } else if (v.item_type == GgufValueType::string) {
        for (size_t k = 0; k < v.size(); ++k) {
          const std::string_view sv = v.str_at(k);
          put<uint64_t>(b, sv.size());
          b.insert(b.end(), sv.begin(), sv.end());
        }
      } else {
        b.insert(b.end(), v.raw.begin(), v.raw.end());
      }
      break;
  }
}

}  // namespace

std::vector<uint8_t> gguf_serialize(const std::vector<std::pair<std::string, GgufValue>>& kv,
                                    const std::vector<GgufWriterTensor>& tensors, uint32_t alignment) {
  ARIADNE_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0, "gguf_serialize: alignment ", alignment,
                " is not a power of two");
  std::vector<uint8_t> b;
  put<uint32_t>(b, 0x46554747u);
  put<uint32_t>(b, 3);
  put<uint64_t>(b, tensors.size());
  put<uint64_t>(b, kv.size() + (alignment != 32 ? 1 : 0));
  for (const auto& [k, v] : kv) {
    put_string(b, k);
    put<uint32_t>(b, uint32_t(v.type));
    put_value(b, v);
  }
  if (alignment != 32) {
    put_string(b, "general.alignment");
    put<uint32_t>(b, uint32_t(GgufValueType::u32));
    put<uint32_t>(b, alignment);
  }
  uint64_t offset = 0;
  for (const GgufWriterTensor& t : tensors) {
    put_string(b, t.name);
    put<uint32_t>(b, uint32_t(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(b, uint64_t(d));
    put<uint32_t>(b, uint32_t(t.type));
    put<uint64_t>(b, offset);
    offset += (t.bytes.size() + alignment - 1) / alignment * alignment;
  }
  b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
  for (const GgufWriterTensor& t : tensors) {
    b.insert(b.end(), t.bytes.begin(), t.bytes.end());
    b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
  }
  return b;
}

std::vector<uint8_t> ggml_quantize(GgmlType type, const float* src, int64_t n) {
  const int64_t bv = ggml_block_values(type), bb = ggml_block_bytes(type);
  ARIADNE_CHECK(bb != 0 && n % bv == 0, "ggml_quantize: ", n, " values are not whole blocks of ", bv);
  std::vector<uint8_t> out(size_t(n / bv * bb));
  auto put_half = [](uint8_t* p, float x) {
    const uint16_t h = float_to_f16(x);
    std::memcpy(p, &h, 2);
  };
  for (int64_t b = 0; b < n / bv; ++b) {
    const float* x = src + b * bv;
    uint8_t* p = out.data() + b * bb;
    switch (type) {
      case GgmlType::f32: std::memcpy(p, x, 4); break;
      case GgmlType::f16: put_half(p, x[0]); break;
      case GgmlType::q8_0: {
        float amax = 0;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float d = amax / 127.f, inv = d > 0 ? 1.f / d : 0.f;
        put_half(p, d);
        for (int i = 0; i < 32; ++i) p[2 + i] = uint8_t(int8_t(std::lround(x[i] * inv)));
        break;
      }
      case GgmlType::q4_0: {
        // Symmetric: the value of largest magnitude maps to −8.
        float mx = 0;
        for (int i = 0; i < 32; ++i)
          if (std::fabs(x[i]) > std::fabs(mx)) mx = x[i];
        const float d = mx / -8.f, inv = d != 0 ? 1.f / d : 0.f;
        put_half(p, d);
        for (int i = 0; i < 16; ++i) {
          const int a = std::clamp(int(std::lround(x[i] * inv)) + 8, 0, 15);
          const int c = std::clamp(int(std::lround(x[16 + i] * inv)) + 8, 0, 15);
          p[2 + i] = uint8_t(a | (c << 4));
        }
        break;
      }
      case GgmlType::q4_1: {
        float lo = x[0], hi = x[0];
        for (int i = 0; i < 32; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
        const float d = (hi - lo) / 15.f, inv = d > 0 ? 1.f / d : 0.f;
        put_half(p, d);
        put_half(p + 2, lo);
        for (int i = 0; i < 16; ++i) {
          const int a = std::clamp(int(std::lround((x[i] - lo) * inv)), 0, 15);
          const int c = std::clamp(int(std::lround((x[16 + i] - lo) * inv)), 0, 15);
          p[4 + i] = uint8_t(a | (c << 4));
        }
        break;
      }
    }
  }
  return out;
}

GgufValue gguf_u32(uint32_t v) {
  GgufValue x;
  x.type = GgufValueType::u32;
  x.i = v;
  x.u = v;
  return x;
}
GgufValue gguf_i32(int32_t v) {
  GgufValue x;
  x.type = GgufValueType::i32;
  x.i = v;
  x.u = uint64_t(int64_t(v));
  return x;
}
GgufValue gguf_f32(float v) {
  GgufValue x;
  x.type = GgufValueType::f32;
  x.f = v;
  return x;
}
GgufValue gguf_bool(bool v) {
  GgufValue x;
  x.type = GgufValueType::boolean;
  x.i = v ? 1 : 0;
  x.u = uint64_t(x.i);
  return x;
}
GgufValue gguf_str(const std::string& v) {
  GgufValue x;
  x.type = GgufValueType::string;
  x.str = v;
  return x;
}
GgufValue gguf_str_array(const std::vector<std::string>& v) {
  GgufValue x;
  x.type = GgufValueType::array;
  x.item_type = GgufValueType::string;
  for (const std::string& s : v) {
    x.blob += s;
    x.ends.push_back(x.blob.size());
  }
  return x;
}
GgufValue gguf_i32_array(const std::vector<int32_t>& v) {
  GgufValue x;
  x.type = GgufValueType::array;
  x.item_type = GgufValueType::i32;
  x.raw.resize(v.size() * 4);
  if (!v.empty()) std::memcpy(x.raw.data(), v.data(), v.size() * 4);
  return x;
}

}  // namespace ariadne
