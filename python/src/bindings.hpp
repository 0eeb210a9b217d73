// The parts of the _ariadne extension module, one function per group of bindings.
#pragma once

#include <nanobind/nanobind.h>

namespace ariadne::py {

void bind_attention(nanobind::module_& m);  // Pattern, BlockMask, attention_into, backends
void bind_layout(nanobind::module_& m);     // token orders, schedules, cost model, receptive field
void bind_estimate(nanobind::module_& m);   // block-sparse estimators, their metrics, prefill
void bind_decode(nanobind::module_& m);     // paged KV cache, decode attention, page selection
void bind_context_parallel(nanobind::module_& m);  // ring pieces, LSE merge, RR from key sums
void bind_shs(nanobind::module_& m);        // SHS-Index: patch labels, layer diagnostics, accumulator
void bind_vit(nanobind::module_& m);        // vision encoder: images, config, preprocess, weights, encode

}  // namespace ariadne::py
