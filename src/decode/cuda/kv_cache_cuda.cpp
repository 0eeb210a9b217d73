// CudaKVCache (include/ariadne/decode.hpp): the device copy of a host PagedKVCache, with the block
// table and lengths the decode kernels read.
#include <algorithm>
#include <utility>

#include "ariadne/decode.hpp"
#include "ariadne/device.hpp"
#include "ariadne/error.hpp"

namespace ariadne {

struct CudaKVCache::Device {
  DeviceBuffer k, v, sum, min, max, table, lengths;
};

CudaKVCache::CudaKVCache() = default;
CudaKVCache::CudaKVCache(const PagedKVCache& twin) { sync(twin); }
CudaKVCache::~CudaKVCache() { delete dev_; }
CudaKVCache::CudaKVCache(CudaKVCache&& o) noexcept
    : cfg_(o.cfg_), capacity_(o.capacity_), max_pages_(o.max_pages_), lengths_(std::move(o.lengths_)),
      dev_(std::exchange(o.dev_, nullptr)) {}
CudaKVCache& CudaKVCache::operator=(CudaKVCache&& o) noexcept {
  if (this != &o) {
    delete dev_;
    cfg_ = o.cfg_;
    capacity_ = o.capacity_;
    max_pages_ = o.max_pages_;
    lengths_ = std::move(o.lengths_);
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
}

bool CudaKVCache::live(int seq) const { return seq >= 0 && size_t(seq) < lengths_.size() && lengths_[size_t(seq)] >= 0; }

int64_t CudaKVCache::length(int seq) const {
  ARIADNE_CHECK(live(seq), "device kv cache: sequence ", seq, " is not a live sequence of this cache");
  return lengths_[size_t(seq)];
}

namespace {
const CudaKVCache::Device& need(const CudaKVCache::Device* d) {
  ARIADNE_CHECK(d != nullptr, "device kv cache: empty (construct it from a host cache, or sync())");
  return *d;
}
}  // namespace

const void* CudaKVCache::k_pool() const { return need(dev_).k.data(); }
const void* CudaKVCache::v_pool() const { return need(dev_).v.data(); }
const int32_t* CudaKVCache::block_table() const { return static_cast<const int32_t*>(need(dev_).table.data()); }
const int32_t* CudaKVCache::lengths() const { return static_cast<const int32_t*>(need(dev_).lengths.data()); }
const float* CudaKVCache::key_sum() const { return static_cast<const float*>(need(dev_).sum.data()); }
const float* CudaKVCache::key_min() const { return static_cast<const float*>(need(dev_).min.data()); }
const float* CudaKVCache::key_max() const { return static_cast<const float*>(need(dev_).max.data()); }

}  // namespace ariadne
