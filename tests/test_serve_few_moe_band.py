"""The band serve prints beside a MoE model decoding a few sequences a step: the spread of published such steps
(catalog/serving/few_moe_decode.toml), re-derived here from the rows and the rule, and how serve takes it."""

from __future__ import annotations

import math
import statistics

import pytest

from meshplan import io
from meshplan.reports.serve import serve_report
from meshplan.reports.serve_band import band_for
from meshplan.reports.serve_coverage import SMALL_MOE_DECODE_BATCH
from meshplan.validation.serving_few_moe import FewMoeRow, band, catalog, command, few_moe

KEY = "decode_few_moe"


@pytest.fixture(scope="module")
def block() -> dict:
    return few_moe()


def test_every_row_is_a_moe_model_at_a_few_sequences_a_step_typed_as_serve_takes_it(block: dict) -> None:
    data = catalog()
    sources = {s["id"] for s in data["source"]}
    assert {r["source"] for r in data["row"]} == sources  # every source has rows, every row a source
    for row, got in zip(data["row"], block["rows"], strict=True):
        assert io.load_model(row["model"]).moe is not None
        assert got["batch_per_replica"] <= SMALL_MOE_DECODE_BATCH
        assert command(row).startswith(f"meshplan serve {row['model']} --gpu ")
        r = serve_report(row["model"], **row["flags"])  # what the user gets for the line
        assert got["predicted_s"] == r["tpot_s"]
        assert got["measured_s"] == pytest.approx(row["measured_tpot_ms"] / 1e3)


def test_tokens_per_second_rows_are_their_batch_over_the_rate() -> None:
    """Rows published as tokens/s carry the time per token the batch takes: 1000 x batch / tokens/s."""
    published = {"gptfast-mixtral-bf16-tp8": (1, 227.82), "sglang-v041-dsv3-b8": (8, 206.32)}
    rows = {r["id"]: r for r in catalog()["row"]}
    for case, (batch, rate) in published.items():
        assert rows[case]["flags"]["batch"] == batch
        assert rows[case]["measured_tpot_ms"] == pytest.approx(1e3 * batch / rate, abs=5e-3)


def test_the_band_is_the_sources_spread_each_weighing_the_same_widened_for_few(block: dict) -> None:
    """Re-derived without the module's helpers: each row at the middle of its weight (1 / its source's rows) on the
    cumulative axis, the quantile linearly between them; t_0.90 with 4 degrees of freedom is 1.5332 (tables), so
    f(5) = 1.5332 sqrt(1.2) / 1.2816."""
    by_source: dict[str, list[float]] = {}
    for r in block["rows"]:
        by_source.setdefault(r["source"], []).append(math.log(r["measured_s"] / r["predicted_s"]))
    pairs = sorted((x, 1 / len(v)) for v in by_source.values() for x in v)
    total = sum(w for _, w in pairs)
    cum, pos = 0.0, []
    for _, w in pairs:
        pos.append((cum + w / 2) / total)
        cum += w

    def q(p: float) -> float:
        if p <= pos[0]:
            return pairs[0][0]
        i = next(i for i in range(1, len(pos)) if p <= pos[i])
        return pairs[i - 1][0] + (p - pos[i - 1]) / (pos[i] - pos[i - 1]) * (pairs[i][0] - pairs[i - 1][0])

    f = 1.5332 * math.sqrt(1 + 1 / 5) / 1.2816
    lo, mid, hi = q(0.1), q(0.5), q(0.9)
    b = block["band"]
    assert len(by_source) == b[f"{KEY}_sources"] == 5
    assert b[f"{KEY}_widening"] == pytest.approx(f, rel=1e-3)
    assert b[f"{KEY}_time_ratio_p50"] == pytest.approx(math.exp(mid), rel=1e-9)
    assert b[f"{KEY}_time_ratio_p10"] == pytest.approx(math.exp(mid - f * (mid - lo)), rel=1e-3)
    assert b[f"{KEY}_time_ratio_p90"] == pytest.approx(math.exp(mid + f * (hi - mid)), rel=1e-3)
    # the stored band is this one
    stored = io.serving_held_out_band()
    assert {k: v for k, v in stored.items() if k.startswith(KEY)} == pytest.approx(b, abs=1e-4)


def test_the_published_spread_is_what_the_band_spans(block: dict) -> None:
    """gpt-fast's Mixtral steps sit within 7% of the model, SGLang's 2024-2025 DeepSeek-V3 releases three to five
    times slower: the band spans both, and each source falls inside the band built without it."""
    ratio = {r["case"]: r["measured_s"] / r["predicted_s"] for r in block["rows"]}
    gptfast = [v for k, v in ratio.items() if k.startswith("gptfast")]
    assert max(abs(v - 1) for v in gptfast) < 0.08
    assert 3 < ratio["sglang-v041-dsv3-b1"] < 6
    b = block["band"]
    assert b[f"{KEY}_time_ratio_p10"] < min(ratio.values()) and max(ratio.values()) < b[f"{KEY}_time_ratio_p90"]
    assert block["inside_band_without_source"] == 1.0
    mean = statistics.fmean(abs(r["error"]) for r in block["rows"])
    assert block["mean_abs_error"] == pytest.approx(mean)
    assert mean < block["best_constant_mean_abs_error"]  # one TPOT guessed for all the rows does worse


def test_one_source_is_refused() -> None:
    one = [FewMoeRow(case=f"c{i}", source="s", model="m", measured_s=2.0, predicted_s=1.0, batch_per_replica=1)
           for i in range(3)]  # fmt: skip
    with pytest.raises(ValueError, match="two sources or more"):
        band(one)


def test_serve_widens_tpot_and_tokens_to_the_union_at_a_few_sequences() -> None:
    kw = {"gpu": "h200", "gpus": 8, "tp": 8, "engine": "sglang", "weights_dtype": "fp8", "input_len": 128}
    few = serve_report("deepseek-v3", **kw, output_len=256, batch=1)  # type: ignore[arg-type]
    held = io.serving_held_out_band()
    base = {c: band_for(held, c, engine="sglang", gpu="h200", moe=True, mla=True) for c in ("decode", "throughput-moe")}
    lo, hi = held[f"{KEY}_time_ratio_p10"], held[f"{KEY}_time_ratio_p90"]
    dec = base["decode"]
    assert few["tpot_s_p10"] == pytest.approx(few["tpot_s"] * min(dec.lo, lo), rel=1e-9)
    assert few["tpot_s_p90"] == pytest.approx(few["tpot_s"] * max(dec.hi, hi), rel=1e-9)
    rate = base["throughput-moe"]
    assert few["tokens_per_s_per_gpu_p10"] == pytest.approx(few["tokens_per_s_per_gpu"] / max(rate.hi, hi), rel=1e-9)
    assert any("published such steps of 5 sources" in w for w in few["band_widened"])
    assert "serve's TPOT band at so few sequences spans the published such steps" in few["warnings"][-1]
    # past the few sequences, and for a dense model, the decode band as before
    many = serve_report("deepseek-v3", **kw, output_len=256, concurrency=64)  # type: ignore[arg-type]
    assert many["batch_per_replica"] > SMALL_MOE_DECODE_BATCH
    assert many["tpot_s_p90"] == pytest.approx(many["tpot_s"] * dec.hi, rel=1e-9)
    assert not any("such steps" in w for w in many["band_widened"])
    dense = serve_report("llama-3.1-8b", gpu="h100-sxm", gpus=1, input_len=128, output_len=256, batch=1)
    assert not any("such steps" in w for w in dense["band_widened"])


def test_serve_plan_states_the_band_its_best_plan_takes_and_its_file_reads_it_back() -> None:
    """A latency search for a MoE model lands on one sequence a step: the band serve-plan states beside its plans is
    the one serve prints for that plan (the few-sequence union), and a saved plan file carrying it reads back; a
    file whose band leaves the union out is refused."""
    import json

    from meshplan.reports.serve_plan import serve_plan_report
    from meshplan.reports.serve_plan_file import serving_plan_of

    kw = {"gpu": "h200", "gpus": 8, "input_len": 1024, "output_len": 256, "engine": "sglang"}
    fast = serve_plan_report("deepseek-v3", **kw, objective="latency")  # type: ignore[arg-type]
    assert fast["best"]["batch_cap_per_replica"] <= SMALL_MOE_DECODE_BATCH
    held = io.serving_held_out_band()
    hi = held[f"{KEY}_time_ratio_p90"]
    assert f"-{hi:.2f} (" in fast["uncertainty"].split("TTFT")[0]  # TPOT's upper factor is the few-step band's
    assert "published such steps of 5 sources" in fast["uncertainty"]
    data = json.loads(json.dumps(fast))
    assert serving_plan_of(data, "plan.json") is not None
    busy = serve_plan_report("deepseek-v3", **kw)  # type: ignore[arg-type]
    assert busy["best"]["batch_cap_per_replica"] > SMALL_MOE_DECODE_BATCH
    assert "such steps" not in busy["uncertainty"]
    data["uncertainty"] = busy["uncertainty"]
    with pytest.raises(ValueError, match="uncertainty"):
        serving_plan_of(data, "plan.json")
