"""OpenAIHttp: the chat side of an OpenAI-compatible server (vLLM, SGLang, `kvscope serve`).

Plain blocking httpx calls: the Qt client (app/remote/remote_chat_qt.py) runs them in threads of
its own, never on the GUI thread. `stream_chat` reads the server-sent events of
POST /v1/chat/completions with `stream: true` and `stream_options.include_usage` (the last chunk
carries the prompt's token count and, from vLLM with prefix caching, `prompt_tokens_details.
cached_tokens`). Closing the generator closes the response, so the server sees the client go
and aborts the request (vLLM and `kvscope serve` free its blocks then). A thread blocked reading
the stream (a long prefill sends nothing) cannot close it itself: `abort()`, from any thread,
shuts the stream's socket down, so the server sees the client go at once and the reader wakes.

Every failure is a `RemoteError` whose message names the server (its connection label) and what
went wrong: the HTTP status with the server's own error message, a refused connection, a
timeout, or a stream that broke off.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

import httpx

from kvscope.app.remote.connection import Connection

CONNECT_TIMEOUT_S = 5.0
DEFAULT_TIMEOUT_S = 120.0  # between two bytes of an answer: a long prefill sends nothing
# Sampling fields that OpenAI itself does not take (vLLM and SGLang do): sent only when they
# change something, so that a strict server is not refused a neutral value.
_EXTRA_FIELDS = {"top_k": (-1, 0), "min_p": (0.0,), "repetition_penalty": (1.0,)}


class RemoteError(Exception):
    """A remote server refused or failed a request; the message says which server and why.
    `status`: the HTTP status when the server answered one, else None."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ChatDelta:
    """One event of a streamed chat reply: new text for a sample, and/or the reply's usage."""

    index: int = 0  # which of the n samples
    text: str = ""  # new text since the previous delta of this sample
    finish_reason: str | None = None  # "stop" | "length" | ... once this sample ends
    prompt_tokens: int | None = None  # from `usage`, when the server sends it
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    completion_tokens: int | None = None


@dataclass(frozen=True)
class TokenCount:
    """vLLM's POST /tokenize answer: the prompt's tokens and the server's context length."""

    tokens: list[int] = field(default_factory=list)
    count: int = 0
    max_model_len: int | None = None


class OpenAIHttp:
    def __init__(self, connection: Connection, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.connection = connection
        headers = {"Accept": "application/json"}
        if connection.api_key:
            headers["Authorization"] = f"Bearer {connection.api_key}"
        self._client = httpx.Client(
            base_url=connection.url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(CONNECT_TIMEOUT_S, timeout)),
        )
        self._timeout = timeout
        self._streaming: httpx.Response | None = None  # the stream being read, for abort()
        self._aborted = False

    def close(self) -> None:
        self._client.close()

    def abort(self) -> None:
        """Cut the chat stream being read now, from any thread: its socket is shut down (the
        server sees a disconnect and aborts the request; the reader stops at once)."""
        self._aborted = True
        response = self._streaming
        network = response.extensions.get("network_stream") if response is not None else None
        sock = network.get_extra_info("socket") if network is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # closed already
                pass

    def __enter__(self) -> OpenAIHttp:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    # ---- requests ------------------------------------------------------------------------
    def models(self) -> list[str]:
        """The model names the server serves (GET /v1/models)."""
        body = self._json("GET", "/v1/models")
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise RemoteError(f"{self._name()}: /v1/models answered without a model list")
        return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]

    def tokenize(
        self,
        model: str,
        messages: list[dict] | None = None,
        prompt: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The token ids the server makes of chat `messages` (templated) or a `prompt`."""
        return self.count_tokens(model, messages, prompt, add_generation_prompt).tokens

    def count_tokens(
        self,
        model: str,
        messages: list[dict] | None = None,
        prompt: str | None = None,
        add_generation_prompt: bool = True,
    ) -> TokenCount:
        """POST /tokenize (vLLM's, at the server root, not under /v1)."""
        if (messages is None) == (prompt is None):
            raise ValueError("tokenize takes either messages or a prompt, not both or neither")
        body: dict = {"model": model}
        if messages is not None:
            body["messages"] = messages
            body["add_generation_prompt"] = add_generation_prompt
        else:
            body["prompt"] = prompt
        answer = self._json("POST", "/tokenize", body)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            raise RemoteError(f"{self._name()}: /tokenize answered without a token list")
        limit = answer.get("max_model_len")
        return TokenCount(
            tokens=[int(t) for t in tokens],
            count=int(answer.get("count", len(tokens))),
            max_model_len=int(limit) if isinstance(limit, int) else None,
        )

    def stream_chat(
        self, model: str, messages: list[dict], params: dict
    ) -> Generator[ChatDelta, None, None]:
        """Stream a chat reply. `params`: SamplingSettings fields (max_tokens, temperature,
        top_p, seed, n, stop, ...). Closing the iterator closes the connection (an abort)."""
        body = {
            "model": model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            **request_fields(params),
        }
        try:
            with self._client.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    raise RemoteError(self._status_message(response), response.status_code)
                self._streaming = response
                if self._aborted:  # abort() came while the request was being sent
                    return
                try:
                    yield from _chat_deltas(response.iter_lines(), self._name())
                finally:
                    self._streaming = None
        except httpx.HTTPError as e:
            if self._aborted:
                raise RemoteError(f"{self._name()}: the reply was stopped") from None
            raise RemoteError(self._transport_message(e)) from None

    # ---- internals -----------------------------------------------------------------------
    def _json(self, method: str, path: str, body: dict | None = None):
        try:
            response = self._client.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise RemoteError(self._transport_message(e)) from None
        if response.status_code >= 400:
            raise RemoteError(self._status_message(response), response.status_code)
        try:
            return response.json()
        except ValueError:
            raise RemoteError(f"{self._name()}: {path} did not answer JSON") from None

    def _name(self) -> str:
        return f"{self.connection.label} ({self.connection.url})"

    def _status_message(self, response: httpx.Response) -> str:
        return (
            f"{self._name()} answered HTTP {response.status_code} to "
            f"{response.request.method} {response.request.url.path}: {_error_text(response)}"
        )

    def _transport_message(self, error: httpx.HTTPError) -> str:
        name = self._name()
        if isinstance(error, httpx.ConnectTimeout):
            return f"{name} did not accept a connection within {CONNECT_TIMEOUT_S:g} s"
        if isinstance(error, httpx.ConnectError):
            return f"cannot connect to {name}: {error or 'connection refused'}. Is it running?"
        if isinstance(error, httpx.TimeoutException):
            return f"{name} sent nothing for {self._timeout:g} s (timed out)"
        if isinstance(error, httpx.RemoteProtocolError):
            return f"{name} closed the connection mid-answer: {error}"
        return f"{name}: {type(error).__name__}: {error}"


def request_fields(params: dict) -> dict:
    """The OpenAI request fields for SamplingSettings-style `params`."""
    fields: dict = {}
    for key in ("max_tokens", "temperature", "top_p", "seed", "stop"):
        if params.get(key) is not None:
            fields[key] = params[key]
    if params.get("n", 1) != 1:
        fields["n"] = params["n"]
    for key, neutral in _EXTRA_FIELDS.items():
        if params.get(key) is not None and params[key] not in neutral:
            fields[key] = params[key]
    if isinstance(params.get("response_format"), dict):  # a chat's structured output
        fields["response_format"] = params["response_format"]
    return fields


def _chat_deltas(lines: Iterator[str], name: str) -> Iterator[ChatDelta]:
    """ChatDeltas from SSE lines: `data: {...}` events until `data: [DONE]`."""
    done = False
    for line in lines:
        if not line.startswith("data:"):
            continue  # blank separators, ": keep-alive" comments, event names
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            raise RemoteError(f"{name} streamed an event that is not JSON: {data[:80]!r}") from None
        if not isinstance(chunk, dict):
            continue
        if "error" in chunk:  # an error in the middle of a stream (vLLM and ours send these)
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise RemoteError(f"{name} failed the reply mid-stream: {message}")
        yield from _chunk_deltas(chunk)
    if not done:
        raise RemoteError(f"{name} ended the stream before [DONE]: the reply is cut off")


def _chunk_deltas(chunk: dict) -> Iterator[ChatDelta]:
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or {}
        text = delta.get("content") or ""
        reason = choice.get("finish_reason")
        if text or reason:
            yield ChatDelta(index=int(choice.get("index", 0)), text=text, finish_reason=reason)
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details") or {}
        yield ChatDelta(
            prompt_tokens=usage.get("prompt_tokens"),
            cached_tokens=details.get("cached_tokens") if isinstance(details, dict) else None,
            completion_tokens=usage.get("completion_tokens"),
        )


def _error_text(response: httpx.Response) -> str:
    """The server's own words: OpenAI's {"error": {"message"}}, vLLM's older {"message"}, or
    the start of whatever body came back."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200] or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if body.get("message"):
            return str(body["message"])
        if body.get("detail"):
            return str(body["detail"])
    return json.dumps(body)[:200]
