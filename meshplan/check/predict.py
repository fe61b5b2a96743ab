"""What meshplan's core predicts for every quantity ``run_check`` measures, with Framework.TORCH.

Each harness layout becomes a ModelSpec, a Layout and a Workload with the run's conditions (cases.py); each rank
then gets the stage bill users get (core.memory.stage_bill, at the rank's pipeline stage) for its training state
and saved activations, and its collectives (core.comm, with every send matched by a receive on the rank it
reaches), named as the harness names its measurements. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from meshplan import io
from meshplan.check.cases import Case, Shape, case_for, model_spec, rotary_buffer_bytes, workload
from meshplan.core import pipeline
from meshplan.core.comm import inventory
from meshplan.core.comm.call import CollectiveCall, StageShape
from meshplan.core.comm.cost import Collective
from meshplan.core.memory import activations as act
from meshplan.core.memory.bill import MemoryBill, moment_bytes_per_param, stage_bill
from meshplan.core.memory.stage_params import stage_params
from meshplan.core.params import count_params
from meshplan.core.placement import place
from meshplan.core.plan import mesh_sizes
from meshplan.core.pytorch import collectives as torch_calls
from meshplan.core.pytorch import shards
from meshplan.core.stages import StageRow, stage_row
from meshplan.spec.cluster import Cluster, GpuCalibration
from meshplan.spec.layout import ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload

STATE_QUANTITIES = (
    "params_bytes",
    "params_storage_bytes",
    "grads_bytes",
    "grads_storage_bytes",
    "optimizer_bytes",
    "ddp_bucket_bytes",
    "gathered_params_after_forward_bytes",
    "grads_peak_bytes",
)
ACTIVATION_QUANTITIES = ("activations_bytes", "activations_peak_bytes")
BUFFER_QUANTITIES = ("comm_buffers_bytes",)
"""Bill terms compared within 1% where a CPU sees all of them (FSDP2 with reshard-after-forward off)."""
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "recv")
ROUTING_DEPENDENT = frozenset({"activations_bytes", "activations_peak_bytes", "all_to_all_bytes"})
"""Quantities of the MoE layouts that depend on where the router sends tokens: compared as the mean over ranks
(each rank receives R rows, and R sums to n T r over the ranks)."""
PHASES = {"forward": "forward", "backward": "backward", "step": "optimizer"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Predicted:
    """One predicted number of one rank, named as the harness names its measurement."""

    layout: str
    rank: int
    quantity: str
    phase: str
    """state, forward, backward or optimizer."""
    axis: str = ""
    """The mesh axis of a collective's group ('' for memory)."""
    value: float
    routing_dependent: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """Every predicted number of one layout, and what the core predicts that the harness cannot see."""

    layout: str
    case: Case
    values: list[Predicted]
    unmeasured: dict[str, float] = field(default_factory=dict)
    """Predicted for rank 0 but invisible on CPU: pipeline stage outputs held outside autograd, FSDP2's transient
    all-gather and reduce-scatter buffers, the workspace a recomputing layer rebuilds in backward."""


NO_OVERHEAD = GpuCalibration(framework_bytes=0.0, fragmentation=0.0)
"""The check compares tensors, not a GPU's runtime: no framework bytes, no fragmentation."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Rank:
    model: ModelSpec
    work: Workload
    units: StageRow
    at: shards.RankCoords
    stage: int
    bill: MemoryBill
    """The stage bill users get (``core.memory.stage_bill``) for this rank's pipeline stage."""


def _rank(case: Case, shape: Shape, rank: int) -> _Rank:
    lay, c = case.layout, case.coords(rank)
    model = model_spec(shape, moe=case.moe)
    fsdp = lay.dp_shard * lay.cp if lay.zero == ZeroStage.PARAMETERS else 1
    at = shards.RankCoords(
        tp=lay.tp,
        tp_rank=c.get("tp", 0),
        ep=lay.ep,
        ep_rank=c.get("dp_replicate", 0) if lay.ep > 1 else 0,
        fsdp=fsdp,
        fsdp_rank=c.get("dp_shard", 0) if fsdp > 1 else 0,
    )
    stage, work = c.get("pp", 0), workload(case, shape)
    bill = stage_bill(model, count_params(model), lay, work, calibration=NO_OVERHEAD, stage=stage)
    return _Rank(model=model, work=work, units=stage_row(model, pp=lay.pp, stage=stage), at=at, stage=stage, bill=bill)


def _torch_state(case: Case, r: _Rank, at: shards.RankCoords) -> shards.TorchState:
    lay = case.layout
    return shards.torch_state(
        r.model,
        at,
        r.units,
        zero=lay.zero,
        ddp_ranks=lay.dp * lay.cp,
        precision=r.work.precision,
        optimizer=r.work.optimizer.kind,
        moment_bytes=moment_bytes_per_param(r.model, r.work),
        reshard_root=case.reshard_root,
        reshard_after_forward=case.conditions.reshard_after_forward,
    )


def _state(case: Case, r: _Rank) -> dict[str, float]:
    """One rank's training state, named as the harness measures it.

    What a term of the stage bill carries comes from the bill: it is the stage's heaviest GPU, rank 0 of every
    TP, EP and FSDP split, so another rank of an uneven split adds what it holds less (the per-tensor inventory,
    ``torch_state``, at its coordinates against the bill's). Logical bytes and the gradients left after the last
    micro-batch are not terms of the bill and come from the inventory alone; so do the parts of the bill's
    communication buffers (DDP's buckets, FSDP2's gathered units and its transient buffers) where FSDP2 adds
    buffers a CPU cannot see.
    """
    bill, here = r.bill, _torch_state(case, r, r.at)
    base = _torch_state(case, r, dataclasses.replace(r.at, tp_rank=0, ep_rank=0, fsdp_rank=0))

    def less(quantity: str) -> float:
        return float(getattr(here, quantity) - getattr(base, quantity))

    out = {
        "params_storage_bytes": bill.weights_bytes + less("params_storage_bytes"),
        "grads_peak_bytes": bill.gradients_bytes + less("grads_storage_bytes"),
        "optimizer_bytes": bill.optimizer_bytes + less("optimizer_bytes"),
        "params_bytes": here.params_bytes,
        "grads_bytes": here.grads_bytes,
        "grads_storage_bytes": here.grads_storage_bytes,
        "gathered_params_after_forward_bytes": here.gathered_root_bytes,
        "fsdp_transient_bytes": here.fsdp_transient_bytes,
    }
    if case.layout.zero == ZeroStage.NONE:  # the bill's buffers are DDP's buckets alone
        out["ddp_bucket_bytes"] = bill.comm_buffers_bytes + less("ddp_bucket_bytes")
    if not case.conditions.reshard_after_forward:  # every unit gathered, and one reduce-scatter input: all visible
        out["comm_buffers_bytes"] = bill.comm_buffers_bytes
    return {q: float(v) for q, v in out.items()}


def _activations(case: Case, shape: Shape, r: _Rank) -> tuple[float, float, float]:
    """(saved over the step, saved at the peak, stage outputs at the peak) of one rank, from the stage bill.

    The bill's activations and loss hold ``in_flight`` micro-batches, the stage outputs a pipeline stage keeps
    outside autograd among them (invisible on CPU): one micro-batch's share of the rest, times the step's
    micro-batches, is what the step saves in all."""
    lay, work = case.layout, r.work
    m = case.micro_batches
    flight = pipeline.in_flight(schedule=lay.schedule, pp=lay.pp, vpp=lay.vpp, m=m, stage=r.stage)
    tokens = shape.seq_len / lay.cp * lay.micro_batch
    last = r.stage == lay.pp - 1
    outputs = act.stage_output_bytes(
        r.model, tokens=tokens, act_bytes=work.precision.activation_bytes, last=last, framework=work.framework
    )
    held = flight * outputs if lay.pp > 1 else 0.0
    per_mb = (r.bill.activations_bytes + r.bill.logits_bytes - held) / flight
    return float(m * per_mb), float(flight * per_mb), float(held)


def _cluster(world_size: int) -> Cluster:
    """Any fleet: the check compares counts and bytes, never times."""
    gpu = io.load_gpu("h100-sxm")
    scale_up, scale_out = io.load_link(gpu.scale_up_link), io.load_link(gpu.scale_out_link)
    return Cluster(gpu=gpu, num_gpus=world_size, scale_up=scale_up, scale_out=scale_out, domain_size=world_size)


def _calls(case: Case, shape: Shape, r: _Rank) -> list[CollectiveCall]:
    lay = case.layout
    stage = stage_params(count_params(r.model), r.model, tp=lay.tp, pp=lay.pp, ep=lay.ep, stage=r.stage)
    st = StageShape(
        tokens=shape.seq_len / lay.cp * lay.micro_batch,
        dense_layers=r.units.dense_layers,
        moe_layers=r.units.moe_layers,
        micro_batches=case.micro_batches,
        dense_params=stage.dense,
        expert_params=stage.experts,
        first_stage=r.stage == 0,
        last_stage=r.stage == lay.pp - 1,
        embedding=r.stage == 0,
        head=r.stage == lay.pp - 1,
        tp_rank=r.at.tp_rank,
        ddp_buffer_bytes=rotary_buffer_bytes(shape, cp=lay.cp) if case.syncs_buffers else 0.0,
    )
    placement, cluster = place(mesh_sizes(lay), domain=case.world_size), _cluster(case.world_size)
    calls = inventory(r.model, lay, r.work, cluster, placement, st)
    if case.reshard_root:  # an explicit True on the root is no condition of the schema: FSDP2's calls again
        fsdp = (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)
        calls = [c for c in calls if not (c.strategy == "dp" and c.op in fsdp)]
        group = lay.dp_shard * lay.cp
        calls += torch_calls.fsdp_calls(
            r.model, lay, r.work, cluster, placement["dp_shard"], st, group=group, inner=group, reshard_root=True
        )
    return [c for c in calls if c.count_per_step > 0 and c.group_size > 1]


def _kind(call: CollectiveCall) -> str:
    return "send" if call.op is Collective.SEND_RECV else str(call.op.value)


def _receiver(case: Case, rank: int, call: CollectiveCall) -> int:
    """The rank a point-to-point call of ``rank`` sends to: the next (forward) or previous (backward) pipeline
    stage, or the next rank of a ring."""
    c = case.coords(rank)
    axis = case.axis_of_call(call)
    step = -1 if call.strategy == "pp" and call.phase == "backward" else 1
    target = dict(c, **{axis: (c[axis] + step) % dict(case.mesh)[axis]})
    return next(r for r in range(case.world_size) if case.coords(r) == target)


def _collectives(case: Case, name: str, calls: dict[int, list[CollectiveCall]]) -> Iterator[Predicted]:
    """Each rank's calls, and for every send the matching receive on the rank it reaches."""
    for rank, rank_calls in calls.items():
        for call in rank_calls:
            yield from _values(case, name, rank, call, _kind(call))
            if call.op is Collective.SEND_RECV:
                yield from _values(case, name, _receiver(case, rank, call), call, "recv")


def _values(case: Case, name: str, rank: int, call: CollectiveCall, kind: str) -> Iterator[Predicted]:
    common: dict[str, Any] = dict(layout=name, rank=rank, phase=PHASES[call.phase], axis=case.axis_of_call(call))
    yield Predicted(quantity=f"{kind}_count", value=float(call.count_per_step), **common)
    quantity = f"{kind}_bytes"
    routed = case.moe and quantity in ROUTING_DEPENDENT
    yield Predicted(quantity=quantity, value=float(call.bytes_per_step), routing_dependent=routed, **common)


def predict(name: str, world_size: int, dense: object, moe: object | None = None) -> Prediction:
    """Every quantity of harness layout ``name`` on ``world_size`` ranks; ``dense`` / ``moe`` are TinyConfigs."""
    case = case_for(name, world_size, micro_batch=Shape.of(dense).micro_batch)
    shape = Shape.of(moe if case.moe and moe is not None else dense)
    if case.world_size != world_size:
        raise ValueError(f"layout {name} needs a world size its mesh {case.mesh} fills, got {world_size}")
    values: list[Predicted] = []
    calls: dict[int, list[CollectiveCall]] = {}
    unmeasured: dict[str, float] = {}
    for rank in range(world_size):
        r = _rank(case, shape, rank)
        state = _state(case, r)
        transient = state.pop("fsdp_transient_bytes")
        if transient and rank == 0:
            unmeasured["fsdp_transient_bytes"] = transient
        if r.bill.activation_workspace_bytes and rank == 0:
            unmeasured["recompute_workspace_bytes"] = float(r.bill.activation_workspace_bytes)
        for q, v in state.items():
            phase = "forward" if q == "gathered_params_after_forward_bytes" else "state"
            values.append(Predicted(layout=name, rank=rank, quantity=q, phase=phase, value=v))
        total, peak, held = _activations(case, shape, r)
        for q, v in (("activations_bytes", total), ("activations_peak_bytes", peak)):
            values.append(
                Predicted(
                    layout=name, rank=rank, quantity=q, phase="forward", value=float(v), routing_dependent=case.moe
                )
            )
        if held and rank == 0:
            unmeasured["pipeline_stage_outputs_bytes"] = float(held)
        calls[rank] = _calls(case, shape, r)
    values += _merge(_collectives(case, name, calls))
    return Prediction(layout=name, case=case, values=values, unmeasured=unmeasured)


def _merge(items: Iterator[Predicted]) -> list[Predicted]:
    """One value per (rank, quantity, phase, axis): calls of one kind add up."""
    merged: dict[tuple[int, str, str, str], Predicted] = {}
    for p in items:
        key = (p.rank, p.quantity, p.phase, p.axis)
        old = merged.get(key)
        merged[key] = p if old is None else dataclasses.replace(old, value=old.value + p.value)
    return list(merged.values())
