"""Serving phases on one GPU: a decode step and a prefill chunk, term by term.

Decode step of a batch of B sequences with context c (per GPU of a TP x PP replica):
  GEMMs     max(W_read / (HBM e_hbm), 2 P_active B / (peak e_mm s(B)))   weights read once, then compute bound
  attention max(B c kv_tok / (HBM e_hbm), F_attn(B, c) / (peak e_attn))  the KV cache of every sequence
  + TP all-reduces (2 per layer, alpha + 2(n-1)/n bytes / bw) + EP dispatch/combine + PP sends + overheads
where s(M) = M / (M + d_half) is the GEMM shape efficiency of the GPU kind. Each kernel class is its own
roofline (a GEMM is memory or compute bound, the attention kernel likewise) and the classes run one after
another. Prefill of T tokens after c0 cached ones: the same GEMMs with M = T, causal attention
4 T (c0 + T/2) a d per layer, memory-bound ops at HBM speed. An engine that launches its kernels op by op
(``--launch eager``) cannot run a forward faster than its host issues the layers' kernels: the forward takes
max(GPU time, host time) (core/time/host.py), the difference its own term (``host_wait_s``). Every array argument
broadcasts (numpy).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from meshplan.core.comm.cost import Collective, nccl_time
from meshplan.core.num import Num, maximum, where
from meshplan.core.serving.shape import (
    ACT_BYTES,
    AllReduceKernel,
    Hardware,
    Quant,
    ReplicaShape,
    ServeLayout,
    compute_dtype,
    prefill_keys,
    sliding_context,
)
from meshplan.core.time.host import Launch, host_stall_s, serving_host_layer_s
from meshplan.spec.cluster import Link
from meshplan.spec.model import ModelSpec
from meshplan.units import DType

EP_DISPATCH_BYTES = 1.0 + 4 / 128
"""Bytes per value a token's hidden state takes to its experts: fp8 values and an fp32 scale per 128 of them
(DeepEP's fp8 dispatch message, hidden + hidden / 128 x 4 bytes, tests/test_low_latency.py) ..."""
EP_COMBINE_BYTES = 2.0
"""... and back from them (bf16 combine)."""
EP_LOW_LATENCY_RDMA_SHARE = 0.80
"""Share of the NIC's line rate DeepEP's low-latency kernels move, every copy of a token counted: 39-41 GB/s per
H800 on a ~50 GB/s ConnectX-7 at EP32-256 for both dispatch and combine (DeepEP README, 'Low-latency kernels with
pure RDMA', 128 tokens per batch, fp8 dispatch / bf16 combine; the 2025 table the May 2025 runs used, before its
NVLink path of 2025-06-05, #173). A share of line rate, not of the link's large-collective efficiency."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MlaDecodeKernel:
    """A published decode kernel for absorbed multi-head latent attention (every query head against the shared
    latent cache, one query a sequence): its shares of the measuring GPU's dense bf16 peak when compute bound and
    of its HBM bandwidth when memory bound, both with the paged cache it serves from."""

    compute_share: float
    bandwidth_share: float
    source: str


MLA_DECODE_KERNELS = {
    "flashmla": MlaDecodeKernel(
        compute_share=660e12 / 989.4e12,
        bandwidth_share=3000e9 / 3.35e12,
        source="FlashMLA README, performance update of 2025-04-22 (deepseek-ai/FlashMLA c2067be): up to 660 "
        "TFLOP/s compute bound and 3,000 GB/s memory bound on H800 SXM5 (989.4 TFLOP/s dense bf16, 3.35 TB/s), "
        "paged cache of 64-token blocks",
    ),
}
"""Decode attention of MLA models, by the kernel a GPU kind's calibration names (``mla_decode_kernel``). The
engines serving MLA on Hopper run such a kernel (FlashMLA, and the absorbed-MLA kernels of FlashInfer and
FlashAttention 3); its rates replace the engine family's attention share and paged-cache read share, which come
from GQA/MHA decode kernels. Prefill's attention is the non-absorbed kernel and keeps the family's share."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Forward:
    """One forward of the stage on one GPU: seconds by term (arrays where inputs are arrays)."""

    weights_read_s: Num
    kv_read_s: Num
    gemm_compute_s: Num
    attention_compute_s: Num
    memory_ops_s: Num
    tp_comm_s: Num
    ep_comm_s: Num
    pp_comm_s: Num
    overhead_s: Num
    host_wait_s: Num = 0.0
    """What the GPU waits for the host to issue the forward's kernels when they launch op by op (``--launch
    eager``): max(GPU, host) - GPU; 0 under replayed CUDA graphs."""

    @property
    def gemm_s(self) -> Num:
        return maximum(self.weights_read_s, self.gemm_compute_s)

    @property
    def attention_s(self) -> Num:
        return maximum(self.kv_read_s, self.attention_compute_s)

    @property
    def comm_s(self) -> Num:
        return self.tp_comm_s + self.ep_comm_s + self.pp_comm_s

    @property
    def total_s(self) -> Num:
        return self.gemm_s + self.attention_s + self.memory_ops_s + self.comm_s + self.overhead_s + self.host_wait_s

    def breakdown(self) -> dict[str, Num]:
        """Seconds by what bounds them: the binding side of each roofline, then the rest."""
        gemm_mem = self.weights_read_s >= self.gemm_compute_s
        attn_mem = self.kv_read_s >= self.attention_compute_s
        return {
            "weights_read_s": where(gemm_mem, self.weights_read_s, 0.0),
            "kv_read_s": where(attn_mem, self.kv_read_s, 0.0),
            "compute_s": where(gemm_mem, 0.0, self.gemm_compute_s)
            + where(attn_mem, 0.0, self.attention_compute_s)
            + self.memory_ops_s,
            "communication_s": self.comm_s,
            "overhead_s": self.overhead_s,
            "host_wait_s": self.host_wait_s,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class MixedStep:
    """The steady state's average step: a share of the steps carry a prefill chunk, the others only decode.

    A prompt reaches the GPU as whole chunks (a prompt, or the engine's tokens-per-step budget of it), not as
    a trickle of b I / O tokens in every step: the steps that carry one are compute bound while the others
    stream the weights, so the chunk's math does not hide under the decode steps' weight read."""

    plain: Forward
    """A step with only the batch's decode tokens."""
    carrying: Forward
    """A step with a prefill chunk beside them."""
    share: Num
    """Share of the steps that carry a chunk."""

    @property
    def total_s(self) -> Num:
        return (1 - self.share) * self.plain.total_s + self.share * self.carrying.total_s

    def breakdown(self) -> dict[str, Num]:
        plain, carrying = self.plain.breakdown(), self.carrying.breakdown()
        return {k: (1 - self.share) * plain[k] + self.share * carrying[k] for k in plain}


def pipeline_factor(hw: Hardware, layout: ServeLayout) -> float:
    """Seconds of a token's round through all stages per second of one stage's forward: pp, over the
    engine's pipeline efficiency when pp > 1."""
    return layout.pp / (hw.cal.pp_efficiency if layout.pp > 1 else 1.0)


def shape_efficiency(m: Num, half_dim: float) -> Num:
    """s(M) = M / (M + d_half): a GEMM with few rows falls off its peak (gemm.gemm_time's factor)."""
    return m / (m + half_dim)


def _hbm_bytes_per_s(hw: Hardware, layout: ServeLayout) -> float:
    share = hw.cal.weight_only_bandwidth_share.get(layout.weights_dtype.value, 1.0)
    share = share if layout.quant is Quant.WEIGHT_ONLY else 1.0
    return hw.gpu.hbm_bandwidth_bytes_per_s * hw.cal.hbm_efficiency * share


def allreduce_s(
    size_bytes: Num, *, n: int, link: Link, kernel: AllReduceKernel, floor_s: float, per_rank_s: float = 0.0
) -> Num:
    """One all-reduce of ``size_bytes`` over ``n`` ranks: the engine's own kernel (a latency floor on two ranks,
    ``per_rank_s`` more for each rank beyond them, plus the ring's 2(n-1)/n bytes) or NCCL, whose ring or tree pays
    a hop latency per step (its tuner's cheapest protocol)."""
    if n == 1:
        return 0.0 * size_bytes
    bw = link.effective_bytes_per_s
    if kernel is AllReduceKernel.CUSTOM:
        return floor_s + (n - 2) * per_rank_s + 2 * (n - 1) / n * size_bytes / bw
    return nccl_time(
        Collective.ALL_REDUCE,
        size_bytes=size_bytes,
        inner=n,
        outer=1,
        inner_bytes_per_s=bw,
        outer_bytes_per_s=bw,
        inner_latency_s=link.latency_s,
        outer_latency_s=link.latency_s,
    )


def forward(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    *,
    new_tokens: Num,
    decode_pairs: Num,
    prefill_pairs: Num,
    kv_tokens_read: Num,
    group_tokens: Num,
    logits: Num,
    layer_overhead_s: float,
    ep_per_node: bool,
) -> Forward:
    """One forward on one GPU: ``new_tokens`` local tokens attend over (query, key) pairs, decode and
    prefill ones apart, reading ``kv_tokens_read`` cached tokens; ``group_tokens`` tokens reach the
    experts of the TP group; ``logits`` tokens go through the LM head."""
    cal, gpu = hw.cal, hw.gpu
    hbm = _hbm_bytes_per_s(hw, layout)
    kernel = gpu.calibration.mla_decode_kernel
    mla = MLA_DECODE_KERNELS[kernel] if model.mla is not None and kernel is not None else None
    kv_efficiency = mla.bandwidth_share if mla is not None else cal.hbm_efficiency * cal.kv_read_share
    decode_attention_efficiency = mla.compute_share if mla is not None else cal.attention_efficiency
    dtype = compute_dtype(layout)
    fp8 = gpu.calibration.fp8_matmul_ratio if dtype is DType.FP8 else 1.0  # the kind's FP8 share, as in training
    peak = gpu.peak(dtype) * gpu.calibration.matmul_efficiency_max * fp8 * cal.matmul_share.get(dtype.value, 1.0)
    n_micro = micro_batches(model, hw, layout)  # each reads the weights once and runs its GEMMs on its own rows
    touched = 1.0 - (1.0 - shape.expert_fraction) ** (group_tokens / n_micro) if model.moe else 0.0
    weights = n_micro * (shape.dense_weight_bytes + shape.expert_weight_bytes * touched / cal.moe_matmul_share)
    half = gpu.calibration.matmul_half_dim
    dense_flops = 2 * (shape.gemm_params_per_token * new_tokens + shape.lm_head_params * logits)
    gemm = dense_flops * shape.gemm_depth / (peak * shape_efficiency(maximum(new_tokens / n_micro, 1.0), half))
    if model.moe is not None:  # the busiest expert rank sets the pace: imbalance x the mean load
        expert_rows = maximum(group_tokens / n_micro * shape.expert_fraction, 1.0)
        imbalance = cal.ep_imbalance if layout.ep > 1 else 1.0
        expert_flops = 2 * shape.expert_params_per_token * new_tokens * imbalance * shape.expert_depth
        gemm = gemm + expert_flops / (peak * cal.moe_matmul_share * shape_efficiency(expert_rows, half))
    attn = (
        decode_pairs * shape.attn_flops_per_pair_decode / decode_attention_efficiency
        + prefill_pairs * shape.attn_flops_per_pair_prefill / cal.attention_efficiency
    ) / gpu.peak(DType.BF16)
    tp_link = hw.link(layout.tp)
    ar_bytes = new_tokens * model.hidden * ACT_BYTES * (layout.tp if layout.dp_attention else 1)
    n_ar = 0 if layout.dp_attention and model.moe else 2
    ar = allreduce_s(
        ar_bytes,
        n=layout.tp,
        link=tp_link,
        kernel=cal.allreduce,
        floor_s=cal.allreduce_latency_s,
        per_rank_s=cal.allreduce_latency_per_rank_s,
    )
    tp_comm = n_ar * shape.layers * ar
    out = Forward(
        weights_read_s=weights / hbm,
        kv_read_s=kv_tokens_read * shape.kv_bytes_per_token / (gpu.hbm_bandwidth_bytes_per_s * kv_efficiency),
        gemm_compute_s=gemm,
        attention_compute_s=attn,
        memory_ops_s=new_tokens * shape.memory_bytes_per_token / (gpu.hbm_bandwidth_bytes_per_s * cal.hbm_efficiency),
        tp_comm_s=tp_comm,
        ep_comm_s=_ep_comm_s(model, shape, hw, layout, new_tokens=new_tokens, per_node=ep_per_node, n_micro=n_micro),
        pp_comm_s=_pp_send_s(model, hw, layout, new_tokens=new_tokens),
        overhead_s=step_host_s(hw, layout, sequences=logits) + layer_overhead_s * shape.layers + 0.0 * new_tokens,
    )
    if cal.launch is Launch.CUDAGRAPH:
        return out
    # the host floor (core/time/host.py): the GPU's work of the forward (everything but the host's work between
    # forwards, which it spends before it issues anything) waits on the host issuing its layers' kernels
    moe_layers = min(model.num_moe_layers, shape.layers) if model.moe is not None else 0
    host = n_micro * (
        moe_layers * serving_host_layer_s(model, launch=cal.launch, tp=layout.tp, moe_layer=True)
        + (shape.layers - moe_layers) * serving_host_layer_s(model, launch=cal.launch, tp=layout.tp, moe_layer=False)
    )
    gpu_s = out.total_s - step_host_s(hw, layout, sequences=logits)
    return dataclasses.replace(out, host_wait_s=host_stall_s(host_s=host, gpu_s=gpu_s))


def step_host_s(hw: Hardware, layout: ServeLayout, *, sequences: Num) -> Num:
    """The host's work between two forwards, the GPU idle through it: the engine's fixed cost per step
    (``step_overhead_s``) and, for each of the ``sequences`` the step samples, ``sequence_host_s`` (scheduling,
    input preparation, the sampler's and the output processing's loops) and ``worker_sequence_host_s`` for each of
    the replica's worker processes the step's metadata is sent to (tp x pp)."""
    cal = hw.cal
    per_sequence = cal.sequence_host_s + layout.tp * layout.pp * cal.worker_sequence_host_s
    return cal.step_overhead_s + sequences * per_sequence


def micro_batches(model: ModelSpec, hw: Hardware, layout: ServeLayout) -> int:
    """2 where the engine runs two-batch overlap on this layout (an EP layout under attention-DP), else 1."""
    ep_layout = model.moe is not None and layout.dp_attention and layout.ep > 1
    return 2 if hw.cal.two_batch_overlap and ep_layout else 1


def _ep_comm_s(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    *,
    new_tokens: Num,
    per_node: bool,
    n_micro: int = 1,
) -> Num:
    """Dispatch (fp8) and combine (bf16) all-to-all of each MoE layer under attention-DP, the part not hidden.

    Of a token's k copies, k (D - 1) / ep go to other GPUs of its scale-up domain (D GPUs) and k (ep - D) / ep
    to other domains over the NICs. DeepEP's normal kernels (prefill, ``per_node``) send a token once to
    each other domain it needs and forward it over NVLink there: (n - 1)(1 - (1 - 1/n)^k) NIC copies for n
    domains, the slower of the two paths setting the pace; its low-latency kernels (decode) send all k copies
    over RDMA when the group spans domains (pure RDMA), at EP_LOW_LATENCY_RDMA_SHARE of line rate, and over
    the scale-up links inside one domain. DeepEP writes straight into each destination's buffer (no tree, no
    ring): dispatch and combine add one link latency each, once per micro-batch. The engine's overlap share
    of the phase's kernels (``ep_overlap`` for the normal ones, ``ep_overlap_decode`` for the low-latency
    ones) is hidden."""
    if model.moe is None or not layout.dp_attention or layout.ep == 1:
        return 0.0 * new_tokens
    k, ep = model.moe.experts_per_token, layout.ep
    domain = min(hw.gpu.scale_up_domain, ep)
    nodes = -(-ep // domain)
    per_copy = new_tokens * model.hidden * (EP_DISPATCH_BYTES + EP_COMBINE_BYTES)
    if per_node or nodes == 1:
        on_copies = k * (domain - 1) / ep
        off_copies = (nodes - 1) * (1 - (1 - 1 / nodes) ** k) if per_node else 0.0
        moved = maximum(
            per_copy * on_copies / hw.scale_up.effective_bytes_per_s,
            per_copy * off_copies / hw.scale_out.effective_bytes_per_s,
        )
    else:
        moved = per_copy * k / (hw.scale_out.bandwidth_bytes_per_s * EP_LOW_LATENCY_RDMA_SHARE)
    per_layer = moved + n_micro * 2 * hw.link(ep).latency_s
    moe_layers = min(model.num_moe_layers, shape.layers)
    overlap = hw.cal.ep_overlap if per_node else hw.cal.ep_overlap_decode
    return moe_layers * per_layer * hw.cal.ep_imbalance * (1 - overlap)


def _pp_send_s(model: ModelSpec, hw: Hardware, layout: ServeLayout, *, new_tokens: Num) -> Num:
    """The activation a stage hands to the next (one send per forward; the last stage sends nothing)."""
    if layout.pp == 1:
        return 0.0 * new_tokens
    link = hw.link(layout.tp * layout.pp)
    return link.latency_s + new_tokens * model.hidden * ACT_BYTES / link.effective_bytes_per_s


def decode_step(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    *,
    batch: Num,
    context: Num,
    prefill_tokens: Num = 0.0,
    rows: Num | None = None,
) -> Forward:
    """One decode step of ``batch`` sequences per GPU (per micro-batch under PP) at mean ``context``,
    with ``prefill_tokens`` of chunked prefill riding along (their attention at mean depth context/2).
    ``rows``: the decode rows the GEMMs, all-reduces and memory-bound ops compute when a CUDA graph pads the
    batch (serve_shape.graph_batch); the KV cache is read for the ``batch`` real sequences only."""
    sliding = sliding_context(model, context)
    rows = batch if rows is None else rows
    group = rows * (layout.tp if layout.dp_attention else 1) + prefill_tokens
    new = rows + prefill_tokens
    return forward(
        model,
        shape,
        hw,
        layout,
        new_tokens=new,
        decode_pairs=batch * sliding,
        prefill_pairs=prefill_tokens * sliding_context(model, context / 2),
        kv_tokens_read=batch * sliding,
        group_tokens=group,
        logits=rows,
        layer_overhead_s=hw.cal.layer_overhead_s,
        ep_per_node=False,
    )


def prefill(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    *,
    tokens: Num,
    cached: Num = 0.0,
    sequences: Num = 1.0,
) -> Forward:
    """A prefill forward of ``tokens`` new tokens after ``cached`` ones (causal: each attends to half the
    chunk on average, sliding-window layers at most their window: ``prefill_keys``), ``sequences`` of them ending
    here (their last token goes through the LM head)."""
    group = tokens * (layout.tp if layout.dp_attention else 1)
    return forward(
        model,
        shape,
        hw,
        layout,
        new_tokens=tokens,
        decode_pairs=0.0,
        prefill_pairs=tokens * prefill_keys(model, cached=cached, chunk=tokens / sequences),
        kv_tokens_read=0.0 * tokens,
        group_tokens=group,
        logits=sequences,
        layer_overhead_s=hw.cal.prefill_layer_overhead_s,
        ep_per_node=True,
    )
