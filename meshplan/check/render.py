"""The check report as text: one table per layout, ranks folded together where they agree."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from meshplan.render import table


def _ranks(records: list[dict[str, Any]]) -> str:
    ranks = [r["rank"] for r in records]
    if ranks == [None]:
        return "mean"
    return "all" if ranks == list(range(records[0]["world_size"])) else ",".join(str(r) for r in ranks)


def _folded(records: Iterable[dict[str, Any]]) -> list[tuple[str, ...]]:
    """Rows of (quantity, phase, axis, ranks, predicted, measured, ratio, ok): ranks with equal numbers share one."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in records:
        key = (r["quantity"], r["phase"], r["axis"], r["predicted"], r["measured"])
        groups.setdefault(key, []).append(r)
    rows: list[tuple[str, ...]] = []
    for (quantity, phase, axis, predicted, measured), group in groups.items():
        ratio = group[0]["ratio"]
        rows.append(
            (
                str(quantity),
                str(phase),
                str(axis or "-"),
                _ranks(group),
                f"{predicted:,.0f}",
                f"{measured:,.0f}",
                "-" if ratio is None else f"{ratio:.4f}",
                f"{group[0]['target']} {'ok' if group[0]['ok'] else 'FAIL'}",
            )
        )
    return rows


def render_check(r: dict[str, Any]) -> str:
    """Text for ``meshplan check`` (register as tables.RENDERERS['check'])."""
    shape = ", ".join(f"{k}={v}" for k, v in r["model"].items())
    moe = ", ".join(f"{k}={v}" for k, v in r["moe"].items())
    out = [f"meshplan check on {r['world_size']} processes; tiny model: {shape}; MoE variant (ep): {moe}", ""]
    headers = ["quantity", "phase", "axis", "ranks", "predicted", "measured", "ratio", "target"]
    for layout in r["layouts"]:
        records = [x for x in r["results"] if x["layout"] == layout]
        bad = sum(not x["ok"] for x in records)
        out.append(f"{layout}: {len(records)} comparisons, " + (f"{bad} off target" if bad else "all within target"))
        out += [table(_folded(records), headers, align="llllrrrl"), ""]
    for s in r["skipped"]:
        out.append(f"skipped {s['layout']}: {s['reason']}")
    for u in r["unmeasured"]:
        out.append(f"predicted, not measurable on CPU: {u['layout']} {u['quantity']} rank {u['rank']}: "
                   f"{u['predicted']:,.0f} bytes")  # fmt: skip
    failed = [x for x in r["results"] if not x["ok"]]
    out.append(
        f"all {len(r['results'])} comparisons within target"
        if not failed
        else f"{len(failed)} of {len(r['results'])} comparisons off target"
    )
    return "\n".join(out)
