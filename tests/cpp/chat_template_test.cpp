// Chat templates: each Jinja construct, transformers' whitespace settings, the published templates' idioms, and every
// error path (syntax errors with line:column, runtime errors, raise_exception, the limits, finding the template).
#include "qkv/text/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace {

using qkv::json::Value;
using qkv::text::ChatTemplate;
using qkv::text::ChatTemplateLimits;

// messages = [system "Be brief.", user "Hi {{ x }} é", assistant " Yo "], bos_token "<s>", eos_token "</s>".
Value context() {
  return Value::parse(
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi {{ x }} é"},
                       {"role": "assistant", "content": " Yo "}],
          "tools": null, "documents": null, "add_generation_prompt": false, "bos_token": "<s>", "eos_token": "</s>"})",
      "test context");
}

std::string render(const std::string& source, const Value& ctx = context()) {
  return ChatTemplate::parse(source, "t").render(ctx);
}

// The message of the exception `f` throws as E (empty when it throws nothing).
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

struct Case {
  const char* name;
  const char* source;
  const char* expected;
};

// The expected strings are jinja2 3.1.6's output for the same template and context in transformers' environment
// (transformers.utils.chat_template_utils._compile_jinja_template(source).render(...)).
const Case kCases[] = {
    {"PrintsPythonReprs",
     "{{ [1, 'a', 1.5, None, True, (1, 2), {'k': 'v'}] }}|{{ none }}|{{ 'it\\'s' }}|{{ [\"it's\"] }}",
     "[1, 'a', 1.5, None, True, (1, 2), {'k': 'v'}]|None|it's|[\"it's\"]"},
    {"FloatsPrintLikePython",
     "{{ 1e20 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 10 / 2 }} {{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ -2.5 }}",
     "1e+20 1e-05 0.30000000000000004 5.0 1e+16 1000000000000000.0 0.0001 -2.5"},
    {"IntegerArithmeticFollowsPython",
     "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ True + 1 }} {{ 1_000 }}",
     "3 -4 2 -2 1024 0.5 3.0 0.5 2 1000"},
    {"StringOperators",
     "{{ 'a' ~ 1 ~ none ~ true }}{{ 'ab' * 3 }}{{ 2 * 'c' }}{{ 'x' + 'y' }}{{ [1] + [2] }}",
     "a1NoneTrueabababccxy[1, 2]"},
    {"ComparisonsAndLogic",
     "{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'b' in 'abc' }}{{ 'z' not in ['a'] }}{{ 'k' in {'k': 1} }}{{ 1 == 1.0 }}{{ [1, 2] < [1, 3] }}{{ 0 or 'x' }}{{ 1 and 2 }}{{ not 0 }}{{ none or [] }}",
     "TrueFalseTrueTrueTrueTrueTruex2True[]"},
    {"InlineIfWithoutElseIsEmpty",
     "[{{ 1 if false }}][{{ 2 if false else 3 }}]",
     "[][3]"},
    {"StringEscapes",
     "{{ '\\u00e9\\x41\\t|\\101|\\q|\\n' }}{{ 'a' \"b\" }}",
     "éA\t|A|\\q|\nab"},
    {"AttributeAndSubscript",
     "{{ messages[1]['role'] }}{{ messages[1].role }}{{ messages[-1].content }}{{ messages[0].get('nope', 'dflt') }}{{ messages[0].keys()|list }}{{ messages[9] is defined }}{{ messages[0].nope is defined }}",
     "useruser Yo dflt['role', 'content']FalseFalse"},
    {"Slices",
     "{{ messages[1:]|length }}|{{ 'héllo'[1] }}|{{ 'héllo'[::-1] }}|{{ [1, 2, 3, 4][::2] }}|{{ [1, 2, 3][5:] }}|{{ [1, 2, 3][-2:] }}|{{ [1, 2, 3][:-1] }}|{{ [1, 2, 3][2:0:-1] }}",
     "2|é|olléh|[1, 3]|[]|[2, 3]|[1, 2]|[3, 2]"},
    {"StringMethods",
     "{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a b c'.split(none, 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ 'xx'.startswith('x') }}{{ 'abc'.endswith(('c', 'd')) }}{{ '  q '.strip() }}{{ '..q..'.lstrip('.') }}{{ 'abcabc'.replace('b', 'B', 1) }}{{ 'ab'.upper() }}{{ 'hello wORLD'.title() }}{{ 'abcb'.find('b') }}{{ '-'.join(['a', 'b']) }}",
     "['a', 'b', '', 'c']['a', 'b']['a', 'b c']['a,b', 'c']TrueTrueqq..aBcabcABHello World1a-b"},
    {"DictMethods",
     "{% for k, v in {'a': 1, 'b': [2]}.items() %}{{ k }}={{ v }};{% endfor %}{{ {'a': 1}.values()|list }}{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b') }}",
     "a=1;b=[2];[1]1None"},
    {"Filters",
     "{{ '  a b  '|trim }}|{{ 'hello wORLD-foo'|title }}|{{ 'hELLO'|capitalize }}|{{ 'x'|upper }}{{ 'Y'|lower }}|{{ 'héllo'|length }}|{{ [1, 2]|first }}{{ [1, 2]|last }}|{{ ['a', 'b']|join(', ') }}|{{ x|default('d') }}{{ ''|default('e', true) }}|{{ 'aXa'|replace('a', 'b') }}|{{ 3|string + 'x' }}|{{ '42'|int + 1 }}|{{ 3.9|int }}|{{ 'x'|int }}|{{ '2.5'|float }}|{{ 'ab'|list }}|{{ {'a': 1}|items|list }}|{{ '<&>'|safe }}|{{ [3, 1, 2]|sort }}|{{ [1, 1, 2]|unique|list }}|{{ messages|count }}",
     "a b|Hello World-Foo|Hello|Xy|5|12|a, b|de|bXb|3x|43|3|0|2.5|['a', 'b']|[('a', 1)]|<&>|[1, 2, 3]|[1, 2]|3"},
    {"Tojson",
     "{{ {'b': 1, 'a': [1, 2.5, none, true, 'é\"\\n<&>']}|tojson }}|{{ {'b': 1, 'a': {}, 'c': [1, {'d': []}]}|tojson(indent=2) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}",
     "{\"b\": 1, \"a\": [1, 2.5, null, true, \"é\\\"\\n<&>\"]}|{\n  \"b\": 1,\n  \"a\": {},\n  \"c\": [\n    1,\n    {\n      \"d\": []\n    }\n  ]\n}|{\"a\": 2, \"b\": 1}"},
    {"Indent",
     "{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(4, true) }}|{{ 'a\n\nb'|indent(2, blank=true) }}",
     "a\n  b\n\n  c|    a\n    b|a\n  \n  b"},
    {"SelectMap",
     "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join }}|{{ messages|rejectattr('role', 'eq', 'user')|list|length }}|{{ [1, 0, 2]|select|list }}|{{ ['a', 'B']|map('upper')|list }}|{{ [1, 2, 3, 4]|reject('odd')|list }}",
     "Hi {{ x }} é|2|[1, 2]|['A', 'B']|[2, 4]"},
    {"Tests",
     "{{ x is defined }}{{ none is none }}{{ 3 is odd }}{{ 4 is even }}{{ 'a' is string }}{{ {} is mapping }}{{ [1] is iterable }}{{ 1 is number }}{{ true is number }}{{ 'A' is upper }}{{ x is undefined }}{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ true is true }}{{ 0 is false }}{{ 6 is divisibleby 3 }}{{ 1 is in [1] }}{{ x is not defined }}{{ 3 is gt 2 }}",
     "FalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrue"},
    {"UndefinedIsEmptyAndFalsy",
     "[{{ nope }}][{{ nope|length }}][{{ nope|lower }}][{{ nope ~ 'x' }}][{{ nope == also_nope }}][{{ 'y' if nope else 'n' }}][{% for a in nope %}never{% endfor %}]",
     "[][0][][x][True][n][]"},
    {"IfElifElse",
     "{% for m in messages %}{% if m.role == 'user' %}U{% elif m.role == 'system' %}S{% else %}A{% endif %}{% endfor %}",
     "SUA"},
    {"LoopVariables",
     "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem.role if loop.previtem is defined else '-' }}{{ loop.nextitem.role if loop.nextitem is defined else '-' }}{{ loop.cycle('o', 'e') }};{% endfor %}",
     "1032TrueFalse3-usero;2121FalseFalse3systemassistante;3210FalseTrue3user-o;"},
    {"ForElseAndInlineFilter",
     "{% for x in [] %}a{% else %}empty{% endfor %}|{% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }} {% endfor %}",
     "empty|2/2 4/2 "},
    {"BreakAndContinue",
     "{% for x in range(6) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}{{ range(2, 9, 3)|list }}{{ range(3, 0, -1)|list }}",
     "023[2, 5, 8][3, 2, 1]"},
    {"TupleUnpacking",
     "{% for a, b in [[1, 2], (3, 4), 'xy'] %}{{ a }}{{ b }}{% endfor %}{% set p, q = 5, 6 %}{{ p }}{{ q }}",
     "1234xy56"},
    {"SetInsideLoopDoesNotLeak",
     "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }}{% if i == 2 %}[{{ y }}]{% endif %}{% set y = i %}{% endfor %}{{ x }}",
     "110120[]1"},
    {"NamespaceCarriesStateOutOfLoops",
     "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.n }}{{ ns.s }}",
     "3sua"},
    {"Macro",
     "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', punct='?') }} {{ greet() }}",
     "Hi a! Hi b? Hi !"},
    {"SetBlockFilterBlockGeneration",
     "{% set x %}  block {{ 1 + 1 }} {% endset %}[{{ x }}]{% filter upper %}shout {{ 'it' }}{% endfilter %}{% set y | trim %}  t  {% endset %}[{{ y }}]{% generation %}gen{% endgeneration %}",
     "[  block 2 ]SHOUT IT[t]gen"},
    {"RawAndComments",
     "{{ '{{' }} {% raw %}{{ raw }} {% if %}{% endraw %}{# a comment {{ x }} #}end",
     "{{ {{ raw }} {% if %}end"},
    {"TrimBlocksDropsTheNewlineAfterATag",
     "{% if true %}\nA\n{% endif %}\nB{{ 'v' }}\nC",
     "A\nBv\nC"},
    {"LstripBlocksDropsIndentBeforeATag",
     "  {% if true %}\n  x\n  {% endif %}\n  y  \n{# c #}\n z\n   {# c2 #}  \n",
     "  x\n  y  \n z\n  "},
    {"MinusStripsAllWhitespace",
     "{%- set x = 'a' -%}   \n\t {{- x -}} \n {# c -#}  \n  {{ x }}  {#- c #}  z",
     "aa  z"},
    {"PlusKeepsWhitespace",
     "{%+ if true %}  keep{% endif %}\n    {%- if true %}x{% endif %}\n  {{ 'v' }}  {% if true +%}\nkept newline{% endif %}",
     "  keepx  v  \nkept newline"},
    {"NewlinesNormalizedAndOneTrailingNewlineDropped",
     "a\r\nb\rc\n\n",
     "a\nb\nc\n"},
};

TEST(ChatTemplate, RendersLikeJinja) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(render(c.source), c.expected);
  }
}

TEST(ChatTemplate, ContextTypesBecomePythonValues) {
  const Value ctx = Value::parse(R"({"i": 3, "f": 3.0, "b": true, "n": null, "s": "x", "l": [1, "a"], "d": {"k": 1}})",
                                 "ctx");
  EXPECT_EQ(render("{{ i }} {{ f }} {{ b }} {{ n }} {{ s }} {{ l }} {{ d }} {{ i is integer }}{{ f is float }}", ctx),
            "3 3.0 True None x [1, 'a'] {'k': 1} TrueTrue");
  EXPECT_EQ(render("{{ anything }}", Value()), "");  // a null context is an empty one
}

TEST(ChatTemplate, SmolLM2StyleTemplateWithAndWithoutSystem) {
  const std::string src =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
      "You are a helpful AI assistant<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
      "{% endif %}";
  const ChatTemplate t = ChatTemplate::parse(src, "smollm2");
  const Value user = Value::parse(R"([{"role": "user", "content": "Hi <|im_start|>"}])", "m");
  EXPECT_EQ(qkv::text::apply_chat_template(t, user, true, "", ""),
            "<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n<|im_start|>user\nHi <|im_start|><|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(qkv::text::apply_chat_template(t, user, false, "", ""),
            "<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n<|im_start|>user\nHi <|im_start|><|im_end|>\n");
}

TEST(ChatTemplate, ApplyChatTemplateDropsNullKeysAndSetsTheDefaults) {
  const ChatTemplate t = ChatTemplate::parse(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content is defined }};{% endfor %}{{ tools }}"
      "{{ documents }}{{ add_generation_prompt }}{{ eos_token }}{{ extra }}",
      "t");
  const Value msgs = Value::parse(R"([{"role": "assistant", "content": null}])", "m");
  Value extra = Value::object();
  extra.set("extra", "!");
  EXPECT_EQ(qkv::text::apply_chat_template(t, msgs, true, "<s>", "</s>", extra),
            "<s>assistant:False;NoneNoneTrue</s>!");
  EXPECT_THROW(qkv::text::apply_chat_template(t, Value::object(), false, "", ""), std::invalid_argument);
  EXPECT_THROW(qkv::text::apply_chat_template(t, Value::parse("[1]", "m"), false, "", ""), std::invalid_argument);
  EXPECT_THROW(qkv::text::apply_chat_template(t, msgs, false, "", "", Value::array()), std::invalid_argument);
}

TEST(ChatTemplate, GemmaStyleRaiseExceptionNamesTheTemplate) {
  const std::string src =
      "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}ok";
  const std::string msg = error_of<std::invalid_argument>([&] { (void)ChatTemplate::parse(src, "gemma2").render(context()); });
  EXPECT_EQ(msg, "[chat_template] gemma2:1:74: System role not supported");
}

TEST(ChatTemplate, MistralStyleAlternationError) {
  const std::string src =
      "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
      "{% endfor %}";
  const std::string msg = error_of<std::invalid_argument>([&] { (void)render(src); });
  EXPECT_NE(msg.find("Conversation roles must alternate"), std::string::npos) << msg;
}

TEST(ChatTemplateErrors, SyntaxErrorsNameTheTemplateLineAndColumn) {
  const std::pair<const char*, const char*> cases[] = {
      {"{% if x %}never closed", "[chat_template] t:1:23: unexpected end of template (expected 'elif' or 'else' or 'endif')"},
      {"line one\n{{ 1 + }}", "[chat_template] t:2:8: unexpected end of print statement (expected an expression)"},
      {"{% for x in y %}{% endif %}", "[chat_template] t:1:20: unknown tag 'endif' (expected 'endfor' or 'else')"},
      {"{{ 'unterminated }}", "[chat_template] t:1:4: unterminated string literal"},
      {"{% include 'x' %}", "[chat_template] t:1:4: unknown tag 'include'"},
      {"{# open comment", "[chat_template] t:1:1: missing end of comment tag"},
      {"{{ (1 }}", "[chat_template] t:1:7: unexpected '}', expected ')'"},
      {"{{ 1 ]}}", "[chat_template] t:1:6: unexpected ']'"},
      {"{{ x", "[chat_template] t:1:1: missing end of print tag '}}'"},
      {"{% if x", "[chat_template] t:1:1: missing end of tag '%}'"},
      {"{% raw %}abc", "[chat_template] t:1:1: missing end of raw directive"},
      {"{{ a $ b }}", "[chat_template] t:1:6: unexpected char '$'"},
      {"{{ '\\x4' }}", "[chat_template] t:1:4: truncated \\x escape in a string literal"},
      {"{{ 99999999999999999999 }}", "[chat_template] t:1:4: integer literal 99999999999999999999 is out of range"},
      {"{% for x in y recursive %}{% endfor %}", "[chat_template] t:1:15: recursive for loops are not supported"},
      {"{{ f(*a) }}", "[chat_template] t:1:6: *args and **kwargs in calls are not supported"},
      {"{{ f(a=1, 2) }}", "[chat_template] t:1:11: a positional argument follows a keyword argument"},
      {"{{ x is defined is defined }}", "[chat_template] t:1:17: you cannot chain multiple tests with is"},
      {"{{ x[] }}", "[chat_template] t:1:5: expected an index inside '[]'"},
      {"{% set %}", "[chat_template] t:1:8: unexpected end of statement block (expected a name)"},
      {"{% set x.y %}", "[chat_template] t:1:12: unexpected end of statement block (expected '=')"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.first);
    EXPECT_EQ(error_of<std::invalid_argument>([&] { (void)ChatTemplate::parse(c.first, "t"); }), c.second);
  }
}

TEST(ChatTemplateErrors, DeepNestingIsRefusedAtParse) {
  std::string src = "{{ ";
  for (int k = 0; k < 500; ++k) src += "(";
  src += "1";
  for (int k = 0; k < 500; ++k) src += ")";
  src += " }}";
  EXPECT_NE(error_of<std::invalid_argument>([&] { (void)ChatTemplate::parse(src, "t"); }).find("nesting deeper than 200"),
            std::string::npos);
}

TEST(ChatTemplateErrors, InvalidUtf8TemplateIsRefused) {
  EXPECT_EQ(error_of<std::invalid_argument>([] { (void)ChatTemplate::parse("ab\xff", "t"); }),
            "[chat_template] t: the template is not valid UTF-8 (at byte 2)");
}

TEST(ChatTemplateErrors, RuntimeErrorsNameTheTemplateLineAndColumn) {
  const std::pair<const char*, const char*> cases[] = {
      {"{{ x.y }}", "[chat_template] t:1:5: 'x' is undefined"},
      {"{{ messages[9].role }}", "[chat_template] t:1:15: list object has no element 9"},
      {"{{ messages[0].nope.x }}", "[chat_template] t:1:20: 'dict object' has no attribute 'nope'"},
      {"{{ (1 if false).x }}", "[chat_template] t:1:16: the inline if-expression on line 1 evaluated to false and no else section was defined."},
      {"{{ 1 + 'a' }}", "[chat_template] t:1:4: unsupported operand type(s) for +: 'int' and 'str'"},
      {"{{ 'a' + 1 }}", "[chat_template] t:1:4: can only concatenate str (not \"int\") to str"},
      {"{{ x + 1 }}", "[chat_template] t:1:4: 'x' is undefined"},
      {"{{ 1 / 0 }}", "[chat_template] t:1:4: division by zero"},
      {"{{ 1 // 0 }}", "[chat_template] t:1:4: integer division or modulo by zero"},
      {"{{ 1 % 0 }}", "[chat_template] t:1:4: modulo by zero"},
      {"{{ 9223372036854775807 + 1 }}", "[chat_template] t:1:4: integer overflow"},
      {"{{ 2 ** 64 }}", "[chat_template] t:1:4: integer overflow"},
      {"{{ -'a' }}", "[chat_template] t:1:4: bad operand type for unary -: 'str'"},
      {"{{ '%s' % 1 }}", "[chat_template] t:1:4: printf-style formatting ('%' on a string) is not supported"},
      {"{{ none|length }}", "[chat_template] t:1:8: object of type 'NoneType' has no len()"},
      {"{% for x in 3 %}{% endfor %}", "[chat_template] t:1:13: 'int' object is not iterable"},
      {"{{ 1 < 'a' }}", "[chat_template] t:1:8: '<' not supported between instances of 'int' and 'str'"},
      {"{{ 1 in 3 }}", "[chat_template] t:1:9: argument of type 'int' is not iterable"},
      {"{{ 1 in 'abc' }}", "[chat_template] t:1:9: 'in <string>' requires string as left operand, not int"},
      {"{% set a, b = [1] %}", "[chat_template] t:1:4: not enough values to unpack (expected 2, got 1)"},
      {"{% set a, b = 1 %}", "[chat_template] t:1:4: cannot unpack non-iterable int object"},
      {"{% set x = 1 %}{% set x.y = 2 %}", "[chat_template] t:1:19: cannot assign attribute on non-namespace object"},
      {"{% set ns = namespace() %}{% set ns._p = 1 %}",
       "[chat_template] t:1:30: chat templates cannot store underscore-prefixed attributes on a namespace, but got '_p'"},
      {"{{ namespace(_x=1) }}",
       "[chat_template] t:1:13: chat templates cannot store underscore-prefixed attributes on a namespace, but got '_x'"},
      {"{{ 3|nosuchfilter }}", "[chat_template] t:1:5: no filter named 'nosuchfilter'"},
      {"{{ 3 is nosuchtest }}", "[chat_template] t:1:6: no test named 'nosuchtest'"},
      {"{{ nope() }}", "[chat_template] t:1:8: 'nope' is undefined"},
      {"{{ 3() }}", "[chat_template] t:1:5: 'int' object is not callable"},
      {"{{ {1: 2} }}", "[chat_template] t:1:5: dictionary keys must be strings, got int"},
      {"{{ [1][1:2:0] }}", "[chat_template] t:1:7: slice step cannot be zero"},
      {"{{ 3[1:] }}", "[chat_template] t:1:5: 'int' object is not subscriptable"},
      {"{{ {'a': x}|tojson }}", "[chat_template] t:1:12: Object of type Undefined is not JSON serializable"},
      {"{{ 'a'.split('') }}", "[chat_template] t:1:13: empty separator"},
      {"{{ range(1, 2, 0) }}", "[chat_template] t:1:9: range() arg 3 must not be zero"},
      {"{{ range('a') }}", "[chat_template] t:1:9: range() arguments must be int, not str"},
      {"{{ 'a'|tojson(ensure_ascii=true) }}", "[chat_template] t:1:7: tojson: ensure_ascii=True is not supported"},
      {"{{ 3|items }}", "[chat_template] t:1:5: Can only get item pairs from a mapping."},
      {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "[chat_template] t:1:35: macro 'm' takes not more than 1 argument(s)"},
      {"{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", "[chat_template] t:1:35: macro 'm' takes no keyword argument 'b'"},
      {"{{ raise_exception('boom') }}", "[chat_template] t:1:19: boom"},
      {"{{ strftime_now(3) }}", "[chat_template] t:1:16: strftime_now() takes a format string"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.first);
    EXPECT_EQ(error_of<std::invalid_argument>([&] { (void)render(c.first); }), c.second);
  }
}

TEST(ChatTemplateErrors, ContextMustBeAnObject) {
  EXPECT_EQ(error_of<std::invalid_argument>([] { (void)render("x", Value::array()); }),
            "[chat_template] t: the context must be a JSON object, got an array");
  EXPECT_THROW((void)ChatTemplate().render(Value::object()), std::invalid_argument);
}

TEST(ChatTemplateLimits, StepsOutputAndDepthAreBounded) {
  const ChatTemplate loop = ChatTemplate::parse("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", "t");
  ChatTemplateLimits small;
  small.max_steps = 10000;
  EXPECT_NE(error_of<std::runtime_error>([&] { (void)loop.render(Value::object(), small); }).find("ChatTemplateLimits::max_steps"),
            std::string::npos);
  EXPECT_NE(error_of<std::runtime_error>([] { (void)render("{{ 'x' * 10**12 }}"); }).find("ChatTemplateLimits::max_output_bytes"),
            std::string::npos);
  small = {};
  small.max_output_bytes = 100;
  const ChatTemplate many = ChatTemplate::parse("{% for i in range(60) %}ab{% endfor %}", "t");
  EXPECT_EQ(error_of<std::runtime_error>([&] { (void)many.render(Value::object(), small); }),
            "[chat_template] t:1:25: output or value larger than 100 bytes (ChatTemplateLimits::max_output_bytes)");
  const ChatTemplate rec = ChatTemplate::parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "t");
  EXPECT_EQ(error_of<std::runtime_error>([&] { (void)rec.render(Value::object()); }),
            "[chat_template] t:1:21: macro calls nested deeper than 64 (ChatTemplateLimits::max_depth)");
  // The same template renders when the limits allow it.
  EXPECT_EQ(ChatTemplate::parse("{% for i in range(3) %}ab{% endfor %}", "t").render(Value::object(), small), "ababab");
}

class FindChatTemplate : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("qkv_chat_template_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  std::string find() { return qkv::text::find_chat_template(dir_.string()); }
  std::filesystem::path dir_;
};

TEST_F(FindChatTemplate, PrefersChatTemplateJinja) {
  write("tokenizer_config.json", R"({"chat_template": "from config"})");
  EXPECT_EQ(find(), "from config");
  write("chat_template.jinja", "from jinja\n");
  EXPECT_EQ(find(), "from jinja\n");
}

TEST_F(FindChatTemplate, TakesTheDefaultOfAList) {
  write("tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_EQ(find(), "D");
}

TEST_F(FindChatTemplate, ErrorsNameTheFolderOrFile) {
  EXPECT_NE(error_of<std::runtime_error>([&] { find(); }).find("has no chat template"), std::string::npos);
  write("tokenizer_config.json", R"({"bos_token": "<s>"})");
  EXPECT_NE(error_of<std::runtime_error>([&] { find(); }).find("has no chat template"), std::string::npos);
  write("tokenizer_config.json", R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  EXPECT_NE(error_of<std::runtime_error>([&] { find(); }).find("no entry named \"default\""), std::string::npos);
  write("tokenizer_config.json", R"({"chat_template": [{"name": 1}]})");
  EXPECT_NE(error_of<std::invalid_argument>([&] { find(); }).find("{\"name\": str, \"template\": str}"), std::string::npos);
  write("tokenizer_config.json", R"({"chat_template": 3})");
  EXPECT_NE(error_of<std::invalid_argument>([&] { find(); }).find("must be a string or a list"), std::string::npos);
  write("tokenizer_config.json", R"({"chat_template": )");
  EXPECT_NE(error_of<std::invalid_argument>([&] { find(); }).find("tokenizer_config.json"), std::string::npos);
  EXPECT_NE(error_of<std::runtime_error>([&] { (void)qkv::text::find_chat_template((dir_ / "nope").string()); })
                .find("is not a folder"),
            std::string::npos);
}

}  // namespace
