// ariadne/llm_tasks.hpp — retrieval tasks with one right answer, generated offline (RULER-style).
//
//  passkey  The classic passkey prompt: a short instruction, the filler "The grass is green. The
//           sky is blue. The sun is yellow. Here we go. There and back again." repeated, the
//           needle "The pass key is N. Remember it. N is the pass key." at a chosen depth, then
//           "What is the pass key? The pass key is". N: 5 random digits.
//  niah     RULER's single needle with essay-like filler replaced by the same repeated sentences:
//           "One of the special magic numbers for W is: N." with W a word and N 7 random
//           digits, asked as "What is the special magic number for W mentioned in the provided
//           text? The special magic number for W mentioned in the provided text is".
// The filler is repeated as often as fits so that the whole prompt has at most `tokens` tokens
// under the given tokenizer (the prompt is within one filler sentence group of the target).
// depth ∈ [0, 1]: share of the filler placed before the needle. Scoring is exact match: the first
// run of digits in the generated text equals N.
#pragma once

#include <cstdint>
#include <string>

namespace ariadne {

class BpeTokenizer;

struct RetrievalTask {
  std::string kind;     // "passkey" | "niah"
  std::string prompt;
  std::string answer;   // the digits
  int64_t tokens = 0;   // prompt length in tokens
  double depth = 0;
  uint64_t seed = 0;
};

// Throws ariadne::Error for an unknown kind, depth outside [0, 1] or a target too small for the
// instruction, needle and question.
RetrievalTask make_retrieval_task(const std::string& kind, const BpeTokenizer& tok, int64_t tokens, double depth,
                                  uint64_t seed);

// Exact match: the first run of ASCII digits in `generated` equals `answer`.
bool retrieval_correct(const std::string& generated, const std::string& answer);

}  // namespace ariadne
