"""Chat templates render as transformers renders them, within a time and size budget
(issue 27, item 3): ordinary templates byte-identical to transformers' apply_chat_template,
hostile ones stopped with the budget's error before they hang or balloon."""

from __future__ import annotations

import time

import pytest
from template_bombs import CONCAT_LOOP, NESTED_LOOP, peak_rss_during

from kvscope.engine.model.templates.fallbacks import CHATML_TEMPLATE, GEMMA_TEMPLATE
from kvscope.engine.model.templates.render import (
    Budget,
    TemplateBudgetError,
    TemplateRenderError,
    render_chat_template,
)

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  What is 2+2?  "},
        {"role": "assistant", "content": "4", "reasoning_content": "add them"},
        {"role": "user", "content": "Ünïcödé, émoji 🙂, tabs\tand\nnew lines, {{ not a tag }}"},
    ],
    [{"role": "system", "content": "only a system message"}],
    [{"role": "user", "content": ""}, {"role": "assistant", "content": "ok"}],
]

# Llama 3's shape with what transformers' environment adds (raise_exception, strftime_now,
# tojson, dict, namespace, loop controls, {% generation %}) and the filters and operators the
# budget intercepts, so each of them is held to transformers' output.
LLAMA3_STYLE = """{{- bos_token }}
{%- set date_string = strftime_now("%Y") %}
{%- set ns = namespace(system='', seen=0) %}
{%- if messages[0]['role'] == 'system' %}
    {%- set ns.system = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- endif %}
{%- macro header(role) -%}
<|start_header_id|>{{ role }}<|end_header_id|>{{ '\n\n' }}
{%- endmacro %}
{{- header('system') }}
{{- 'Year: ' ~ date_string ~ '\n' }}
{{- ns.system }}
{%- set meta %}{{ dict(n=messages|length, kind='chat') | tojson }}{% endset %}
{{- '\n' + meta | indent(2) + '%s|%d' % ('x', 3) + '{:>4}'.format('r') }}
{{- ('-' * 3) | center(7) ~ (['a', 'b'] | join(', ')) | replace('a', 'A') }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message['role'] not in ['user', 'assistant'] %}
        {{- raise_exception('Unknown role: ' + message['role']) }}
    {%- endif %}
    {%- if message['content'] == 'skip me' %}{% continue %}{% endif %}
    {%- if ns.seen > 20 %}{% break %}{% endif %}
    {%- set ns.seen = ns.seen + 1 %}
    {{- header(message['role']) }}
    {%- if message['role'] == 'assistant' %}
        {%- generation %}{{- message['content'] | trim }}{% endgeneration %}
    {%- else %}
        {{- message['content'] | trim | wordwrap(30) }}
    {%- endif %}
    {%- if message.reasoning_content is defined %}[{{ message.reasoning_content }}]{% endif %}
    {{- '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- header('assistant') }}{%- endif %}
"""


def _transformers(tokenizer, template: str, messages: list[dict]) -> str:
    return tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=True
    )


def _ours(tokenizer, template: str, messages: list[dict]) -> str:
    return render_chat_template(template, messages, tokenizer.special_tokens_map, Budget())


@pytest.fixture(scope="module")
def tokenizer(default_model_lazy):
    return default_model_lazy.tokenizer


@pytest.mark.parametrize("name", ["bundled", "gemma", "chatml", "llama3-style"])
def test_ordinary_templates_render_byte_identical_to_transformers(tokenizer, name):
    template = {
        "bundled": tokenizer.chat_template,  # the GGUF's own, as the engine's tokenizer has it
        "gemma": GEMMA_TEMPLATE,
        "chatml": CHATML_TEMPLATE,
        "llama3-style": LLAMA3_STYLE,
    }[name]
    for messages in CONVERSATIONS:
        if name == "gemma" and messages[-1]["role"] == "assistant":
            continue  # Gemma's template refuses a conversation ending on the assistant
        expected = _transformers(tokenizer, template, messages)
        assert _ours(tokenizer, template, messages) == expected
    skipped = [{"role": "user", "content": "skip me"}, {"role": "user", "content": "kept"}]
    assert _ours(tokenizer, LLAMA3_STYLE, skipped) == _transformers(
        tokenizer, LLAMA3_STYLE, skipped
    )


def test_a_template_that_refuses_fails_as_transformers_does(tokenizer):
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(Exception, match="must alternate") as theirs:
        _transformers(tokenizer, GEMMA_TEMPLATE, messages)
    with pytest.raises(TemplateRenderError, match="must alternate"):
        _ours(tokenizer, GEMMA_TEMPLATE, messages)
    assert "TemplateError" in type(theirs.value).__name__
    with pytest.raises(TemplateRenderError, match="Unknown role: tool"):
        _ours(tokenizer, LLAMA3_STYLE, [{"role": "tool", "content": "x"}])


# Each would hang, or allocate gigabytes, under transformers' renderer.
HOSTILE = {
    "repeat": "{{ 'x' * 3000000000 }}",
    "concat loop": CONCAT_LOOP,
    "plus loop": "{% set ns = namespace(s='x') %}"
    "{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "list repeat": "{{ ([1] * 100000) * 100000 }}",
    "output loop": "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxx"
    "{% endfor %}{% endfor %}",
    "macro buffer": "{% macro m() %}{% for i in range(100000) %}{% for j in range(100000) %}"
    "xxxxxxxx{% endfor %}{% endfor %}{% endmacro %}{{ m() }}",
    "set block": "{% set b %}{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxx"
    "{% endfor %}{% endfor %}{% endset %}",
    "indent": "{{ 'a\nb' | indent(3000000000) }}",
    "center": "{{ 'a'.center(3000000000) }}",
    "ljust": "{{ 'a'.ljust(3000000000) }}",
    "format width": "{{ '{:>3000000000}'.format('a') }}",
    "format nested width": "{{ '{:>{}}'.format('a', 3000000000) }}",
    "percent width": "{{ '%3000000000d' % 1 }}",
    "format filter": "{{ '%*d' | format(3000000000, 1) }}",
    "power": "{{ 10 ** (10 ** 10) }}",
    "join": "{{ (['x' * 900000] * 1000) | join }}",
    "str join": "{{ ''.join(['x' * 900000] * 1000) }}",
    "tojson": "{{ (['x' * 900000] * 1000) | tojson }}",
    "printed list": "{{ ['x' * 900000] * 1000 }}",
    "replace": "{{ ('x' * 1000) | replace('', 'y' * 10000) }}",
    "wordwrap": "{{ ('x ' * 100000) | wordwrap(1, wrapstring='y' * 1000) }}",
    "batch fill": "{{ [1] | batch(3000000000, 0) | list }}",
    "lipsum": "{{ lipsum(100000000) }}",
    "to_bytes": "{{ (1).to_bytes(3000000000, 'big') }}",
    "recursion": "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_growing_template_fails_with_the_memory_budget(name):
    start = time.monotonic()
    with pytest.raises(TemplateBudgetError, match="budget") as caught:
        render_chat_template(HOSTILE[name], [{"role": "user", "content": "x"}], {}, Budget())
    assert time.monotonic() - start < 30  # a hang detector, not a speed test
    if name != "recursion":
        assert "1,000,000" in str(caught.value) or "65,536" in str(caught.value)


def test_a_looping_template_fails_with_the_time_budget():
    start = time.monotonic()
    with pytest.raises(TemplateBudgetError, match="time budget of 0.5 s"):
        render_chat_template(NESTED_LOOP, [], {}, Budget(seconds=0.5))
    assert time.monotonic() - start < 30  # unbounded, it would run for hours


@pytest.fixture()
def hostile_engine(default_llm):
    """The session's engine with its tokenizer's template swapped for a test's (restored)."""
    engine = default_llm.engine
    original = engine.tokenizer.chat_template
    yield engine
    engine.tokenizer.chat_template = original


@pytest.mark.parametrize("template", ["{{ 'x' * 3000000000 }}", CONCAT_LOOP])
def test_the_engine_refuses_a_ballooning_template_without_the_memory(hostile_engine, template):
    hostile_engine.tokenizer.chat_template = template
    messages = [{"role": "user", "content": "hi"}]

    def render():
        with pytest.raises(TemplateBudgetError, match="memory budget"):
            hostile_engine.apply_chat_template(messages)

    assert peak_rss_during(render) < 100 << 20
    # The engine goes on: the next template renders.
    hostile_engine.tokenizer.chat_template = CHATML_TEMPLATE
    assert hostile_engine.apply_chat_template(messages).endswith("<|im_start|>assistant\n")


def test_the_engine_stops_a_looping_template_and_goes_on(hostile_engine):
    hostile_engine.tokenizer.chat_template = NESTED_LOOP
    start = time.monotonic()
    with pytest.raises(TemplateBudgetError, match="time budget of 2 s"):
        hostile_engine.apply_chat_template([{"role": "user", "content": "hi"}])
    assert time.monotonic() - start < 30
    hostile_engine.tokenizer.chat_template = CHATML_TEMPLATE
    assert "<|im_start|>user\nhi" in hostile_engine.apply_chat_template(
        [{"role": "user", "content": "hi"}]
    )


def test_the_budget_grows_with_what_could_fit(default_llm):
    """A legitimate long conversation is not cut by the budget: it is sized from the context
    (max_model_len x the longest token), never below 1M characters."""
    engine = default_llm.engine
    long_text = "y" * (engine.max_prompt_chars - 100)
    prompt = engine.apply_chat_template([{"role": "user", "content": long_text}])
    assert long_text in prompt
