"""The check report: real torch.distributed runs of a tiny model held against meshplan's predictions.

Layouts are named as the report names them (``fsdp_tp``, ``pp_1f1b``); ``pp`` runs both pipeline schedules.
Shapes left unset keep the harness's tiny model. Bad input raises ValueError before torch is imported (every
check of the flags uses meshplan.check.shapes, which does not import it) and before any process starts.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TORCH_MISSING = "meshplan check needs the torch extra: pip install 'meshplan[torch]'"
HARNESS_LAYOUTS = (
    "ddp",
    "fsdp",
    "fsdp_reshard_root",
    "fsdp_no_reshard",
    "fsdp_no_sync",
    "fsdp_sac_op",
    "fsdp_bf16",
    "fsdp_bf16_reduce_bf16",
    "tp",
    "tp_sac_op",
    "sp",
    "sp_sac_op",
    "fsdp_tp",
    "pp_gpipe",
    "pp_1f1b",
    "ep",
    "cp",
)
"""The harness's layouts (meshplan.check.shapes.FITS, and runner.LAYOUTS, which imports torch), by the names
reports use."""
LAYOUT_NAMES: dict[str, tuple[str, ...]] = {name: (name,) for name in HARNESS_LAYOUTS} | {"pp": ("pp_gpipe", "pp_1f1b")}
"""Command-line layout -> the harness layouts it runs: each by its own name, ``pp`` for both schedules."""
DEFAULT_LAYOUTS = ("ddp", "fsdp", "tp", "sp", "fsdp_tp", "pp", "ep", "cp")
"""Run when no --layouts is given (the FSDP variants run on request)."""


MAX_WORLD_SIZE = 16
"""Local processes at most, and never more than two per CPU core (each holds a copy of torch, ~300 MB)."""
LIMITS = {"hidden": 4_096, "layers": 64, "heads": 256, "kv_heads": 256, "seq": 8_192, "micro_batch": 64}
"""The tiny model stays tiny: a check compares shapes, not scale."""
MEMORY_SHARE = 0.5
"""Share of the machine's memory the processes of one check may take together (an upper estimate)."""


def max_world_size() -> int:
    return max(2, min(MAX_WORLD_SIZE, 2 * (os.cpu_count() or 1)))


def machine_bytes() -> int | None:
    """Physical memory of this machine, or None where the OS does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def rank_bytes(cfg: Any) -> int:
    """Upper estimate of one rank's fp32 bytes: weights, grads, Adam, and every activation and score kept."""
    h, layers, tokens = cfg.hidden, cfg.num_layers, cfg.micro_batch * cfg.seq_len
    params = layers * (4 * h * h + 3 * h * cfg.ffn_hidden) + 2 * cfg.vocab_size * h
    activations = layers * tokens * (40 * h + cfg.num_heads * cfg.seq_len)
    return int(4 * (4 * params + activations) + 300_000_000)  # + the interpreter and torch per process


MAX_STEP_FLOPS = 2e11
"""FLOPs of one rank's training step at most: a few seconds of a CPU core per layout and step."""


def step_flops(cfg: Any) -> float:
    """6 N T for the matmuls plus the attention scores (12 L T s h), one rank, one step (an upper estimate)."""
    h, layers, tokens = cfg.hidden, cfg.num_layers, cfg.micro_batch * cfg.seq_len
    params = layers * (4 * h * h + 3 * h * cfg.ffn_hidden) + 2 * cfg.vocab_size * h
    return float(6 * params * tokens + 12 * layers * tokens * cfg.seq_len * h)


def check_limits(world_size: int, dense: Any) -> None:
    """Refuse a check this machine cannot run quickly: too many processes, or more memory than it has."""
    top = max_world_size()
    if world_size > top:
        raise ValueError(f"world size {world_size} is above {top} local processes ({os.cpu_count()} CPU cores here)")
    total, need = machine_bytes(), world_size * rank_bytes(dense)
    if total is not None and need > MEMORY_SHARE * total:
        raise ValueError(
            f"about {need / 1e9:.1f} GB for {world_size} processes; this machine has {total / 1e9:.1f} GB: "
            "use a smaller --hidden, --layers, --seq or --micro-batch"
        )
    flops = step_flops(dense)
    if flops > MAX_STEP_FLOPS:
        raise ValueError(
            f"about {flops:.2g} FLOPs per step and process, above the check's {MAX_STEP_FLOPS:.0e} (minutes on a CPU): "
            "use a smaller --hidden, --layers, --seq or --micro-batch"
        )


def parse_layouts(text: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """'ddp,fsdp,...' (or a list) -> command-line layout names; None keeps every default layout that fits."""
    if text is None:
        return None
    names = [n.strip().lower() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    unknown = [n for n in names if n not in LAYOUT_NAMES]
    if unknown or not names:
        raise ValueError(f"unknown layout {unknown[0] if unknown else text!r} (choose from {', '.join(LAYOUT_NAMES)})")
    return tuple(dict.fromkeys(names))


def tiny_configs(
    *,
    hidden: int | None = None,
    layers: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    seq: int | None = None,
    micro_batch: int | None = None,
) -> tuple[Any, Any]:
    """(dense, MoE) TinyConfigs; the head dim is hidden / heads, the FFN 2 x hidden, an expert's FFN hidden."""
    given = dict(num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, seq_len=seq, micro_batch=micro_batch)
    changes: dict[str, int] = {k: v for k, v in given.items() if v is not None}
    given_flags = dict(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, seq=seq, micro_batch=micro_batch)
    for name, value in given_flags.items():
        if value is not None and value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}")
        if value is not None and value > LIMITS[name]:
            raise ValueError(f"--{name.replace('_', '-')} {value} is above the check's limit of {LIMITS[name]:,}")
    from meshplan.check.shapes import DENSE, MOE  # no torch: every flag is checked before torch is imported

    if hidden is not None or heads is not None:
        h, a = hidden or DENSE.hidden, heads or DENSE.num_heads
        if h % a:
            raise ValueError(f"heads={a} must divide hidden={h}")
        changes |= dict(hidden=h, head_dim=h // a, ffn_hidden=2 * h)
    dense = dataclasses.replace(DENSE, **changes)
    moe = dataclasses.replace(
        MOE, **changes, **({"expert_ffn_hidden": changes["hidden"]} if "hidden" in changes else {})
    )
    return dense, moe


def plan_layouts(
    names: tuple[str, ...] | None, world_size: int, dense: Any, moe: Any
) -> tuple[list[str], list[dict[str, str]]]:
    """(harness layouts to run, skipped default layouts with the reason)."""
    from meshplan.check.shapes import FITS  # no torch: a layout that cannot run is refused before torch loads

    def broken(harness: str) -> list[str]:
        return FITS[harness].broken(world_size, dense=dense, moe=moe)

    run: list[str] = []
    skipped: list[dict[str, str]] = []
    for name in names or DEFAULT_LAYOUTS:
        reasons = list(dict.fromkeys(r for harness in LAYOUT_NAMES[name] for r in broken(harness)))
        if reasons and names is not None:
            raise ValueError(f"layout {name} does not fit world size {world_size}: {'; '.join(reasons)}")
        if reasons:
            skipped.append({"layout": name, "reason": "; ".join(reasons)})
        else:
            run += LAYOUT_NAMES[name]
    if not run:
        raise ValueError(f"no layout fits world size {world_size} and these shapes")
    return run, skipped


def check_report(
    *,
    world_size: int = 2,
    layouts: str | Sequence[str] | None = None,
    hidden: int | None = None,
    layers: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    seq: int | None = None,
    micro_batch: int | None = None,
    trace_dir: str | None = None,
) -> dict[str, Any]:
    """Run the layouts on ``world_size`` local processes and compare every measured quantity with meshplan;
    ``trace_dir``: also profile one step of each layout there (check/trace.py), never over an existing file."""
    names = parse_layouts(layouts)
    if world_size < 2:
        raise ValueError(f"world size must be at least 2, got {world_size}")
    if world_size > max_world_size():
        raise ValueError(f"world size {world_size} is above {max_world_size()} local processes on this machine")
    dense, moe = tiny_configs(  # the shapes checked against each other, without torch
        hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, seq=seq, micro_batch=micro_batch
    )
    check_limits(world_size, dense)
    run, skipped = plan_layouts(names, world_size, dense, moe)
    if trace_dir is not None:
        _check_trace_dir(trace_dir, run, world_size)
    if importlib.util.find_spec("torch") is None:
        raise ValueError(TORCH_MISSING)
    from meshplan.check.runner import run_check  # imports torch (seconds): only once every flag is known to run

    measured = run_check(world_size, run, dense=dense, moe=moe, trace_dir=trace_dir or "")
    return assemble_report(world_size, run, skipped, measured, dense, moe)


TRACE_SUFFIXES = ("trace.json", "snapshot.pickle", "logged.json")


def _check_trace_dir(folder: str, layouts: Sequence[str], world_size: int) -> None:
    """ValueError unless ``folder`` is a folder that holds none of the files the traced run will write."""
    if not Path(folder).is_dir():
        raise ValueError(f"--trace {folder}: no such folder")
    taken = [
        name
        for layout in layouts
        for rank in range(world_size)
        for suffix in TRACE_SUFFIXES
        if Path(folder, name := f"{layout}_rank{rank}.{suffix}").exists()
    ]
    if taken:
        raise ValueError(f"--trace {folder} already holds {taken[0]} ({len(taken)} of its files): name another folder")


def assemble_report(
    world_size: int, run: list[str], skipped: list[dict[str, str]], measured: Sequence[Any], dense: Any, moe: Any
) -> dict[str, Any]:
    """The report of harness layouts ``run`` from their ``measured`` records (``runner.Measurement``; ``compare``
    takes each layout's own), each held against meshplan's prediction."""
    from meshplan.check.compare import all_ok, compare
    from meshplan.check.predict import predict

    results, unmeasured = [], []
    for harness in run:
        prediction = predict(harness, world_size, dense, moe)
        results += compare(prediction, measured, world_size=world_size)
        unmeasured += [
            {"layout": harness, "quantity": q, "rank": 0, "predicted": v} for q, v in prediction.unmeasured.items()
        ]
    dense_fields = ("num_layers", "hidden", "num_heads", "num_kv_heads", "head_dim", "ffn_hidden", "vocab_size")
    return {
        "world_size": world_size,
        "model": {f: getattr(dense, f) for f in (*dense_fields, "seq_len", "micro_batch")},
        "moe": {f: getattr(moe, f) for f in ("num_experts", "experts_per_token", "expert_ffn_hidden")},
        "layouts": run,
        "skipped": skipped,
        "results": results,
        "unmeasured": unmeasured,
        "all_ok": all_ok(results),
    }
