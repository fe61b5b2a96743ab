"""Reports: the JSON-shaped answers the CLI prints and the HTTP API returns.

One function per question. Both edges call these and nothing else, so a
number on a web page and the same number on the command line come from one
place. Inputs are names and plain values (as a user gives them); outputs are
plain dicts of JSON data whose keys are part of the command-line contract.
Submodules load on first use, so `meshplan params` starts without numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "params_report": "meshplan.reports.params",
    "fit_report": "meshplan.reports.bills",
    "memory_report": "meshplan.reports.bills",
    "serving_report": "meshplan.reports.bills",
    "LayoutRequest": "meshplan.reports.inputs",
    "layout_dict": "meshplan.reports.inputs",
    "resolve_cluster": "meshplan.reports.inputs",
    "resolve_layout": "meshplan.reports.inputs",
    "resolve_workload": "meshplan.reports.inputs",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'meshplan.reports' has no attribute {name!r}")
