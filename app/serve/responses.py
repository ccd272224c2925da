"""OpenAI response bodies built from the engine's RequestOutput: whole responses, streamed
chunks (deltas against what was already sent), logprobs and usage."""

from __future__ import annotations

import json
import time

from kvscope.app.serve.tools.formats import ToolFormat
from kvscope.app.serve.tools.replies import ToolCallDeltas, message
from kvscope.engine import CompletionOutput, RequestOutput


def sse(payload: dict | str) -> str:
    """One server-sent event as OpenAI streams them."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def usage(out: RequestOutput) -> dict:
    completion = sum(len(c.token_ids) for c in out.outputs)
    prompt = len(out.prompt_token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": out.num_cached_tokens},
    }


def finish_reason(choice: CompletionOutput) -> str | None:
    # "abort" only reaches a client whose request the engine failed; OpenAI has no such value.
    return choice.finish_reason


def _tool_finish(choice: CompletionOutput, called: bool) -> str | None:
    # OpenAI's "tool_calls" when a finished reply called tools; "length" stays "length".
    return "tool_calls" if called and choice.finish_reason == "stop" else finish_reason(choice)


class TokenText:
    """Token id -> its text piece, cached (logprobs name every top token)."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._cache[token_id] = self._tokenizer.decode([token_id])
        return text


def _top(entries: dict[int, float], k: int) -> list[tuple[int, float]]:
    return sorted(entries.items(), key=lambda kv: -kv[1])[:k]


def chat_logprobs(choice: CompletionOutput, start: int, end: int, k: int, text: TokenText):
    """OpenAI chat `logprobs.content` for generated tokens [start, end)."""
    if choice.logprobs is None:
        return None
    content = []
    for token_id, entries in zip(
        choice.token_ids[start:end], choice.logprobs[start:end], strict=False
    ):
        piece = text(token_id)
        content.append(
            {
                "token": piece,
                "logprob": entries.get(token_id, float("-inf")),
                "bytes": list(piece.encode("utf-8")),
                "top_logprobs": [
                    {"token": text(t), "logprob": lp, "bytes": list(text(t).encode("utf-8"))}
                    for t, lp in _top(entries, k)
                ],
            }
        )
    return {"content": content}


def completion_logprobs(
    choice: CompletionOutput, start: int, end: int, k: int, text: TokenText, offset: int
):
    """OpenAI completions `logprobs` (tokens, token_logprobs, top_logprobs, text_offset)."""
    if choice.logprobs is None:
        return None
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for token_id, entries in zip(
        choice.token_ids[start:end], choice.logprobs[start:end], strict=False
    ):
        piece = text(token_id)
        tokens.append(piece)
        token_logprobs.append(entries.get(token_id, float("-inf")))
        tops.append({text(t): lp for t, lp in _top(entries, k)} if k else None)
        offsets.append(offset)
        offset += len(piece)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


class ResponseBuilder:
    """Bodies for one request: id, model, creation time, and what each choice has been sent."""

    def __init__(
        self,
        kind: str,
        response_id: str,
        model: str,
        top_k: int,
        text: TokenText,
        tools: ToolFormat | None = None,
    ):
        self.kind = kind  # "chat" | "completion"
        # The format tool calls come in, when the request offers tools the model may call.
        self.tools = tools
        self._tool_deltas: dict[int, ToolCallDeltas] = {}
        self.id = response_id
        self.model = model
        self.created = int(time.time())
        self.top_k = top_k
        self.text = text
        self._sent_text: dict[int, int] = {}
        self._sent_tokens: dict[int, int] = {}
        self._done: set[int] = set()

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    # ---- whole responses -----------------------------------------------------------------
    def full(self, out: RequestOutput) -> dict:
        choices = []
        for c in out.outputs:
            n = len(c.token_ids)
            if self.kind == "chat":
                reply, calls = {"role": "assistant", "content": c.text}, False
                if self.tools is not None:
                    reply, calls = message(self.tools, c.text)
                choices.append(
                    {
                        "index": c.index,
                        "message": reply,
                        "logprobs": chat_logprobs(c, 0, n, self.top_k, self.text),
                        "finish_reason": _tool_finish(c, calls),
                    }
                )
            else:
                choices.append(
                    {
                        "index": c.index,
                        "text": c.text,
                        "logprobs": completion_logprobs(c, 0, n, self.top_k, self.text, 0),
                        "finish_reason": finish_reason(c),
                    }
                )
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": choices, "usage": usage(out)}

    # ---- streaming -----------------------------------------------------------------------
    def first_chunks(self, n: int, with_usage: bool) -> list[dict]:
        """Chat streams open each choice with its role, as OpenAI does."""
        if self.kind != "chat":
            return []
        return [
            self._chunk(i, {"role": "assistant", "content": ""}, None, None, with_usage)
            for i in range(n)
        ]

    def deltas(self, out: RequestOutput, with_usage: bool) -> list[dict]:
        chunks = []
        for c in out.outputs:
            if c.index in self._done:
                continue
            text_from = self._sent_text.get(c.index, 0)
            tok_from = self._sent_tokens.get(c.index, 0)
            new_text = c.text[text_from:]
            tok_to = len(c.token_ids)
            finished = c.finish_reason is not None
            if not new_text and not finished and tok_to == tok_from:
                continue
            self._sent_text[c.index] = len(c.text)
            self._sent_tokens[c.index] = tok_to
            if finished:
                self._done.add(c.index)
            reason = finish_reason(c) if finished else None
            if self.kind == "chat" and self.tools is not None:
                streamer = self._tool_deltas.setdefault(c.index, ToolCallDeltas(self.tools))
                delta = streamer.step(c.text)
                if finished:
                    reason = _tool_finish(c, streamer.any_call)
                elif not delta:
                    # A call's JSON between two pieces worth sending: its tokens' logprobs go
                    # with the next chunk.
                    self._sent_tokens[c.index] = tok_from
                    continue
                lp = chat_logprobs(c, tok_from, tok_to, self.top_k, self.text)
                chunks.append(self._chunk(c.index, delta, lp, reason, with_usage))
            elif self.kind == "chat":
                delta = {"content": new_text} if new_text or not finished else {}
                lp = chat_logprobs(c, tok_from, tok_to, self.top_k, self.text)
                chunks.append(self._chunk(c.index, delta, lp, reason, with_usage))
            else:
                lp = completion_logprobs(c, tok_from, tok_to, self.top_k, self.text, text_from)
                chunks.append(self._chunk(c.index, new_text, lp, reason, with_usage))
        return chunks

    def usage_chunk(self, out: RequestOutput) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage(out)}

    def _chunk(self, index, delta, logprobs, reason, with_usage) -> dict:
        if self.kind == "chat":
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
            body = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": index, "text": delta, "logprobs": logprobs, "finish_reason": reason}
            body = {**self._head("text_completion"), "choices": [choice]}
        if with_usage:
            body["usage"] = None
        return body
