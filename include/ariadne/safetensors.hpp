// ariadne/safetensors.hpp — memory-mapped safetensors reader and a small writer.
//
// File layout (the format every Hugging Face checkpoint uses):
//   [8 bytes]  N, unsigned little-endian: length of the JSON header
//   [N bytes]  JSON object: { "__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..],
//              "data_offsets": [begin, end]}, ... }   (may be padded with trailing spaces)
//   [rest]     the data buffer; offsets are relative to its start, [begin, end) half-open.
//
// The reader validates everything before any tensor is touched, and every error names the file and
// the tensor or field: header length against the file size, the JSON itself (object, no duplicate
// names), each entry's fields (dtype known, shape of non-negative integers, two offsets with
// begin <= end), size == prod(shape) · dtype size (overflow-checked), and the offsets tiling the data
// buffer exactly (sorted, no overlap, no hole, nothing after the last tensor). Tensors of any known
// safetensors dtype are accepted in the file (their sizes are checked); only F32, BF16 and F16 can
// be read, and reading another dtype throws naming the tensor and its dtype.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ariadne/tensor.hpp"

namespace ariadne {

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;      // as in the file: "F32", "BF16", "I64", ...
  bool supported = false;      // dtype is F32, BF16 or F16 (then `dtype` is meaningful)
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  // any rank (Conv3d weights have 5 dimensions)
  uint64_t begin = 0, end = 0; // byte range in the data buffer
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`. Throws ariadne::Error naming the file and the problem.
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  std::vector<std::string> names() const;  // sorted
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  // Throws naming the file and the tensor when absent.
  const SafetensorsEntry& entry(const std::string& name) const;
  // Raw bytes of a tensor inside the mapping (valid while this object lives). No alignment is
  // guaranteed (the header length is arbitrary): read through memcpy or convert with read_f32.
  const uint8_t* bytes(const std::string& name) const;
  // The tensor converted to f32, row-major in its own shape. Throws for unsupported dtypes.
  std::vector<float> read_f32(const std::string& name) const;

 private:
  std::string path_;
  const uint8_t* map_ = nullptr;
  uint64_t map_size_ = 0;
  uint64_t data_start_ = 0;  // 8 + header length
  std::map<std::string, std::string> metadata_;
  std::map<std::string, SafetensorsEntry> entries_;
  void unmap();
};

// One tensor to write: `data` points to prod(shape) values of `dtype`, row-major.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes tensors (sorted by name, packed in that order) and string metadata. The header is padded
// with spaces to a multiple of 8 bytes so that data offsets are 8-aligned from the file start.
// Throws naming the file or the tensor (duplicate names, "__metadata__" as a tensor name, I/O).
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The safetensors dtype string of a supported dtype: "F32", "BF16", "F16".
const char* safetensors_dtype_name(DType t);

}  // namespace ariadne
