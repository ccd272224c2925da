"""The OpenAI-compatible routes: chat and text completions (streamed or whole), models, health
and metrics. Each request is checked here (model name, bounds, what the engine cannot honour),
queued to the engine thread, and answered from its stream of outputs."""

from __future__ import annotations

import asyncio
import json
import re
import time
from itertools import count

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from kvscope.app.core.request_ids import api_request_id
from kvscope.app.serve.engine_loop import Accepted, RequestStream
from kvscope.app.serve.errors import APIError
from kvscope.app.serve.prompt_work import render_off_loop, tokenize_off_loop
from kvscope.app.serve.protocol import (
    REFUSED_CHAT,
    REFUSED_COMPLETION,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    SamplingFields,
    TokenizeRequest,
)
from kvscope.app.serve.responses import ResponseBuilder, sse
from kvscope.app.serve.sampling import refuse_unsupported, sampling_params
from kvscope.app.serve.state import ServerState
from kvscope.app.serve.structured import compile_off_loop, read_structured_outputs
from kvscope.app.serve.tools.formats import ToolFormat
from kvscope.app.serve.tools.request import ToolRequest
from kvscope.app.serve.truncation import cut_text, truncated_prompt, truncation_keep
from kvscope.engine import RequestOutput, SamplingParams, StructuredOutputsParams

MAX_TEMPLATE_KWARGS_CHARS = 64 * 1024
DISCONNECT_POLL_S = 0.5  # how often a whole (non-streamed) request checks its client is there
_CLIENT_LABEL = re.compile(r"[^A-Za-z0-9_.-]+")


def client_label(body: SamplingFields, request: Request) -> str:
    """Who asked, for the block map's colours: the `user` field or X-KVScope-Client header."""
    raw = body.user or request.headers.get("x-kvscope-client") or "client"
    return _CLIENT_LABEL.sub("-", raw).strip("-")[:32] or "client"


def check_template_kwargs(kwargs: dict | None) -> dict | None:
    """chat_template_kwargs: extra template variables (enable_thinking...), bounded in size."""
    if not kwargs:
        return None
    if len(json.dumps(kwargs)) > MAX_TEMPLATE_KWARGS_CHARS:
        raise APIError(
            400,
            f"chat_template_kwargs is over {MAX_TEMPLATE_KWARGS_CHARS:,} characters of JSON",
            "chat_template_kwargs",
        )
    return kwargs


def constraint_field(body: SamplingFields) -> str:
    """The field a constraint came from, for its 400 (response_format wins, as it does)."""
    return "response_format" if body.response_format is not None else "structured_outputs"


def build_router(state: ServerState) -> APIRouter:
    router = APIRouter()
    ids = count(1)

    def check_prompt_chars(body, chars: int, param: str) -> None:
        """Refuse a prompt that cannot fit before it costs a tokenizer or template run: a
        4 MiB prompt refused anyway used to stall every stream while it was tokenized."""
        # /tokenize too: what it counts could never be sent, and a 3.9 M-character count cost
        # the server 400 MB it kept. A truncated prompt may be longer: it is cut by characters
        # before it is tokenized (prompt_ids), the body's size bounding what is templated.
        truncating = getattr(body, "truncate_prompt_tokens", None) is not None
        if chars > state.max_prompt_chars and not truncating:
            raise APIError(
                400,
                f"the prompt is {chars:,} characters: more than {state.max_model_len:,} tokens "
                "(max_model_len) can hold",
                param,
            )

    def check_model(name: str) -> None:
        if name not in state.model_names:
            shown = name if len(name) <= 200 else f"{name[:200]}… ({len(name):,} characters)"
            raise APIError(404, f"The model `{shown}` does not exist.", "model", "model_not_found")

    async def chat_prompt(
        messages: list[dict], tools: list[dict] | None = None, kwargs: dict | None = None
    ) -> str:
        """The chat template's prompt, rendered in the template pool within its budget (a
        looping or ballooning template fails this request with a 400, nothing else)."""
        try:
            prompt = await render_off_loop(
                state.engine.apply_chat_template, messages, tools, kwargs
            )
        except ValueError as e:
            raise APIError(400, str(e), "messages") from None
        return prompt

    async def prompt_ids(body, prompt, param: str):
        """A text prompt's token ids, from the tokenizing pool (None for a token-id prompt),
        then truncate_prompt_tokens: the engine thread never tokenizes a served prompt, and a
        truncated one is cut by characters first, so no request tokenizes more than what
        max_model_len (or the truncation) can use."""
        truncation_keep(state, body)  # a bad value is refused before the tokenizer runs
        ids = None
        if isinstance(prompt, str):
            prompt = cut_text(state, body, prompt)
            try:
                _text, ids = await tokenize_off_loop(state.engine.tokenize, prompt)
            except ValueError as e:
                raise APIError(400, str(e), param) from None
        return truncated_prompt(state, body, prompt, ids)

    async def admit(rid, prompt, ids, params: SamplingParams, arrival: float, param: str):
        stream = RequestStream(rid, asyncio.get_running_loop())
        state.driver.call(lambda _: state.metrics.track(rid, arrival))
        state.driver.submit(rid, prompt, params, stream, ids)
        first = await stream.get()
        if isinstance(first, Exception):  # a sampling parameter's error names it (ParamError)
            state.driver.call(lambda _: state.metrics.forget(rid))  # nothing to track
            raise APIError(400, str(first), getattr(first, "param", param))
        assert isinstance(first, Accepted)
        return stream

    async def constrain(constraint: StructuredOutputsParams | None, param: str) -> None:
        if constraint is not None:
            await compile_off_loop(state.engine, constraint, param)

    async def respond(
        request: Request,
        kind: str,
        body,
        prompt,
        params,
        top_k: int,
        tools: ToolFormat | None = None,
    ):
        arrival = time.time()
        rid = api_request_id(client_label(body, request), next(ids))
        param = "messages" if kind == "chat" else "prompt"
        prompt, token_ids = await prompt_ids(body, prompt, param)
        stream = await admit(rid, prompt, token_ids, params, arrival, param)
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        builder = ResponseBuilder(
            kind, f"{prefix}-{rid}", body.model, top_k, state.token_text, tools
        )
        if body.stream:
            with_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                _stream(stream, builder, params.n, with_usage),
                media_type="text/event-stream",
            )
        out = await _collect(stream, request)
        if out is None:  # the client went away: nobody to answer
            return Response(status_code=499)
        errors = [c.error for c in out.outputs if c.error]
        if errors:
            raise APIError(500, f"the engine failed this request: {errors[0]}")
        return JSONResponse(builder.full(out))

    async def _stream(stream: RequestStream, builder: ResponseBuilder, n: int, with_usage: bool):
        try:
            for chunk in builder.first_chunks(n, with_usage):
                yield sse(chunk)
            last: RequestOutput | None = None
            while not stream.finished:
                item = await stream.get()
                if isinstance(item, Exception):
                    yield sse({"error": {"message": str(item), "type": "internal_server_error"}})
                    return
                last = item
                for chunk in builder.deltas(item, with_usage):
                    yield sse(chunk)
            if with_usage and last is not None:
                yield sse(builder.usage_chunk(last))
            yield sse("[DONE]")
        finally:
            # Closed mid-stream (or cancelled): the engine frees the request's blocks.
            if not stream.finished:
                state.driver.abort(stream.request_id)

    async def _collect(stream: RequestStream, request: Request) -> RequestOutput | None:
        # The client is checked on a clock, not only when no output came: a running request
        # yields an output every step, and one whose client timed out must stop burning the
        # machine for nobody.
        loop = asyncio.get_running_loop()
        check_at = loop.time() + DISCONNECT_POLL_S
        try:
            while True:
                try:
                    item = await asyncio.wait_for(stream.get(), DISCONNECT_POLL_S)
                except TimeoutError:
                    item = None
                if loop.time() >= check_at:
                    if await request.is_disconnected():
                        return None
                    check_at = loop.time() + DISCONNECT_POLL_S
                if item is None:
                    continue
                if isinstance(item, Exception):
                    raise APIError(500, str(item))
                if item.finished:
                    return item
        finally:
            if not stream.finished:
                state.driver.abort(stream.request_id)

    @router.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        check_model(body.model)
        refuse_unsupported(body, REFUSED_CHAT)
        messages = [m.for_template() for m in body.messages]
        check_prompt_chars(body, sum(len(m["content"]) for m in messages), "messages")
        top_k = body.top_logprobs or 0
        logprobs = top_k if body.logprobs else None
        if body.top_logprobs and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
        template_kwargs = check_template_kwargs(body.chat_template_kwargs)
        constraint = read_structured_outputs(body.response_format, body.structured_outputs)
        template = state.engine.tokenizer.chat_template
        tooling = ToolRequest.read(
            body.tools, body.tool_choice, body.parallel_tool_calls, messages, template
        )
        tools: list[dict] | None = None
        reply_format: ToolFormat | None = None
        if tooling is not None:
            messages, tools = tooling.prompt(messages)
            if tooling.calls_allowed:
                if constraint is not None:
                    raise APIError(
                        400,
                        "response_format and structured_outputs cannot be combined with tools "
                        'unless tool_choice is "none"',
                        "response_format",
                    )
                constraint = StructuredOutputsParams(grammar=tooling.grammar())
                reply_format = tooling.format
        params = sampling_params(
            state, body, body.max_completion_tokens or body.max_tokens, logprobs, constraint
        )
        await constrain(constraint, "tools" if reply_format else constraint_field(body))
        prompt = await chat_prompt(messages, tools, template_kwargs)
        # What the template added counts too: a prompt that cannot fit is not tokenized.
        check_prompt_chars(body, len(prompt), "messages")
        return await respond(request, "chat", body, prompt, params, top_k, reply_format)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        check_model(body.model)
        refuse_unsupported(body, REFUSED_COMPLETION)
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise APIError(400, f"one prompt per request, got {len(prompt)}", "prompt")
            prompt = prompt[0]
        if not prompt:
            raise APIError(400, "prompt is empty", "prompt")
        if isinstance(prompt, str):
            check_prompt_chars(body, len(prompt), "prompt")
        constraint = read_structured_outputs(body.response_format, body.structured_outputs)
        params = sampling_params(state, body, body.max_tokens, body.logprobs, constraint)
        await constrain(constraint, constraint_field(body))
        return await respond(request, "completion", body, prompt, params, body.logprobs or 0)

    @router.post("/tokenize")
    async def tokenize(body: TokenizeRequest):
        """The token ids the engine would see, as vLLM answers: {count, max_model_len, tokens,
        token_strs}."""
        if body.model is not None:
            check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give either prompt or messages", "prompt")
        if body.messages is not None:
            if not body.add_generation_prompt:
                raise APIError(400, "add_generation_prompt: false is not supported", "messages")
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            check_prompt_chars(body, sum(len(m["content"]) for m in messages), "messages")
            text = await chat_prompt(messages)
            check_prompt_chars(body, len(text), "messages")
        else:
            assert body.prompt is not None  # exactly one of prompt and messages, checked above
            text = body.prompt
            check_prompt_chars(body, len(text), "prompt")
        try:
            # The answer is built whole in the tokenizing pool, its JSON included: with 1,000
            # /tokenize calls queued, encoding their token lists on the event loop (FastAPI's
            # jsonable_encoder, ms each) kept /health waiting seconds.
            answer = await tokenize_off_loop(tokenize_answer, text, bool(body.return_token_strs))
        except ValueError as e:
            raise APIError(400, str(e), "prompt") from None
        return Response(answer, media_type="application/json")

    def tokenize_answer(text: str, with_strs: bool) -> bytes:
        """vLLM's TokenizeResponse as JSON bytes: token_strs is null unless asked for, then the
        tokenizer's own pieces (convert_ids_to_tokens), not decoded text."""
        _text, ids = state.engine.tokenize(text)
        strs = state.engine.tokenizer.convert_ids_to_tokens(ids) if with_strs else None
        answer = {
            "count": len(ids),
            "max_model_len": state.max_model_len,
            "tokens": ids,
            "token_strs": strs,
        }
        # As Starlette's JSONResponse renders it.
        return json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode()

    @router.post("/detokenize")
    async def detokenize(body: DetokenizeRequest):
        if body.model is not None:
            check_model(body.model)
        vocab = state.engine.model_config.vocab_size
        bad = [t for t in body.tokens if not 0 <= t < vocab]
        if bad:
            raise APIError(
                400, f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})", "tokens"
            )
        return {"prompt": state.engine.tokenizer.decode(body.tokens)}

    @router.get("/v1/models")
    async def models():
        data = [
            {
                "id": name,
                "object": "model",
                "created": state.started,
                "owned_by": "kvscope",
                "max_model_len": state.max_model_len,
            }
            for name in state.model_names
        ]
        return {"object": "list", "data": data}

    @router.get("/health")
    async def health():
        return Response(status_code=200)

    @router.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return router
