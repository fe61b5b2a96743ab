"""Reports: the JSON-shaped answers the CLI prints and the HTTP API returns.

One function per question. Both edges call these and nothing else, so a
number on a web page and the same number on the command line come from one
place. Inputs are names and plain values (as a user gives them); outputs are
plain dicts of JSON data whose keys are part of the command-line contract.
"""

from meshplan.reports.bills import fit_report, memory_report, params_report, serving_report
from meshplan.reports.inputs import LayoutRequest, layout_dict, resolve_cluster, resolve_layout, resolve_workload

__all__ = [
    "LayoutRequest",
    "fit_report",
    "layout_dict",
    "memory_report",
    "params_report",
    "resolve_cluster",
    "resolve_layout",
    "resolve_workload",
    "serving_report",
]
