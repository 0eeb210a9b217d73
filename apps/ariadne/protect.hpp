// Block protections as the CLI spells them (prefill --protect, llm --protect, llm-probe
// --probe-protect): "published" (as each method was released), "none", or any of sink, diagonal,
// last_row joined by '+'; "previous" may be added (llm generation runs only:
// PrefillOptions::keep_previous, an experiment).
#pragma once

#include <optional>
#include <string>

#include "ariadne/estimate.hpp"

namespace ariadne::cli {

// nullopt for "published"; throws ariadne::Error naming the bad word.
std::optional<Protections> parse_protect(const std::string& s, bool allow_previous);
bool keeps_previous(const std::string& s);
std::string protections_text(const Protections& p);  // "sink+diagonal", "none"

}  // namespace ariadne::cli
