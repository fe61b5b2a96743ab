"""evaluate(): one layout on one fleet, all of it: memory per stage, placement, collectives, step time."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.core.comm import CollectiveCall
from meshplan.core.comm.call import scale_up_share
from meshplan.core.constraints import check_layout
from meshplan.core.memory.pressure import hbm_pressure, pressure_warning
from meshplan.core.params import count_params
from meshplan.core.placement import DEFAULT_ORDER, AxisPlacement, place, whole_node_size
from meshplan.core.time.flops import megatron_core_flops, megatron_flops, model_flops_per_token, narayanan_flops
from meshplan.core.time.step_time import StepTime, step_time
from meshplan.core.training import TrainingMemory, training_memory
from meshplan.spec.cluster import Cluster
from meshplan.spec.conditions import Fp8Recipe
from meshplan.spec.layout import Layout
from meshplan.spec.model import MlpKind, ModelSpec
from meshplan.spec.workload import Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """Everything meshplan predicts for one layout."""

    model: ModelSpec
    cluster: Cluster
    layout: Layout
    workload: Workload
    order: tuple[str, ...]
    memory: TrainingMemory
    placement: dict[str, AxisPlacement]
    step: StepTime
    collectives: tuple[CollectiveCall, ...]
    """The collectives of a full middle stage's GPU (counts per step)."""

    @property
    def tp_crosses_domain(self) -> bool:
        """TP groups leave the scale-up domain: every layer's collectives cross the slow fabric."""
        return bool(self.placement["tp"].outer > 1)

    def warnings(self) -> list[str]:
        out = []
        if self.tp_crosses_domain:
            domain, tp, spans = self.cluster.domain_size, self.layout.tp, int(self.placement["tp"].outer)
            who = (
                f"TP={tp} does not tile the scale-up domains of {domain} GPUs: the groups that straddle two run"
                if tp <= domain
                else f"TP={tp} spans {spans} scale-up domains of {domain} GPUs: its groups run"
            )
            out.append(
                f"{who} their per-layer collectives over {self.cluster.scale_out.name} at "
                f"{self.cluster.scale_out.bandwidth_bytes_per_s / 1e9:.0f} GB/s instead of "
                f"{self.cluster.scale_up.name} at {self.cluster.scale_up.bandwidth_bytes_per_s / 1e9:.0f} GB/s"
            )
        out += self._straddle_warnings()
        out += self._direct_board_warnings()
        if self.model.max_seq_len and self.workload.seq_len > self.model.max_seq_len:
            out.append(
                f"seq {self.workload.seq_len:,} exceeds the model's maximum of {self.model.max_seq_len:,} tokens"
            )
        pressure = float(hbm_pressure(self.memory.per_gpu.total_bytes, self.memory.hbm_bytes))
        out += pressure_warning(pressure, fits=self.memory.fits)
        if self.workload.conditions.fp8_recipe is Fp8Recipe.ROWWISE:
            out.append(
                "rowwise FP8: its casts are priced, its rowwise-scaled GEMM kernels are not; on torchtitan's "
                "published rowwise runs this model's throughput is 13% high on one node of 8 H100s (tensorwise: 9%) "
                "and 18-47% high with TP 8 (docs/validation.md): the step time is likely optimistic"
            )
        if not self.memory.fits:
            out.append(
                f"does not fit: {self.memory.per_gpu.total_bytes / 1e9:.1f} GB needed on stage "
                f"{self.memory.heaviest_stage}, {self.memory.hbm_bytes / 1e9:.1f} GB of HBM"
            )
        return out

    def _straddle_warnings(self) -> list[str]:
        """Context- and expert-parallel groups whose ranks would fit one scale-up domain but which the fleet's
        rank-by-rank filling splits over two (core/placement.py): named, with the node size that keeps them whole."""
        domain, out = self.cluster.domain_size, []
        for axis, name in (("cp", "CP"), ("ep", "EP")):
            p = self.placement[axis]
            span = int(p.stride) * int(p.size)
            if int(p.size) > 1 and int(p.outer) > 1 and span <= domain:
                keep = whole_node_size(span, domain)
                out.append(
                    f"{name}={int(p.size)} does not tile the scale-up domains of {domain} GPUs: the groups that "
                    f"straddle two send over {self.cluster.scale_out.name}; a scheduler that gives the job {keep} "
                    f"GPUs a domain (Slurm --segment) keeps each whole: --node-size {keep}"
                )
        return out

    def _direct_board_warnings(self) -> list[str]:
        """Groups that share a switchless scale-up domain with other GPUs: they reach only their own peers' links."""
        cl = self.cluster
        if cl.scale_up_switched or cl.domain_size <= 2:
            return []
        peers = cl.domain_size - 1
        inside = {axis: int(p.inner) for axis, p in self.placement.items() if axis != "etp"}
        short = [
            f"{axis} {n} ({n - 1} of {peers} peers' links, {scale_up_share(cl, n):.0%})"
            for axis, n in inside.items()
            if 1 < n < cl.domain_size
        ]
        if not short:
            return []
        return [
            f"the scale-up domain of {cl.domain_size} GPUs is a board of direct links with no switch: "
            f"{', '.join(short)} of {cl.scale_up.name}'s bandwidth (docs/formulas.md section 7)"
        ]


def mesh_sizes(layout: object) -> dict[str, object]:
    """Degrees of every placement axis, EP and the experts' TP included (ints or arrays)."""
    return {name: getattr(layout, name) for name in ("tp", "cp", "ep", "etp", "dp_shard", "dp_replicate", "pp")}


def evaluate(
    model: ModelSpec, cluster: Cluster, layout: Layout, workload: Workload, *, order: tuple[str, ...] = DEFAULT_ORDER
) -> Plan:
    """Evaluate one layout; raises ValueError naming the broken rule when it does not suit the model or fleet."""
    check_layout(model, layout, workload, cluster.num_gpus)
    memory = training_memory(model, layout, workload, gpu=cluster.gpu)
    placement = place(mesh_sizes(layout), order=order, domain=cluster.domain_size)
    step, calls = step_time(model, count_params(model), layout, workload, cluster, placement)
    return Plan(
        model=model,
        cluster=cluster,
        layout=layout,
        workload=workload,
        order=order,
        memory=memory,
        placement=placement,
        step=step,
        collectives=tuple(c for c in calls if bool(c.count_per_step > 0)),
    )


METRICS = (
    "mfu",
    "tokens_per_s_per_gpu",
    "iteration_time_s",
    "tflops_per_gpu_eq3",
    "tflops_per_gpu_megatron",
    "tflops_per_gpu_mcore",
)
"""The figures published runs report, each as meshplan predicts it (``metric_value``)."""


def full_attention_mfu(plan: Plan) -> float:
    """MFU as Llama 3's Table 4 counts it (the one source whose metric is MFU): model FLOPs with the attention over
    the whole context, 6 N + 6 L a (d_qk + d_v) s per token (torchtitan's count, Meta's PyTorch stack: 6 N + 12 L H Q
    T), over the peak of the matmuls' dtype. The reports' ``mfu`` halves the attention (causal); counted so, the
    128K row, where attention is 57% of these FLOPs, would read 0.28 against the published 0.38 (the 8K rows lose
    4%), a drop from 8K the paper's 41% -> 38% does not show."""
    w = plan.workload
    per_token = model_flops_per_token(plan.model, seq_len=w.attention_span, finetune=w.finetune, causal=False)
    peak = plan.cluster.gpu.peak(w.precision.compute)
    return float(per_token * w.seq_len * w.global_batch / (plan.step.step_time_s * plan.cluster.num_gpus * peak))


def metric_value(plan: Plan, metric: str) -> float:
    """A plan's figure in the unit a publication reports: MFU (as the one source reporting it counts it,
    ``full_attention_mfu``), tokens per second per GPU, the iteration time, or achieved TFLOP/s per GPU counted as
    Narayanan et al. 2021 Eq. 3, as Megatron-LM's logger counts them, or as Megatron-Core's 2025 logger does."""
    step, m, w = plan.step, plan.model, plan.workload
    if metric == "iteration_time_s":
        return float(step.step_time_s)
    if metric == "mfu":
        return full_attention_mfu(plan)
    if metric == "tokens_per_s_per_gpu":
        return float(step.tokens_per_s_per_gpu)
    if metric == "tflops_per_gpu_eq3":
        flops = narayanan_flops(
            batch=w.global_batch, layers=m.num_layers, seq=w.seq_len, hidden=m.hidden, vocab=m.vocab_size
        )
        return float(flops / (step.step_time_s * plan.cluster.num_gpus) / 1e12)
    if metric == "tflops_per_gpu_megatron":
        flops = megatron_flops(
            batch=w.global_batch,
            layers=m.num_layers,
            seq=w.seq_len,
            hidden=m.hidden,
            vocab=m.vocab_size,
            ffn_hidden=m.ffn_hidden,
            kv_heads=m.num_kv_heads,
            heads=m.num_heads,
            gated=m.mlp is MlpKind.GATED,
        )
        return float(flops / (step.step_time_s * plan.cluster.num_gpus) / 1e12)
    if metric == "tflops_per_gpu_mcore":
        flops = megatron_core_flops(m, batch=w.global_batch, seq=w.seq_len)
        return float(flops / (step.step_time_s * plan.cluster.num_gpus) / 1e12)
    raise ValueError(f"unknown metric {metric!r}")
