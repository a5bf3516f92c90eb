// Chat templates: a Jinja2 interpreter (lexer, parser, evaluator) for the templates models ship, with the settings of
// transformers' apply_chat_template: trim_blocks, lstrip_blocks, loop controls, its tojson, raise_exception.
#include "qkv/text/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "qkv/core/error.h"

namespace qkv::text {

namespace {

// ------------------------------------------------------------------------------------------------ UTF-8 and text

uint32_t decode_cp(std::string_view s, size_t i, size_t* n) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + len > s.size()) len = 1;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *n = len;
  return cp;
}

void append_cp(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// The code points of s as views (Python indexes strings by code point).
std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    decode_cp(s, i, &n);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// Python's str.isspace (and re's \s on str).
bool is_space_cp(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

bool all_space(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    if (!is_space_cp(decode_cp(s, i, &n))) return false;
    i += n;
  }
  return true;
}

// Python's str.strip / lstrip / rstrip: whitespace, or the code points of `chars` when given.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::vector<uint32_t> set;
  if (chars) {
    for (size_t i = 0; i < chars->size();) {
      size_t n = 1;
      set.push_back(decode_cp(*chars, i, &n));
      i += n;
    }
  }
  auto strip_it = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : is_space_cp(cp);
  };
  std::vector<std::pair<size_t, uint32_t>> cps;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    cps.emplace_back(i, decode_cp(s, i, &n));
    i += n;
  }
  size_t b = 0, e = cps.size();
  if (left) while (b < e && strip_it(cps[b].second)) ++b;
  if (right) while (e > b && strip_it(cps[e - 1].second)) --e;
  const size_t from = b < cps.size() ? cps[b].first : s.size();
  const size_t to = e < cps.size() ? cps[e].first : s.size();
  return std::string(s.substr(from, to - from));
}

std::string ascii_upper(std::string s) {
  for (char& c : s) if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
  return s;
}
std::string ascii_lower(std::string s) {
  for (char& c : s) if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  return s;
}
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Python's str.title: a letter after a non-letter is upper-cased, other letters lower-cased.
std::string py_title(std::string s) {
  bool prev_alpha = false;
  for (char& c : s) {
    const bool alpha = is_alpha(c) || static_cast<unsigned char>(c) >= 0x80;
    if (is_alpha(c)) c = prev_alpha ? ascii_lower(std::string(1, c))[0] : ascii_upper(std::string(1, c))[0];
    prev_alpha = alpha;
  }
  return s;
}

std::string py_capitalize(std::string s) {
  s = ascii_lower(std::move(s));
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 32);
  return s;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every code point
    int64_t n = 0;
    for (auto cp : code_points(s)) {
      if (count < 0 || n < count) { out += to; ++n; }
      out += cp;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out.append(s, pos, at - pos);
    out += to;
    pos = at + from.size();
    ++n;
  }
  out.append(s, pos);
  return out;
}

// Python's str.splitlines() line boundaries.
std::vector<std::string> py_splitlines(std::string_view s) {
  std::vector<std::string> lines;
  std::string cur;
  for (size_t i = 0; i < s.size();) {
    size_t n = 1;
    const uint32_t cp = decode_cp(s, i, &n);
    const bool brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) ||
                     cp == 0x85 || cp == 0x2028 || cp == 0x2029;
    if (brk) {
      lines.push_back(cur);
      cur.clear();
      if (cp == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      cur.append(s.substr(i, n));
    }
    i += n;
  }
  if (!cur.empty()) lines.push_back(cur);
  return lines;
}

// Python's repr(float).
std::string py_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (mant[0] == '-') { sign = "-"; mant.erase(0, 1); }
  std::string digits;
  for (char c : mant) if (c != '.') digits += c;
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp >= 0) {
      if (digits.size() <= static_cast<size_t>(exp) + 1) {
        out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
      }
    } else {
      out = "0." + std::string(-exp - 1, '0') + digits;
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char eb[16];
  std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return sign + out + eb;
}

// Python's repr(str).
std::string py_repr_str(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == q || ch == '\\') { out += '\\'; out += ch; }
    else if (ch == '\n') out += "\\n";
    else if (ch == '\r') out += "\\r";
    else if (ch == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += ch;
    }
  }
  out += q;
  return out;
}

// ------------------------------------------------------------------------------------------------ values

struct Val;
struct Func;
using List = std::vector<Val>;
struct Dict {
  std::vector<std::pair<std::string, Val>> items;
  const Val* find(const std::string& k) const;
  void set(const std::string& k, Val v);
};

enum class T : uint8_t { Undef, None, Bool, Int, Float, Str, List, Dict, Obj, Func };

struct Val {
  T t = T::Undef;
  bool tuple = false;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;                // Str; for Undef: why it is undefined
  std::shared_ptr<List> l;      // List (tuple when `tuple`)
  std::shared_ptr<Dict> d;      // Dict; Obj (a namespace or the loop object)
  std::shared_ptr<Func> fn;     // Func
  bool ns = false;              // Obj: a namespace (attributes may be assigned)

  static Val undef(std::string why) { Val v; v.s = std::move(why); return v; }
  static Val none() { Val v; v.t = T::None; return v; }
  static Val boolean(bool x) { Val v; v.t = T::Bool; v.b = x; return v; }
  static Val integer(int64_t x) { Val v; v.t = T::Int; v.i = x; return v; }
  static Val flt(double x) { Val v; v.t = T::Float; v.f = x; return v; }
  static Val str(std::string x) { Val v; v.t = T::Str; v.s = std::move(x); return v; }
  static Val list(List items, bool tuple = false) {
    Val v; v.t = T::List; v.tuple = tuple; v.l = std::make_shared<List>(std::move(items)); return v;
  }
  static Val dict(Dict dd = {}) { Val v; v.t = T::Dict; v.d = std::make_shared<Dict>(std::move(dd)); return v; }
  static Val obj(Dict dd, bool is_ns) {
    Val v; v.t = T::Obj; v.ns = is_ns; v.d = std::make_shared<Dict>(std::move(dd)); return v;
  }
  bool is_num() const { return t == T::Int || t == T::Float || t == T::Bool; }
  double num() const { return t == T::Float ? f : t == T::Int ? static_cast<double>(i) : (b ? 1.0 : 0.0); }
};

const Val* Dict::find(const std::string& k) const {
  for (const auto& kv : items) if (kv.first == k) return &kv.second;
  return nullptr;
}
void Dict::set(const std::string& k, Val v) {
  for (auto& kv : items) if (kv.first == k) { kv.second = std::move(v); return; }
  items.emplace_back(k, std::move(v));
}

const char* py_type(const Val& v) {
  switch (v.t) {
    case T::Undef: return "Undefined";
    case T::None: return "NoneType";
    case T::Bool: return "bool";
    case T::Int: return "int";
    case T::Float: return "float";
    case T::Str: return "str";
    case T::List: return v.tuple ? "tuple" : "list";
    case T::Dict: return "dict";
    case T::Obj: return v.ns ? "Namespace" : "LoopContext";
    case T::Func: return "function";
  }
  return "?";
}

bool truthy(const Val& v) {
  switch (v.t) {
    case T::Undef: case T::None: return false;
    case T::Bool: return v.b;
    case T::Int: return v.i != 0;
    case T::Float: return v.f != 0.0;
    case T::Str: return !v.s.empty();
    case T::List: return !v.l->empty();
    case T::Dict: return !v.d->items.empty();
    default: return true;
  }
}

std::string repr(const Val& v);

// str(v), as {{ v }} prints it.
std::string to_str(const Val& v) {
  switch (v.t) {
    case T::Undef: return "";
    case T::None: return "None";
    case T::Bool: return v.b ? "True" : "False";
    case T::Int: return std::to_string(v.i);
    case T::Float: return py_float(v.f);
    case T::Str: return v.s;
    case T::List: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.l->size(); ++k) {
        if (k) out += ", ";
        out += repr((*v.l)[k]);
      }
      if (v.tuple && v.l->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case T::Dict: {
      std::string out = "{";
      for (size_t k = 0; k < v.d->items.size(); ++k) {
        if (k) out += ", ";
        out += py_repr_str(v.d->items[k].first) + ": " + repr(v.d->items[k].second);
      }
      return out + "}";
    }
    case T::Obj: {
      std::string out = v.ns ? "<Namespace {" : "<LoopContext {";
      for (size_t k = 0; k < v.d->items.size(); ++k) {
        if (k) out += ", ";
        out += py_repr_str(v.d->items[k].first) + ": " + repr(v.d->items[k].second);
      }
      return out + "}>";
    }
    case T::Func: return "<function>";
  }
  return "";
}

std::string repr(const Val& v) { return v.t == T::Str ? py_repr_str(v.s) : v.t == T::Undef ? "Undefined" : to_str(v); }

bool py_eq(const Val& a, const Val& b) {
  if (a.is_num() && b.is_num()) {
    if (a.t != T::Float && b.t != T::Float) {
      const int64_t x = a.t == T::Int ? a.i : a.b, y = b.t == T::Int ? b.i : b.b;
      return x == y;
    }
    return a.num() == b.num();
  }
  if (a.t != b.t) return false;
  switch (a.t) {
    case T::Undef: case T::None: return true;
    case T::Str: return a.s == b.s;
    case T::List: {
      if (a.tuple != b.tuple || a.l->size() != b.l->size()) return false;
      for (size_t k = 0; k < a.l->size(); ++k) if (!py_eq((*a.l)[k], (*b.l)[k])) return false;
      return true;
    }
    case T::Dict: {
      if (a.d->items.size() != b.d->items.size()) return false;
      for (const auto& kv : a.d->items) {
        const Val* o = b.d->find(kv.first);
        if (!o || !py_eq(kv.second, *o)) return false;
      }
      return true;
    }
    case T::Obj: return a.d == b.d;
    case T::Func: return a.fn == b.fn;
    default: return false;
  }
}

// ------------------------------------------------------------------------------------------------ lexer

enum class Tok { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;  // Data / Name / Op / number text; String: the unescaped value
  size_t pos;        // byte offset in the normalized source
};

struct Source {
  std::string name;
  std::string text;  // newlines normalized to \n, one trailing newline dropped (jinja2's defaults)
  std::vector<size_t> line_starts;

  void index() {
    line_starts = {0};
    for (size_t k = 0; k < text.size(); ++k) if (text[k] == '\n') line_starts.push_back(k + 1);
  }
  size_t line(size_t pos) const {
    return static_cast<size_t>(std::upper_bound(line_starts.begin(), line_starts.end(), pos) - line_starts.begin());
  }
  std::string where(size_t pos) const {
    const size_t line = this->line(pos);
    const size_t col = pos - line_starts[line - 1] + 1;
    return name + ":" + std::to_string(line) + ":" + std::to_string(col);
  }
  [[noreturn]] void fail(size_t pos, const std::string& what) const {
    throw std::invalid_argument("[chat_template] " + where(pos) + ": " + what);
  }
};

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

// ------------------------------------------------------------------------------------------------ syntax tree

enum class E { Const, Name, List, Tuple, Dict, Attr, Item, Slice, Call, Filter, Test, Neg, Pos, Not, Bin, Cmp, And, Or, Cond };

struct Expr {
  E k;
  size_t pos;
  Val v;                                // Const
  std::string s;                        // Name, Attr, Filter / Test name, Bin op
  std::vector<std::unique_ptr<Expr>> c; // children; Call/Filter/Test: c[0] base (null in a filter block), then args
  std::vector<std::string> kw;          // Call/Filter/Test: names of the last kw.size() args; Cmp: the operators
  bool negated = false;                 // Test: `is not`
};
using ExprP = std::unique_ptr<Expr>;

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;
enum class S { Text, Out, If, For, Set, SetBlock, Macro, FilterBlock, Break, Continue, Generation };

struct Stmt {
  S k;
  size_t pos;
  std::string text;                      // Text; Macro name
  ExprP e, cond;                         // Out / Set value / For iterable; For's inline `if`
  std::vector<std::string> targets;      // Set / For / SetBlock names; Macro parameters
  std::string attr;                      // Set: `ns.attr = ...`
  std::vector<std::pair<ExprP, Body>> branches;  // If (else: a null condition)
  Body body, else_body;
  std::vector<ExprP> defaults;           // Macro: one per parameter (null: none)
  std::vector<ExprP> filters;            // FilterBlock / SetBlock: filters with a null base
};

// ------------------------------------------------------------------------------------------------ parser

class Parser {
 public:
  Parser(const Source& src, std::vector<Token> toks) : src_(src), t_(std::move(toks)) {}

  Body parse_template() {
    std::string end;
    Body b = subparse({}, &end);
    return b;
  }

 private:
  const Source& src_;
  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& pp, size_t pos) : p(pp) {
      if (++p.depth_ > 200) p.src_.fail(pos, "template nesting deeper than 200 levels");
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case Tok::Eof: return "end of template";
      case Tok::VarEnd: return "end of print statement";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::String: return "string " + py_repr_str(t.text);
      case Tok::Data: return "template data";
      default: return "'" + t.text + "'";
    }
  }
  [[noreturn]] void unexpected(const std::string& expected = "") const {
    src_.fail(cur().pos, "unexpected " + describe(cur()) + (expected.empty() ? "" : " (expected " + expected + ")"));
  }
  void expect_op(const char* op) {
    if (!is_op(op)) unexpected(std::string("'") + op + "'");
    ++i_;
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) unexpected("a name");
    return t_[i_++].text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) unexpected("end of statement block");
    ++i_;
  }

  ExprP node(E k, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->pos = pos;
    return e;
  }

  // Statements until one of `ends` (a tag name); its name goes to *end, the tag name token consumed.
  Body subparse(const std::vector<std::string>& ends, std::string* end) {
    Body body;
    for (;;) {
      const Token& tk = cur();
      if (tk.type == Tok::Eof) {
        if (!ends.empty()) {
          std::string want;
          for (size_t k = 0; k < ends.size(); ++k) want += (k ? " or '" : "'") + ends[k] + "'";
          src_.fail(tk.pos, "unexpected end of template (expected " + want + ")");
        }
        return body;
      }
      if (tk.type == Tok::Data) {
        auto st = std::make_unique<Stmt>();
        st->k = S::Text;
        st->pos = tk.pos;
        st->text = tk.text;
        body.push_back(std::move(st));
        ++i_;
      } else if (tk.type == Tok::VarBegin) {
        ++i_;
        auto st = std::make_unique<Stmt>();
        st->k = S::Out;
        st->pos = tk.pos;
        st->e = parse_tuple(true, {});
        if (cur().type != Tok::VarEnd) unexpected("end of print statement");
        ++i_;
        body.push_back(std::move(st));
      } else if (tk.type == Tok::BlockBegin) {
        ++i_;
        if (cur().type != Tok::Name) unexpected("a tag name");
        const std::string tag = cur().text;
        if (std::find(ends.begin(), ends.end(), tag) != ends.end()) {
          ++i_;
          *end = tag;
          return body;
        }
        body.push_back(parse_statement(ends));
      } else {
        unexpected();
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement(const std::vector<std::string>& ends) {
    DepthGuard g(*this, cur().pos);
    const size_t pos = cur().pos;
    const std::string tag = t_[i_++].text;
    auto st = std::make_unique<Stmt>();
    st->pos = pos;
    std::string end;
    if (tag == "if") {
      st->k = S::If;
      ExprP c = parse_tuple(false, {});
      for (;;) {
        expect_block_end();
        Body b = subparse({"elif", "else", "endif"}, &end);
        st->branches.emplace_back(std::move(c), std::move(b));
        if (end == "elif") { c = parse_tuple(false, {}); continue; }
        if (end == "else") {
          expect_block_end();
          st->branches.emplace_back(nullptr, subparse({"endif"}, &end));
        }
        break;
      }
    } else if (tag == "for") {
      st->k = S::For;
      st->targets.push_back(expect_name());
      while (is_op(",")) {
        ++i_;
        if (is_name("in")) break;
        st->targets.push_back(expect_name());
      }
      if (!is_name("in")) unexpected("'in'");
      ++i_;
      st->e = parse_tuple(false, {"recursive", "if"});
      if (is_name("if")) { ++i_; st->cond = parse_expression(true); }
      if (is_name("recursive")) src_.fail(cur().pos, "recursive for loops are not supported");
      expect_block_end();
      st->body = subparse({"endfor", "else"}, &end);
      if (end == "else") {
        expect_block_end();
        st->else_body = subparse({"endfor"}, &end);
      }
    } else if (tag == "set") {
      st->targets.push_back(expect_name());
      if (is_op(".")) {
        ++i_;
        st->attr = expect_name();
      } else {
        while (is_op(",")) {
          ++i_;
          st->targets.push_back(expect_name());
        }
      }
      if (is_op("=")) {
        ++i_;
        st->k = S::Set;
        st->e = parse_tuple(true, {});
      } else {
        if (!st->attr.empty() || st->targets.size() != 1) unexpected("'='");
        st->k = S::SetBlock;
        parse_filter_chain(st->filters);
        expect_block_end();
        st->body = subparse({"endset"}, &end);
      }
    } else if (tag == "macro") {
      st->k = S::Macro;
      st->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        if (!st->targets.empty()) expect_op(",");
        if (is_op(")")) break;
        st->targets.push_back(expect_name());
        if (is_op("=")) { ++i_; st->defaults.push_back(parse_expression(true)); }
        else st->defaults.push_back(nullptr);
      }
      ++i_;
      expect_block_end();
      st->body = subparse({"endmacro"}, &end);
    } else if (tag == "filter") {
      st->k = S::FilterBlock;
      auto f = node(E::Filter, cur().pos);
      f->c.push_back(nullptr);
      parse_filter_body(*f);
      st->filters.push_back(std::move(f));
      parse_filter_chain(st->filters);
      expect_block_end();
      st->body = subparse({"endfilter"}, &end);
    } else if (tag == "generation") {
      st->k = S::Generation;
      expect_block_end();
      st->body = subparse({"endgeneration"}, &end);
    } else if (tag == "break" || tag == "continue") {
      st->k = tag == "break" ? S::Break : S::Continue;
    } else {
      std::string msg = "unknown tag '" + tag + "'";
      if (!ends.empty()) {
        msg += " (expected ";
        for (size_t k = 0; k < ends.size(); ++k) msg += (k ? " or '" : "'") + ends[k] + "'";
        msg += ")";
      }
      src_.fail(pos, msg);
    }
    expect_block_end();  // of the statement, or of its end tag
    return st;
  }

  void parse_filter_chain(std::vector<ExprP>& out) {
    while (is_op("|")) {
      ++i_;
      auto f = node(E::Filter, cur().pos);
      f->c.push_back(nullptr);
      parse_filter_body(*f);
      out.push_back(std::move(f));
    }
  }

  bool tuple_end(const std::vector<std::string>& extra) const {
    if (cur().type == Tok::VarEnd || cur().type == Tok::BlockEnd || cur().type == Tok::Eof || is_op(")")) return true;
    return cur().type == Tok::Name && std::find(extra.begin(), extra.end(), cur().text) != extra.end();
  }

  ExprP parse_tuple(bool with_condexpr, const std::vector<std::string>& extra) {
    const size_t pos = cur().pos;
    std::vector<ExprP> items;
    bool comma = false;
    for (;;) {
      if (!items.empty()) {
        if (!is_op(",")) break;
        ++i_;
        comma = true;
      }
      if (tuple_end(extra)) break;
      items.push_back(with_condexpr ? parse_expression(true) : parse_or());
    }
    if (!comma) {
      if (items.empty()) unexpected("an expression");
      return std::move(items[0]);
    }
    auto t = node(E::Tuple, pos);
    t->c = std::move(items);
    return t;
  }

  ExprP parse_expression(bool with_condexpr) {
    DepthGuard g(*this, cur().pos);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  ExprP parse_condexpr() {
    const size_t pos = cur().pos;
    ExprP e = parse_or();
    while (is_name("if")) {
      ++i_;
      ExprP test = parse_or();
      ExprP other;
      if (is_name("else")) { ++i_; other = parse_condexpr(); }
      auto c = node(E::Cond, pos);
      c->c.push_back(std::move(test));
      c->c.push_back(std::move(e));
      c->c.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprP binary(E k, std::string op, ExprP a, ExprP b, size_t pos) {
    auto n = node(k, pos);
    n->s = std::move(op);
    n->c.push_back(std::move(a));
    n->c.push_back(std::move(b));
    return n;
  }

  ExprP parse_or() {
    const size_t pos = cur().pos;
    ExprP e = parse_and();
    while (is_name("or")) { ++i_; e = binary(E::Or, "or", std::move(e), parse_and(), pos); }
    return e;
  }
  ExprP parse_and() {
    const size_t pos = cur().pos;
    ExprP e = parse_not();
    while (is_name("and")) { ++i_; e = binary(E::And, "and", std::move(e), parse_not(), pos); }
    return e;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this, cur().pos);
      auto n = node(E::Not, cur().pos);
      ++i_;
      n->c.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    const size_t pos = cur().pos;
    ExprP e = parse_math1();
    ExprP cmp;
    for (;;) {
      std::string op;
      if (cur().type == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        op = "notin";
        i_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(E::Cmp, pos);
        cmp->c.push_back(std::move(e));
      }
      cmp->kw.push_back(op);
      cmp->c.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }
  ExprP parse_math1() {
    const size_t pos = cur().pos;
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = t_[i_++].text;
      e = binary(E::Bin, op, std::move(e), parse_concat(), pos);
    }
    return e;
  }
  ExprP parse_concat() {
    const size_t pos = cur().pos;
    ExprP e = parse_math2();
    while (is_op("~")) { ++i_; e = binary(E::Bin, "~", std::move(e), parse_math2(), pos); }
    return e;
  }
  ExprP parse_math2() {
    const size_t pos = cur().pos;
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = t_[i_++].text;
      e = binary(E::Bin, op, std::move(e), parse_pow(), pos);
    }
    return e;
  }
  ExprP parse_pow() {
    const size_t pos = cur().pos;
    ExprP e = parse_unary(true);
    while (is_op("**")) { ++i_; e = binary(E::Bin, "**", std::move(e), parse_unary(true), pos); }
    return e;
  }
  ExprP parse_unary(bool with_filter) {
    DepthGuard g(*this, cur().pos);
    const size_t pos = cur().pos;
    ExprP e;
    if (is_op("-") || is_op("+")) {
      const bool neg = cur().text == "-";
      ++i_;
      e = node(neg ? E::Neg : E::Pos, pos);
      e->c.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }
  ExprP parse_primary() {
    const Token& tk = cur();
    const size_t pos = tk.pos;
    if (tk.type == Tok::Name) {
      ++i_;
      if (tk.text == "true" || tk.text == "True") { auto n = node(E::Const, pos); n->v = Val::boolean(true); return n; }
      if (tk.text == "false" || tk.text == "False") { auto n = node(E::Const, pos); n->v = Val::boolean(false); return n; }
      if (tk.text == "none" || tk.text == "None") { auto n = node(E::Const, pos); n->v = Val::none(); return n; }
      auto n = node(E::Name, pos);
      n->s = tk.text;
      return n;
    }
    if (tk.type == Tok::String) {
      std::string v;
      while (cur().type == Tok::String) v += t_[i_++].text;
      auto n = node(E::Const, pos);
      n->v = Val::str(std::move(v));
      return n;
    }
    if (tk.type == Tok::Int) {
      ++i_;
      int64_t x = 0;
      auto r = std::from_chars(tk.text.data(), tk.text.data() + tk.text.size(), x);
      if (r.ec != std::errc()) src_.fail(pos, "integer literal " + tk.text + " is out of range");
      auto n = node(E::Const, pos);
      n->v = Val::integer(x);
      return n;
    }
    if (tk.type == Tok::Float) {
      ++i_;
      auto n = node(E::Const, pos);
      n->v = Val::flt(std::strtod(tk.text.c_str(), nullptr));
      return n;
    }
    if (is_op("(")) {
      ++i_;
      if (is_op(")")) {
        ++i_;
        auto n = node(E::Tuple, pos);
        return n;
      }
      ExprP e = parse_tuple(true, {});
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++i_;
      auto n = node(E::List, pos);
      while (!is_op("]")) {
        if (!n->c.empty()) expect_op(",");
        if (is_op("]")) break;
        n->c.push_back(parse_expression(true));
      }
      ++i_;
      return n;
    }
    if (is_op("{")) {
      ++i_;
      auto n = node(E::Dict, pos);
      while (!is_op("}")) {
        if (!n->c.empty()) expect_op(",");
        if (is_op("}")) break;
        n->c.push_back(parse_expression(true));
        expect_op(":");
        n->c.push_back(parse_expression(true));
      }
      ++i_;
      return n;
    }
    unexpected("an expression");
  }
  ExprP parse_postfix(ExprP e) {
    for (;;) {
      const size_t pos = cur().pos;
      if (is_op(".")) {
        ++i_;
        if (cur().type == Tok::Name) {
          auto n = node(E::Attr, pos);
          n->s = t_[i_++].text;
          n->c.push_back(std::move(e));
          e = std::move(n);
        } else if (cur().type == Tok::Int) {
          auto n = node(E::Item, pos);
          auto k = node(E::Const, cur().pos);
          k->v = Val::integer(std::stoll(t_[i_++].text));
          n->c.push_back(std::move(e));
          n->c.push_back(std::move(k));
          e = std::move(n);
        } else {
          unexpected("an attribute name");
        }
      } else if (is_op("[")) {
        ++i_;
        ExprP parts[3];
        bool slice = false;
        int part = 0;
        for (;;) {
          if (is_op("]")) break;
          if (is_op(":")) {
            ++i_;
            slice = true;
            if (++part > 2) unexpected("']'");
            continue;
          }
          if (parts[part]) unexpected("':' or ']'");
          parts[part] = parse_expression(true);
        }
        ++i_;
        if (slice) {
          auto n = node(E::Slice, pos);
          n->c.push_back(std::move(e));
          for (auto& p : parts) n->c.push_back(std::move(p));
          e = std::move(n);
        } else {
          if (!parts[0]) src_.fail(pos, "expected an index inside '[]'");
          auto n = node(E::Item, pos);
          n->c.push_back(std::move(e));
          n->c.push_back(std::move(parts[0]));
          e = std::move(n);
        }
      } else if (is_op("(")) {
        auto n = node(E::Call, pos);
        n->c.push_back(std::move(e));
        parse_call_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }
  void parse_call_args(Expr& n) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) src_.fail(cur().pos, "*args and **kwargs in calls are not supported");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        n.kw.push_back(t_[i_].text);
        i_ += 2;
        n.c.push_back(parse_expression(true));
      } else {
        if (!n.kw.empty()) src_.fail(cur().pos, "a positional argument follows a keyword argument");
        n.c.push_back(parse_expression(true));
      }
    }
    ++i_;
  }
  void parse_filter_body(Expr& f) {
    f.s = expect_name();
    while (is_op(".")) { ++i_; f.s += "." + expect_name(); }
    if (is_op("(")) parse_call_args(f);
  }
  ExprP parse_filter_expr(ExprP e) {
    for (;;) {
      const size_t pos = cur().pos;
      if (is_op("|")) {
        ++i_;
        auto f = node(E::Filter, pos);
        f->c.push_back(std::move(e));
        parse_filter_body(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        ++i_;
        auto t = node(E::Test, pos);
        if (is_name("not")) { ++i_; t->negated = true; }
        t->s = expect_name();
        while (is_op(".")) { ++i_; t->s += "." + expect_name(); }
        t->c.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((cur().type == Tok::Name || cur().type == Tok::String || cur().type == Tok::Int ||
                    cur().type == Tok::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) src_.fail(cur().pos, "you cannot chain multiple tests with is");
          t->c.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        auto n = node(E::Call, pos);
        n->c.push_back(std::move(e));
        parse_call_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }
};

}  // namespace

struct ChatTemplate::Impl {
  Source src;
  Body body;
};

namespace {

// ------------------------------------------------------------------------------------------------ evaluator

struct Args {
  std::vector<Val> pos;
  std::vector<std::pair<std::string, Val>> kw;
};

class Interp;
struct Func {
  std::string name;
  std::function<Val(Interp&, Args&, size_t at)> call;
};

Val make_func(std::string name, std::function<Val(Interp&, Args&, size_t)> f) {
  Val v;
  v.t = T::Func;
  v.fn = std::make_shared<Func>(Func{std::move(name), std::move(f)});
  return v;
}

enum class Flow { Normal, Break, Continue };

class Interp {
 public:
  Interp(const ChatTemplate::Impl& t, const ChatTemplateLimits& lim) : t_(t), lim_(lim) {}

  [[noreturn]] void fail(size_t at, const std::string& what) const { t_.src.fail(at, what); }
  [[noreturn]] void fail_limit(size_t at, const std::string& what) const {
    throw std::runtime_error("[chat_template] " + t_.src.where(at) + ": " + what);
  }

  void step(size_t at) {
    if (++steps_ > lim_.max_steps)
      fail_limit(at, "the template ran more than " + std::to_string(lim_.max_steps) + " steps (ChatTemplateLimits::max_steps)");
  }
  void check_size(size_t n, size_t at) const {
    if (n > lim_.max_output_bytes)
      fail_limit(at, "output or value larger than " + std::to_string(lim_.max_output_bytes) +
                         " bytes (ChatTemplateLimits::max_output_bytes)");
  }

  std::string run(const json::Value& context);

  // Scopes: frames_[0] holds the context and top-level sets; a for loop, a macro call pushes one.
  std::vector<std::unordered_map<std::string, Val>> frames_;
  size_t macro_base_ = 0;  // lookups inside a macro skip the caller's frames above frame 0

  Val lookup(const std::string& name) const {
    for (size_t k = frames_.size(); k-- > 0;) {
      if (k > 0 && k < macro_base_) continue;
      const auto it = frames_[k].find(name);
      if (it != frames_[k].end()) return it->second;
    }
    const auto g = globals_.find(name);
    if (g != globals_.end()) return g->second;
    return Val::undef("'" + name + "' is undefined");
  }

  Val eval(const Expr& e);
  Flow exec(const Body& body, std::string& out);
  Val call(const Val& f, Args& args, size_t at) {
    if (f.t == T::Undef) fail(at, f.s);
    if (f.t != T::Func) fail(at, std::string("'") + py_type(f) + "' object is not callable");
    return f.fn->call(*this, args, at);
  }
  Val apply_filter(const std::string& name, Val v, Args& args, size_t at);
  bool apply_test(const std::string& name, const Val& v, Args& args, size_t at);
  Val getattr(const Val& obj, const std::string& name, size_t at);
  Val getitem(const Val& obj, const Val& key, size_t at);
  std::vector<Val> iterate(const Val& v, size_t at);
  Val binop(const std::string& op, const Val& a, const Val& b, size_t at);
  bool compare(const std::string& op, const Val& a, const Val& b, size_t at);
  std::string tojson(const Val& v, const std::string* indent, bool sort_keys, const std::string& item_sep,
                     const std::string& key_sep, int depth, size_t at);

  void undefined_check(const Val& v, size_t at) const {
    if (v.t == T::Undef) fail(at, v.s);
  }
  void emit(std::string& out, const std::string& s, size_t at) {
    out += s;
    check_size(out.size(), at);
  }

  const ChatTemplate::Impl& t_;
  ChatTemplateLimits lim_;
  uint64_t steps_ = 0;
  int depth_ = 0;
  std::unordered_map<std::string, Val> globals_;
};

int64_t to_index(const Val& v) { return v.t == T::Bool ? (v.b ? 1 : 0) : v.i; }

// Named/positional argument `k` of a builtin, or nullptr.
const Val* arg(const Args& a, size_t k, const char* name) {
  if (k < a.pos.size()) return &a.pos[k];
  for (const auto& kv : a.kw) if (kv.first == name) return &kv.second;
  return nullptr;
}

Val Interp::getattr(const Val& obj, const std::string& name, size_t at) {
  switch (obj.t) {
    case T::Undef: fail(at, obj.s);
    case T::Dict: {
      auto d = obj.d;
      if (name == "items" || name == "keys" || name == "values" || name == "get") {
        return make_func(name, [d, name](Interp& in, Args& a, size_t p) -> Val {
          if (name == "get") {
            const Val* k = arg(a, 0, "key");
            if (!k) in.fail(p, "get() needs a key");
            const Val* dflt = arg(a, 1, "default");
            if (k->t == T::Str) if (const Val* v = d->find(k->s)) return *v;
            return dflt ? *dflt : Val::none();
          }
          List out;
          for (const auto& kv : d->items) {
            if (name == "items") out.push_back(Val::list({Val::str(kv.first), kv.second}, true));
            else if (name == "keys") out.push_back(Val::str(kv.first));
            else out.push_back(kv.second);
          }
          return Val::list(std::move(out));
        });
      }
      if (const Val* v = obj.d->find(name)) return *v;
      return Val::undef("'dict object' has no attribute '" + name + "'");
    }
    case T::Obj: {
      if (const Val* v = obj.d->find(name)) return *v;
      return Val::undef(std::string("'") + py_type(obj) + " object' has no attribute '" + name + "'");
    }
    case T::Str: {
      static const char* kMethods[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith",
                                       "upper", "lower", "title", "capitalize", "replace", "find", "rfind",
                                       "count", "join", "splitlines", "isdigit", "isspace", "isalpha", "removeprefix",
                                       "removesuffix", "islower", "isupper"};
      if (std::find_if(std::begin(kMethods), std::end(kMethods), [&](const char* m) { return name == m; }) ==
          std::end(kMethods))
        return Val::undef("'str object' has no attribute '" + name + "'");
      const std::string s = obj.s;
      return make_func(name, [s, name](Interp& in, Args& a, size_t p) -> Val {
        auto str_arg = [&](size_t k, const char* nm) -> const std::string* {
          const Val* v = arg(a, k, nm);
          if (!v || v->t == T::None) return nullptr;
          if (v->t != T::Str) in.fail(p, name + "() argument must be str, not " + py_type(*v));
          return &v->s;
        };
        if (name == "strip" || name == "lstrip" || name == "rstrip")
          return Val::str(py_strip(s, str_arg(0, "chars"), name != "rstrip", name != "lstrip"));
        if (name == "upper") return Val::str(ascii_upper(s));
        if (name == "lower") return Val::str(ascii_lower(s));
        if (name == "title") return Val::str(py_title(s));
        if (name == "capitalize") return Val::str(py_capitalize(s));
        if (name == "startswith" || name == "endswith") {
          const Val* x = arg(a, 0, "prefix");
          if (!x) in.fail(p, name + "() takes at least 1 argument");
          std::vector<std::string> cands;
          if (x->t == T::Str) cands.push_back(x->s);
          else if (x->t == T::List && x->tuple) for (const auto& it : *x->l) { if (it.t != T::Str) in.fail(p, name + "() tuple must hold str"); cands.push_back(it.s); }
          else in.fail(p, name + "() first arg must be str or a tuple of str, not " + py_type(*x));
          for (const auto& c : cands) {
            if (c.size() > s.size()) continue;
            if (name == "startswith" ? s.compare(0, c.size(), c) == 0 : s.compare(s.size() - c.size(), c.size(), c) == 0) return Val::boolean(true);
          }
          return Val::boolean(false);
        }
        if (name == "replace") {
          const std::string* from = str_arg(0, "old");
          const std::string* to = str_arg(1, "new");
          if (!from || !to) in.fail(p, "replace() takes 2 str arguments");
          const Val* cnt = arg(a, 2, "count");
          const std::string r = replace_all(s, *from, *to, cnt && cnt->t == T::Int ? cnt->i : -1);
          in.check_size(r.size(), p);
          return Val::str(r);
        }
        if (name == "split" || name == "rsplit") {
          const std::string* sep = str_arg(0, "sep");
          const Val* mx = arg(a, 1, "maxsplit");
          int64_t maxsplit = mx && mx->t == T::Int ? mx->i : -1;
          List out;
          if (sep) {
            if (sep->empty()) in.fail(p, "empty separator");
            if (name == "split") {
              size_t pos = 0;
              for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
                const size_t f = s.find(*sep, pos);
                if (f == std::string::npos) break;
                out.push_back(Val::str(s.substr(pos, f - pos)));
                pos = f + sep->size();
              }
              out.push_back(Val::str(s.substr(pos)));
            } else {
              size_t end = s.size();
              std::vector<std::string> parts;
              for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
                if (end < sep->size()) break;
                const size_t f = s.rfind(*sep, end - sep->size());
                if (f == std::string::npos) break;
                parts.push_back(s.substr(f + sep->size(), end - f - sep->size()));
                end = f;
              }
              parts.push_back(s.substr(0, end));
              for (size_t k = parts.size(); k-- > 0;) out.push_back(Val::str(parts[k]));
            }
          } else {  // runs of whitespace; no empty strings
            std::vector<std::pair<size_t, size_t>> words;
            size_t k = 0;
            while (k < s.size()) {
              size_t n = 1;
              if (is_space_cp(decode_cp(s, k, &n))) { k += n; continue; }
              const size_t b = k;
              while (k < s.size() && !is_space_cp(decode_cp(s, k, &n))) k += n;
              words.emplace_back(b, k);
            }
            if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
              const size_t m = static_cast<size_t>(maxsplit);
              if (name == "split") {
                const std::pair<size_t, size_t> rest{words[m].first, words.back().second};
                words.resize(m);
                words.push_back(rest);
              } else {
                const size_t keep = words.size() - m;
                std::vector<std::pair<size_t, size_t>> w2{{words[0].first, words[keep - 1].second}};
                w2.insert(w2.end(), words.begin() + static_cast<std::ptrdiff_t>(keep), words.end());
                words = std::move(w2);
              }
            }
            for (auto& w : words) out.push_back(Val::str(s.substr(w.first, w.second - w.first)));
          }
          return Val::list(std::move(out));
        }
        if (name == "find" || name == "rfind" || name == "count") {
          const std::string* sub = str_arg(0, "sub");
          if (!sub) in.fail(p, name + "() takes a str argument");
          if (name == "count") {
            if (sub->empty()) return Val::integer(static_cast<int64_t>(code_points(s).size()) + 1);
            int64_t n = 0;
            for (size_t pos = s.find(*sub); pos != std::string::npos; pos = s.find(*sub, pos + sub->size())) ++n;
            return Val::integer(n);
          }
          const size_t f = name == "find" ? s.find(*sub) : s.rfind(*sub);
          if (f == std::string::npos) return Val::integer(-1);
          return Val::integer(static_cast<int64_t>(code_points(s.substr(0, f)).size()));
        }
        if (name == "join") {
          const Val* it = arg(a, 0, "iterable");
          if (!it) in.fail(p, "join() takes exactly one argument");
          std::string r;
          bool first = true;
          for (const Val& x : in.iterate(*it, p)) {
            if (x.t != T::Str) in.fail(p, std::string("sequence item: expected str instance, ") + py_type(x) + " found");
            if (!first) r += s;
            r += x.s;
            first = false;
            in.check_size(r.size(), p);
          }
          return Val::str(r);
        }
        if (name == "splitlines") {
          List out;
          for (auto& l : py_splitlines(s)) out.push_back(Val::str(l));
          return Val::list(std::move(out));
        }
        if (name == "removeprefix" || name == "removesuffix") {
          const std::string* x = str_arg(0, "prefix");
          if (!x) in.fail(p, name + "() takes a str argument");
          if (name == "removeprefix") return Val::str(s.compare(0, x->size(), *x) == 0 ? s.substr(x->size()) : s);
          return Val::str(s.size() >= x->size() && s.compare(s.size() - x->size(), x->size(), *x) == 0 ? s.substr(0, s.size() - x->size()) : s);
        }
        bool all = !s.empty(), any_cased = false;
        for (char c : s) {
          if (name == "isdigit") all = all && c >= '0' && c <= '9';
          else if (name == "isspace") all = all && is_space_cp(static_cast<unsigned char>(c));
          else if (name == "isalpha") all = all && is_alpha(c);
          else if (name == "islower") { if (c >= 'A' && c <= 'Z') all = false; if (c >= 'a' && c <= 'z') any_cased = true; }
          else { if (c >= 'a' && c <= 'z') all = false; if (c >= 'A' && c <= 'Z') any_cased = true; }
        }
        if (name == "islower" || name == "isupper") return Val::boolean(all && any_cased);
        return Val::boolean(all);
      });
    }
    default:
      if (obj.t == T::None) return Val::undef("'None' has no attribute '" + name + "'");
      return Val::undef(std::string("'") + py_type(obj) + " object' has no attribute '" + name + "'");
  }
}

Val Interp::getitem(const Val& obj, const Val& key, size_t at) {
  if (obj.t == T::Undef) fail(at, obj.s);
  if ((obj.t == T::List || obj.t == T::Str) && (key.t == T::Int || key.t == T::Bool)) {
    int64_t k = to_index(key);
    if (obj.t == T::List) {
      const int64_t n = static_cast<int64_t>(obj.l->size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Val::undef(std::string(py_type(obj)) + " object has no element " + std::to_string(to_index(key)));
      return (*obj.l)[static_cast<size_t>(k)];
    }
    const auto cps = code_points(obj.s);
    const int64_t n = static_cast<int64_t>(cps.size());
    if (k < 0) k += n;
    if (k < 0 || k >= n) return Val::undef("str object has no element " + std::to_string(to_index(key)));
    return Val::str(std::string(cps[static_cast<size_t>(k)]));
  }
  if (obj.t == T::Dict && key.t == T::Str) {
    if (const Val* v = obj.d->find(key.s)) return *v;
  }
  if (key.t == T::Str) return getattr(obj, key.s, at);
  return Val::undef(std::string(py_type(obj)) + " object has no element " + repr(key));
}

std::vector<Val> Interp::iterate(const Val& v, size_t at) {
  switch (v.t) {
    case T::Undef: return {};
    case T::List: return *v.l;
    case T::Dict: {
      std::vector<Val> out;
      for (const auto& kv : v.d->items) out.push_back(Val::str(kv.first));
      return out;
    }
    case T::Str: {
      std::vector<Val> out;
      for (auto cp : code_points(v.s)) out.push_back(Val::str(std::string(cp)));
      return out;
    }
    default: fail(at, std::string("'") + py_type(v) + "' object is not iterable");
  }
}

Val Interp::binop(const std::string& op, const Val& a, const Val& b, size_t at) {
  if (op == "~") {
    std::string r = to_str(a) + to_str(b);
    check_size(r.size(), at);
    return Val::str(std::move(r));
  }
  undefined_check(a, at);
  undefined_check(b, at);
  auto type_error = [&]() -> Val {
    fail(at, "unsupported operand type(s) for " + op + ": '" + py_type(a) + "' and '" + py_type(b) + "'");
  };
  if (a.is_num() && b.is_num()) {
    const bool ints = a.t != T::Float && b.t != T::Float;
    const int64_t x = a.t == T::Int ? a.i : a.b, y = b.t == T::Int ? b.i : b.b;
    const double fx = a.num(), fy = b.num();
    int64_t r = 0;
    if (op == "+") {
      if (!ints) return Val::flt(fx + fy);
      if (__builtin_add_overflow(x, y, &r)) fail(at, "integer overflow");
      return Val::integer(r);
    }
    if (op == "-") {
      if (!ints) return Val::flt(fx - fy);
      if (__builtin_sub_overflow(x, y, &r)) fail(at, "integer overflow");
      return Val::integer(r);
    }
    if (op == "*") {
      if (!ints) return Val::flt(fx * fy);
      if (__builtin_mul_overflow(x, y, &r)) fail(at, "integer overflow");
      return Val::integer(r);
    }
    if (op == "/") {
      if (fy == 0) fail(at, "division by zero");
      return Val::flt(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (fy == 0) fail(at, op == "%" ? "modulo by zero" : "integer division or modulo by zero");
      if (ints) {
        if (x == INT64_MIN && y == -1) fail(at, "integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) { --q; m += y; }
        return Val::integer(op == "//" ? q : m);
      }
      double m = std::fmod(fx, fy);
      if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
      return op == "//" ? Val::flt(std::floor(fx / fy)) : Val::flt(m);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t res = 1, base = x;
        for (int64_t e = y; e > 0; --e) {
          if (__builtin_mul_overflow(res, base, &res)) fail(at, "integer overflow");
          step(at);
        }
        return Val::integer(res);
      }
      if (fx == 0 && fy < 0) fail(at, "0.0 cannot be raised to a negative power");
      return Val::flt(std::pow(fx, fy));
    }
  }
  if (op == "+") {
    if (a.t == T::Str && b.t == T::Str) {
      check_size(a.s.size() + b.s.size(), at);
      return Val::str(a.s + b.s);
    }
    if (a.t == T::List && b.t == T::List && a.tuple == b.tuple) {
      check_size(a.l->size() + b.l->size(), at);
      List r = *a.l;
      r.insert(r.end(), b.l->begin(), b.l->end());
      return Val::list(std::move(r), a.tuple);
    }
    if (a.t == T::Str) fail(at, std::string("can only concatenate str (not \"") + py_type(b) + "\") to str");
    return type_error();
  }
  if (op == "*") {
    const Val* seq = a.t == T::Str || a.t == T::List ? &a : &b;
    const Val* n = seq == &a ? &b : &a;
    if ((seq->t == T::Str || seq->t == T::List) && (n->t == T::Int || n->t == T::Bool)) {
      const int64_t times = std::max<int64_t>(0, to_index(*n));
      const size_t unit = seq->t == T::Str ? seq->s.size() : seq->l->size();
      if (unit && static_cast<uint64_t>(times) > lim_.max_output_bytes / unit) check_size(lim_.max_output_bytes + 1, at);
      if (seq->t == T::Str) {
        std::string r;
        for (int64_t k = 0; k < times; ++k) r += seq->s;
        return Val::str(std::move(r));
      }
      List r;
      for (int64_t k = 0; k < times; ++k) r.insert(r.end(), seq->l->begin(), seq->l->end());
      return Val::list(std::move(r), seq->tuple);
    }
  }
  if (op == "%" && a.t == T::Str) fail(at, "printf-style formatting ('%' on a string) is not supported");
  return type_error();
}

bool py_lt(const Val& a, const Val& b, Interp& in, size_t at) {
  if (a.is_num() && b.is_num()) return a.num() < b.num();
  if (a.t == T::Str && b.t == T::Str) return a.s < b.s;
  if (a.t == T::List && b.t == T::List) {
    const size_t n = std::min(a.l->size(), b.l->size());
    for (size_t k = 0; k < n; ++k) {
      if (py_eq((*a.l)[k], (*b.l)[k])) continue;
      return py_lt((*a.l)[k], (*b.l)[k], in, at);
    }
    return a.l->size() < b.l->size();
  }
  if (a.t == T::Undef) in.fail(at, a.s);
  if (b.t == T::Undef) in.fail(at, b.s);
  in.fail(at, std::string("'<' not supported between instances of '") + py_type(a) + "' and '" + py_type(b) + "'");
}

bool contains(const Val& container, const Val& item, Interp& in, size_t at) {
  switch (container.t) {
    case T::Str:
      if (item.t != T::Str) in.fail(at, std::string("'in <string>' requires string as left operand, not ") + py_type(item));
      return container.s.find(item.s) != std::string::npos;
    case T::List:
      for (const auto& x : *container.l) if (py_eq(x, item)) return true;
      return false;
    case T::Dict: return item.t == T::Str && container.d->find(item.s) != nullptr;
    case T::Undef: return false;
    default: in.fail(at, std::string("argument of type '") + py_type(container) + "' is not iterable");
  }
}

bool Interp::compare(const std::string& op, const Val& a, const Val& b, size_t at) {
  if (op == "==") return py_eq(a, b);
  if (op == "!=") return !py_eq(a, b);
  if (op == "in") return contains(b, a, *this, at);
  if (op == "notin") return !contains(b, a, *this, at);
  if (op == "<") return py_lt(a, b, *this, at);
  if (op == ">") return py_lt(b, a, *this, at);
  if (op == "<=") return !py_lt(b, a, *this, at);
  return !py_lt(a, b, *this, at);  // >=
}

std::string Interp::tojson(const Val& v, const std::string* indent, bool sort_keys, const std::string& item_sep,
                           const std::string& key_sep, int depth, size_t at) {
  if (depth > 200) fail(at, "tojson: value nested too deeply");
  switch (v.t) {
    case T::None: return "null";
    case T::Bool: return v.b ? "true" : "false";
    case T::Int: return std::to_string(v.i);
    case T::Float:
      if (std::isnan(v.f)) return "NaN";
      if (std::isinf(v.f)) return v.f < 0 ? "-Infinity" : "Infinity";
      return py_float(v.f);
    case T::Str: {
      std::string out;
      json::append_quoted(out, v.s);
      return out;
    }
    case T::List: case T::Dict: {
      const bool is_list = v.t == T::List;
      const size_t n = is_list ? v.l->size() : v.d->items.size();
      if (n == 0) return is_list ? "[]" : "{}";
      std::string nl, nl_close;
      if (indent) {
        nl = "\n";
        for (int k = 0; k <= depth; ++k) nl += *indent;
        nl_close = "\n";
        for (int k = 0; k < depth; ++k) nl_close += *indent;
      }
      std::string out(1, is_list ? '[' : '{');
      std::vector<size_t> order(n);
      for (size_t k = 0; k < n; ++k) order[k] = k;
      if (!is_list && sort_keys)
        std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return v.d->items[x].first < v.d->items[y].first; });
      for (size_t k = 0; k < n; ++k) {
        if (k) out += item_sep;
        out += nl;
        if (is_list) {
          out += tojson((*v.l)[k], indent, sort_keys, item_sep, key_sep, depth + 1, at);
        } else {
          const auto& kv = v.d->items[order[k]];
          json::append_quoted(out, kv.first);
          out += key_sep;
          out += tojson(kv.second, indent, sort_keys, item_sep, key_sep, depth + 1, at);
        }
        check_size(out.size(), at);
      }
      out += nl_close;
      out += is_list ? ']' : '}';
      return out;
    }
    default: fail(at, std::string("Object of type ") + py_type(v) + " is not JSON serializable");
  }
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// jinja2's title filter: words begin after '-', whitespace, '(', '{', '[', '<'.
std::string jinja_title(const std::string& s) {
  std::string out;
  bool start = true;
  for (size_t k = 0; k < s.size();) {
    size_t n = 1;
    const uint32_t cp = decode_cp(s, k, &n);
    const bool sep = is_space_cp(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    std::string ch = s.substr(k, n);
    if (sep) {
      start = true;
    } else {
      ch = start ? ascii_upper(ch) : ascii_lower(ch);
      start = false;
    }
    out += ch;
    k += n;
  }
  return out;
}

// Dotted attribute lookup of selectattr / map / sort / join(attribute=...): getitem at each step.
Val attr_path(Interp& in, const Val& item, const std::string& path, size_t at) {
  Val v = item;
  size_t b = 0;
  while (true) {
    const size_t dot = path.find('.', b);
    const std::string part = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
    Val key = Val::str(part);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }))
      key = Val::integer(std::stoll(part));
    v = in.getitem(v, key, at);
    if (dot == std::string::npos) return v;
    b = dot + 1;
  }
}

bool Interp::apply_test(const std::string& name, const Val& v, Args& a, size_t at) {
  const Val* x = arg(a, 0, "value");
  auto need = [&]() -> const Val& {
    if (!x) fail(at, "test '" + name + "' needs an argument");
    return *x;
  };
  if (name == "defined") return v.t != T::Undef;
  if (name == "undefined") return v.t == T::Undef;
  if (name == "none") return v.t == T::None;
  if (name == "string") return v.t == T::Str;
  if (name == "mapping") return v.t == T::Dict;
  if (name == "iterable") return v.t == T::Undef || v.t == T::Str || v.t == T::List || v.t == T::Dict;
  if (name == "sequence") return v.t == T::Undef || v.t == T::Str || v.t == T::List || v.t == T::Dict;
  if (name == "number") return v.is_num();
  if (name == "integer") return v.t == T::Int;
  if (name == "float") return v.t == T::Float;
  if (name == "boolean") return v.t == T::Bool;
  if (name == "true") return v.t == T::Bool && v.b;
  if (name == "false") return v.t == T::Bool && !v.b;
  if (name == "callable") return v.t == T::Func;
  if (name == "odd" || name == "even") {
    if (v.t != T::Int && v.t != T::Bool) fail(at, std::string("test '") + name + "' needs an int, got " + py_type(v));
    const int64_t n = to_index(v);
    return name == "odd" ? (n % 2 != 0) : (n % 2 == 0);
  }
  if (name == "divisibleby") {
    const Val& d = need();
    if (!v.is_num() || !d.is_num()) fail(at, "divisibleby needs numbers");
    if (d.num() == 0) fail(at, "integer division or modulo by zero");
    return std::fmod(v.num(), d.num()) == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return py_eq(v, need());
  if (name == "ne" || name == "!=") return !py_eq(v, need());
  if (name == "lt" || name == "lessthan" || name == "<") return compare("<", v, need(), at);
  if (name == "le" || name == "<=") return compare("<=", v, need(), at);
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(">", v, need(), at);
  if (name == "ge" || name == ">=") return compare(">=", v, need(), at);
  if (name == "in") return contains(need(), v, *this, at);
  if (name == "sameas") {
    const Val& o = need();
    if (v.t != o.t) return false;
    if (v.t == T::None || v.t == T::Undef) return true;
    if (v.t == T::Bool) return v.b == o.b;
    if (v.t == T::List) return v.l == o.l;
    if (v.t == T::Dict || v.t == T::Obj) return v.d == o.d;
    return py_eq(v, o);
  }
  if (name == "lower" || name == "upper") {
    const std::string s = to_str(v);
    bool cased = false;
    for (char c : s) {
      if (name == "lower" ? (c >= 'A' && c <= 'Z') : (c >= 'a' && c <= 'z')) return false;
      if (is_alpha(c)) cased = true;
    }
    return cased;
  }
  fail(at, "no test named '" + name + "'");
}

Val Interp::apply_filter(const std::string& name, Val v, Args& a, size_t at) {
  auto num_arg = [&](size_t k, const char* nm, int64_t dflt) {
    const Val* x = arg(a, k, nm);
    if (!x) return dflt;
    if (x->t != T::Int && x->t != T::Bool) fail(at, "filter '" + name + "': argument " + nm + " must be an int");
    return to_index(*x);
  };
  auto str_of = [&](const Val* x, const std::string& dflt) { return x ? to_str(*x) : dflt; };
  if (name == "safe" || name == "list" || name == "string") {
    if (name == "safe") return v;
    if (name == "string") return Val::str(to_str(v));
    if (v.t == T::List) return Val::list(*v.l);
    return Val::list(iterate(v, at));
  }
  if (name == "trim") {
    const Val* chars = arg(a, 0, "chars");
    std::string c = chars && chars->t != T::None ? to_str(*chars) : "";
    return Val::str(py_strip(to_str(v), chars && chars->t != T::None ? &c : nullptr, true, true));
  }
  if (name == "upper") return Val::str(ascii_upper(to_str(v)));
  if (name == "lower") return Val::str(ascii_lower(to_str(v)));
  if (name == "capitalize") return Val::str(py_capitalize(to_str(v)));
  if (name == "title") return Val::str(jinja_title(to_str(v)));
  if (name == "escape" || name == "e") return Val::str(html_escape(to_str(v)));
  if (name == "length" || name == "count") {
    switch (v.t) {
      case T::Undef: return Val::integer(0);
      case T::Str: return Val::integer(static_cast<int64_t>(code_points(v.s).size()));
      case T::List: return Val::integer(static_cast<int64_t>(v.l->size()));
      case T::Dict: return Val::integer(static_cast<int64_t>(v.d->items.size()));
      default: fail(at, std::string("object of type '") + py_type(v) + "' has no len()");
    }
  }
  if (name == "first" || name == "last") {
    std::vector<Val> items = iterate(v, at);
    if (items.empty()) return Val::undef(std::string("No ") + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const std::string sep = str_of(arg(a, 0, "d"), "");
    const Val* attribute = arg(a, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Val& x : iterate(v, at)) {
      if (!first) out += sep;
      out += to_str(attribute && attribute->t != T::None ? attr_path(*this, x, to_str(*attribute), at) : x);
      first = false;
      check_size(out.size(), at);
    }
    return Val::str(out);
  }
  if (name == "default" || name == "d") {
    const Val* dv = arg(a, 0, "default_value");
    const Val* boolean = arg(a, 1, "boolean");
    const bool use = v.t == T::Undef || (boolean && truthy(*boolean) && !truthy(v));
    return use ? (dv ? *dv : Val::str("")) : v;
  }
  if (name == "replace") {
    const Val* from = arg(a, 0, "old");
    const Val* to = arg(a, 1, "new");
    if (!from || !to) fail(at, "filter 'replace' needs old and new");
    const std::string r = replace_all(to_str(v), to_str(*from), to_str(*to), num_arg(2, "count", -1));
    check_size(r.size(), at);
    return Val::str(r);
  }
  if (name == "int") {
    const int64_t dflt = num_arg(0, "default", 0);
    if (v.t == T::Int) return v;
    if (v.t == T::Bool) return Val::integer(v.b);
    if (v.t == T::Float) {
      if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return Val::integer(dflt);
      return Val::integer(static_cast<int64_t>(v.f));
    }
    if (v.t == T::Str) {
      const std::string s = py_strip(v.s, nullptr, true, true);
      int64_t x = 0;
      const char* b = s.data() + (s.size() && s[0] == '+' ? 1 : 0);
      auto r = std::from_chars(b, s.data() + s.size(), x);
      if (r.ec == std::errc() && r.ptr == s.data() + s.size() && !s.empty()) return Val::integer(x);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18)
        return Val::integer(static_cast<int64_t>(d));
    }
    return Val::integer(dflt);
  }
  if (name == "float") {
    const Val* dv = arg(a, 0, "default");
    if (v.is_num()) return Val::flt(v.num());
    if (v.t == T::Str) {
      const std::string s = py_strip(v.s, nullptr, true, true);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return Val::flt(d);
    }
    return dv ? Val::flt(dv->num()) : Val::flt(0.0);
  }
  if (name == "items") {
    if (v.t == T::Undef) return Val::list({});
    if (v.t != T::Dict) fail(at, "Can only get item pairs from a mapping.");
    List out;
    for (const auto& kv : v.d->items) out.push_back(Val::list({Val::str(kv.first), kv.second}, true));
    return Val::list(std::move(out));
  }
  if (name == "dictsort") {
    if (v.t != T::Dict) fail(at, "dictsort needs a mapping");
    List out;
    for (const auto& kv : v.d->items) out.push_back(Val::list({Val::str(kv.first), kv.second}, true));
    std::stable_sort(out.begin(), out.end(), [](const Val& x, const Val& y) {
      return ascii_lower((*x.l)[0].s) < ascii_lower((*y.l)[0].s);
    });
    return Val::list(std::move(out));
  }
  if (name == "tojson") {
    const Val* ind = arg(a, 0, "indent");
    const Val* sk = arg(a, 3, "sort_keys");
    const Val* sep = arg(a, 2, "separators");
    std::string indent;
    const std::string* ip = nullptr;
    if (ind && ind->t != T::None) {
      if (ind->t == T::Str) indent = ind->s;
      else if (ind->t == T::Int) indent = std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(ind->i, 64))), ' ');
      else fail(at, "tojson: indent must be an int or a str");
      ip = &indent;
    }
    std::string item_sep = ip ? "," : ", ", key_sep = ": ";
    if (sep && sep->t == T::List && sep->l->size() == 2) {
      item_sep = to_str((*sep->l)[0]);
      key_sep = to_str((*sep->l)[1]);
    }
    const Val* ea = arg(a, 1, "ensure_ascii");
    if (ea && truthy(*ea)) fail(at, "tojson: ensure_ascii=True is not supported");
    return Val::str(tojson(v, ip, sk && truthy(*sk), item_sep, key_sep, 0, at));
  }
  if (name == "indent") {
    const Val* w = arg(a, 0, "width");
    std::string ind = w && w->t == T::Str ? w->s : std::string(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(w ? to_index(*w) : 4, 1 << 16))), ' ');
    const Val* first = arg(a, 1, "first");
    const Val* blank = arg(a, 2, "blank");
    const std::string s = to_str(v) + "\n";
    const auto lines = py_splitlines(s);
    std::string rv;
    if (blank && truthy(*blank)) {
      for (size_t k = 0; k < lines.size(); ++k) { if (k) rv += "\n" + ind; rv += lines[k]; }
    } else {
      rv = lines.empty() ? "" : lines[0];
      for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].empty() ? "" : ind) + lines[k];
    }
    if (first && truthy(*first)) rv = ind + rv;
    check_size(rv.size(), at);
    return Val::str(rv);
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    const bool by_attr = name.size() > 6;
    const bool keep = name[0] == 's';
    size_t k0 = 0;
    std::string attr;
    if (by_attr) {
      const Val* at0 = arg(a, 0, "attribute");
      if (!at0) fail(at, "filter '" + name + "' needs an attribute name");
      attr = to_str(*at0);
      k0 = 1;
    }
    std::string test;
    Args targs;
    if (a.pos.size() > k0) {
      test = to_str(a.pos[k0]);
      targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(k0) + 1, a.pos.end());
    }
    List out;
    for (const Val& x : iterate(v, at)) {
      step(at);
      const Val probe = by_attr ? attr_path(*this, x, attr, at) : x;
      const bool ok = test.empty() ? truthy(probe) : apply_test(test, probe, targs, at);
      if (ok == keep) out.push_back(x);
    }
    return Val::list(std::move(out));
  }
  if (name == "map") {
    List out;
    const Val* attribute = nullptr;
    for (const auto& kv : a.kw) if (kv.first == "attribute") attribute = &kv.second;
    const Val* dflt = nullptr;
    for (const auto& kv : a.kw) if (kv.first == "default") dflt = &kv.second;
    for (const Val& x : iterate(v, at)) {
      step(at);
      if (attribute) {
        Val r = attr_path(*this, x, to_str(*attribute), at);
        out.push_back(r.t == T::Undef && dflt ? *dflt : r);
      } else {
        if (a.pos.empty()) fail(at, "map needs a filter name or attribute=");
        Args fa;
        fa.pos.assign(a.pos.begin() + 1, a.pos.end());
        out.push_back(apply_filter(to_str(a.pos[0]), x, fa, at));
      }
    }
    return Val::list(std::move(out));
  }
  if (name == "reverse") {
    if (v.t == T::Str) {
      auto cps = code_points(v.s);
      std::string r;
      for (size_t k = cps.size(); k-- > 0;) r += cps[k];
      return Val::str(r);
    }
    auto items = iterate(v, at);
    std::reverse(items.begin(), items.end());
    return Val::list(std::move(items));
  }
  if (name == "unique") {
    List out;
    for (const Val& x : iterate(v, at)) {
      bool seen = false;
      for (const Val& y : out) {
        if (x.t == T::Str && y.t == T::Str ? ascii_lower(x.s) == ascii_lower(y.s) : py_eq(x, y)) { seen = true; break; }
      }
      if (!seen) out.push_back(x);
    }
    return Val::list(std::move(out));
  }
  if (name == "sort") {
    const Val* rev = arg(a, 0, "reverse");
    const Val* cs = arg(a, 1, "case_sensitive");
    const Val* attribute = arg(a, 2, "attribute");
    auto items = iterate(v, at);
    auto key = [&](const Val& x) {
      Val k = attribute && attribute->t != T::None ? attr_path(*this, x, to_str(*attribute), at) : x;
      if (k.t == T::Str && !(cs && truthy(*cs))) k.s = ascii_lower(k.s);
      return k;
    };
    std::stable_sort(items.begin(), items.end(), [&](const Val& x, const Val& y) { return py_lt(key(x), key(y), *this, at); });
    if (rev && truthy(*rev)) std::reverse(items.begin(), items.end());
    return Val::list(std::move(items));
  }
  if (name == "abs") {
    if (v.t == T::Int) return Val::integer(v.i < 0 ? -v.i : v.i);
    if (v.t == T::Float) return Val::flt(std::fabs(v.f));
    fail(at, std::string("bad operand type for abs(): '") + py_type(v) + "'");
  }
  if (name == "round") {
    const int64_t prec = num_arg(0, "precision", 0);
    if (!v.is_num()) fail(at, "round needs a number");
    const double p = std::pow(10.0, static_cast<double>(prec));
    return Val::flt(std::round(v.num() * p) / p);
  }
  if (name == "sum" || name == "min" || name == "max") {
    auto items = iterate(v, at);
    if (name == "sum") {
      Val acc = Val::integer(0);
      const Val* attribute = arg(a, 0, "attribute");
      for (const Val& x : items)
        acc = binop("+", acc, attribute && attribute->t != T::None ? attr_path(*this, x, to_str(*attribute), at) : x, at);
      return acc;
    }
    if (items.empty()) return Val::undef("No aggregated item, sequence was empty.");
    Val best = items[0];
    for (const Val& x : items)
      if (name == "min" ? py_lt(x, best, *this, at) : py_lt(best, x, *this, at)) best = x;
    return best;
  }
  if (name == "attr") {
    const Val* n = arg(a, 0, "name");
    if (!n) fail(at, "attr needs a name");
    if (v.t == T::Dict) {  // getattr only: a dict's keys are not its attributes
      const std::string nm = to_str(*n);
      if (nm == "items" || nm == "keys" || nm == "values" || nm == "get") return getattr(v, nm, at);
      return Val::undef("'dict object' has no attribute '" + nm + "'");
    }
    return getattr(v, to_str(*n), at);
  }
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (char c : to_str(v)) {
      const bool w = is_alpha(c) || (c >= '0' && c <= '9') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Val::integer(n);
  }
  fail(at, "no filter named '" + name + "'");
}

Val Interp::eval(const Expr& e) {
  step(e.pos);
  switch (e.k) {
    case E::Const: return e.v;
    case E::Name: return lookup(e.s);
    case E::List: case E::Tuple: {
      List items;
      for (const auto& c : e.c) items.push_back(eval(*c));
      return Val::list(std::move(items), e.k == E::Tuple);
    }
    case E::Dict: {
      Dict d;
      for (size_t k = 0; k + 1 < e.c.size(); k += 2) {
        Val key = eval(*e.c[k]);
        if (key.t != T::Str) fail(e.c[k]->pos, std::string("dictionary keys must be strings, got ") + py_type(key));
        d.set(key.s, eval(*e.c[k + 1]));
      }
      return Val::dict(std::move(d));
    }
    case E::Attr: return getattr(eval(*e.c[0]), e.s, e.pos);
    case E::Item: {
      Val obj = eval(*e.c[0]);
      return getitem(obj, eval(*e.c[1]), e.pos);
    }
    case E::Slice: {
      Val obj = eval(*e.c[0]);
      undefined_check(obj, e.pos);
      int64_t idx[3] = {0, 0, 1};
      bool given[3] = {false, false, false};
      for (int k = 0; k < 3; ++k) {
        if (!e.c[k + 1]) continue;
        Val x = eval(*e.c[k + 1]);
        if (x.t == T::None) continue;
        if (x.t != T::Int && x.t != T::Bool) fail(e.c[k + 1]->pos, "slice indices must be integers or None");
        idx[k] = to_index(x);
        given[k] = true;
      }
      if (idx[2] == 0) fail(e.pos, "slice step cannot be zero");
      std::vector<std::string_view> cps;
      int64_t n = 0;
      if (obj.t == T::List) n = static_cast<int64_t>(obj.l->size());
      else if (obj.t == T::Str) { cps = code_points(obj.s); n = static_cast<int64_t>(cps.size()); }
      else fail(e.pos, std::string("'") + py_type(obj) + "' object is not subscriptable");
      const int64_t st = idx[2];
      auto norm = [&](int64_t x, bool g, int64_t dflt) {
        if (!g) return dflt;
        if (x < 0) x += n;
        if (st > 0) return std::clamp<int64_t>(x, 0, n);
        return std::clamp<int64_t>(x, -1, n - 1);
      };
      const int64_t b = norm(idx[0], given[0], st > 0 ? 0 : n - 1);
      const int64_t en = norm(idx[1], given[1], st > 0 ? n : -1);
      List items;
      std::string s;
      for (int64_t k = b; st > 0 ? k < en : k > en; k += st) {
        if (obj.t == T::List) items.push_back((*obj.l)[static_cast<size_t>(k)]);
        else s += cps[static_cast<size_t>(k)];
      }
      return obj.t == T::List ? Val::list(std::move(items), obj.tuple) : Val::str(std::move(s));
    }
    case E::Call: case E::Filter: case E::Test: {
      Args args;
      const size_t npos = e.c.size() - 1 - e.kw.size();
      for (size_t k = 0; k < npos; ++k) args.pos.push_back(eval(*e.c[1 + k]));
      for (size_t k = 0; k < e.kw.size(); ++k) args.kw.emplace_back(e.kw[k], eval(*e.c[1 + npos + k]));
      if (e.k == E::Call) {
        Val f = eval(*e.c[0]);
        return call(f, args, e.pos);
      }
      Val base = eval(*e.c[0]);
      if (e.k == E::Filter) return apply_filter(e.s, std::move(base), args, e.pos);
      return Val::boolean(apply_test(e.s, base, args, e.pos) != e.negated);
    }
    case E::Neg: case E::Pos: {
      Val x = eval(*e.c[0]);
      undefined_check(x, e.pos);
      if (!x.is_num()) fail(e.pos, std::string("bad operand type for unary ") + (e.k == E::Neg ? "-" : "+") + ": '" + py_type(x) + "'");
      if (e.k == E::Pos) return x.t == T::Bool ? Val::integer(x.b) : x;
      if (x.t == T::Float) return Val::flt(-x.f);
      if (x.t == T::Int && x.i == INT64_MIN) fail(e.pos, "integer overflow");
      return Val::integer(-to_index(x));
    }
    case E::Not: return Val::boolean(!truthy(eval(*e.c[0])));
    case E::And: {
      Val a = eval(*e.c[0]);
      return truthy(a) ? eval(*e.c[1]) : a;
    }
    case E::Or: {
      Val a = eval(*e.c[0]);
      return truthy(a) ? a : eval(*e.c[1]);
    }
    case E::Bin: {
      Val a = eval(*e.c[0]);
      return binop(e.s, a, eval(*e.c[1]), e.pos);
    }
    case E::Cmp: {
      Val a = eval(*e.c[0]);
      for (size_t k = 0; k < e.kw.size(); ++k) {
        Val b = eval(*e.c[k + 1]);
        if (!compare(e.kw[k], a, b, e.c[k + 1]->pos)) return Val::boolean(false);
        a = std::move(b);
      }
      return Val::boolean(true);
    }
    case E::Cond: {
      if (truthy(eval(*e.c[0]))) return eval(*e.c[1]);
      if (e.c[2]) return eval(*e.c[2]);
      return Val::undef("the inline if-expression on line " + std::to_string(t_.src.line(e.pos)) +
                        " evaluated to false and no else section was defined.");
    }
  }
  return Val();
}

void assign(Interp& in, const std::vector<std::string>& targets, const Val& v, size_t at,
            std::unordered_map<std::string, Val>& frame) {
  if (targets.size() == 1) {
    frame[targets[0]] = v;
    return;
  }
  std::vector<Val> items;
  if (v.t == T::List) items = *v.l;
  else if (v.t == T::Str) items = in.iterate(v, at);
  else if (v.t == T::Dict) items = in.iterate(v, at);
  else in.fail(at, std::string("cannot unpack non-iterable ") + py_type(v) + " object");
  if (items.size() != targets.size())
    in.fail(at, std::string(items.size() > targets.size() ? "too many" : "not enough") + " values to unpack (expected " +
                    std::to_string(targets.size()) + ", got " + std::to_string(items.size()) + ")");
  for (size_t k = 0; k < targets.size(); ++k) frame[targets[k]] = items[k];
}

Flow Interp::exec(const Body& body, std::string& out) {
  for (const auto& sp : body) {
    const Stmt& s = *sp;
    switch (s.k) {
      case S::Text: emit(out, s.text, s.pos); break;
      case S::Out: emit(out, to_str(eval(*s.e)), s.pos); break;
      case S::If:
        for (const auto& br : s.branches) {
          if (!br.first || truthy(eval(*br.first))) {
            const Flow f = exec(br.second, out);
            if (f != Flow::Normal) return f;
            break;
          }
        }
        break;
      case S::For: {
        const Val seq = eval(*s.e);
        std::vector<Val> items = iterate(seq, s.e->pos);
        if (s.cond) {
          std::vector<Val> kept;
          for (const Val& x : items) {
            step(s.pos);
            frames_.emplace_back();
            assign(*this, s.targets, x, s.pos, frames_.back());
            const bool ok = truthy(eval(*s.cond));
            frames_.pop_back();
            if (ok) kept.push_back(x);
          }
          items = std::move(kept);
        }
        const int64_t n = static_cast<int64_t>(items.size());
        for (int64_t k = 0; k < n; ++k) {
          step(s.pos);
          Dict loop;
          loop.set("index", Val::integer(k + 1));
          loop.set("index0", Val::integer(k));
          loop.set("revindex", Val::integer(n - k));
          loop.set("revindex0", Val::integer(n - k - 1));
          loop.set("first", Val::boolean(k == 0));
          loop.set("last", Val::boolean(k == n - 1));
          loop.set("length", Val::integer(n));
          loop.set("depth", Val::integer(1));
          loop.set("depth0", Val::integer(0));
          loop.set("previtem", k > 0 ? items[k - 1] : Val::undef("there is no previous item"));
          loop.set("nextitem", k + 1 < n ? items[k + 1] : Val::undef("there is no next item"));
          loop.set("cycle", make_func("cycle", [k](Interp& in, Args& a, size_t p) -> Val {
                     if (a.pos.empty()) in.fail(p, "no items for cycling given");
                     return a.pos[static_cast<size_t>(k) % a.pos.size()];
                   }));
          frames_.emplace_back();
          frames_.back()["loop"] = Val::obj(std::move(loop), false);
          assign(*this, s.targets, items[k], s.pos, frames_.back());
          Flow f;
          try {
            f = exec(s.body, out);
          } catch (...) {
            frames_.pop_back();
            throw;
          }
          frames_.pop_back();
          if (f == Flow::Break) break;
        }
        if (n == 0 && !s.else_body.empty()) {
          const Flow f = exec(s.else_body, out);
          if (f != Flow::Normal) return f;
        }
        break;
      }
      case S::Set: {
        Val v = eval(*s.e);
        if (!s.attr.empty()) {
          Val target = lookup(s.targets[0]);
          if (target.t != T::Obj || !target.ns) fail(s.pos, "cannot assign attribute on non-namespace object");
          if (s.attr[0] == '_') fail(s.pos, "chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + s.attr + "'");
          target.d->set(s.attr, std::move(v));
        } else {
          assign(*this, s.targets, v, s.pos, frames_.back());
        }
        break;
      }
      case S::SetBlock: case S::FilterBlock: case S::Generation: {
        std::string inner;
        const Flow f = exec(s.body, inner);
        Val v = Val::str(std::move(inner));
        for (const auto& fe : s.filters) {
          Args args;
          const size_t npos = fe->c.size() - 1 - fe->kw.size();
          for (size_t k = 0; k < npos; ++k) args.pos.push_back(eval(*fe->c[1 + k]));
          for (size_t k = 0; k < fe->kw.size(); ++k) args.kw.emplace_back(fe->kw[k], eval(*fe->c[1 + npos + k]));
          v = apply_filter(fe->s, std::move(v), args, fe->pos);
        }
        if (s.k == S::SetBlock) frames_.back()[s.targets[0]] = v;
        else emit(out, to_str(v), s.pos);
        if (f != Flow::Normal) return f;
        break;
      }
      case S::Macro: {
        const Stmt* def = &s;
        frames_.back()[s.text] = make_func(s.text, [def](Interp& in, Args& a, size_t p) -> Val {
          if (a.pos.size() > def->targets.size())
            in.fail(p, "macro '" + def->text + "' takes not more than " + std::to_string(def->targets.size()) + " argument(s)");
          std::unordered_map<std::string, Val> frame;
          for (size_t k = 0; k < def->targets.size(); ++k) {
            if (k < a.pos.size()) frame[def->targets[k]] = a.pos[k];
            else if (def->defaults[k]) frame[def->targets[k]] = in.eval(*def->defaults[k]);
            else frame[def->targets[k]] = Val::undef("parameter '" + def->targets[k] + "' was not provided");
          }
          for (const auto& kv : a.kw) {
            if (std::find(def->targets.begin(), def->targets.end(), kv.first) == def->targets.end())
              in.fail(p, "macro '" + def->text + "' takes no keyword argument '" + kv.first + "'");
            frame[kv.first] = kv.second;
          }
          if (++in.depth_ > in.lim_.max_depth)
            in.fail_limit(p, "macro calls nested deeper than " + std::to_string(in.lim_.max_depth) + " (ChatTemplateLimits::max_depth)");
          const size_t saved_base = in.macro_base_;
          in.frames_.push_back(std::move(frame));
          in.macro_base_ = in.frames_.size() - 1;
          std::string body;
          try {
            in.exec(def->body, body);
          } catch (...) {
            in.frames_.pop_back();
            in.macro_base_ = saved_base;
            --in.depth_;
            throw;
          }
          in.frames_.pop_back();
          in.macro_base_ = saved_base;
          --in.depth_;
          return Val::str(std::move(body));
        });
        break;
      }
      case S::Break: return Flow::Break;
      case S::Continue: return Flow::Continue;
    }
  }
  return Flow::Normal;
}

Val from_json(const json::Value& j) {
  switch (j.type()) {
    case json::Value::Type::kNull: return Val::none();
    case json::Value::Type::kBool: return Val::boolean(j.as_bool());
    case json::Value::Type::kNumber: return j.is_integer() ? Val::integer(j.as_integer()) : Val::flt(j.as_number());
    case json::Value::Type::kString: return Val::str(j.as_string());
    case json::Value::Type::kArray: {
      List items;
      for (const auto& x : j.items()) items.push_back(from_json(x));
      return Val::list(std::move(items));
    }
    case json::Value::Type::kObject: {
      Dict d;
      for (const auto& kv : j.members()) d.set(kv.first, from_json(kv.second));
      return Val::dict(std::move(d));
    }
  }
  return Val::none();
}

std::string Interp::run(const json::Value& context) {
  globals_["raise_exception"] = make_func("raise_exception", [](Interp& in, Args& a, size_t p) -> Val {
    const Val* m = arg(a, 0, "message");
    in.fail(p, m ? to_str(*m) : std::string("raise_exception() called"));
  });
  globals_["range"] = make_func("range", [](Interp& in, Args& a, size_t p) -> Val {
    int64_t v[3] = {0, 0, 1};
    for (const Val& x : a.pos)
      if (x.t != T::Int && x.t != T::Bool) in.fail(p, std::string("range() arguments must be int, not ") + py_type(x));
    if (a.pos.size() == 1) v[1] = to_index(a.pos[0]);
    else if (a.pos.size() == 2 || a.pos.size() == 3) for (size_t k = 0; k < a.pos.size(); ++k) v[k] = to_index(a.pos[k]);
    else in.fail(p, "range expected 1 to 3 arguments, got " + std::to_string(a.pos.size()));
    if (v[2] == 0) in.fail(p, "range() arg 3 must not be zero");
    List out;
    for (int64_t k = v[0]; v[2] > 0 ? k < v[1] : k > v[1]; k += v[2]) {
      in.step(p);
      out.push_back(Val::integer(k));
    }
    return Val::list(std::move(out));
  });
  globals_["namespace"] = make_func("namespace", [](Interp& in, Args& a, size_t p) -> Val {
    Dict d;
    for (const Val& x : a.pos) {
      if (x.t != T::Dict) in.fail(p, "namespace() takes a mapping and keyword arguments");
      for (const auto& kv : x.d->items) d.set(kv.first, kv.second);
    }
    for (const auto& kv : a.kw) d.set(kv.first, kv.second);
    for (const auto& kv : d.items)
      if (!kv.first.empty() && kv.first[0] == '_')
        in.fail(p, "chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + kv.first + "'");
    return Val::obj(std::move(d), true);
  });
  globals_["dict"] = make_func("dict", [](Interp& in, Args& a, size_t p) -> Val {
    Dict d;
    for (const Val& x : a.pos) {
      if (x.t != T::Dict) in.fail(p, "dict() takes a mapping and keyword arguments");
      for (const auto& kv : x.d->items) d.set(kv.first, kv.second);
    }
    for (const auto& kv : a.kw) d.set(kv.first, kv.second);
    return Val::dict(std::move(d));
  });
  globals_["strftime_now"] = make_func("strftime_now", [](Interp& in, Args& a, size_t p) -> Val {
    const Val* f = arg(a, 0, "format");
    if (!f || f->t != T::Str) in.fail(p, "strftime_now() takes a format string");
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    std::string buf(256 + f->s.size() * 8, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), f->s.c_str(), &tm);
    buf.resize(n);
    return Val::str(buf);
  });
  frames_.emplace_back();
  if (!context.is_object() && !context.is_null())
    throw std::invalid_argument(std::string("[chat_template] ") + t_.src.name + ": the context must be a JSON object, got " +
                                json::type_name(context.type()));
  for (const auto& kv : context.members()) frames_[0][kv.first] = from_json(kv.second);
  std::string out;
  exec(t_.body, out);
  return out;
}

}  // namespace

ChatTemplate ChatTemplate::parse(std::string source, std::string name) {
  auto impl = std::make_shared<Impl>();
  impl->src.name = std::move(name);
  if (json::first_invalid_utf8(source) != std::string::npos)
    throw std::invalid_argument("[chat_template] " + impl->src.name + ": the template is not valid UTF-8 (at byte " +
                                std::to_string(json::first_invalid_utf8(source)) + ")");
  std::string text;
  text.reserve(source.size());
  for (size_t k = 0; k < source.size(); ++k) {
    if (source[k] == '\r') {
      text += '\n';
      if (k + 1 < source.size() && source[k + 1] == '\n') ++k;
    } else {
      text += source[k];
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  impl->src.text = std::move(text);
  impl->src.index();
  Parser parser(impl->src, tokenize(impl->src));
  impl->body = parser.parse_template();
  ChatTemplate t;
  t.impl_ = std::move(impl);
  return t;
}

std::string ChatTemplate::render(const json::Value& context, const ChatTemplateLimits& limits) const {
  QKV_CHECK_ARG(impl_, "[chat_template] render on a template that was never parsed");
  Interp in(*impl_, limits);
  return in.run(context);
}

const std::string& ChatTemplate::name() const {
  static const std::string empty;
  return impl_ ? impl_->src.name : empty;
}
const std::string& ChatTemplate::source() const {
  static const std::string empty;
  return impl_ ? impl_->src.text : empty;
}

std::string apply_chat_template(const ChatTemplate& tmpl, const json::Value& messages, bool add_generation_prompt,
                                const std::string& bos_token, const std::string& eos_token, const json::Value& extra) {
  QKV_CHECK_ARG(messages.is_array(), "[apply_chat_template] messages must be a JSON array, got ",
                json::type_name(messages.type()));
  QKV_CHECK_ARG(extra.is_object() || extra.is_null(), "[apply_chat_template] extra must be a JSON object, got ",
                json::type_name(extra.type()));
  json::Value msgs = json::Value::array();
  for (size_t k = 0; k < messages.items().size(); ++k) {
    const json::Value& m = messages.items()[k];
    QKV_CHECK_ARG(m.is_object(), "[apply_chat_template] message ", k, " must be an object, got ",
                  json::type_name(m.type()));
    json::Value clean = json::Value::object();
    for (const auto& kv : m.members()) if (!kv.second.is_null()) clean.set(kv.first, kv.second);
    msgs.push(std::move(clean));
  }
  json::Value ctx = json::Value::object();
  ctx.set("messages", std::move(msgs));
  ctx.set("tools", json::Value());
  ctx.set("documents", json::Value());
  ctx.set("add_generation_prompt", add_generation_prompt);
  ctx.set("bos_token", bos_token);
  ctx.set("eos_token", eos_token);
  for (const auto& kv : extra.members()) ctx.set(kv.first, kv.second);
  return tmpl.render(ctx);
}

std::string find_chat_template(const std::string& model_dir) {
  namespace fs = std::filesystem;
  auto read = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    QKV_CHECK_RUNTIME(f, "[find_chat_template] cannot read ", p.string());
    std::ostringstream ss;
    ss << f.rdbuf();
    QKV_CHECK_RUNTIME(!f.bad(), "[find_chat_template] cannot read ", p.string());
    return ss.str();
  };
  const fs::path dir(model_dir);
  QKV_CHECK_RUNTIME(fs::is_directory(dir), "[find_chat_template] ", model_dir, " is not a folder");
  if (fs::is_regular_file(dir / "chat_template.jinja")) return read(dir / "chat_template.jinja");
  const fs::path cfg = dir / "tokenizer_config.json";
  if (fs::is_regular_file(cfg)) {
    const json::Value v = json::Value::parse(read(cfg), "[find_chat_template] " + cfg.string());
    if (const json::Value* t = v.find("chat_template")) {
      if (t->is_string()) return t->as_string();
      QKV_CHECK_ARG(t->is_array(), "[find_chat_template] ", cfg.string(),
                    ": \"chat_template\" must be a string or a list of {name, template}, got ", json::type_name(t->type()));
      for (const auto& e : t->items()) {
        const json::Value* n = e.find("name");
        const json::Value* tt = e.find("template");
        QKV_CHECK_ARG(n && tt && n->is_string() && tt->is_string(), "[find_chat_template] ", cfg.string(),
                      ": each \"chat_template\" entry must be {\"name\": str, \"template\": str}");
        if (n->as_string() == "default") return tt->as_string();
      }
      QKV_CHECK_RUNTIME(false, "[find_chat_template] ", cfg.string(), ": \"chat_template\" has no entry named \"default\"");
    }
  }
  QKV_CHECK_RUNTIME(false, "[find_chat_template] ", model_dir,
                    " has no chat template (neither chat_template.jinja nor a \"chat_template\" in tokenizer_config.json)");
  return {};
}

}  // namespace qkv::text
