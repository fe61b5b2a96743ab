"""meshplan validate holds the step-time targets on published measured runs (regression bounds).

Targets (from the step-time issue, measured by `meshplan validate`):
- Korthikanti et al. 2022 Table 5, 8 iteration times: mean |error| <= 3%, max <= 7%
  (Calculon: 3.65% mean, 8.87% max on exactly these);
- Narayanan et al. 2021 Table 1, 10 throughputs: mean |error| <= 0.8 x that of the best single constant;
- Llama 3 Table 4, 3 MFUs: each within 3 points; both published drops with the right sign, within 2 points.
"""

import pytest

from meshplan.validate import best_constant_error, validate


@pytest.fixture(scope="module")
def report() -> dict:
    return validate()


def test_every_target_holds(report: dict) -> None:
    failed = [(s["source"], c) for s in report["sources"] for c in s["checks"] if not c["ok"]]
    assert not failed, failed
    assert report["all_ok"]


def test_korthikanti_bounds(report: dict) -> None:
    src = next(s for s in report["sources"] if s["source"] == "korthikanti2022")
    assert src["cases"] == 8
    assert src["mean_abs_error"] <= 0.03 and src["max_abs_error"] <= 0.07


def test_narayanan_beats_the_best_constant(report: dict) -> None:
    src = next(s for s in report["sources"] if s["source"] == "narayanan2021")
    runs = [r for r in report["runs"] if r["source"] == "narayanan2021"]
    assert len(runs) == 10
    constant = best_constant_error([r["measured"] for r in runs])
    assert constant == pytest.approx(0.0535, abs=0.002)  # the bar stated in the issue: about 5.4%
    assert src["mean_abs_error"] <= 0.8 * constant
    # and it predicts why larger models reach more: the largest beats the smallest
    by_case = {r["case"]: r["predicted"] for r in runs}
    assert by_case["1008.0B"] > by_case["1.7B"] * 1.1


def test_llama3_mfu_and_drops(report: dict) -> None:
    runs = {r["case"]: r for r in report["runs"] if r["source"] == "llama3"}
    for r in runs.values():
        assert abs(r["predicted"] - r["measured"]) <= 0.03
    base, more, long = runs["8K, 8,192 GPUs"], runs["8K, 16,384 GPUs"], runs["128K, 16,384 GPUs"]
    for a, b in ((base, more), (more, long)):
        got, want = b["predicted"] - a["predicted"], b["measured"] - a["measured"]
        assert got < 0 and abs(got - want) <= 0.02
