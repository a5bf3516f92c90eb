// A compiled Unicode regex (PCRE2, UTF + UCP) for the pre-tokenizers, with \s and \S rewritten to Unicode's
// White_Space set as Oniguruma (the regex engine of HF tokenizers) reads them.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkv::text::detail {

class Regex {
 public:
  // Throws std::invalid_argument "[tokenizer] <context>: regex ... does not compile: <why> (at offset N)".
  Regex(const std::string& pattern, const std::string& context);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  Regex(Regex&&) noexcept;
  // Every non-overlapping match (byte offsets [start, end)), left to right; an empty match moves on by one
  // character.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

// Unicode's White_Space property (Rust's char::is_whitespace, Oniguruma's \s).
bool is_white_space(char32_t cp);

}  // namespace qkv::text::detail
