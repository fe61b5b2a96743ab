"""`meshplan calibrate` on published sources, each taken as one user's cluster.

    python benchmarks/calibrate_sources.py [--draws 10] [--fit 10] [--source NAME ...] [--without CONSTANT ...]

Every catalog source is a cluster, or one per GPU kind where its runs span several (``fms_fsdp:h100-sxm``).
Every run is typed as a user would (``validate.estimate_args``: its flags, the layout validate picks, the paper's
model as a model file) with the figure calibrate takes: the iteration time as ``step_time_s``, any rate (tokens
per second, TFLOP/s per GPU by a paper's count, MFU) as ``tokens_per_s_per_gpu``, the published rate times the
catalog's tokens over its own figure for the run (the FLOPs a paper counts per token are fixed by the run, so
its rate is tokens per second in another unit). ``--fit`` runs chosen at random are the user's measured runs,
and the others are predicted before and after the fit. Clusters of fewer than 2 x ``--fit`` runs fit on half
(at least 3, calibrate's least; clusters of fewer than 6 runs are listed as too few). Each cluster is drawn
``--draws`` times; the medians of the held-out runs' mean |error| are printed, with the share of the other runs
whose measured over predicted step time falls in the profile's own P10-P90 band (80% if the band is honest) and
the constants calibrate chose. The issue's target: from 10 runs, the error on the cluster's other runs at least
halves. ``--without`` takes constants out of calibrate's choices (``--without step_overhead_s``).

``--in-sample SOURCE`` prints instead, for one source, every choice of one or two constants fitted on all its runs
(first order, as calibrate fits) and its mean |error| there: the least any such profile can leave.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import random
import statistics
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from meshplan import io
from meshplan.spec.profile import CONSTANTS, IDENTITY
from meshplan.validation import calibrate
from meshplan.validation import fit as profile_fit
from meshplan.validation.calibrate import MIN_RUNS, MeasuredRun, _rows, fit_runs, predict
from meshplan.validation.training import _model, estimate_args, run_case, sources

calibrate._estimate = functools.cache(calibrate._estimate)  # draws refit the same runs: evaluate each once


def clusters() -> dict[str, tuple[str, str | None]]:
    """Every source as a cluster, or one cluster per GPU kind where its runs span several: name -> (source, kind)."""
    out: dict[str, tuple[str, str | None]] = {}
    for name, data in sources().items():
        kinds = sorted({str({**data.get("defaults", {}), **c}["gpu"]) for c in data["case"]})
        for kind in kinds:
            out[name if len(kinds) == 1 else f"{name}:{kind}"] = (name, None if len(kinds) == 1 else kind)
    return out


def typed_runs(cluster: str, folder: Path) -> list[MeasuredRun]:
    """Every run of ``cluster`` as the estimate arguments a user types, with its published figure."""
    source, kind = clusters()[cluster]
    data = sources()[source]
    metric = data["source"]["metric"]
    runs = []
    for i, raw in enumerate(data["case"]):
        case = {**data.get("defaults", {}), **raw}
        if kind is not None and case["gpu"] != kind:
            continue
        result = run_case(source, case, metric)
        model = None
        if case.get("model_overrides"):
            path = folder / f"{source}-{i}.toml"
            path.write_text(io.model_to_toml(_model(case)), encoding="utf-8")
            model = str(path)
        args = tuple(estimate_args(case, result.layout, model=model)[1:])  # without the command name
        if metric == "iteration_time_s":
            runs.append(MeasuredRun(args=args, metric="step_time_s", measured=float(case["measured"])))
            continue
        typed = MeasuredRun(args=args, metric="tokens_per_s_per_gpu", measured=1.0)
        tokens = predict([typed], IDENTITY)[0] * result.measured / result.predicted
        runs.append(MeasuredRun(args=args, metric="tokens_per_s_per_gpu", measured=tokens))
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
    parser.add_argument("--in-sample", metavar="CLUSTER", choices=sorted(clusters()))
    parser.add_argument("--source", nargs="*", metavar="CLUSTER", choices=sorted(clusters()))
    parser.add_argument("--without", nargs="*", default=[], choices=CONSTANTS)
    args = parser.parse_args()
    if args.in_sample:
        in_sample(args.in_sample)
        return
    offered = tuple(c for c in CONSTANTS if c not in args.without)
    head = f"{'cluster':<26} {'runs':>4} {'fit':>3} {'held out: catalog':>18} {'fitted':>7} {'in band':>8}"
    print(f"{head}  scales chosen (draws)")
    with tempfile.TemporaryDirectory() as tmp:
        for source in args.source or sorted(clusters()):
            runs = typed_runs(source, Path(tmp))
            k = args.fit if len(runs) >= 2 * args.fit else len(runs) // 2
            if k < MIN_RUNS:
                print(f"{source:<26} {len(runs):>4}  too few runs to fit {MIN_RUNS} and predict the others", flush=True)
                continue
            rng = random.Random(source)
            before, after, covered, chosen = [], [], [], []
            for _ in range(args.draws):
                picked = set(rng.sample(range(len(runs)), k))
                train = [r for i, r in enumerate(runs) if i in picked]
                test = [r for i, r in enumerate(runs) if i not in picked]
                before.append(_mean_error(test, predict(test, IDENTITY)))
                try:
                    profile, numbers = fit_runs(train, offered=offered)
                except ValueError:  # refused: the user keeps the catalog
                    after.append(before[-1])
                    chosen.append("refused")
                    continue
                fitted = predict(test, profile)
                after.append(_mean_error(test, fitted))
                covered.append(_covered(test, fitted, numbers["time_ratio_p10"], numbers["time_ratio_p90"]))
                chosen.append("+".join(numbers["fitted"]).replace("_scale", "") or "none")
            picks = ", ".join(f"{c} {chosen.count(c)}" for c in sorted(set(chosen)))
            b, a = statistics.median(before), statistics.median(after)
            c = statistics.median(covered) if covered else math.nan
            line = f"{source:<26} {len(runs):>4} {k:>3} {100 * b:>17.1f}% {100 * a:>6.1f}% {100 * c:>7.0f}%  {picks}"
            print(line, flush=True)


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
