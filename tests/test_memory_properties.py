"""Properties of the training bill that must hold for every model and layout."""

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from meshplan import io
from meshplan.core.memory.bill import TERMS, stage_bill
from meshplan.core.params import count_params
from meshplan.core.training import training_memory
from meshplan.spec.cluster import GpuCalibration
from meshplan.spec.layout import Layout, Recompute, ZeroStage
from meshplan.spec.workload import Workload

MODELS = ["llama-3.1-8b", "mixtral-8x7b", "deepseek-v3", "gpt3-175b", "qwen3-235b-a22b"]
CAL = GpuCalibration()


def bill(name: str, layout: Layout, work: Workload, stage: int = 0):
    model = io.load_model(name)
    return stage_bill(model, count_params(model), layout, work, calibration=CAL, stage=stage)


@given(name=st.sampled_from(MODELS), seq=st.sampled_from([512, 2048, 8192]), mb=st.integers(1, 4))
def test_terms_sum_to_total(name: str, seq: int, mb: int) -> None:
    b = bill(name, Layout(micro_batch=mb), Workload(seq_len=seq, global_batch=mb))
    assert b.total_bytes == sum(getattr(b, t) for t in TERMS)
    assert b.optimizer_bytes == b.master_weights_bytes + b.optimizer_moments_bytes
    assert all(getattr(b, t) >= 0 for t in TERMS)


@given(name=st.sampled_from(MODELS), zero=st.sampled_from(list(ZeroStage)))
def test_degree_one_equals_unsharded(name: str, zero: ZeroStage) -> None:
    work = Workload(seq_len=1024, global_batch=1)
    plain = bill(name, Layout(), work)
    sharded_by_one = bill(name, Layout(zero=zero, dp_shard=1), work)
    assert sharded_by_one == plain
    # with one GPU, the whole model sits on it: weights are every parameter in bf16
    params = count_params(io.load_model(name))
    assert plain.weights_bytes == 2 * (params.total + params.mtp)


@given(
    name=st.sampled_from(MODELS),
    zero=st.sampled_from([1, 2, 3]),
    shard=st.sampled_from([2, 4, 8]),
    recompute=st.sampled_from(list(Recompute)),
)
def test_more_zero_sharding_never_raises_a_model_state_term(
    name: str, zero: int, shard: int, recompute: Recompute
) -> None:
    work = Workload(seq_len=1024, global_batch=2 * shard)
    small = bill(name, Layout(zero=ZeroStage(zero), dp_shard=shard, recompute=recompute), work)
    big = bill(name, Layout(zero=ZeroStage(zero), dp_shard=2 * shard, recompute=recompute), work)
    for term in (
        "weights_bytes",
        "gradients_bytes",
        "master_weights_bytes",
        "optimizer_moments_bytes",
        "activations_bytes",
    ):
        assert getattr(big, term) <= getattr(small, term) * (1 + 1e-12), term


@given(name=st.sampled_from(["llama-3.1-70b", "mixtral-8x7b", "qwen3-235b-a22b"]), tp=st.sampled_from([2, 4]))
def test_more_tensor_parallelism_never_raises_a_term(name: str, tp: int) -> None:
    model = io.load_model(name)
    if model.num_kv_heads % (2 * tp):
        return
    work = Workload(seq_len=2048, global_batch=1)
    gpu = io.load_gpu("h100-sxm")
    fewer = training_memory(model, Layout(tp=tp, sp=True), work, gpu=gpu).per_gpu
    more = training_memory(model, Layout(tp=2 * tp, sp=True), work, gpu=gpu).per_gpu
    for term in TERMS:
        assert getattr(more, term) <= getattr(fewer, term) * (1 + 1e-12), term


@given(name=st.sampled_from(MODELS), pp=st.sampled_from([2, 4, 8]))
def test_pipeline_stages_hold_every_parameter_once(name: str, pp: int) -> None:
    model = io.load_model(name)
    work = Workload(seq_len=512, global_batch=pp)
    layout = Layout(pp=pp)
    total = sum(bill(name, layout, work, stage=i).weights_bytes for i in range(pp)) / 2
    params = count_params(model)
    extra_head = (
        params.embedding - params.position_embedding if model.tied_embeddings else 0
    )  # tied: a copy on the last stage
    assert abs(total - (params.total + params.mtp + extra_head)) < 1e-6 * params.total


def test_full_recompute_keeps_only_layer_inputs() -> None:
    model = io.load_model("llama-3.1-8b")
    work = Workload(seq_len=4096, global_batch=1)
    full = bill("llama-3.1-8b", Layout(recompute=Recompute.FULL), work)
    assert full.activations_bytes == model.num_layers * 4096 * model.hidden * 2 + 4096 * 2 * model.hidden * 2


def test_bills_are_frozen() -> None:
    b = bill("llama-3.1-8b", Layout(), Workload(seq_len=128, global_batch=1))
    try:
        b.weights_bytes = 0  # type: ignore[misc]
    except dataclasses.FrozenInstanceError:
        return
    raise AssertionError("MemoryBill must be frozen")


@given(
    name=st.sampled_from(MODELS),
    rank=st.sampled_from([4, 16, 64]),
    recompute=st.sampled_from(list(Recompute)),
    tp=st.sampled_from([1, 2, 8]),
)
def test_freezing_never_costs_more(name: str, rank: int, recompute: Recompute, tp: int) -> None:
    """LoRA's bill never exceeds full training's but for its adapters and their activations; QLoRA's base never
    exceeds LoRA's; the adapters and every term stay non-negative."""
    from meshplan.spec.finetune import Finetune, FinetuneMode

    lay = Layout(tp=tp, sp=tp > 1, recompute=recompute, zero=1, dp_shard=4, dp_replicate=1)
    bills = {
        mode: bill(name, lay, Workload(seq_len=2048, global_batch=4, finetune=Finetune(mode=mode, lora_rank=rank)))
        for mode in FinetuneMode
        if not (mode is FinetuneMode.QLORA and tp > 1)  # refused: TP cannot split the 4-bit base
    }
    full, lora = bills[FinetuneMode.FULL], bills[FinetuneMode.LORA]
    adapters = lora.adapter_weights_bytes
    assert 0 < adapters < full.weights_bytes
    assert lora.weights_bytes == full.weights_bytes
    assert lora.gradients_bytes == adapters and lora.gradients_bytes < full.gradients_bytes
    assert lora.optimizer_bytes < full.optimizer_bytes
    assert all(getattr(b, t) >= 0 for b in bills.values() for t in TERMS)
    if FinetuneMode.QLORA in bills:
        assert bills[FinetuneMode.QLORA].weights_bytes < 0.4 * lora.weights_bytes
