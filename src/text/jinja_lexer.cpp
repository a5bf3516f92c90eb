// Chat templates' Jinja2 interpreter: the lexer, which cuts a template into data, tags and expression tokens with
// jinja2's defaults plus trim_blocks and lstrip_blocks. The parser (jinja_parser.cpp) reads its tokens.
#include "jinja.h"

namespace qkv::text::jinja {

namespace {

bool starts_with_at(const std::string& s, size_t pos, std::string_view p) {
  return s.compare(pos, p.size(), p) == 0;
}

size_t skip_ws(const std::string& s, size_t pos) {
  while (pos < s.size()) {
    size_t n = 1;
    if (!is_space_cp(decode_cp(s, pos, &n))) break;
    pos += n;
  }
  return pos;
}

std::string unescape(const Source& src, size_t at, std::string_view body) {
  std::string out;
  for (size_t k = 0; k < body.size(); ++k) {
    const char c = body[k];
    if (c != '\\' || k + 1 >= body.size()) { out += c; continue; }
    const char e = body[++k];
    switch (e) {
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': case 'u': case 'U': {
        const size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (size_t j = 1; j <= len; ++j) {
          const char h = k + j < body.size() ? body[k + j] : '\0';
          int dv = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
          if (dv < 0) src.fail(at, "truncated \\" + std::string(1, e) + " escape in a string literal");
          cp = cp * 16 + static_cast<uint32_t>(dv);
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) src.fail(at, "invalid code point escape in a string literal");
        append_cp(out, cp);
        k += len;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int j = 0; j < 2 && k + 1 < body.size() && body[k + 1] >= '0' && body[k + 1] <= '7'; ++j)
            cp = cp * 8 + static_cast<uint32_t>(body[++k] - '0');
          append_cp(out, cp);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

}  // namespace

// jinja2's Lexer.tokeniter with trim_blocks=True and lstrip_blocks=True.
std::vector<Token> tokenize(const Source& src) {
  const std::string& s = src.text;
  std::vector<Token> toks;
  size_t pos = 0;
  bool line_starting = true;
  static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(",
                               ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
  auto emit_data = [&](std::string text, size_t at) {
    if (!text.empty()) toks.push_back({Tok::Data, std::move(text), at});
  };
  // The text before a tag, with its whitespace control applied.
  auto strip_text = [&](std::string text, char sign, bool is_var) {
    if (sign == '-') return py_strip(text, nullptr, false, true);
    if (sign != '+' && !is_var) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size() && all_space(std::string_view(text).substr(l_pos)))
        text.resize(l_pos);
    }
    return text;
  };
  while (pos < s.size()) {
    size_t at = std::string::npos;
    for (size_t k = pos; k + 1 < s.size(); ++k) {
      if (s[k] == '{' && (s[k + 1] == '{' || s[k + 1] == '%' || s[k + 1] == '#')) { at = k; break; }
    }
    if (at == std::string::npos) {
      emit_data(s.substr(pos), pos);
      break;
    }
    const char kind = s[at + 1];
    const char sign = at + 2 < s.size() && (s[at + 2] == '-' || s[at + 2] == '+') ? s[at + 2] : '\0';
    size_t p = at + 2 + (sign ? 1 : 0);
    // {% raw %} ... {% endraw %}
    if (kind == '%') {
      size_t q = skip_ws(s, p);
      if (starts_with_at(s, q, "raw")) {
        size_t r = skip_ws(s, q + 3);
        size_t end = std::string::npos;
        if (starts_with_at(s, r, "-%}")) end = skip_ws(s, r + 3);
        else if (starts_with_at(s, r, "%}")) end = r + 2;
        if (end != std::string::npos) {
          emit_data(strip_text(s.substr(pos, at - pos), sign, false), pos);
          line_starting = s[end - 1] == '\n';
          // find {%[-+]? endraw ... %}
          size_t k = end;
          for (;; ++k) {
            if (k + 1 >= s.size()) src.fail(at, "missing end of raw directive");
            if (s[k] != '{' || s[k + 1] != '%') continue;
            const char sg = k + 2 < s.size() && (s[k + 2] == '-' || s[k + 2] == '+') ? s[k + 2] : '\0';
            size_t q2 = skip_ws(s, k + 2 + (sg ? 1 : 0));
            if (!starts_with_at(s, q2, "endraw")) continue;
            size_t r2 = skip_ws(s, q2 + 6);
            size_t end2;
            if (starts_with_at(s, r2, "+%}")) end2 = r2 + 3;
            else if (starts_with_at(s, r2, "-%}")) end2 = skip_ws(s, r2 + 3);
            else if (starts_with_at(s, r2, "%}")) end2 = r2 + 2 + (r2 + 2 < s.size() && s[r2 + 2] == '\n' ? 1 : 0);
            else continue;
            emit_data(strip_text(s.substr(end, k - end), sg, false), end);
            pos = end2;
            line_starting = pos > 0 && s[pos - 1] == '\n';
            break;
          }
          continue;
        }
      }
    }
    emit_data(strip_text(s.substr(pos, at - pos), sign, kind == '{'), pos);
    line_starting = false;
    if (kind == '#') {
      size_t k = p;
      for (;; ++k) {
        if (k + 1 >= s.size()) src.fail(at, "missing end of comment tag");
        if (s[k] == '+' && starts_with_at(s, k + 1, "#}")) { pos = k + 3; break; }
        if (s[k] == '-' && starts_with_at(s, k + 1, "#}")) { pos = skip_ws(s, k + 3); break; }
        if (s[k] == '#' && s[k + 1] == '}') { pos = k + 2 + (k + 2 < s.size() && s[k + 2] == '\n' ? 1 : 0); break; }
      }
      line_starting = s[pos - 1] == '\n';
      continue;
    }
    const bool is_var = kind == '{';
    toks.push_back({is_var ? Tok::VarBegin : Tok::BlockBegin, "", at});
    std::vector<char> balance;
    for (;;) {
      if (p >= s.size()) src.fail(at, is_var ? "missing end of print tag '}}'" : "missing end of tag '%}'");
      if (balance.empty()) {
        size_t end = std::string::npos;
        if (is_var) {
          if (starts_with_at(s, p, "-}}")) end = skip_ws(s, p + 3);
          else if (starts_with_at(s, p, "}}")) end = p + 2;
        } else {
          if (starts_with_at(s, p, "+%}")) end = p + 3;
          else if (starts_with_at(s, p, "-%}")) end = skip_ws(s, p + 3);
          else if (starts_with_at(s, p, "%}")) end = p + 2 + (p + 2 < s.size() && s[p + 2] == '\n' ? 1 : 0);
        }
        if (end != std::string::npos) {
          toks.push_back({is_var ? Tok::VarEnd : Tok::BlockEnd, "", p});
          pos = end;
          line_starting = s[end - 1] == '\n';
          break;
        }
      }
      const char c = s[p];
      size_t n = 1;
      if (is_space_cp(decode_cp(s, p, &n))) { p += n; continue; }
      if (c >= '0' && c <= '9') {
        size_t q = p;
        auto digits = [&](size_t x) {
          const size_t st = x;
          while (x < s.size() && ((s[x] >= '0' && s[x] <= '9') || (s[x] == '_' && x + 1 < s.size() && s[x + 1] >= '0' && s[x + 1] <= '9' && x > st))) ++x;
          return x;
        };
        q = digits(q);
        bool is_float = false;
        if (!(p > 0 && s[p - 1] == '.')) {
          size_t r = q;
          if (r + 1 < s.size() && s[r] == '.' && s[r + 1] >= '0' && s[r + 1] <= '9') { r = digits(r + 1); is_float = true; }
          if (r < s.size() && (s[r] == 'e' || s[r] == 'E')) {
            size_t x = r + 1;
            if (x < s.size() && (s[x] == '+' || s[x] == '-')) ++x;
            if (x < s.size() && s[x] >= '0' && s[x] <= '9') { r = digits(x); is_float = true; }
          }
          if (is_float) q = r;
        }
        std::string text;
        for (size_t k = p; k < q; ++k) if (s[k] != '_') text += s[k];
        toks.push_back({is_float ? Tok::Float : Tok::Int, text, p});
        p = q;
        continue;
      }
      if (is_alpha(c) || c == '_') {
        size_t q = p;
        while (q < s.size() && (is_alpha(s[q]) || s[q] == '_' || (s[q] >= '0' && s[q] <= '9'))) ++q;
        toks.push_back({Tok::Name, s.substr(p, q - p), p});
        p = q;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t q = p + 1;
        while (q < s.size() && s[q] != c) q += s[q] == '\\' ? 2 : 1;
        if (q >= s.size()) src.fail(p, std::string("unterminated string literal"));
        toks.push_back({Tok::String, unescape(src, p, std::string_view(s).substr(p + 1, q - p - 1)), p});
        p = q + 1;
        continue;
      }
      bool matched = false;
      for (const char* op : kOps) {
        if (!starts_with_at(s, p, op)) continue;
        const std::string o = op;
        if (o == "(" || o == "[" || o == "{") balance.push_back(o == "(" ? ')' : o == "[" ? ']' : '}');
        if (o == ")" || o == "]" || o == "}") {
          if (balance.empty()) src.fail(p, "unexpected '" + o + "'");
          if (balance.back() != o[0]) src.fail(p, "unexpected '" + o + "', expected '" + std::string(1, balance.back()) + "'");
          balance.pop_back();
        }
        toks.push_back({Tok::Op, o, p});
        p += o.size();
        matched = true;
        break;
      }
      if (!matched) src.fail(p, "unexpected char " + py_repr_str(s.substr(p, n)));
    }
  }
  toks.push_back({Tok::Eof, "", s.size()});
  return toks;
}

}  // namespace qkv::text::jinja
