// The _ariadne extension module: thin bindings of the C++ library (the `ariadne` package wraps it).
//
// Every ariadne::Error becomes ariadne.Error, a subclass of ValueError, with the same message, so
// callers can catch either.
#include <nanobind/nanobind.h>

#include "ariadne/error.hpp"
#include "bindings.hpp"

NB_MODULE(_ariadne, m) {
  m.doc() = "ariadne: cheap softmax attention for multimodal LLMs (native bindings; use the ariadne package)";
  nanobind::exception<ariadne::Error>(m, "Error", PyExc_ValueError);
  ariadne::py::bind_attention(m);
  ariadne::py::bind_layout(m);
  ariadne::py::bind_estimate(m);
  ariadne::py::bind_decode(m);
  ariadne::py::bind_context_parallel(m);  // after bind_estimate: returns EstimateResult
  ariadne::py::bind_shs(m);
  ariadne::py::bind_vit(m);  // after bind_layout: its functions take and return Schedule
  m.def("_set_leak_warnings", &nanobind::set_leak_warnings, nanobind::arg("enabled"),
        "Turns nanobind's report of objects still alive at interpreter exit on or off.");
}
