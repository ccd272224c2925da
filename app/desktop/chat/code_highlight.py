"""A small offline syntax highlighter for the languages models write most.

Code in a chat is untrusted and arrives while it streams, so the highlighter is one regular
expression per language, run over the whole block (a string or comment may span lines), that
names spans of the text; it never evaluates or loads anything. Unknown languages get no spans.
Python, JavaScript/TypeScript, C/C++, Rust, shell and JSON are known, under their usual fence
names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    kind: str  # keyword, builtin, constant, string, key (a JSON key), number, comment, meta


@dataclass(frozen=True)
class _Lexicon:
    pattern: re.Pattern[str]  # named groups: comment, string, key, number, meta, word
    keywords: frozenset[str]
    builtins: frozenset[str] = frozenset()
    constants: frozenset[str] = frozenset()


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


def _lexicon(parts: dict[str, str], keywords: str, builtins: str = "", constants: str = ""):
    """Compile the alternatives in order (the first that matches at a position wins)."""
    pattern = "|".join(f"(?P<{name}>{regex})" for name, regex in parts.items())
    return _Lexicon(
        re.compile(pattern, re.MULTILINE), _words(keywords), _words(builtins), _words(constants)
    )


_NUMBER = r"\b(?:0[xXbBoO][0-9a-fA-F_]+|\d[\d_]*(?:\.\d[\d_]*)?(?:[eE][+-]?\d+)?)\w*"
_WORD = r"[A-Za-z_]\w*"
_C_COMMENT = r"//[^\n]*|/\*[\s\S]*?(?:\*/|\Z)"
_DOUBLE_QUOTED = r'"(?:\\.|[^"\\\n])*"?'
_CHAR = r"'(?:\\.|[^'\\\n])'"

_PYTHON = _lexicon(
    {
        "comment": r"#[^\n]*",
        "string": r"(?:\b[rRbBuUfF]{1,2})?(?:\"\"\"[\s\S]*?(?:\"\"\"|\Z)|'''[\s\S]*?(?:'''|\Z)"
        r"|\"(?:\\.|[^\"\\\n])*\"?|'(?:\\.|[^'\\\n])*'?)",
        "meta": r"^[ \t]*@[\w.]+",
        "number": _NUMBER,
        "word": _WORD,
    },
    "and as assert async await break class continue def del elif else except finally for from "
    "global if import in is lambda match case nonlocal not or pass raise return try while with "
    "yield",
    "print len range open int str float list dict set tuple bool type super isinstance enumerate "
    "zip map filter sorted min max sum abs any all self cls",
    "True False None",
)
_JAVASCRIPT = _lexicon(
    {
        "comment": _C_COMMENT,
        "string": r"\"(?:\\.|[^\"\\\n])*\"?|'(?:\\.|[^'\\\n])*'?|`(?:\\.|[^`\\])*`?",
        "number": _NUMBER,
        "word": r"[A-Za-z_$][\w$]*",
    },
    "async await break case catch class const continue debugger default delete do else export "
    "extends finally for from function if import in instanceof let new of return static super "
    "switch this throw try typeof var void while with yield interface type enum implements",
    "console document window Math JSON Object Array String Number Promise Error Map Set require "
    "module process",
    "true false null undefined NaN Infinity",
)
_C = _lexicon(
    {
        "comment": _C_COMMENT,
        "meta": r"^[ \t]*#[ \t]*\w+",
        "string": f"{_DOUBLE_QUOTED}|{_CHAR}",
        "number": _NUMBER,
        "word": _WORD,
    },
    "auto break case catch class const constexpr continue default delete do else enum explicit "
    "extern for friend goto if inline namespace new noexcept operator private protected public "
    "register return sizeof static static_cast struct switch template this throw try typedef "
    "typename union using virtual volatile while",
    "int char short long float double void bool unsigned signed size_t int8_t int16_t int32_t "
    "int64_t uint8_t uint16_t uint32_t uint64_t std printf malloc free",
    "true false nullptr NULL",
)
_RUST = _lexicon(
    {
        "comment": _C_COMMENT,
        "meta": r"#!?\[[^\]\n]*\]|\b\w+!",
        "string": rf'b?"(?:\\.|[^"\\])*"?|{_CHAR}',
        "number": _NUMBER,
        "word": _WORD,
    },
    "as async await break const continue crate dyn else enum extern fn for if impl in let loop "
    "match mod move mut pub ref return self Self static struct super trait type unsafe use where "
    "while",
    "i8 i16 i32 i64 i128 isize u8 u16 u32 u64 u128 usize f32 f64 bool char str String Vec Option "
    "Result Box Some None Ok Err",
    "true false",
)
_SHELL = _lexicon(
    {
        "comment": r"(?:^|(?<=\s))#[^\n]*",
        "string": r"\"(?:\\.|[^\"\\])*\"?|'[^']*'?",
        "meta": r"\$(?:\{[^}\n]*\}|\w+|[@#?$!*-])",
        "number": r"\b\d+\b",
        "word": r"[A-Za-z_][\w-]*",
    },
    "if then else elif fi for while until do done case esac function in return local export "
    "select time",
    "echo cd ls grep sed awk cat printf read source set unset pip python python3 make sudo apt "
    "git cp mv rm mkdir curl wget chmod",
    "true false",
)
_JSON = _lexicon(
    {
        "key": r'"(?:\\.|[^"\\\n])*"(?=\s*:)',
        "string": _DOUBLE_QUOTED,
        "number": r"-?\b\d+(?:\.\d+)?(?:[eE][+-]?\d+)?",
        "word": _WORD,
    },
    "",
    constants="true false null",
)

_LANGUAGES = {
    **dict.fromkeys(("python", "py", "python3", "py3", "pycon"), _PYTHON),
    **dict.fromkeys(
        ("javascript", "js", "jsx", "mjs", "typescript", "ts", "tsx", "node"), _JAVASCRIPT
    ),
    **dict.fromkeys(("c", "h", "cpp", "c++", "cc", "cxx", "hpp", "cuda", "cu"), _C),
    **dict.fromkeys(("rust", "rs"), _RUST),
    **dict.fromkeys(("bash", "sh", "shell", "zsh", "console", "shellsession"), _SHELL),
    **dict.fromkeys(("json", "jsonc", "json5"), _JSON),
}


def _lexicon_of(language: str) -> _Lexicon | None:
    # A fence's info string may carry more after the name ("python title=x.py").
    name = language.strip().split(maxsplit=1)[0].lower() if language.strip() else ""
    return _LANGUAGES.get(name)


def highlight(code: str, language: str) -> list[Span]:
    """The spans of `code` worth a colour, in order and disjoint; [] for an unknown language."""
    lexicon = _lexicon_of(language)
    if lexicon is None:
        return []
    spans = []
    for match in lexicon.pattern.finditer(code):
        kind = match.lastgroup
        assert kind is not None  # the pattern is all named groups (_lexicon), one of them matched
        if kind == "word":
            word = match.group()
            if word in lexicon.keywords:
                kind = "keyword"
            elif word in lexicon.constants:
                kind = "constant"
            elif word in lexicon.builtins:
                kind = "builtin"
            else:
                continue
        if match.end() > match.start():
            spans.append(Span(match.start(), match.end(), kind))
    return spans
