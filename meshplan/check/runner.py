"""Launch N gloo processes, apply each layout, run a measured training step, and collect per-rank records.

One process launch per world size: every layout shares its process group, one after the other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import os
import signal
import socket
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.multiprocessing.spawn import ProcessRaisedException, start_processes

from meshplan.check.comms import CollectiveCall, CommCounter
from meshplan.check.conditions import build_fsdp_no_sync, build_fsdp_op_sac, tp_op_sac_builder
from meshplan.check.layouts import (
    Builder,
    Trainer,
    build_cp,
    build_ddp,
    build_ep,
    build_fsdp_tp,
    fsdp_builder,
    tp_builder,
)
from meshplan.check.measure import (
    SavedTensorTracker,
    ddp_bucket_bytes,
    fsdp_gathered_bytes,
    held_grads_bytes,
    state_bytes,
)
from meshplan.check.pipeline import pipeline_phase, pp_builder
from meshplan.check.shapes import DENSE, FITS, MOE, LayoutFit, TinyConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutRecipe:
    build: Builder
    fit: LayoutFit
    """What it needs of the shapes and the world size (shapes.FITS, read before torch is imported)."""
    buffers_visible: bool = False
    """Every communication buffer of the peak is a tensor the probe sees (FSDP2 with reshard-after-forward off:
    the gathered units and one reduce-scatter input), so comm_buffers_bytes is measured."""

    @property
    def moe(self) -> bool:
        return self.fit.moe


def _recipe(name: str, build: Builder, *, buffers_visible: bool = False) -> LayoutRecipe:
    return LayoutRecipe(build=build, fit=FITS[name], buffers_visible=buffers_visible)


LAYOUTS: dict[str, LayoutRecipe] = {
    "ddp": _recipe("ddp", build_ddp),
    "fsdp": _recipe("fsdp", fsdp_builder()),
    "fsdp_reshard_root": _recipe("fsdp_reshard_root", fsdp_builder(reshard_after_forward=True)),
    "fsdp_no_reshard": _recipe("fsdp_no_reshard", fsdp_builder(reshard_after_forward=False), buffers_visible=True),
    "fsdp_no_sync": _recipe("fsdp_no_sync", build_fsdp_no_sync),
    "fsdp_sac_op": _recipe("fsdp_sac_op", build_fsdp_op_sac),
    "fsdp_bf16": _recipe(
        "fsdp_bf16",
        fsdp_builder(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)),
    ),
    "fsdp_bf16_reduce_bf16": _recipe(
        "fsdp_bf16_reduce_bf16", fsdp_builder(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    ),
    "tp": _recipe("tp", tp_builder(sequence_parallel=False)),
    "sp": _recipe("sp", tp_builder(sequence_parallel=True)),
    "tp_sac_op": _recipe("tp_sac_op", tp_op_sac_builder(sequence_parallel=False)),
    "sp_sac_op": _recipe("sp_sac_op", tp_op_sac_builder(sequence_parallel=True)),
    "fsdp_tp": _recipe("fsdp_tp", build_fsdp_tp),
    "pp_gpipe": _recipe("pp_gpipe", pp_builder("gpipe")),
    "pp_1f1b": _recipe("pp_1f1b", pp_builder("1f1b")),
    "ep": _recipe("ep", build_ep),
    "cp": _recipe("cp", build_cp),
}
"""Each harness layout: how it is built (torch), and what it needs (shapes.FITS)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One measured number of one rank.

    Quantities. Phase ``state``: params_bytes, params_storage_bytes, grads_bytes, grads_storage_bytes (after
    backward), grads_peak_bytes (the most gradient bytes held after any micro-batch's backward),
    optimizer_bytes, optimizer_step_bytes, buffers_bytes, param_tensors, ddp_bucket_bytes. Phase
    ``forward``: activations_bytes (saved for backward, each storage once, whole step; with what a selective
    checkpoint caches outside autograd's hooks), activations_peak_bytes,
    saved_params_bytes, saved_buffers_bytes, saved_inputs_bytes, gathered_params_after_forward_bytes (FSDP2).
    Collectives, per phase (forward, backward, optimizer, and step = all three) and process group:
    ``<kind>_count`` and ``<kind>_bytes`` for kind in all_reduce, all_gather, reduce_scatter, all_to_all,
    broadcast, send, recv. Phase ``step``: python_collective_calls, python_calls_bypassing_dispatch.
    """

    world_size: int
    layout: str
    rank: int
    quantity: str
    phase: str
    """state (after backward / after the optimizer step), forward, backward, optimizer, or step (all phases)."""
    measured: int
    group_size: int = 0
    """Size of the process group of a collective (0 for memory quantities)."""
    group_ranks: str = ""
    """Global ranks of that group, comma-separated (tells the axes of a 2-D mesh apart)."""


class _Probe:
    def __init__(self, counter: CommCounter | None, trainer: Trainer) -> None:
        self.counter = counter
        self.trainer = trainer
        self.gathered_after_forward_bytes = 0
        self.held_outside_autograd_bytes = 0
        self.grads_peak_bytes = 0

    def in_phase(self, phase: str) -> contextlib.AbstractContextManager[None]:
        return self.counter.in_phase(phase) if self.counter is not None else contextlib.nullcontext()

    def after_forward(self, model: nn.Module, loss: torch.Tensor) -> None:
        self.gathered_after_forward_bytes = max(self.gathered_after_forward_bytes, fsdp_gathered_bytes(model))
        self.held_outside_autograd_bytes = max(self.held_outside_autograd_bytes, self.trainer.held_outside_autograd())

    def after_backward(self, model: nn.Module) -> None:
        self.grads_peak_bytes = max(self.grads_peak_bytes, held_grads_bytes(model))


def _collective_quantities(calls: list[CollectiveCall]) -> Iterator[tuple[str, str, str, int]]:
    totals: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
    for call in calls:
        for phase in (call.phase, "step"):
            entry = totals[(phase, call.kind, call.group_ranks)]
            entry[0] += 1
            entry[1] += call.size_bytes
    for (phase, kind, ranks), (count, size) in sorted(totals.items()):
        yield f"{kind}_count", phase, ranks, count
        yield f"{kind}_bytes", phase, ranks, size


def measure_layout(name: str, recipe: LayoutRecipe, cfg: TinyConfig, world_size: int) -> list[Measurement]:
    """Build the layout on this rank, warm it up, and measure one training step."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    trainer = recipe.build(cfg, world_size)
    for _ in range(trainer.warmup_steps):
        trainer.forward_backward(_Probe(None, trainer))
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()
    counter, tracker = CommCounter(), SavedTensorTracker(trainer.model, trainer.inputs)
    probe = _Probe(counter, trainer)
    with counter:
        with tracker.track():
            trainer.forward_backward(probe)
        after_backward = state_bytes(trainer.model)
        with counter.in_phase("optimizer"):
            trainer.optimizer.step()
    after_step = state_bytes(trainer.model, trainer.optimizer)
    trainer.optimizer.zero_grad()
    calls = [
        CollectiveCall(**(asdict(c) | {"phase": pipeline_phase(c.kind, c.peer, rank)}))
        if c.phase == "pipeline" and c.kind in ("send", "recv")
        else c
        for c in counter.calls
    ]
    values: list[tuple[str, str, str, int]] = [
        ("grads_bytes", "state", "", after_backward["grads_bytes"]),
        ("grads_storage_bytes", "state", "", after_backward["grads_storage_bytes"]),
        *((q, "state", "", v) for q, v in after_step.items() if not q.startswith("grads")),
        ("grads_peak_bytes", "state", "", max(probe.grads_peak_bytes, after_backward["grads_storage_bytes"])),
        ("activations_bytes", "forward", "", tracker.saved_bytes["activation"] + probe.held_outside_autograd_bytes),
        ("activations_peak_bytes", "forward", "", tracker.peak_activation_bytes + probe.held_outside_autograd_bytes),
        ("saved_params_bytes", "forward", "", tracker.saved_bytes["param"]),
        ("saved_buffers_bytes", "forward", "", tracker.saved_bytes["buffer"]),
        ("saved_inputs_bytes", "forward", "", tracker.saved_bytes["input"]),
        ("gathered_params_after_forward_bytes", "forward", "", probe.gathered_after_forward_bytes),
        ("ddp_bucket_bytes", "state", "", ddp_bucket_bytes(trainer.model)),
        ("python_collective_calls", "step", "", counter.python_calls),
        ("python_calls_bypassing_dispatch", "step", "", counter.bypass_calls),
        *_collective_quantities(calls),
    ]
    if recipe.buffers_visible:
        largest_reduce = max((c.size_bytes for c in calls if c.kind == "reduce_scatter"), default=0)
        values.append(("comm_buffers_bytes", "state", "", probe.gathered_after_forward_bytes + largest_reduce))
    return [
        Measurement(
            world_size=world_size,
            layout=name,
            rank=rank,
            quantity=q,
            phase=p,
            group_size=len(g.split(",")) if g else 0,
            group_ranks=g,
            measured=v,
        )
        for q, p, g, v in values
    ]


def _worker(
    rank: int,
    world_size: int,
    port: int,
    layouts: list[str],
    dense: TinyConfig,
    moe: TinyConfig,
    out_dir: str,
    trace_dir: str = "",
) -> None:
    # the fork server ignores Ctrl-C (meshplan.check.deaf); a worker hears it again, and torch's wrapper ends it
    # quietly on one
    signal.signal(signal.SIGINT, signal.default_int_handler)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        records = []
        for name in layouts:
            recipe = LAYOUTS[name]
            records += measure_layout(name, recipe, moe if recipe.moe else dense, world_size)
            dist.barrier()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps([asdict(r) for r in records]))
        for name in layouts if trace_dir else []:  # each layout built afresh and profiled (check/trace.py)
            from meshplan.check.trace import trace_layout

            torch.manual_seed(0)
            trace_layout(name, LAYOUTS[name].build(moe if LAYOUTS[name].moe else dense, world_size), trace_dir)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _broken_rules(name: str, world_size: int, *, dense: TinyConfig, moe: TinyConfig) -> list[str]:
    return LAYOUTS[name].fit.broken(world_size, dense=dense, moe=moe)


def run_check(
    world_size: int,
    layouts: Sequence[str] | None = None,
    *,
    dense: TinyConfig = DENSE,
    moe: TinyConfig = MOE,
    trace_dir: str = "",
) -> list[Measurement]:
    """Run ``layouts`` (default: every one that fits) on ``world_size`` local gloo processes; one record per
    quantity, phase, process group and rank (see ``Measurement``). Raises ValueError for a layout that does not
    fit the world size or the shapes. ``trace_dir``: also profile one step of each layout there (check/trace.py:
    a profiler trace, a snapshot-shaped pickle and the logged step time per rank)."""
    if world_size < 2:
        raise ValueError(f"world_size must be at least 2, got {world_size}")
    if layouts is None:
        names = [n for n in LAYOUTS if not _broken_rules(n, world_size, dense=dense, moe=moe)]
    else:
        names = list(layouts)
        unknown = [n for n in names if n not in LAYOUTS]
        if unknown:
            raise ValueError(f"unknown layouts {unknown}; known: {sorted(LAYOUTS)}")
        broken = [f"{n}: {rule}" for n in names for rule in _broken_rules(n, world_size, dense=dense, moe=moe)]
        if broken:
            raise ValueError("layouts that do not fit: " + "; ".join(broken))
    with tempfile.TemporaryDirectory() as out_dir:
        _launch(world_size, names, dense, moe, out_dir, trace_dir)
        return [
            Measurement(**r)
            for rank in range(world_size)
            for r in json.loads(Path(out_dir, f"rank{rank}.json").read_text())
        ]


PORT_TRIES = 3
"""Attempts with a fresh port when another program takes the chosen one before the workers bind it."""


def _launch(
    world_size: int, names: list[str], dense: TinyConfig, moe: TinyConfig, out_dir: str, trace_dir: str = ""
) -> None:
    """Start the workers and wait for them; whatever happens (a failure, Ctrl-C), no process is left behind."""
    # a fork server that imported torch once forks every worker: no 3 s torch import per process, and
    # unlike a plain fork it never copies a parent whose OpenMP threads already ran
    multiprocessing.set_forkserver_preload(["meshplan.check.deaf", "meshplan.check.runner"])
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)  # we report failures ourselves
    token = f"{os.getpid()}-{time.monotonic_ns()}"
    previous = os.environ.get(RUN_TOKEN)
    os.environ[RUN_TOKEN] = token  # inherited by the fork server and every worker: how cleanup finds them
    try:
        for attempt in range(1, PORT_TRIES + 1):
            port = _free_port()
            try:
                _run_workers(world_size, port, names, dense, moe, out_dir, trace_dir)
                return
            except ProcessRaisedException as exc:
                if "Address already in use" not in str(exc) and "EADDRINUSE" not in str(exc):
                    raise
                if attempt == PORT_TRIES:
                    raise ValueError(
                        f"{PORT_TRIES} ports in a row on 127.0.0.1 were taken by other programs (the last {port})"
                    ) from None
    finally:
        _stop_forkserver(token)
        if previous is None:
            os.environ.pop(RUN_TOKEN, None)
        else:
            os.environ[RUN_TOKEN] = previous


def _run_workers(
    world_size: int, port: int, names: list[str], dense: TinyConfig, moe: TinyConfig, out_dir: str, trace_dir: str = ""
) -> None:
    context = None
    try:
        context = start_processes(  # type: ignore[no-untyped-call]
            _worker,
            args=(world_size, port, names, dense, moe, out_dir, trace_dir),
            nprocs=world_size,
            start_method="forkserver",
            join=False,
        )
        while not context.join():
            pass
    finally:
        if context is not None:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join(timeout=5)


RUN_TOKEN = "MESHPLAN_CHECK_RUN"
"""Environment variable naming one check run; its fork server and workers carry it."""


def _stop_forkserver(token: str) -> None:
    """End the fork server (it holds an imported torch, ~300 MB) and every worker of this run, at once.

    Not gracefully: a Ctrl-C during start-up can leave a worker that the fork server forked after the parent
    stopped waiting (it holds the fork server's liveness pipe, so the server never sees the parent go, and it
    sleeps in gloo's connection retries). The run's processes are found by their environment, since an
    orphan's parent is no longer the fork server.
    """
    from multiprocessing import forkserver

    server = forkserver._forkserver
    pid = getattr(server, "_forkserver_pid", None)
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)  # first, so it forks nothing more
    for process in _run_processes(token):
        with contextlib.suppress(OSError):
            os.kill(process, signal.SIGKILL)
    stop = getattr(server, "_stop", None)
    if stop is not None:
        stop()


def _run_processes(token: str) -> list[int]:
    """Processes other than this one, and other than the resource tracker, whose environment holds ``token``
    (Linux /proc; empty elsewhere)."""
    needle = f"{RUN_TOKEN}={token}".encode()
    out = []
    for entry in Path("/proc").glob("[0-9]*"):
        pid = int(entry.name)
        if pid == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            if b"resource_tracker" in (entry / "cmdline").read_bytes():
                continue
        except OSError:
            continue
        out.append(pid)
    return out
