"""Readable lines for days, dollars and goodput (reports/cost.py's keys) on estimate, plan and serve."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meshplan.render import count, gb, percent, seconds


def money(x: float | None) -> str:
    """A cost in the price's own currency: 85.0M, 5.67, 0.409 ('never' where the job never finishes)."""
    if x is None:
        return "never"
    return count(x) if abs(x) >= 1e3 else f"{x:.3g}"


def _minutes(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 5400 else f"{s / 60:.1f} min"


def _h(h: float) -> str:
    return f"{h:,.0f}" if h >= 100 else f"{h:.3g}"


def _days(d: float | None) -> str:
    return "never" if d is None else f"{d:,.1f}"


def _hours(h: float | None) -> str:
    return "never" if h is None else count(h)


def cost_lines(r: Mapping[str, Any]) -> list[str]:
    """The price, the checkpoint and the failures of one layout (estimate), each only when asked for."""
    out: list[str] = []
    if "cost" in r:
        c = r["cost"]
        total = (
            f", {money(c['cost_total'])} for {count(r['time_to_train']['tokens_total'])} tokens"
            if "cost_total" in c
            else ""
        )
        free = " (failures not counted)" if "goodput" in r else ""
        out.append(
            f"cost at {c['price_per_gpu_hour']:g} per GPU-hour: {money(c['cost_per_million_tokens'])} per million "
            f"tokens{total}{free}"
        )
    if "checkpoint" in r:
        out.append(checkpoint_line(r["checkpoint"]))
    if "goodput" in r:
        out += goodput_lines(r["goodput"])
    return out


def checkpoint_line(k: Mapping[str, Any]) -> str:
    return (
        f"checkpoint: {gb(k['bytes_total'])} ({k['weight_bytes_per_param']:g} bytes/param of weights + "
        f"{k['optimizer_bytes_per_param']:g} of master copy and moments), saved in {seconds(k['save_s'])} at "
        f"{k['bandwidth_bytes_per_s_per_node'] / 1e9:g} GB/s per node on {k['nodes']:,} node"
        + ("s" if k["nodes"] > 1 else "")
    )


def goodput_lines(g: Mapping[str, Any]) -> list[str]:
    """The failure rate, what each failure costs, and the goodput (with the time to train when given)."""
    steps = f"every {g['interval_steps']:,.0f} steps" if g["interval_steps"] >= 1 else "every step"
    optimum = ""
    if not g["interval_source"].startswith("Young"):
        optimum = f"; the Young/Daly optimum is {_minutes(g['optimal_interval_s'])}"
    lines = [
        f"failures: one every {_h(g['job_mtbf_hours'])} h on this fleet ({g['mtbf_gpu_hours']:,.0f} GPU-hours per "
        f"GPU); each costs a {_minutes(g['restart_s'])} restart + {_minutes(g['interval_s'] / 2)} of lost work "
        f"(half the {_minutes(g['interval_s'])} between saves, {steps}: {g['interval_source']}{optimum})",
    ]
    head = (
        f"goodput {percent(g['goodput_fraction'])} (saves take {percent(g['checkpoint_overhead_fraction'])} of "
        f"training time, failures {percent(min(g['failure_overhead_fraction'], 1.0))} of wall time)"
    )
    if "wall_time_days" in g:
        head += f": {_days(g['wall_time_days'])} days, {_hours(g['gpu_hours_total'])} GPU-hours"
        head += "" if g["failures_total"] is None else f", {g['failures_total']:,.0f} failures expected"
        head += f", cost {money(g['cost_total'])}" if "cost_total" in g else ""
    return [*lines, head]


def with_cost_columns(
    r: Mapping[str, Any], rows: list[tuple[Any, ...]], columns: Sequence[str], align: str
) -> tuple[list[tuple[Any, ...]], list[str], str]:
    """``plan``'s table with days, GPU-hours, cost and goodput columns before its last one, where asked for
    (with an MTBF, days, GPU-hours and cost count failures)."""
    plans = r["plans"]
    if not plans or ("time_to_train_days" not in plans[0] and "cost" not in plans[0]):
        return rows, list(columns), align
    extra: list[str] = []
    values: list[list[str]] = [[] for _ in plans]
    failures = "goodput" in plans[0]
    if "time_to_train_days" in plans[0]:
        extra += ["days", "GPU-hours"]
        for v, p in zip(values, plans, strict=True):
            g = p["goodput"] if failures else None
            v += [_days(g["wall_time_days"] if g else p["time_to_train_days"])]
            v += [_hours(g["gpu_hours_total"] if g else p["gpu_hours_total"])]
    if "cost" in plans[0]:
        tokens = "cost_total" in plans[0]["cost"]
        extra.append("cost" if tokens else "cost/M tok")
        for v, p in zip(values, plans, strict=True):
            c = p["goodput"].get("cost_total") if failures and tokens else p["cost"].get("cost_total")
            v.append(money(c if tokens else p["cost"]["cost_per_million_tokens"]))
    if failures:
        extra.append("goodput")
        for v, p in zip(values, plans, strict=True):
            v.append(percent(p["goodput"]["goodput_fraction"]))
    joined = [(*row[:-1], *v, row[-1]) for row, v in zip(rows, values, strict=True)]
    return joined, [*columns[:-1], *extra, columns[-1]], align[:-1] + "r" * len(extra) + align[-1]


def plan_cost_lines(r: Mapping[str, Any]) -> list[str]:
    """``plan``'s fleet lines: the cost objective's fleets, the checkpoint, plan 1's failures."""
    out: list[str] = []
    if "cheapest_fleet" in r:
        f = r["cheapest_fleet"]
        within = f" within {f['days']:g} days" if f["days"] is not None else ""
        out.append(
            f"cheapest fleet to train {count(f['tokens'])} tokens{within}: {f['gpus']:,} GPUs; GPU-hours of the best "
            f"layout on {f['searched_from']:,} GPUs and each halving: " + ", ".join(_fleet(x) for x in f["fleets"])
        )
    if "checkpoint" in r:
        out.append(checkpoint_line(r["checkpoint"]))
    if r["plans"] and "goodput" in r["plans"][0]:
        out.append("plan 1 " + goodput_lines(r["plans"][0]["goodput"])[0])
    return out


def _fleet(x: Mapping[str, Any]) -> str:
    if not x["fits"]:
        return f"{x['gpus']:,}: nothing fits"
    late = " (late)" if x["meets_deadline"] is False else ""
    return f"{x['gpus']:,}: {_hours(x['gpu_hours_total'])}{late}"


def serve_cost_line(r: Mapping[str, Any]) -> list[str]:
    """``serve``'s cost per million output tokens, when a price is given."""
    if "cost" not in r:
        return []
    c = r["cost"]
    per_million = money(c["cost_per_million_output_tokens"])
    return [
        f"cost at {c['price_per_gpu_hour']:g} per GPU-hour: {per_million} per million output tokens "
        f"({r['gpus']} GPUs at {r['tokens_per_s_total']:,.0f} output tokens/s)"
    ]
