// Chat templates' Jinja2 interpreter: UTF-8 and Python text helpers (strip, title, repr, ...), and the values'
// Python semantics (type names, truth, str(), repr(), ==). jinja.h declares them and maps the other files.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "jinja.h"

namespace qkv::text::jinja {

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

}  // namespace qkv::text::jinja
