"""serve's word on a MoE model decoding a few sequences a step: its speed there belongs to the engine's release."""

from __future__ import annotations

import pytest

from meshplan.reports.serve import serve_report
from meshplan.reports.serve_coverage import SMALL_MOE_DECODE_BATCH


def _small_moe(report: dict) -> list[str]:
    return [w for w in report["warnings"] if "engine release's host and dispatch costs" in w]


@pytest.mark.parametrize("batch", [1, SMALL_MOE_DECODE_BATCH])
def test_a_moe_model_at_a_few_sequences_a_step_is_told_its_engine_release_sets_the_step(batch: int) -> None:
    report = serve_report("mixtral-8x7b", gpu="h100-sxm", gpus=2, tp=2, input_len=128, output_len=256, batch=batch)
    assert report["batch_per_replica"] == pytest.approx(batch)
    (warning,) = _small_moe(report)
    plural = "" if batch == 1 else "s"
    assert f"mixtral-8x7b decodes {batch} sequence{plural} a step per replica" in warning
    assert "1.79 times at concurrency 4" in warning  # the published release-to-release move it cites
    assert "trtllm's family constants" in warning  # the engine whose constants priced it (serve's default)


def test_no_word_past_the_small_batch_or_for_a_dense_model() -> None:
    past = serve_report(
        "mixtral-8x7b", gpu="h100-sxm", gpus=2, tp=2, input_len=128, output_len=256, batch=SMALL_MOE_DECODE_BATCH + 1
    )
    assert past["batch_per_replica"] > SMALL_MOE_DECODE_BATCH
    assert _small_moe(past) == []
    dense = serve_report("llama-3.1-8b", gpu="h100-sxm", gpus=1, input_len=128, output_len=256, batch=1)
    assert _small_moe(dense) == []


def test_the_load_sets_the_batch_the_word_is_about() -> None:
    """Under a concurrency the in-flight batch per replica decides, not the fleet's total: 8 users over 4
    replicas are 2 a replica (warned); 64 over 4 are 16 (not)."""
    few = serve_report("mixtral-8x7b", gpu="h100-sxm", gpus=8, tp=2, input_len=128, output_len=256, concurrency=8)
    assert few["batch_per_replica"] == pytest.approx(2, rel=0.05)
    assert len(_small_moe(few)) == 1
    many = serve_report("mixtral-8x7b", gpu="h100-sxm", gpus=8, tp=2, input_len=128, output_len=256, concurrency=64)
    assert many["batch_per_replica"] > SMALL_MOE_DECODE_BATCH
    assert _small_moe(many) == []


def test_serve_plan_says_it_of_its_best_plan() -> None:
    """serve-plan asked for the lowest latency decodes one sequence a step: its best plan carries the word, and a
    throughput search, whose best plan fills its batch, does not."""
    from meshplan.reports.serve_plan import serve_plan_report

    fast = serve_plan_report("mixtral-8x7b", gpu="h100-sxm", gpus=2, input_len=512, output_len=256, objective="latency")
    assert fast["best"]["batch_cap_per_replica"] <= SMALL_MOE_DECODE_BATCH
    (warning,) = [w for w in fast["warnings"] if "engine release's host and dispatch costs" in w]
    assert warning.startswith(f"the best plan of mixtral-8x7b decodes {fast['best']['batch_cap_per_replica']} sequence")
    busy = serve_plan_report("mixtral-8x7b", gpu="h100-sxm", gpus=2, input_len=512, output_len=256)
    assert busy["best"]["batch_cap_per_replica"] > SMALL_MOE_DECODE_BATCH
    assert not [w for w in busy["warnings"] if "engine release's host and dispatch costs" in w]
