// Byte-level BPE: the pre-tokenizer's pieces on hand-worked strings, merge priority on a tiny
// vocabulary, byte round trips, special tokens, and (when SmolLM2 is present) the ids HF's
// tokenizer gives for the committed texts.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "ariadne/error.hpp"
#include "ariadne/gguf.hpp"
#include "ariadne/llm.hpp"
#include "ariadne/tokenizer.hpp"

namespace ariadne {
namespace {

using Pieces = std::vector<std::string>;

TEST(Tokenizer, PreTokenizerPieces) {
  EXPECT_EQ(BpeTokenizer::pre_tokenize("Hello world"), (Pieces{"Hello", " world"}));
  // Digits are single pieces; the space before them stays alone.
  EXPECT_EQ(BpeTokenizer::pre_tokenize("is 71432."), (Pieces{"is", " ", "7", "1", "4", "3", "2", "."}));
  // A white-space run followed by a word gives its last space to the word.
  EXPECT_EQ(BpeTokenizer::pre_tokenize("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("x\n\n  y"), (Pieces{"x", "\n\n ", " y"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("x\ny"), (Pieces{"x", "\n", "y"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("end  "), (Pieces{"end", "  "}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("don't we'll"), (Pieces{"don", "'t", " we", "'ll"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("a+=b!!"), (Pieces{"a", "+=", "b", "!!"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize(" ?!x"), (Pieces{" ?!", "x"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize("café über"), (Pieces{"café", " über"}));
  EXPECT_EQ(BpeTokenizer::pre_tokenize(""), Pieces{});
  // The pieces always concatenate back to the input, invalid UTF-8 included.
  std::mt19937 rng(7);
  const std::string alphabet = std::string("ab1 \n\t'.,!") + "\xc3\xa9" + "\xff\x80";
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    const int n = int(rng() % 30);
    for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    std::string joined;
    for (const std::string& p : BpeTokenizer::pre_tokenize(s)) {
      EXPECT_FALSE(p.empty());
      joined += p;
    }
    EXPECT_EQ(joined, s);
  }
}

// A vocabulary of the 256 byte characters (GPT-2 alphabet) plus a few merged symbols.
BpeTokenizer tiny(const std::vector<std::string>& merges) {
  std::vector<std::string> tokens;
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const uint32_t cp = keep ? uint32_t(b) : uint32_t(256 + next++);
    std::string s;
    if (cp < 0x80) s += char(cp);
    else s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
    tokens.push_back(s);
  }
  std::vector<int32_t> types(tokens.size(), 1);
  for (const std::string& m : merges) {
    const size_t sp = m.find(' ');
    tokens.push_back(m.substr(0, sp) + m.substr(sp + 1));
    types.push_back(1);
  }
  tokens.push_back("<|im_start|>");
  types.push_back(3);
  return BpeTokenizer(tokens, types, merges, -1, -1, false, "tiny");
}

TEST(Tokenizer, MergePriorityAndFallback) {
  // "a b" before "b c": abc → ab + c.  The reverse order: a + bc.
  const BpeTokenizer t1 = tiny({"a b", "b c"});
  const BpeTokenizer t2 = tiny({"b c", "a b"});
  EXPECT_EQ(t1.encode("abc"), (std::vector<int32_t>{t1.find("ab"), t1.find("c")}));
  EXPECT_EQ(t2.encode("abc"), (std::vector<int32_t>{t2.find("a"), t2.find("bc")}));
  // Chained merges and all occurrences: abab → ab ab; with "ab ab" → abab.
  const BpeTokenizer t3 = tiny({"a b", "ab ab"});
  EXPECT_EQ(t3.encode("abab"), (std::vector<int32_t>{t3.find("abab")}));
  EXPECT_EQ(t3.encode("ababab"), (std::vector<int32_t>{t3.find("abab"), t3.find("ab")}));
  // A space is byte 32 → U+0120 'Ġ' in the vocabulary.
  EXPECT_EQ(t1.encode(" a"), (std::vector<int32_t>{t1.find("\xc4\xa0"), t1.find("a")}));
  // Special tokens are matched only when asked.
  const auto sp = t1.encode("x<|im_start|>y");
  EXPECT_EQ(sp, (std::vector<int32_t>{t1.find("x"), t1.find("<|im_start|>"), t1.find("y")}));
  EXPECT_GT(t1.encode("x<|im_start|>y", false).size(), 3u);
  EXPECT_EQ(t1.decode(sp), "x<|im_start|>y");
  EXPECT_THROW(t1.decode({100000}), Error);
  EXPECT_THROW(BpeTokenizer({"a"}, {}, {"nospace"}, -1, -1, false, "m"), Error);
  EXPECT_THROW(BpeTokenizer({"a"}, {1, 1}, {}, -1, -1, false, "m"), Error);
  EXPECT_THROW(BpeTokenizer({"a"}, {}, {}, 5, -1, false, "m"), Error);
}

TEST(Tokenizer, ByteRoundTrip) {
  const BpeTokenizer t = tiny({"a b", "ab c", "\xc4\xa0 a"});
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    const int n = int(rng() % 40);
    for (int i = 0; i < n; ++i) s += char(rng() % 256);
    EXPECT_EQ(t.decode(t.encode(s, false)), s);
  }
}

// Ids from HF's tokenizer built from the same GGUF (tests/data/smollm2_reference.json).
TEST(Tokenizer, SmolLM2MatchesHF) {
  const std::string path = llm_model_path();
  if (path.empty()) GTEST_SKIP() << "SmolLM2 GGUF absent: " << llm_model_hint();
  const char* src = std::getenv("ARIADNE_SOURCE_DIR");
  const std::string ref_path = std::string(src ? src : ".") + "/tests/data/smollm2_reference.json";
  std::ifstream in(ref_path);
  ASSERT_TRUE(in) << ref_path;
  const nlohmann::json ref = nlohmann::json::parse(in);
  const GgufFile f = GgufFile::open(path);
  const BpeTokenizer tok = BpeTokenizer::from_gguf(f);
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_EQ(tok.eos(), 2);
  for (const auto& item : ref["tokenized"]) {
    const std::string text = item["text"];
    const std::vector<int32_t> want = item["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), want) << "text: " << text;
    EXPECT_EQ(tok.decode(tok.encode(text)), text);
  }
  EXPECT_EQ(tok.encode(ref["prompt"].get<std::string>()), ref["prompt_ids"].get<std::vector<int32_t>>());
}

}  // namespace
}  // namespace ariadne
