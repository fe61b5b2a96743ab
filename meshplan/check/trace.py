"""A profiled step of a harness layout, written as the files ``meshplan compare`` reads.

``trace_layout`` builds the layout, warms it up and runs two more steps under ``torch.profiler`` (CPU activity;
a schedule of one warm-up step and one active step), writing ``<layout>_rank<r>.trace.json``: a real Kineto
Chrome trace of a real gloo run. CUDA memory snapshots exist only on a GPU, so ``<layout>_rank<r>.snapshot.pickle``
is built in the shape of ``torch.cuda.memory._snapshot()`` from the run's own tensors at the end of the profiled
forward (the moment this harness's step holds most): one block per live storage (parameters, the optimizer's
state, gradients, saved activations, FSDP's gathered parameters, DDP's buckets), rounded up as the CUDA caching
allocator rounds (512 bytes) and packed into 2 MiB small-pool segments (blocks up to 1 MiB) or segments of their own
rounded to 2 MiB. Each block's ``frames`` name the call site PyTorch records for that kind of tensor (written here,
since a CPU run records no allocator history). ``<layout>_rank<r>.logged.json`` holds the step's wall time as a
training loop logs it.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule

from meshplan.check.layouts import Trainer
from meshplan.check.measure import SavedTensorTracker, ddp_bucket_bytes, fsdp_gathered_bytes

ROUND_BYTES = 512
SMALL_BLOCK_BYTES = 1 << 20
SEGMENT_BYTES = 2 << 20
FRAMES = {
    "parameters": [("torch/nn/modules/module.py", "_apply"), ("meshplan/check/model.py", "__init__")],
    "optimizer_state": [("torch/optim/adamw.py", "_init_group"), ("torch/optim/optimizer.py", "wrapper")],
    "gradients": [("torch/autograd/graph.py", "_engine_run_backward"), ("torch/autograd/__init__.py", "backward")],
    "activations": [("meshplan/check/model.py", "forward"), ("torch/nn/modules/module.py", "_call_impl")],
    "comm_buffers": [("torch/distributed/distributed_c10d.py", "all_gather_into_tensor")],
}
"""The call sites (innermost first) that a recorded CUDA history shows for each kind of tensor."""


def _storages(tensors: list[torch.Tensor]) -> dict[int, int]:
    out = {}
    for t in tensors:
        inner = t.to_local() if hasattr(t, "to_local") else t
        out[int(inner.untyped_storage()._cdata)] = inner.untyped_storage().nbytes()
    return out


class _Peak:
    """A probe that records every live storage at the end of the forward."""

    def __init__(self, trainer: Trainer, tracker: SavedTensorTracker) -> None:
        self.trainer, self.tracker = trainer, tracker
        self.blocks: list[tuple[str, int]] = []

    def in_phase(self, phase: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def after_forward(self, model: nn.Module, loss: torch.Tensor) -> None:
        if self.blocks:
            return
        params = _storages(list(model.parameters()) + list(model.buffers()))
        grads = _storages([p.grad for p in model.parameters() if p.grad is not None])
        state = [v for s in self.trainer.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        blocks = [("parameters", n) for n in params.values()]
        blocks += [("gradients", n) for key, n in grads.items() if key not in params]
        blocks += [("optimizer_state", n) for n in _storages(state).values()]
        blocks += [("activations", n) for n in self.tracker.live_activation_storages()]
        gathered = fsdp_gathered_bytes(model) + ddp_bucket_bytes(model)
        blocks += [("comm_buffers", gathered)] if gathered else []
        self.blocks = [(kind, n) for kind, n in blocks if n > 0]

    def after_backward(self, model: nn.Module) -> None:
        pass


def snapshot_of(blocks: list[tuple[str, int]]) -> dict[str, Any]:
    """``torch.cuda.memory._snapshot()``'s structure for these live blocks (kind, bytes), packed as the caching
    allocator packs them."""
    segments: list[dict[str, Any]] = []
    traces: list[dict[str, Any]] = []
    address = 1 << 32
    small: dict[str, Any] | None = None
    for kind, nbytes in sorted(blocks, key=lambda b: -b[1]):
        size = -(-nbytes // ROUND_BYTES) * ROUND_BYTES
        frames = [{"filename": f, "name": n, "line": 0} for f, n in FRAMES[kind]]
        block = {"size": size, "requested_size": nbytes, "state": "active_allocated", "frames": frames}
        if size <= SMALL_BLOCK_BYTES:
            if small is None or small["allocated_size"] + size > SEGMENT_BYTES:
                small = _segment(address, SEGMENT_BYTES, "small")
                segments.append(small)
                traces.append({"action": "segment_alloc", "addr": address, "size": SEGMENT_BYTES, "frames": []})
                address += SEGMENT_BYTES
            target = small
        else:
            total = -(-size // SEGMENT_BYTES) * SEGMENT_BYTES
            target = _segment(address, total, "large")
            segments.append(target)
            traces.append({"action": "segment_alloc", "addr": address, "size": total, "frames": []})
            address += total
        block["address"] = target["address"] + target["allocated_size"]
        target["blocks"].append(block)
        target["allocated_size"] += size
        target["active_size"] += size
        target["requested_size"] += nbytes
        traces.append({"action": "alloc", "addr": block["address"], "size": size, "frames": frames})
    for segment in segments:
        free = segment["total_size"] - segment["allocated_size"]
        if free:
            at = segment["address"] + segment["allocated_size"]
            segment["blocks"].append(
                {"address": at, "size": free, "requested_size": 0, "state": "inactive", "frames": []}
            )
    return {"segments": segments, "device_traces": [traces], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}


def _segment(address: int, total: int, kind: str) -> dict[str, Any]:
    return {
        "device": 0,
        "address": address,
        "total_size": total,
        "allocated_size": 0,
        "active_size": 0,
        "requested_size": 0,
        "stream": 0,
        "segment_type": kind,
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": [],
    }


def trace_layout(name: str, trainer: Trainer, out_dir: str) -> None:
    """Profile two steps of a built ``trainer`` (the first a profiler warm-up) and write the three files."""
    rank = dist.get_rank()
    stem = Path(out_dir, f"{name}_rank{rank}")
    for _ in range(trainer.warmup_steps):
        trainer.forward_backward(_Peak(trainer, SavedTensorTracker(trainer.model, trainer.inputs)))
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()
    peak: _Peak | None = None
    step_s = 0.0
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=1),
        on_trace_ready=lambda p: p.export_chrome_trace(f"{stem}.trace.json"),
    ) as prof:
        for _ in range(2):
            tracker = SavedTensorTracker(trainer.model, trainer.inputs)
            peak = _Peak(trainer, tracker)
            start = time.perf_counter()
            with tracker.track():
                trainer.forward_backward(peak)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad()
            step_s = time.perf_counter() - start
            prof.step()
    assert peak is not None
    Path(f"{stem}.snapshot.pickle").write_bytes(pickle.dumps(snapshot_of(peak.blocks), protocol=4))
    Path(f"{stem}.logged.json").write_text(json.dumps({"step_time_s": step_s}) + "\n")
