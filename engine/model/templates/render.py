"""Chat templates rendered as transformers renders them, within a time and size budget.

`LLMEngine.apply_chat_template` calls `render_chat_template`, so the server, the desktop app's
chats and `kvscope chat` all get the bound. A template that goes over it fails that one call
with a `TemplateBudgetError` (a ValueError) naming the budget; one that refuses the messages or
breaks on them fails with a `TemplateRenderError` (also a ValueError). Nothing else is held up:
the render runs in the caller's thread and stops itself.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from jinja2 import Template
from jinja2.exceptions import TemplateError, TemplateSyntaxError

from kvscope.engine.model.templates.budget import (
    Budget,
    TemplateBudgetError,
    TemplateRenderError,
)
from kvscope.engine.model.templates.env import BoundedEnvironment

__all__ = [
    "Budget",
    "TemplateBudgetError",
    "TemplateRenderError",
    "pick_template",
    "render_chat_template",
]

MAX_TEMPLATE_CHARS = 1 << 20  # real templates are a few KB; the largest known ~50 KB
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")  # transformers' aliases

_environment = BoundedEnvironment()


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> Template:
    return _environment.from_string(source)


def pick_template(chat_template: str | Mapping[str, object], with_tools: bool = False) -> str:
    """The template transformers would use: the one, or a dict's "tool_use" when tools are
    given and it has one, else its "default"."""
    if isinstance(chat_template, Mapping):
        if with_tools and "tool_use" in chat_template:
            chat_template = {"default": chat_template["tool_use"]}
        if "default" not in chat_template:
            raise TemplateRenderError(
                "this model has several chat templates and none is named 'default' "
                f"(it has {sorted(chat_template)})"
            )
        template = chat_template["default"]
    else:
        template = chat_template
    if not isinstance(template, str):
        raise TemplateRenderError(f"the chat template is a {type(template).__name__}")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateBudgetError(
            f"the chat template is {len(template):,} characters, over the limit of "
            f"{MAX_TEMPLATE_CHARS:,}"
        )
    return template


def _template_messages(messages: Sequence[Mapping[str, object]]) -> list[dict[str, object]]:
    """The messages as transformers hands them to the template: None values dropped, plain
    copies, reasoning aliased under the names templates read."""
    out = []
    for given in messages:
        message = {k: v for k, v in given.items() if v is not None}
        reasoning = next((message[k] for k in _REASONING_FIELDS if k in message), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render_chat_template(
    chat_template: str | Mapping[str, object],
    messages: Sequence[Mapping[str, object]],
    special_tokens: Mapping[str, object],
    budget: Budget,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, object]] | None = None,
    template_kwargs: Mapping[str, object] | None = None,
) -> str:
    """The rendered prompt, or a TemplateBudgetError / TemplateRenderError (both ValueError).
    `tools`: OpenAI's tool list, as transformers passes it; `template_kwargs`: more variables
    (a request's chat_template_kwargs, e.g. enable_thinking), which never replace these."""
    source = pick_template(chat_template, with_tools=bool(tools))
    variables = {
        **dict(template_kwargs or {}),
        **dict(special_tokens),
        "messages": _template_messages(messages),
        "tools": [dict(t) for t in tools] if tools else None,
        "documents": None,
        "add_generation_prompt": add_generation_prompt,
    }
    pieces: list[str] = []
    chars = 0
    with budget:
        try:
            template = _compile(source)
            for piece in template.generate(**variables):
                chars += len(piece)
                budget.check_chars(chars, "the rendered prompt")
                pieces.append(piece)
        except TemplateBudgetError:
            raise
        except (RecursionError, MemoryError) as e:
            # What the size checks cannot foresee (a macro calling itself): the same failure.
            raise budget.tripped or budget.fail(
                f"the chat template went over its budget: {type(e).__name__} ({e})"
            ) from None
        except TemplateSyntaxError as e:
            raise budget.tripped or TemplateRenderError(
                f"the model's chat template does not parse: {e}"
            ) from None
        except TemplateError as e:  # the model's own rules, e.g. "roles must alternate"
            raise budget.tripped or TemplateRenderError(
                f"the model's chat template refused these messages: {e}"
            ) from None
        except Exception as e:  # a template is data: its failure is this request's
            raise budget.tripped or TemplateRenderError(
                f"the model's chat template failed on these messages: {type(e).__name__}: {e}"
            ) from None
    if budget.tripped is not None:  # the template swallowed the error and went on
        raise budget.tripped
    return "".join(pieces)
