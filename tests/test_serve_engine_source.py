"""A serving question that states no engine: TensorRT-LLM's constants predict it (the same numbers as --engine
trtllm), ``engine_source`` says "default", and its band is the class's widened as for an unseen engine
(reports/serve_setup.py stated_engine, reports/serve_band.py band_for)."""

from __future__ import annotations

import json
import math

import pytest
from test_serve_band import BAND

from meshplan import io
from meshplan.cli import main
from meshplan.reports.serve import serve_report, serving_band_text
from meshplan.reports.serve_band import band_for
from meshplan.reports.serve_plan import serve_plan_report
from meshplan.reports.serve_plan_file import serving_plan_of
from meshplan.validation.serving import reference_rows
from meshplan.validation.serving_typed import TYPED_KINDS, stated_engine_flag, typed_flags, typed_setup

SERVE = {"gpu": "h100-sxm", "gpus": 1, "input_len": 1000, "output_len": 200, "concurrency": 8.0}
REASON = "no engine stated: TensorRT-LLM's constants, widened as for an unseen engine"
BAND_KEYS = ("tpot_s_p10", "tpot_s_p90", "ttft_s_unloaded_p10", "ttft_s_unloaded_p90")
BAND_KEYS += ("tokens_per_s_per_gpu_p10", "tokens_per_s_per_gpu_p90", "band_sources", "band_widened", "uncertainty")
BAND_KEYS += ("load_band",)


def test_no_engine_predicts_trtllms_numbers_with_the_unseen_engine_band() -> None:
    unstated = serve_report("llama-3.1-8b", **SERVE)  # type: ignore[arg-type]
    flagged = serve_report("llama-3.1-8b", **SERVE, engine="trtllm")  # type: ignore[arg-type]
    assert (unstated["engine"], unstated["engine_source"]) == ("trtllm", "default")
    assert (flagged["engine"], flagged["engine_source"]) == ("trtllm", "flag")
    rest = set(unstated) - set(BAND_KEYS) - {"engine_source"}
    assert rest == set(flagged) - set(BAND_KEYS) - {"engine_source"}
    assert {k: unstated[k] for k in rest} == {k: flagged[k] for k in rest}  # the prediction is the same
    assert REASON in unstated["band_widened"] and REASON in unstated["uncertainty"]
    assert REASON not in flagged["band_widened"] and REASON not in flagged["uncertainty"]
    # the band of each class, re-derived: the class's P10-P90 with the unseen-engine width in quadrature (H100, a
    # dense non-MLA model: levels the published rows ran), against trtllm's family band where it has rows
    band = io.serving_held_out_band()
    for key, cls in (("tpot_s", "decode"), ("ttft_s_unloaded", "prefill")):
        lo, mid, hi = (band[f"{cls}_time_ratio_{q}"] for q in ("p10", "p50", "p90"))
        w = band[f"{cls}_unseen_engine_log"]
        want_lo = mid * math.exp(-math.sqrt(math.log(mid / lo) ** 2 + w * w))
        want_hi = mid * math.exp(math.sqrt(math.log(hi / mid) ** 2 + w * w))
        assert unstated[f"{key}_p10"] == pytest.approx(unstated[key] * want_lo, rel=1e-12)
        assert unstated[f"{key}_p90"] == pytest.approx(unstated[key] * want_hi, rel=1e-12)
        if f"{cls}_engine_trtllm_sources" in band:
            fam = band[f"{cls}_engine_trtllm_time_ratio_p90"]
            assert flagged[f"{key}_p90"] == pytest.approx(flagged[key] * fam, rel=1e-12)


def test_band_for_an_unstated_engine_ignores_the_family_of_the_stand_in() -> None:
    band = BAND  # the band file of tests/test_serve_band.py: TensorRT-LLM decode rows of two sources
    stated = band_for(band, "decode", engine="trtllm", gpu="h100-sxm", moe=False, mla=False)
    unstated = band_for(band, "decode", engine="trtllm", gpu="h100-sxm", moe=False, mla=False, stated=False)
    assert (stated.lo, stated.mid, stated.hi, stated.widened) == (0.8, 1.2, 1.8, ())
    assert unstated.mid == 1.0 and unstated.engine_sources == 0 and unstated.sources == 3
    assert unstated.lo == pytest.approx(math.exp(-math.sqrt(math.log(1 / 0.8) ** 2 + 0.04)), rel=1e-12)
    assert unstated.hi == pytest.approx(math.exp(math.sqrt(math.log(1.5) ** 2 + 0.04)), rel=1e-12)
    assert unstated.widened == (REASON,)


def test_serve_plan_text_names_the_unstated_engine() -> None:
    model = io.load_model("llama-3.1-8b")
    assert REASON in serving_band_text(model, engine="trtllm", gpu="h100-sxm", stated=False)
    assert REASON not in serving_band_text(model, engine="trtllm", gpu="h100-sxm")


def test_typed_rows_carry_the_engine_only_where_their_source_states_it() -> None:
    """NIM's page (its backend inside the container) states no engine: typed without --engine. Splitwise's CSV
    states none either, but its paper does (vLLM, of its time: 0.2, op by op with Ray workers): typed as its reader
    types it, --engine vllm-0.2, whose own launch mode is op by op."""
    typed = [r for r in reference_rows() if r["kind"] in TYPED_KINDS]
    assert {r["source"]["id"] for r in typed} == {"splitwise_perf_csv", "nim_bench_llm"}
    for r in typed:
        flags = typed_flags(r)
        if r["source"]["id"] == "nim_bench_llm":
            assert stated_engine_flag(r) is None and "engine" not in flags and "launch" not in flags
        else:
            assert flags["engine"] == "vllm-0.2" and "launch" not in flags
            assert typed_setup(r)[0].hw.cal.launch.value == "eager"
    tables = [r for r in reference_rows() if r["kind"] not in TYPED_KINDS and r["source"]["id"].startswith("trtllm")]
    assert tables and all(stated_engine_flag(r) == "trtllm" for r in tables)


def test_cli_text_says_the_engine_was_not_stated(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["serve", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "1", "--input-len", "1000", "--output-len", "200"]
    assert main([*argv, "--concurrency", "8"]) == 0
    text = capsys.readouterr().out
    assert "(trtllm, no engine stated)" in text and REASON in text
    assert main([*argv, "--concurrency", "8", "--engine", "trtllm"]) == 0
    text = capsys.readouterr().out
    assert "no engine stated" not in text


def test_a_saved_plan_keeps_where_its_engine_came_from() -> None:
    """serve-plan --save writes engine_source; the reader holds the band text to it, and reads a file written before
    the key existed as one whose engine was stated."""
    kwargs = {"gpu": "h100-sxm", "gpus": 8, "input_len": 1024, "output_len": 256}
    unstated = json.loads(json.dumps(serve_plan_report("llama-3.1-8b", **kwargs)))  # type: ignore[arg-type]
    flagged = json.loads(json.dumps(serve_plan_report("llama-3.1-8b", **kwargs, engine="trtllm")))  # type: ignore[arg-type]
    assert (unstated["engine_source"], flagged["engine_source"]) == ("default", "flag")
    assert unstated["best"] == flagged["best"] and REASON in unstated["uncertainty"]
    assert serving_plan_of(unstated, "plan.json").predicted == serving_plan_of(flagged, "plan.json").predicted
    older = {k: v for k, v in flagged.items() if k != "engine_source"}
    assert serving_plan_of(older, "plan.json").predicted == serving_plan_of(flagged, "plan.json").predicted
    with pytest.raises(ValueError, match="uncertainty"):
        serving_plan_of(unstated | {"engine_source": "flag"}, "plan.json")
    with pytest.raises(ValueError, match="engine_source must be one of flag, default"):
        serving_plan_of(unstated | {"engine_source": "guess"}, "plan.json")
