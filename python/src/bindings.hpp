// The parts of the _ariadne extension module, one function per group of bindings.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>

#include "ariadne/estimate.hpp"

namespace ariadne::py {

void bind_attention(nanobind::module_& m);  // Pattern, BlockMask, attention_into, backends
void bind_layout(nanobind::module_& m);     // token orders, schedules, cost model, receptive field
void bind_estimate(nanobind::module_& m);   // block-sparse estimators, their metrics, prefill
void bind_decode(nanobind::module_& m);     // paged KV cache, decode attention, page selection
void bind_context_parallel(nanobind::module_& m);  // ring pieces, LSE merge, RR from key sums
void bind_shs(nanobind::module_& m);        // SHS-Index: patch labels, layer diagnostics, accumulator
void bind_vit(nanobind::module_& m);        // vision encoder: images, config, preprocess, weights, encode

// An estimator's `protect` argument: None for the method's published protections, else the names
// to keep ("last_row", "sink", "diagonal"; an empty list keeps none). Errors name the argument.
std::optional<Protections> protections_of(const std::optional<std::vector<std::string>>& names);

}  // namespace ariadne::py
