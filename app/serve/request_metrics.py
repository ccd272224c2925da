"""vLLM's families that follow requests through the engine, filled from the engine's outputs.

As vLLM 0.33's PrometheusStatLogger records them (vllm/v1/metrics/loggers.py, stats.py): token
counters when a prompt's prefill completes and as tokens come out; latencies, token counts and
phase times once per finished request; `iteration_tokens_total` once per engine step that had
outputs (prompt tokens computed by requests whose prefill completed in it, plus the tokens
generated in it). A request with n samples counts as n requests here, as vLLM runs it as n child
requests; `request_params_n` and `request_max_num_generation_tokens` are observed once per
request, as vLLM observes them per parent.

Times: `arrival` is when the server received the request (vLLM's frontend arrival), "queued" when
the engine took it (RequestMetrics.arrival_time), "scheduled" its first step
(first_scheduled_time); token times are those of the engine step that produced them, read when
the step's outputs arrive here. queue = scheduled - queued, prefill = first token - scheduled,
decode = last token - first token, inference = last token - scheduled, e2e = finish - arrival.
A phase a request never reached (aborted while waiting) counts as zero.

Differences, stated: our n samples fork from one prefill; the forked samples' prompt tokens count
as local cache hits (they share the first sample's KV blocks) and their
`request_prefill_kv_computed_tokens` is 0, where vLLM's children each look up the prefix cache.
finished_reason "repetition" stays 0: the engine has no repetition detector."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from kvscope.engine import CompletionOutput, LLMEngine, RequestOutput

LABELS = ["model_name", "engine"]
# vLLM's FinishReason, each as str() renders it; ours end "stop", "length" or "abort", and "error"
# when the engine failed the sample (its output carries `error`; the server answers 500).
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")  # PromptTokenStats
# vLLM's default buckets (vllm/v1/metrics/buckets.py).
TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
ITL_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
]  # fmt: skip
REQUEST_LATENCY_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
REQUEST_PARAMS_N_BUCKETS = [1, 2, 5, 10, 20]
REQUEST_NUM_PREEMPTIONS_BUCKETS = [1, 2, 3, 4, 5, 10, 20]
# A request tracked by the server that the engine never took (refused with a 400) is forgotten
# after this long.
UNTAKEN_TTL_S = 300.0


def request_tokens_buckets(max_model_len: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_model_len: vLLM's buckets for token counts."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class _Sample:
    __slots__ = ("tokens", "first_token", "last_token", "done")

    def __init__(self) -> None:
        self.tokens = 0
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.done = False


class _Tracked:
    __slots__ = ("arrival", "max_tokens", "samples")

    def __init__(self, arrival: float) -> None:
        self.arrival = arrival
        self.max_tokens: int | None = None  # read from the engine once it has the request
        self.samples: dict[int, _Sample] = {}


class RequestFamilies:
    """The families below, registered in `registry` for one model on engine "0"."""

    def __init__(self, registry: CollectorRegistry, model_name: str, max_model_len: int) -> None:
        values = (model_name, "0")

        def counter(name, doc):
            return Counter(name, doc, LABELS, registry=registry).labels(*values)

        def histogram(name, doc, buckets):
            family = Histogram(name, doc, LABELS, buckets=buckets, registry=registry)
            return family.labels(*values)

        def labelled_counter(name, doc, label, label_values):
            family = Counter(name, doc, [*LABELS, label], registry=registry)
            return {v: family.labels(*values, v) for v in label_values}

        tokens = request_tokens_buckets(max_model_len)
        latency = REQUEST_LATENCY_BUCKETS
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_by_source = labelled_counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            "source",
            PROMPT_SOURCES,
        )
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.success = labelled_counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            "finished_reason",
            FINISH_REASONS,
        )
        self.prompt_hist = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.generation_hist = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKENS_BUCKETS,
        )
        self.max_generation = histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tokens,
        )
        self.params_n = histogram(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            REQUEST_PARAMS_N_BUCKETS,
        )
        self.params_max_tokens = histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tokens,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            latency,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            latency,
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            latency,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            latency,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            latency,
        )
        self.num_preemptions = histogram(
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            REQUEST_NUM_PREEMPTIONS_BUCKETS,
        )
        self.prefill_kv_computed = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )
        self._tracked: dict[str, _Tracked] = {}
        self._untaken: set[str] = set()  # tracked, but not yet seen in the engine

    # ---- the engine thread ---------------------------------------------------------------
    def track(self, request_id: str, arrival: float) -> None:
        """A request the server received at `arrival` (before it is handed to the engine)."""
        self._tracked[request_id] = _Tracked(arrival)
        self._untaken.add(request_id)

    @property
    def num_tracked(self) -> int:
        return len(self._tracked)

    def forget(self, request_id: str) -> None:
        """A tracked request the engine refused: nothing of it is counted or kept."""
        self._tracked.pop(request_id, None)
        self._untaken.discard(request_id)

    def observe(
        self, engine: LLMEngine, outputs: list[RequestOutput], now: float, stepped: bool
    ) -> None:
        """Outputs of one engine step (`stepped`) or of aborts, at `now`."""
        self._take(engine, now)
        # vLLM's children prefill each; ours fork from the first sample (LLMEngine.add_request)
        # except under the naive allocator, which shares nothing.
        forks = engine.config.allocator == "paged"
        step_tokens, seen = 0, False
        for out in outputs:
            tracked = self._tracked.get(out.request_id)
            if tracked is not None:
                seen = True
                step_tokens += self._observe_output(tracked, out, now, forks)
        if stepped and seen:
            self.iteration_tokens.observe(step_tokens)

    def _take(self, engine: LLMEngine, now: float) -> None:
        """Read max_tokens of requests the engine has taken since the last call."""
        for request_id in list(self._untaken):
            request = engine.requests.get(request_id)
            tracked = self._tracked.get(request_id)
            if request is not None and tracked is not None:
                tracked.max_tokens = request.params.max_tokens
                self._untaken.discard(request_id)
            elif tracked is None or now - tracked.arrival > UNTAKEN_TTL_S:
                self._untaken.discard(request_id)
                self._tracked.pop(request_id, None)

    def _observe_output(self, tracked: _Tracked, out: RequestOutput, now: float, forks) -> int:
        """Count one request's progress; returns the tokens it computed this step."""
        num_prompt = len(out.prompt_token_ids)
        computed_by_first = num_prompt - out.num_cached_tokens
        step_tokens = 0
        for c in out.outputs:
            sample = tracked.samples.setdefault(c.index, _Sample())
            computed = computed_by_first if c.index == 0 or not forks else 0
            new = len(c.token_ids) - sample.tokens
            if new > 0:
                # No token yet (first_token and last_token are set together): its prefill
                # completed in this step.
                if sample.last_token is None:
                    sample.first_token = now
                    self.ttft.observe(now - tracked.arrival)
                    self.prompt_tokens.inc(num_prompt)
                    self.prompt_by_source["local_compute"].inc(computed)
                    self.prompt_by_source["local_cache_hit"].inc(num_prompt - computed)
                    self.prompt_cached.inc(num_prompt - computed)
                    step_tokens += computed
                else:
                    self.itl.observe(now - sample.last_token)
                sample.last_token = now
                sample.tokens = len(c.token_ids)
                self.generation_tokens.inc(new)
                step_tokens += new
            if c.finish_reason is not None and not sample.done:
                sample.done = True
                self._finished(tracked, out, c, sample, now, computed)
        if out.finished:
            self._tracked.pop(out.request_id, None)
            self._untaken.discard(out.request_id)
            self.max_generation.observe(max(len(c.token_ids) for c in out.outputs))
            self.params_n.observe(len(out.outputs))
        return step_tokens

    def _finished(
        self,
        tracked: _Tracked,
        out: RequestOutput,
        c: CompletionOutput,
        sample: _Sample,
        now: float,
        computed: int,
    ) -> None:
        reason = "error" if c.error else c.finish_reason
        if reason in self.success:
            self.success[reason].inc()
        m = out.metrics
        last = sample.last_token if sample.last_token is not None else now
        first = sample.first_token if sample.first_token is not None else last
        scheduled = first
        if m is not None and m.first_scheduled_time is not None:
            scheduled = min(m.first_scheduled_time, first)
        queued = min(m.arrival_time, scheduled) if m is not None else scheduled
        self.e2e.observe(max(0.0, now - tracked.arrival))
        self.queue_time.observe(scheduled - queued)
        self.prefill_time.observe(first - scheduled)
        self.decode_time.observe(last - first)
        self.inference_time.observe(last - scheduled)
        generated = len(c.token_ids)
        # vLLM leaves the first token (the prefill's) out of the mean.
        self.tpot.observe((last - first) / (generated - 1) if generated > 1 else 0.0)
        self.num_preemptions.observe(c.num_preemptions)
        self.prefill_kv_computed.observe(computed)
        self.prompt_hist.observe(len(out.prompt_token_ids))
        self.generation_hist.observe(generated)
        if tracked.max_tokens:  # vLLM skips a request without one
            self.params_max_tokens.observe(tracked.max_tokens)
