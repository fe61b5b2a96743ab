"""The catalog as the explorer's forms need it (``/api/catalog``): models, GPUs, links, recipes, stacks, the run
conditions with their choices and bounds, and the request limits."""

from __future__ import annotations

from typing import Any

from meshplan import io
from meshplan.reports.recipes import list_report
from meshplan.server import parse
from meshplan.spec.layout import Recompute
from meshplan.spec.requests import Group, field
from meshplan.spec.requests import group as fields_of
from meshplan.spec.workload import PRECISIONS, OptimizerKind


def _gpu_entries() -> list[dict[str, Any]]:
    """Each catalog GPU with its memory and links."""
    return [
        {
            "name": name,
            "display_name": str(io.gpu_meta(name).get("display_name", name)),
            "hbm_bytes_per_gpu": g.hbm_bytes,
            "scale_up_link": g.scale_up_link,
            "scale_up_domain": g.scale_up_domain,
            "scale_out_link": g.scale_out_link,
            "description": g.description,
        }
        for name, g in ((name, io.load_gpu(name)) for name in parse.gpu_names())
    ]


def _link_entries() -> list[dict[str, Any]]:
    """Each catalog link with its tier, bandwidth per direction and latency."""
    return [
        {
            "name": name,
            "kind": lk.kind.value,
            "tier": lk.tier.value,
            "bandwidth_bytes_per_s": lk.bandwidth_bytes_per_s,
            "latency_s": lk.latency_s,
            "description": lk.description,
        }
        for name, lk in ((name, io.load_link(name)) for name in parse.link_names())
    ]


def _condition_entries() -> list[dict[str, Any]]:
    """The run conditions as the CLI flags and the query parameters take them (choices, bounds, unit, help)."""
    return [
        {
            "name": f.key,
            "type": f.type.__name__,
            "choices": list(f.choices),
            "lo": f.lo,
            "hi": f.hi,
            "unit": f.unit,
            "help": f.help,
        }
        for f in fields_of(Group.CONDITIONS)
    ]


def _unset_layout() -> dict[str, Any]:
    """What estimate takes for each layout field, the sequence and the global batch when nothing sets them (the
    schema's defaults; null: derived from the others), for a form that must not keep its own example values."""
    return {f.key: f.default for f in (*fields_of(Group.LAYOUT), field("seq"), field("global_batch"))}


def catalog_dict() -> dict[str, Any]:
    """What /api/catalog serves: the catalog's names and the choices and limits of every form."""
    return {
        "models": list(parse.model_names()),
        "gpus": _gpu_entries(),
        "links": _link_entries(),
        "recipes": list_report()["recipes"],
        "precisions": [{"name": p.name, "description": p.description} for p in PRECISIONS.values()],
        "optimizers": [o.value for o in OptimizerKind],
        "recompute": [r.name.lower() for r in Recompute],
        "serving_dtypes": list(field("weights_dtype").choices),
        "kv_dtypes": list(field("kv_dtype").choices),
        "objectives": list(field("objective").choices),
        "stacks": [
            {"name": s.name, "description": s.description, "reports": s.reports, "defaults": dict(s.defaults)}
            for s in map(io.load_stack, io.list_stacks())
        ],
        "conditions": _condition_entries(),
        "unset": _unset_layout(),
        "limits": {
            "gpus": parse.MAX_GPUS,
            "seq": parse.MAX_SEQ,
            "global_batch": parse.MAX_BATCH,
            "micro_batch": parse.MAX_MICRO_BATCH,
            "top": parse.MAX_TOP,
            "body_bytes": parse.MAX_BODY_BYTES,
        },
    }
