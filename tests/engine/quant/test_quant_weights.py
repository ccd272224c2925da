"""Quantized weights: GGUF blocks held exactly, kept-quantized forwards against the dequantized
reference, round-to-nearest quantization, the CPU kernel layout, and unsupported types."""

import gguf
import numpy as np
import pytest
import torch
from tiny_models import QUANT_TYPES, make_quant_gguf, make_tiny_model, random_quant_blocks

import kvscope.engine.model.gguf.loader as gguf_loader
from kvscope.engine import LLM, SamplingParams
from kvscope.engine.model.loader import load_model
from kvscope.engine.quant.cpu_layout import (
    KERNEL_ENV,
    KERNEL_TILE_WIDTHS,
    _pack_codes,
    cpu_layout,
    gemv_kernels,
    kernel_tile_width,
)
from kvscope.engine.quant.gguf_blocks import decode_blocks, to_quantized_tensor
from kvscope.engine.quant.rtn import quantize_rtn
from kvscope.kernels.quant_format import cat_rows, quantized_matmul_torch


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_packed_format_holds_every_gguf_type_exactly(qtype):
    rows, cols = 24, 512
    raw = random_quant_blocks(qtype, rows, cols, seed=3)
    gtype = gguf.GGMLQuantizationType[qtype]
    reference = gguf.quants.dequantize(raw, gtype).reshape(rows, cols)
    w = to_quantized_tensor(decode_blocks(raw, gtype, cols), (rows, cols), qtype)
    assert torch.equal(w.dequantize(), torch.from_numpy(reference))  # bit for bit
    # Row subsets (the embedding's lookups) and stacking (fused q/k/v) keep the values.
    ids = torch.tensor([5, 0, 23, 5])
    assert torch.equal(w.dequantize(rows=ids), torch.from_numpy(reference)[ids])
    both = cat_rows([w, w])
    assert torch.equal(both.dequantize(), torch.from_numpy(np.concatenate([reference] * 2)))


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_chunked_streaming_read_equals_one_piece(tmp_path, monkeypatch, qtype):
    """A file is converted a few rows at a time; the chunk boundary must not show."""
    path = make_quant_gguf(tmp_path / f"{qtype}.gguf", qtype)
    whole = load_model(path).read_all("auto")
    monkeypatch.setattr(gguf_loader, "CHUNK_ELEMENTS", 3 * 256)  # 3 rows per chunk
    chunked = load_model(path).read_all("auto")
    for name, w in whole.items():
        if isinstance(w, torch.Tensor):
            assert torch.equal(w, chunked[name])
        else:
            assert torch.equal(w.dequantize(), chunked[name].dequantize()), name
            assert w.nbytes == chunked[name].nbytes


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_kept_quantized_forward_matches_dequantized_reference(tmp_path, qtype, monkeypatch):
    """float32 activations: the weights are the same numbers either way, so logits differ only by
    matmul summation order (~1e-6 relative); 1e-4 absolute on logits of size ~1 leaves a margin.
    bfloat16 through the CPU int4 kernel rounds activations and scales to 8 significant bits:
    its logits stay within a few percent of the logit range."""
    path = make_quant_gguf(tmp_path / f"{qtype}.gguf", qtype)
    loaded = load_model(path)
    prompt = list(range(3, 40))
    params = SamplingParams(temperature=0, max_tokens=4, logprobs=5)
    kw = dict(device="cpu", num_kv_blocks=16)
    ref_llm = LLM(model=loaded, dtype="float32", quantization="none", **kw)
    # float32 over quantized weights dequantizes at load when that fits (next test); the
    # per-call path is what remains when it does not: make it not fit.
    with monkeypatch.context() as m:
        m.setattr("kvscope.engine.llm_engine.free_memory", lambda device: 1)
        kept_llm = LLM(model=loaded, dtype="float32", quantization="auto", **kw)
    assert ref_llm.stats()["weight_layout"] == "dense"
    assert kept_llm.stats()["weight_layout"] == "dequant-per-call"
    assert "on every call" in kept_llm.stats()["weight_choice"]
    assert kept_llm.stats()["weight_format"] == qtype
    assert kept_llm.stats()["weight_bytes"] < ref_llm.stats()["weight_bytes"] / 2.5

    def logits(llm):
        engine = llm.engine
        return engine.model.compute_logits(_hidden(engine, prompt))

    ref, kept = logits(ref_llm), logits(kept_llm)
    assert (kept - ref).abs().max() < 1e-4
    out_ref = ref_llm.generate([prompt], params)[0].outputs[0]
    out_kept = kept_llm.generate([prompt], params)[0].outputs[0]
    assert out_kept.token_ids == out_ref.token_ids

    fast = LLM(model=loaded, quantization="auto", **kw)  # CPU default: bfloat16, int4 kernel
    assert fast.stats()["dtype"] == "bfloat16"
    layout = fast.stats()["weight_layout"]
    if gemv_kernels() is not None:  # numba's layout takes every format, Q6_K's 16-groups too
        assert layout == "cpu-gemv"
    else:
        assert layout == ("cpu-bf16-dense" if qtype == "Q6_K" else "cpu-int4")
    bf16 = logits(fast)
    assert (bf16 - ref).abs().max() < 0.05 * (ref.max() - ref.min())


def _hidden(engine, prompt):
    """Last-position hidden state of one prompt through a scratch pool (no scheduler)."""
    from kvscope.engine.kv.kv_cache import KVCache
    from kvscope.engine.model.attention import AttentionMetadata

    mc, model = engine.model_config, engine.model
    n, bs = len(prompt), 16
    pool = KVCache(mc.num_layers, -(-n // bs), bs, mc.num_kv_heads, mc.head_dim, model.dtype, "cpu")
    meta = AttentionMetadata.single_prefill(n, bs, "cpu")
    hidden = model.forward(torch.tensor(prompt), torch.arange(n), pool, meta)
    return hidden[-1:]


def test_bundled_model_greedy_tokens_identical_kept_quantized(
    default_model_lazy, chat_prompts, monkeypatch
):
    """The bundled Q4_1/Q8_0 file, float32 activations: kept-quantized == dequantized, and by
    default (the dense weights fit) dequantized once at load, not on every call."""
    kw = dict(device="cpu", dtype="float32", num_kv_blocks=64)
    ref = LLM(model=default_model_lazy, quantization="none", **kw)
    default = LLM(model=default_model_lazy, **kw)
    assert (default.stats()["weight_layout"], default.stats()["weight_format"]) == (
        "dense",
        "float32",
    )
    assert "dequantized once at load" in default.stats()["weight_choice"]
    assert ref.stats()["weight_choice"] == ""  # nothing was chosen: the user said "none"
    assert default.stats()["weight_bytes"] == ref.stats()["weight_bytes"]
    with monkeypatch.context() as m:  # the dense weights do not fit: per call, and said so
        m.setattr("kvscope.engine.llm_engine.free_memory", lambda device: 1)
        kept = LLM(model=default_model_lazy, quantization="auto", **kw)
    assert kept.stats()["weight_format"] == "Q4_1+Q8_0"
    assert kept.stats()["weight_layout"] == "dequant-per-call"
    params = SamplingParams(temperature=0, max_tokens=16)
    prompts = [
        kept.engine.apply_chat_template([{"role": "user", "content": p}]) for p in chat_prompts[:3]
    ]
    outs = [llm.generate(prompts, params) for llm in (ref, default, kept)]
    for a, b, c in zip(*outs, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids == c.outputs[0].token_ids


@pytest.mark.parametrize("bits", [4, 8])
def test_round_to_nearest_quantization(bits):
    torch.manual_seed(0)
    w = torch.randn(96, 384)
    q = quantize_rtn(w, bits, 128)
    top = (1 << bits) - 1
    g = w.view(96, 3, 128)
    step = (g.amax(-1) - g.amin(-1)) / top
    err = (q.dequantize() - w).view(96, 3, 128).abs()
    # Half a grid step, plus float16 rounding of the stored scale and offset.
    assert (err <= step[..., None] * 0.5 + 2e-3 * g.abs().amax(-1, keepdim=True)).all()
    assert q.nbytes == 96 * 384 * bits // 8 + 96 * 3 * 4


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_hf_folder_quantized_at_load(tmp_path, default_model, quantization):
    folder = make_tiny_model("llama", tmp_path / "m", tokenizer=default_model.tokenizer)
    kw = dict(device="cpu", dtype="float32", num_kv_blocks=16)
    dense = LLM(model=str(folder), **kw)
    quant = LLM(model=str(folder), quantization=quantization, **kw)
    assert dense.stats()["weight_format"] == "float32"
    assert quant.stats()["weight_format"] == quantization
    assert quant.stats()["weight_bytes"] < dense.stats()["weight_bytes"] / 2
    params = SamplingParams(temperature=0, max_tokens=8)
    a = dense.generate(["Hello there"], params)[0].outputs[0].token_ids
    b = quant.generate(["Hello there"], params)[0].outputs[0].token_ids
    if quantization == "int8":  # 8-bit RTN on random weights keeps the greedy path here
        assert a == b
    assert len(b) == 8


needs_int4_kernel = pytest.mark.skipif(
    kernel_tile_width() is None, reason="torch packs int4 in no layout we know on this CPU"
)


@needs_int4_kernel
def test_cpu_layout_is_torch_int4_pack_layout():
    # The layout follows the CPU (64-row tiles with AVX-512, 32 with AVX2): whatever this machine
    # is, the detected width must reproduce torch's own packing of a matrix it did not probe.
    q = torch.randint(0, 16, (128, 96), dtype=torch.uint8)
    assert torch.equal(
        _pack_codes(q), torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.int(), 1)
    )


@needs_int4_kernel
def test_a_layout_for_another_tile_width_is_wrong():
    # Why the width is detected: packed for the other ISA, the same codes are different bytes.
    q = torch.randint(0, 16, (128, 96), dtype=torch.uint8)
    other = next(t for t in KERNEL_TILE_WIDTHS if t != kernel_tile_width())
    assert not torch.equal(_pack_codes(q, other), _pack_codes(q))


def _random_weight(qtype: str, n: int, k: int):
    raw = random_quant_blocks(qtype, n, k, seed=1)
    return to_quantized_tensor(
        decode_blocks(raw, gguf.GGMLQuantizationType[qtype], k), (n, k), qtype
    )


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "Q5_1"])
@pytest.mark.parametrize("rows", [1, 5, 400])  # int4 kernel and dequantize-then-GEMM
@pytest.mark.parametrize("kernel", ["auto", "torch"])  # numba's where installed; torch's
def test_cpu_layout_matmul_close_to_reference(qtype, rows, kernel, monkeypatch):
    monkeypatch.setenv(KERNEL_ENV, kernel)
    n, k = 72, 512  # 72 rows: padded to a 64-row tile
    w = _random_weight(qtype, n, k)
    x = torch.randn(rows, k)
    ref = quantized_matmul_torch(x.double(), w)
    y = cpu_layout(w)(x.bfloat16()).double()
    assert y.shape == (rows, n)
    assert (y - ref).abs().max() < 1e-2 * ref.abs().max()


def test_cpu_without_a_known_int4_layout_falls_back_to_bf16_dense(monkeypatch):
    monkeypatch.setenv(KERNEL_ENV, "torch")  # torch's kernels only, as without numba
    monkeypatch.setattr("kvscope.engine.quant.cpu_layout.int4_kernel_available", lambda: False)
    w = _random_weight("Q4_K", 72, 512)
    layout = cpu_layout(w)
    assert layout.dense is not None and not layout.parts
    x = torch.randn(3, 512)
    ref = quantized_matmul_torch(x.double(), w)
    assert (layout(x.bfloat16()).double() - ref).abs().max() < 1e-2 * ref.abs().max()


def test_unsupported_tensor_type_is_refused_by_name(tmp_path):
    path = make_quant_gguf(tmp_path / "m.gguf", "Q4_0")
    data = bytearray(path.read_bytes())
    # Retype one tensor as IQ4_NL (same block size and bytes as Q4_0): it must be named.
    f = load_model(path)  # noqa: F841  (a valid file first)
    from kvscope.engine.model.gguf.file import read_gguf

    t = next(t for t in read_gguf(path).tensors if t.name == "blk.1.ffn_up.weight")
    name = t.name.encode()
    where = data.index(len(name).to_bytes(8, "little") + name)
    type_at = where + 8 + len(name) + 4 + 8 * len(t.shape)
    assert int.from_bytes(data[type_at : type_at + 4], "little") == gguf.GGMLQuantizationType.Q4_0
    data[type_at : type_at + 4] = int(gguf.GGMLQuantizationType.IQ4_NL).to_bytes(4, "little")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"blk\.1\.ffn_up\.weight.*IQ4_NL"):
        load_model(bad)


def test_a_model_that_cannot_fit_is_refused_before_loading(tmp_path, monkeypatch):
    import kvscope.engine.sizing.model_build as build
    from kvscope.engine.memory.model_too_large import ModelTooLargeError

    path = make_quant_gguf(tmp_path / "m.gguf", "Q4_K")
    loaded = load_model(path)
    reads = []
    real_read = loaded.weights.read
    monkeypatch.setattr(loaded.weights, "read", lambda *a: reads.append(a) or real_read(*a))
    monkeypatch.setattr(build, "free_memory", lambda device: 100 << 20)
    with pytest.raises(ModelTooLargeError) as e:
        LLM(model=loaded, device="cpu", num_kv_blocks=8)
    message = str(e.value)
    assert "m.gguf needs about" in message and "is free" in message and "Q4_K" in message
    assert "quantization='int4'" in message  # a way out
    assert reads == []  # refused from the header alone


def test_out_of_memory_while_building_is_a_clear_error(tmp_path, monkeypatch):
    from kvscope.engine.memory.model_too_large import ModelTooLargeError

    loaded = load_model(make_quant_gguf(tmp_path / "m.gguf", "Q8_0"))

    def exhausted(*args):
        raise MemoryError()

    monkeypatch.setattr(loaded.weights, "read", exhausted)
    with pytest.raises(ModelTooLargeError, match="ran out of memory while loading"):
        LLM(model=loaded, device="cpu", num_kv_blocks=8)


def test_planner_counts_the_kept_format(tmp_path, monkeypatch):
    from kvscope.engine.sizing.planner import plan_kv

    path = make_quant_gguf(tmp_path / "m.gguf", "Q4_K")
    kept = plan_kv(path, context=256, vram_bytes="1GiB")
    dense = plan_kv(path, context=256, vram_bytes="1GiB", quantization="none")
    assert kept.weights_format == "Q4_K" and dense.weights_format == "dequantized"
    # The CPU float32 path keeps the packed format only where the dense weights do not fit.
    monkeypatch.setattr("kvscope.engine.llm_engine.free_memory", lambda device: 1)
    llm = LLM(model=str(path), device="cpu", dtype="float32", num_kv_blocks=8)
    assert llm.stats()["weight_layout"] == "dequant-per-call"
    # The GPU keeps the packed format as that CPU float32 path does: bytes agree but for the
    # float32 norms the planner counts at fp16.
    assert abs(kept.weights_bytes - llm.stats()["weight_bytes"]) < 0.01 * kept.weights_bytes
    assert dense.weights_bytes > 3 * kept.weights_bytes
    assert kept.load_peak_bytes > 0 and kept.fits_to_load


def test_out_of_memory_in_the_tokenizer_is_not_called_a_broken_tokenizer(tmp_path, monkeypatch):
    import kvscope.engine.model.gguf.loader as loader_module
    from kvscope.engine.memory.model_too_large import ModelTooLargeError

    path = make_quant_gguf(tmp_path / "fresh.gguf", "Q8_0")  # a new file: not in the cache

    def exhausted(*args, **kwargs):
        raise MemoryError()

    monkeypatch.setattr(loader_module.AutoTokenizer, "from_pretrained", exhausted)
    with pytest.raises(ModelTooLargeError, match="ran out of host memory while converting"):
        load_model(path)
