"""Goodput: how much of a training job's wall time advances training, once checkpoints and failures are paid.

A job on N GPUs stops at every failure of any of them. With failures independent and memoryless, the job's
mean time between failures is the GPU's divided by N:

    M = MTBF_gpu / N

Every checkpoint save stops training for delta = checkpoint bytes / write bandwidth, and the job trains for tau
between two saves. A failure costs the restart R (requeue, start, load the checkpoint) and the work done since
the last save, tau / 2 on average:

    waste per failure   w = R + tau / 2
    wall time           W = T (1 + delta / tau) + (W / M) w      (T: the failure-free training time)
                          = T (1 + delta / tau) / (1 - w / M)
    goodput             T / W = (1 - w / M) / (1 + delta / tau)

The interval that minimises the waste to first order is Young's (J. W. Young, "A first order approximation to
the optimum checkpoint interval", Communications of the ACM 17(9), 1974):

    tau* = sqrt(2 delta M)

which J. T. Daly ("A higher order estimate of the optimum checkpoint interval for restart dumps", Future
Generation Computer Systems 22(3), 2006) confirms to first order (his higher-order optimum is
sqrt(2 delta M) - delta for delta < M / 2). First order: failures during a save or a restart cost the same w,
and w must stay below M (else the job never finishes: ``goodput_fraction`` is then 0).

The documented example failure rate is Llama 3's (Grattafiori et al., "The Llama 3 Herd of Models", 2024,
Sec. 3.3.4): 466 job interruptions (47 planned, 419 unexpected) in a 54-day snapshot of pre-training on
16,384 H100 GPUs, i.e. one every 54 x 24 / 466 = 2.78 h for the job and 45,566 GPU-hours per GPU
(``LLAMA3_MTBF_GPU_HOURS``). The paper reports over 90% effective training time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan.units import SECONDS_PER_HOUR

LLAMA3_INTERRUPTIONS = 466
LLAMA3_DAYS = 54.0
LLAMA3_GPUS = 16_384
LLAMA3_MTBF_GPU_HOURS = LLAMA3_DAYS * 24.0 * LLAMA3_GPUS / LLAMA3_INTERRUPTIONS
"""One GPU's mean time between job interruptions in Llama 3's pre-training (Sec. 3.3.4): 45,566 GPU-hours."""


def checkpoint_bytes(
    *, saved_params: float, trained_params: float, weight_bytes: float, optimizer_bytes_per_param: float
) -> float:
    """Bytes one checkpoint holds for the whole model: the weights of every saved parameter and the optimizer
    state (master copy and moments) of every trained one (14 bytes a parameter under bf16 with an fp32 master
    copy and Adam's two fp32 moments: 2 + 4 + 8)."""
    return saved_params * weight_bytes + trained_params * optimizer_bytes_per_param


def save_time_s(checkpoint_bytes: float, *, bandwidth_bytes_per_s_per_node: float, nodes: int) -> float:
    """Seconds one save takes: every node writes its GPUs' share of the checkpoint at once (the model-parallel
    ranks hold distinct parts, the data-parallel ranks split the replicated ones, as Megatron-LM's fully
    parallel save and PyTorch DCP do), so the fleet writes at ``nodes`` times one node's bandwidth."""
    return checkpoint_bytes / (bandwidth_bytes_per_s_per_node * nodes)


def job_mtbf_s(mtbf_gpu_hours: float, gpus: int) -> float:
    """The job's mean time between failures: one GPU's, divided by the GPUs (seconds)."""
    return mtbf_gpu_hours * SECONDS_PER_HOUR / gpus


def young_daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """Young's (1974) first-order optimal training time between checkpoints, sqrt(2 delta M), as Daly (2006)
    confirms to first order (seconds)."""
    return math.sqrt(2.0 * save_s * mtbf_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput:
    """What checkpoints and failures cost a job, per unit of failure-free training time."""

    mtbf_s: float
    """The job's mean time between failures."""
    interval_s: float
    """Training time between two checkpoint saves."""
    save_s: float
    restart_s: float
    waste_per_failure_s: float
    """Restart plus half an interval of lost work."""
    checkpoint_overhead: float
    """Save time per second of training: delta / tau."""
    failure_overhead: float
    """Share of wall time lost to failures: w / M (1 or more: the job never finishes)."""
    fraction: float
    """Goodput: failure-free training time over wall time, (1 - w / M) / (1 + delta / tau); 0 when w >= M."""

    @property
    def finishes(self) -> bool:
        return self.fraction > 0.0

    def wall_s(self, train_s: float) -> float:
        """Wall time to do ``train_s`` of failure-free training (inf when the job never finishes)."""
        return train_s / self.fraction if self.finishes else math.inf

    def failures(self, train_s: float) -> float:
        """Failures expected over that wall time."""
        return self.wall_s(train_s) / self.mtbf_s


def goodput(*, mtbf_s: float, save_s: float, interval_s: float, restart_s: float) -> Goodput:
    """The first-order goodput of a job that saves every ``interval_s`` of training (module docstring)."""
    if not (mtbf_s > 0 and interval_s > 0 and save_s >= 0 and restart_s >= 0):
        raise ValueError(f"goodput needs M > 0, tau > 0, delta >= 0, R >= 0: {mtbf_s}, {interval_s}, {save_s}")
    waste = restart_s + interval_s / 2.0
    lost = waste / mtbf_s
    overhead = save_s / interval_s
    return Goodput(
        mtbf_s=mtbf_s,
        interval_s=interval_s,
        save_s=save_s,
        restart_s=restart_s,
        waste_per_failure_s=waste,
        checkpoint_overhead=overhead,
        failure_overhead=lost,
        fraction=max(0.0, 1.0 - lost) / (1.0 + overhead),
    )
