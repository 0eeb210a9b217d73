// The paged KV cache (include/ariadne/decode.hpp): host pools that grow by doubling, a free list
// of pages, and per page the key summaries the sparse decode scores (stride sums, min, max).
#include <algorithm>
#include <cstring>
#include <limits>

#include "ariadne/decode.hpp"
#include "ariadne/error.hpp"
#include "decode/internal.hpp"

namespace ariadne {

namespace {

void check_kv(const TensorView& t, const char* name, const KVCacheConfig& c, int64_t n) {
  ARIADNE_CHECK(t.defined(), "kv cache append: ", name, " is undefined");
  ARIADNE_CHECK(t.device == Device::cpu, "kv cache append: ", name, " is on the device; this cache lives on the host");
  ARIADNE_CHECK(t.rank == 3 && t.shape[0] == n && t.shape[1] == c.kv_heads && t.shape[2] == c.head_dim,
                "kv cache append: ", name, " is ", t.describe(), ", expected [", n, ", ", c.kv_heads, ", ",
                c.head_dim, "] (tokens, the cache's kv_heads, head_dim)");
  ARIADNE_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16, "kv cache append: ", name,
                " has dtype ", dtype_name(t.dtype), ", expected f32, bf16 or f16");
  ARIADNE_CHECK(t.stride[2] == 1 && t.stride[1] >= c.head_dim && t.stride[0] >= 0, "kv cache append: ", name,
                " needs a contiguous head dim and non-overlapping heads, got ", t.describe());
}

// Stores src (element i of a row of dtype `from`) into the cache's dtype.
void store_row(const TensorView& src, int64_t token, int head, DType to, unsigned char* dst, int d) {
  const unsigned char* s =
      static_cast<const unsigned char*>(src.data) + (token * src.stride[0] + head * src.stride[1]) * dtype_size(src.dtype);
  if (src.dtype == to) {
    std::memcpy(dst, s, size_t(d) * size_t(dtype_size(to)));
    return;
  }
  for (int i = 0; i < d; ++i) decode_detail::store(dst, to, i, decode_detail::load(s, src.dtype, i));
}

}  // namespace

PagedKVCache::PagedKVCache(const KVCacheConfig& c) : cfg_(c) {
  ARIADNE_CHECK(c.page_size > 0 && c.page_size <= (1 << 20), "kv cache: page_size is ", c.page_size,
                ", expected 1 … 2^20 tokens");
  ARIADNE_CHECK(c.kv_heads > 0 && c.kv_heads <= 4096, "kv cache: kv_heads is ", c.kv_heads, ", expected 1 … 4096");
  ARIADNE_CHECK(c.head_dim > 0 && c.head_dim <= 1024, "kv cache: head_dim is ", c.head_dim, ", expected 1 … 1024");
  ARIADNE_CHECK(c.dtype == DType::f32 || c.dtype == DType::bf16 || c.dtype == DType::f16, "kv cache: dtype ",
                dtype_name(c.dtype), " is not a storage type, expected f32, bf16 or f16");
  ARIADNE_CHECK(c.summary_stride > 0 && c.page_size % c.summary_stride == 0, "kv cache: summary_stride ",
                c.summary_stride, " must be positive and divide page_size ", c.page_size);
}

int PagedKVCache::add_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (!seqs_[i].live) {
      seqs_[i] = Sequence{true, 0, {}};
      return int(i);
    }
  ARIADNE_CHECK(seqs_.size() < size_t(1) << 30, "kv cache: too many sequences");
  seqs_.push_back(Sequence{true, 0, {}});
  return int(seqs_.size() - 1);
}

bool PagedKVCache::live(int seq) const { return seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)].live; }

void PagedKVCache::clear(int seq) {
  ARIADNE_CHECK(live(seq), "kv cache: sequence ", seq, " is not a live sequence of this cache");
  Sequence& s = seqs_[size_t(seq)];
  for (int32_t p : s.pages) free_pages_.push_back(p);
  s.pages.clear();
  s.length = 0;
}

void PagedKVCache::release(int seq) {
  clear(seq);
  seqs_[size_t(seq)].live = false;
}

int64_t PagedKVCache::length(int seq) const {
  ARIADNE_CHECK(live(seq), "kv cache: sequence ", seq, " is not a live sequence of this cache");
  return seqs_[size_t(seq)].length;
}

int64_t PagedKVCache::pages(int seq) const { return int64_t(page_table(seq).size()); }

const std::vector<int32_t>& PagedKVCache::page_table(int seq) const {
  ARIADNE_CHECK(live(seq), "kv cache: sequence ", seq, " is not a live sequence of this cache");
  return seqs_[size_t(seq)].pages;
}

int64_t PagedKVCache::page_bytes() const {
  return 2 * int64_t(cfg_.page_size) * cfg_.kv_heads * cfg_.head_dim * dtype_size(cfg_.dtype);
}

int64_t PagedKVCache::take_page() {
  if (free_pages_.empty()) {
    const int64_t grown = std::max<int64_t>(16, capacity_ * 2);
    ARIADNE_CHECK(grown < (int64_t(1) << 31), "kv cache: more than 2^31 pages");
    const int64_t row = int64_t(cfg_.kv_heads) * cfg_.head_dim;
    const size_t page = size_t(cfg_.page_size) * size_t(row) * size_t(dtype_size(cfg_.dtype));
    k_.resize(size_t(grown) * page);
    v_.resize(size_t(grown) * page);
    sum_.resize(size_t(grown * strides_per_page() * row));
    min_.resize(size_t(grown * row));
    max_.resize(size_t(grown * row));
    for (int64_t p = grown - 1; p >= capacity_; --p) free_pages_.push_back(p);
    capacity_ = grown;
  }
  const int64_t p = free_pages_.back();
  free_pages_.pop_back();
  return p;
}

// Recomputes the summaries of rows [0, row0 + rows) of a pool page from its stored keys (the
// values a decode reads, after rounding to the cache dtype). Only the strides touching the new
// rows change; min/max fold the new rows in (a fresh page starts from ±inf).
void PagedKVCache::summarize(int64_t pool_page, int64_t row0, int64_t rows) {
  const int d = cfg_.head_dim, H = cfg_.kv_heads, S = cfg_.summary_stride, P = cfg_.page_size;
  const int64_t row = int64_t(H) * d;
  const unsigned char* kp = k_.data();
  float* mn = min_.data() + pool_page * row;
  float* mx = max_.data() + pool_page * row;
  if (row0 == 0) {
    std::fill_n(mn, row, std::numeric_limits<float>::infinity());
    std::fill_n(mx, row, -std::numeric_limits<float>::infinity());
  }
  // Element i of token t's key of head h in the pool ([pages, kv_heads, page_size, head_dim]).
  const auto key = [&](int64_t t, int h, int i) {
    return decode_detail::load(kp, cfg_.dtype, ((pool_page * H + h) * P + t) * d + i);
  };
  for (int h = 0; h < H; ++h)
    for (int64_t t = row0; t < row0 + rows; ++t)
      for (int i = 0; i < d; ++i) {
        const float x = key(t, h, i);
        mn[h * d + i] = std::min(mn[h * d + i], x);
        mx[h * d + i] = std::max(mx[h * d + i], x);
      }
  // Stride sums in row order from the stride's first row, so a stride summed across appends
  // equals one summed at once.
  for (int h = 0; h < H; ++h)
    for (int64_t j = row0 / S; j <= (row0 + rows - 1) / S; ++j) {
      float* sum = sum_.data() + ((pool_page * H + h) * strides_per_page() + j) * d;
      std::fill_n(sum, d, 0.f);
      for (int64_t t = j * S; t < std::min<int64_t>((j + 1) * S, row0 + rows); ++t)
        for (int i = 0; i < d; ++i) sum[i] += key(t, h, i);
    }
}

void PagedKVCache::append(int seq, const TensorView& k, const TensorView& v) {
  ARIADNE_CHECK(live(seq), "kv cache append: sequence ", seq, " is not a live sequence of this cache");
  ARIADNE_CHECK(k.defined() && k.rank == 3, "kv cache append: k must be a 3-d tensor [tokens, kv_heads, head_dim]");
  const int64_t n = k.shape[0];
  check_kv(k, "k", cfg_, n);
  check_kv(v, "v", cfg_, n);
  Sequence& s = seqs_[size_t(seq)];
  ARIADNE_CHECK(s.length + n < (int64_t(1) << 31), "kv cache append: sequence ", seq, " would hold ", s.length + n,
                " tokens, more than 2^31 − 1");
  const int P = cfg_.page_size, H = cfg_.kv_heads, d = cfg_.head_dim;
  const int64_t esz = dtype_size(cfg_.dtype);
  int64_t done = 0;
  while (done < n) {
    const int64_t t = s.length, in_page = t % P;
    if (in_page == 0) s.pages.push_back(int32_t(take_page()));
    const int64_t pool = s.pages.back(), take = std::min<int64_t>(n - done, P - in_page);
    for (int h = 0; h < H; ++h)
      for (int64_t r = 0; r < take; ++r) {
        const size_t off = size_t(((pool * H + h) * P + in_page + r) * d * esz);
        store_row(k, done + r, h, cfg_.dtype, k_.data() + off, d);
        store_row(v, done + r, h, cfg_.dtype, v_.data() + off, d);
      }
    summarize(pool, in_page, take);
    s.length += take;
    done += take;
  }
}

TensorView PagedKVCache::k_pool() const {
  return make_view(const_cast<unsigned char*>(k_.data()), cfg_.dtype,
                   {capacity_, cfg_.kv_heads, cfg_.page_size, cfg_.head_dim});
}
TensorView PagedKVCache::v_pool() const {
  return make_view(const_cast<unsigned char*>(v_.data()), cfg_.dtype,
                   {capacity_, cfg_.kv_heads, cfg_.page_size, cfg_.head_dim});
}
const float* PagedKVCache::key_sum(int64_t p) const {
  return sum_.data() + p * strides_per_page() * cfg_.kv_heads * cfg_.head_dim;
}
const float* PagedKVCache::key_min(int64_t p) const { return min_.data() + p * cfg_.kv_heads * cfg_.head_dim; }
const float* PagedKVCache::key_max(int64_t p) const { return max_.data() + p * cfg_.kv_heads * cfg_.head_dim; }

}  // namespace ariadne

#if !defined(ARIADNE_WITH_CUDA)
// Builds without the CUDA backend: a device cache cannot be made, and says so.
namespace ariadne {
namespace {
[[noreturn]] void no_cuda() {
  detail::fail("the device decode (CudaKVCache, CudaPageSelection): this build of ariadne has no CUDA backend");
}
}  // namespace
struct CudaKVCache::Device {};
CudaKVCache::CudaKVCache() = default;
CudaKVCache::CudaKVCache(const PagedKVCache&) { no_cuda(); }
CudaKVCache::~CudaKVCache() = default;
CudaKVCache::CudaKVCache(CudaKVCache&&) noexcept = default;
CudaKVCache& CudaKVCache::operator=(CudaKVCache&&) noexcept = default;
void CudaKVCache::sync(const PagedKVCache&) { no_cuda(); }
bool CudaKVCache::live(int) const { return false; }
int64_t CudaKVCache::length(int) const { no_cuda(); }
const void* CudaKVCache::k_pool() const { no_cuda(); }
const void* CudaKVCache::v_pool() const { no_cuda(); }
const int32_t* CudaKVCache::block_table() const { no_cuda(); }
const int32_t* CudaKVCache::lengths() const { no_cuda(); }
const float* CudaKVCache::key_sum() const { no_cuda(); }
const float* CudaKVCache::key_min() const { no_cuda(); }
const float* CudaKVCache::key_max() const { no_cuda(); }
void CudaKVCache::reserve(std::span<const int32_t>, int64_t) { no_cuda(); }
void CudaKVCache::append(const TensorView&, const TensorView&, std::span<const int32_t>, const int32_t*, void*) {
  no_cuda();
}
void CudaKVCache::append_rows(int, const TensorView&, const TensorView&, void*) { no_cuda(); }
void CudaKVCache::refresh_lengths() { no_cuda(); }
struct CudaPageSelection::Device {};
CudaPageSelection::CudaPageSelection() = default;
CudaPageSelection::~CudaPageSelection() = default;
CudaPageSelection::CudaPageSelection(CudaPageSelection&&) noexcept = default;
CudaPageSelection& CudaPageSelection::operator=(CudaPageSelection&&) noexcept = default;
void CudaPageSelection::reserve(int64_t, int, int) { no_cuda(); }
const int32_t* CudaPageSelection::row_ptr() const { no_cuda(); }
const int32_t* CudaPageSelection::pages() const { no_cuda(); }
const int32_t* CudaPageSelection::visible() const { no_cuda(); }
const float* CudaPageSelection::kept_mass() const { no_cuda(); }
void CudaPageSelection::reset_step(int64_t) { no_cuda(); }
PageSelection CudaPageSelection::to_host() const { no_cuda(); }
namespace decode_detail {
void select_cuda(const DecodeParams&, const PageSelectConfig&, CudaPageSelection::Device&) { no_cuda(); }
void decode_cuda(const DecodeParams&) { no_cuda(); }
size_t decode_cuda_workspace(const DecodeParams&, int64_t) { no_cuda(); }
}  // namespace decode_detail
}  // namespace ariadne
#endif
