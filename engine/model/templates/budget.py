"""The time and size budget of one chat-template render, and how it is enforced.

A model file's chat template is untrusted code: a GGUF can carry one that loops for hours
(nested `range(100000)`) or builds `'x' * 3000000000`. jinja2's sandbox stops attribute
escapes, not work. The budget stops work:

- time: a trace function in the rendering thread (sys.settrace is per thread) checks the clock
  on the template's own lines, so even a loop with no output and no sandbox call is stopped;
- size: every value that can grow (a `+`, `*`, `%` or `~`, a filter, a method call, an output
  buffer) is checked against a character budget *before* it is built where the size can be
  foreseen, and after otherwise, so no intermediate grows past a few times the budget.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING

from jinja2.utils import Namespace

if TYPE_CHECKING:
    from _typeshed import TraceFunction

DEFAULT_SECONDS = 2.0
DEFAULT_CHARS = 1_000_000
MAX_INT_BITS = 1 << 16  # a template has no use for integers of more than ~20,000 digits
_TIME_CHECK_EVERY = 64  # trace events between clock reads: cheap, and a fraction of a ms apart
_TEMPLATE_FILE = "<template>"  # jinja2 compiles templates from strings under this file name
_DIGITS = re.compile(r"\d+")


class TemplateBudgetError(ValueError):
    """A chat template went over its time or size budget; the message names which and the
    limit. A ValueError: the request fails, the caller (and the server) go on."""


class TemplateRenderError(ValueError):
    """A chat template could not be rendered for these messages (it refused them, or failed)."""


@dataclass
class Budget:
    """One render's limits and what it has spent; `current()` is the active one of a thread."""

    seconds: float = DEFAULT_SECONDS
    chars: int = DEFAULT_CHARS
    deadline: float = field(default=0.0, init=False)
    tripped: TemplateBudgetError | None = field(default=None, init=False)
    _events: int = field(default=0, init=False)

    # ---- checks --------------------------------------------------------------------------
    def fail(self, message: str) -> TemplateBudgetError:
        """The error to raise, remembered: if template code swallowed it, render re-raises."""
        error = TemplateBudgetError(message)
        self.tripped = self.tripped or error
        return error

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise self.fail(
                f"the chat template ran over its time budget of {self.seconds:g} s "
                "(does it loop without end?)"
            )

    def check_chars(self, chars: int, what: str) -> None:
        if chars > self.chars:
            raise self.fail(
                f"the chat template went over its memory budget: {what} would be {chars:,} "
                f"characters or items, over the limit of {self.chars:,}"
            )

    def check_value(self, value: object, what: str) -> object:
        """A value just built (a filter's or call's result): within the budget, or the error."""
        if isinstance(value, (str, list, tuple, dict, set, frozenset)):
            self.check_chars(len(value), what)
        elif isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise self.fail(
                f"the chat template went over its memory budget: {what} is an integer of "
                f"{value.bit_length():,} bits, over the limit of {MAX_INT_BITS:,}"
            )
        return value

    def check_text(self, values: Iterable[object], what: str, extra: int = 0) -> None:
        """Before converting values to text (str(), a join, JSON): their estimated size."""
        total = extra
        for value in values:
            total += text_size(value, self.chars - total + 1)
            if total > self.chars:
                break
        self.check_chars(total, what)

    def check_width(self, width: object, what: str) -> None:
        """A width, count or repeat argument: a number over the budget is refused unbuilt."""
        if isinstance(width, int) and not isinstance(width, bool):
            self.check_chars(width, what)

    def check_spec_numbers(self, spec: str, what: str) -> None:
        """Widths and precisions written in a format string ('%3000000000d', '{:>9999999}')."""
        for digits in _DIGITS.findall(spec):
            if len(digits) > 18 or int(digits) > self.chars:
                raise self.fail(
                    f"the chat template went over its memory budget: {what} asks for a width "
                    f"of {digits[:40]}, over the limit of {self.chars:,}"
                )

    # ---- the trace -----------------------------------------------------------------------
    def _trace_call(self, frame: FrameType, event: str, arg: object) -> TraceFunction | None:
        self._events += 1
        if self._events % _TIME_CHECK_EVERY == 0:
            self.check_time()
        if frame.f_code.co_filename == _TEMPLATE_FILE:
            return self._trace_line
        return None

    def _trace_line(self, frame: FrameType, event: str, arg: object) -> TraceFunction:
        self._events += 1
        if self._events % _TIME_CHECK_EVERY == 0:
            self.check_time()
        return self._trace_line

    def __enter__(self) -> Budget:
        self.deadline = time.monotonic() + self.seconds
        self._previous_trace = sys.gettrace()
        _active.budget = self
        sys.settrace(self._trace_call)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(self._previous_trace)  # a debugger's or coverage's tracer comes back
        _active.budget = None


_active = threading.local()


def current() -> Budget | None:
    """The budget of the render running in this thread (None outside a render)."""
    return getattr(_active, "budget", None)


def text_size(value: object, limit: int) -> int:
    """An estimate of how many characters str()/JSON of `value` takes: its strings' lengths
    plus a few per item, walked iteratively; stops counting once over `limit`."""
    total = 0
    stack = [value]
    seen: set[int] = set()
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
            continue
        if isinstance(item, Namespace):  # its repr shows its attributes
            item = object.__getattribute__(item, "_Namespace__attrs")
        if isinstance(item, (list, tuple, set, frozenset, dict)):
            if id(item) in seen:  # repr writes a cycle as [...]
                continue
            seen.add(id(item))
            total += 2 + 2 * len(item)
            if isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            else:
                stack.extend(item)
            continue
        if isinstance(item, int) and not isinstance(item, bool):
            total += 2 + item.bit_length() // 3  # decimal digits, roughly
            continue
        total += 8  # None, bools, floats, Undefined: a few characters each
    return total
