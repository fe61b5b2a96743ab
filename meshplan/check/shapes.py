"""The tiny model's shape and which harness layout fits which world size, without torch.

``meshplan check`` refuses flags that cannot run (heads that do not divide the hidden size, KV heads that do not
divide the heads, a layout that does not fit the world size) from this module alone, before torch is imported
(reports/check.py): importing torch takes seconds. runner.py builds and runs the layouts named here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class TinyConfig:
    """Shape of the tiny model and of one training micro-batch."""

    num_layers: int = 4
    hidden: int = 32
    num_heads: int = 8
    num_kv_heads: int = 4
    head_dim: int = 4
    ffn_hidden: int = 64
    vocab_size: int = 50
    seq_len: int = 16
    micro_batch: int = 2
    num_experts: int = 0
    """Routed experts per layer (0: dense SwiGLU MLP in every layer)."""
    experts_per_token: int = 2
    expert_ffn_hidden: int = 32
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if self.num_experts and self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} exceeds num_experts={self.num_experts}")


DENSE = TinyConfig()
MOE = TinyConfig(num_experts=8, experts_per_token=2, expert_ffn_hidden=32)


def divisible(cfg: TinyConfig, n: int, *fields: str) -> list[str]:
    """The ``fields`` of ``cfg`` that ``n`` does not divide, as reasons."""
    return [f"{f}={getattr(cfg, f)} is not divisible by {n}" for f in fields if getattr(cfg, f) % n]


def tp_rules(cfg: TinyConfig, n: int) -> list[str]:
    return divisible(cfg, n, "num_heads", "num_kv_heads", "ffn_hidden")


def sp_rules(cfg: TinyConfig, n: int) -> list[str]:
    return tp_rules(cfg, n) + divisible(cfg, n, "seq_len")


def _fits_always(cfg: TinyConfig, n: int) -> list[str]:
    return []


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutFit:
    """What a harness layout needs of the model and the world size."""

    moe: bool = False
    """Runs on the MoE variant of the model."""
    min_world_size: int = 2
    rules: Callable[[TinyConfig, int], list[str]] = field(default=_fits_always)
    """Broken shape rules for a world size (empty when the layout fits)."""

    def broken(self, world_size: int, *, dense: TinyConfig, moe: TinyConfig) -> list[str]:
        """Why the layout cannot run at ``world_size`` on these shapes (empty: it can)."""
        if world_size < self.min_world_size:
            return [f"needs world size >= {self.min_world_size}, got {world_size}"]
        return list(self.rules(moe if self.moe else dense, world_size))


def _fsdp_tp_rules(cfg: TinyConfig, n: int) -> list[str]:
    return ([f"world size {n} is odd"] if n % 2 else []) + sp_rules(cfg, 2)


def _pp_rules(cfg: TinyConfig, n: int) -> list[str]:
    return divisible(cfg, n, "num_layers")


def _ep_rules(cfg: TinyConfig, n: int) -> list[str]:
    return divisible(cfg, n, "num_experts") if cfg.num_experts else ["num_experts is 0"]


def _cp_rules(cfg: TinyConfig, n: int) -> list[str]:
    return divisible(cfg, n, "seq_len")


_DATA_PARALLEL = ("ddp", "fsdp", "fsdp_reshard_root", "fsdp_no_reshard", "fsdp_no_sync", "fsdp_sac_op")
FITS: dict[str, LayoutFit] = {
    **{name: LayoutFit() for name in (*_DATA_PARALLEL, "fsdp_bf16", "fsdp_bf16_reduce_bf16")},
    "tp": LayoutFit(rules=tp_rules),
    "sp": LayoutFit(rules=sp_rules),
    "tp_sac_op": LayoutFit(rules=tp_rules),
    "sp_sac_op": LayoutFit(rules=sp_rules),
    "fsdp_tp": LayoutFit(min_world_size=4, rules=_fsdp_tp_rules),
    "pp_gpipe": LayoutFit(rules=_pp_rules),
    "pp_1f1b": LayoutFit(rules=_pp_rules),
    "ep": LayoutFit(moe=True, rules=_ep_rules),
    "cp": LayoutFit(rules=_cp_rules),
}
"""Each harness layout (runner.LAYOUTS, by the same names) and what it needs."""
