"""``meshplan list``: what the catalog holds, one line per entry."""

from __future__ import annotations

from typing import Any

from meshplan import io

KINDS = ("models", "gpus", "links", "recipes", "stacks")


def list_report(kind: str) -> dict[str, Any]:
    """The catalog's ``kind``: names with a short description (and the numbers that tell them apart)."""
    if kind not in KINDS:
        raise ValueError(f"meshplan list: unknown kind {kind!r} (choose from {', '.join(KINDS)})")
    if kind == "stacks":
        return {"kind": kind, "items": stacks_report()["stacks"]}
    items: list[dict[str, Any]]
    if kind == "models":
        from meshplan.core.params import count_params

        items = []
        for name in io.list_models():
            spec = io.load_model(name)
            counts = count_params(spec)
            items.append({"name": name, "params_total": counts.total, "layers": spec.num_layers, "moe": bool(spec.moe)})
    elif kind == "gpus":
        items = []
        for name in io.list_gpus():
            g = io.load_gpu(name)
            items.append({"name": name, "hbm_bytes_per_gpu": g.hbm_bytes, "description": g.description})
    elif kind == "links":
        items = []
        for name in io.list_links():
            lk = io.load_link(name)
            items.append(
                {
                    "name": name,
                    "bandwidth_bytes_per_s_per_direction": lk.bandwidth_bytes_per_s,
                    "description": lk.description,
                }
            )
    else:
        from meshplan.reports.recipes import list_report as recipes

        items = [{"name": r["name"], "description": r.get("title", "")} for r in recipes()["recipes"]]
    return {"kind": kind, "items": items}


def stacks_report() -> dict[str, Any]:
    """``meshplan stacks``: every training stack with the conditions it sets and where its defaults come from."""
    stacks = []
    for name in io.list_stacks():
        s = io.load_stack(name)
        stacks.append(
            {
                "name": s.name,
                "description": s.description,
                "reports": s.reports,
                "defaults": dict(s.defaults),
                "source": s.source,
            }
        )
    return {"stacks": stacks}
