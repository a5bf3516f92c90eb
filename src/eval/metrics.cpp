// BLEU and chrF as sacrebleu 2.6.0 computes them. Text is decoded to code points first (Python str semantics);
// the 13a rules are fixed-width regex substitutions, emulated as left-to-right non-overlapping scans.
#include "qkv/eval/metrics.h"

#include <cmath>
#include <unordered_map>

#include "qkv/core/error.h"
#include "qkv/core/utf8.h"

namespace qkv::eval {
namespace {

using U32 = std::u32string;

// UTF-8 -> code points. A byte that does not start a valid sequence becomes U+DC00 + byte (Python's
// surrogateescape), so nothing is lost and it never matches a real character.
U32 decode(std::string_view s) {
  U32 out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    const size_t n = utf8_decode(s, i, &cp);
    out.push_back(n ? cp : 0xDC00 + static_cast<unsigned char>(s[i]));
    i += n ? n : 1;
  }
  return out;
}

std::string encode(const U32& s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c >= 0xDC80 && c <= 0xDCFF) {  // an escaped byte
      out.push_back(static_cast<char>(c - 0xDC00));
    } else {
      utf8_append(c, out);
    }
  }
  return out;
}

// Python's str.isspace().
bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_digit(char32_t c) { return c >= U'0' && c <= U'9'; }

// sacrebleu's TokenizerZh._is_chinese_char as it actually behaves: its table compares one-character strings
// with two-character bounds ('\u20000' is '\u2000' + '0'), which turns the "Extension B" entry into
// U+2001..U+2A6D (general punctuation, arrows, ...). These are the resulting ranges, merged.
bool is_chinese_char(char32_t c) {
  static const char32_t kRanges[][2] = {
      {0x2001, 0x2A6D}, {0x2E80, 0x2FDF}, {0x2FF0, 0x303F}, {0x3100, 0x312F}, {0x31A0, 0x31EF},
      {0x3200, 0x4DB5}, {0x4E00, 0x9FBB}, {0xF900, 0xFA2D}, {0xFA30, 0xFA6A}, {0xFA70, 0xFAD9},
      {0xFE10, 0xFE1F}, {0xFE30, 0xFE4F}, {0xFF00, 0xFFEF}};
  for (const auto& r : kRanges)
    if (c >= r[0] && c <= r[1]) return true;
  return false;
}

std::vector<U32> split_ws(const U32& s) {
  std::vector<U32> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_space(s[i])) ++i;
    const size_t start = i;
    while (i < s.size() && !is_space(s[i])) ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

U32 join_ws(const U32& s) {  // ' '.join(s.split())
  U32 out;
  for (const U32& w : split_ws(s)) {
    if (!out.empty()) out.push_back(U' ');
    out += w;
  }
  return out;
}

U32 rstrip(const U32& s) {
  size_t e = s.size();
  while (e > 0 && is_space(s[e - 1])) --e;
  return s.substr(0, e);
}

U32 strip(const U32& s) {
  size_t b = 0;
  while (b < s.size() && is_space(s[b])) ++b;
  return rstrip(s.substr(b));
}

U32 replace_all(const U32& s, const U32& from, const U32& to) {
  U32 out;
  size_t i = 0;
  for (;;) {
    const size_t at = s.find(from, i);
    if (at == U32::npos) break;
    out.append(s, i, at - i);
    out += to;
    i = at + from.size();
  }
  out.append(s, i, U32::npos);
  return out;
}

// TokenizerRegexp: the four substitutions, then whitespace normalisation.
U32 regexp_rules(const U32& in) {
  // 1. ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> ' \1 '
  U32 a;
  for (char32_t c : in) {
    const bool punct = (c >= 0x7B && c <= 0x7E) || (c >= 0x5B && c <= 0x60) || (c >= 0x20 && c <= 0x26) ||
                       (c >= 0x28 && c <= 0x2B) || (c >= 0x3A && c <= 0x40) || c == 0x2F;
    if (punct) { a.push_back(U' '); a.push_back(c); a.push_back(U' '); }
    else a.push_back(c);
  }
  auto period = [](char32_t c) { return c == U'.' || c == U','; };
  // 2. ([^0-9])([\.,]) -> '\1 \2 '
  U32 b;
  for (size_t i = 0; i < a.size();) {
    if (i + 1 < a.size() && !is_digit(a[i]) && period(a[i + 1])) {
      b.push_back(a[i]); b.push_back(U' '); b.push_back(a[i + 1]); b.push_back(U' ');
      i += 2;
    } else {
      b.push_back(a[i++]);
    }
  }
  // 3. ([\.,])([^0-9]) -> ' \1 \2'
  U32 c;
  for (size_t i = 0; i < b.size();) {
    if (i + 1 < b.size() && period(b[i]) && !is_digit(b[i + 1])) {
      c.push_back(U' '); c.push_back(b[i]); c.push_back(U' '); c.push_back(b[i + 1]);
      i += 2;
    } else {
      c.push_back(b[i++]);
    }
  }
  // 4. ([0-9])(-) -> '\1 \2 '
  U32 d;
  for (size_t i = 0; i < c.size();) {
    if (i + 1 < c.size() && is_digit(c[i]) && c[i + 1] == U'-') {
      d.push_back(c[i]); d.push_back(U' '); d.push_back(U'-'); d.push_back(U' ');
      i += 2;
    } else {
      d.push_back(c[i++]);
    }
  }
  return join_ws(d);
}

U32 tok_13a(const U32& line_in) {
  U32 line = replace_all(line_in, U"<skipped>", U"");
  line = replace_all(line, U"-\n", U"");
  line = replace_all(line, U"\n", U" ");
  if (line.find(U'&') != U32::npos) {
    line = replace_all(line, U"&quot;", U"\"");
    line = replace_all(line, U"&amp;", U"&");
    line = replace_all(line, U"&lt;", U"<");
    line = replace_all(line, U"&gt;", U">");
  }
  return regexp_rules(U" " + line + U" ");
}

U32 tok_zh(const U32& line_in) {
  const U32 line = strip(line_in);
  U32 spaced;
  for (char32_t c : line) {
    if (is_chinese_char(c)) { spaced.push_back(U' '); spaced.push_back(c); spaced.push_back(U' '); }
    else spaced.push_back(c);
  }
  return regexp_rules(spaced);
}

// Counts of the n-grams (n = 1..4) of a token list, keyed by the tokens joined with U+001F (a whitespace
// character, so never inside a token).
using Counter = std::unordered_map<U32, int64_t>;

Counter word_ngrams(const std::vector<U32>& toks, int max_order) {
  Counter c;
  for (int n = 1; n <= max_order; ++n)
    for (size_t i = 0; i + n <= toks.size(); ++i) {
      U32 key = toks[i];
      for (int k = 1; k < n; ++k) { key.push_back(0x1F); key += toks[i + k]; }
      ++c[key];
    }
  return c;
}

double my_log(double x) { return x == 0.0 ? -9999999999.0 : std::log(x); }

}  // namespace

BleuTokenizer bleu_tokenizer_from_string(const std::string& name) {
  if (name == "13a") return BleuTokenizer::k13a;
  if (name == "zh") return BleuTokenizer::kZh;
  if (name == "none") return BleuTokenizer::kNone;
  throw std::invalid_argument("[bleu] unknown tokenizer '" + name + "' (choose 13a, zh or none)");
}

std::string tokenize_13a(std::string_view line) { return encode(tok_13a(decode(line))); }
std::string tokenize_zh(std::string_view line) { return encode(tok_zh(decode(line))); }

BleuScore corpus_bleu(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references,
                      BleuTokenizer tokenizer) {
  QKV_CHECK_ARG(hypotheses.size() == references.size(), "[bleu] ", hypotheses.size(), " hypotheses but ",
                references.size(), " references (one reference per hypothesis)");
  constexpr int kOrder = 4;
  BleuScore r;
  auto prep = [&](const std::string& s) {
    const U32 t = rstrip(decode(s));  // BLEU._preprocess_segment: tokenizer(sent.rstrip())
    switch (tokenizer) {
      case BleuTokenizer::k13a: return split_ws(tok_13a(t));
      case BleuTokenizer::kZh: return split_ws(tok_zh(t));
      case BleuTokenizer::kNone: break;
    }
    return split_ws(t);
  };
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    const std::vector<U32> h = prep(hypotheses[i]), ref = prep(references[i]);
    const Counter hc = word_ngrams(h, kOrder), rc = word_ngrams(ref, kOrder);
    r.sys_len += static_cast<int64_t>(h.size());
    r.ref_len += static_cast<int64_t>(ref.size());
    for (const auto& [ng, count] : hc) {
      int n = 1;
      for (char32_t ch : ng) n += ch == 0x1F;
      r.total[n - 1] += count;
      const auto it = rc.find(ng);
      if (it != rc.end()) r.correct[n - 1] += std::min(count, it->second);
    }
  }
  // BLEU.compute_bleu with smooth_method "exp".
  if (r.sys_len < r.ref_len) r.bp = r.sys_len > 0 ? std::exp(1.0 - static_cast<double>(r.ref_len) / r.sys_len) : 0.0;
  bool any = false;
  for (int64_t c : r.correct) any = any || c != 0;
  if (!any) return r;
  double smooth = 1.0;
  for (int n = 0; n < kOrder; ++n) {
    if (r.total[n] == 0) break;
    if (r.correct[n] == 0) {
      smooth *= 2;
      r.precisions[n] = 100.0 / (smooth * r.total[n]);
    } else {
      r.precisions[n] = 100.0 * r.correct[n] / r.total[n];
    }
  }
  double sum = 0.0;
  for (double p : r.precisions) sum += my_log(p);
  r.score = r.bp * std::exp(sum / kOrder);
  return r;
}

ChrfScore corpus_chrf(const std::vector<std::string>& hypotheses, const std::vector<std::string>& references,
                      int char_order, int beta) {
  QKV_CHECK_ARG(hypotheses.size() == references.size(), "[chrf] ", hypotheses.size(), " hypotheses but ",
                references.size(), " references (one reference per hypothesis)");
  QKV_CHECK_ARG(char_order >= 1 && beta >= 0, "[chrf] char_order must be >= 1 and beta >= 0, got ", char_order,
                " and ", beta);
  ChrfScore r;
  r.stats.assign(char_order, {0, 0, 0});
  auto squash = [](const std::string& s) {  // ''.join(line.split())
    U32 out;
    for (const U32& w : split_ws(decode(s))) out += w;
    return out;
  };
  for (size_t i = 0; i < hypotheses.size(); ++i) {
    const U32 h = squash(hypotheses[i]), ref = squash(references[i]);
    for (int n = 1; n <= char_order; ++n) {
      Counter hc, rc;
      for (size_t k = 0; k + n <= h.size(); ++k) ++hc[h.substr(k, n)];
      for (size_t k = 0; k + n <= ref.size(); ++k) ++rc[ref.substr(k, n)];
      int64_t hyp_count = 0, match = 0, ref_count = 0;
      for (const auto& [ng, c] : hc) {
        hyp_count += c;
        const auto it = rc.find(ng);
        if (it != rc.end()) match += std::min(c, it->second);
      }
      for (const auto& kv : rc) ref_count += kv.second;
      auto& st = r.stats[n - 1];
      st[0] += rc.empty() ? 0 : hyp_count;  // sacrebleu counts hypothesis n-grams only when the ref has some
      st[1] += ref_count;
      st[2] += match;
    }
  }
  // CHRF._compute_f_score without eps smoothing.
  const double eps = 1e-16, factor = static_cast<double>(beta) * beta;
  double avg_prec = 0.0, avg_rec = 0.0;
  int effective = 0;
  for (const auto& st : r.stats) {
    const double prec = st[0] > 0 ? static_cast<double>(st[2]) / st[0] : eps;
    const double rec = st[1] > 0 ? static_cast<double>(st[2]) / st[1] : eps;
    if (st[0] > 0 && st[1] > 0) {
      avg_prec += prec;
      avg_rec += rec;
      ++effective;
    }
  }
  if (effective == 0) {
    avg_prec = avg_rec = 0.0;
  } else {
    avg_prec /= effective;
    avg_rec /= effective;
  }
  if (avg_prec + avg_rec != 0.0) r.score = 100.0 * ((1 + factor) * avg_prec * avg_rec / (factor * avg_prec + avg_rec));
  return r;
}

}  // namespace qkv::eval
