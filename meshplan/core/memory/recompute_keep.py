"""What a layer keeps under ``--recompute selective --recompute-keep``: its input and the named tensors, tensor by
tensor (the names: ``spec.conditions.RECOMPUTE_KEEP``). Backward reruns every other op of the layer's forward, as
torch.utils.checkpoint does with a selective policy that saves the named ops' outputs (``core/time/stage_time.py``
pays for it). Every function broadcasts over numpy arrays of layouts."""

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
