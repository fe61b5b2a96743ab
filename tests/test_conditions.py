"""Training stacks and the conditions they set: each condition's effect on the bill, derived by hand."""

from __future__ import annotations

from typing import Any

import pytest

from meshplan import io
from meshplan.core import pipeline
from meshplan.core.memory.stage_activations import layer_activations, loss_peak_bytes
from meshplan.core.params import count_params
from meshplan.reports.bills import memory_report
from meshplan.reports.conditions import resolve
from meshplan.reports.inputs import LayoutRequest, resolve_layout, resolve_workload
from meshplan.spec.conditions import Conditions, LossKind
from meshplan.spec.requests import STACKS

V = 128_256  # Llama 3's vocabulary


def test_interleaved_warm_up_with_group_size() -> None:
    """Llama 3 405B, p = 16, v = 8, N = 16, M = 32 (Llama 3 Sec. 3.3.2): rank r runs (v-1)N + 2(p-1-r) warm-up
    chunk forwards and one more before its first backward. Rank 1 holds one layer per chunk: 7*16 + 2*14 + 1
    = 141. Rank 0's 7 layers leave its first chunk empty (the embedding alone): of its 7*16 + 2*15 + 1 = 143
    forwards, 16 of the first group and 15 of the second run that empty chunk: 143 - 31 = 112."""
    common = dict(pp=16, vpp=8, m=32, group=16)
    assert pipeline.interleaved_forwards(pp=16, vpp=8, m=32, stage=1, group=16) == 141
    assert pipeline.interleaved_layer_microbatches(stage=1, layers=8, **common) == 141
    assert pipeline.interleaved_layer_microbatches(stage=0, layers=7, **common) == 112
    # group N = p is Megatron's default: the count Korthikanti et al. 2022 Sec. 4.2.3 use, p(1 + (p-1)/(pv)) x L/p
    assert pipeline.interleaved_layer_microbatches(pp=4, vpp=2, m=8, stage=0, group=4, layers=8) == 4 * 11


def _memory(**kw: Any) -> dict[str, Any]:
    layout = kw.pop("layout")
    return memory_report(kw.pop("model"), gpu=kw.pop("gpu", "h100-sxm"), gpus=kw.pop("gpus"), layout=layout, **kw)


def test_llama3_405b_rank_activations_follow_the_chunk_counts() -> None:
    """The bill holds 141 layer-micro-batches on rank 1 and 112 on rank 0 (no recompute at 8K, Llama 3)."""
    layout = LayoutRequest(tp=8, pp=16, vpp=8, sp=True, zero=1)
    r = _memory(
        model="llama-3.1-405b",
        gpus=16384,
        layout=layout,
        seq=8192,
        global_batch=4096,  # 4096 / 128 replicas = 32 micro-batches
        precision="bf16-fp32-grads",
        conditions={"microbatch_group": 16},
    )
    model = io.load_model("llama-3.1-405b")
    lay = resolve_layout(layout, gpus=16384)
    per_layer = layer_activations(model, lay, resolve_workload(layout=lay, seq=8192, global_batch=4096)).dense
    assert r["stages"][1]["activations_bytes"] == pytest.approx(141 * per_layer)
    assert r["stages"][0]["activations_bytes"] == pytest.approx(112 * per_layer)
    assert r["conditions"]["microbatch_group"] == {"value": 16, "source": "flag"}


@pytest.mark.parametrize(
    ("loss", "parallel", "tp", "expected"),
    [
        # forward: bf16 logits (2) + fp32 upcast (4) + saved fp32 log-probs (4) = 10; backward, the logits dropped:
        # saved log-probs (4) + fp32 grad of the log-probs (4) + fp32 grad of the upcast (4) = 12, the peak
        (LossKind.UPCAST, False, 8, 12 * 8192 * V),
        (LossKind.UPCAST, True, 8, 12 * 8192 * V / 8),
        (LossKind.FUSED, False, 1, 12 * 8192 * V / 8),  # one of 8 token chunks at a time
        (LossKind.FRAMEWORK, None, 8, 4 * 8192 * V / 8),  # Megatron: fp32 softmax of its vocabulary shard
        # compiled: the bf16 logits the compiled graph keeps (2) and their bf16 gradient (2), no fp32 copy
        (LossKind.COMPILED, False, 1, 4 * 8192 * V),
        (LossKind.COMPILED, True, 8, 4 * 8192 * V / 8),
    ],
)
def test_loss_peak_for_a_128k_vocabulary(loss: LossKind, parallel: bool | None, tp: int, expected: float) -> None:
    model = io.load_model("llama-3.1-8b")
    lay = resolve_layout(LayoutRequest(tp=tp), gpus=tp)
    work = resolve_workload(
        layout=lay, seq=8192, global_batch=1, conditions=Conditions(loss=loss, loss_parallel=parallel)
    )
    assert loss_peak_bytes(model, tokens=8192, tp=tp, workload=work) == pytest.approx(expected)
    assert abs(12 * 8192 * V - 12.61e9) < 0.01e9  # 12.6 GB for one 8K sequence without TP


def test_accumulation_without_sync_holds_the_unsharded_fp32_gradient() -> None:
    """FSDP over 8 GPUs, 2 micro-batches per step: with sync each rank keeps 1/8 of the fp32 gradient; without
    it every rank holds all of it, 4 bytes x 8.03B parameters, until the last micro-batch."""
    base = dict(model="llama-3.1-8b", gpus=8, layout=LayoutRequest(zero=3), seq=2048, global_batch=16)
    synced = _memory(**base, precision="bf16-fp32-grads")
    unsynced = _memory(**base, precision="bf16-fp32-grads", conditions={"grad_sync": "off"})
    total = count_params(io.load_model("llama-3.1-8b")).total
    assert synced["per_gpu"]["gradients_bytes"] == pytest.approx(4 * total / 8, rel=1e-6)
    assert unsynced["per_gpu"]["gradients_bytes"] == pytest.approx(4 * total, rel=1e-6)
    one_step = _memory(**base | {"global_batch": 8}, precision="bf16-fp32-grads", conditions={"grad_sync": "off"})
    assert one_step["per_gpu"]["gradients_bytes"] == synced["per_gpu"]["gradients_bytes"]  # nothing accumulates


def test_reshard_after_forward_off_keeps_the_stage_gathered() -> None:
    base = dict(model="llama-3.1-8b", gpus=8, layout=LayoutRequest(zero=3), seq=2048)
    on = _memory(**base)["per_gpu"]["comm_buffers_bytes"]
    off = _memory(**base, conditions={"reshard_after_forward": "off"})["per_gpu"]["comm_buffers_bytes"]
    total = count_params(io.load_model("llama-3.1-8b")).total
    assert off > 2 * total > on  # every bf16 parameter gathered, plus one layer's gradients


def test_a_flag_beats_the_stack_which_beats_the_default() -> None:
    _, block = resolve({"stack": "torchtitan", "loss": "fused", "precision": None})
    assert block["stack"] == "torchtitan" and block["reports"] == "reserved"
    assert block["values"]["loss"] == {"value": "fused", "source": "flag"}
    assert block["values"]["precision"] == {"value": "fsdp2-bf16", "source": "stack"}
    assert block["values"]["microbatch_group"] == {"value": None, "source": "default"}
    assert block["stack_source"] == "flag" and block["differs_from_stack"] == ["loss"]  # torchtitan's is upcast
    _, none = resolve({})
    assert none["stack"] == "megatron-core" and none["stack_source"] == "default" and none["differs_from_stack"] == []
    own = io.load_stack("megatron-core").defaults
    assert {k for k, v in none["values"].items() if v["source"] == "stack"} == set(own)
    assert none["values"]["precision"] == {"value": "bf16-fp32-grads", "source": "stack"}


def test_every_stack_loads_and_the_schema_lists_them() -> None:
    assert tuple(io.list_stacks()) == STACKS
    for name in STACKS:
        s = io.load_stack(name)
        assert s.source and s.description and s.defaults["framework"] in ("megatron", "torch")


def test_runtime_reserve_and_the_allocator_peaks() -> None:
    r = _memory(model="llama-3.1-8b", gpus=8, layout=LayoutRequest(zero=3), seq=4096, conditions={"stack": "fsdp2"})
    bill = r["per_gpu"]
    assert bill["runtime_reserve_bytes"] == 0.5e9
    assert bill["reserved_bytes"] == pytest.approx(
        bill["total_bytes"] - bill["framework_bytes"] - bill["runtime_reserve_bytes"]
    )
    assert bill["allocated_bytes"] == pytest.approx(bill["reserved_bytes"] - bill["fragmentation_bytes"])
    assert r["conditions"]["framework"] == {"value": "torch", "source": "stack"}


def test_full_recompute_on_the_first_k_layers() -> None:
    """Megatron's block method with --recompute-num-layers 8 on a 32-layer stage: 8 layers keep their input
    only (2sbh), 24 keep everything."""
    layout = LayoutRequest(tp=8, sp=True, recompute="full")
    r = _memory(model="llama-3.1-8b", gpus=8, layout=layout, seq=4096, conditions={"recompute_layers": 8})
    model = io.load_model("llama-3.1-8b")
    lay = resolve_layout(layout, gpus=8)
    la = layer_activations(model, lay, resolve_workload(layout=lay, seq=4096, global_batch=8))
    assert la.dense_full == pytest.approx(2 * 4096 * 4096 / 8)  # 2 bytes x s x h / t with SP
    everything = _memory(model="llama-3.1-8b", gpus=8, layout=layout, seq=4096)
    head = everything["per_gpu"]["activations_bytes"] - 32 * la.dense_full  # final norm and head input
    assert head == pytest.approx(2 * la.dense_full)  # the final norm input and the head input, 2sbh/t each
    assert r["per_gpu"]["activations_bytes"] == pytest.approx(8 * la.dense_full + 24 * la.dense_none + head)


def test_routing_imbalance_scales_the_routed_experts() -> None:
    """Mixtral 8x7B (top-2 of 8, f_e = 14336), EP 8: the busiest rank at 2x the mean keeps twice the routed
    experts' activations. Per token per layer those are k (3 beta f_e + what each routed copy keeps), so the
    step from 1 to 2 adds at least 2 x 3 x 2 x 14336 bytes and at most that plus k x 4 beta h."""
    base = dict(model="mixtral-8x7b", gpus=8, layout=LayoutRequest(ep=8, zero=1), seq=4096, global_batch=8)
    acts = [
        _memory(**base, conditions={"routing_imbalance": x})["per_gpu"]["activations_bytes"] for x in (1.0, 2.0, 3.0)
    ]
    per_token_layer = (acts[1] - acts[0]) / (4096 * 32)
    assert 2 * 3 * 2 * 14336 <= per_token_layer <= 2 * 3 * 2 * 14336 + 2 * 4 * 2 * 4096
    assert acts[2] - acts[1] == pytest.approx(acts[1] - acts[0])  # linear in the imbalance
    no_ep = dict(base, layout=LayoutRequest(zero=1))
    same = [_memory(**no_ep, conditions={"routing_imbalance": x})["per_gpu"]["activations_bytes"] for x in (1.0, 2.0)]
    assert same[0] == same[1]  # every expert on every rank: nothing to be unbalanced


def test_lora_with_trainable_embedding_and_head() -> None:
    """Llama 3.1 8B, LoRA on one GPU with the embedding and the untied head trained in place: both 128,256 x 4096
    matrices gain fp32 gradients (4 bytes: megatron-core's main grads), an fp32 master (4) and two fp32 moments
    (8)."""
    from meshplan.reports.inputs import FinetuneRequest

    base = dict(model="llama-3.1-8b", gpus=1, layout=LayoutRequest(), seq=2048, global_batch=1)
    plain = _memory(**base, finetune=FinetuneRequest(mode="lora"))["per_gpu"]
    edges = _memory(**base, finetune=FinetuneRequest(mode="lora", lora_train_embeddings=True))["per_gpu"]
    vocab = 2 * V * 4096  # embedding + head
    assert edges["gradients_bytes"] - plain["gradients_bytes"] == pytest.approx(4 * vocab)
    assert edges["master_weights_bytes"] - plain["master_weights_bytes"] == pytest.approx(4 * vocab)
    assert edges["optimizer_moments_bytes"] - plain["optimizer_moments_bytes"] == pytest.approx(8 * vocab)
    assert edges["activations_bytes"] > plain["activations_bytes"]  # the head's input is kept for its gradient
    with pytest.raises(ValueError, match="lora-train-embeddings"):
        _memory(**base, finetune=FinetuneRequest(mode="full", lora_train_embeddings=True))


def test_megatron_module_list_recompute_on_a_gpt_layer() -> None:
    """Megatron-22B (GELU MLP, h = 6144, f = 4h), t = 8 with SP, s = 2048, fp16: recomputing core_attn and mlp
    drops, per token, the attention scores (as selective does) and the MLP's input and its two internals:
    2 h / t + 2 x 2 f / t = 1536 + 12288 = 13824 bytes; adding layernorm drops the two norm outputs the block
    keeps besides, 2 x 2 h / t = 3072 bytes (the MLP input being one of them)."""
    from meshplan.spec.conditions import Selective

    model = io.load_model("megatron-22b")
    lay = resolve_layout(LayoutRequest(tp=8, sp=True, recompute="selective"), gpus=8)

    def dense(**cond: Any) -> float:
        work = resolve_workload(
            layout=lay, seq=2048, global_batch=1, precision="fp16", attention="eager", conditions=Conditions(**cond)
        )
        return float(layer_activations(model, lay, work).dense)

    megatron = dense()  # --recompute selective: core attention
    assert dense(selective=Selective.MODULES, recompute_modules=("core_attn",)) == pytest.approx(megatron)
    mlp = dense(selective=Selective.MODULES, recompute_modules=("core_attn", "mlp"))
    assert megatron - mlp == pytest.approx(2048 * 13824)
    both = dense(selective=Selective.MODULES, recompute_modules=("core_attn", "mlp", "layernorm"))
    assert mlp - both == pytest.approx(2048 * (3072 - 1536))  # the MLP input is one of the two norm outputs


def test_megatron_moe_recompute_keeps_only_the_block_input() -> None:
    """Megatron's ``moe`` module checkpoints MoELayer's whole forward (router, dispatch, experts, combine): a MoE
    layer then keeps what a layer with no MoE internals keeps, whatever its experts. Re-derived per token for
    Qwen3-235B-A22B (h 4096, 128 experts, top 8, f_e 1536, no shared expert) at t = 4 with SP and expert TP 1, bf16:
    the router's fp32 logits and probabilities over 128 experts split by SP (2 x 4 x 128 / 4 = 256 bytes) and
    k e_t / t = 2 routed copies, each with Megatron's 2 h-wide rows (the dispatched row and the expert's output,
    2 x 2 x 4096) and the SwiGLU expert's 3 f_e-wide tensors (3 x 2 x 1536): 2 x (16384 + 9216) = 51200 bytes,
    51456 in all. Before, the rows and the router were billed as kept (75.5 MB of 210.8 MB dropped a layer)."""
    import dataclasses

    from meshplan.spec.conditions import Selective

    model = io.load_model("qwen3-235b-a22b")
    assert model.moe is not None and not model.moe.num_shared_experts
    lay = resolve_layout(LayoutRequest(tp=4, sp=True, ep=8, expert_tp=1, recompute="selective"), gpus=32)

    def moe(m: Any, mods: tuple[str, ...]) -> float:
        work = resolve_workload(
            layout=lay,
            seq=4096,
            global_batch=1,
            precision="bf16",
            conditions=Conditions(selective=Selective.MODULES, recompute_modules=mods),
        )
        return float(layer_activations(m, lay, work).moe)

    none, kept = moe(model, ("layernorm",)), moe(model, ("layernorm", "moe"))
    assert none - kept == pytest.approx(4096 * (2 * 4 * 128 / 4 + 2 * (2 * 2 * 4096 + 3 * 2 * 1536)))
    wider = dataclasses.replace(model, moe=dataclasses.replace(model.moe, experts_per_token=16, num_experts=256))
    assert moe(wider, ("layernorm", "moe")) == pytest.approx(kept)  # nothing routed outlives the checkpoint
    assert moe(wider, ("layernorm",)) > none


def test_scale_out_bandwidth_as_a_number() -> None:
    from meshplan.reports.estimate import estimate_report
    from meshplan.reports.inputs import resolve_cluster

    cluster = resolve_cluster(gpu="h100-sxm", gpus=64, scale_out_bandwidth=12.5e9)
    assert cluster.scale_out.bandwidth_bytes_per_s == 12.5e9 and cluster.scale_out.name == "ib-ndr"
    run = dict(gpu="h100-sxm", gpus=64, layout=LayoutRequest(tp=8), seq=4096, global_batch=64)
    fast = estimate_report("llama-3.1-70b", **run)["breakdown"]["exposed_dp_s"]  # type: ignore[arg-type]
    slow = estimate_report("llama-3.1-70b", scale_out_bandwidth=12.5e9, **run)["breakdown"]["exposed_dp_s"]  # type: ignore[arg-type]
    assert slow > fast  # a quarter of NDR's 50e9 bytes/s for the data-parallel reduce across nodes


def test_fewer_nics_than_gpus_share_the_host_bandwidth() -> None:
    """4 NICs for 8 GPUs (as AWS p4d's 4 x 100 Gb/s EFA): each GPU gets half a NIC; DP across nodes slows."""
    from meshplan.reports.estimate import estimate_report
    from meshplan.reports.inputs import resolve_cluster

    one_each = resolve_cluster(gpu="a100-80gb", gpus=64, scale_out="eth-100g")
    shared = resolve_cluster(gpu="a100-80gb", gpus=64, scale_out="eth-100g", nics_per_node=4)
    assert shared.scale_out.bandwidth_bytes_per_s == pytest.approx(one_each.scale_out.bandwidth_bytes_per_s * 4 / 8)
    run = dict(gpu="h100-sxm", gpus=64, layout=LayoutRequest(tp=8), seq=4096, global_batch=64)
    fast = estimate_report("llama-3.1-70b", **run)["breakdown"]["exposed_dp_s"]  # type: ignore[arg-type]
    slow = estimate_report("llama-3.1-70b", nics_per_node=2, **run)["breakdown"]["exposed_dp_s"]  # type: ignore[arg-type]
    assert slow > fast
    with pytest.raises(ValueError, match="nics_per_node"):
        resolve_cluster(gpu="a100-80gb", gpus=64, nics_per_node=0)


def test_oversubscription_slows_all_to_all_across_nodes_only() -> None:
    """A 2:1 fabric halves the uplink share of the all-to-all bytes leaving a node; rings and trees are untouched."""
    from meshplan.reports.estimate import estimate_report
    from meshplan.reports.inputs import resolve_cluster

    layout = LayoutRequest(tp=2, ep=8, dp_shard=32, zero=1)  # EP 8 over TP 2: each expert group spans two nodes
    moe = dict(gpu="h100-sxm", gpus=64, layout=layout, seq=4096, global_batch=64)
    calm = estimate_report("mixtral-8x7b", **moe)["breakdown"]  # type: ignore[arg-type]
    busy = estimate_report("mixtral-8x7b", oversubscription=2.0, **moe)["breakdown"]  # type: ignore[arg-type]
    assert busy["exposed_ep_s"] > calm["exposed_ep_s"]
    assert busy["exposed_dp_s"] == calm["exposed_dp_s"]
    dense = dict(gpu="h100-sxm", gpus=64, layout=LayoutRequest(tp=8), seq=4096, global_batch=64)
    same = [estimate_report("llama-3.1-70b", oversubscription=x, **dense)["step_time_s"] for x in (1.0, 4.0)]  # type: ignore[arg-type]
    assert same[0] == same[1]
    with pytest.raises(ValueError, match="oversubscription"):
        resolve_cluster(gpu="h100-sxm", gpus=64, oversubscription=0.5)


def test_interleaved_layer_microbatches_in_closed_form_equal_the_chunk_walk() -> None:
    """The closed form against a walk chunk by chunk, written out here: every chunk's forwards times its layers."""
    import itertools

    def walk(*, pp: int, vpp: int, m: int, stage: int, group: int, layers: int) -> int:
        forwards = min((vpp - 1) * group + 2 * (pp - 1 - stage) + 1, m * vpp)
        base = -(-layers // vpp)
        short = base * vpp - layers
        total = 0
        for c in range(vpp):
            rounds, rest = divmod(forwards, group * vpp)
            count = rounds * group + min(max(rest - c * group, 0), group)
            is_short = c < short if stage < pp / 2 else c >= vpp - short
            total += count * (base - is_short)
        return total

    for pp, vpp, stage, group, m, layers in itertools.product(
        (2, 4, 16), (2, 3, 8), (0, 1, 3), (2, 4, 16), (4, 32), (5, 8, 16)
    ):
        if stage >= pp or group > m or layers < vpp - 1:
            continue
        kw = dict(pp=pp, vpp=vpp, m=m, stage=stage, group=group, layers=layers)
        assert pipeline.interleaved_layer_microbatches(**kw) == walk(**kw), kw
