"""The peak-memory table of docs/validation.md, as Markdown, from `meshplan validate --memory`.

python benchmarks/memory_validation.py > /tmp/memory.md
"""

from __future__ import annotations

from meshplan.render import gb
from meshplan.validation.memory import validate_memory


def main() -> None:
    report = validate_memory()
    for src in report["sources"]:
        print(f"### {src['title']} ({src['reports']} bytes)\n")
        print("| case | figure | published GiB | billed GiB | error |")
        print("|---|---|---|---|---|")
        for r in (x for x in report["runs"] if x["source"] == src["source"]):
            print(
                f"| {r['case']} | {r['metric']} | {r['measured_gib']:.2f} | {r['predicted_gib']:.2f} | "
                f"{100 * r['error']:+.1f}% |"
            )
        print(
            f"\nmean |error| {100 * src['mean_abs_error']:.2f}%, max {100 * src['max_abs_error']:.2f}%; "
            f"the best single constant: {100 * src['best_constant_error']:.2f}%\n"
        )
    s = report["summary"]
    print(f"All cases: mean |error| {100 * s['mean_abs_error']:.2f}%, max {100 * s['max_abs_error']:.2f}%.\n")
    for v in report["verdicts"]:
        state = "fits" if v["fits"] else f"{gb(v['over_bytes_per_gpu'])} over HBM"
        print(f"- {v['case']}: {gb(v['memory_bytes_per_gpu'])} of {gb(v['hbm_bytes_per_gpu'])}, {state}")
        for saving in v.get("savings", []):
            closes = "closes the gap" if saving["closes_gap"] else "not enough alone"
            print(f"  - {saving['saving']}: {gb(saving['bytes'])} ({closes})")
    print("\nAll targets hold." if report["all_ok"] else "\nSome targets do not hold.")


if __name__ == "__main__":
    main()
