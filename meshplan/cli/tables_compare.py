"""``meshplan compare`` as text: the step and the memory, term by term, and the layout's flags."""

from __future__ import annotations

from typing import Any

from meshplan.render import gb, percent, seconds, table


def _cell(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return seconds(value) if unit == "s" else gb(value)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _rows(terms: list[dict[str, Any]], unit: str) -> list[list[str]]:
    return [
        [
            r["term"],
            _cell(r[f"measured_{unit}"], unit),
            _cell(r[f"predicted_{unit}"], unit),
            _ratio(r["measured_over_predicted"]),
            r["note"],
        ]
        for r in terms
    ]


def compare_table(r: dict[str, Any]) -> str:
    lay = {k: v for k, v in r["layout"].items() if v not in (1, False, "none")}
    out = [f"{r['model']} on {r['gpus']} x {r['gpu']}: {', '.join(f'{k}={v}' for k, v in lay.items())}"]
    t, m = r["time"], r["memory"]
    headers = ["term", "measured", "predicted", "ratio", ""]
    if t["step_time_s_measured"] is not None:
        line = (
            f"step: measured {seconds(t['step_time_s_measured'])} ({t['step_from']}), predicted "
            f"{seconds(t['step_time_s_predicted'])} ({_ratio(t['measured_over_predicted'])})"
        )
        if "attributed_fraction" in t:
            where = "GPU" if t["trace_on_device"] else "CPU"
            line += f"; {percent(t['attributed_fraction'])} of the {where} trace's step attributed to named terms"
        out += ["", line, "", table(_rows(t["terms"], "s"), headers, align="lrrrl")]
        if t.get("calls_per_step"):
            calls = [
                [c["collective"], f"{c['measured']:g}", f"{c['measured_in_backward']:g}", f"{c['predicted']:g}"]
                for c in t["calls_per_step"]
            ]
            out += ["", table(calls, ["calls per step", "measured", "after backward began", "predicted"])]
    if m["terms"]:
        line = (
            f"memory: peak {_cell(m['peak_bytes_measured'], 'bytes')} measured, {gb(m['peak_bytes_predicted'])} billed"
        )
        if m.get("attributed_fraction") is not None:
            line += f"; {percent(m['attributed_fraction'])} of the snapshot attributed to named terms"
        out += ["", line, "", table(_rows(m["terms"], "bytes"), headers, align="lrrrl")]
    out += ["", "layout flags:" if r["layout_flags"] else "layout flags: none (the run's collectives fit the plan)"]
    out += [f"  - {flag}" for flag in r["layout_flags"]]
    if r.get("runs_file"):
        out += ["", f"wrote the run to {r['runs_file']} (meshplan calibrate {r['runs_file']})"]
    return "\n".join(out)
