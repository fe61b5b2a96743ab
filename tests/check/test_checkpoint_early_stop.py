"""What ``--recompute-early-stop`` prices, counted in torch: an MPT-shaped block (LayerNorm, fused QKV, causal
SDPA, output projection, residual, LayerNorm, up, GELU, down, residual; bf16 autocast, biases) checkpointed with
``use_reentrant=False`` re-runs three of its four forward matmuls in backward, the down projection left out; with
early stop off, or reentrant, all four."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip(
    "torch", reason="the checkpoint check needs the torch extra (pip install 'meshplan[torch]')"
)

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop  # noqa: E402

MATMULS = ("mm", "addmm", "bmm")


class _CountMatmuls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += func.overloadpacket.__name__ in MATMULS
        return func(*args, **(kwargs or {}))


class _Block(torch.nn.Module):  # type: ignore[misc]
    """MPTBlock's order of operations (llmfoundry/models/layers/blocks.py, ffn.py MPTMLP), p = 0 dropout."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        nn = torch.nn
        self.heads = heads
        self.norm_1, self.norm_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.wqkv, self.out_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up_proj, self.down_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x: Any) -> Any:
        b, t, d = x.shape
        q, k, v = self.wqkv(self.norm_1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        a = sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.dropout(self.out_proj(a.transpose(1, 2).reshape(b, t, d)))
        return x + self.dropout(self.down_proj(torch.nn.functional.gelu(self.up_proj(self.norm_2(x)))))


def _backward_matmuls(*, reentrant: bool | None, early_stop: bool = True) -> int:
    """Matmuls the backward runs: 8 gradients (input and weight of 4 linear layers) plus those recomputed."""
    torch.manual_seed(0)
    block, x = _Block(), torch.randn(2, 16, 64, requires_grad=True)
    with set_checkpoint_early_stop(early_stop), torch.autocast("cpu", dtype=torch.bfloat16):
        y = block(x) if reentrant is None else checkpoint(block, x, use_reentrant=reentrant)
    counter = _CountMatmuls()
    with counter:
        y.float().sum().backward()
    return counter.count


def test_early_stop_skips_the_down_projection() -> None:
    assert _backward_matmuls(reentrant=None) == 8
    assert _backward_matmuls(reentrant=False) == 8 + 3
    assert _backward_matmuls(reentrant=False, early_stop=False) == 8 + 4
    assert _backward_matmuls(reentrant=True) == 8 + 4
