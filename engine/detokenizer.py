"""Text of a sequence as it streams: incremental detokenization and stop strings."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:  # importing transformers costs seconds; only the type is needed here
    from transformers import PreTrainedTokenizerBase

# Prompt tokens kept as decoding context: SentencePiece tokenizers drop a token's leading space
# when nothing precedes it, so the first generated token needs something in front.
_PROMPT_CONTEXT = 5
_REPLACEMENT = "\ufffd"  # what decode shows for bytes of a character that has not completed yet


class IncrementalDetokenizer:
    """Turns a growing token sequence into text deltas without ever emitting a broken character.

    Each step decodes a short window twice, with and without the unread tokens, and emits the
    difference once it no longer ends in U+FFFD (the bytes of an emoji or CJK character are often
    split across tokens). The window then slides to start at the tokens just read. (vLLM calls
    the window's start prefix_offset and _read its read_offset.)
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.output_text = ""
        self._window = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        self._read = len(self._window)  # window[:_read] is already text; the rest is pending

    def step(self, new_token_ids: Sequence[int]) -> str:
        """Add generated tokens; return the text they completed ("" while a character is open)."""
        self._window.extend(new_token_ids)
        read_text = self._decode(self._window[: self._read])
        text = self._decode(self._window)
        if len(text) <= len(read_text) or text.endswith(_REPLACEMENT):
            return ""
        return self._emit(text[len(read_text) :])

    def flush(self) -> str:
        """Emit whatever is still pending, broken characters included (as U+FFFD, like decode).

        After it, output_text == tokenizer.decode(generated ids, skip_special_tokens=...)."""
        read_text = self._decode(self._window[: self._read])
        return self._emit(self._decode(self._window)[len(read_text) :])

    def _emit(self, delta: str) -> str:
        self._window = self._window[self._read :]
        self._read = len(self._window)
        self.output_text += delta
        return delta

    def _decode(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
        return cast(str, text)  # one flat list of ids decodes to one str; the stubs say either


@dataclass(frozen=True)
class StopHit:
    stop: str  # the stop string that matched: the sequence's stop_reason
    index: int  # the output text ends here: text[:index] excludes the stop string


class StopChecker:
    """Stop strings over a growing output text, with vLLM's semantics: generation finishes with
    reason "stop" at the earliest match, and the stop string is not part of the output."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = list(stop)
        self._longest = max(map(len, self.stop), default=0)

    def find(self, text: str, new_chars: int) -> StopHit | None:
        """The earliest stop string that ends inside the last new_chars characters of text.

        Called after every delta, so any earlier match would already have ended generation;
        searching only the tail keeps each step O(delta + longest stop string)."""
        if new_chars <= 0:
            return None
        hit = None
        for stop in self.stop:
            index = text.find(stop, max(len(text) - new_chars - len(stop) + 1, 0))
            if index != -1 and (hit is None or index < hit.index):
                hit = StopHit(stop, index)
        return hit

    def streamable(self, text: str) -> str:
        """The part of an unfinished sequence's text that is safe to show: it holds back the
        longest tail that could still grow into a stop string, which would then be cut."""
        for n in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-n:]
            if any(stop.startswith(tail) for stop in self.stop):
                return text[:-n]
        return text
