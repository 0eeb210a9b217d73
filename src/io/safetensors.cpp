// Memory-mapped safetensors reader and writer (format: include/ariadne/safetensors.hpp).
#include "ariadne/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "ariadne/file.hpp"

namespace ariadne {

namespace {

// The reference implementation refuses headers above 100 MB; a larger value is a corrupt or
// hostile file, not a checkpoint.
constexpr uint64_t kMaxHeader = 100ull << 20;

// Bytes per element of every dtype the format defines; 0 for an unknown name.
int dtype_bytes(const std::string& s) {
  static const std::map<std::string, int> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
      {"F64", 8},  {"I64", 8}, {"U64", 8}};
  auto it = sizes.find(s);
  return it == sizes.end() ? 0 : it->second;
}

// a * b, failing on uint64 overflow.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return true;
  *out = a * b;
  return false;
}

// Non-negative integer from a JSON value that fits int64 (safetensors writes shapes and offsets
// as unsigned integers; floats, negatives and strings are malformed).
bool as_count(const nlohmann::json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return *out <= uint64_t(std::numeric_limits<int64_t>::max());
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = uint64_t(v.get<int64_t>());
    return true;
  }
  return false;
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // checked_numel when the file was opened
  return n;
}

const char* safetensors_dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::f64: return "F64";
  }
  return "?";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = open_input_file(path, &map_size_);  // refuses FIFOs, directories, devices
  if (map_size_ < 8) {
    ::close(fd);
    detail::fail(path, ": ", map_size_, " bytes, too short for a safetensors file (needs an 8-byte header length)");
  }
  void* m = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  ARIADNE_CHECK(m != MAP_FAILED, path, ": mmap failed (", std::strerror(map_errno), ")");
  map_ = static_cast<const uint8_t*>(m);
  try {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | map_[i];  // little-endian, independent of the host
    ARIADNE_CHECK(n > 0, path, ": header length is 0");
    ARIADNE_CHECK(n <= kMaxHeader, path, ": header length ", n, " exceeds the 100 MB limit (corrupt file?)");
    ARIADNE_CHECK(n <= map_size_ - 8, path, ": header length ", n, " exceeds the file size ", map_size_,
                  " minus 8 (truncated file?)");
    data_start_ = 8 + n;
    const uint64_t data_size = map_size_ - data_start_;
    const char* h = reinterpret_cast<const char*>(map_ + 8);

    // Duplicate names would be silently merged by the JSON library: catch them while parsing.
    std::vector<std::set<std::string>> keys;
    nlohmann::json::parser_callback_t cb = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& v) {
      using E = nlohmann::json::parse_event_t;
      if (ev == E::object_start) keys.emplace_back();
      else if (ev == E::object_end && !keys.empty()) keys.pop_back();
      else if (ev == E::key && !keys.empty()) {
        const auto k = v.get<std::string>();
        ARIADNE_CHECK(keys.back().insert(k).second, path, ": header: duplicate key '", k, "'");
      }
      return true;
    };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(h, h + n, cb);
    } catch (const nlohmann::json::exception& e) {
      detail::fail(path, ": header is not valid JSON (", e.what(), ")");
    }
    ARIADNE_CHECK(j.is_object(), path, ": header is a JSON ", j.type_name(), ", expected an object");

    std::vector<const SafetensorsEntry*> by_offset;
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& name = it.key();
      const auto& v = it.value();
      if (name == "__metadata__") {
        ARIADNE_CHECK(v.is_object(), path, ": __metadata__ is a JSON ", v.type_name(), ", expected an object of strings");
        for (auto m2 = v.begin(); m2 != v.end(); ++m2) {
          ARIADNE_CHECK(m2.value().is_string(), path, ": __metadata__['", m2.key(), "'] is a JSON ",
                        m2.value().type_name(), ", expected a string");
          metadata_[m2.key()] = m2.value().get<std::string>();
        }
        continue;
      }
      const std::string where = path + ": tensor '" + name + "'";
      ARIADNE_CHECK(v.is_object(), where, ": entry is a JSON ", v.type_name(), ", expected an object");
      for (auto f = v.begin(); f != v.end(); ++f)
        ARIADNE_CHECK(f.key() == "dtype" || f.key() == "shape" || f.key() == "data_offsets", where,
                      ": unknown field '", f.key(), "' (expected dtype, shape, data_offsets)");
      ARIADNE_CHECK(v.contains("dtype") && v["dtype"].is_string(), where, ": field 'dtype' missing or not a string");
      ARIADNE_CHECK(v.contains("shape") && v["shape"].is_array(), where, ": field 'shape' missing or not an array");
      ARIADNE_CHECK(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
                    where, ": field 'data_offsets' missing or not an array of 2 integers");
      SafetensorsEntry e;
      e.name = name;
      e.dtype_name = v["dtype"].get<std::string>();
      const int esize = dtype_bytes(e.dtype_name);
      ARIADNE_CHECK(esize > 0, where, ": unknown dtype '", e.dtype_name, "'");
      e.supported = e.dtype_name == "F32" || e.dtype_name == "BF16" || e.dtype_name == "F16";
      if (e.supported) e.dtype = e.dtype_name == "F32" ? DType::f32 : e.dtype_name == "BF16" ? DType::bf16 : DType::f16;
      uint64_t bytes = uint64_t(esize);
      for (size_t d = 0; d < v["shape"].size(); ++d) {
        uint64_t dim = 0;
        ARIADNE_CHECK(as_count(v["shape"][d], &dim), where, ": shape[", d, "] = ", v["shape"][d].dump(),
                      " is not a non-negative integer");
        ARIADNE_CHECK(!mul_overflows(bytes, dim, &bytes), where, ": shape ", v["shape"].dump(), " overflows 64 bits");
        e.shape.push_back(int64_t(dim));
      }
      // Zero-size tensors too: no partial product of the shape (a stride, a row count) may overflow.
      (void)checked_numel(e.shape, where, ": shape ", v["shape"].dump());
      uint64_t b = 0, en = 0;
      ARIADNE_CHECK(as_count(v["data_offsets"][0], &b) && as_count(v["data_offsets"][1], &en), where,
                    ": data_offsets ", v["data_offsets"].dump(), " are not non-negative integers");
      ARIADNE_CHECK(b <= en, where, ": data_offsets [", b, ", ", en, "] end before they begin");
      ARIADNE_CHECK(en <= data_size, where, ": data_offsets end ", en, " is past the data buffer (", data_size,
                    " bytes; truncated file?)");
      ARIADNE_CHECK(en - b == bytes, where, ": data_offsets cover ", en - b, " bytes but shape ", v["shape"].dump(),
                    " of ", e.dtype_name, " needs ", bytes);
      e.begin = b;
      e.end = en;
      by_offset.push_back(&entries_.emplace(name, std::move(e)).first->second);
    }
    // The tensors must tile the data buffer: sorted by begin, each starts where the previous ended.
    std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
      return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    uint64_t expect = 0;
    const SafetensorsEntry* prev = nullptr;
    for (const SafetensorsEntry* e : by_offset) {
      ARIADNE_CHECK(e->begin >= expect, path, ": tensor '", e->name, "' [", e->begin, ", ", e->end,
                    ") overlaps tensor '", prev ? prev->name : "", "' (ends at ", expect, ")");
      ARIADNE_CHECK(e->begin == expect, path, ": tensor '", e->name, "' begins at ", e->begin,
                    " but the previous tensor ends at ", expect, " (hole in the data buffer)");
      expect = e->end;
      prev = e;
    }
    ARIADNE_CHECK(expect == data_size, path, ": the tensors end at byte ", expect, " of a ", data_size,
                  "-byte data buffer (trailing bytes)");
  } catch (const std::bad_alloc&) {
    unmap();
    detail::fail(path, ": cannot read the header (out of memory)");
  } catch (...) {
    unmap();
    throw;
  }
}

void SafetensorsFile::unmap() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_size_);
  map_ = nullptr;
}

SafetensorsFile::~SafetensorsFile() { unmap(); }

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)), map_(o.map_), map_size_(o.map_size_), data_start_(o.data_start_),
      metadata_(std::move(o.metadata_)), entries_(std::move(o.entries_)) {
  o.map_ = nullptr;
}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_size_ = o.map_size_;
    data_start_ = o.data_start_;
    metadata_ = std::move(o.metadata_);
    entries_ = std::move(o.entries_);
    o.map_ = nullptr;
  }
  return *this;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : entries_) out.push_back(k);
  return out;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  ARIADNE_CHECK(it != entries_.end(), path_, ": no tensor named '", name, "'");
  return it->second;
}

const uint8_t* SafetensorsFile::bytes(const std::string& name) const {
  return map_ + data_start_ + entry(name).begin;
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const SafetensorsEntry& e = entry(name);
  ARIADNE_CHECK(e.supported, path_, ": tensor '", name, "' has dtype ", e.dtype_name,
                "; only F32, BF16 and F16 can be read");
  const uint8_t* p = map_ + data_start_ + e.begin;
  const int64_t n = e.numel();
  std::vector<float> out;
  with_path_errors(path_ + ": tensor '" + name + "'", "convert to f32", [&] { out.resize(static_cast<size_t>(n)); });
  if (n == 0) return out;  // memcpy must not see the null data() of an empty vector
  if (e.dtype == DType::f32) {
    std::memcpy(out.data(), p, size_t(n) * 4);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);  // the mapping is not 2-byte aligned in general
      out[size_t(i)] = e.dtype == DType::bf16 ? bf16_to_float(h) : f16_to_float(h);
    }
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<const SafetensorsTensor*> sorted;
  for (const auto& t : tensors) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  uint64_t off = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const SafetensorsTensor& t = *sorted[i];
    ARIADNE_CHECK(t.name != "__metadata__", path, ": '__metadata__' cannot name a tensor");
    ARIADNE_CHECK(i == 0 || sorted[i - 1]->name != t.name, path, ": tensor '", t.name, "' given twice");
    uint64_t bytes = uint64_t(dtype_size(t.dtype));
    for (int64_t d : t.shape) {
      ARIADNE_CHECK(d >= 0, path, ": tensor '", t.name, "' has negative dimension ", d);
      ARIADNE_CHECK(!mul_overflows(bytes, uint64_t(d), &bytes), path, ": tensor '", t.name, "' is too large");
    }
    ARIADNE_CHECK(bytes == 0 || t.data != nullptr, path, ": tensor '", t.name, "' has no data");
    h[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
  }
  std::string header = h.dump();
  header.append((8 - (8 + header.size()) % 8) % 8, ' ');
  // Atomic: a failed write (a full disk) leaves an existing file at `path` as it was.
  write_file_atomic(path, [&](const WriteFn& write) {
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(header.size()) >> (8 * i));
    write(len, 8);
    write(header.data(), header.size());
    for (const SafetensorsTensor* t : sorted) {
      uint64_t bytes = uint64_t(dtype_size(t->dtype));
      for (int64_t d : t->shape) bytes *= uint64_t(d);  // checked above
      if (bytes) write(t->data, size_t(bytes));
    }
  });
}

}  // namespace ariadne
