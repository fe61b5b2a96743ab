"""FLOP counts against the papers' closed forms, and the pipeline bubble and in-flight counts."""

import pytest

from meshplan import io
from meshplan.core import pipeline
from meshplan.core.params import count_params
from meshplan.core.time.flops import korthikanti_model_flops, model_flops_per_token, narayanan_flops, six_nd
from meshplan.core.time.step_time import _bubble
from meshplan.spec.layout import Schedule


def test_model_flops_equal_korthikanti_eq_7_for_a_gpt_model() -> None:
    """Eq. 7 counts the attention over the whole context; the causal count (MFU's) halves its s/6h term."""
    model = io.load_model("megatron-530b")
    s, batch = 2048, 280
    ours = model_flops_per_token(model, seq_len=s, causal=False) * s * batch
    paper = korthikanti_model_flops(
        batch=batch, layers=model.num_layers, seq=s, hidden=model.hidden, vocab=model.vocab_size
    )
    assert ours == pytest.approx(paper, rel=2e-4)  # the paper drops biases (13h per layer)
    causal = model_flops_per_token(model, seq_len=s) * s * batch
    h, layers = model.hidden, model.num_layers
    assert ours - causal == pytest.approx(72 * batch * layers * s * h**2 * s / (6 * h) / 2, rel=1e-12)


def test_narayanan_eq_3_is_four_thirds_of_the_model_flops_plus_the_head() -> None:
    """Eq. 3 counts the recompute forward: 96 B s l h^2 (1 + s/6h + V/16lh) = 4/3 of Eq. 7 but the head."""
    b, s, layers, h, v = 512, 2048, 24, 2304, 51200
    eq3 = narayanan_flops(batch=b, layers=layers, seq=s, hidden=h, vocab=v)
    eq7 = korthikanti_model_flops(batch=b, layers=layers, seq=s, hidden=h, vocab=v)
    head = 6 * b * s * v * h
    assert eq3 == pytest.approx(4 / 3 * (eq7 - head) + head)


def test_six_nd_is_close_to_the_detailed_count_at_short_context() -> None:
    model = io.load_model("llama-3.1-70b")
    detailed = model_flops_per_token(model, seq_len=2048)
    assert six_nd(count_params(model).total, 1) == pytest.approx(detailed, rel=0.05)


@pytest.mark.parametrize(("p", "m", "v"), [(4, 16, 1), (8, 64, 1), (8, 64, 3), (16, 32, 8)])
def test_bubble_fractions(p: int, m: int, v: int) -> None:
    """Narayanan et al. 2021 Sec. 2.2: bubble / ideal = (p-1)/m, and (p-1)/(v m) when interleaved."""
    t_f, t_b = 1.0, 2.0
    schedule = Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B
    bubble = _bubble(schedule, pp=p, vpp=v, t_f=t_f, t_b=t_b)
    assert bubble / (m * (t_f + t_b)) == pytest.approx((p - 1) / (v * m))
    assert _bubble(Schedule.GPIPE, pp=p, vpp=1, t_f=t_f, t_b=t_b) == pytest.approx((p - 1) * (t_f + t_b))
    assert _bubble(Schedule.ZERO_BUBBLE, pp=p, vpp=1, t_f=t_f, t_b=t_b) == pytest.approx((p - 1) * t_f)


def test_a_larger_pipeline_never_shrinks_the_bubble() -> None:
    sizes = [_bubble(Schedule.ONE_F_ONE_B, pp=p, vpp=1, t_f=1.0, t_b=2.0) for p in (1, 2, 4, 8, 16)]
    assert sizes == sorted(sizes) and sizes[0] == 0


def test_in_flight_micro_batches() -> None:
    """1F1B: stage i holds min(p - i, m); interleaved stage 0: p (1 + (p-1)/(p v)) (Korthikanti Sec. 4.2.3)."""
    p, m, v = 8, 64, 3
    assert [pipeline.in_flight(schedule=Schedule.ONE_F_ONE_B, pp=p, vpp=1, m=m, stage=i) for i in range(p)] == list(
        range(p, 0, -1)
    )
    first = pipeline.in_flight(schedule=Schedule.INTERLEAVED, pp=p, vpp=v, m=m, stage=0)
    assert first == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert pipeline.in_flight(schedule=Schedule.GPIPE, pp=p, vpp=1, m=m, stage=3) == m
    assert pipeline.in_flight(schedule=Schedule.ONE_F_ONE_B, pp=p, vpp=1, m=2, stage=0) == 2


def test_uneven_stages_spare_the_first_and_last() -> None:
    layers = [pipeline.stage_layers(126, pp=16, stage=i) for i in range(16)]
    assert sum(layers) == 126 and layers[0] == layers[-1] == 7 and set(layers[1:-1]) == {8}
