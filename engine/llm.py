"""LLM: the friendly offline wrapper, shaped like vLLM's, around one LLMEngine."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Sequence
from typing import Any, cast

from transformers import PreTrainedTokenizerBase

from kvscope.engine.beam_search import BeamSearchRunner
from kvscope.engine.config import EngineConfig, user_knobs
from kvscope.engine.kv.snapshot import KVSnapshot
from kvscope.engine.llm_engine import LLMEngine
from kvscope.engine.model.loader import LoadedModel
from kvscope.engine.outputs import BeamSearchOutput, RequestOutput
from kvscope.engine.prompts import PromptInput
from kvscope.engine.sampling_params import BeamSearchParams, SamplingParams

Messages = list[dict[str, Any]]
# One prompt, or several (a list of texts, or of token-id lists).
Prompts = PromptInput | Sequence[PromptInput]


def _init_signature() -> inspect.Signature:
    """`LLM(model=None, device="auto", ...)`: EngineConfig's user knobs in their order, for
    inspect.signature and help(); `model` also takes a LoadedModel."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter("self", kind)]
    for f in user_knobs():
        annotation = "str | os.PathLike | LoadedModel | None" if f.name == "model" else f.type
        params.append(inspect.Parameter(f.name, kind, default=f.default, annotation=annotation))
    return inspect.Signature(params, return_annotation="None")


_INIT_SIGNATURE = _init_signature()


class LLM:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The arguments are `model` and EngineConfig's user knobs, as __signature__ below shows;
        # binding to it raises the TypeError a written-out signature would, naming the argument.
        try:
            call = _INIT_SIGNATURE.bind(self, *args, **kwargs)
        except TypeError as e:
            raise TypeError(f"LLM() {e}") from None
        call.apply_defaults()
        knobs = {name: value for name, value in call.arguments.items() if name != "self"}
        model = knobs.pop("model")
        # A LoadedModel lets callers (the app's settings, tests) rebuild an engine with new knobs
        # without reading the weights from disk again.
        loaded = model if isinstance(model, LoadedModel) else None
        self.config = EngineConfig(model=loaded.source if loaded else model, **knobs)
        self.engine = LLMEngine(self.config, loaded)
        self._ids = itertools.count()

    __init__.__signature__ = _INIT_SIGNATURE  # type: ignore[attr-defined]  # for help() and IDEs

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompts,
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion with continuous batching; outputs come back in input order."""
        listed = _prompt_list(prompts)
        if isinstance(params, list):
            if len(params) != len(listed):
                raise ValueError(f"{len(params)} sampling params for {len(listed)} prompts")
            per_prompt = params
        else:
            per_prompt = [params or SamplingParams()] * len(listed)
        return self._run(list(zip(listed, per_prompt, strict=True)))

    def chat(
        self,
        messages: Messages | list[Messages],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template (with the assistant turn opened) and generate."""
        if messages and isinstance(messages[0], dict):
            conversations = [messages]  # one chat
        else:
            conversations = cast(list[Messages], messages)
        prompts = [self.engine.apply_chat_template(c) for c in conversations]
        return self.generate(prompts, params)

    def beam_search(
        self, prompts: Prompts, params: BeamSearchParams | None = None
    ) -> list[BeamSearchOutput]:
        """Beam search per prompt; each result's sequences come best-first."""
        token_ids = [self.engine.tokenize(p)[1] for p in _prompt_list(prompts)]
        for ids in token_ids:
            if not ids:
                raise ValueError("prompt is empty after tokenization")
        return BeamSearchRunner(self.engine).run(token_ids, params or BeamSearchParams())

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()

    def kv_snapshot(self) -> KVSnapshot:
        """An immutable copy of the KV pool (per-block arrays, block tables, metrics)."""
        return self.engine.kv_snapshot()

    def shadow_snapshot(self) -> KVSnapshot | None:
        """The same traffic on the naive contiguous allocator; None in contiguous mode."""
        return self.engine.shadow_snapshot()

    def _run(self, work: list[tuple[PromptInput, SamplingParams]]) -> list[RequestOutput]:
        ids = []
        try:
            for prompt, params in work:
                request_id = f"llm-{next(self._ids)}"
                self.engine.add_request(request_id, prompt, params)
                ids.append(request_id)
            final: dict[str, RequestOutput] = {}
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.finished:
                        final[out.request_id] = out
        except BaseException:
            # Leave the engine clean for the next call: nothing half-added keeps its blocks.
            for request_id in ids:
                self.engine.abort_request(request_id)
            raise
        return [final[i] for i in ids]


def _prompt_list(prompts: Prompts) -> list[PromptInput]:
    """One prompt (text or token ids) or a list of them, as a non-empty list."""
    if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
        # One prompt: text, or token ids (bytes too, which tokenizing then refuses by name).
        return [cast(PromptInput, prompts)]
    if not prompts:
        raise ValueError("prompts is empty")
    return list(cast(Sequence[PromptInput], prompts))
