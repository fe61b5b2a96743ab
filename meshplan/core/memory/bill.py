"""The training memory bill of one GPU, term by term, for any hybrid layout.

Model state follows the ZeRO paper (Rajbhandari et al. 2020, Sec. 3 and 5):
2 + 2 + 12 = 16 bytes per parameter under bf16 mixed precision with Adam,
each part divided by the data-parallel shard group from the ZeRO stage that
partitions it, over the parameters the stage holds (stage_params.py). Activations follow Korthikanti et al.
2022 (activations.py) times the micro-batches a pipeline stage holds in flight (stage_activations.py).

Every function here broadcasts: the layout's degrees may be ints or numpy
arrays of candidate layouts.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from meshplan.core import finetune, pipeline
from meshplan.core.memory.stage_activations import LayerActivations, StageActivations, stage_activations
from meshplan.core.memory.stage_params import StageParams, layer_rank_params, layout_stage_params
from meshplan.core.num import Num, gcd, maximum, to_float, where
from meshplan.core.params import ParamCount
from meshplan.core.pytorch import shards
from meshplan.core.stages import candidate_stages, stage_row, vocab_params_per_rank
from meshplan.spec.cluster import GpuCalibration
from meshplan.spec.layout import LayoutLike, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Framework, OptimizerKind, Workload
from meshplan.units import DTYPE_BYTES, FP32_BYTES, DType


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBill:
    """What one GPU holds at its peak, by disjoint term (bytes)."""

    weights_bytes: Num
    adapter_weights_bytes: Num
    gradients_bytes: Num
    master_weights_bytes: Num
    optimizer_moments_bytes: Num
    activations_bytes: Num
    logits_bytes: Num
    activation_workspace_bytes: Num
    dequant_workspace_bytes: Num
    comm_buffers_bytes: Num
    framework_bytes: Num
    fragmentation_bytes: Num
    runtime_reserve_bytes: Num

    @property
    def optimizer_bytes(self) -> Num:
        """Master weights plus optimizer moments: the state the optimizer step owns."""
        return self.master_weights_bytes + self.optimizer_moments_bytes

    @property
    def model_state_bytes(self) -> Num:
        """Weights, gradients and optimizer state (the ZeRO paper's 'model states')."""
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> Num:
        return sum(getattr(self, name) for name in TERMS)

    @property
    def reserved_bytes(self) -> Num:
        """What the caching allocator holds at the peak (torch.cuda.max_memory_reserved): the total less what
        lives outside the allocator (CUDA context and workspaces, the runtime's reserve)."""
        return self.total_bytes - self.framework_bytes - self.runtime_reserve_bytes

    @property
    def allocated_bytes(self) -> Num:
        """Bytes of live tensors at the peak (torch.cuda.max_memory_allocated): reserved less fragmentation."""
        return self.reserved_bytes - self.fragmentation_bytes

    def as_dict(self) -> dict[str, Num]:
        """Every term, the optimizer subtotal, the allocator's allocated and reserved peaks and the total."""
        out = {name: getattr(self, name) for name in TERMS}
        out["optimizer_bytes"] = self.optimizer_bytes
        out["allocated_bytes"] = self.allocated_bytes
        out["reserved_bytes"] = self.reserved_bytes
        out["total_bytes"] = self.total_bytes
        return out


TERMS: tuple[str, ...] = tuple(f.name for f in fields(MemoryBill))


def moment_bytes_per_param(model: ModelSpec, workload: Workload) -> float:
    """Optimizer-moment bytes per parameter (master weights excluded)."""
    opt = workload.optimizer
    if opt.state_bytes_per_param is not None:
        return opt.state_bytes_per_param
    if opt.kind is OptimizerKind.ADAFACTOR:
        # a row and a column vector of fp32 per matrix: (1/rows + 1/cols) per parameter
        return FP32_BYTES * (1 / model.hidden + 1 / model.ffn_hidden)
    return opt.num_moments * workload.precision.moment_bytes


def shard_degrees(*, dp_shard: Num, cp: Num, ep: Num, tp: Num = 1, etp: Num = 1) -> tuple[Num, Num]:
    """(dense, expert) ZeRO shard-group sizes.

    Dense state is sharded over dp_shard * cp (FSDP's and the distributed
    optimizer's group); expert state over the part of the experts' own data
    group outside the expert-parallel group: with the TP ranks an expert does
    not split (tp / etp) counted as data ranks of the experts (MoE parallel
    folding, whose expert-data-parallel group is tp cp dp / (ep etp)),
    g / gcd(g, ep) with g = dp_shard * cp * tp / etp.
    """
    group = dp_shard * cp
    expert_group = group * tp // etp  # whole: ep * etp divides tp * cp * dp
    return group, expert_group // gcd(expert_group, ep)


def state_bytes_per_param(model: ModelSpec, workload: Workload) -> float:
    """Weights, gradients, master copy and optimizer moments per trained parameter, before any sharding: the
    back-of-envelope figure (16 bytes under bf16 mixed precision with Adam; ZeRO paper Sec. 3.1)."""
    prec = workload.precision
    return prec.weight_bytes + prec.grad_bytes + prec.master_bytes + moment_bytes_per_param(model, workload)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageTraining:
    """Parameters of one GPU's stage split by what happens to them in training."""

    base_dense: Num
    base_experts: Num
    """The model's own parameters (frozen under LoRA / QLoRA)."""
    adapter_dense: Num
    adapter_experts: Num
    """LoRA adapters (0 in full training)."""
    train_dense: Num
    train_experts: Num
    """What gets gradients and optimizer state: the adapters, or the parameters not frozen."""
    quantized: Num
    """Base matmul weights stored in NF4 (QLoRA), 0 otherwise."""


def stage_training(
    model: ModelSpec, params: ParamCount, lay: LayoutLike, workload: Workload, *, stage: Num, held: StageParams
) -> StageTraining:
    """Split one GPU's stage parameters into base, adapters and trainable (fine-tuning aware)."""
    ft = workload.finetune
    if ft.adapted:
        dense_a, exp_a = finetune.adapter_split(model, ft, moe_layer=False, tp=lay.tp, ep=lay.ep)
        dense_m, exp_m = finetune.adapter_split(model, ft, moe_layer=True, tp=lay.tp, ep=lay.ep)
        ad = held.dense_layers * dense_a + held.moe_layers * dense_m
        ae = held.dense_layers * exp_a + held.moe_layers * exp_m
        quantized: Num = 0.0
        if finetune.quantized_base(ft):
            # kept in bf16: the embedding, the output head (its own copy unless tied on one stage), final norm
            vocab, last = vocab_params_per_rank(model, tp=lay.tp), stage == lay.pp - 1
            head = where((lay.pp > 1) | (not model.tied_embeddings), vocab, 0.0)
            edges = where(stage == 0, vocab + params.position_embedding, 0) + where(last, head + model.norm_params, 0)
            quantized = finetune.quantizable_params(
                model,
                dense=held.dense,
                experts=held.experts,
                layers=held.dense_layers + held.moe_layers,
                edges=edges,
            )
        edges_trained: Num = 0.0
        if ft.train_embeddings:  # the embedding and the output head train beside the adapters
            vocab = vocab_params_per_rank(model, tp=lay.tp)
            head = where((lay.pp > 1) | (not model.tied_embeddings), vocab, 0.0)
            edges_trained = where(stage == 0, vocab, 0) + where(stage == lay.pp - 1, head, 0)
        return StageTraining(
            base_dense=held.dense,
            base_experts=held.experts,
            adapter_dense=ad,
            adapter_experts=ae,
            train_dense=ad + edges_trained,
            train_experts=ae,
            quantized=quantized,
        )
    frozen_dense: Num = 0.0
    frozen_experts: Num = 0.0
    if ft.freeze_embeddings:
        frozen_dense = where(stage == 0, vocab_params_per_rank(model, tp=lay.tp) + params.position_embedding, 0)
    if ft.freeze_layers:
        first = stage_row(model, pp=lay.pp, stage=stage, split=workload.conditions.stage_split).first_layer
        n = finetune.frozen_leading_layers(ft, first=first, layers=held.dense_layers + held.moe_layers)
        layer = params.dense_layer if params.num_dense_layers >= ft.freeze_layers else params.moe_layer
        d, e = layer_rank_params(layer, model, tp=lay.tp, ep=lay.ep, etp=lay.etp)
        frozen_dense, frozen_experts = frozen_dense + n * d, n * e
    return StageTraining(
        base_dense=held.dense,
        base_experts=held.experts,
        adapter_dense=0.0,
        adapter_experts=0.0,
        train_dense=held.dense - frozen_dense,
        train_experts=held.experts - frozen_experts,
        quantized=0.0,
    )


def _model_state(
    model: ModelSpec, lay: LayoutLike, workload: Workload, tr: StageTraining
) -> tuple[Num, Num, Num, Num, Num]:
    """(weights, adapter weights, gradients, master weights, moments) bytes of one GPU, after ZeRO sharding.

    The base is kept in the weight dtype (NF4 for QLoRA's matmul weights); gradients and optimizer state
    exist only for what trains. QLoRA's adapters are bf16 and updated in place by a 32-bit AdamW, with no fp32
    master copy (the QLoRA reference training script).
    """
    shard, expert_shard = shard_degrees(dp_shard=lay.dp_shard, cp=lay.cp, ep=lay.ep, tp=lay.tp, etp=lay.etp)
    divisors: dict[ZeroStage, tuple[Num, Num]] = {}

    def sharded(dense: Num, experts: Num, from_stage: ZeroStage) -> Num:
        if from_stage not in divisors:  # each stage's divisors once (a search's arrays are long)
            on = lay.zero >= from_stage
            divisors[from_stage] = where(on, shard, 1), where(on, expert_shard, 1)
        d, e = divisors[from_stage]
        return dense / d + experts / e

    prec = workload.precision
    ft = workload.finetune
    base = sharded(tr.base_dense, tr.base_experts, ZeroStage.PARAMETERS)
    if finetune.quantized_base(ft):
        quant = finetune.base_bytes_per_param(ft)  # NF4 or GPTQ int4 with their scales
        share = tr.quantized / maximum(tr.base_dense + tr.base_experts, 1.0)
        weights = base * (share * quant + (1 - share) * DTYPE_BYTES[DType.BF16])
    else:
        weights = base * prec.weight_bytes
    optimizer_held = sharded(tr.train_dense, tr.train_experts, ZeroStage.OPTIMIZER)
    return (
        weights,
        sharded(tr.adapter_dense, tr.adapter_experts, ZeroStage.PARAMETERS) * prec.weight_bytes,
        sharded(tr.train_dense, tr.train_experts, ZeroStage.GRADIENTS) * prec.grad_bytes,
        optimizer_held * (0.0 if finetune.quantized_base(ft) else prec.master_bytes),
        optimizer_held * moment_bytes_per_param(model, workload),
    )


def state_bytes(model: ModelSpec, params: ParamCount, lay: LayoutLike, workload: Workload, *, stage: Num) -> Num:
    """Model-state bytes of one GPU of ``stage`` (Megatron-style accounting): a lower bound of its whole bill,
    which the planner uses to drop hopeless layouts before it computes activations."""
    held = layout_stage_params(params, model, lay, workload, stage=stage)
    if workload.framework is Framework.TORCH:
        return 0.0 * held.dense  # PyTorch-native state is billed tensor by tensor: no shortcut
    tr = stage_training(model, params, lay, workload, stage=stage, held=held)
    return sum(_model_state(model, lay, workload, tr))


def stage_bill(
    model: ModelSpec,
    params: ParamCount,
    layout: LayoutLike,
    workload: Workload,
    *,
    calibration: GpuCalibration,
    stage: Num,
    layer_acts: LayerActivations | None = None,
    activations: StageActivations | None = None,
    held: StageParams | None = None,
) -> MemoryBill:
    """The bill of one GPU on pipeline stage ``stage``; ``layout`` is a Layout or a batch of them.

    One pass, top to bottom: the parameters this GPU holds, their state (weights, gradients, master copy,
    moments, gathered copies), the activations its stage keeps, then what the runtime keeps beside them.
    ``activations`` and ``held``: the stage's activations (``stage_activations``) and parameters
    (``stage_params``) when already known, else found here.
    """
    lay = layout
    # 1. parameters: what this GPU's stage holds, by kind, after TP, EP and the stage split
    held = held or layout_stage_params(params, model, lay, workload, stage=stage)
    # 2. their state: Megatron-style by parameter count, or PyTorch-native tensor by tensor
    st = _stage_state(model, params, lay, workload, stage=stage, held=held)
    # 3. activations: what the stage keeps for backward over the micro-batches in flight, the logits, workspaces
    a = activations or stage_activations(model, params, lay, workload, stage=stage, layer_acts=layer_acts, held=held)
    acts, logits, workspace = a.saved, a.logits, a.workspace
    dequant = where(finetune.quantized_base(workload.finetune), 2.0 * finetune.largest_matrix(model, tp=lay.tp), 0.0)
    # 4. the runtime: its own bytes, the allocator's fragmentation of what comes and goes, the reserve kept back
    dynamic = acts + logits + workspace + dequant + st.gathered
    return MemoryBill(
        weights_bytes=to_float(st.weights),
        adapter_weights_bytes=to_float(st.adapters + 0 * dynamic),
        gradients_bytes=to_float(st.grads),
        master_weights_bytes=to_float(st.master),
        optimizer_moments_bytes=to_float(st.moments),
        activations_bytes=to_float(acts),
        logits_bytes=to_float(logits),
        activation_workspace_bytes=to_float(workspace),
        dequant_workspace_bytes=to_float(dequant + 0 * dynamic),
        comm_buffers_bytes=to_float(st.gathered),
        framework_bytes=to_float(calibration.framework_bytes + 0 * dynamic),
        fragmentation_bytes=to_float(calibration.fragmentation * dynamic),
        runtime_reserve_bytes=to_float(workload.conditions.runtime_reserve_bytes + 0 * dynamic),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _StateBytes:
    """One GPU's model state and gathered parameters (bytes)."""

    weights: Num
    adapters: Num
    grads: Num
    master: Num
    moments: Num
    gathered: Num


def _stage_state(
    model: ModelSpec, params: ParamCount, lay: LayoutLike, workload: Workload, *, stage: Num, held: StageParams
) -> _StateBytes:
    """Model state of one GPU on ``stage`` and the parameters ZeRO-3 / FSDP holds gathered, after gradient
    accumulation and resharding. Two branches: PyTorch-native full training is billed tensor by tensor
    (``pytorch.shards``); everything else (Megatron-style stacks, and fine-tuning under any stack) by
    parameter count, sharded by the ZeRO stage."""
    tr = stage_training(model, params, lay, workload, stage=stage, held=held)
    if workload.framework is Framework.TORCH and not workload.finetune.adapted:
        weights, grads, master, moments, gathered = _torch_native_state(model, lay, workload, stage=stage)
        adapters: Num = 0.0
        if not shards.fsdp_zero2(workload):  # DeepSpeed's ZeRO-2: whole weights, gradients and optimizer sharded
            ds = lay.zero == ZeroStage.GRADIENTS
            by_count = _model_state(model, lay, workload, tr)
            weights, grads = where(ds, by_count[0], weights), where(ds, by_count[2], grads)
            master, moments = where(ds, by_count[3], master), where(ds, by_count[4], moments)
            gathered = where(ds, 0.0, gathered)
    else:
        weights, adapters, grads, master, moments = _model_state(model, lay, workload, tr)
        gathered = _zero3_gathered(lay, workload, held=held)
        if workload.framework is Framework.TORCH:  # fine-tuning under a PyTorch-native stack
            moments = moments + _adapter_step_bytes(model, lay, workload, held=held)
    grads, gathered = _accumulation_state(model, lay, workload, tr=tr, held=held, grads=grads, gathered=gathered)
    return _StateBytes(
        weights=weights, adapters=adapters, grads=grads, master=master, moments=moments, gathered=gathered
    )


def _zero3_gathered(lay: LayoutLike, workload: Workload, *, held: StageParams) -> Num:
    """ZeRO-3 / FSDP's gathered copy of the largest layer and its unsharded gradient, where parameters are
    sharded."""
    prec = workload.precision
    shard, _ = shard_degrees(dp_shard=lay.dp_shard, cp=lay.cp, ep=lay.ep)
    return where(
        (lay.zero >= ZeroStage.PARAMETERS) & (shard > 1),
        held.largest_layer * (2 * shards.gather_bytes(prec, fp8=workload.conditions.fp8_all_gather) + prec.grad_bytes),
        0,
    )


def _adapter_step_bytes(model: ModelSpec, lay: LayoutLike, workload: Workload, *, held: StageParams) -> Num:
    """torch.optim's 0-dim fp32 step per trained tensor: thousands of small adapter tensors."""
    ft, step = workload.finetune, shards.OPTIMIZER_STEP_BYTES.get(workload.optimizer.kind, 0.0)
    per_layer = [finetune.adapter_tensors(model, ft, moe_layer=moe, ep=lay.ep) for moe in (False, True)]
    return step * (held.dense_layers * per_layer[0] + held.moe_layers * per_layer[1])


def _torch_native_state(
    model: ModelSpec, lay: LayoutLike, workload: Workload, *, stage: Num
) -> tuple[Num, Num, Num, Num, Num]:
    """(weights, gradients, master, moments, gathered) of PyTorch-native training, tensor by tensor
    (``pytorch.shards``): FSDP2 over dp_shard x cp from ZeRO-2 (ZeRO-2 keeping every unit gathered from forward to
    backward, as SHARD_GRAD_OP does), ZeroRedundancyOptimizer at ZeRO-1, DDP's buckets at ZeRO-0."""
    zero, cp = lay.zero, lay.cp
    fsdp = where(zero >= ZeroStage.GRADIENTS, lay.dp_shard * cp, 1)
    state = shards.torch_state(
        model,
        shards.RankCoords(tp=lay.tp, ep=lay.ep, fsdp=fsdp, etp=lay.etp),
        stage_row(model, pp=lay.pp, stage=stage, split=workload.conditions.stage_split),
        zero=zero,
        ddp_ranks=lay.dp_replicate * lay.dp_shard * cp,
        precision=workload.precision,
        optimizer=workload.optimizer.kind,
        moment_bytes=moment_bytes_per_param(model, workload),
        fp8_all_gather=workload.conditions.fp8_all_gather,
    )
    gathered = state.ddp_bucket_bytes + state.gathered_root_bytes + state.fsdp_transient_bytes
    moments = state.optimizer_bytes - state.master_bytes
    return state.params_storage_bytes, state.grads_storage_bytes, state.master_bytes, moments, gathered


def _accumulation_state(
    model: ModelSpec,
    lay: LayoutLike,
    workload: Workload,
    *,
    tr: StageTraining,
    held: StageParams,
    grads: Num,
    gathered: Num,
) -> tuple[Num, Num]:
    """(gradients, gathered parameters) once gradient accumulation and FSDP resharding are accounted for.

    Accumulating without sync (``no_sync`` / ``set_requires_gradient_sync(False)``) holds the unsharded
    gradient in the gradient dtype on every rank until the last micro-batch; with reshard-after-forward off,
    FSDP / ZeRO-3 keeps every layer of the stage gathered between forward and backward. PyTorch's pipeline
    schedules do both under FSDP whenever pp > 1 (torchtitan: parameters and fp32 gradients stay unsharded
    across the micro-batches of a step).
    """
    cond, prec = workload.conditions, workload.precision
    m = pipeline.micro_batches(workload.global_batch, micro_batch=lay.micro_batch, dp=lay.dp_replicate * lay.dp_shard)
    torch_pp = (lay.pp > 1) if workload.framework is Framework.TORCH else False
    shard, _ = shard_degrees(dp_shard=lay.dp_shard, cp=lay.cp, ep=lay.ep)
    no_sync = ((not cond.grad_sync) | torch_pp) & (m > 1) & (lay.zero >= ZeroStage.GRADIENTS) & (shard > 1)
    unsharded_grads = (tr.train_dense + tr.train_experts) * prec.grad_bytes
    grads = where(no_sync, maximum(grads, unsharded_grads), grads)
    keep = ((not cond.reshard_after_forward) | torch_pp) & (lay.zero >= ZeroStage.PARAMETERS) & (shard > 1)
    stage_gathered = (held.dense + held.experts) * shards.gather_bytes(prec, fp8=cond.fp8_all_gather)
    gathered = where(keep, maximum(gathered, stage_gathered + held.largest_layer * prec.grad_bytes), gathered)
    return grads, gathered


def candidates(model: ModelSpec, lay: LayoutLike, workload: Workload) -> tuple[Num, ...]:
    """The stages of ``lay`` that hold the maximum of every term (``stages.candidate_stages``)."""
    frozen = workload.finetune.freeze_layers if not workload.finetune.adapted else 0
    return candidate_stages(
        model, pp=lay.pp, boundaries=(frozen,) if frozen else (), split=workload.conditions.stage_split
    )
