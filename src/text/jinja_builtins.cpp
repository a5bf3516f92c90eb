// Chat templates' Jinja2 interpreter: the builtins a template reaches by name: attributes and methods of str, dict
// and objects (Interp::getattr), jinja2's filters (apply_filter) and tests (apply_test). The evaluator that calls
// them is jinja_eval.cpp.
#include <charconv>
#include <cmath>

#include "jinja.h"

namespace qkv::text::jinja {

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

namespace {

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

}  // namespace

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

}  // namespace qkv::text::jinja
