// ariadne/tokenizer.hpp — the byte-level BPE tokenizer of GPT-2-style GGUF files (SmolLM2, Llama 3).
//
// Tables come from the file's metadata: tokenizer.ggml.tokens (strings in the GPT-2 byte-to-unicode
// alphabet), tokenizer.ggml.merges ("a b", by priority), tokenizer.ggml.token_type (1 normal,
// 3 control, 4 user-defined, 6 byte), tokenizer.ggml.bos_token_id / eos_token_id,
// tokenizer.ggml.add_bos_token.
//
// encode(text):
//  1. Special tokens: when parse_special, control and user-defined tokens found in the text
//     ("<|im_start|>") become their ids (longest match first); the rest is ordinary text.
//  2. Pre-tokenizer (tokenizer.ggml.pre "smollm", i.e. HF's Sequence[Digits(individual),
//     ByteLevel(regex)]): every digit is its own piece, then each stretch between digits is cut by
//     the GPT-2 rule
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     Character classes on code points: ASCII exactly; above ASCII, Unicode white space (U+0085,
//     U+00A0, U+1680, U+2000–U+200A, U+2028/9, U+202F, U+205F, U+3000) is \s, the Latin-1
//     superscripts/fractions (U+00B2, B3, B9, BC–BE) are \p{N}, Latin-1 punctuation and symbols
//     (U+00A1–U+00BF except ª µ º) and the general/CJK punctuation blocks (U+2010–U+206F,
//     U+3001–U+303F) are neither, and every other code point counts as a letter — an
//     approximation of the Unicode tables that is exact for ASCII text (the retrieval tasks).
//     Invalid UTF-8 bytes are single "other" characters.
//  3. Each piece's bytes are mapped through GPT-2's byte-to-unicode table (printable bytes 33–126,
//     161–172, 174–255 map to themselves, the other 68 bytes to U+0100 onwards in byte order) and
//     merged by BPE: repeatedly the adjacent pair of lowest merge rank is joined (all its
//     non-overlapping occurrences, left to right) until no pair has a rank; each symbol is then
//     looked up in the vocabulary (a symbol missing from it falls back to its single-byte tokens).
//  4. add_bos (from the file) prepends bos.
// decode(ids) maps token strings back through the inverse byte table; control tokens are
// written as their text.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace ariadne {

class GgufFile;

class BpeTokenizer {
 public:
  BpeTokenizer() = default;
  // tokens: vocabulary in byte-to-unicode form; types: one per token (empty: all normal);
  // merges: "a b" lines by priority. Throws ariadne::Error on bad ids, duplicate tokens or a
  // malformed merge line (naming `source`).
  BpeTokenizer(std::vector<std::string> tokens, std::vector<int32_t> types, const std::vector<std::string>& merges,
               int32_t bos, int32_t eos, bool add_bos, const std::string& source = "tokenizer");
  // Reads the tables above; requires tokenizer.ggml.model == "gpt2".
  static BpeTokenizer from_gguf(const GgufFile& file);

  std::vector<int32_t> encode(const std::string& text, bool parse_special = true) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string token_bytes(int32_t id) const;  // one token's bytes (control tokens: their text)

  // The pre-tokenizer alone (step 2): pieces of `text`, in order, concatenating to it.
  static std::vector<std::string> pre_tokenize(const std::string& text);

  int32_t vocab_size() const { return int32_t(tokens_.size()); }
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  int32_t find(const std::string& token) const;  // id of a vocabulary string, or −1

 private:
  void bpe(const std::string& piece, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;
  std::vector<int32_t> types_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<std::string, int32_t> merge_rank_;  // key: left + '\x01' + right
  std::vector<int32_t> special_;                          // control / user-defined ids, longest first
  bool special_first_[256] = {};                          // first bytes of the special tokens
  int32_t bos_ = -1, eos_ = -1;
  bool add_bos_ = false;
  std::string byte_char_[256];  // GPT-2 byte → its unicode character (UTF-8)
  std::unordered_map<std::string, uint8_t> char_byte_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;  // piece → ids (not thread-safe)
};

}  // namespace ariadne
