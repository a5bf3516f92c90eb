// PCRE2 behind the pre-tokenizers' regexes. PCRE2's \s under UCP also takes U+180E (through \h), which Unicode
// dropped from White_Space in 6.3 and Oniguruma does not take, so \s and \S are rewritten to the explicit set.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "regex.h"

#include <pcre2.h>

#include "qkv/core/error.h"
#include "qkv/core/utf8.h"

namespace qkv::text::detail {
namespace {

// Unicode 15 White_Space, as the body of a character class.
constexpr const char* kWhiteSpaceClass =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
    "\\x{3000}";

// \s -> [ws] (or ws inside a class), \S -> [^ws]; everything else as written.
std::string rewrite_spaces(const std::string& pattern, const std::string& context) {
  std::string out;
  bool in_class = false;
  size_t class_start = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[i + 1];
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpaceClass) : "[" + std::string(kWhiteSpaceClass) + "]";
      } else if (n == 'S') {
        QKV_CHECK_RUNTIME(!in_class, "[tokenizer] ", context, ": regex '", pattern,
                          "' uses \\S inside a character class, which this reader does not implement");
        out += "[^" + std::string(kWhiteSpaceClass) + "]";
      } else {
        out += c;
        out += n;
      }
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      class_start = out.size() + 1;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += '^', ++i, ++class_start;
      continue;
    }
    if (in_class && c == ']' && out.size() > class_start) in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

bool is_white_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

Regex::Regex(const std::string& pattern, const std::string& context) : pattern_(pattern) {
  const std::string rewritten = rewrite_spaces(pattern, context);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(error, buf, sizeof buf);
    throw std::invalid_argument(::qkv::detail::concat("[tokenizer] ", context, ": regex '", pattern,
                                               "' does not compile: ", reinterpret_cast<const char*>(buf),
                                               " (at offset ", offset, ")"));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter when JIT is unavailable
  code_ = code;
}

Regex::~Regex() {
  if (code_) pcre2_code_free(static_cast<pcre2_code*>(code_));
}

Regex::Regex(Regex&& other) noexcept : pattern_(std::move(other.pattern_)), code_(other.code_) {
  other.code_ = nullptr;
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  QKV_CHECK_RUNTIME(md != nullptr, "[tokenizer] out of memory for regex match data");
  size_t pos = 0;
  while (pos <= text.size()) {
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                               PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof buf);
      throw std::runtime_error(::qkv::detail::concat("[tokenizer] regex '", pattern_, "' failed: ",
                                              reinterpret_cast<const char*>(buf)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t s = ov[0], e = ov[1];
    if (e > s) {
      out.emplace_back(s, e);
      pos = e;
    } else {  // empty match: step over one character
      if (s >= text.size()) break;
      const size_t n = utf8_decode(text, s);
      pos = s + (n ? n : 1);
    }
  }
  pcre2_match_data_free(md);
  return out;
}

}  // namespace qkv::text::detail
