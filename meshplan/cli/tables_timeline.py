"""``estimate --timeline``: the step drawn as text, one line per pipeline stage, with the totals its rows sum to."""

from __future__ import annotations

from typing import Any

from meshplan.render import gb, seconds

WIDTH = 72
"""Characters a stage's line spans: each stands for 1/WIDTH of the step, drawn as what fills most of it."""
MARKS = {"forward": "F", "backward": "B", "bubble": ".", "optimizer": "o", "host": "h"}
COMM = {"tp": "t", "cp": "c", "ep": "e", "pp": "p", "dp": "d"}
LEGEND = "F forward  B backward  . bubble  t/c/e/p/d exposed TP, CP, EP, PP, DP traffic  o optimizer  h host"


def _line(intervals: list[dict[str, Any]], step: float) -> str:
    fill: list[dict[str, float]] = [{} for _ in range(WIDTH)]
    width = step / WIDTH
    for i in intervals:
        mark = COMM[i["axis"]] if i["kind"] == "comm" else MARKS[i["kind"]]
        first, last = int(i["start_s"] / width), min(int(i["end_s"] / width), WIDTH - 1)
        for k in range(first, last + 1):
            share = min(i["end_s"], (k + 1) * width) - max(i["start_s"], k * width)
            if share > 0:
                fill[k][mark] = fill[k].get(mark, 0.0) + share
    return "".join(max(f, key=lambda m: f[m]) if f else " " for f in fill)


def timeline_lines(r: dict[str, Any]) -> list[str]:
    """The text Gantt of ``estimate``'s ``timeline`` key and, per stage, its peak memory."""
    tl = r["timeline"]
    t = tl["totals"]
    step = t["step_time_s"]
    out = [
        "",
        f"step timeline ({tl['schedule']}, {tl['micro_batches']} micro-batches"
        + (f", {tl['vpp']} chunks a stage" if tl["vpp"] > 1 else "")
        + f"; drawn in {tl['drawn_as']}), {seconds(step)} across",
    ]
    for row, mem in zip(tl["stages"], tl["memory"], strict=True):
        out.append(f"stage {row['stage']:>3} |{_line(row['intervals'], step)}| peak {gb(mem['peak_bytes'])}")
    out += [
        LEGEND,
        f"each stage: compute {seconds(t['compute_s'])}, bubble {seconds(t['bubble_s'])}, exposed communication "
        f"{seconds(t['exposed_comm_s'])}, optimizer {seconds(t['optimizer_s'])}",
    ]
    return out
