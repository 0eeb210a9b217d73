// Byte-level BPE (include/ariadne/tokenizer.hpp has the rules implemented here).
#include "ariadne/tokenizer.hpp"

#include <algorithm>
#include <limits>

#include "ariadne/error.hpp"
#include "ariadne/gguf.hpp"

namespace ariadne {

namespace {

enum class CharClass : uint8_t { space, letter, number, other };

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
}

// Length in bytes of the UTF-8 character at s[i] and its code point; an invalid or truncated
// sequence is one byte with code point 0xFFFFFFFF (classified "other").
size_t utf8_next(const std::string& s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return uint8_t(s[k]); };
  const uint8_t c = b(i);
  size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    *cp = 0xFFFFFFFFu;
    return 1;
  }
  uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) {
      *cp = 0xFFFFFFFFu;
      return 1;
    }
    v = (v << 6) | (b(i + k) & 0x3F);
  }
  *cp = v;
  return len;
}

CharClass classify(uint32_t cp) {
  if (cp < 0x80) {
    if (cp == ' ' || (cp >= 9 && cp <= 13)) return CharClass::space;
    if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CharClass::letter;
    if (cp >= '0' && cp <= '9') return CharClass::number;
    return CharClass::other;
  }
  if (cp == 0xFFFFFFFFu) return CharClass::other;
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
      cp == 0x202F || cp == 0x205F || cp == 0x3000)
    return CharClass::space;
  if (cp == 0xB2 || cp == 0xB3 || cp == 0xB9 || (cp >= 0xBC && cp <= 0xBE)) return CharClass::number;
  if (cp < 0xA0) return CharClass::other;  // C1 controls
  if (cp >= 0xA1 && cp <= 0xBF && cp != 0xAA && cp != 0xB5 && cp != 0xBA) return CharClass::other;
  if (cp == 0xD7 || cp == 0xF7) return CharClass::other;  // × ÷
  if ((cp >= 0x2010 && cp <= 0x206F) || (cp >= 0x3001 && cp <= 0x303F)) return CharClass::other;
  return CharClass::letter;
}

struct Ch {
  size_t pos, len;
  CharClass cls;
};

std::vector<Ch> chars_of(const std::string& s) {
  std::vector<Ch> out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_next(s, i, &cp);
    out.push_back({i, n, classify(cp)});
    i += n;
  }
  return out;
}

// The GPT-2 rule on one stretch without digits' isolation concerns (the caller split digits off).
void gpt2_split(const std::string& s, std::vector<std::string>& out) {
  const std::vector<Ch> c = chars_of(s);
  const size_t n = c.size();
  auto text = [&](size_t a, size_t b) { return s.substr(c[a].pos, (b < n ? c[b].pos : s.size()) - c[a].pos); };
  size_t i = 0;
  while (i < n) {
    // Contractions: 's 't 're 've 'm 'll 'd (lower case, as in the pattern).
    if (s[c[i].pos] == '\'' && i + 1 < n) {
      const std::string rest = s.substr(c[i + 1].pos, 2);
      size_t take = 0;
      if (rest.size() >= 2 && (rest == "re" || rest == "ve" || rest == "ll")) take = 3;
      else if (!rest.empty() && (rest[0] == 's' || rest[0] == 't' || rest[0] == 'm' || rest[0] == 'd')) take = 2;
      if (take > 0 && i + take <= n) {
        out.push_back(text(i, i + take));
        i += take;
        continue;
      }
    }
    // ' ?X+' for X in letters, numbers, other: an optional leading ' ' joins the run.
    size_t j = i;
    if (s[c[i].pos] == ' ' && i + 1 < n && c[i + 1].cls != CharClass::space) ++j;
    if (c[j].cls != CharClass::space) {
      const CharClass k = c[j].cls;
      size_t e = j;
      while (e < n && c[e].cls == k) ++e;
      out.push_back(text(i, e));
      i = e;
      continue;
    }
    // '\s+(?!\S)' then '\s+': a white-space run followed by a non-space gives back its last char.
    size_t e = i;
    while (e < n && c[e].cls == CharClass::space) ++e;
    if (e < n && e - i > 1) --e;
    out.push_back(text(i, e));
    i = e;
  }
}

}  // namespace

std::vector<std::string> BpeTokenizer::pre_tokenize(const std::string& text) {
  // Digits(individual_digits): each ASCII digit (and each \p{N} character) is a piece of its own.
  std::vector<std::string> out;
  const std::vector<Ch> c = chars_of(text);
  size_t start = 0;  // byte offset of the current non-digit stretch
  for (const Ch& ch : c) {
    if (ch.cls != CharClass::number) continue;
    if (ch.pos > start) gpt2_split(text.substr(start, ch.pos - start), out);
    out.push_back(text.substr(ch.pos, ch.len));
    start = ch.pos + ch.len;
  }
  if (start < text.size()) gpt2_split(text.substr(start), out);
  return out;
}

BpeTokenizer::BpeTokenizer(std::vector<std::string> tokens, std::vector<int32_t> types,
                           const std::vector<std::string>& merges, int32_t bos, int32_t eos, bool add_bos,
                           const std::string& source)
    : tokens_(std::move(tokens)), types_(std::move(types)), bos_(bos), eos_(eos), add_bos_(add_bos) {
  ARIADNE_CHECK(!tokens_.empty() && tokens_.size() < size_t(std::numeric_limits<int32_t>::max()), source,
                ": the vocabulary has ", tokens_.size(), " tokens, expected 1 .. 2^31−2");
  if (types_.empty()) types_.assign(tokens_.size(), 1);
  ARIADNE_CHECK(types_.size() == tokens_.size(), source, ": token_type has ", types_.size(), " entries, expected ",
                tokens_.size(), " (one per token)");
  const int32_t nv = int32_t(tokens_.size());
  ARIADNE_CHECK(bos_ >= -1 && bos_ < nv, source, ": bos_token_id ", bos_, " is outside the vocabulary of ", nv);
  ARIADNE_CHECK(eos_ >= -1 && eos_ < nv, source, ": eos_token_id ", eos_, " is outside the vocabulary of ", nv);
  for (int32_t i = 0; i < nv; ++i) {
    // Duplicates occur in real vocabularies only for unused placeholders; the first id wins.
    vocab_.emplace(tokens_[size_t(i)], i);
    if ((types_[size_t(i)] == 3 || types_[size_t(i)] == 4) && !tokens_[size_t(i)].empty()) {
      special_.push_back(i);
      special_first_[uint8_t(tokens_[size_t(i)][0])] = true;
    }
  }
  std::stable_sort(special_.begin(), special_.end(),
                   [&](int32_t a, int32_t b) { return tokens_[size_t(a)].size() > tokens_[size_t(b)].size(); });
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t sp = m.find(' ', 1);  // the left symbol is never empty; a symbol may not hold ' '
    ARIADNE_CHECK(sp != std::string::npos && sp + 1 < m.size(), source, ": merge ", r, " '", m,
                  "' is not two symbols separated by a space");
    merge_rank_.emplace(m.substr(0, sp) + '\x01' + m.substr(sp + 1), int32_t(r));
  }
  // GPT-2's table: printable bytes keep their code point, the others take U+0100 + k in order.
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const uint32_t cp = keep ? uint32_t(b) : uint32_t(256 + next++);
    append_utf8(byte_char_[b], cp);
    char_byte_.emplace(byte_char_[b], uint8_t(b));
  }
}

BpeTokenizer BpeTokenizer::from_gguf(const GgufFile& f) {
  const std::string model = f.get_string("tokenizer.ggml.model");
  ARIADNE_CHECK(model == "gpt2", f.path(), ": metadata 'tokenizer.ggml.model' is '", model,
                "', expected 'gpt2' (byte-level BPE)");
  std::vector<int32_t> types;
  if (f.has("tokenizer.ggml.token_type"))
    for (int64_t t : f.get_ints("tokenizer.ggml.token_type")) types.push_back(int32_t(t));
  const auto id = [&](const char* key) {
    const int64_t v = f.get_int(key, -1);
    ARIADNE_CHECK(v >= -1 && v < std::numeric_limits<int32_t>::max(), f.path(), ": metadata '", key, "' is ", v);
    return int32_t(v);
  };
  return BpeTokenizer(f.get_strings("tokenizer.ggml.tokens"), std::move(types),
                      f.get_strings("tokenizer.ggml.merges"), id("tokenizer.ggml.bos_token_id"),
                      id("tokenizer.ggml.eos_token_id"), f.get_bool("tokenizer.ggml.add_bos_token", false),
                      f.path() + ": tokenizer");
}

int32_t BpeTokenizer::find(const std::string& token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

void BpeTokenizer::bpe(const std::string& piece, std::vector<int32_t>& out) const {
  auto hit = cache_.find(piece);
  if (hit != cache_.end()) {
    out.insert(out.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<std::string> sym;
  for (unsigned char b : piece) sym.push_back(byte_char_[b]);
  while (sym.size() > 1) {
    int32_t best = std::numeric_limits<int32_t>::max();
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merge_rank_.find(sym[i] + '\x01' + sym[i + 1]);
      if (it != merge_rank_.end() && it->second < best) best = it->second, at = i;
    }
    if (best == std::numeric_limits<int32_t>::max()) break;
    const std::string left = sym[at], right = sym[at + 1];
    std::vector<std::string> merged;
    merged.reserve(sym.size());
    for (size_t i = 0; i < sym.size(); ++i) {
      if (i + 1 < sym.size() && sym[i] == left && sym[i + 1] == right) {
        merged.push_back(left + right);
        ++i;
      } else {
        merged.push_back(sym[i]);
      }
    }
    sym.swap(merged);
  }
  std::vector<int32_t> ids;
  for (const std::string& s : sym) {
    const int32_t id = find(s);
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    // Not in the vocabulary: spell it with single-byte tokens (each byte's character).
    for (size_t i = 0; i < s.size();) {
      uint32_t cp = 0;
      const size_t n = utf8_next(s, i, &cp);
      const int32_t b = find(s.substr(i, n));
      ARIADNE_CHECK(b >= 0, "tokenizer: byte symbol '", s.substr(i, n), "' is not in the vocabulary");
      ids.push_back(b);
      i += n;
    }
  }
  out.insert(out.end(), ids.begin(), ids.end());
  cache_.emplace(piece, std::move(ids));
}

std::vector<int32_t> BpeTokenizer::encode(const std::string& text, bool parse_special) const {
  std::vector<int32_t> out;
  if (add_bos_ && bos_ >= 0) out.push_back(bos_);
  auto plain = [&](const std::string& s) {
    for (const std::string& p : pre_tokenize(s)) bpe(p, out);
  };
  if (!parse_special || special_.empty()) {
    plain(text);
    return out;
  }
  size_t start = 0, i = 0;
  while (i < text.size()) {
    int32_t hit = -1;
    if (special_first_[uint8_t(text[i])]) {
      for (int32_t id : special_) {
        const std::string& t = tokens_[size_t(id)];
        if (text.compare(i, t.size(), t) == 0) {
          hit = id;
          break;
        }
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    if (i > start) plain(text.substr(start, i - start));
    out.push_back(hit);
    i += tokens_[size_t(hit)].size();
    start = i;
  }
  if (start < text.size()) plain(text.substr(start));
  return out;
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  ARIADNE_CHECK(id >= 0 && id < vocab_size(), "tokenizer: token id ", id, " is outside the vocabulary of ",
                vocab_size());
  const std::string& t = tokens_[size_t(id)];
  if (types_[size_t(id)] == 3 || types_[size_t(id)] == 4) return t;
  std::string out;
  for (size_t i = 0; i < t.size();) {
    uint32_t cp = 0;
    const size_t n = utf8_next(t, i, &cp);
    auto it = char_byte_.find(t.substr(i, n));
    // A character outside the byte alphabet is kept as its own UTF-8 text.
    if (it == char_byte_.end()) out += t.substr(i, n);
    else out += char(it->second);
    i += n;
  }
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

}  // namespace ariadne
