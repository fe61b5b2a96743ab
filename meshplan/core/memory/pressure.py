"""The edge of HBM: how full a layout leaves each GPU, and what PyTorch's caching allocator does near capacity.

The caching allocator keeps the blocks it freed for reuse. When no cached block is large enough for a request and
``cudaMalloc`` fails, it frees every unused cached block (``release_cached_blocks``, which first synchronizes on the
events of every stream) and tries again, counted in ``torch.cuda.memory_stats()["num_alloc_retries"]``: a device
synchronization and a round of ``cudaFree`` / ``cudaMalloc`` in the middle of a step. How often that happens
depends on how the step's transient tensors fragment the cache, which the bill does not follow block by block; it
names the share of HBM a layout fills (``hbm_pressure``), flags a layout past ``PRESSURE_SHARE`` and widens the
slow side of its step-time band by ``PRESSURE_BAND_P90``. No time penalty is added to the step (docs/validation.md,
"The edge of HBM").
"""

from __future__ import annotations

from meshplan.core.num import Num

PRESSURE_SHARE = 0.90
"""Share of HBM past which a layout is flagged as near capacity. KempnerForge's Llama-3-style 70B on 8 H200 (TP 4 x
FSDP 2, published_runs_3.json) allocated 128.5 of the 139.8 GiB PyTorch sees, 92%, and its step took 1.56 times the
predicted one where its 32- to 160-GPU runs of the same layout, at 59-67%, took 1.10-1.17 times theirs; the same
share is the planner's default headroom (``--headroom 0.10``), so no layout the planner ranks by default is past
it."""
PRESSURE_BAND_P90 = 1.25
"""Factor on the P90 of the step-time band of a layout past ``PRESSURE_SHARE``: the PyTorch FSDP throughput guide
(pytorch/examples FSDP, "Maximizing training throughput": a 2B model gained 25% by backing its batch off until
``num_alloc_retries`` stayed 0): the smaller of the two published losses, the 70B KempnerForge run above taking
1.56 / 1.14 = 1.37 times what its peers' errors would give."""


def hbm_pressure(total_bytes: Num, hbm_bytes: Num) -> Num:
    """The share of HBM a GPU's whole bill fills (above 1: it does not fit)."""
    return total_bytes / hbm_bytes


def near_capacity(pressure: Num) -> Num:
    """The layout fits but fills more than ``PRESSURE_SHARE`` of HBM."""
    return (pressure > PRESSURE_SHARE) & (pressure <= 1.0)


def pressure_warning(pressure: float, *, fits: bool) -> list[str]:
    """The warning a report carries for a layout that fits past ``PRESSURE_SHARE`` (none otherwise)."""
    if not fits or pressure <= PRESSURE_SHARE:
        return []
    return [
        f"{pressure:.0%} of HBM in use (past {PRESSURE_SHARE:.0%}): this close to capacity fragmentation can make "
        "PyTorch's caching allocator flush its cache and retry allocations (cudaMalloc retries, each a device "
        "synchronization), which slows steps; the step time does not include that, and its P90 is widened by "
        f"{PRESSURE_BAND_P90 - 1:.0%}"
    ]
