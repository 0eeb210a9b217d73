// Malformed inputs for the readers and parsers that reach undefined behaviour or exhaust the stack
// unless every size, offset and nesting depth is checked; each must throw ariadne::Error naming
// the input and the field. The sanitizer build (scripts/test) runs them with ASan + UBSan, where a
// missing check fails loudly.
#include <gtest/gtest.h>

#include <string>

#include "ariadne/error.hpp"
#include "ariadne/mask.hpp"
#include "ariadne/pattern.hpp"
#include "ariadne/schedule.hpp"
#include "common.hpp"

namespace {

using namespace ariadne;

using ariadne::testing::error_of;

// images[].width · height overflowed int64 (signed overflow) before the size limit was checked.
TEST(Hardening, CocoHugeImageSizeIsRejectedWithoutOverflow) {
  for (const char* wh : {"\"width\": 1099511627776, \"height\": 1099511627776",
                         "\"width\": 9223372036854775807, \"height\": 2", "\"width\": 3, \"height\": 4611686018427387904"}) {
    const std::string doc = std::string("{\"images\": [{\"id\": 1, \"file_name\": \"a.jpg\", ") + wh +
                            "}], \"annotations\": []}";
    const std::string msg = error_of([&] { (void)parse_coco(doc, "huge.json"); });
    EXPECT_NE(msg.find("huge.json: images[0]: size"), std::string::npos) << msg;
  }
}

// An integer argument of --pattern was converted to int64 before its range was checked: NaN, inf
// and 1e300 are undefined behaviour in that conversion.
TEST(Hardening, PatternSpecNonFiniteAndHugeNumbers) {
  for (const char* spec : {"window:1e300", "window:nan", "window:inf,3", "window:3,-inf", "chunk:1e19",
                           "blocks:0.5@1e300", "blocks:0.5@nan", "chunk:-1e300"}) {
    const std::string msg = error_of([&] { (void)parse_pattern_spec(spec); });
    EXPECT_NE(msg.find(std::string("pattern '") + spec + "'"), std::string::npos) << spec << ": " << msg;
  }
  EXPECT_EQ(parse_pattern_spec("window:3,5").dense.window_right, 5);  // still parses good input
}

// Schedule groups recursed once per '(' without a limit: a long run of '(' overflowed the stack.
TEST(Hardening, ScheduleDeepNestingIsRejected) {
  const std::string deep = std::string(200000, '(') + "R" + std::string(200000, ')');
  const std::string msg = error_of([&] { (void)parse_schedule(deep); });
  EXPECT_NE(msg.find("nested more than"), std::string::npos) << msg.substr(0, 200);
  // Moderate nesting stays valid.
  const std::string ok = std::string(20, '(') + "2xR F" + std::string(20, ')');
  EXPECT_EQ(parse_schedule(ok).layers.size(), 3u);
}

}  // namespace
