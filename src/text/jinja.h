// The Jinja2 interpreter behind ChatTemplate (qkv/text/chat_template.h), private to src/text: its values, tokens,
// syntax tree and interpreter, shared by jinja_values.cpp (UTF-8 and Python text helpers, values), jinja_lexer.cpp,
// jinja_parser.cpp, jinja_eval.cpp (expressions and statements) and jinja_builtins.cpp (str/dict methods, filters,
// tests); chat_template.cpp drives them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "qkv/core/json.h"
#include "qkv/text/chat_template.h"

namespace qkv::text::jinja {

// ------------------------------------------------------------------------------------------------ UTF-8 and text
// (jinja_values.cpp)

// The code point that starts at byte i of s, and its length in bytes in *n (a stray byte: itself, length 1).
uint32_t decode_cp(std::string_view s, size_t i, size_t* n);
void append_cp(std::string& out, uint32_t cp);
// The code points of s as views (Python indexes strings by code point).
std::vector<std::string_view> code_points(std::string_view s);
// Python's str.isspace (and re's \s on str).
bool is_space_cp(uint32_t cp);
bool all_space(std::string_view s);
// Python's str.strip / lstrip / rstrip: whitespace, or the code points of `chars` when given.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);
std::string ascii_upper(std::string s);
std::string ascii_lower(std::string s);
bool is_alpha(char c);
// Python's str.title: a letter after a non-letter is upper-cased, other letters lower-cased.
std::string py_title(std::string s);
std::string py_capitalize(std::string s);
// Python's str.replace(from, to, count); count < 0: all.
std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count);
// Python's str.splitlines().
std::vector<std::string> py_splitlines(std::string_view s);
// Python's repr(float).
std::string py_float(double d);
// Python's repr(str).
std::string py_repr_str(const std::string& s);

// ------------------------------------------------------------------------------------------------ values
// (jinja_values.cpp)

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

// Python's type name of v ("str", "list", "NoneType", ...).
const char* py_type(const Val& v);
// Python's bool(v).
bool truthy(const Val& v);
// str(v), as {{ v }} prints it.
std::string to_str(const Val& v);
// Python's repr(v).
std::string repr(const Val& v);
// Python's v == w.
bool py_eq(const Val& a, const Val& b);

// ------------------------------------------------------------------------------------------------ lexer
// (jinja_lexer.cpp)

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

// jinja2's Lexer.tokeniter with trim_blocks=True and lstrip_blocks=True.
std::vector<Token> tokenize(const Source& src);

// ------------------------------------------------------------------------------------------------ syntax tree
// (built by jinja_parser.cpp, run by jinja_eval.cpp)

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
// (jinja_parser.cpp)

// The template's statements; throws std::invalid_argument "[chat_template] <name>:<line>:<col>: ..." on a syntax error.
Body parse(const Source& src, std::vector<Token> toks);

}  // namespace qkv::text::jinja

namespace qkv::text {

// What ChatTemplate::parse builds and the interpreter runs.
struct ChatTemplate::Impl {
  jinja::Source src;
  jinja::Body body;
};

}  // namespace qkv::text

namespace qkv::text::jinja {

// ------------------------------------------------------------------------------------------------ evaluator
// (jinja_eval.cpp; Interp::getattr, apply_filter and apply_test in jinja_builtins.cpp)

struct Args {
  std::vector<Val> pos;
  std::vector<std::pair<std::string, Val>> kw;
};

class Interp;
struct Func {
  std::string name;
  std::function<Val(Interp&, Args&, size_t at)> call;
};

// A callable value (a builtin function or method, a macro).
Val make_func(std::string name, std::function<Val(Interp&, Args&, size_t)> f);

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

// v as an int (a bool counts as 0 / 1).
int64_t to_index(const Val& v);
// Named/positional argument `k` of a builtin, or nullptr.
const Val* arg(const Args& a, size_t k, const char* name);
// Python's a < b: numbers, strings, lists; a TypeError (in.fail) otherwise.
bool py_lt(const Val& a, const Val& b, Interp& in, size_t at);
// Python's `item in container`.
bool contains(const Val& container, const Val& item, Interp& in, size_t at);

}  // namespace qkv::text::jinja
