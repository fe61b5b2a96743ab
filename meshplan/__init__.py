"""meshplan: plan how a transformer is split across GPUs.

The public API, loaded on first use (so the command line starts without numpy)::

    import meshplan

    model = meshplan.load_model("llama-3.1-70b")
    cluster = meshplan.resolve_cluster(gpu="h200", gpus=64)
    layout = meshplan.Layout(tp=8, pp=2, dp_shard=4, zero=meshplan.ZeroStage.OPTIMIZER)
    plan = meshplan.evaluate(model, cluster, layout, meshplan.Workload(seq_len=8192, global_batch=256))

docs/api.md walks through it; every name below is part of the contract (tests/test_public_api.py).
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    # inputs
    "ModelSpec": "meshplan.spec.model",
    "GPU": "meshplan.spec.cluster",
    "Link": "meshplan.spec.cluster",
    "Cluster": "meshplan.spec.cluster",
    "Layout": "meshplan.spec.layout",
    "ZeroStage": "meshplan.spec.layout",
    "Recompute": "meshplan.spec.layout",
    "Schedule": "meshplan.spec.layout",
    "ContextParallel": "meshplan.spec.layout",
    "Workload": "meshplan.spec.workload",
    "PRECISIONS": "meshplan.spec.workload",
    "Optimizer": "meshplan.spec.workload",
    "Finetune": "meshplan.spec.finetune",
    "FinetuneMode": "meshplan.spec.finetune",
    "FIELDS": "meshplan.spec.requests",
    "LayoutRequest": "meshplan.reports.inputs",
    "FinetuneRequest": "meshplan.reports.inputs",
    # loaders
    "load_model": "meshplan.io",
    "load_gpu": "meshplan.io",
    "load_link": "meshplan.io",
    "list_models": "meshplan.io",
    "list_gpus": "meshplan.io",
    "list_links": "meshplan.io",
    "resolve_cluster": "meshplan.reports.inputs",
    "resolve_layout": "meshplan.reports.inputs",
    "resolve_workload": "meshplan.reports.inputs",
    # the core
    "count_params": "meshplan.core.params",
    "evaluate": "meshplan.core.plan",
    "Plan": "meshplan.core.plan",
    "MemoryBill": "meshplan.core.memory.bill",
    "TrainingMemory": "meshplan.core.training",
    "StepTime": "meshplan.core.time.step_time",
    "stage_table": "meshplan.core.stages",
    "search": "meshplan.search.rank",
    "SearchResult": "meshplan.search.rank",
    "SearchSpace": "meshplan.search.space",
    "Objective": "meshplan.search.order",
    # reports: the JSON answers of the CLI and the HTTP API
    "params_report": "meshplan.reports.params",
    "memory_report": "meshplan.reports.bills",
    "fit_report": "meshplan.reports.bills",
    "serving_report": "meshplan.reports.bills",
    "estimate_report": "meshplan.reports.estimate",
    "plan_report": "meshplan.reports.plan",
    "validate": "meshplan.validation.training",
}

__all__ = sorted(_WHERE)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'meshplan' has no attribute {name!r}")


def __dir__() -> list[str]:
    return [*__all__, "__version__"]
