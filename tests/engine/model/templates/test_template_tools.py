"""Tools and extra variables reach a chat template as transformers hands them over, and a
template dict's "tool_use" entry is the one picked when tools are given."""

import tokenizers
import transformers

from kvscope.engine.model.templates.render import Budget, pick_template, render_chat_template

TEMPLATE = (
    "{% if tools %}TOOLS={{ tools | map(attribute='function.name') | join(',') }}\n{% endif %}"
    "{% if enable_thinking is defined and not enable_thinking %}NO_THINK\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
)
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
MESSAGES = [{"role": "user", "content": "Weather?"}]


def _render(**kwargs):
    return render_chat_template(TEMPLATE, MESSAGES, {}, Budget(seconds=2, chars=10**6), **kwargs)


def test_tools_and_template_kwargs_reach_the_template():
    assert _render() == "user: Weather?\n"
    assert _render(tools=[TOOL]).startswith("TOOLS=get_weather\n")
    assert "NO_THINK" in _render(template_kwargs={"enable_thinking": False})


def test_the_same_text_as_transformers_renders():
    # transformers' own apply_chat_template over the same template, tools and kwargs.
    vocab = tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(vocab))
    theirs = tokenizer.apply_chat_template(
        MESSAGES, tools=[TOOL], chat_template=TEMPLATE, tokenize=False, enable_thinking=False
    )
    assert _render(tools=[TOOL], template_kwargs={"enable_thinking": False}) == theirs


def test_kwargs_never_replace_the_messages():
    out = _render(template_kwargs={"messages": [{"role": "x", "content": "injected"}]})
    assert out == "user: Weather?\n"


def test_a_tool_use_template_is_picked_with_tools():
    both = {"default": "plain", "tool_use": "with tools"}
    assert pick_template(both) == "plain"
    assert pick_template(both, with_tools=True) == "with tools"
    assert pick_template({"default": "plain"}, with_tools=True) == "plain"
