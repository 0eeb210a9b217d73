// CudaKVCache (include/ariadne/decode.hpp): the device copy of a host PagedKVCache, with the block
// table and lengths the decode kernels read, and the page bookkeeping of its own appends (the
// kernels: append_cuda.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <unordered_set>
#include <utility>

#include "ariadne/decode.hpp"
#include "ariadne/device.hpp"
#include "ariadne/error.hpp"
#include "decode/internal.hpp"

namespace ariadne {

struct CudaKVCache::Device {
  DeviceBuffer k, v, sum, min, max, table, lengths;
};

CudaKVCache::CudaKVCache() = default;
CudaKVCache::CudaKVCache(const PagedKVCache& twin) { sync(twin); }
CudaKVCache::~CudaKVCache() { delete dev_; }
CudaKVCache::CudaKVCache(CudaKVCache&& o) noexcept
    : cfg_(o.cfg_), capacity_(o.capacity_), max_pages_(o.max_pages_), lengths_(std::move(o.lengths_)),
      table_(std::move(o.table_)), free_(std::move(o.free_)), dev_(std::exchange(o.dev_, nullptr)) {}
CudaKVCache& CudaKVCache::operator=(CudaKVCache&& o) noexcept {
  if (this != &o) {
    delete dev_;
    cfg_ = o.cfg_;
    capacity_ = o.capacity_;
    max_pages_ = o.max_pages_;
    lengths_ = std::move(o.lengths_);
    table_ = std::move(o.table_);
    free_ = std::move(o.free_);
    dev_ = std::exchange(o.dev_, nullptr);
  }
  return *this;
}

void CudaKVCache::sync(const PagedKVCache& twin) {
  const KVCacheConfig& c = twin.config();
  const int seqs = twin.sequence_slots();
  int max_pages = 1;
  for (int s = 0; s < seqs; ++s)
    if (twin.live(s)) max_pages = std::max<int>(max_pages, int(twin.pages(s)));
  std::vector<int32_t> table(size_t(std::max(seqs, 1)) * size_t(max_pages), -1);
  std::vector<int32_t> lengths(size_t(std::max(seqs, 1)), 0);
  std::vector<int64_t> host_lengths(size_t(seqs), -1);
  for (int s = 0; s < seqs; ++s) {
    if (!twin.live(s)) continue;
    const std::vector<int32_t>& pt = twin.page_table(s);
    std::copy(pt.begin(), pt.end(), table.begin() + int64_t(s) * max_pages);
    lengths[size_t(s)] = int32_t(twin.length(s));
    host_lengths[size_t(s)] = twin.length(s);
  }
  auto* d = new Device;
  const int64_t cap = std::max<int64_t>(twin.capacity_pages(), 1);
  const int64_t row = int64_t(c.kv_heads) * c.head_dim;
  if (twin.capacity_pages() > 0) {
    d->k = DeviceBuffer::from_host(twin.k_pool().data, c.dtype, {cap, c.kv_heads, c.page_size, c.head_dim});
    d->v = DeviceBuffer::from_host(twin.v_pool().data, c.dtype, {cap, c.kv_heads, c.page_size, c.head_dim});
    d->sum = DeviceBuffer::from_host(twin.key_sum(0), DType::f32, {cap, c.kv_heads, twin.strides_per_page(), c.head_dim});
    d->min = DeviceBuffer::from_host(twin.key_min(0), DType::f32, {cap, row});
    d->max = DeviceBuffer::from_host(twin.key_max(0), DType::f32, {cap, row});
  } else {  // no page yet: one page of room, so every pointer is valid
    d->k = DeviceBuffer(c.dtype, {cap, c.kv_heads, c.page_size, c.head_dim});
    d->v = DeviceBuffer(c.dtype, {cap, c.kv_heads, c.page_size, c.head_dim});
    d->sum = DeviceBuffer(DType::f32, {cap, c.kv_heads, twin.strides_per_page(), c.head_dim});
    d->min = DeviceBuffer(DType::f32, {cap, row});
    d->max = DeviceBuffer(DType::f32, {cap, row});
  }
  d->table = DeviceBuffer::from_ints(table);
  d->lengths = DeviceBuffer::from_ints(lengths);
  delete dev_;
  dev_ = d;
  cfg_ = c;
  capacity_ = twin.capacity_pages();
  max_pages_ = max_pages;
  lengths_ = std::move(host_lengths);
  table_ = std::move(table);
  free_ = twin.free_pages();
}

namespace {
const CudaKVCache::Device& need(const CudaKVCache::Device* d) {
  ARIADNE_CHECK(d != nullptr, "device kv cache: empty (construct it from a host cache, or sync())");
  return *d;
}
void check(cudaError_t e, const char* what) {
  ARIADNE_CHECK(e == cudaSuccess, "device kv cache: ", what, ": ", cudaGetErrorString(e));
}

// k and v of an append (`what`): device tensors [n, kv_heads, head_dim] of the cache's dtype with a
// contiguous head dim; `first` is how an error names n, `why` what the first dim holds.
void check_rows(const KVCacheConfig& c, const TensorView& k, const TensorView& v, int64_t n, const char* what,
                const std::string& first, const char* why) {
  for (const auto& [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    ARIADNE_CHECK(t->defined() && t->device == ::ariadne::Device::cuda, "device kv cache ", what, ": ", name,
                  " must be a device tensor, got ", t->defined() ? t->describe() : std::string("nothing"));
    ARIADNE_CHECK(t->rank == 3 && t->shape[0] == n && t->shape[1] == c.kv_heads && t->shape[2] == c.head_dim,
                  "device kv cache ", what, ": ", name, " is ", t->describe(), ", expected [", first, ", ", c.kv_heads,
                  ", ", c.head_dim, "] (", why, ", the cache's kv_heads and head_dim)");
    ARIADNE_CHECK(t->dtype == c.dtype, "device kv cache ", what, ": ", name, " has dtype ", dtype_name(t->dtype),
                  ", expected the cache's ", dtype_name(c.dtype));
    ARIADNE_CHECK(t->stride[2] == 1, "device kv cache ", what, ": ", name, " needs a contiguous head dim, got ",
                  t->describe());
  }
}

// The fields every append shares: the new rows, the pools and summaries, the geometry.
void fill_pool(decode_detail::AppendPool& a, const KVCacheConfig& c, const CudaKVCache::Device& d,
               const TensorView& k, const TensorView& v, void* stream) {
  a.k = k.data;
  a.v = v.data;
  a.k_s0 = k.stride[0];
  a.k_sh = k.stride[1];
  a.v_s0 = v.stride[0];
  a.v_sh = v.stride[1];
  a.k_pool = d.k.data();
  a.v_pool = d.v.data();
  a.sum = static_cast<float*>(d.sum.data());
  a.min = static_cast<float*>(d.min.data());
  a.max = static_cast<float*>(d.max.data());
  a.kv_heads = c.kv_heads;
  a.head_dim = c.head_dim;
  a.page_size = c.page_size;
  a.summary_stride = c.summary_stride;
  a.dtype = c.dtype;
  a.stream = stream;
}
}  // namespace

// A free pool page; with none left the pools double (at least 16 pages), as the host twin's do, and
// the new pages join the free list in the host's order.
int64_t CudaKVCache::take_page() {
  if (free_.empty()) {
    const int64_t grown = std::max<int64_t>(16, capacity_ * 2);
    ARIADNE_CHECK(grown < (int64_t(1) << 31), "device kv cache: more than 2^31 pages");
    const KVCacheConfig& c = cfg_;
    const int64_t spp = c.page_size / c.summary_stride;
    const auto regrow = [&](DeviceBuffer& b, DType dt, std::vector<int64_t> shape) {
      DeviceBuffer n(dt, shape);
      if (capacity_ > 0)  // the old pages keep their contents (an empty cache's one-page room has none)
        check(cudaMemcpy(n.data(), b.data(), b.bytes(), cudaMemcpyDeviceToDevice), "growing the pools");
      b = std::move(n);
    };
    regrow(dev_->k, c.dtype, {grown, c.kv_heads, c.page_size, c.head_dim});
    regrow(dev_->v, c.dtype, {grown, c.kv_heads, c.page_size, c.head_dim});
    regrow(dev_->sum, DType::f32, {grown, c.kv_heads, spp, c.head_dim});
    regrow(dev_->min, DType::f32, {grown, int64_t(c.kv_heads) * c.head_dim});
    regrow(dev_->max, DType::f32, {grown, int64_t(c.kv_heads) * c.head_dim});
    for (int64_t p = grown - 1; p >= capacity_; --p) free_.push_back(p);
    capacity_ = grown;
  }
  const int64_t p = free_.back();
  free_.pop_back();
  return p;
}

// The table keeps its device buffer while its size stays (a reserve that takes pages for the same
// widths), so a CUDA graph captured over the cache stays valid until the pools or the width grow.
void CudaKVCache::upload_table() {
  const size_t bytes = table_.size() * sizeof(int32_t);
  if (dev_->table.data() != nullptr && dev_->table.bytes() == bytes)
    check(cudaMemcpy(dev_->table.data(), table_.data(), bytes, cudaMemcpyHostToDevice), "block table upload");
  else
    dev_->table = DeviceBuffer::from_ints(table_);
}

void CudaKVCache::reserve(std::span<const int32_t> seqs, int64_t tokens) {
  need(dev_);
  ARIADNE_CHECK(tokens >= 0 && tokens < (int64_t(1) << 30), "device kv cache reserve: tokens is ", tokens,
                ", expected 0 … 2^30");
  const int P = cfg_.page_size;
  int widest = max_pages_;
  for (const int32_t s : seqs) {
    ARIADNE_CHECK(live(s), "device kv cache reserve: sequence ", s, " is not a live sequence of this cache");
    ARIADNE_CHECK(lengths_[size_t(s)] + tokens < (int64_t(1) << 31), "device kv cache reserve: sequence ", s,
                  " would hold more than 2^31 − 1 tokens");
    widest = std::max<int>(widest, int((lengths_[size_t(s)] + tokens + P - 1) / P));
  }
  if (widest > max_pages_) {  // a wider table, rows copied over
    std::vector<int32_t> wide(table_.size() / size_t(std::max(max_pages_, 1)) * size_t(widest), -1);
    const size_t rows = table_.size() / size_t(std::max(max_pages_, 1));
    for (size_t r = 0; r < rows; ++r)
      std::copy_n(table_.begin() + int64_t(r) * max_pages_, max_pages_, wide.begin() + int64_t(r) * widest);
    table_.swap(wide);
    max_pages_ = widest;
  }
  for (const int32_t s : seqs) {
    const int64_t need_pages = (lengths_[size_t(s)] + tokens + P - 1) / P;
    int32_t* row = table_.data() + int64_t(s) * max_pages_;
    for (int64_t i = 0; i < need_pages; ++i)
      if (row[i] < 0) row[i] = int32_t(take_page());
  }
  upload_table();
}

void CudaKVCache::append(const TensorView& k, const TensorView& v, std::span<const int32_t> seqs,
                         const int32_t* device_seqs, void* stream) {
  need(dev_);
  const KVCacheConfig& c = cfg_;
  const int64_t B = int64_t(seqs.size());
  ARIADNE_CHECK(c.dtype == DType::bf16 || c.dtype == DType::f16, "device kv cache append: the cache stores ",
                dtype_name(c.dtype), "; device appends take bf16 or f16 caches");
  check_rows(c, k, v, B, "append", std::to_string(B), "one token per sequence id");
  ARIADNE_CHECK(B == 0 || device_seqs != nullptr, "device kv cache append: device_seqs is null (the ids in device memory)");
  std::unordered_set<int32_t> seen;
  for (const int32_t s : seqs) {
    ARIADNE_CHECK(live(s), "device kv cache append: sequence ", s, " is not a live sequence of this cache");
    ARIADNE_CHECK(seen.insert(s).second, "device kv cache append: sequence ", s,
                  " appears twice in one step (one token per sequence)");
    const int64_t t = lengths_[size_t(s)];
    ARIADNE_CHECK(t / c.page_size < max_pages_ && table_[size_t(int64_t(s) * max_pages_ + t / c.page_size)] >= 0,
                  "device kv cache append: sequence ", s, " has no page reserved for its token ", t,
                  ": call reserve() first");
  }
  decode_detail::AppendArgs a{};
  fill_pool(a, c, *dev_, k, v, stream);
  a.table = static_cast<const int32_t*>(dev_->table.data());
  a.max_pages = max_pages_;
  a.lengths = static_cast<int32_t*>(dev_->lengths.data());
  a.seqs = device_seqs;
  a.batch = int(B);
  decode_detail::append_cuda(a);
  for (const int32_t s : seqs) ++lengths_[size_t(s)];
}

void CudaKVCache::append_rows(int seq, const TensorView& k, const TensorView& v, void* stream) {
  need(dev_);
  const KVCacheConfig& c = cfg_;
  ARIADNE_CHECK(c.dtype == DType::bf16 || c.dtype == DType::f16, "device kv cache append_rows: the cache stores ",
                dtype_name(c.dtype), "; device appends take bf16 or f16 caches");
  ARIADNE_CHECK(live(seq), "device kv cache append_rows: sequence ", seq, " is not a live sequence of this cache");
  const int64_t n = k.defined() && k.rank == 3 ? k.shape[0] : -1;
  check_rows(c, k, v, n, "append_rows", "tokens", "k and v the same tokens");
  ARIADNE_CHECK(n < (int64_t(1) << 30), "device kv cache append_rows: ", n, " tokens, expected fewer than 2^30");
  if (n == 0) return;
  const int32_t one[1] = {seq};
  reserve(one, n);
  const int64_t t0 = lengths_[size_t(seq)];
  decode_detail::AppendRowsArgs a{};
  fill_pool(a, c, *dev_, k, v, stream);
  a.table_row = static_cast<const int32_t*>(dev_->table.data()) + int64_t(seq) * max_pages_;
  a.length = static_cast<int32_t*>(dev_->lengths.data()) + seq;
  a.t0 = t0;
  a.n = int(n);
  decode_detail::append_rows_cuda(a);
  lengths_[size_t(seq)] = t0 + n;
}

void CudaKVCache::appended(std::span<const int32_t> seqs) {
  need(dev_);
  for (const int32_t s : seqs) {
    ARIADNE_CHECK(live(s), "device kv cache appended: sequence ", s, " is not a live sequence of this cache");
    ++lengths_[size_t(s)];
  }
}

void CudaKVCache::refresh_lengths() {
  need(dev_);
  std::vector<int32_t> dev(lengths_.size(), 0);
  if (!dev.empty()) dev_->lengths.copy_to_host(dev.data(), dev.size() * sizeof(int32_t));
  for (size_t s = 0; s < lengths_.size(); ++s)
    if (lengths_[s] >= 0) lengths_[s] = dev[s];
}

bool CudaKVCache::live(int seq) const { return seq >= 0 && size_t(seq) < lengths_.size() && lengths_[size_t(seq)] >= 0; }

int64_t CudaKVCache::length(int seq) const {
  ARIADNE_CHECK(live(seq), "device kv cache: sequence ", seq, " is not a live sequence of this cache");
  return lengths_[size_t(seq)];
}


const void* CudaKVCache::k_pool() const { return need(dev_).k.data(); }
const void* CudaKVCache::v_pool() const { return need(dev_).v.data(); }
const int32_t* CudaKVCache::block_table() const { return static_cast<const int32_t*>(need(dev_).table.data()); }
const int32_t* CudaKVCache::lengths() const { return static_cast<const int32_t*>(need(dev_).lengths.data()); }
const float* CudaKVCache::key_sum() const { return static_cast<const float*>(need(dev_).sum.data()); }
const float* CudaKVCache::key_min() const { return static_cast<const float*>(need(dev_).min.data()); }
const float* CudaKVCache::key_max() const { return static_cast<const float*>(need(dev_).max.data()); }

}  // namespace ariadne
