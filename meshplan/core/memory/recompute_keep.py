"""What a layer keeps under the selective policies that name what to keep or to recompute: ``--recompute-keep``, its
input and the named tensors, tensor by tensor (the names: ``spec.conditions.RECOMPUTE_KEEP``), backward rerunning
every other op of the layer's forward as torch.utils.checkpoint does with a selective policy that saves the named
ops' outputs (``core/time/stage_time.py`` pays for it); Megatron's ``--recompute-modules``
(``module_savings_per_token``); torchtitan's per-op policy (``op_checkpoint_per_token``). Every function broadcasts
over numpy arrays of layouts."""

from __future__ import annotations

from meshplan.core.memory import activations as act
from meshplan.core.num import Num, maximum, where
from meshplan.spec.layout import LayoutLike
from meshplan.spec.model import MlpKind, ModelSpec
from meshplan.spec.workload import Workload
from meshplan.units import FP32_BYTES


def keep_tensor_bytes_per_token(
    model: ModelSpec, lay: LayoutLike, workload: Workload, *, moe_layer: bool, lin: act.LinearInputs
) -> dict[str, Num]:
    """Bytes per local token of each tensor ``--recompute-keep`` can name (``RECOMPUTE_KEEP``), and ``input``, the
    layer's input, which a checkpointed layer always keeps.

    norm: the QKV and MLP inputs (each as its linear layer keeps it, 1/t under SP unless the framework keeps them
    gathered); q, k, v: the projections' outputs, k d / t wide each for K and V under GQA (one head per rank at
    least), MLA's up-projected heads; attn: the attention kernel's output and its fp32 log-sum-exp per head;
    o and down: the row-parallel projections' outputs, h wide (unreduced under TP); gate, up, act: the MLP's f / t
    wide tensors (act kept as the down projection's input), in a MoE layer the routed copies' expert widths and
    the shared experts'.
    """
    beta, tp, h = workload.precision.activation_bytes, lay.tp, model.hidden
    split = act.input_split(tp, lay.sp, workload.framework)
    ffn: Num = model.ffn_hidden / tp
    if moe_layer and model.moe is not None:
        moe = model.moe
        copies = moe.experts_per_token * where(lay.sp, lay.etp / tp, 1.0)  # as act.mlp_bytes_per_token
        ffn = copies * moe.expert_ffn_hidden / lay.etp + moe.num_shared_experts * moe.shared_hidden / tp
    if model.mla is not None:
        q = k = model.num_heads * model.mla.qk_head_dim / tp
        v = model.num_heads * model.mla.v_head_dim / tp
    else:
        q = model.q_width / tp
        k = v = maximum(model.num_kv_heads / tp, 1.0) * model.head_dim
    gated = model.mlp is MlpKind.GATED
    return {
        "input": beta * h * where(lay.sp, 1.0 / tp, 1.0),
        "norm": 2 * lin.own_bytes * h * split,
        "q": beta * q,
        "k": beta * k,
        "v": beta * v,
        "attn": beta * model.attn_out_width / tp + FP32_BYTES * model.num_heads / tp,
        "o": beta * h,
        "gate": beta * ffn if gated else 0.0 * ffn,
        "up": beta * ffn,
        "act": lin.own_bytes * ffn,
        "down": beta * h,
    }


def keep_per_token(
    model: ModelSpec, lay: LayoutLike, workload: Workload, *, moe_layer: bool, lin: act.LinearInputs
) -> Num:
    """Bytes per local token a layer keeps under ``--recompute-keep``: its input and the named tensors."""
    tensors = keep_tensor_bytes_per_token(model, lay, workload, moe_layer=moe_layer, lin=lin)
    return tensors["input"] + sum((tensors[name] for name in workload.conditions.recompute_keep), 0.0)


def module_savings_per_token(
    model: ModelSpec, lay: LayoutLike, workload: Workload, *, moe_layer: bool, lin: act.LinearInputs
) -> Num:
    """Bytes per token a layer no longer keeps when Megatron recomputes the listed modules (core_attn apart).

    layernorm: the two norm outputs (the QKV and MLP inputs, beta h each, 1/t under SP); mlp: a dense MLP's
    input and internals (beta h split + n beta f / t); moe: everything the MoE block keeps inside its forward,
    which Megatron checkpoints whole (the router's tensors, each routed copy's rows and bookkeeping, the experts'
    and the shared experts' internals: ``act.moe_internal_bytes_per_token``); moe_act: the experts' activation
    output (beta f_e / t per routed copy); shared_experts: their internals; mla_up_proj: MLA's up-projected
    queries, keys and values (beta (q + k + v) / t).
    """
    mods = set(workload.conditions.recompute_modules)
    beta, tp, h = workload.precision.activation_bytes, lay.tp, model.hidden
    split = act.input_split(tp, lay.sp, workload.framework)
    per_f = act.mlp_internal_bytes(model, kernels=workload.kernels, act_bytes=beta, inputs=lin)
    moe = model.moe if moe_layer else None
    mlp_in = lin.block_input_bytes(beta, moe_layer=moe is not None)
    out: Num = 0.0
    if "layernorm" in mods:
        out = out + (lin.own_bytes + mlp_in) * h * split
    if "mlp" in mods and moe is None:
        out = out + mlp_in * h * split * ("layernorm" not in mods) + per_f * model.ffn_hidden / tp
    if moe is not None:
        copies = moe.experts_per_token * where(lay.sp, lay.etp / tp, 1.0)  # as act.mlp_bytes_per_token
        shared = moe.num_shared_experts * per_f * moe.shared_hidden / tp
        if "moe" in mods:  # the whole MoE forward is checkpointed: only the block's input stays
            inside = act.moe_internal_bytes_per_token(
                model,
                tp=tp,
                sp=lay.sp,
                act_bytes=beta,
                kernels=workload.kernels,
                framework=workload.framework,
                routing_imbalance=act.busiest_rank_share(lay.ep, workload.conditions.routing_imbalance),
                etp=lay.etp,
                inputs=lin,
            )
            out = out + mlp_in * h * split * ("layernorm" not in mods) + inside
        else:
            if "moe_act" in mods:  # the down projections' inputs, as they were kept
                out = out + copies * lin.own_bytes * moe.expert_ffn_hidden / lay.etp
            if "shared_experts" in mods:
                out = out + shared
    if "mla_up_proj" in mods and model.mla is not None:
        out = out + beta * (model.q_width + 2 * model.num_heads * model.mla.v_head_dim) / tp
    return out


def op_checkpoint_per_token(model: ModelSpec, lay: LayoutLike, workload: Workload, *, moe_layer: bool) -> Num:
    """Bytes per token a layer keeps under torchtitan's per-op selective checkpointing.

    Its policy (torchtitan ``_apply_op_sac``) counts a block's matmuls and recomputes every second one: of
    wq, wk, wv, wo, w1, w3, w2 it saves the outputs of the 1st, 3rd, 5th and 7th, wq (q), wv (kv), w1 (f) and w2
    (h); it also saves the attention kernel's output and log-sum-exp, and keeps the layer input to rebuild the
    rest: beta (h/t_sp + (attention out)/t + (q + kv + f) / t + h + 2 h/t [SP]) + 4 fp32 log-sum-exp per head,
    with f the MLP width of the layer (top-k experts' under MoE, taken as one MLP of that width). Under TP, w2 is
    row-parallel: its output is the unreduced sum at full width h; with SP the two reduce-scatters' outputs
    (on the save list) are kept too, h/t each. MoE layers keep their experts' output at h/t. Measured by
    ``meshplan check`` (fsdp_sac_op at f = 2h and f = 3h; tp_sac_op and sp_sac_op).
    """
    beta, tp = workload.precision.activation_bytes, lay.tp
    ffn = model.ffn_hidden
    down_out = model.hidden  # w2's output, unreduced under TP
    if moe_layer and model.moe is not None:
        ffn = model.moe.expert_ffn_hidden * model.moe.experts_per_token
        down_out = model.hidden / tp
    saved_matmuls = (model.q_width + model.kv_width + ffn) / tp + down_out
    layer_input = model.hidden * where(lay.sp, 1.0 / tp, 1.0)
    scattered = where(lay.sp, 2.0 * model.hidden / tp, 0.0)
    lse = FP32_BYTES * model.num_heads / tp
    return beta * (layer_input + model.attn_out_width / tp + saved_matmuls + scattered) + lse
