// Chat templates' Jinja2 interpreter: the parser, a recursive descent over the lexer's tokens (jinja_lexer.cpp) that
// builds the syntax tree of jinja.h (statements, expressions) as jinja2's Parser does. jinja_eval.cpp runs the tree.
#include <charconv>

#include "jinja.h"

namespace qkv::text::jinja {

namespace {

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
    while (is_op(".")) { ++i_; f.s += '.'; f.s += expect_name(); }
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
        while (is_op(".")) { ++i_; t->s += '.'; t->s += expect_name(); }
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

Body parse(const Source& src, std::vector<Token> toks) {
  Parser parser(src, std::move(toks));
  return parser.parse_template();
}

}  // namespace qkv::text::jinja
