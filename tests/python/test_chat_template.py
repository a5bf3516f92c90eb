"""qkv.ChatTemplate against transformers' own compiled template (jinja2 with transformers' environment: trim_blocks,
lstrip_blocks, loop controls, its tojson, raise_exception, strftime_now), on the same template strings and messages.

The templates are the ones models publish (tests/python/chat_templates/*.jinja, and SmolLM2's from the folder that
transformers writes for it, tests/python/smollm2.py); the snippets exercise each construct on its own."""
import datetime
import pathlib

import jinja2
import pytest
from transformers.utils.chat_template_utils import _compile_jinja_template

import qkv
import smollm2

HERE = pathlib.Path(__file__).resolve().parent
TEMPLATES = HERE / "chat_templates"

SYSTEM = {"role": "system", "content": "You are a terse assistant.\n"}
U1 = {"role": "user", "content": "Hello, how are you?"}
A1 = {"role": "assistant", "content": "  Fine, thanks. "}
U2 = {"role": "user",
      "content": "Tricky: {{ not a tag }} {% if %} <|im_start|>user\n é漢字🙂 \"quotes\" 'single'\nsecond line\n  indented  "}
A2 = {"role": "assistant", "content": "Ünïcödé answer\twith a tab\n"}

CONVERSATIONS = {
    "one_turn": [U1],
    "multi_turn": [U1, A1, U2],
    "system_one_turn": [SYSTEM, U1],
    "system_multi_turn": [SYSTEM, U1, A1, U2, A2],
    "ends_with_assistant": [U1, A1],
    "two_users_in_a_row": [U1, U2],
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, in °C.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "e.g. Zürich"},
                           "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TOOL_CALL = {"role": "assistant",
             "tool_calls": [{"type": "function",
                             "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}}]}
TOOL_REPLY = {"role": "tool", "content": "{\"temp\": 21.5}"}

SPECIAL = {"bos_token": "<s>", "eos_token": "</s>"}


def template_sources():
    out = {p.stem: p.read_text(encoding="utf-8") for p in sorted(TEMPLATES.glob("*.jinja"))}
    out["smollm2"] = (smollm2.hf_folder() / "chat_template.jinja").read_text(encoding="utf-8")
    return out


SOURCES = template_sources()


def reference(source, messages, add_generation_prompt=False, **kwargs):
    """transformers' rendering: (text, None) or (None, the error message)."""
    try:
        text = _compile_jinja_template(source).render(messages=messages, tools=kwargs.pop("tools", None),
                                                      documents=None, add_generation_prompt=add_generation_prompt,
                                                      **kwargs)
        return text, None
    except jinja2.exceptions.TemplateError as e:
        return None, str(e)


def check_same(source, messages, add_generation_prompt=False, **kwargs):
    want, error = reference(source, messages, add_generation_prompt, **dict(kwargs))
    tmpl = qkv.ChatTemplate(source, "t")
    if error is not None:
        with pytest.raises(ValueError) as info:
            tmpl.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)
        assert error.splitlines()[0] in str(info.value)
        assert str(info.value).startswith("[chat_template] t:")
        return None
    got = tmpl.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)
    assert got == want
    return got


@pytest.mark.parametrize("add_generation_prompt", [False, True])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("template", sorted(SOURCES))
def test_published_templates_match_transformers(template, conversation, add_generation_prompt):
    check_same(SOURCES[template], CONVERSATIONS[conversation], add_generation_prompt, **SPECIAL)


def test_every_template_renders_at_least_one_conversation():
    for name, source in SOURCES.items():
        rendered = [reference(source, c, True, **SPECIAL)[0] for c in CONVERSATIONS.values()]
        assert any(r for r in rendered), name


def test_gemma_rejects_the_system_role_in_both():
    _, error = reference(SOURCES["gemma2"], [SYSTEM, U1], **SPECIAL)
    assert error == "System role not supported"
    with pytest.raises(ValueError, match="System role not supported"):
        qkv.ChatTemplate(SOURCES["gemma2"]).render([SYSTEM, U1], **SPECIAL)


@pytest.mark.parametrize("template", ["mistral_v0_1", "mistral_v0_3", "gemma2"])
def test_alternating_roles_are_enforced_in_both(template):
    _, error = reference(SOURCES[template], [U1, U2], **SPECIAL)
    assert error is not None and "alternate" in error
    with pytest.raises(ValueError, match="alternate user/assistant"):
        qkv.ChatTemplate(SOURCES[template]).render([U1, U2], **SPECIAL)


@pytest.mark.parametrize("tools_in_user_message", [True, False])
def test_llama31_tools_and_dates(tools_in_user_message):
    src = SOURCES["llama3_1"]
    kw = dict(SPECIAL, tools=[WEATHER_TOOL], tools_in_user_message=tools_in_user_message)
    check_same(src, [SYSTEM, U1], True, **kw)
    check_same(src, [U1, TOOL_CALL, TOOL_REPLY], True, **kw)
    check_same(src, [U1, TOOL_CALL, {"role": "ipython", "content": {"temp": 21.5}}], True, **kw)
    check_same(src, [SYSTEM, U1], True, date_string="05 Dec 2025", **SPECIAL)
    check_same(src, [SYSTEM, U1, A1], False, builtin_tools=["brave_search", "code_interpreter"], **SPECIAL)
    builtin_call = {"role": "assistant", "tool_calls": [
        {"function": {"name": "brave_search", "arguments": {"query": "qkv"}}}]}
    check_same(src, [U1, builtin_call], False, builtin_tools=["brave_search"], **SPECIAL)
    two_calls = {"role": "assistant", "tool_calls": TOOL_CALL["tool_calls"] * 2}
    assert check_same(src, [U1, two_calls], **SPECIAL) is None  # "only supports single tool-calls" in both
    assert check_same(src, [], tools=[WEATHER_TOOL], **SPECIAL) is None  # tools but no user message


def test_qwen25_tools_and_default_system():
    src = SOURCES["qwen2_5"]
    got = check_same(src, [U1], True)
    assert got.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    check_same(src, [SYSTEM, U1], True, tools=[WEATHER_TOOL])
    check_same(src, [U1], True, tools=[WEATHER_TOOL])
    check_same(src, [U1, dict(TOOL_CALL, content="Let me check."), TOOL_REPLY, TOOL_REPLY, A1, U2], True,
               tools=[WEATHER_TOOL])


SNIPPETS = [
    "{{ [1, 'a', 1.5, None, True, (1, 2), (3,), {'k': 'v'}] }}",
    "{{ 1e20 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ 10 / 2 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7.5 // 2 }} "
    "{{ -7.5 % 2 }} {{ 1_000 }} {{ 2.5e3 }} {{ 123456789012345678.0 }} {{ -0.0001 }} {{ True + 1 }}",
    "  {% if true %}\n  x\n  {% endif %}\n  y  \n{# c #}\n z\n   {# c2 #}  \n",
    "{%- for m in messages -%}\n  {{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}\n{%- endfor %}",
    "{% for m in messages %}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}"
    "{{ loop.previtem.role if loop.previtem is defined else '-' }}{{ loop.nextitem.role if loop.nextitem is defined }}"
    "{{ loop.cycle('odd', 'even') }};{% endfor %}",
    "{% for k, v in {'a': 1, 'b': [2]}.items() %}{{ k }}={{ v }};{% endfor %}{% for k in {'x': 1} %}{{ k }}{% endfor %}",
    "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ m.role[0] %}"
    "{% endfor %}{{ ns.n }}{{ ns.s }}",
    "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }}{% if i == 2 %}[{{ y }}]{% endif %}"
    "{% set y = i %}{% endfor %}{{ x }}",
    "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(' | ') }}"
    "{{ messages|rejectattr('role', 'eq', 'user')|list|length }}{{ [1, 0, 2]|select|list }}"
    "{{ ['a', 'B']|map('upper')|list }}{{ messages|map(attribute='role')|list }}",
    "{{ '  a b  '|trim }}|{{ 'hello wORLD-foo(bar'|title }}|{{ 'hELLO'|capitalize }}|{{ 'x'|upper }}{{ 'Y'|lower }}"
    "|{{ 'xxaxx'|trim('x') }}",
    "{{ {'b': 1, 'a': [1, 2.5, none, true, 'é\"\\n<&>']}|tojson }}|{{ {'b': 1, 'a': {}, 'c': [1, {'d': []}]}|tojson(indent=2) }}"
    "|{{ []|tojson(indent=2) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ 'x'|tojson }}|{{ 1.0|tojson }}"
    "|{{ {'a': 1}|tojson(indent='\t') }}|{{ [1, 2]|tojson(separators=(',', ':')) }}",
    "{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(4, true) }}|{{ 'a\n\nb'|indent(2, blank=true) }}|{{ 'x\n'|indent }}",
    "{{ x|default('d') }}{{ ''|default('e', true) }}{{ x|d('f') }}{{ x is defined }}{{ none is none }}{{ 3 is odd }}"
    "{{ 4 is even }}{{ 'a' is string }}{{ {} is mapping }}{{ [1] is iterable }}{{ 1 is number }}{{ true is number }}"
    "{{ 'A' is upper }}{{ 'a' is lower }}{{ x is undefined }}{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}"
    "{{ true is true }}{{ 0 is false }}{{ 'ab' is sequence }}{{ 6 is divisibleby 3 }}{{ 1 is in [1] }}"
    "{{ none is sameas none }}{{ x is not defined }}{{ 2 is eq 2 }}{{ 3 is gt 2 }}",
    "{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a b c'.split(none, 1) }}{{ 'a,b,c'.rsplit(',', 1) }}"
    "{{ 'xx'.startswith('x') }}{{ 'abc'.endswith(('c', 'd')) }}{{ '  q '.strip() }}{{ '..q..'.lstrip('.') }}"
    "{{ 'q \n'.rstrip() }}{{ 'abcabc'.replace('b', 'B', 1) }}{{ 'ab'.upper() }}{{ 'AB'.lower() }}"
    "{{ 'hello wORLD'.title() }}{{ 'hELLO'.capitalize() }}{{ 'abcb'.find('b') }}{{ 'abcb'.rfind('b') }}"
    "{{ 'abcb'.count('b') }}{{ '-'.join(['a', 'b']) }}{{ 'a\nb'.splitlines() }}{{ 'ab'.removeprefix('a') }}",
    "{{ messages[-1].content[:5] }}|{{ messages[1:]|length }}|{{ 'héllo'[1] }}|{{ 'héllo'[::-1] }}|"
    "{{ [1, 2, 3, 4][::2] }}|{{ [1, 2, 3][5:] }}|{{ [1, 2, 3][-2:] }}|{{ [1, 2, 3][:-1] }}|{{ 'héllo'|length }}"
    "|{{ [1, 2, 3][::-1] }}|{{ [1, 2, 3][2:0:-1] }}",
    "{% for x in [] %}a{% else %}empty{% endfor %}{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}"
    "{% endfor %}{% for x in undefined_list %}never{% endfor %}",
    "{% for x in range(6) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}"
    "{% endfor %}{{ range(2, 9, 3)|list }}{{ range(3, 0, -1)|list }}",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', punct='?') }}"
    " {{ greet() }}",
    "{% set x %}  block {{ 1 + 1 }} {% endset %}[{{ x }}]{% filter upper %}shout {{ 'it' }}{% endfilter %}"
    "{% set y | trim %}  t  {% endset %}[{{ y }}]",
    "{{ 'a' ~ 1 ~ none ~ true }}{{ 'ab' * 3 }}{{ 2 * 'c' }}{{ [1] + [2] }}{{ 1 if false }}|{{ 2 if false else 3 }}"
    "{{ not 0 }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 'b' in 'abc' }}{{ 'z' not in ['a'] }}{{ 'k' in {'k': 1} }}"
    "{{ 1 == 1.0 }}{{ [1, 2] == [1, 2] }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ -(3) }}{{ +2 }}{{ 0 or 'x' }}"
    "{{ 1 and 2 }}{{ none or [] }}",
    "{{ '{{' }} {% raw %}{{ raw }} {% if %}{% endraw %} {{ \"it's\" }} {{ ['it\\'s', \"a\\\"b\"] }} "
    "{{ '\\u00e9\\x41\\t|\\101|\\q' }} {{ 'a' 'b' }}",
    "{{ 3|string + 'x' }}{{ '42'|int + 1 }}{{ '3.5'|float }}{{ 'x'|int }}{{ 3.9|int }}{{ '3.9'|int }}{{ 'x'|float }}"
    "{{ [3, 1, 2]|sort }}{{ ['b', 'A', 'c']|sort }}{{ [3, 1]|sort(reverse=true) }}{{ [1, 2, 2]|unique|list }}"
    "{{ [1, 2, 3]|reverse|list }}{{ 'abc'|reverse }}{{ [1, 2]|first }}{{ [1, 2]|last }}{{ 'abc'|list }}"
    "{{ {'a': 1}|items|list }}{{ [1, 2, 3]|sum }}{{ [1, 5, 3]|max }}{{ [4, 2]|min }}{{ -3|abs }}{{ 2.567|round(2) }}"
    "{{ [{'n': 2}, {'n': 1}]|sort(attribute='n') }}{{ {'b': 1, 'a': 2}|dictsort }}{{ '<a&b>'|e }}{{ 'x y z'|wordcount }}"
    "{{ {'a': 1}|length }}{{ []|first is defined }}{{ {'a': {'b': 7}}|attr('a') }}",
    "{{ loop }}{{ undefined_thing }}{{ undefined_thing|length }}{{ undefined_thing|lower }}{{ undefined_thing|list }}"
    "{{ undefined_thing ~ 'x' }}{{ undefined_thing|string }}{{ undefined_thing == undefined_too }}"
    "{{ undefined_thing is iterable }}{{ messages[9] is defined }}{{ messages[0].nope is defined }}",
    "a\r\nb\rc\n",
    "a\n\n",
    "{%+ if true %}  keep{% endif %}\n    {%- if true %}x{% endif %}\n  {{ 'v' }}  {% if true +%}\nkept newline"
    "{% endif %}\n  {%- if true -%}  \n  stripped  {%- endif %}\n{% if true %}\n\n{% endif %}",
    "{{ messages|length }}{{ messages[0]['role'] }}{{ messages[0].role }}{{ messages[0].get('missing', 'dflt') }}"
    "{{ messages[0].get('role') }}{{ messages[0].keys()|list }}{{ messages[0].values()|list }}"
    "{{ messages[0]['items'] is callable }}{{ messages[0].items is callable }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{{ (1,) }}{{ () }}{{ dict(x=1) }}{{ {'a': 1}['a'] }}{{ {'a': 1}.a }}"
    "{{ {'a': 1}.b is defined }}{{ 1, 2 }}{% set t = (1, 'x') %}{{ t[1] }}{{ t }}",
    "{% generation %}gen {{ 1 }}{% endgeneration %}|{{ 'ok' if messages else 'no' }}",
    "{% if messages[0].role == 'user' %}u{% elif messages[0].role == 'system' %}s{% else %}o{% endif %}"
    "{% if false %}{% elif false %}{% else %}e{% endif %}",
    "{{ strftime_now('%Y-%m-%d') }}",
    "{% for a, b in [[1, 2], (3, 4), 'xy'] %}{{ a }}{{ b }}{% endfor %}",
    "{%- set x = 'a' -%}   \n\t {{- x -}} \n {# c -#}  \n  {{ x }}  {#- c #}  z",
    "{{ {'a': [1, {'b': none}], 'é': 'ü'} }}{{ 'x\\ny' }}{{ ['x\\ny', \"'\"] }}",
]


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")  # jinja2 on '\\q', as Python
@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_snippets_match_jinja(index):
    today = datetime.date.today()
    check_same(SNIPPETS[index], [U1, A1, U2], True, **SPECIAL)
    assert datetime.date.today() == today  # strftime_now compared within one day


ERRORS = [
    ("{{ raise_exception('custom failure') }}", "custom failure"),
    ("{{ x.y }}", "'x' is undefined"),
    ("{{ 1 + 'a' }}", "unsupported operand"),
    ("{{ 'a' + 1 }}", "can only concatenate str"),
    ("{{ 1 / 0 }}", "division by zero"),
    ("{{ none|length }}", "has no len()"),
    ("{% for x in 3 %}{% endfor %}", "not iterable"),
    ("{{ 1 < 'a' }}", "not supported between"),
    ("{% set a, b = [1] %}", "values to unpack"),
    ("{% set x = 1 %}{% set x.y = 2 %}", "non-namespace"),
    ("{% set ns = namespace() %}{% set ns._p = 1 %}", "underscore"),
    ("{{ 3|nosuchfilter }}", "no filter named 'nosuchfilter'"),
]


@pytest.mark.parametrize("source,message", ERRORS)
def test_errors_raise_in_both(source, message):
    with pytest.raises(Exception):  # jinja2 raises TemplateError, or Python's TypeError, ZeroDivisionError, ...
        _compile_jinja_template(source).render(messages=[U1])
    with pytest.raises(ValueError, match=message):
        qkv.ChatTemplate(source, "t").render([U1])


@pytest.mark.parametrize("source,where", [
    ("{% if x %}never closed", "t:1:"),
    ("line one\n{{ 1 + }}", "t:2:"),
    ("{% for x in y %}{% endif %}", "t:1:"),
    ("{{ 'unterminated }}", "t:1:"),
    ("{% if %}{% endif %}", "t:1:7"),
    ("{% set x = 1 %}\n  {% endfor %}", "t:2:6"),
    ("{# open comment", "t:1:1"),
    ("{{ (1 }}", "t:1:"),
])
def test_syntax_errors_name_the_template_line_and_column(source, where):
    with pytest.raises(jinja2.exceptions.TemplateSyntaxError):
        _compile_jinja_template(source)
    with pytest.raises(ValueError, match=r"^\[chat_template\] " + where):
        qkv.ChatTemplate(source, "t")


def test_limits_stop_runaway_templates():
    with pytest.raises(RuntimeError, match="max_output_bytes"):
        qkv.ChatTemplate("{{ 'x' * 10**9 }}").render([])
    with pytest.raises(RuntimeError, match="max_steps"):
        qkv.ChatTemplate("{% for i in range(10**7) %}{% for j in range(10**7) %}{% endfor %}{% endfor %}").render([])


def test_render_rejects_values_json_cannot_hold():
    t = qkv.ChatTemplate("{{ messages }}")
    with pytest.raises(TypeError, match=r"messages\[0\]\['content'\] is a set"):
        t.render([{"role": "user", "content": {1}}])
    with pytest.raises(ValueError, match="outside int64"):
        t.render([{"n": 2**70}])


def test_find_chat_template(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "{{ 1 }}"}')
    assert qkv.find_chat_template(tmp_path) == "{{ 1 }}"
    (tmp_path / "tokenizer_config.json").write_text(
        '{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}')
    assert qkv.find_chat_template(str(tmp_path)) == "D"
    (tmp_path / "chat_template.jinja").write_text("J")
    assert qkv.find_chat_template(tmp_path) == "J"
    assert qkv.find_chat_template(smollm2.hf_folder()) == SOURCES["smollm2"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RuntimeError, match="has no chat template"):
        qkv.find_chat_template(empty)
