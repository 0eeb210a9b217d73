// ariadne/gguf.hpp — a validating, memory-mapped reader of GGUF model files (versions 2 and 3).
//
// Layout (little-endian throughout):
//   header   "GGUF" magic (bytes 47 47 55 46), u32 version (2 or 3), u64 tensor_count,
//            u64 metadata_kv_count
//   metadata kv_count × { string key, u32 value_type, value }
//            string = u64 length + bytes (no terminator); array = u32 element type, u64 count,
//            elements (arrays of arrays and of strings allowed)
//   tensors  tensor_count × { string name, u32 n_dims (1..4), u64 dims[n_dims] (dims[0] is the
//            innermost, contiguous dimension), u32 ggml_type, u64 offset }
//   padding  to `general.alignment` (u32 key; 32 when absent; a power of two)
//   data     each tensor at data_start + offset; offsets are multiples of the alignment.
//
// Tensor types decoded here (block layouts, each block covering 32 consecutive values of a row):
//   F32   plain floats
//   F16   IEEE half floats
//   Q8_0  { f16 d; i8 q[32] }                  x_i = d · q_i
//   Q4_0  { f16 d; u8 q[16] }                  x_i = d · (nib_i − 8)
//   Q4_1  { f16 d; f16 m; u8 q[16] }           x_i = d · nib_i + m
// where for the 4-bit types nib_i = q[i] & 15 for i < 16 and q[i − 16] >> 4 for i >= 16.
// Any other type is rejected when the file is opened (its size could not be validated).
//
// Metadata holds at most kGgufMaxValues values (keys plus elements of arrays of arrays; a model has a
// few dozen keys and no nested arrays), so that a small crafted file cannot take gigabytes.
//
// Every count, length, size and offset is checked with overflow-safe arithmetic against the bytes
// that remain; errors are ariadne::Error naming the file and the field or tensor
// ("m.gguf: tensor 'blk.0.attn_q.weight': offset 96 + 4608 bytes runs past the end of the data").
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ariadne {

enum class GgufValueType : uint32_t {
  u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8,
  array = 9, u64 = 10, i64 = 11, f64 = 12,
};
const char* gguf_value_type_name(GgufValueType t);

constexpr uint64_t kGgufMaxValues = uint64_t(1) << 16;

// One metadata value. Integers (and bools) are held in `i` (u64 values above INT64_MAX in `u`
// too), floats in `f`, strings in `str`.
//
// Arrays are stored compactly, in memory proportional to their size in the file (a vocabulary of
// 150,000 tokens is one blob, not 150,000 objects): arrays of numbers and bools keep the stored
// little-endian element bytes in `raw`, arrays of strings keep the concatenated bytes in `blob`
// and each string's end offset in `ends`; only arrays of arrays hold one GgufValue per element in
// `items`. Read elements with size() and int_at / float_at / str_at.
struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string str;
  GgufValueType item_type = GgufValueType::u8;  // arrays only
  std::vector<uint8_t> raw;                     // arrays of numbers / bools: count · element size bytes
  std::string blob;                             // arrays of strings: the strings back to back
  std::vector<uint64_t> ends;                   // arrays of strings: end of string k in blob
  std::vector<GgufValue> items;                 // arrays of arrays only

  bool is_integer() const;  // u8 … i64 and bool
  bool is_float() const { return type == GgufValueType::f32 || type == GgufValueType::f64; }
  // Arrays: the number of elements; element k as an integer (u64 above INT64_MAX reads as
  // INT64_MAX), a float (integers converted), or a string. Throw for a wrong item type or k.
  size_t size() const;
  int64_t int_at(size_t k) const;
  uint64_t uint_at(size_t k) const;
  double float_at(size_t k) const;
  std::string_view str_at(size_t k) const;
};

enum class GgmlType : uint32_t { f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q8_0 = 8 };
const char* ggml_type_name(GgmlType t);
int64_t ggml_block_values(GgmlType t);  // values per block: 1 for f32/f16, 32 for the quants
int64_t ggml_block_bytes(GgmlType t);   // bytes per block: 4, 2, 34 (q8_0), 18 (q4_0), 20 (q4_1)

struct GgufTensor {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] innermost (a [out, in] matrix is {in, out})
  GgmlType type = GgmlType::f32;
  uint64_t offset = 0;        // from the start of the data section
  uint64_t bytes = 0;         // stored size
  const uint8_t* data = nullptr;  // into the mapping; valid while the GgufFile lives

  int64_t numel() const;
  int64_t row_length() const { return dims.empty() ? 1 : dims[0]; }
  int64_t rows() const;  // numel / row_length
};

class GgufFile {
 public:
  // Maps and validates the whole file (header, metadata, tensor infos, sizes, offsets).
  static GgufFile open(const std::string& path);
  // The same over bytes in memory (not copied: they must outlive the object); `name` appears in
  // messages. Used by tests.
  static GgufFile parse(const uint8_t* data, size_t size, const std::string& name);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_start() const { return data_start_; }

  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  const GgufValue& value(const std::string& key) const;  // throws naming the key when absent
  // Typed getters: throw naming the file and key when absent, of another type, or out of range.
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;  // f32/f64, or an integer
  double get_float(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::string get_string(const std::string& key) const;
  std::vector<std::string> get_strings(const std::string& key) const;  // array of strings
  std::vector<int64_t> get_ints(const std::string& key) const;         // array of integers

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  bool has_tensor(const std::string& name) const { return index_.count(name) != 0; }
  const GgufTensor& tensor(const std::string& name) const;  // throws naming the tensor

  // Dequantized values in storage order (row-major with dims[0] fastest), as f32.
  std::vector<float> to_float(const GgufTensor& t) const;
  // Rows [row0, row0 + n) of the tensor viewed as [rows(), row_length()], into out (n · row_length).
  void rows_to_float(const GgufTensor& t, int64_t row0, int64_t n, float* out) const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_start_ = 0;
  std::map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::shared_ptr<void> mapping_;  // owns the mmap (empty for parse())
};

// Decodes `n` values (a multiple of the type's block) of `type` from `src` into `dst`.
void ggml_dequantize(GgmlType type, const uint8_t* src, int64_t n, float* dst);

// ---- writing (tests and tools build small files with it) ----
// Appends the little-endian encoding of values to a byte buffer; GgufWriter lays out a whole file.
struct GgufWriterTensor {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order (dims[0] innermost)
  GgmlType type = GgmlType::f32;
  std::vector<uint8_t> bytes;  // already encoded blocks
};
// Builds a version-3 file: metadata in insertion order, then tensors aligned to `alignment` (also
// written as general.alignment when it is not 32).
std::vector<uint8_t> gguf_serialize(const std::vector<std::pair<std::string, GgufValue>>& kv,
                                    const std::vector<GgufWriterTensor>& tensors, uint32_t alignment = 32);
// Encoders for the writer (tests): f32 values to the stored bytes of `type` (n a multiple of the block).
std::vector<uint8_t> ggml_quantize(GgmlType type, const float* src, int64_t n);

// Convenience constructors of metadata values.
GgufValue gguf_u32(uint32_t v);
GgufValue gguf_i32(int32_t v);
GgufValue gguf_f32(float v);
GgufValue gguf_bool(bool v);
GgufValue gguf_str(const std::string& v);
GgufValue gguf_str_array(const std::vector<std::string>& v);
GgufValue gguf_i32_array(const std::vector<int32_t>& v);

}  // namespace ariadne
