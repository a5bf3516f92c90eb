// The one UTF-8 codec: strict decoding of one sequence (no overlong forms, surrogates or code points past
// U+10FFFF) and encoding of one code point. The tokenizers, the JSON reader and the metrics build on these two.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace qkv {

// The byte length (1..4) of the valid UTF-8 sequence at s[pos], with its code point in *cp when cp is non-null;
// 0 when none starts there (a continuation byte, an overlong form, a surrogate, a code point past U+10FFFF, or a
// sequence cut off by the end of s). pos < s.size().
inline size_t utf8_decode(std::string_view s, size_t pos, char32_t* cp = nullptr) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(pos);
  size_t n = 0;
  char32_t c = 0, min = 0;
  if (b0 < 0x80) {
    n = 1, c = b0;
  } else if ((b0 & 0xE0) == 0xC0) {
    n = 2, c = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, c = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, c = b0 & 0x07, min = 0x10000;
  } else {
    return 0;  // a continuation byte or F8..FF
  }
  if (n > s.size() - pos) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(pos + k) & 0xC0) != 0x80) return 0;
    c = (c << 6) | (byte(pos + k) & 0x3F);
  }
  if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
  if (cp) *cp = c;
  return n;
}

// Appends the UTF-8 bytes of cp (< 0x110000) to out.
inline void utf8_append(char32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace qkv
