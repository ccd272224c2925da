"""KVPlan: what `engine.sizing.planner.plan_kv` worked out, as a record and as text for a terminal.

The arithmetic is the planner's; this module only holds its figures and lays them out
(`kvscope plan` prints `table()`, `--json` prints `to_dict()`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from kvscope.engine.memory.byte_units import format_bytes


@dataclass(frozen=True)
class KVPlan:
    model: str  # a label: file or folder name, or "flags"
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    dtype_bytes: int
    context: int  # tokens per sequence, prompt and output together
    model_max_context: int | None  # the model's max_position_embeddings; None from flags
    batch: int
    block_size: int
    bytes_per_token: int
    bytes_per_sequence: int  # the exact K/V of one sequence (sliding layers: their window)
    batch_bytes: int
    bytes_per_block: int
    blocks_per_sequence: int  # ceil(context / block_size): a paged pool allocates whole blocks
    batch_blocks: int
    vram_bytes: int | None
    gpu_memory_utilization: float
    weights_bytes: int | None
    weights_source: str  # "given" | "estimated" | "none" (counted as 0)
    weights_dtype: str | None  # of an estimate
    weights_format: str | None  # the estimate's kept formats: "Q4_K+Q6_K", "int4", "fp16"
    load_peak_bytes: int | None  # extra while building (estimates only)
    kv_budget_bytes: int | None  # vram x utilization - weights, at least 0; None without vram
    budget_deficit_bytes: int | None  # how far weights overrun vram x utilization
    num_blocks: int | None  # blocks in the budget
    max_tokens_in_budget: int | None
    max_sequences_at_context: int | None
    fits: bool | None  # batch x blocks_per_sequence <= num_blocks; None without vram
    fits_to_load: bool | None  # weights + load peak <= vram x utilization; None without vram
    # Sliding-window layers count at their window (bytes_per_sequence, blocks_per_sequence).
    sliding_window: int | None = None
    sliding_layers: int = 0
    kv_groups: int = 1  # block tables per sequence (engine.kv.layout); a block holds one's layers

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        """The plan as aligned 'label  value' lines for a terminal."""
        rows = [
            ("model", self.model),
            (
                "layers x KV heads x head dim",
                f"{self.num_layers} x {self.num_kv_heads} x {self.head_dim}",
            ),
            ("KV dtype", f"{self.dtype} ({self.dtype_bytes} B)"),
            ("bytes per token", format_bytes(self.bytes_per_token)),
            *(
                [
                    (
                        "sliding layers",
                        f"{self.sliding_layers} of {self.num_layers} keep a "
                        f"{self.sliding_window:,}-token window ({self.kv_groups} KV groups)",
                    )
                ]
                if self.sliding_layers
                else []
            ),
            (
                "bytes per sequence",
                f"{format_bytes(self.bytes_per_sequence)} at {self.context:,} tokens",
            ),
            *(
                [("context warning", f"the model attends to at most {self.model_max_context:,}")]
                if self.model_max_context and self.context > self.model_max_context
                else []
            ),
            ("batch bytes", f"{format_bytes(self.batch_bytes)} for {self.batch} sequences"),
            ("block size", f"{self.block_size} tokens, {format_bytes(self.bytes_per_block)}"),
            ("blocks per sequence", f"{self.blocks_per_sequence:,}"),
            ("blocks for the batch", f"{self.batch_blocks:,}"),
        ]
        if self.vram_bytes is None:
            rows.append(("budget", "no VRAM size given: nothing to fit against"))
        else:
            if self.weights_bytes is None:
                weights = "0 (not given)"
            else:
                weights = f"{format_bytes(self.weights_bytes)}, {self.weights_source}"
                if self.weights_format:
                    weights += f" as {self.weights_format}"
                elif self.weights_dtype:
                    weights += f" at {self.weights_dtype}"
            rows += [
                ("VRAM", f"{format_bytes(self.vram_bytes)} x {self.gpu_memory_utilization}"),
                ("weights", weights),
            ]
            if self.load_peak_bytes:
                load = "yes" if self.fits_to_load else "NO"
                rows.append(("load peak", f"{format_bytes(self.load_peak_bytes)} (fits: {load})"))
            assert self.kv_budget_bytes is not None  # plan_kv sets it whenever vram is given
            rows.append(("KV budget", format_bytes(self.kv_budget_bytes)))
            if self.budget_deficit_bytes:
                rows.append(("weights overrun", format_bytes(self.budget_deficit_bytes)))
            rows += [
                ("blocks in budget", f"{self.num_blocks:,}"),
                ("tokens in budget", f"{self.max_tokens_in_budget:,}"),
                ("sequences at context", f"{self.max_sequences_at_context:,}"),
                ("fits", "yes" if self.fits else "NO"),
            ]
        width = max(len(label) for label, _ in rows)
        return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
