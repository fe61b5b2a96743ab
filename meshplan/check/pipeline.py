"""Pipeline parallelism with ``torch.distributed.pipelining``: one stage per rank, L/n blocks each.

Stage 0 keeps the embedding, the last stage the final norm and the output projection (torchtitan's manual
split). ``PipelineStage`` infers the shapes it sends at its first step (object send/recv); the measured step
comes after that. Every micro-batch crosses every stage boundary once in forward (the (b, s, h) hidden
states) and once in backward (their gradient). The schedule mixes forward and backward work, so its calls are
labelled afterwards by direction: a send to the next stage or a recv from the previous one is forward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from meshplan.check.layouts import Builder, Probe, Trainer, batch
from meshplan.check.model import TinyConfig, TinyLlama, cross_entropy

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def stage_module(cfg: TinyConfig, stage: int, num_stages: int) -> TinyLlama:
    if cfg.num_layers % num_stages:
        raise ValueError(f"num_layers={cfg.num_layers} must be divisible by the pipeline degree {num_stages}")
    model = TinyLlama(cfg)
    per_stage = cfg.num_layers // num_stages
    keep = {str(i) for i in range(stage * per_stage, (stage + 1) * per_stage)}
    for name in [name for name in model.layers if name not in keep]:
        del model.layers[name]
    if stage != 0:
        model.tok_embeddings = None
    if stage != num_stages - 1:
        model.norm = None
        model.output = None
    return model


def pp_builder(schedule: str, *, microbatches_per_stage: int = 2) -> Builder:
    """Micro-batches m = microbatches_per_stage x n, each of cfg.micro_batch sequences."""

    def build(cfg: TinyConfig, world_size: int) -> Trainer:
        rank = dist.get_rank()
        model = stage_module(cfg, rank, world_size)
        stage = PipelineStage(model, stage_index=rank, num_stages=world_size, device=torch.device("cpu"))
        num_microbatches = microbatches_per_stage * world_size
        runner = SCHEDULES[schedule](stage, n_microbatches=num_microbatches, loss_fn=cross_entropy)
        tokens, targets = batch(cfg, seed=0, size=num_microbatches * cfg.micro_batch)

        def forward_backward(probe: Probe) -> None:
            with probe.in_phase("pipeline"):
                if rank == 0:
                    runner.step(tokens)
                elif rank == world_size - 1:
                    runner.step(target=targets, losses=[])
                else:
                    runner.step()

        return Trainer(
            model=model,
            optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
            forward_backward=forward_backward,
            inputs=(tokens, targets),
        )

    return build


def pipeline_phase(kind: str, peer: int, rank: int) -> str:
    """Forward for activations going down the pipeline, backward for gradients coming up."""
    return "forward" if (kind == "send") == (peer > rank) else "backward"
