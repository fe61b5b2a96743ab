"""Real torch.distributed runs of a tiny Llama-style model, measured per rank (optional extra ``meshplan[torch]``).

``run_check(world_size, layouts)`` launches ``world_size`` local gloo processes, applies each layout with
PyTorch's own APIs (DDP, FSDP2, DTensor tensor/sequence parallel, FSDP2 x TP, ``torch.distributed.pipelining``,
all-to-all expert parallel, ring context parallel), runs one measured training step after warm-up, and returns
``Measurement`` records: parameter, gradient, optimizer-state and saved-activation bytes, and the count and
bytes of every collective per phase and process group. Importing this package does not import torch; the first
use of one of its names does, and says how to install it when it is missing.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DENSE", "LAYOUTS", "MOE", "Measurement", "TinyConfig", "run_check"]

_SOURCES = {"TinyConfig": "meshplan.check.shapes", "DENSE": "meshplan.check.shapes", "MOE": "meshplan.check.shapes"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'meshplan.check' has no attribute {name!r}")
    try:
        module = importlib.import_module(_SOURCES.get(name, "meshplan.check.runner"))
    except ModuleNotFoundError as exc:
        if exc.name == "torch":
            raise ModuleNotFoundError(
                "meshplan check needs torch; install the CPU build with `pip install torch==2.13.0`"
            ) from exc
        raise
    return getattr(module, name)
