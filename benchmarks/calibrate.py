"""Grid search of one GPU kind's calibration constants over that kind's published runs.

    python benchmarks/calibrate.py a100-80gb korthikanti2022,narayanan2021 \
        "matmul_efficiency_max=0.75,0.77,0.79 pipeline_step_overhead_s=0.001,0.0015"

For every combination it prints the mean and max error of each source and
whether its targets hold; the best combination comes last. Constants are
per GPU kind (never per run): one combination must serve all the sources
given. The values in the catalog were chosen with this script; the grids
used are recorded in docs/validation.md.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import sys

from meshplan import io

validate = importlib.import_module("meshplan.validation.training")  # the package exports a function of that name


def run(gpu: str, overrides: dict[str, float], sources: list[str]) -> list[dict]:
    """Every source's summary with ``gpu``'s calibration replaced by ``overrides``."""
    original = io.load_gpu

    def patched(name: str):  # type: ignore[no-untyped-def]
        spec = original(name)
        if spec.name != gpu:
            return spec
        return dataclasses.replace(spec, calibration=dataclasses.replace(spec.calibration, **overrides))

    io.load_gpu = patched  # type: ignore[assignment]
    try:
        return [validate.summarize(s, validate.run_source(s)) for s in sources]
    finally:
        io.load_gpu = original  # type: ignore[assignment]


def score(summaries: list[dict]) -> float:
    """Worst ratio of a check's value to its bound (below 1: every target holds)."""
    return max(c["value"] / c["bound"] for s in summaries for c in s["checks"])


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    gpu, sources, grid_text = argv[0], argv[1].split(","), argv[2]
    grid = {k: [float(x) for x in v.split(",")] for k, v in (item.split("=") for item in grid_text.split())}
    results = []
    for values in itertools.product(*grid.values()):
        overrides = dict(zip(grid, values, strict=True))
        summaries = run(gpu, overrides, sources)
        s = score(summaries)
        results.append((s, overrides))
        detail = "  ".join(
            f"{x['source']}: mean {100 * x['mean_abs_error']:.2f}% max {100 * x['max_abs_error']:.2f}%"
            for x in summaries
        )
        print(f"{s:6.3f} {'ok ' if s <= 1 else 'no '} {overrides}  {detail}", flush=True)
    best = min(results, key=lambda r: r[0])
    print(f"best: {best[1]} (worst check at {best[0]:.3f} of its bound)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
