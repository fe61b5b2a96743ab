"""Layout: how one training job is cut across the fleet.

The mesh is ``gpus = dp_replicate * dp_shard * cp * tp * pp``. Expert
parallelism adds no factor: the experts have a mesh of their own over the same
ranks, etp x ep x edp = tp x cp x dp (Megatron-Core's MoE parallel folding,
Liu et al. 2025, arXiv:2504.14960). With expert TP equal to TP (the default),
expert groups are carved out of the data-parallel and context ranks
(dp_replicate * dp_shard * cp); with a smaller expert TP, EP folds over the
TP ranks too, so an expert group can stay inside one NVLink domain while
attention uses TP.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol


class ZeroStage(IntEnum):
    """What the data-parallel shard group partitions (ZeRO, Rajbhandari et al. 2020)."""

    NONE = 0
    """Plain data parallel: every rank holds the whole training state."""
    OPTIMIZER = 1
    """ZeRO-1 / distributed optimizer: fp32 master weights and moments are sharded."""
    GRADIENTS = 2
    """ZeRO-2: gradients are sharded too (reduce-scatter instead of all-reduce)."""
    PARAMETERS = 3
    """ZeRO-3 / FSDP: parameters are sharded too and all-gathered layer by layer."""


class Recompute(IntEnum):
    """Activation recomputation (Korthikanti et al. 2022)."""

    NONE = 0
    """Keep every activation the backward pass needs."""
    SELECTIVE = 1
    """Recompute the attention core (scores, softmax, dropout); keep the rest."""
    FULL = 2
    """Keep only each layer's input; recompute the whole layer in backward."""


class Schedule(IntEnum):
    """Pipeline schedule."""

    GPIPE = 0
    """All forwards, then all backwards: every micro-batch in flight."""
    ONE_F_ONE_B = 1
    """1F1B (PipeDream-Flush): at most pp micro-batches in flight."""
    INTERLEAVED = 2
    """Interleaved 1F1B with vpp virtual stages per rank: the bubble shrinks by vpp."""
    ZERO_BUBBLE = 3
    """ZB-H1 style: weight-gradient work fills the bubble; 1F1B memory."""
    DUALPIPE = 4
    """DeepSeek's bidirectional DualPipe: half the bubble, two parameter copies."""


class ContextParallel(IntEnum):
    """How context-parallel ranks exchange keys and values."""

    RING = 0
    """Ring attention: K/V blocks pass around the ring, overlapped with compute."""
    ALL_GATHER = 1
    """All-gather the full K/V before attention (Llama 3)."""


_DEGREES = ("tp", "pp", "vpp", "cp", "ep", "dp_shard", "dp_replicate", "micro_batch")


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Degrees of every parallel axis, and how the step is executed."""

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    """Virtual pipeline stages (model chunks) per pipeline rank."""
    cp: int = 1
    ep: int = 1
    expert_tp: int | None = None
    """Tensor-parallel degree inside each expert (Megatron --expert-tensor-parallel-size); None: tp."""
    dp_shard: int = 1
    """Data-parallel ranks that shard the training state (the ZeRO / FSDP group)."""
    dp_replicate: int = 1
    """Data-parallel replicas of that group (HSDP's outer axis; plain DP when dp_shard = 1)."""
    sp: bool = False
    """Megatron sequence parallelism inside the TP group."""
    zero: ZeroStage = ZeroStage.NONE
    recompute: Recompute = Recompute.NONE
    schedule: Schedule = Schedule.ONE_F_ONE_B
    cp_kind: ContextParallel = ContextParallel.RING
    micro_batch: int = 1
    """Sequences per micro-batch on one data-parallel rank."""

    def __post_init__(self) -> None:
        for name in _DEGREES:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.expert_tp is not None and (
            not isinstance(self.expert_tp, int) or isinstance(self.expert_tp, bool) or self.expert_tp < 1
        ):
            raise ValueError(f"expert_tp must be a positive integer, got {self.expert_tp!r}")
        if self.expert_tp is not None and self.expert_tp > self.tp:
            raise ValueError(
                f"expert_tp={self.expert_tp} above tp={self.tp}: meshplan models expert TP up to tp (MoE parallel "
                "folding splits the TP ranks between expert TP and EP); raise tp or lower expert_tp"
            )
        data_ranks = self.dp_replicate * self.dp_shard * self.cp
        if self.expert_tp is None and data_ranks % self.ep:
            raise ValueError(
                f"ep={self.ep} must divide dp_replicate*dp_shard*cp = "
                f"{self.dp_replicate}*{self.dp_shard}*{self.cp} = {data_ranks}"
            )
        if (self.tp * data_ranks) % (self.ep * self.etp):
            raise ValueError(
                f"ep*expert_tp = {self.ep}*{self.etp} must divide tp*cp*dp = {self.tp}*{self.cp}*"
                f"{self.dp_replicate * self.dp_shard} = {self.tp * data_ranks} (the experts' mesh folds over "
                "the same ranks)"
            )
        if self.etp != self.tp and self.tp > 1 and not self.sp:
            raise ValueError(
                f"expert_tp={self.etp} differs from tp={self.tp}: MoE parallel folding dispatches each rank's "
                "sequence-parallel tokens, so it needs sp (Megatron requires --sequence-parallel with TP and experts)"
            )
        if self.zero == ZeroStage.NONE and self.dp_shard > 1:
            raise ValueError(f"dp_shard={self.dp_shard} shards nothing with zero=0; use dp_replicate or zero 1-3")
        if self.vpp > 1 and self.pp == 1:
            raise ValueError(f"vpp={self.vpp} needs pp > 1")
        if self.schedule == Schedule.INTERLEAVED and self.vpp == 1:
            raise ValueError("the interleaved schedule needs vpp > 1")
        if self.vpp > 1 and self.schedule != Schedule.INTERLEAVED:
            raise ValueError(f"vpp={self.vpp} needs the interleaved schedule, got {self.schedule.name.lower()}")
        if self.sp and self.tp == 1:
            raise ValueError("sequence parallelism (sp) needs tp > 1")

    @property
    def etp(self) -> int:
        """Expert tensor-parallel degree as resolved: ``expert_tp``, or tp when unset."""
        return self.tp if self.expert_tp is None else self.expert_tp

    @property
    def num_gpus(self) -> int:
        """GPUs the mesh spans."""
        return self.dp_replicate * self.dp_shard * self.cp * self.tp * self.pp

    @property
    def dp(self) -> int:
        """All data-parallel ranks: each sees different sequences."""
        return self.dp_replicate * self.dp_shard


class LayoutLike(Protocol):
    """A Layout, or a batch of layouts whose fields are numpy arrays (the planner's LayoutBatch).

    The core's formulas read only these fields, so one implementation serves both.
    """

    @property
    def tp(self) -> Any: ...
    @property
    def pp(self) -> Any: ...
    @property
    def vpp(self) -> Any: ...
    @property
    def cp(self) -> Any: ...
    @property
    def ep(self) -> Any: ...
    @property
    def etp(self) -> Any: ...
    @property
    def dp_shard(self) -> Any: ...
    @property
    def dp_replicate(self) -> Any: ...
    @property
    def sp(self) -> Any: ...
    @property
    def zero(self) -> Any: ...
    @property
    def recompute(self) -> Any: ...
    @property
    def schedule(self) -> Any: ...
    @property
    def cp_kind(self) -> Any: ...
    @property
    def micro_batch(self) -> Any: ...
