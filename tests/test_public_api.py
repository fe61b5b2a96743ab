"""The public Python API: a frozen list of names, each importable, and the docs' example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import meshplan

PUBLIC = [
    "Cluster", "ContextParallel", "FIELDS", "Finetune", "FinetuneMode", "FinetuneRequest", "GPU", "Layout",
    "LayoutRequest", "Link", "MemoryBill", "ModelSpec", "Objective", "Optimizer", "PRECISIONS", "Plan",
    "Recompute", "Schedule", "SearchResult", "SearchSpace", "StepTime", "TrainingMemory", "Workload", "ZeroStage",
    "count_params", "estimate_report", "evaluate", "fit_report", "list_gpus", "list_links", "list_models",
    "load_gpu", "load_link", "load_model", "memory_report", "params_report", "plan_report", "resolve_cluster",
    "resolve_layout", "resolve_workload", "search", "serving_report", "stage_table", "validate",
]  # fmt: skip


def test_all_is_frozen_and_every_name_resolves() -> None:
    assert sorted(PUBLIC) == meshplan.__all__
    for name in meshplan.__all__:
        assert getattr(meshplan, name) is not None, name


def test_import_is_light() -> None:
    code = "import sys, meshplan; print('numpy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_docs_example_runs() -> None:
    text = (Path(__file__).parent.parent / "docs" / "api.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(block.strip().splitlines()) <= 12
    done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert re.match(r"[\d.]+ GB on stage \d, [\d.]+ s per step, MFU [\d.]+%", lines[0]), lines
    assert lines[1].startswith("Layout(") and lines[1].endswith(" s"), lines
