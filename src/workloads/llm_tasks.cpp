// Retrieval tasks (src/workloads/llm_tasks.hpp).
#include "workloads/llm_tasks.hpp"

#include <cctype>
#include <cmath>

#include "ariadne/error.hpp"
#include "ariadne/tokenizer.hpp"

namespace ariadne {

namespace {

// splitmix64: a small, well-mixed generator so the tasks are the same on every machine.
uint64_t mix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string digits(uint64_t& s, int n) {
  std::string d;
  d += char('1' + mix(s) % 9);  // no leading zero
  for (int i = 1; i < n; ++i) d += char('0' + mix(s) % 10);
  return d;
}

const char* const kFiller = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
const char* const kWords[] = {"apple", "river", "window", "garden", "pencil", "rocket", "violin", "harbor",
                              "lantern", "meadow", "falcon", "copper", "orchid", "glacier", "compass", "tunnel"};

}  // namespace

RetrievalTask make_retrieval_task(const std::string& kind, const BpeTokenizer& tok, int64_t tokens, double depth,
                                  uint64_t seed) {
  ARIADNE_CHECK(depth >= 0 && depth <= 1, "retrieval task: depth ", depth, " is outside [0, 1]");
  RetrievalTask t;
  t.kind = kind;
  t.depth = depth;
  t.seed = seed;
  uint64_t s = seed * 0x2545F4914F6CDD1Dull + 1;
  std::string intro, needle, question;
  if (kind == "passkey") {
    t.answer = digits(s, 5);
    intro = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
            "I will quiz you about the important information there.";
    needle = " The pass key is " + t.answer + ". Remember it. " + t.answer + " is the pass key.";
    question = "\nWhat is the pass key? The pass key is";
  } else if (kind == "niah") {
    t.answer = digits(s, 7);
    const std::string w = kWords[mix(s) % (sizeof kWords / sizeof kWords[0])];
    intro = "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the numbers afterwards.";
    needle = " One of the special magic numbers for " + w + " is: " + t.answer + ".";
    question = "\nWhat is the special magic number for " + w + " mentioned in the provided text? "
               "The special magic number for " + w + " mentioned in the provided text is";
  } else {
    detail::fail("retrieval task: kind '", kind, "' is unknown, expected passkey or niah");
  }
  auto build = [&](int64_t reps) {
    const int64_t before = int64_t(std::llround(depth * double(reps)));
    std::string p = intro;
    for (int64_t i = 0; i < before; ++i) p += kFiller;
    p += needle;
    for (int64_t i = before; i < reps; ++i) p += kFiller;
    return p + question;
  };
  const auto count = [&](const std::string& p) { return int64_t(tok.encode(p, false).size()); };
  const int64_t base = count(build(0));
  ARIADNE_CHECK(base <= tokens, "retrieval task: ", tokens, " tokens is below the ", base,
                " that the instruction, needle and question take");
  const int64_t per = std::max<int64_t>(1, count(build(8)) - base) ;  // tokens per 8 fillers
  int64_t reps = std::max<int64_t>(0, (tokens - base) * 8 / per);
  // The estimate is within a few tokens; walk to the largest count that fits.
  while (reps > 0 && count(build(reps)) > tokens) --reps;
  while (count(build(reps + 1)) <= tokens) ++reps;
  t.prompt = build(reps);
  t.tokens = count(t.prompt);
  return t;
}

bool retrieval_correct(const std::string& generated, const std::string& answer) {
  size_t i = 0;
  while (i < generated.size() && !std::isdigit(uint8_t(generated[i]))) ++i;
  size_t j = i;
  while (j < generated.size() && std::isdigit(uint8_t(generated[j]))) ++j;
  return j > i && generated.compare(i, j - i, answer) == 0 && j - i == answer.size();
}

}  // namespace ariadne
