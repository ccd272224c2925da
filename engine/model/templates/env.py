"""The jinja2 environment chat templates render in: transformers' own, with a budget.

It mirrors `transformers.utils.chat_template_utils._cached_compile_jinja_template` (an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loop controls and the
`generation` tag; `raise_exception`, `strftime_now`, `tojson`, its `dict` and `namespace`),
so an ordinary template renders byte-identical text
(tests/engine/model/templates/test_template_bounds.py compares),
and adds the hooks that bound the work (engine/model/templates/budget.py):

- operators `+ * % **` are intercepted (the sandbox's `call_binop`) and checked first;
- `~` and output buffers (macros, `{% set %}` blocks, filter blocks) are routed through the
  environment by a code generator subclass, since jinja2 compiles them to plain joins;
- every filter and every call is checked: before for those whose size can be foreseen
  (template_checks), after for all;
- `finalize` measures a value before `{{ }}` turns it into text.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, NoReturn

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg, generate_lorem_ipsum

from kvscope.engine.model.templates.budget import current
from kvscope.engine.model.templates.checks import (
    FILTER_CHECKS,
    METHOD_CHECKS,
    check_binop,
    check_lipsum,
    check_str_format,
    check_strftime,
)

if TYPE_CHECKING:
    from jinja2.parser import Parser
    from jinja2.runtime import Context


class BoundedBuffer(list[object]):
    """A macro's or block's output, refused once it holds more characters than the budget."""

    __slots__ = ("chars",)

    def __init__(self) -> None:
        super().__init__()
        self.chars = 0

    def append(self, item: object) -> None:
        self._count((item,))
        super().append(item)

    def extend(self, items: Iterable[object]) -> None:
        items = tuple(items)
        self._count(items)
        super().extend(items)

    def _count(self, items: Iterable[object]) -> None:
        self.chars += sum(len(i) for i in items if isinstance(i, str))
        budget = current()
        if budget is not None:
            budget.check_chars(self.chars, "a block's or macro's output")


class BoundedCodeGenerator(CodeGenerator):
    """jinja2's compiler, with output buffers and `~` going through the environment."""

    def buffer(self, frame: Frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.output_buffer()")

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        if frame.eval_ctx.volatile:
            func_name = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            func_name = "markup_join"
        else:
            func_name = "str_join"
        self.write(f"{func_name}(environment.concat_parts((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(")))")


class GenerationTag(jinja2.ext.Extension):
    """transformers' `{% generation %}` (AssistantTracker): outside assistant-mask tracking,
    which KVScope never asks for, it renders its body as is."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_generation_support")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _generation_support(self, caller: Callable[[], str]) -> str:
        return caller()


class TemplateNamespace(jinja2.utils.Namespace):
    """transformers' namespace: no underscore-prefixed attributes (CPython internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's Namespace trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                "Chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"but got {name!r}. Please rename the attribute."
            )


class TemplateDict:
    """transformers' `dict`: a callable without dict's class attributes."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[object, object]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[object, object]:
        return dict.fromkeys(*args, **kwargs)


def raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def tojson(
    x: object,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' override: no HTML escaping, and json.dumps' options.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def strftime_now(format: str) -> str:  # noqa: A002 - the name templates call it with
    budget = current()
    if budget is not None:
        check_strftime(budget, format, [], {})
    return datetime.now().strftime(format)


def lipsum(  # noqa: A002 - jinja's own parameter names
    n: int = 5, html: bool = True, min: int = 20, max: int = 100
) -> str:
    budget = current()
    if budget is not None:
        check_lipsum(budget, n, [html, min, max], {})
    return generate_lorem_ipsum(n, html, min, max)


def _bounded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., object]:
    """`fn` with its pre-check (if any) and a check of what it returns."""
    pass_arg = _PassArg.from_obj(fn)
    skip = 0 if pass_arg is None else 1  # jinja passes a context or environment first
    pre = FILTER_CHECKS.get(name)
    what = f"the {name!r} filter's result"

    @functools.wraps(fn)
    def bounded(*args: Any, **kwargs: Any) -> object:
        budget = current()
        if budget is None or len(args) <= skip:
            return fn(*args, **kwargs)
        if pre is not None:
            rest = list(args[skip + 1 :])
            replaced = pre(budget, args[skip], rest, kwargs)
            value = args[skip] if replaced is None else replaced
            args = (*args[:skip], value, *rest)
        return budget.check_value(fn(*args, **kwargs), what)

    return bounded


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' chat-template environment, every growing operation under the budget."""

    code_generator_class = BoundedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "%", "**"})

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[GenerationTag, jinja2.ext.loopcontrols],
            finalize=self._measure_output,
        )
        self.filters["tojson"] = tojson
        self.filters = {name: _bounded_filter(name, fn) for name, fn in self.filters.items()}
        self.globals["raise_exception"] = raise_exception
        self.globals["strftime_now"] = strftime_now
        self.globals["dict"] = TemplateDict()
        self.globals["namespace"] = TemplateNamespace
        self.globals["lipsum"] = lipsum

    # ---- hooks the compiled templates call -----------------------------------------------
    @staticmethod
    def output_buffer() -> BoundedBuffer:
        return BoundedBuffer()

    @staticmethod
    def concat_parts(parts: tuple[object, ...]) -> tuple[object, ...]:
        budget = current()
        if budget is not None:
            budget.check_text(parts, "a '~' result")
        return parts

    @staticmethod
    def _measure_output(value: object) -> object:
        budget = current()
        if budget is not None and not isinstance(value, str):
            budget.check_text([value], "a value written by {{ }}")
        return value

    def call_binop(self, context: Context, operator: str, left: object, right: object) -> object:
        budget = current()
        if budget is None:
            return super().call_binop(context, operator, left, right)
        check_binop(budget, operator, left, right)
        return budget.check_value(
            super().call_binop(context, operator, left, right), f"a {operator!r} result"
        )

    def call(  # noqa: N805 - the sandbox's names
        __self, __context: Context, __obj: object, *args: Any, **kwargs: Any
    ) -> object:
        budget = current()
        if budget is None:
            return super().call(__context, __obj, *args, **kwargs)
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        wrapped = getattr(getattr(__obj, "__wrapped__", None), "__self__", None)
        if isinstance(wrapped, str) and name in ("format", "format_map"):
            check_str_format(budget, wrapped, list(args), kwargs)
        elif isinstance(owner, (str, int)):  # str subclasses (Markup) grow as str does
            check = METHOD_CHECKS.get((str if isinstance(owner, str) else int, name))
            if check is not None:
                rest = list(args)
                check(budget, owner, rest, kwargs)
                args = tuple(rest)
        result = super().call(__context, __obj, *args, **kwargs)
        return budget.check_value(result, f"a call of {name or type(__obj).__name__}")
