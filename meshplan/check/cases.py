"""The harness's layouts and tiny model in meshplan's terms: ModelSpec, Layout, Workload and the process mesh.

Each harness layout (meshplan/check/layouts.py) is a Layout on a mesh whose axes carry meshplan's axis names,
with the harness's dtypes (fp32, or FSDP2's bf16 mixed precision), AdamW, eager kernels and Framework.TORCH.
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from meshplan.core.comm.call import CollectiveCall
from meshplan.spec.conditions import Conditions, Selective
from meshplan.spec.layout import Layout, Recompute, Schedule, ZeroStage
from meshplan.spec.model import MlpKind, ModelSpec, MoESpec, NormKind
from meshplan.spec.workload import PRECISIONS, Framework, Kernels, Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape:
    """The tiny model and micro-batch, as the harness's TinyConfig gives them (no torch needed)."""

    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden: int
    vocab_size: int
    seq_len: int
    micro_batch: int
    num_experts: int = 0
    experts_per_token: int = 2
    expert_ffn_hidden: int = 32

    @classmethod
    def of(cls, cfg: object) -> Shape:
        return cls(**{f: getattr(cfg, f) for f in cls.__dataclass_fields__})


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """A harness layout in meshplan's terms."""

    layout: Layout
    mesh: tuple[tuple[str, int], ...]
    """Axes of the harness's process mesh, outermost first, named as meshplan's layout axes."""
    precision: str = "fp32"
    moe: bool = False
    micro_batches: int = 1
    syncs_buffers: bool = False
    """DDP broadcasts the module buffers every forward (the harness turns it off for CP and EP)."""
    reshard_root: bool = False
    """FSDP2 with an explicit ``reshard_after_forward=True``, which reshards the root too."""
    conditions: Conditions = dataclasses.field(default_factory=Conditions)
    """The run conditions of the schema's conditions group (gradient sync, reshard-after-forward, the selective
    recompute policy) as the harness sets them."""

    @property
    def world_size(self) -> int:
        out = 1
        for _, size in self.mesh:
            out *= size
        return out

    def coords(self, rank: int) -> dict[str, int]:
        """This rank's index along every mesh axis (the last axis varies fastest)."""
        out, rest = {}, rank
        for name, size in reversed(self.mesh):
            out[name], rest = rest % size, rest // size
        return out

    def axis_of_group(self, ranks: frozenset[int]) -> str:
        """The mesh axis a process group spans (its ranks differ along that axis only)."""
        for name, _ in self.mesh:
            for rank in ranks:
                c = self.coords(rank)
                group = {r for r in range(self.world_size) if _same_but(self.coords(r), c, name)}
                if group == ranks:
                    return name
                break
        raise ValueError(f"process group {sorted(ranks)} is not an axis of the mesh {self.mesh}")

    def axis_of_call(self, call: CollectiveCall) -> str:
        """The mesh axis of a predicted call (a one-axis mesh holds every group, whatever the core names it)."""
        names = [name for name, _ in self.mesh]
        if call.axis in names:
            return call.axis
        assert len(names) == 1, f"{call.strategy} {call.op} on axis {call.axis} is on none of the mesh axes {names}"
        return names[0]


def _same_but(a: Mapping[str, int], b: Mapping[str, int], axis: str) -> bool:
    return all(a[k] == b[k] for k in a if k != axis)


ACCUMULATED_MICRO_BATCHES = 2
"""Micro-batches per step of the no-sync layout: one accumulated without sync, then the last one."""


def _fsdp(n: int, **kw: Any) -> Case:
    return Case(layout=Layout(dp_shard=n, zero=ZeroStage.PARAMETERS), mesh=(("dp_shard", n),), **kw)


_CASES: dict[str, Callable[[int], Case]] = {
    "ddp": lambda n: Case(layout=Layout(dp_replicate=n), mesh=(("dp_replicate", n),), syncs_buffers=True),
    "fsdp": lambda n: _fsdp(n),
    "fsdp_reshard_root": lambda n: _fsdp(n, reshard_root=True),
    "fsdp_bf16": lambda n: _fsdp(n, precision="fsdp2-bf16"),
    "fsdp_no_reshard": lambda n: _fsdp(n, conditions=Conditions(reshard_after_forward=False)),
    "fsdp_no_sync": lambda n: _fsdp(n, micro_batches=ACCUMULATED_MICRO_BATCHES, conditions=Conditions(grad_sync=False)),
    "fsdp_sac_op": lambda n: Case(
        layout=Layout(dp_shard=n, zero=ZeroStage.PARAMETERS, recompute=Recompute.SELECTIVE),
        mesh=(("dp_shard", n),),
        conditions=Conditions(selective=Selective.OP),
    ),
    "tp": lambda n: Case(layout=Layout(tp=n), mesh=(("tp", n),)),
    "sp": lambda n: Case(layout=Layout(tp=n, sp=True), mesh=(("tp", n),)),
    "tp_sac_op": lambda n: Case(
        layout=Layout(tp=n, recompute=Recompute.SELECTIVE),
        mesh=(("tp", n),),
        conditions=Conditions(selective=Selective.OP),
    ),
    "sp_sac_op": lambda n: Case(
        layout=Layout(tp=n, sp=True, recompute=Recompute.SELECTIVE),
        mesh=(("tp", n),),
        conditions=Conditions(selective=Selective.OP),
    ),
    "fsdp_tp": lambda n: Case(
        layout=Layout(tp=2, dp_shard=n // 2, zero=ZeroStage.PARAMETERS, sp=True),
        mesh=(("dp_shard", n // 2), ("tp", 2)),
    ),
    "pp_gpipe": lambda n: Case(layout=Layout(pp=n, schedule=Schedule.GPIPE), mesh=(("pp", n),), micro_batches=2 * n),
    "pp_1f1b": lambda n: Case(
        layout=Layout(pp=n, schedule=Schedule.ONE_F_ONE_B), mesh=(("pp", n),), micro_batches=2 * n
    ),
    "ep": lambda n: Case(layout=Layout(dp_replicate=n, ep=n), mesh=(("dp_replicate", n),), moe=True),
    "cp": lambda n: Case(layout=Layout(cp=n), mesh=(("cp", n),)),
}


def case_for(name: str, world_size: int, *, micro_batch: int = 1) -> Case:
    """The meshplan layout of one harness layout on ``world_size`` ranks, ``micro_batch`` sequences per step."""
    if name not in _CASES:
        raise ValueError(f"no prediction for layout {name!r}; predicted: {', '.join(_CASES)}")
    case = _CASES[name](world_size)
    return dataclasses.replace(case, layout=dataclasses.replace(case.layout, micro_batch=micro_batch))


def model_spec(shape: Shape, *, moe: bool) -> ModelSpec:
    """The tiny Llama: RMSNorm, SwiGLU, rotary, untied output; every layer a MoE layer in the MoE variant."""
    experts = (
        MoESpec(
            num_experts=shape.num_experts,
            experts_per_token=shape.experts_per_token,
            expert_ffn_hidden=shape.expert_ffn_hidden,
        )
        if moe
        else None
    )
    return ModelSpec(
        name="tiny-llama-moe" if moe else "tiny-llama",
        num_layers=shape.num_layers,
        hidden=shape.hidden,
        num_heads=shape.num_heads,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        ffn_hidden=shape.ffn_hidden,
        vocab_size=shape.vocab_size,
        mlp=MlpKind.GATED,
        norm=NormKind.RMSNORM,
        moe=experts,
    )


def workload(case: Case, shape: Shape) -> Workload:
    """The harness's step: ``case.micro_batches`` micro-batches per data-parallel rank (2 pp of them under
    pipelining, 2 when accumulating without sync, else 1), AdamW, under the case's conditions."""
    return Workload(
        seq_len=shape.seq_len,
        global_batch=case.layout.micro_batch * case.layout.dp * case.micro_batches,
        precision=PRECISIONS[case.precision],
        kernels=Kernels.EAGER,
        framework=Framework.TORCH,
        conditions=case.conditions,
    )


def rotary_buffer_bytes(shape: Shape, *, cp: int) -> float:
    """The model's rotary tables: cos and sin, (s / cp, d) fp32 each (the only module buffers)."""
    return 2 * shape.seq_len / cp * shape.head_dim * 4.0
