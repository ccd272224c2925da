"""What each growing operation of a chat template may build, checked before it is built.

One check per filter, string method or operator whose result can be far larger than its
inputs (a width, a repeat count, a separator or replacement used once per item): the size it
would reach is estimated from its arguments and refused over the budget, so `'x' * 3e9` or
`s|indent(10**9)` never allocate. Everything else is bounded by its inputs and is checked
after it runs (`Budget.check_value`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from string import Formatter
from typing import Any

from kvscope.engine.model.templates.budget import MAX_INT_BITS, Budget, text_size

# A check's arguments: the budget, the filter's value or the method's object, then the call's
# other arguments (a list the check may replace items of) and keyword arguments, as jinja2 passes
# them (typed Any there: a template's values can be anything). A filter's check may return the
# items it materialized, to pass on instead of the value.
Check = Callable[[Budget, Any, list[Any], dict[str, Any]], list[object] | None]


def _arg(
    args: list[Any], kwargs: dict[str, Any], index: int, name: str, default: object = None
) -> object:
    if index < len(args):
        return args[index]
    return kwargs.get(name, default)


def _length(value: object) -> int:
    return len(value) if isinstance(value, (str, list, tuple, dict)) else len(str(value))


def bounded_list(budget: Budget, items: Iterable[object], what: str) -> list[object]:
    """An iterable as a list, refused as soon as it has more items than the budget."""
    if isinstance(items, (list, tuple, str, dict)):
        budget.check_chars(len(items), what)
        return list(items)
    out: list[object] = []
    for item in items:
        out.append(item)
        if len(out) > budget.chars:
            budget.check_chars(len(out), what)
    return out


def check_width(  # center, ljust...
    budget: Budget, value: object, args: list[Any], kwargs: dict[str, Any]
) -> None:
    budget.check_width(_arg(args, kwargs, 0, "width", 0), "a padded string")


def check_indent(budget: Budget, value: object, args: list[Any], kwargs: dict[str, Any]) -> None:
    width = _arg(args, kwargs, 0, "width", 4)
    per_line = len(width) if isinstance(width, str) else width
    if isinstance(per_line, int):
        lines = str(value).count("\n") + 1
        budget.check_chars(_length(value) + lines * max(per_line, 0), "an indented string")


def check_replace(budget: Budget, value: object, args: list[Any], kwargs: dict[str, Any]) -> None:
    old = str(_arg(args, kwargs, 0, "old", ""))
    new = str(_arg(args, kwargs, 1, "new", ""))
    count = _arg(args, kwargs, 2, "count", None)
    text = _length(value)
    times = text // max(len(old), 1) + 1
    if isinstance(count, int) and count >= 0:
        times = min(times, count)
    budget.check_chars(text + times * len(new), "a replaced string")


def check_join(
    budget: Budget, value: Iterable[object], args: list[Any], kwargs: dict[str, Any]
) -> list[object]:
    """Materializes the items (bounded) so they can be measured; returns them to join."""
    items = bounded_list(budget, value, "a joined list")
    sep = str(_arg(args, kwargs, 0, "d", ""))
    budget.check_text(items, "a joined string", len(sep) * max(len(items) - 1, 0))
    return items


def check_str_join(  # 'sep'.join(items)
    budget: Budget, sep: str, args: list[Any], kwargs: dict[str, Any]
) -> None:
    if args:
        items = bounded_list(budget, args[0], "a joined list")
        budget.check_text(items, "a joined string", len(sep) * max(len(items) - 1, 0))
        args[0] = items


def check_wordwrap(budget: Budget, value: object, args: list[Any], kwargs: dict[str, Any]) -> None:
    wrap = _arg(args, kwargs, 2, "wrapstring", None)
    text = _length(value)
    budget.check_chars(text + text * len(str(wrap or "\n")), "a wrapped string")


def check_percent(budget: Budget, fmt: object, values: object) -> None:
    """'fmt' % values: widths in the format, '*' widths taken from the values, each value's
    text (a mapping's entries can be named many times)."""
    fmt = str(fmt)
    budget.check_spec_numbers(fmt, "a %-format")
    values = values if isinstance(values, tuple) else (values,)
    for v in values:
        budget.check_width(v, "a %-format's '*' width")
    fields = max(fmt.count("%"), 1)
    biggest = max((text_size(v, budget.chars + 1) for v in values), default=0)
    budget.check_chars(len(fmt) + fields * biggest, "a %-formatted string")


def check_format_filter(
    budget: Budget, value: object, args: list[Any], kwargs: dict[str, Any]
) -> None:
    check_percent(budget, value, tuple(args) if args else dict(kwargs))


def check_str_format(budget: Budget, fmt: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    """'fmt'.format(...) / format_map(...): widths in the specs, nested widths from the
    arguments, and each field's text once per time it is named."""
    values = list(args) + list(kwargs.values())
    if len(values) == 1 and isinstance(values[0], dict):  # format_map(mapping)
        values = list(values[0].values())
    fields = 0
    for _literal, name, spec, _conv in Formatter().parse(fmt):
        if name is None:
            continue
        fields += 1
        budget.check_spec_numbers(spec or "", "a format string")
        if spec and "{" in spec:
            for v in values:
                budget.check_width(v, "a format string's nested width")
    biggest = max((text_size(v, budget.chars + 1) for v in values), default=0)
    budget.check_chars(len(fmt) + fields * biggest, "a formatted string")


def check_tojson(budget: Budget, value: object, args: list[Any], kwargs: dict[str, Any]) -> None:
    indent = _arg(args, kwargs, 1, "indent", None)
    separators = _arg(args, kwargs, 2, "separators", None)
    per_item = 2
    if isinstance(indent, int) and not isinstance(indent, bool):
        budget.check_width(indent, "a JSON indent")
        per_item += 1 + indent * _depth(value)
    elif isinstance(indent, str):
        per_item += 1 + len(indent) * _depth(value)
    if isinstance(separators, (list, tuple)):
        per_item += sum(len(str(s)) for s in separators)
    items = _count_items(value, budget.chars + 1)
    budget.check_text([value], "a JSON text", items * per_item)


def _depth(value: object, limit: int = 64) -> int:
    depth, level = 0, [value]
    while level and depth < limit:
        nxt: list[object] = []
        for v in level:
            if isinstance(v, dict):
                nxt.extend(v.values())
            elif isinstance(v, (list, tuple)):
                nxt.extend(v)
        if not nxt:
            break
        depth, level = depth + 1, nxt
    return depth + 1


def _count_items(value: object, limit: int) -> int:
    count, stack = 0, [value]
    while stack and count < limit:
        v = stack.pop()
        count += 1
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return count


def check_list(
    budget: Budget, value: Iterable[object], args: list[Any], kwargs: dict[str, Any]
) -> list[object]:
    return bounded_list(budget, value, "a list")


def check_sum(
    budget: Budget, value: Iterable[object], args: list[Any], kwargs: dict[str, Any]
) -> list[object]:
    items = bounded_list(budget, value, "a summed list")
    sized = [len(v) for v in items if isinstance(v, (str, list, tuple))]
    budget.check_chars(sum(sized), "a sum of lists")
    return items


def check_batch(budget: Budget, value: object, args: list[Any], kwargs: dict[str, Any]) -> None:
    if _arg(args, kwargs, 1, "fill_with", None) is not None:  # pads the last batch to size
        budget.check_width(_arg(args, kwargs, 0, "linecount", 0), "a batch's padding")


def check_expandtabs(budget: Budget, value: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    size = _arg(args, kwargs, 0, "tabsize", 8)
    if isinstance(size, int):
        budget.check_chars(len(value) + str(value).count("\t") * max(size, 0), "expanded tabs")


def check_translate(budget: Budget, value: str, args: list[Any], kwargs: dict[str, Any]) -> None:
    table = args[0] if args else None
    if isinstance(table, dict):
        longest = max((_length(v) for v in table.values() if v is not None), default=1)
        budget.check_chars(len(value) * max(longest, 1), "a translated string")


def check_to_bytes(budget: Budget, value: int, args: list[Any], kwargs: dict[str, Any]) -> None:
    budget.check_width(_arg(args, kwargs, 0, "length", 1), "int.to_bytes")


def check_lipsum(budget: Budget, n: object, args: list[Any], kwargs: dict[str, Any]) -> None:
    words = _arg(args, kwargs, 2, "max", 100)
    if isinstance(n, int) and isinstance(words, int):
        budget.check_chars(n * max(words, 0) * 12, "lorem ipsum")


def check_strftime(budget: Budget, fmt: object, args: list[Any], kwargs: dict[str, Any]) -> None:
    fmt = str(fmt)
    budget.check_spec_numbers(fmt, "a date format")
    budget.check_chars(len(fmt) + 64 * fmt.count("%"), "a date string")


# Filters by name: their value is the first argument after jinja's context/environment.
FILTER_CHECKS: dict[str, Check] = {
    "center": check_width,
    "indent": check_indent,
    "replace": check_replace,
    "join": check_join,
    "wordwrap": check_wordwrap,
    "format": check_format_filter,
    "tojson": check_tojson,
    "list": check_list,
    "sum": check_sum,
    "batch": check_batch,
}

# Methods of built-in values by (type, name): the value is the method's own object.
METHOD_CHECKS: dict[tuple[type, str], Check] = {
    (str, "center"): check_width,
    (str, "ljust"): check_width,
    (str, "rjust"): check_width,
    (str, "zfill"): check_width,
    (str, "replace"): check_replace,
    (str, "join"): check_str_join,
    (str, "expandtabs"): check_expandtabs,
    (str, "translate"): check_translate,
    (int, "to_bytes"): check_to_bytes,
}


def check_binop(budget: Budget, op: str, left: object, right: object) -> None:
    """`+`, `*`, `%`, `**` before they run: sequence lengths, repeats and integer sizes."""
    sized = (str, list, tuple)
    if op == "+" and isinstance(left, sized) and isinstance(right, sized):
        budget.check_chars(len(left) + len(right), "a '+' result")
    elif op == "*":
        seq, times = (left, right) if isinstance(left, sized) else (right, left)
        if isinstance(seq, sized) and isinstance(times, int):
            budget.check_chars(len(seq) * max(times, 0), "a repeated sequence")
        elif isinstance(left, int) and isinstance(right, int):
            _check_bits(budget, left.bit_length() + right.bit_length(), "a product")
    elif op == "%" and isinstance(left, str):
        check_percent(budget, left, right)
    elif op == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
        _check_bits(budget, left.bit_length() * max(right, 0), "a power")


def _check_bits(budget: Budget, bits: int, what: str) -> None:
    if bits > MAX_INT_BITS:
        raise budget.fail(
            f"the chat template went over its memory budget: {what} would be an integer of "
            f"~{bits:,} bits, over the limit of {MAX_INT_BITS:,}"
        )
