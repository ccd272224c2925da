"""The packed weight formats the engine keeps quantized weights in, on every device.

One format, `QuantizedTensor`, holds every supported GGUF quantization *exactly* and the engine's
own round-to-nearest int8/int4 quantization of float checkpoints. A weight matrix W of shape
[N, K] (out_features, in_features, the nn.Linear layout) is stored as

    codes      uint8 [N, K] (bits=8) or [N, K // 2] (bits=4: element 2j in the low nibble of
               byte j, element 2j+1 in the high nibble); unsigned integers q
    d, dmin    float16 or float32 [N, K // super_group]: one scale and one offset per super-group
    sub_scale  int8 [N, K // group] or None
    sub_min    int8 [N, K // group] or None (may be the same tensor as sub_scale)

and its value is, in float32,

    scale[n, g] = d[n, g // (S/G)] * sub_scale[n, g]      (d alone when sub_scale is None)
    min[n, g]   = dmin[n, g // (S/G)] * sub_min[n, g]     (dmin alone when sub_min is None)
    W[n, k]     = scale[n, k // G] * q[n, k] + min[n, k // G]

with G = group_size and S = super_group_size (S = G for one-level types). Every GGUF type maps
onto it with no rounding at all, and the products above are exact in float32 (a float16 d times
an int8 sub-scale times an 8-bit code needs at most 24 significant bits), so dequantizing gives
the same bits as `gguf.quants.dequantize`:

    GGUF   bits G   S    q                    d          dmin          sub_scale  sub_min
    Q4_0   4    32  32   nibble               d          -8 d          -          -
    Q4_1   4    32  32   nibble               d          m             -          -
    Q5_0   8    32  32   5-bit                d          -16 d         -          -
    Q5_1   8    32  32   5-bit                d          m             -          -
    Q8_0   8    32  32   int8 + 128           d          -128 d        -          -
    Q4_K   4    32  256  nibble               d          -dmin         6-bit sc   6-bit m
    Q5_K   8    32  256  5-bit                d          -dmin         6-bit sc   6-bit m
    Q6_K   8    16  256  6-bit                d          -32 d         int8 sc    (= sub_scale)
    int8   8    128 128  round to nearest     (max-min)/255   min      -          -
    int4   4    128 128  round to nearest     (max-min)/15    min      -          -

d and dmin are float16 when the product above is exactly a float16 (the file's own halves, and
-8 d etc. unless they overflow), float32 otherwise. Bits per weight: Q4_0 5.0, Q4_K 4.625,
Q8_0 9.0, Q6_K 8.625 (the file's 6.56: 6-bit codes are widened to bytes so kernels read them
with one load), int4 4.25, int8 8.25. F32/F16/BF16 tensors are not quantized: they stay plain
tensors in the compute dtype.

`Int4PackCPU` is not a storage format of its own but a kernel layout derived from one: the codes
rearranged for torch's `_weight_int4pack_mm_for_cpu` with the per-group scale and zero in
bfloat16 (that kernel's activation dtype), so it is exact up to bfloat16 rounding of the scales,
the same rounding bfloat16 activations already carry. 8-bit codes become two of them (high and
low nibble). See `engine/quant/cpu_layout.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

# Rows dequantized per chunk: bounds the float32 scratch of a dequantizing matmul.
DEQUANT_CHUNK_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class QuantizedTensor:
    shape: tuple[int, int]  # (N, K)
    bits: int  # 4 or 8
    group_size: int
    super_group_size: int
    codes: torch.Tensor
    d: torch.Tensor
    dmin: torch.Tensor
    sub_scale: torch.Tensor | None = None
    sub_min: torch.Tensor | None = None
    kind: str = ""  # where it came from: "Q4_K", "int8", ... (shown to the user)

    def __post_init__(self) -> None:
        n, k = self.shape
        g, s = self.group_size, self.super_group_size
        if self.bits not in (4, 8):
            raise ValueError(f"QuantizedTensor bits must be 4 or 8, got {self.bits}")
        if k % s or s % g:
            raise ValueError(f"K={k} must split into super-groups of {s} and groups of {g}")
        want = (n, k // 2) if self.bits == 4 else (n, k)
        if tuple(self.codes.shape) != want or self.codes.dtype != torch.uint8:
            raise ValueError(
                f"codes must be uint8 {want}, got {self.codes.dtype} {self.codes.shape}"
            )
        for name in ("d", "dmin"):
            t = getattr(self, name)
            if tuple(t.shape) != (n, k // s) or t.dtype not in (torch.float16, torch.float32):
                raise ValueError(f"{name} must be float16/float32 {(n, k // s)}, got {t.shape}")
        for name in ("sub_scale", "sub_min"):
            t = getattr(self, name)
            if t is not None and (tuple(t.shape) != (n, k // g) or t.dtype != torch.int8):
                raise ValueError(f"{name} must be int8 {(n, k // g)}, got {t.dtype} {t.shape}")

    # ---- facts ---------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def nbytes(self) -> int:
        parts = [self.codes, self.d, self.dmin, self.sub_scale]
        if self.sub_min is not None and self.sub_min is not self.sub_scale:
            parts.append(self.sub_min)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    # ---- values --------------------------------------------------------------------------
    def group_scales(self, rows: slice | torch.Tensor = slice(None)) -> tuple[torch.Tensor, ...]:
        """float32 (scale, min), each [rows, K // group_size]."""
        per_super = self.super_group_size // self.group_size
        scale = self.d[rows].float().repeat_interleave(per_super, dim=1)
        low = self.dmin[rows].float().repeat_interleave(per_super, dim=1)
        if self.sub_scale is not None:
            scale = scale * self.sub_scale[rows].float()
        if self.sub_min is not None:
            low = low * self.sub_min[rows].float()
        return scale, low

    def unpacked_codes(self, rows: slice | torch.Tensor = slice(None)) -> torch.Tensor:
        """uint8 [rows, K], one code per element."""
        codes = self.codes[rows]
        if self.bits == 8:
            return codes
        return torch.stack([codes & 0x0F, codes >> 4], dim=-1).flatten(-2)

    def dequantize(
        self, dtype: torch.dtype = torch.float32, rows: slice | torch.Tensor = slice(None)
    ) -> torch.Tensor:
        """W[rows] in `dtype`, computed in float32: [rows, K]."""
        q = self.unpacked_codes(rows)
        scale, low = self.group_scales(rows)
        g = self.group_size
        q = q.view(q.shape[0], -1, g).float()
        w = torch.addcmul(low[:, :, None], q, scale[:, :, None])
        return w.view(q.shape[0], -1).to(dtype)

    # ---- structure -----------------------------------------------------------------------
    def to(self, device: torch.device | str) -> QuantizedTensor:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        sub_scale = move(self.sub_scale)
        sub_min = sub_scale if self.sub_min is self.sub_scale else move(self.sub_min)
        return replace(
            self,
            codes=self.codes.to(device),
            d=self.d.to(device),
            dmin=self.dmin.to(device),
            sub_scale=sub_scale,
            sub_min=sub_min,
        )

    def same_layout(self, other: QuantizedTensor) -> bool:
        """Whether rows of `other` can be stacked under ours (see `cat_rows`)."""
        return (
            self.bits == other.bits
            and self.group_size == other.group_size
            and self.super_group_size == other.super_group_size
            and self.shape[1] == other.shape[1]
            and self.d.dtype == other.d.dtype
            and (self.sub_scale is None) == (other.sub_scale is None)
            and (self.sub_min is None) == (other.sub_min is None)
            and (self.sub_min is self.sub_scale) == (other.sub_min is other.sub_scale)
        )


def cat_rows(parts: list[QuantizedTensor]) -> QuantizedTensor:
    """Stack matrices with the same layout along N (q/k/v or gate/up into one matmul)."""
    first = parts[0]
    if not all(first.same_layout(p) for p in parts[1:]):
        raise ValueError("cannot stack quantized tensors of different layouts")

    def cat(name: str) -> torch.Tensor | None:
        """The parts' optional tensor `name` stacked (one layout: all have it, or none)."""
        tensors = [getattr(p, name) for p in parts]
        return None if tensors[0] is None else torch.cat(tensors)

    sub_scale = cat("sub_scale")
    shared = first.sub_min is first.sub_scale
    kinds = sorted({p.kind for p in parts})
    return replace(
        first,
        shape=(sum(p.shape[0] for p in parts), first.shape[1]),
        codes=torch.cat([p.codes for p in parts]),
        d=torch.cat([p.d for p in parts]),
        dmin=torch.cat([p.dmin for p in parts]),
        sub_scale=sub_scale,
        sub_min=sub_scale if shared else cat("sub_min"),
        kind="+".join(kinds),
    )


def quantized_matmul_torch(x: torch.Tensor, w: QuantizedTensor) -> torch.Tensor:
    """x [M, K] @ W.T -> [M, N] in x's dtype: the reference. Dequantizes W a few rows at a time
    (exact values, float32 scratch bounded by DEQUANT_CHUNK_ELEMENTS) and multiplies in x's
    dtype; float32 x therefore gets the dense float32 result up to summation order."""
    n, k = w.shape
    out = torch.empty((x.shape[0], n), dtype=x.dtype, device=x.device)
    step = max(1, DEQUANT_CHUNK_ELEMENTS // k)
    for start in range(0, n, step):
        rows = slice(start, min(n, start + step))
        torch.matmul(x, w.dequantize(x.dtype, rows).t(), out=out[:, rows])
    return out
