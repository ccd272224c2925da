"""Simulated users for the block map: a closed-loop load generator (pure logic, no Qt).

Each of `num_users` users sends one request, waits for it to finish, thinks, and sends the next.
Think times are exponential with mean num_users / arrival_rate_per_s, so while every user is
thinking requests arrive as a Poisson process at arrival_rate_per_s; a busy engine slows the
loop down, as real users would be. Every user draws from its own seeded random stream, so a
user's k-th request (text, lengths, think time) is the same in every run whatever the engine's
timing. With `shared_system_prompt` every prompt starts with the same long system prompt, which
the prefix cache serves from shared blocks.

The worker calls `due(now)` each loop, passes each request to `engine.add_request(
request_id, prompt, params)` (or applies the chat template to `messages` first) and reports
finished requests with `on_finished(request_id)`.

`fit_to_context` clamps a spec's lengths to the engine's max_seq_len, so no request is refused
for its length; `plan_preemption_demo` sizes a spec to the pool and to this machine's measured
speed (app/desktop/simulated_users/step_speed.py) so that the paged engine runs dry and preempts
within seconds, and says when; `describe_progress` says how many submitted requests run and how many
wait.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, replace
from functools import lru_cache

from kvscope.app.core.paths import ASSETS_DIR
from kvscope.app.core.request_ids import load_request_id
from kvscope.app.desktop.simulated_users.step_speed import DEFAULT_SPEED, MachineSpeed
from kvscope.engine import SamplingParams

# Characters per token, measured with SmolLM2's tokenizer on these texts: prompts are sized
# roughly (within ~10%), never tokenized here.
PROSE_CHARS_PER_TOKEN = 4.8
SYSTEM_CHARS_PER_TOKEN = 3.7  # the agent prompt is JSON, denser in tokens
SYSTEM_SHARE = 0.75  # the shared system prompt takes this share of the shortest prompt
TEMPERATURE = 0.8
MAX_USERS = 1024
MAX_TOKENS = 1 << 20
MAX_RATE = 100.0  # requests/s: the panel's box goes this far
# A drawn prompt length is a target: the text and the chat template may come out this much
# longer (measured within ~10%, plus the template's role markers).
PROMPT_SLACK = 1.15
TEMPLATE_TOKENS = 24
MIN_PROMPT_TOKENS = 16  # the panel's least prompt length
# The preemption preset: its first preemption within about DEMO_TARGET_S of Start, prompts
# filling DEMO_PROMPT_FILL of the pool (room for the template's and the text's slack), replies
# that need DEMO_OVERRUN times the pool in all; drawn lengths in [DEMO_SPREAD x, x].
DEMO_TARGET_S = 20.0
DEMO_TOO_SLOW = 1.5  # past this many targets, suggest a smaller pool
DEMO_PROMPT_FILL = 0.8
DEMO_OVERRUN = 1.2
DEMO_SPREAD = 0.9
# At most this many users: a step of 16 decodes is near what chats (n=3) and the panel's default
# 4 users let the meter see; past it the measured per-sequence cost extrapolates badly (from
# batches of 1-5: 1.4 ms a sequence; at 64 on this machine: 29 ms).
DEMO_MAX_USERS = 16


def _check_range(name: str, value: object) -> tuple[int, int]:
    if (
        isinstance(value, (tuple, list))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and 1 <= value[0] <= value[1] <= MAX_TOKENS
    ):
        return int(value[0]), int(value[1])
    raise ValueError(
        f"{name} must be (min, max) ints with 1 <= min <= max <= {MAX_TOKENS}, got {value!r}"
    )


@dataclass(frozen=True)
class LoadSpec:
    num_users: int = 4
    prompt_tokens: tuple[int, int] = (256, 768)
    output_tokens: tuple[int, int] = (64, 256)
    shared_system_prompt: bool = True
    arrival_rate_per_s: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.num_users, int) or not 1 <= self.num_users <= MAX_USERS:
            raise ValueError(
                f"num_users must be an int in [1, {MAX_USERS}], got {self.num_users!r}"
            )
        object.__setattr__(self, "prompt_tokens", _check_range("prompt_tokens", self.prompt_tokens))
        object.__setattr__(self, "output_tokens", _check_range("output_tokens", self.output_tokens))
        if not isinstance(self.shared_system_prompt, bool):
            raise ValueError(
                f"shared_system_prompt must be True or False, got {self.shared_system_prompt!r}"
            )
        rate = self.arrival_rate_per_s
        if not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
            raise ValueError(f"arrival_rate_per_s must be a finite number > 0, got {rate!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")

    @property
    def system_prompt_tokens(self) -> int:
        """Approximate length of the shared system prompt (0 without one)."""
        return int(self.prompt_tokens[0] * SYSTEM_SHARE) if self.shared_system_prompt else 0


@dataclass(frozen=True)
class LoadRequest:
    request_id: str  # load_request_id(user, k): "load-{user}/{k}"
    user: int
    prompt: str  # plain text: system prompt (if any), blank line, the user's message
    messages: tuple[dict, ...]  # the same as chat messages, for the chat template
    params: SamplingParams
    prompt_tokens: int  # the drawn target length (the text is sized to it roughly)
    arrival_time: float


@lru_cache(maxsize=1)
def _corpus() -> tuple[str, tuple[str, ...]]:
    """(agent system prompt, chat questions) from the bundled workload."""
    workload = json.loads((ASSETS_DIR / "chat_mixed.json").read_text(encoding="utf-8"))
    questions = tuple(c["messages"][-1]["content"] for c in workload["chat"])
    return workload["agent"]["system_prompt"], questions


def _cut(text: str, chars: int) -> str:
    """Text cut to about `chars` characters at a word boundary."""
    if len(text) <= chars:
        return text
    cut = text.rfind(" ", 0, chars)
    return text[: cut if cut > chars // 2 else chars]


def system_prompt(tokens: int) -> str:
    """The shared system prompt, about `tokens` long: the bundled agent prompt, repeated if
    needed. The same for every user and every seed."""
    agent, _ = _corpus()
    chars = int(tokens * SYSTEM_CHARS_PER_TOKEN)
    return _cut((agent + "\n") * (chars // (len(agent) + 1) + 1), chars).rstrip()


def _user_text(rng: random.Random, user: int, k: int, tokens: int) -> str:
    """A user message of about `tokens` tokens: context notes, then a question. It opens with
    the user and request number, so different requests never share a first block by chance."""
    _, questions = _corpus()
    head = f"User {user}, request {k}. "
    question = rng.choice(questions)
    budget = int(tokens * PROSE_CHARS_PER_TOKEN) - len(head) - len(question) - 12
    notes: list[str] = []
    while budget > 0 and sum(len(n) + 1 for n in notes) < budget:
        notes.append(rng.choice(questions))
    context = _cut(" ".join(notes), max(budget, 0))
    body = f"Context: {context}\n\n" if context else ""
    return f"{head}{body}Question: {question}"


class LoadGenerator:
    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.stopped = False
        self.num_sent = 0
        self.in_flight: dict[str, int] = {}  # request id -> user
        self._rngs = [random.Random(spec.seed * 1_000_003 + u) for u in range(spec.num_users)]
        self._next_at: list[float | None] = [None] * spec.num_users
        self._count = [0] * spec.num_users
        self._start: float | None = None
        self._now = 0.0
        self._system = system_prompt(spec.system_prompt_tokens) if spec.shared_system_prompt else ""

    def _think_time(self, user: int) -> float:
        return self._rngs[user].expovariate(self.spec.arrival_rate_per_s / self.spec.num_users)

    def due(self, now: float) -> list[LoadRequest]:
        """Requests whose arrival time has come, in arrival order; each user at most one."""
        self._now = now
        if self._start is None:  # the clock starts at the first call
            self._start = now
            self._next_at = [now + self._think_time(u) for u in range(self.spec.num_users)]
        if self.stopped:
            return []
        ready = sorted((t, u) for u, t in enumerate(self._next_at) if t is not None and t <= now)
        return [self._make(u, t) for t, u in ready]

    def _make(self, user: int, arrival: float) -> LoadRequest:
        rng, spec = self._rngs[user], self.spec
        k = self._count[user]
        self._count[user] += 1
        self._next_at[user] = None
        prompt_tokens = rng.randint(*spec.prompt_tokens)
        output_tokens = rng.randint(*spec.output_tokens)
        seed = rng.randrange(2**31)
        text = _user_text(rng, user, k, max(prompt_tokens - spec.system_prompt_tokens, 1))
        messages: tuple[dict, ...] = ({"role": "user", "content": text},)
        prompt = text
        if self._system:
            messages = ({"role": "system", "content": self._system}, *messages)
            prompt = f"{self._system}\n\n{text}"
        request_id = load_request_id(user, k)
        self.in_flight[request_id] = user
        self.num_sent += 1
        params = SamplingParams(
            max_tokens=output_tokens, temperature=TEMPERATURE, ignore_eos=True, seed=seed
        )
        return LoadRequest(request_id, user, prompt, messages, params, prompt_tokens, arrival)

    def on_finished(self, request_id: str, now: float | None = None) -> None:
        """A request ended (finished or aborted): its user thinks, then sends the next one.
        `now` defaults to the time of the latest due() call. Unknown ids are ignored, so the
        worker may report every finished request, not only the generator's."""
        user = self.in_flight.pop(request_id, None)
        if user is None:
            return
        start = self._now if now is None else now
        self._next_at[user] = start + self._think_time(user)

    def stop(self) -> None:
        """No new requests from now on; those in flight are left to finish (or to abort)."""
        self.stopped = True

    def next_arrival(self) -> float | None:
        """When the next request becomes due (None if stopped or all users are waiting)."""
        pending = [t for t in self._next_at if t is not None]
        return None if self.stopped or not pending else min(pending)


def fit_to_context(spec: LoadSpec, max_seq_len: int) -> LoadSpec:
    """The spec with lengths cut so that prompt + output fits max_seq_len (the engine refuses
    a prompt that leaves no room, and stops a reply at the limit). Outputs keep at most half
    of the context; prompts take what is left, allowing for PROMPT_SLACK and the template."""
    room = max(2, max_seq_len - TEMPLATE_TOKENS)
    out_hi = max(1, min(spec.output_tokens[1], room // 2))
    out_lo = min(spec.output_tokens[0], out_hi)
    prompt_cap = max(1, int((room - out_hi) / PROMPT_SLACK))
    prompt_hi = min(spec.prompt_tokens[1], prompt_cap)
    prompt_lo = min(spec.prompt_tokens[0], prompt_hi)
    return replace(spec, prompt_tokens=(prompt_lo, prompt_hi), output_tokens=(out_lo, out_hi))


@dataclass(frozen=True)
class DemoPlan:
    """The preemption preset: the load, and when its first preemption should show."""

    spec: LoadSpec
    prefill_s: float  # the prompts' prefill, at the measured rate
    first_preemption_s: float  # prefill, then decoding until the pool runs dry
    pool_tokens: int
    # A pool that shows it within the target here, when this one takes much longer; else None.
    suggested_pool_tokens: int | None = None


def _demo_for(users: int, pool: int, max_seq_len: int, speed: MachineSpeed) -> DemoPlan | None:
    """`users` private prompts filling DEMO_PROMPT_FILL of the pool, outputs as long as the
    context allows; None when their replies would not overrun the pool."""
    prompt = int(DEMO_PROMPT_FILL * pool / users / PROMPT_SLACK) - TEMPLATE_TOKENS
    prompt = min(prompt, int((max_seq_len - TEMPLATE_TOKENS) / 2 / PROMPT_SLACK))
    if prompt < MIN_PROMPT_TOKENS:
        return None
    room = max(2, max_seq_len - TEMPLATE_TOKENS)  # as fit_to_context keeps it: half for replies
    output = min(max_seq_len - int(prompt * PROMPT_SLACK) - TEMPLATE_TOKENS, room // 2)
    # What a request takes on average: drawn lengths in [DEMO_SPREAD x, x], the template on top.
    mean = (1 + DEMO_SPREAD) / 2
    prompt_held = users * (mean * prompt + TEMPLATE_TOKENS)
    if users * (prompt_held / users + mean * output) < DEMO_OVERRUN * pool:
        return None  # they would finish before the pool runs dry
    spec = LoadSpec(
        num_users=users,
        prompt_tokens=(max(MIN_PROMPT_TOKENS, int(prompt * DEMO_SPREAD)), prompt),
        output_tokens=(max(1, int(output * DEMO_SPREAD)), output),
        shared_system_prompt=False,
        arrival_rate_per_s=min(4.0 * users, MAX_RATE),  # everyone within about a second
    )
    prefill_s = prompt_held / speed.batch_prefill_tokens_per_s
    decode_steps = max(0.0, pool - prompt_held) / users  # each step adds a token to each
    total = prefill_s + decode_steps * speed.decode_step_s(users)
    return DemoPlan(fit_to_context(spec, max_seq_len), prefill_s, total, pool)


def plan_preemption_demo(
    num_blocks: int,
    block_size: int,
    max_seq_len: int,
    max_num_seqs: int = 64,
    speed: MachineSpeed = DEFAULT_SPEED,
    target_s: float = DEMO_TARGET_S,
) -> DemoPlan:
    """Users and lengths that overrun this pool soonest at this machine's speed: prompts fill
    most of it (prefill computes a token faster than decode), then the replies need more than
    is left, so while they decode the pool runs dry and the newest sequences are preempted.
    Among the user counts that overrun it, the one whose first preemption comes first (a bigger
    batch decodes more tokens a second). Filling the pool takes pool / prefill rate at least:
    when that is far past `target_s`, `suggested_pool_tokens` is a pool that would not be."""
    pool = num_blocks * block_size
    limit = max(2, min(max_num_seqs, DEMO_MAX_USERS))
    plans = [p for u in range(2, limit + 1) if (p := _demo_for(u, pool, max_seq_len, speed))]
    if not plans:  # too short a context, or too few users, to overrun it: the most that fit
        least = MIN_PROMPT_TOKENS * PROMPT_SLACK + TEMPLATE_TOKENS
        users = max(2, min(limit, int(DEMO_PROMPT_FILL * pool / least)))
        spec = LoadSpec(
            num_users=users,
            prompt_tokens=(MIN_PROMPT_TOKENS, MIN_PROMPT_TOKENS),
            output_tokens=(max_seq_len, max_seq_len),
            shared_system_prompt=False,
            arrival_rate_per_s=min(4.0 * users, MAX_RATE),
        )
        spec = fit_to_context(spec, max_seq_len)
        held = users * least
        prefill_s = held / speed.batch_prefill_tokens_per_s
        needs = held + users * spec.output_tokens[1]
        total = prefill_s + max(0, pool - held) / users * speed.decode_step_s(users)
        plans = [DemoPlan(spec, prefill_s, total if needs > pool else math.inf, pool)]
    best = min(plans, key=lambda p: p.first_preemption_s)
    if best.first_preemption_s <= DEMO_TOO_SLOW * target_s:
        return best
    # The time grows about linearly with the pool: scale it down, whole blocks, small enough
    # for `limit` users of a full context to overrun it (a pool under max_seq_len shortens the
    # context with it, which the rebuilt engine's plan allows for).
    suggested = limit * max_seq_len / (DEMO_OVERRUN + DEMO_PROMPT_FILL)
    if math.isfinite(best.first_preemption_s):
        suggested = min(suggested, pool * target_s / best.first_preemption_s)
    suggested = max(int(suggested) // block_size * block_size, 8 * block_size)
    return replace(best, suggested_pool_tokens=suggested if suggested < pool else None)


def preemption_demo(
    num_blocks: int,
    block_size: int,
    max_seq_len: int,
    max_num_seqs: int = 64,
    speed: MachineSpeed = DEFAULT_SPEED,
) -> LoadSpec:
    """The preset's load alone (see plan_preemption_demo)."""
    return plan_preemption_demo(num_blocks, block_size, max_seq_len, max_num_seqs, speed).spec


def describe_progress(in_flight: list[str], sequences: list[tuple[str, str]]) -> str:
    """The generator's requests in flight, "8 submitted: 3 running, 5 waiting", from the
    engine's sequences as (request id, status) pairs: a request runs if any of its samples
    does and waits if the engine lists it otherwise, the words the Sequences tile and the status
    bar use; one the engine does not list (sent since its last step, or finished in it) is
    "not in the engine yet", so "waiting" means the same number everywhere."""
    listed: dict[str, bool] = {}
    for request_id, status in sequences:
        listed[request_id] = listed.get(request_id, False) or status == "running"
    running = sum(listed.get(request_id, False) for request_id in in_flight)
    waiting = sum(request_id in listed for request_id in in_flight) - running
    line = f"{len(in_flight)} submitted: {running} running, {waiting} waiting"
    unlisted = len(in_flight) - running - waiting
    return f"{line}, {unlisted} not in the engine yet" if unlisted else line
