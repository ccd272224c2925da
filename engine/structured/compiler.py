"""GrammarCompiler: the one place llguidance is used. It wraps the loaded model's tokenizer
(special tokens and every EOS id included) once, compiles each distinct grammar once within a
budget, and hands each sequence its own matcher.

llguidance and not xgrammar: it is MIT-licensed with no dependencies (xgrammar pulls in its own
torch, triton and transformers requirements), it builds its lexer lazily so a grammar is ready
in a millisecond instead of a precompile per schema, its limits (LLParserLimits) turn a
grammar that would blow up into an error instead of a stall, and a mask costs ~0.1 ms a token.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kvscope.engine.param_error import ParamError
from kvscope.engine.structured.params import StructuredOutputsParams

if TYPE_CHECKING:
    import llguidance

CACHE_SIZE = 256  # compiled grammars kept (a template matcher each, a few KB to a few MB)
MAX_GRAMMAR_CHARS = 1 << 20  # a schema of more than 1 MiB of grammar text is refused unread


class GrammarError(ParamError):
    """A constraint that cannot be compiled: its message says why (the server's 400)."""

    def __init__(self, message: str) -> None:
        super().__init__("structured_outputs", message)


class GrammarMatcher:
    """One sequence's place in its grammar. Tokens go in as they are sampled; a preempted
    sequence keeps its matcher, since recomputing its K/V samples nothing."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def fill_mask(self, bitmask_row: Any) -> None:
        """Write the allowed-next-token bitmask (int32 words, bit i of word w = token 32w+i)
        into a contiguous CPU row."""
        self._matcher.unsafe_compute_mask_ptr(
            bitmask_row.data_ptr(), bitmask_row.numel() * bitmask_row.element_size()
        )

    def accept(self, token_id: int) -> bool:
        """Advance past a sampled token; False when the grammar does not allow it."""
        return bool(self._matcher.consume_token(token_id))

    @property
    def is_terminated(self) -> bool:
        """Nothing but EOS may follow: the output is complete."""
        return bool(self._matcher.is_stopped())

    @property
    def error(self) -> str:
        return str(self._matcher.get_error())

    def fork(self) -> GrammarMatcher:
        return GrammarMatcher(self._matcher.deep_copy())


class CompiledGrammar:
    """A checked grammar: a matcher at its start, copied for each sequence that uses it."""

    def __init__(self, template: llguidance.LLMatcher) -> None:
        self._template = template

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._template.deep_copy())


class GrammarCompiler:
    """Compiles constraints against one tokenizer; safe from any thread (the server compiles
    off its event loop, the engine thread then finds the grammar in the cache)."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        self._hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._lock = threading.Lock()
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()

    @property
    def mask_vocab_size(self) -> int:
        """Tokens a mask covers: the tokenizer's, which may outnumber the model's logits."""
        return int(self.tokenizer.vocab_size)

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the model's vocabulary, built on first use (~1.5 s on a
        49k vocabulary, once per loaded model)."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = _wrap_tokenizer(self._hf_tokenizer, self.vocab_size, self._eos)
            return self._tokenizer

    def compile(self, params: StructuredOutputsParams) -> CompiledGrammar:
        """The compiled grammar of a constraint (cached by its grammar text), or GrammarError."""
        import llguidance

        try:
            text = params.grammar_text()
        except RecursionError:
            raise GrammarError("the schema is nested too deeply") from None
        except GrammarError:
            raise
        except ParamError as e:
            raise GrammarError(str(e)) from None
        except ValueError as e:
            raise GrammarError(f"the constraint cannot be read: {e}") from None
        if len(text) > MAX_GRAMMAR_CHARS:
            raise GrammarError(
                f"the grammar is {len(text):,} characters; at most {MAX_GRAMMAR_CHARS:,} are taken"
            )
        with self._lock:
            found = self._cache.get(text)
            if found is not None:
                self._cache.move_to_end(text)
                return found
        tokenizer = self.tokenizer
        # Building the matcher checks the grammar within llguidance's default limits (lexer
        # states, grammar size, fuel per token) and drops the GIL while it works.
        template = llguidance.LLMatcher(tokenizer, text, log_level=0)
        if template.is_error():
            raise GrammarError(f"invalid constraint: {_first_line(template.get_error())}")
        compiled = CompiledGrammar(template)
        with self._lock:
            self._cache[text] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled


def _first_line(message: str, limit: int = 300) -> str:
    line = message.strip().splitlines()[0] if message.strip() else "unknown error"
    return line if len(line) <= limit else line[:limit] + "…"


def _wrap_tokenizer(hf_tokenizer: Any, vocab_size: int, eos: list[int]) -> llguidance.LLTokenizer:
    import llguidance

    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise GrammarError("structured output needs a fast (Rust) tokenizer; this model has none")
    # The tokenizer's JSON (added and special tokens included), without padding or truncation,
    # which would change what its vocabulary decodes to.
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    # A tokenizer may name more tokens than the model has logits for (added tokens past the
    # embedding): the masks then cover them too, and the sampler never sees those columns.
    n_vocab = max(vocab_size, backend.get_vocab_size(with_added_tokens=True))
    try:
        return llguidance.LLTokenizer(backend.to_str(), n_vocab=n_vocab, eos_token=eos)
    except ValueError as e:
        raise GrammarError(f"the model's tokenizer cannot drive a grammar: {e}") from None
