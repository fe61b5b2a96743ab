"""The MFU range of the published runs (catalog/published_mfu.toml), from a ``meshplan validate`` report.

Each published run's measured MFU, in the reports' convention (causal attention over the dense bf16 peak,
core/time/flops.py ``MFU_CONVENTION``), is its predicted MFU times predicted over measured step time
(validation/training.py ``RunResult.measured_mfu``): the model's FLOPs and the peak are the same on both sides,
so the number is the run's, whatever the source published (a step time, TFLOP/s, tokens/s or an MFU counted
otherwise). Per GPU kind, class of layout (reports/published_range.py ``MFU_CLASSES``; a run counts in each of
``run_classes``) and matmul kind, the range keeps the lowest and highest of those, the runs and sources behind
them, and the run that measured the highest. ``meshplan estimate``, ``recipe`` and ``plan`` hold their
predictions to it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from meshplan.reports.published_range import run_classes


def published_mfu_range(report: Mapping[str, Any]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """Per GPU kind, class and matmul kind (sorted): ``mfu_min``, ``mfu_max``, ``runs``, ``sources`` and
    ``highest`` ("source: case" of the run that measured ``mfu_max``) of a validate report's runs."""
    cells: dict[tuple[str, str, str], list[tuple[float, str, str]]] = {}
    for run in report["runs"]:
        lay = run["layout"]
        for cls in run_classes(cp=lay.get("cp", 1), ep=lay.get("ep", 1), moe=run["moe"]):
            cells.setdefault((run["gpu"], cls, run["matmul"]), []).append(
                (float(run["measured_mfu"]), run["source"], run["case"])
            )
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for (gpu, cls, matmul), members in sorted(cells.items()):
        top = max(members)
        out.setdefault(gpu, {}).setdefault(cls, {})[matmul] = {
            "mfu_min": min(m[0] for m in members),
            "mfu_max": top[0],
            "runs": len(members),
            "sources": len({m[1] for m in members}),
            "highest": f"{top[1]}: {top[2]}",
        }
    return out


def range_toml(ranges: Mapping[str, Mapping[str, Mapping[str, Mapping[str, Any]]]]) -> str:
    """catalog/published_mfu.toml's text: a header, then a table per GPU kind, class and matmul kind."""
    lines = [
        "# Written by benchmarks/validation_table.py --write-band from `meshplan validate` (validation/mfu_range.py):",
        "# per GPU kind, class of layout and matmul kind, the lowest and highest MFU the published runs of",
        "# catalog/runs measured, in the reports' convention (causal attention over the dense bf16 peak): each run's",
        "# predicted MFU times predicted over measured step time. Classes (reports/published_range.py MFU_CLASSES):",
        "# dense, moe (no EP), cp, ep, and cp_ep (every run with CP or EP: what a layout with both is held to).",
    ]
    for gpu, classes in ranges.items():
        for cls, kinds in classes.items():
            for matmul, cell in kinds.items():
                lines += [
                    "",
                    f'[{gpu}.{cls}."{matmul}"]',
                    f"mfu_min = {cell['mfu_min']:.4f}",
                    f"mfu_max = {cell['mfu_max']:.4f}",
                    f"runs = {cell['runs']}",
                    f"sources = {cell['sources']}",
                    f"highest = {json.dumps(cell['highest'], ensure_ascii=False)}",
                ]
    return "\n".join(lines) + "\n"
