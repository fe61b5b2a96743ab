"""`meshplan calibrate` on published sources, each taken as one user's cluster.

    python benchmarks/calibrate_sources.py [--draws 10] [--fit 10]

For each source whose runs are one cluster and whose metric calibrate takes (tokens per second per GPU or
iteration time), every run is typed as a user would (``validate.estimate_args``: its flags, the layout validate
picks, the paper's model as a model file), ``--fit`` of them chosen at random are the user's measured runs, and
the others are predicted before and after the fit. Sources with fewer than 2 x ``--fit`` runs fit on half. Each
source is drawn ``--draws`` times; the medians of the held-out runs' mean |error| are printed, with the share of
the other runs whose measured over predicted step time falls in the profile's own P10-P90 band (80% if the band
is honest) and the constants calibrate chose. The issue's target: from 10 runs, the error on the cluster's other
runs at least halves.

``--in-sample SOURCE`` prints instead, for one source, every choice of one or two constants fitted on all its runs
(first order, as calibrate fits) and its mean |error| there: the least any such profile can leave.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from meshplan import io
from meshplan.spec.profile import CONSTANTS, IDENTITY
from meshplan.validation import fit as profile_fit
from meshplan.validation.calibrate import MeasuredRun, _rows, fit_runs, predict
from meshplan.validation.training import _model, estimate_args, run_case, sources

METRICS = {"tokens_per_s_per_gpu": "tokens_per_s_per_gpu", "iteration_time_s": "step_time_s"}
CLUSTERS = (
    "llm_foundry_a100",
    "llm_foundry_h100",
    "torchtitan_h100",
    "torchtitan_a100",
    "megascale2024",
    "korthikanti2022",
)
"""Sources that are one cluster each (one GPU kind and fabric) with a metric calibrate takes."""


def typed_runs(source: str, folder: Path) -> list[MeasuredRun]:
    """Every run of ``source`` as the estimate arguments a user types, with its published value."""
    data = sources()[source]
    metric = data["source"]["metric"]
    runs = []
    for i, raw in enumerate(data["case"]):
        case = {**data.get("defaults", {}), **raw}
        layout = run_case(source, case, metric).layout
        model = None
        if case.get("model_overrides"):
            path = folder / f"{source}-{i}.toml"
            path.write_text(io.model_to_toml(_model(case)), encoding="utf-8")
            model = str(path)
        args = estimate_args(case, layout, model=model)[1:]  # without the command name
        runs.append(MeasuredRun(args=tuple(args), metric=METRICS[metric], measured=float(case["measured"])))
    return runs


def _mean_error(runs: list[MeasuredRun], predicted: list[float]) -> float:
    return statistics.mean(abs(p / r.measured - 1) for r, p in zip(runs, predicted, strict=True))


def _covered(runs: list[MeasuredRun], predicted: list[float], lo: float, hi: float) -> float:
    """Share of ``runs`` whose measured over predicted step time lies in the profile's band [lo, hi]."""
    pairs = zip(runs, predicted, strict=True)
    ratios = [p / r.measured if r.metric == "tokens_per_s_per_gpu" else r.measured / p for r, p in pairs]
    return sum(lo <= x <= hi for x in ratios) / len(ratios)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=10)
    parser.add_argument("--fit", type=int, default=10)
    parser.add_argument("--in-sample", metavar="SOURCE", choices=CLUSTERS)
    args = parser.parse_args()
    if args.in_sample:
        in_sample(args.in_sample)
        return
    head = f"{'source':<18} {'runs':>4} {'fit':>3} {'held out: catalog':>18} {'fitted':>7} {'in band':>8}"
    print(f"{head}  scales chosen (draws)")
    with tempfile.TemporaryDirectory() as tmp:
        for source in CLUSTERS:
            runs = typed_runs(source, Path(tmp))
            k = args.fit if len(runs) >= 2 * args.fit else len(runs) // 2
            rng = random.Random(source)
            before, after, covered, chosen = [], [], [], []
            for _ in range(args.draws):
                picked = set(rng.sample(range(len(runs)), k))
                train = [r for i, r in enumerate(runs) if i in picked]
                test = [r for i, r in enumerate(runs) if i not in picked]
                profile, numbers = fit_runs(train)
                before.append(_mean_error(test, predict(test, IDENTITY)))
                fitted = predict(test, profile)
                after.append(_mean_error(test, fitted))
                covered.append(_covered(test, fitted, numbers["time_ratio_p10"], numbers["time_ratio_p90"]))
                chosen.append("+".join(numbers["fitted"]).replace("_scale", "") or "none")
            picks = ", ".join(f"{c} {chosen.count(c)}" for c in sorted(set(chosen)))
            b, a, c = statistics.median(before), statistics.median(after), statistics.median(covered)
            print(f"{source:<18} {len(runs):>4} {k:>3} {100 * b:>17.1f}% {100 * a:>6.1f}% {100 * c:>7.0f}%  {picks}")


def in_sample(source: str) -> None:
    """Every choice of at most two constants fitted on all of ``source``'s runs, least error first."""
    with tempfile.TemporaryDirectory() as tmp:  # the runs' model files live there
        runs = typed_runs(source, Path(tmp))
        sens = profile_fit.sensitivities(lambda p: _rows(runs, p))
    rows = []
    for free in profile_fit.subsets(CONSTANTS, 2):
        fitted = profile_fit.fit(sens, free=free)
        values = ", ".join(f"{name} {getattr(fitted.profile, name):.3g}" for name in free) or "the catalog"
        rows.append((fitted.mean_abs_error, values))
    print(f"{source}: {len(runs)} runs, each choice of constants fitted on all of them (first order)")
    for error, values in sorted(rows):
        print(f"{100 * error:6.2f}%  {values}")


if __name__ == "__main__":
    main()
