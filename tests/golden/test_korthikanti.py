"""Korthikanti et al. 2022: activation memory per layer (Table 2) and per GPU (Figure 1).

Table 2's formulas are written out here from the paper and compared with
meshplan's tensor-by-tensor accounting of the same GPT layer (eager
attention, dropout, 16-bit activations): they must agree exactly. Figure 1's
per-GPU values (as transcribed for Calculon's validation, GiB) are compared
for the first pipeline stage (activations) and a middle stage (weights and
optimizer state, which the figure counts without embeddings) at 5%.
"""

import pytest

from meshplan import io
from meshplan.core.memory import activations as act
from meshplan.core.training import training_memory
from meshplan.spec.layout import Layout, Recompute, Schedule
from meshplan.spec.workload import PRECISIONS, Attention, Workload
from meshplan.units import GiB

GPT_22B = io.load_model("megatron-22b")


def table_2(s: int, b: int, h: int, a: int, t: int, *, sp: bool, recompute: str) -> float:
    """Per-layer activation bytes, Korthikanti et al. 2022 Table 2."""
    if recompute == "full":
        return 2 * s * b * h / (t if sp else 1)
    quad = 0 if recompute == "selective" else 5 * a * s / (h * t)
    return s * b * h * ((34 / t if sp else 10 + 24 / t) + quad)


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_table_2_per_layer(t: int, sp: bool, recompute: str) -> None:
    if sp and t == 1:
        pytest.skip("sequence parallelism needs tp > 1")
    s, b = 2048, 4
    got = act.layer_bytes(
        GPT_22B,
        seq_len=s,
        micro_batch=b,
        tp=t,
        sp=sp,
        cp=1,
        recompute=Recompute[recompute.upper()],
        attention=Attention.EAGER,
        act_bytes=2.0,
        moe_layer=False,
    )
    assert got == pytest.approx(table_2(s, b, GPT_22B.hidden, GPT_22B.num_heads, t, sp=sp, recompute=recompute))


# Figure 1 (GiB): params+opt, activations without recompute (TP), activations with SP + selective
FIGURE_1 = {
    "megatron-22b": (dict(tp=8, pp=1, micro_batch=4), 4, None, (45.5625, 59.25, 9.5625)),
    "gpt3-175b": (dict(tp=8, pp=8, vpp=3, micro_batch=1), 64, 51200, (45.5625, 66.84375, 12.3515625)),
    "megatron-530b": (dict(tp=8, pp=35, vpp=3, micro_batch=1), 280, None, (31.640625, 114.0234375, 23.076171875)),
    "megatron-1t": (dict(tp=8, pp=64, micro_batch=1), 512, None, (32.958984375, 131.25, 26.5625)),
}


@pytest.mark.parametrize("name", sorted(FIGURE_1))
def test_figure_1_per_gpu(name: str) -> None:
    import dataclasses

    degrees, batch, vocab, (state_gib, act_none_gib, act_seqsel_gib) = FIGURE_1[name]
    model = io.load_model(name)
    if vocab:
        model = dataclasses.replace(model, vocab_size=vocab)
    gpu = io.load_gpu("a100-80gb")
    work = Workload(seq_len=2048, global_batch=batch, precision=PRECISIONS["fp16"], attention=Attention.EAGER)
    schedule = Schedule.INTERLEAVED if degrees.get("vpp", 1) > 1 else Schedule.ONE_F_ONE_B
    for sp, recompute, published in (
        (False, Recompute.NONE, act_none_gib),
        (True, Recompute.SELECTIVE, act_seqsel_gib),
    ):
        layout = Layout(schedule=schedule, sp=sp, recompute=recompute, **degrees)
        mem = training_memory(model, layout, work, gpu=gpu)
        assert mem.stages[0].activations_bytes / GiB == pytest.approx(published, rel=0.05)
        middle = mem.stages[min(1, layout.pp - 1)]
        assert middle.model_state_bytes / GiB == pytest.approx(state_gib, rel=0.05)
