"""Decode steps of a Llama-family model on the CPU, fused: a handful of numba calls per layer
instead of ~60 torch ops (kernels/cpu_decode_jit.py says why).

A step takes this path when every token in it is a decode token (one per sequence, at most
MAX_ROWS of them), the weights are in numba's quantized layout (kernels/cpu_gemv.py: a
GGUF model on a bfloat16 CPU engine) and the KV pool is bfloat16. Anything else (prefill chunks,
mixed steps, dense or float32 weights, an fp8 pool, Gemma's layers) keeps the torch forward.

Per layer, each call's output is the next one's input, in float32 (the residual stream stays
float32 here, where the torch path rounds it to bfloat16 after every op):

    add_norm_quantize   h += down of the layer before; x = RMSNorm(h); x -> int8 per 32
    project             qkv = x @ Wqkv (one call per matrix: a Q4_K q/k beside a Q6_K v is two)
    rope_store_attend   bias, q/k norm, RoPE, K/V into the pool, paged attention, -> int8
                        (on several threads: rows shared out, for batches)
    project             o
    add_norm_quantize   h += o; x = RMSNorm(h) -> int8
    project             gate_up
    silu_mul_quantize   silu(gate) * up -> int8
    project             down
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt
import torch

from kvscope.engine.model.attention import AttentionMetadata
from kvscope.engine.model.linear import Linear, SplitLinear
from kvscope.engine.model.parallel_choice import ParallelChoice
from kvscope.engine.quant.cpu_layout import CpuQuantLinear
from kvscope.kernels import cpu_decode, cpu_gemv

# Decode rows the fused path takes (the engine's default max_num_seqs). Its int8 matmuls cost
# about linearly in the rows, yet beat the torch path's float32 GEMM on dequantized weights
# there: bundled model, one thread, greedy decode tokens/s fused vs torch at 40 rows 103 vs 55,
# 48 rows 133 vs 87, 64 rows 104 vs 68 (the torch path keeps the int8 kernel up to 32 rows).
MAX_ROWS = 64

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kvscope.engine.kv.kv_cache import KVCache
    from kvscope.engine.model.fusable import FusableLayer, FusableModel


class _Kernel(Protocol):
    """A numba dispatcher of kernels/cpu_decode.py's namespace: called, or compiled for the
    types of given arguments (`_bound`)."""

    def __call__(self, *args: object) -> object: ...

    def typeof_pyval(self, value: object) -> object: ...

    def compile(self, signature: tuple[object, ...]) -> Callable[..., object]: ...


# A plan's call: a kernel and its arguments; once bound, the kernel compiled for them.
_Call = tuple[_Kernel, tuple[object, ...]]
_BoundCall = tuple[Callable[..., object], tuple[object, ...]]
# Each layer's K and V pool as bfloat16 bits.
_PoolViews = list[tuple[npt.NDArray[np.uint16], npt.NDArray[np.uint16]]]


@dataclass(frozen=True)
class _Matrix:
    w: cpu_gemv.QuantizedCodesT
    col0: int  # its first output column within the projection


@dataclass(frozen=True)
class _Projection:
    matrices: tuple[_Matrix, ...]
    n: int
    k: int
    bias: np.ndarray  # float32 [n], or empty

    @classmethod
    def of(cls, linear: Linear | SplitLinear) -> _Projection | None:
        parts = linear.parts if isinstance(linear, SplitLinear) else [linear]
        matrices, biases, col0 = [], [], 0
        for part in parts:
            w = part.weight
            if not isinstance(w, CpuQuantLinear) or w.gemv is None:
                return None
            matrices.append(_Matrix(w.gemv, col0))
            col0 += w.n
            if part.bias is not None:
                biases.append(part.bias.float().numpy())
        if biases and len(biases) != len(parts):
            return None  # some parts with a bias, some without: not a layout the loader makes
        ks = {m.w.k for m in matrices}
        if len(ks) != 1:
            return None
        bias = np.concatenate(biases) if biases else np.zeros(0, np.float32)
        return cls(tuple(matrices), col0, ks.pop(), np.ascontiguousarray(bias, np.float32))


def _vector(t: torch.Tensor | None) -> np.ndarray:
    if t is None:
        return np.zeros(0, np.float32)
    return np.ascontiguousarray(t.float().numpy())


def _decode_tensors(meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode step's block tables and lengths: set, as `accepts` took decode tokens only."""
    tables, lens = meta.decode_block_tables, meta.decode_seq_lens
    assert tables is not None and lens is not None
    return tables, lens


@dataclass(frozen=True)
class _Layer:
    input_norm: np.ndarray
    post_norm: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray
    qkv: _Projection
    o: _Projection
    gate_up: _Projection
    down: _Projection
    window: int  # 0: full attention
    scale: float

    @classmethod
    def of(cls, layer: FusableLayer) -> _Layer | None:
        qkv, o, gate_up, down = [_Projection.of(p) for p in layer.projections()]
        if qkv is None or o is None or gate_up is None or down is None:
            return None
        return cls(
            _vector(layer.input_norm),
            _vector(layer.post_norm),
            _vector(layer.q_norm),
            _vector(layer.k_norm),
            qkv,
            o,
            gate_up,
            down,
            window=layer.sliding_window or 0,
            scale=float(layer.scale),
        )


class FusedCpuDecode:
    """A LlamaModel's decode steps through kernels/cpu_decode_jit.py (see the module doc)."""

    def __init__(self, model: FusableModel, layers: list[_Layer], ns: SimpleNamespace) -> None:
        cfg = model.cfg
        self.ns = ns
        self.layers = layers
        self.eps = float(cfg.rms_norm_eps)
        self.hq, self.hkv, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.hidden = cfg.hidden_size
        self.final_norm = _vector(model.norm)
        self.embed = weakref.WeakMethod(model.embed_tokens)  # a strong one is a cycle only gc frees
        self.rope = model.rope
        # float32 hidden states straight into a quantized head: its kernel takes them as they
        # are (0.37 ms a step less than via bfloat16 on the bundled head) and the logits keep
        # float32 precision; a dense head wants the model's dtype.
        head = model.lm_head.weight
        self.out_dtype = torch.float32 if isinstance(head, CpuQuantLinear) else model.dtype
        self._pool_views: tuple[int, _PoolViews] | None = None
        # Threads or one, by measurement (engine/model/parallel_choice.py says why).
        self.choice = ParallelChoice(torch.get_num_threads())
        self._plans: dict[tuple[int, bool, int], _Plan] = {}

    @classmethod
    def for_model(cls, model: FusableModel) -> FusedCpuDecode | None:
        """The fused path for `model`, or None where its weights or shapes do not fit it."""
        cfg = model.cfg
        if model.device.type != "cpu" or model.dtype != torch.bfloat16:
            return None
        if cfg.head_dim % 2 or cfg.num_heads % cfg.num_kv_heads:
            return None
        found = [_Layer.of(layer) for layer in model.layers]
        layers = [lay for lay in found if lay is not None]
        if not layers or len(layers) != len(found):
            return None
        ns = cpu_decode.load()
        if ns is None:
            return None
        fused = cls(model, layers, ns)
        fused.warm_up()
        return fused

    def warm_up(self) -> None:
        """Compile (or load from numba's cache) the matmul entries for each kind of matrix the
        model has, on its own weights: the first decode step then does not wait for them."""
        threads = torch.get_num_threads()
        tables = [self.ns.project] + ([self.ns.project_parallel] if threads > 1 else [])
        seen = set()
        for layer in self.layers:
            for p in (layer.qkv, layer.o, layer.gate_up, layer.down):
                for mat in p.matrices:
                    w = mat.w
                    # super-block scales (a tuple) come in one pair of types
                    scales = w.scale.dtype if isinstance(w.scale, np.ndarray) else type(w.scale)
                    kind = (w.bits, w.codes.dtype, w.codes.ndim, scales, type(w.low))
                    if kind in seen:
                        continue
                    seen.add(kind)
                    r = _Buffers(1).rounded_as(p.k, w.act_group)
                    for a in r[:3]:
                        a.fill(0)
                    y = np.empty((1, p.n), np.float32)
                    for table in tables:
                        args = (w.codes, w.scale, w.low, w.group, w.n, *r[:3], y, mat.col0)
                        table[w.bits](*args)

    def accepts(
        self, num_tokens: int, metas: Sequence[AttentionMetadata], kv_cache: KVCache
    ) -> bool:
        return (
            0 < num_tokens <= MAX_ROWS
            and kv_cache.dtype == torch.bfloat16
            and all(
                isinstance(m, AttentionMetadata) and m.num_decode_tokens == num_tokens
                for m in metas
            )
        )

    def _pools(self, kv_cache: KVCache) -> _PoolViews:
        """Each layer's K and V pool as bfloat16 bits, views made once per pool. A new pool
        drops the plans made for the old one: their views would keep its memory alive."""
        key = kv_cache.data.data_ptr()
        if self._pool_views is None or self._pool_views[0] != key:
            self._plans.clear()
            views: _PoolViews = []
            for i in range(len(self.layers)):
                k, v = (t.view(torch.int16).numpy().view(np.uint16) for t in kv_cache.layer(i))
                views.append((k, v))
            self._pool_views = (key, views)
        return self._pool_views[1]

    def __call__(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: KVCache,
        metas: Sequence[AttentionMetadata],
    ) -> torch.Tensor:
        """Hidden states after the final norm, [T, hidden], as LlamaModel.forward returns them
        (float32 where the head is quantized: see `out_dtype`)."""
        m = input_ids.shape[0]
        threads = torch.get_num_threads()
        if self.choice.threads != threads:
            self.choice = ParallelChoice(threads)
        parallel = self.choice.for_step(m)
        started = time.perf_counter()
        if parallel:
            self.ns.numba.set_num_threads(min(threads, self.ns.numba.config.NUMBA_NUM_THREADS))
        width = max(int(_decode_tensors(meta)[0].shape[1]) for meta in metas)
        plan = self._plan(m, parallel, kv_cache, len(metas), width)
        embed = self.embed()
        assert embed is not None  # the model is alive: it is the one calling
        plan.h[:] = embed(input_ids).float().numpy()
        for t, dest in zip(self.rope.cos_sin(positions), (plan.cos, plan.sin), strict=True):
            dest[:] = t.reshape(m, self.head_dim).numpy()
        for meta, (slots, tables, lens) in zip(metas, plan.groups, strict=True):
            slots[:] = meta.slot_mapping.numpy()
            decode_tables, decode_lens = _decode_tensors(meta)
            tables[:, : decode_tables.shape[1]] = decode_tables.numpy()
            lens[:] = decode_lens.numpy()
        for fn, args in plan.calls:
            fn(*args)
        self.choice.record(m, parallel, time.perf_counter() - started)
        return torch.from_numpy(plan.out.copy()).to(self.out_dtype)

    def _plan(self, m: int, parallel: bool, kv_cache: KVCache, groups: int, width: int) -> _Plan:
        """The step's calls with their arrays, made once per batch size and reused: a step then
        copies its inputs in and runs ~8 calls a layer with nothing to look up: the Python
        between the kernels is what a step built afresh each time spends."""
        pools = self._pools(kv_cache)  # first: a new pool clears the plans
        key = (m, parallel, groups)
        plan = self._plans.get(key)
        if plan is None or plan.width < width:
            plan = self._build_plan(m, parallel, pools, kv_cache, groups, width * 2)
            self._plans[key] = plan
        return plan

    def _build_plan(
        self,
        m: int,
        parallel: bool,
        pools: _PoolViews,
        kv_cache: KVCache,
        groups: int,
        width: int,
    ) -> _Plan:
        ns = self.ns
        project = ns.project_parallel if parallel else ns.project
        # Threads take rows: one row's attention runs on one thread either way.
        attend_fn = ns.rope_store_attend_parallel if parallel and m > 1 else ns.rope_store_attend
        buffers = _Buffers(m)
        h = buffers.out("h", self.hidden)
        cos, sin = buffers.out("cos", self.head_dim), buffers.out("sin", self.head_dim)
        group_inputs = [
            (np.zeros(m, np.int64), np.zeros((m, width), np.int32), np.ones(m, np.int32))
            for _ in range(groups)
        ]
        x = buffers.x(self.hidden)
        calls: list[_Call] = []
        delta = h[:0]
        for i, layer in enumerate(self.layers):
            r = buffers.rounded(layer.qkv)
            calls.append(
                (ns.add_norm_quantize, (h, delta, layer.input_norm, self.eps, r.group, x, *r[:3]))
            )
            qkv = buffers.out("qkv", layer.qkv.n)
            calls += self._project(project, layer.qkv, x, r, buffers, qkv)
            slots, tables, lens = group_inputs[kv_cache.group_of(i) if groups > 1 else 0]
            k_pool, v_pool = pools[i]
            attn = buffers.out("attn", self.hq * self.head_dim)
            r = buffers.rounded(layer.o)
            attend = (
                qkv,
                layer.qkv.bias,
                layer.q_norm,
                layer.k_norm,
                self.eps,
                cos,
                sin,
                k_pool,
                v_pool,
                slots,
                tables,
                lens,
                layer.window,
                np.float32(layer.scale),  # a float64 scale made the score loop 2x slower
                self.hq,
                self.hkv,
                attn,
                r.group,
                *r[:3],
            )
            calls.append((attend_fn, attend))
            o = buffers.out("o", layer.o.n)
            calls += self._project(project, layer.o, attn, r, buffers, o)
            r = buffers.rounded(layer.gate_up)
            calls.append(
                (ns.add_norm_quantize, (h, o, layer.post_norm, self.eps, r.group, x, *r[:3]))
            )
            gate_up = buffers.out("gate_up", layer.gate_up.n)
            calls += self._project(project, layer.gate_up, x, r, buffers, gate_up)
            act = buffers.out("act", layer.down.k)
            r = buffers.rounded(layer.down)
            calls.append((ns.silu_mul_quantize, (gate_up, act, r.group, *r[:3])))
            delta = buffers.out("down", layer.down.n)
            calls += self._project(project, layer.down, act, r, buffers, delta)
        out = buffers.out("out", self.hidden)
        calls.append((ns.add_rows, (h, delta)))
        calls.append((ns.norm_rows, (h, self.final_norm, self.eps, out)))
        bound = [_bound(fn, args) for fn, args in calls]
        return _Plan(h, cos, sin, group_inputs, bound, out, width)

    def _project(
        self,
        project: Mapping[int, _Kernel],
        p: _Projection,
        x: np.ndarray,
        r: _Rounded,
        buffers: _Buffers,
        y: np.ndarray,
    ) -> list[_Call]:
        """The calls for y = x @ p from `r`, x rounded per p's first matrix's activation group;
        a matrix with another group (a Q6_K v's 16 beside a Q4_K q's 32) rounds x its own way
        first."""
        calls: list[_Call] = []
        for mat in p.matrices:
            w = mat.w
            if w.act_group != r.group:
                r = buffers.rounded_as(p.k, w.act_group)
                calls.append((self.ns.quantize_rows, (x, w.act_group, *r[:3])))
            args = (w.codes, w.scale, w.low, w.group, w.n, *r[:3], y, mat.col0)
            calls.append((project[w.bits], args))
        return calls


def _bound(fn: _Kernel, args: tuple[object, ...]) -> _BoundCall:
    """(the compiled function for exactly these arguments' types, args): a plan passes the same
    arrays every step, so numba's dispatcher (typing ~10 arguments, then a lookup) need not run
    240 times a step; the types are resolved once here as the dispatcher would resolve them.
    Measured: 12.1 -> 10.3 ms for a bundled-model step's calls at one thread (while another
    process ran: the absolute times are high, the difference is the dispatch)."""
    signature = tuple(fn.typeof_pyval(a) for a in args)
    return fn.compile(signature), args


@dataclass(frozen=True)
class _Plan:
    """One batch size's arrays and calls (FusedCpuDecode._plan)."""

    h: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    groups: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # slots, block tables, lengths
    calls: list[_BoundCall]
    out: np.ndarray
    width: int  # block-table entries the tables arrays hold


class _Rounded(NamedTuple):
    """Activations rounded to int8 per group (kernels/cpu_gemv_jit.quantize_rows)."""

    xq: np.ndarray
    xd: np.ndarray
    xs: np.ndarray
    group: int


class _Buffers:
    """One step's scratch arrays, by name and width."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self._arrays: dict[tuple[str, int], np.ndarray] = {}

    def out(self, name: str, width: int) -> np.ndarray:
        return self._get(name, width, np.float32)

    def x(self, width: int) -> np.ndarray:
        return self._get("x", width, np.float32)

    def rounded(self, p: _Projection) -> _Rounded:
        """Buffers for p's input, rounded per its first matrix's activation group."""
        return self.rounded_as(p.k, p.matrices[0].w.act_group)

    def rounded_as(self, k: int, group: int) -> _Rounded:
        return _Rounded(
            self._get(f"xq{group}", k, np.int8),
            self._get(f"xd{group}", k // group, np.float32),
            self._get(f"xs{group}", k // group, np.float32),
            group,
        )

    def _get(self, name: str, width: int, dtype: npt.DTypeLike) -> np.ndarray:
        key = (name, width)
        arr = self._arrays.get(key)
        if arr is None:
            arr = self._arrays[key] = np.empty((self.rows, width), dtype)
        return arr
