"""The request bodies of the OpenAI API that the server takes, validated by pydantic, with the
fields vLLM's OpenAI server adds to them.

Checked against vLLM 0.33.0's own request models and SamplingParams by
tests/app/serve/test_vllm_sampling.py (it imports them from vLLM's wheel): every field of vLLM's
ChatCompletionRequest and CompletionRequest is either honoured, refused, or listed there as no
sampling field with why.

- Honoured, with vLLM's meaning and vLLM's bounds (its errors are 400s, and so are ours):
  max_tokens, max_completion_tokens, temperature, top_p, top_k, min_p, n, seed (-1: none), stop,
  stop_token_ids, ignore_eos, min_tokens, presence_penalty, frequency_penalty, repetition_penalty,
  logit_bias (clamped to [-100, 100]), allowed_token_ids, logprobs, top_logprobs,
  include_stop_str_in_output, skip_special_tokens, spaces_between_special_tokens (see below),
  truncate_prompt_tokens, truncation_side.
- Structured outputs and tools (app/serve/structured.py, app/serve/tools/): response_format,
  structured_outputs, and on chat tools, tool_choice, parallel_tool_calls, chat_template_kwargs.
- Refused with a 400 naming the field when set to anything but its default (REFUSED below): what
  the engine cannot do (beam search, prompt logprobs, bad words, structural tags, watermarks,
  KV transfer, priorities...) and chat inputs it would otherwise drop silently (documents, a
  custom chat template, echo). spaces_between_special_tokens: false is refused only with
  skip_special_tokens: false, the one case where vLLM's output would differ.
- Unknown fields are ignored, as OpenAI-compatible servers do, so clients that send extras
  (metadata) still work; but not best_of (OpenAI's legacy completions field, vLLM's before its
  V1 engine), which asks for other output: refused unless it equals n (DROPPED_BY_VLLM).

Counts and token ids are ints, never booleans (true is not token 1)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictInt

# The most top logprobs SamplingParams takes (vLLM's default max_logprobs is the same 20).
MAX_LOGPROBS = 20
INT64 = (-(2**63), 2**63 - 1)


def _no_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    return value


# An int as vLLM takes it (16.0 and "16" pass, as pydantic's lax mode lets them), but not a bool.
Int = Annotated[int, BeforeValidator(_no_bool)]
TokenId = Annotated[StrictInt, Field(ge=0)]
LogprobCount = Annotated[StrictInt, Field(ge=0, le=MAX_LOGPROBS)]
MAX_STOP_STRINGS = 4  # vLLM's VLLM_MAX_STOP_STRINGS default
MAX_STOP_CHARS = 1000
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]

# vLLM fields the engine cannot honour: field -> the values that mean "not used" (its default and
# what vLLM treats the same). Any other value is refused with a 400 naming the field.
_REFUSED_BOTH: dict[str, tuple] = {
    "use_beam_search": (False,),  # beam search needs an idle engine (engine/beam_search.py)
    "length_penalty": (1, 1.0),  # only beam search reads it
    "watermarking": (None, False),
    "prompt_logprobs": (None,),
    "logprob_token_ids": (None, []),
    "bad_words": (None, []),
    "repetition_detection": (None,),
    "thinking_token_budget": (None, -1),  # vLLM reads -1 as unset
    "priority": (0,),  # vLLM refuses it too without priority scheduling
    "cache_salt": (None,),  # the prefix cache is not salted per request
    "kv_transfer_params": (None,),  # no KV connector
    "ec_transfer_params": (None,),
    "vllm_xargs": (None,),  # no custom sampling extensions
    "routed_experts_prompt_start": (0,),  # no MoE routing data to return
    "stream_interval": (None, 1),  # every token is its own chunk
}
REFUSED_CHAT: dict[str, tuple] = {
    **_REFUSED_BOTH,
    "echo": (False,),
    "documents": (None,),
    "chat_template": (None,),  # the model's own template renders (app/serve/routes.py)
    "reasoning_effort": (None,),
    "continue_final_message": (False,),
    "add_generation_prompt": (True,),
    "add_special_tokens": (False,),  # the template adds the special tokens
}
REFUSED_COMPLETION: dict[str, tuple] = {
    **_REFUSED_BOTH,
    "echo": (False,),
    "suffix": (None,),  # no fill-in-the-middle rendering
    "prompt_embeds": (None,),
}

# Fields vLLM 0.33's request models no longer declare: its server drops them as unknown extras
# (a debug log), though a client sending one expects other output than it gets. best_of: keep
# the best n of best_of candidates; unused when it is n (every candidate is kept).
DROPPED_BY_VLLM = ("best_of",)


def refused_field(body: BaseModel, refused: dict[str, tuple]) -> str | None:
    """The first field of `refused` that the body sets to a value the engine cannot honour."""
    extra = body.model_extra or {}
    for name, unused in refused.items():
        if name not in extra:
            continue
        value = extra[name]
        # 1 == True in Python; a bool only matches a bool.
        if not any(value == u and isinstance(value, bool) == isinstance(u, bool) for u in unused):
            return name
    return None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool | None = False


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    # An assistant turn that called tools, and a tool's result answering one of its calls.
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as the tools' history conversion reads it (app/serve/tools/messages)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        for key in ("tool_calls", "tool_call_id", "name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class SamplingFields(BaseModel):
    """Fields both endpoints share. Extras are kept (not validated) so that the refused fields
    can be seen: see refused_field."""

    model_config = ConfigDict(extra="allow")
    model: str
    max_tokens: Int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: Int | None = None
    min_p: float | None = None
    n: Int = Field(default=1, ge=1, le=16)
    # vLLM's bound (VLLM_MAX_STOP_STRINGS, default 4; OpenAI's is 4 too), and a length bound of
    # our own: every stop string is searched for after every token of every sequence.
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: list[TokenId] | None = None
    seed: Int | None = Field(default=None, ge=INT64[0], le=INT64[1])
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    allowed_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    min_tokens: Int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: Int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    user: str | None = None
    # Read by app/serve/structured.py: OpenAI's response_format, vLLM's structured_outputs.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: LogprobCount | None = None
    # Read by app/serve/tools/spec.py, which checks them as OpenAI and vLLM do.
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: Int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    logprobs: LogprobCount | None = None


class TokenizeRequest(BaseModel):
    """vLLM's POST /tokenize: a prompt as the completions endpoint takes it, or chat messages
    templated as the chat endpoint would (so a router can count a chat's prompt blocks)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[TokenId]
