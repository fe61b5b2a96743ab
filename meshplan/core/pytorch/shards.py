"""What one GPU holds of every parameter tensor, exactly, and the training state PyTorch keeps for it.

PyTorch splits a dim of n rows over k ranks in chunks of ceil(n / k) rows (``torch.chunk``, DTensor's
``Shard``): the last ranks may hold fewer rows, or none. FSDP2 shards dim 0 of every (TP-local) parameter
the same way over its group and pads each rank's shard to ceil(dim0 / k) rows, so its storage, all-gather and
reduce-scatter buffers are sums over tensors of padded shards (``fully_shard``'s ``_sharded_param_data``).
DDP reduces gradients in buckets: the first closes at 1 MiB, the next ones at 25 MiB, each closing after the
tensor that reaches its cap, filled in the order gradients become ready (the reverse of the forward order).

Every function broadcasts over numpy arrays of layouts (degrees and ranks may be arrays); loops run over the
tensors of one layer, never over layouts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from meshplan.core.num import Num, ceil_div, gcd, maximum, minimum, where
from meshplan.core.params import ParamTensor, embedding_tensors, head_tensors, layer_tensors
from meshplan.core.stages import StageRow
from meshplan.spec.conditions import ZeroGradReduce
from meshplan.spec.layout import ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import OptimizerKind, PrecisionPolicy, Workload
from meshplan.units import DTYPE_BYTES, DType, MiB

DDP_FIRST_BUCKET_BYTES = 1 * MiB
"""``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``: the first gradient bucket after DDP rebuilds them."""
DDP_BUCKET_BYTES = 25 * MiB
"""DDP's default ``bucket_cap_mb`` = 25."""
OPTIMIZER_STEP_BYTES = {OptimizerKind.ADAMW: 4.0, OptimizerKind.ADAFACTOR: 4.0}
"""torch.optim keeps a 0-dim fp32 ``step`` tensor per parameter for these optimizers."""


def chunk_rows(rows: Num, parts: Num, index: Num) -> Num:
    """Rows chunk ``index`` holds when ``rows`` rows are split in chunks of ceil(rows / parts)."""
    return minimum(maximum(rows - index * ceil_div(rows, parts), 0), ceil_div(rows, parts))


def gather_bytes(precision: PrecisionPolicy, *, fp8: bool = False) -> float:
    """Bytes per element of parameters gathered for compute: the compute dtype (fp32 when computing in TF32);
    ``fp8``: the weights are all-gathered in FP8 (torchao's enable_fsdp_float8_all_gather, tensorwise scaling:
    the gathered Float8 tensor is what the matmul reads, no bf16 copy)."""
    if fp8:
        return DTYPE_BYTES[DType.FP8]
    return DTYPE_BYTES[DType.FP32] if precision.compute is DType.TF32 else DTYPE_BYTES[DType.BF16]


@dataclass(frozen=True, slots=True, kw_only=True)
class RankCoords:
    """Where one GPU sits on the axes that split parameters (degrees and ranks, ints or arrays)."""

    tp: Num = 1
    tp_rank: Num = 0
    ep: Num = 1
    ep_rank: Num = 0
    fsdp: Num = 1
    """FSDP2's shard group (dp_shard x cp under ZeRO-3; 1 otherwise)."""
    fsdp_rank: Num = 0
    etp: Num = None
    """TP degree inside each routed expert (None: tp; 1 when EP folds over TP)."""
    expert_fsdp: Num = None
    """FSDP2's shard group of the routed experts (None: ``expert_fsdp_group`` of the degrees above)."""


def expert_fsdp_group(at: RankCoords) -> Num:
    """The ranks FSDP2 shards a routed expert over: those of its shard group outside the EP group.

    Expert parallelism already gives each rank its own E / ep experts, so torchtitan wraps them in a unit of
    their own on the ``dp_shard_mod_ep`` mesh, (dp_shard cp tp / etp) / ep ranks where EP borrows from the shard
    group (and from the TP ranks an expert does not split); the rest of the layer stays on the whole shard group
    (torchtitan parallelize.py apply_fsdp: ``fully_shard(transformer_block.moe.experts, mesh=dp_mod_ep_mesh)``;
    ParallelDims: dp_shard_mod_ep = dp_shard cp tp / ep when etp = 1, dp_shard cp / ep when etp = tp). Without EP
    the experts sit in their layer's unit, on the whole group."""
    if at.expert_fsdp is not None:
        return at.expert_fsdp
    etp = at.tp if at.etp is None else at.etp
    group = where(at.ep > 1, at.fsdp * at.tp // etp, at.fsdp)
    return where(at.fsdp > 1, group // gcd(group, at.ep), 1)


def local_dims(tensor: ParamTensor, at: RankCoords, *, padded: bool = False) -> tuple[Num, Num]:
    """(dim 0, elements) of this rank's TP / EP piece of ``tensor``, before FSDP2.

    ``padded``: the TP-split dim at its full chunk, as stored. ``distribute_tensor`` scatters padded chunks and
    hands the last ranks a narrowed view of theirs, so a short TP shard still occupies a whole chunk.
    """
    dims = _local_shape(tensor, at, padded=padded)
    numel: Num = 1
    for d in dims:
        numel = numel * d
    return dims[0], numel


def _local_shape(tensor: ParamTensor, at: RankCoords, *, padded: bool = False) -> list[Num]:
    dims: list[Num] = list(tensor.shape)
    if tensor.tp_dim is not None:
        size = dims[tensor.tp_dim]
        split = at.etp if tensor.expert and at.etp is not None else at.tp  # routed experts split by expert TP
        rank = at.tp_rank % split
        dims[tensor.tp_dim] = ceil_div(size, split) if padded else chunk_rows(size, split, rank)
    if tensor.expert:
        dims[0] = chunk_rows(dims[0], at.ep, at.ep_rank)
    return dims


def fsdp_numel(tensor: ParamTensor, at: RankCoords) -> tuple[Num, Num]:
    """(elements this rank owns, elements its storage holds) of ``tensor``.

    Under FSDP2 (``fsdp`` > 1) the storage is the padded shard of the TP-local tensor; without it, the TP chunk.
    A routed expert is sharded over its own group (``expert_fsdp_group``), on dim 1 where the rank's experts are
    fewer than that group (torchtitan's ``Shard(1)`` placement when efsdp x ep > the experts: no padded rows).
    """
    rows, numel = local_dims(tensor, at)
    group = expert_fsdp_group(at) if tensor.expert else at.fsdp
    rank = at.fsdp_rank % group
    per_row = numel / maximum(rows, 1)
    by_row = ceil_div(rows, group) * per_row, chunk_rows(rows, group, rank) * per_row
    if tensor.expert and len(tensor.shape) >= 2:
        cols = _local_shape(tensor, at)[1]
        per_col = numel / maximum(rows * cols, 1)
        by_col = rows * ceil_div(cols, group) * per_col, rows * chunk_rows(cols, group, rank) * per_col
        on_cols = rows < group
        by_row = where(on_cols, by_col[0], by_row[0]), where(on_cols, by_col[1], by_row[1])
    stored = where(group > 1, by_row[0], local_dims(tensor, at, padded=True)[1])
    return where(group > 1, by_row[1], numel), stored


def unit_padded_numel(tensors: tuple[ParamTensor, ...], at: RankCoords) -> Num:
    """Padded shard elements of one FSDP2 unit; the unit's all-gather output is ``fsdp`` times this."""
    return sum((fsdp_numel(t, at)[1] for t in tensors), 0.0 * at.fsdp)


def _stage_groups(model: ModelSpec, units: StageRow) -> Iterator[tuple[tuple[ParamTensor, ...], Num]]:
    """(tensors of one group, copies on the stage), in module order."""
    yield embedding_tensors(model), units.embedding
    yield layer_tensors(model, moe_layer=False), units.dense_layers
    if model.moe is not None:
        yield layer_tensors(model, moe_layer=True), units.moe_layers
    yield head_tensors(model), units.head


@dataclass(frozen=True, slots=True, kw_only=True)
class RankParams:
    """Parameter elements of one GPU's shards."""

    numel: Num
    """Elements this rank owns (DTensor's local tensors)."""
    padded_numel: Num
    """Elements its parameter storage holds: FSDP2's padded shards, or the full chunks of uneven TP splits."""
    expert_numel: Num
    """Routed-expert elements among numel."""
    tensors: Num
    """Parameter tensors on the rank."""
    vocab_rows_elsewhere: Num
    """Elements of the token table on other TP ranks (what a replicated embedding gradient adds)."""


def rank_params(model: ModelSpec, at: RankCoords, units: StageRow) -> RankParams:
    """What one GPU of a pipeline stage holding ``units`` keeps, tensor by tensor."""
    numel, padded, expert, tensors = (0.0 * at.tp,) * 4
    for group, copies in _stage_groups(model, units):
        for t in group:
            owned, stored = fsdp_numel(t, at)
            numel = numel + copies * owned
            padded = padded + copies * stored
            expert = expert + copies * owned * t.expert
            tensors = tensors + copies
    table = embedding_tensors(model)[0]
    elsewhere = units.embedding * (table.numel - local_dims(table, at)[1])
    return RankParams(
        numel=numel, padded_numel=padded, expert_numel=expert, tensors=tensors, vocab_rows_elsewhere=elsewhere
    )


def fsdp_units(model: ModelSpec, at: RankCoords, units: StageRow) -> list[tuple[str, Num, Num, Num]]:
    """(unit, padded shard elements of one unit, units of that kind on the stage, its shard group): FSDP2 wraps
    every layer and then the stage's root (embedding, final norm, output head); under EP a MoE layer's routed
    experts are a unit of their own on their group (``expert_fsdp_group``), the rest of the layer on ``fsdp``."""
    root = units.embedding * unit_padded_numel(embedding_tensors(model), at)
    root = root + units.head * unit_padded_numel(head_tensors(model), at)
    out = [("root", root, where(root > 0, 1, 0), at.fsdp)]
    out.append(("layer", unit_padded_numel(layer_tensors(model, moe_layer=False), at), units.dense_layers, at.fsdp))
    if model.moe is not None:
        tensors = layer_tensors(model, moe_layer=True)
        experts = unit_padded_numel(tuple(t for t in tensors if t.expert), at)
        own_unit = at.ep > 1
        rest = unit_padded_numel(tuple(t for t in tensors if not t.expert), at) + where(own_unit, 0.0, experts)
        out.append(("moe-layer", rest, units.moe_layers, at.fsdp))
        out.append(("experts", experts, where(own_unit, units.moe_layers, 0), expert_fsdp_group(at)))
    return out


def _ready_order(model: ModelSpec, units: StageRow) -> Iterator[tuple[ParamTensor, Num]]:
    """Every tensor of the stage with a 0/1 presence flag, in the order backward makes gradients ready."""
    groups = list(_stage_groups(model, units))
    most = [int(np.max(copies)) for _, copies in groups]
    for (group, copies), top in reversed(list(zip(groups, most, strict=True))):
        for i in reversed(range(top)):
            for t in reversed(group):
                yield t, copies > i


def ddp_buckets(model: ModelSpec, at: RankCoords, units: StageRow, *, grad_bytes: float, experts: Num = True) -> Num:
    """Gradient buckets DDP all-reduces each step, after it rebuilt them in the order gradients became ready.

    A bucket closes once it reaches its cap (1 MiB for the first, 25 MiB after), the tensor that crossed the
    cap included; a tensor is never split. ``experts`` = False leaves routed experts out (EP ranks own them).
    """
    filled, limit, buckets = 0.0 * at.tp, DDP_FIRST_BUCKET_BYTES + 0.0 * at.tp, 0 * at.tp
    for t, present in _ready_order(model, units):
        size = local_dims(t, at)[1] * grad_bytes
        take = present & (experts | (not t.expert)) & (size > 0)
        filled = filled + where(take, size, 0.0)
        close = take & (filled >= limit)
        buckets = buckets + where(close, 1, 0)
        filled = where(close, 0.0, filled)
        limit = where(close, float(DDP_BUCKET_BYTES), limit)
    return buckets + where(filled > 0, 1, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class TorchState:
    """Training-state bytes one GPU holds under PyTorch-native training (Framework.TORCH)."""

    params_bytes: Num
    """Owned parameter elements x the weight dtype (FSDP2 keeps fp32 shards under bf16 mixed precision)."""
    params_storage_bytes: Num
    """As stored: FSDP2's padded shards."""
    grads_bytes: Num
    """Owned gradients; under TP without FSDP2 the token table's gradient is whole on every TP rank."""
    grads_storage_bytes: Num
    """FSDP2's gradients are views into its padded reduce-scatter output; other gradients are allocated whole."""
    optimizer_bytes: Num
    """Moments of the owned (unpadded) elements, master weights if any, and a step tensor per parameter."""
    master_bytes: Num
    """The master-weight part of optimizer_bytes (0 under PyTorch's own policies: the fp32 shard is the weight)."""
    ddp_bucket_bytes: Num
    """DDP's bucket buffers, a second copy of the gradients it reduces (gradient_as_bucket_view=False)."""
    gathered_root_bytes: Num
    """FSDP2's units left gathered from forward to backward: the root by default (0 when resharded), every unit
    with reshard-after-forward off."""
    fsdp_transient_bytes: Num
    """FSDP2's buffers around the largest layer: its all-gather output and the next layer's prefetched one, and
    one reduce-scatter input (from the source; CPU runs cannot see them)."""


def torch_state(
    model: ModelSpec,
    at: RankCoords,
    units: StageRow,
    *,
    zero: Num,
    ddp_ranks: Num,
    precision: PrecisionPolicy,
    optimizer: OptimizerKind,
    moment_bytes: float,
    reshard_root: Num = False,
    reshard_after_forward: Num = True,
    fp8_all_gather: bool = False,
) -> TorchState:
    """The state bill of one GPU; ``ddp_ranks`` is the group DDP averages gradients over (dp x cp).

    ``zero`` picks PyTorch's form of each ZeRO stage: 3 is FSDP2 (``fully_shard``), 2 is FSDP2 with
    ``reshard_after_forward=False`` (FSDP1's SHARD_GRAD_OP, torchtitan's ``fsdp_reshard_after_forward="never"``):
    parameters, gradients and optimizer state stay sharded over ``at.fsdp`` at rest, and every unit stays gathered
    from its forward to its backward; 1 shards the optimizer state alone over ``ddp_ranks``
    (``ZeroRedundancyOptimizer``); 0 is DDP.
    ``reshard_after_forward`` False: every FSDP2 unit stays gathered between its forward and its backward
    (``fully_shard(..., reshard_after_forward=False)``), the root as by default. ``fp8_all_gather``: the layers'
    units gather in FP8 (the root, with the embedding and the output head that stay in bf16, does not)."""
    p = rank_params(model, at, units)
    fsdp = (zero >= ZeroStage.GRADIENTS) & (at.fsdp > 1)
    reshard_after_forward = reshard_after_forward & (zero >= ZeroStage.PARAMETERS)
    optimizer_shards = where((zero == ZeroStage.OPTIMIZER) & (ddp_ranks > 1), ddp_ranks, 1)
    grads_extra = where(fsdp | (at.tp == 1), 0.0, p.vocab_rows_elsewhere)
    step = OPTIMIZER_STEP_BYTES.get(optimizer, 0.0)
    ddp = (zero == ZeroStage.NONE) & (ddp_ranks > 1)
    reduced = p.numel - where(at.ep > 1, p.expert_numel, 0.0)
    sizes = fsdp_units(model, at, units)
    # gathered elements: each unit's padded shard times its group
    layers = sum((padded * n * g for _, padded, n, g in sizes[1:]), 0.0)
    kept = sizes[0][1] * at.fsdp + where(reshard_after_forward, 0.0, layers)
    largest = sizes[1][1] * sizes[1][3]
    if len(sizes) > 2:  # a MoE layer: its unit and, under EP, its experts' unit, gathered together
        largest = maximum(largest, sizes[2][1] * sizes[2][3] + where(sizes[3][2] > 0, sizes[3][1] * sizes[3][3], 0.0))
    transient = largest * (2 * gather_bytes(precision, fp8=fp8_all_gather) + precision.grad_bytes)
    return TorchState(
        params_bytes=p.numel * precision.weight_bytes,
        params_storage_bytes=p.padded_numel * precision.weight_bytes,
        grads_bytes=(p.numel + grads_extra) * precision.grad_bytes,
        grads_storage_bytes=(where(fsdp, p.padded_numel, p.numel) + grads_extra) * precision.grad_bytes,
        optimizer_bytes=(p.numel * (moment_bytes + precision.master_bytes) + p.tensors * step) / optimizer_shards,
        master_bytes=p.numel * precision.master_bytes / optimizer_shards,
        ddp_bucket_bytes=where(ddp, reduced * precision.grad_bytes, 0.0),
        gathered_root_bytes=where(where(reshard_root, False, fsdp), kept * gather_bytes(precision), 0.0),
        fsdp_transient_bytes=where(fsdp, transient, 0.0),
    )


def fsdp_zero2(work: Workload) -> bool:
    """ZeRO-2 is FSDP's SHARD_GRAD_OP (each unit gathered in every forward, its gradients reduce-scattered), not
    DeepSpeed's, which the stack says by reducing otherwise (``zero_grad_reduce``; core/comm/dp.py)."""
    return work.conditions.zero_grad_reduce is ZeroGradReduce.REDUCE_SCATTER
