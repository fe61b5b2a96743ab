"""The serving band's promise, measured: each published serving source held out of the band in turn, and its rows
checked against the band built without it (docs/validation.md, "The serving band, held out source by source").

python benchmarks/serving_band_coverage.py           # per source and class, then per class and overall
python benchmarks/serving_band_coverage.py --rows    # also every row outside

For each source with counted rows (``meshplan validate --serving``, status ok), the band is rebuilt from every other
source (validation/serving_band.py ``band_without``: their corrections and residuals held out among themselves)
and each of the source's rows is inside when its measured over predicted time (a latency's ratio, a rate's
inverse; serve's raw prediction, as serve prints it beside the band) lies within the P10-P90 that a question like
the row's takes (its class, engine, GPU kind, MoE or not, MLA or not). A class the held-out source alone measured
has no band without it: its rows count as outside unless the rule gives such a class a band. The promise is 80%.
Run from an older checkout (PYTHONPATH=that checkout) it measures that revision's rule the same way.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from meshplan.validation import serving_band
from meshplan.validation.serving import predict_rows, reference_rows
from meshplan.validation.serving_band import band_without, inside, time_ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", action="store_true", help="also list every row outside its band")
    args = parser.parse_args()
    rows = [p for r in reference_rows() for p in predict_rows(r)]
    counted = [r for r in rows if r.status == "ok" and r.predicted]
    tally: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    reasons: dict[tuple[str, str], set[str]] = defaultdict(set)
    outside = []
    for source in sorted({r.source for r in counted}):
        band = band_without(rows, source)
        for r in counted:
            if r.source != source:
                continue
            widened: tuple[str, ...] = ()
            try:
                ok = inside(r, band)
                if hasattr(serving_band, "row_band"):  # this revision's rule names why a band is widened
                    widened = serving_band.row_band(r, band).widened
            except (KeyError, ValueError):  # no band for the class without this source
                ok = False
            reasons[(source, r.metric_class)] |= set(widened)
            for k in ((source, r.metric_class), ("all sources", r.metric_class), ("all sources", "all classes")):
                tally[k][0] += ok
                tally[k][1] += 1
                tally[k][2] += bool(widened)
            if not ok:
                outside.append((r, time_ratio(r)))
    print("| source | metric class | rows | inside the band built without it | share | rows widened (why) |")
    print("|---|---|---|---|---|---|")
    for (source, cls), (n_in, n, wide) in sorted(tally.items(), key=lambda t: (t[0][0] == "all sources", t[0])):
        why = f" ({'; '.join(sorted(reasons[(source, cls)]))})" if reasons.get((source, cls)) else ""
        print(f"| {source} | {cls} | {n} | {n_in} | {100 * n_in / n:.1f}% | {wide}{why} |")
    per_source = [(n_in, n) for (s, _), (n_in, n, _) in tally.items() if s != "all sources"]
    made = sum(1 for n_in, n in per_source if n_in >= 0.8 * n)
    print(f"\n{made} of {len(per_source)} (source, class) pairs have 80% of their rows inside or more")
    if args.rows:
        print("\n| row | source | class | measured / predicted time |")
        print("|---|---|---|---|")
        for r, ratio in outside:
            print(f"| {r.case} | {r.source} | {r.metric_class} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
