// ariadne/npy.hpp — NumPy .npy files: a validating reader and an f32 writer.
//
// Used for q/k dumps of models ariadne does not run (one file per layer, [heads, tokens, dim]),
// for label maps saved as integer arrays, and for the received-attention output of `ariadne shs`.
//
// Format (NumPy's NEP 1): the magic "\x93NUMPY", a major/minor version (1.0: 2-byte header
// length; 2.0 and 3.0: 4-byte), then an ASCII (3.0: UTF-8) Python dict literal with exactly the
// keys 'descr', 'fortran_order' and 'shape', ended by '\n', then the raw data. The reader accepts
// little-endian (or byte-order-free) bool, integer and float dtypes, C order only, and requires the
// data to fill the rest of the file exactly. Every failure throws ariadne::Error naming the file
// and the field ("x.npy: header: 'shape' entry 2 is -1, expected a non-negative integer").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ariadne {

struct NpyArray {
  std::string name;            // file name (or what the caller called the bytes), for messages
  std::string descr;           // dtype as written, e.g. "<f4", "<f2", "<i4", "|u1", "|b1"
  char kind = 'f';             // 'f' float, 'i' signed, 'u' unsigned, 'b' bool
  int itemsize = 4;            // bytes per element
  std::vector<int64_t> shape;  // empty for a 0-d array (one element)
  std::vector<uint8_t> data;   // numel · itemsize bytes, C order, little-endian

  int64_t numel() const;
  // Every element as float (f2/f4/f8 converted; integers and bools cast).
  std::vector<float> to_float() const;
  // Every element as int32; only integer and bool dtypes, values must fit (else Error naming the file).
  std::vector<int32_t> to_int32() const;
};

NpyArray read_npy(const std::string& path);
// The same from bytes in memory; `name` appears in messages.
NpyArray parse_npy(const uint8_t* data, size_t size, const std::string& name);

// Writes a little-endian f32 array (version 1.0, header padded to 64 bytes). Throws naming the file.
void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);

}  // namespace ariadne
