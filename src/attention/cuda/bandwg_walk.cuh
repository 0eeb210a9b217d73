// Internal: the wgmma band kernel's walk over its run of query tiles and their key chunks, which
// producer and consumers compute alike (attention_bandwg.cuh).
#pragma once

#include "attention/cuda/bandwg_shape.cuh"

namespace ariadne::cuda {

template <int BM, int CK>
struct BandWgWalk {
  const Pattern* pat;
  int64_t t, t_end, total_q, total_k;
  bool varlen;
  int s_hint = 0;
  int cur_s = -1;      // sequence of the resident chunks
  int have_hi = 0;     // resident chunks end here (sequence chunk index)
  int prev_c_lo = 0;
  int shift = 0;       // ring number = chunk index + shift
  int n_next = 0;      // next free ring number

  __device__ BandWgWalk(const Pattern& p, int64_t first, int64_t end, int64_t tq, int64_t tk)
      : pat(&p), t(first), t_end(end), total_q(tq), total_k(tk), varlen(p.cu_seqlens_q != nullptr) {
    // The run's first sequence; later tiles only move forward from it.
    if (varlen) s_hint = virtual_tile_seq<BM>(p, first);
  }

  // The next virtual tile that holds query rows (virtual tiles past a sequence's end are empty).
  __device__ BandWgTile next() {
    BandWgTile b;
    while (t < t_end) {
      const int64_t v = t++;
      int64_t tile = v;
      if (varlen) {
        while (s_hint + 1 < pat->num_seqs && s_hint + 1 + pat->cu_seqlens_q[s_hint + 1] / BM <= v) ++s_hint;
        tile = v - (s_hint + pat->cu_seqlens_q[s_hint] / BM);
      }
      b.e = pat->seq(s_hint, total_q, total_k);
      if (tile * BM >= b.e.lq) continue;
      b.q_lo = int(tile * BM);
      b.q_hi = b.q_lo + BM < b.e.lq ? b.q_lo + BM : int(b.e.lq);
      const BandRule rule(*pat, b.e);
      int lo_last, hi_first;
      rule.bounds(b.q_lo, b.k_lo, hi_first);
      rule.bounds(b.q_hi - 1, lo_last, b.k_hi);
      b.valid = true;
      if (b.k_hi <= b.k_lo) {  // no row of the tile sees a key
        b.n_lo = n_next;
        return b;
      }
      const int c_lo = b.k_lo / CK, c_hi = (b.k_hi + CK - 1) / CK;
      if (s_hint == cur_s && c_lo >= prev_c_lo && c_lo <= have_hi) {
        b.ld_lo = have_hi;  // continues the resident chunks: only those past have_hi are new
        b.ld_hi = c_hi > have_hi ? c_hi : have_hi;
      } else {
        cur_s = s_hint;  // a new sequence or a jump: fresh ring numbers
        shift = n_next - c_lo;
        b.ld_lo = c_lo;
        b.ld_hi = c_hi;
      }
      have_hi = b.ld_hi;
      n_next = have_hi + shift;
      prev_c_lo = c_lo;
      b.c_lo = c_lo;
      b.nc = c_hi - c_lo;
      b.n_lo = c_lo + shift;
      return b;
    }
    return b;
  }
};

}  // namespace ariadne::cuda
