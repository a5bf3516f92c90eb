// Chat templates' Jinja2 interpreter: the evaluator of the syntax tree (expressions, operators, comparisons, tojson,
// statements, scopes, macros) and the globals. Attribute lookup (str/dict methods), filters and tests are in
// jinja_builtins.cpp.
#include <cmath>
#include <ctime>

#include "jinja.h"

namespace qkv::text::jinja {

Val make_func(std::string name, std::function<Val(Interp&, Args&, size_t)> f) {
  Val v;
  v.t = T::Func;
  v.fn = std::make_shared<Func>(Func{std::move(name), std::move(f)});
  return v;
}

int64_t to_index(const Val& v) { return v.t == T::Bool ? (v.b ? 1 : 0) : v.i; }

// Named/positional argument `k` of a builtin, or nullptr.
const Val* arg(const Args& a, size_t k, const char* name) {
  if (k < a.pos.size()) return &a.pos[k];
  for (const auto& kv : a.kw) if (kv.first == name) return &kv.second;
  return nullptr;
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

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace qkv::text::jinja
