"""What PyTorch-native stacks run beyond the layer's kernels, at HBM speed: torchao's dynamic FP8 casts, FSDP2's
and the functional collectives' copies on the compute stream, and which matmuls torchtitan's per-op selective
checkpointing recomputes."""

from __future__ import annotations

from meshplan.core.num import Num, where
from meshplan.core.time.flops import Gemm
from meshplan.spec.model import MlpKind, ModelSpec

DYNAMIC_CAST_BYTES = 4.0
"""torchao's Float8Linear (dynamic scaling: the scale is the tensor's amax of this very use), per element of each
tensor it casts (input, weight, output gradient): once the amax is known, one kernel reads the bf16 tensor and
writes it in FP8 twice, row- and column-major, for the forward and the backward GEMMs (2 + 1 + 1 bytes; torchao
torchao/float8/roofline_utils.py get_tensor_memory_traffic_bytes)."""
DYNAMIC_AMAX_BYTES = 2.0
"""The amax pass before that cast, reading the bf16 tensor: torch.compile fuses it into the kernel that produced
an input or an output gradient (roofline_utils: fuse_with_prev), never into a weight's, which FSDP gathers
(eager PyTorch fuses nothing)."""
ROWWISE_CAST_BYTES = {False: 8.0, True: 6.0}
"""torchao's rowwise recipe (one scale per row of each operand, along the GEMM's reduction dimension), per element
of an input or an output gradient: its two GEMMs reduce along different dimensions, so it is scaled twice. One
kernel reads the bf16 tensor (2; fused into its producer under torch.compile: 0), writes it in FP8 along dim 0 (1)
and writes its bf16 transpose (2); a second reads that transpose (2) and writes it in FP8 (1): 8, or 6 fused. The
row maxima are taken inside the casts, no amax pass (torchao/testing/training/roofline_utils.py,
get_tensor_memory_traffic_ovhd_s, 'rowwise')."""
ROWWISE_WEIGHT_CAST_BYTES = 10.0
"""The same recipe per weight element: the forward cast (read 2, write 1), the bf16 transpose (read 2, write 2)
and its cast (read 2, write 1); a weight has no producer to fuse into."""


def fsdp2_copy_bytes(*, gathered: float, act_bytes: float, grad_bytes: float) -> tuple[float, float]:
    """(forward, backward) bytes per weight element FSDP2 copies on the compute stream for one layer and
    micro-batch: after each all-gather (forward, and again in backward when it resharded) the gathered buffer split
    into the parameters (``foreach_all_gather_copy_out``: read and write ``gathered`` bytes), and before the
    reduce-scatter the unsharded gradients copied into its input in the reduce dtype (``foreach_reduce``'s
    ``_chunk_cat``: read ``act_bytes``, write ``grad_bytes``). torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py; the all-gather's own copy-in moves the 1/n shard only, not counted."""
    copy_out = 2 * gathered
    return copy_out, copy_out + act_bytes + grad_bytes


def tp_chunk_cat_bytes(
    *,
    width_bytes: float,
    gather_width_bytes: float,
    micro_batch: Num,
    replayed_gathers: Num,
    replayed_scatters: Num,
    full: Num,
    fused: bool,
) -> tuple[Num, Num]:
    """(forward, backward) bytes per token one layer copies around its sequence-parallel collectives, which
    PyTorch's functional collectives issue along the sequence dimension of [b, s, h] activations
    (torch/distributed/_functional_collectives.py): a reduce-scatter first regroups its input by rank
    (``_chunk_or_narrow_cat``: read and write the whole buffer), and an all-gather's output, grouped by rank,
    is regrouped by sequence (``_maybe_view_chunk_cat``), a view when b = 1 and a copy otherwise. Forward: two
    all-gathers and two reduce-scatters; backward: their autograd counterparts (a reduce-scatter for each
    all-gather and the reverse), the forward gathers and scatters a selective policy runs again
    (``comm.tp.selective_replays``) and, under full recompute (``full`` = 1), the whole forward's.
    ``width_bytes``: h x the activation bytes; ``gather_width_bytes``: h x the bytes the forward all-gathers
    move (1 under torchao's Float8 tensorwise TP, which casts before it gathers).

    ``fused`` (async TP): the all-gathers that feed a matmul and the reduce-scatters of one matmul's output run
    as fused matmul-collectives, which restride their operands instead of copying
    (torch/distributed/_symmetric_memory ``restride_A_shard_for_fused_all_gather_matmul``); the backward
    reduce-scatters of the input gradients, each a sum of several matmuls' (wq, wk, wv; w1, w3), match no
    fused pattern and keep their copy."""
    buffer, gathered = 2.0 * width_bytes, 2.0 * gather_width_bytes  # read and write one [b, s, h] buffer
    if fused:
        return 0.0, 2.0 * buffer
    gather = where(micro_batch > 1, 1.0, 0.0)
    forward = 2.0 * gather * gathered + 2.0 * buffer
    backward = (2.0 + 2.0 * gather + replayed_scatters) * buffer + replayed_gathers * gather * gathered
    return forward, backward + full * forward


def keep_gemm_share(model: ModelSpec, g: Gemm, keep: tuple[str, ...]) -> float:
    """Share of ``g`` whose output ``--recompute-keep`` saves, so backward need not run it again: the fused Q/K/V
    GEMM split by the widths of the kept projections, the gate/up GEMM by its halves; MLA's down projections and
    the router, whose outputs are never named, are recomputed."""
    kept = set(keep)
    gated = model.mlp is MlpKind.GATED
    if g.name == "qkv":
        widths = {"q": model.q_width, "k": model.kv_width, "v": model.kv_width}
        return sum(w for name, w in widths.items() if name in kept) / (model.q_width + 2 * model.kv_width)
    if g.name in ("q", "q_up"):
        return 1.0 if "q" in kept else 0.0
    if g.name == "kv_up" and model.mla is not None:
        nope, v = model.mla.qk_nope_head_dim, model.mla.v_head_dim
        return (nope * ("k" in kept) + v * ("v" in kept)) / (nope + v)
    if g.name == "attn_out":
        return 1.0 if "o" in kept else 0.0
    if g.name in ("mlp_up", "expert_up", "shared_up"):
        return (("gate" in kept) + ("up" in kept)) / 2 if gated else float("up" in kept)
    if g.name in ("mlp_down", "expert_down", "shared_down"):
        return 1.0 if "down" in kept else 0.0
    return 0.0


def op_sac_share(model: ModelSpec, g: Gemm, *, moe_layer: bool) -> float:
    """Share of ``g`` torchtitan's per-op selective checkpointing recomputes: every second aten.mm of a block in
    call order, of wq, wk, wv, wo, w1, w3, w2 the 2nd, 4th and 6th (wk, wo, w3; without a gate, of wq, wk, wv, wo,
    w1, w2: wk, wo, w2), the fused Q/K/V and gate/up GEMMs split by their FLOPs; the others' outputs are saved
    (torchtitan ``_apply_op_sac``, as core/memory/recompute_keep.py ``op_checkpoint_per_token`` bills them). MLA and MoE
    layers, whose matmuls are other ops: half of every GEMM."""
    if model.mla is not None or moe_layer:
        return 0.5
    gated = model.mlp is MlpKind.GATED
    shares = {
        "qkv": model.kv_width / (model.q_width + 2 * model.kv_width),
        "attn_out": 1.0,
        "mlp_up": 0.5 if gated else 0.0,
        "mlp_down": 0.0 if gated else 1.0,
    }
    return shares.get(g.name, 0.5)
