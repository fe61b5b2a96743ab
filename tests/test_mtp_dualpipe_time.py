"""The last stage trains the multi-token-prediction modules; a DualPipe rank runs the two stages it holds.

Re-derived here from the layer and head times: an MTP module is one more MoE layer on the last stage, a
2h -> h projection and the shared output head with its loss again (DeepSeek-V3 Sec. 2.2); a DualPipe rank holds
stages i and p-1-i (Sec. 3.2.1), so per held copy it spends the mean of the two stages' times.
"""

import dataclasses

import pytest

from meshplan import io
from meshplan.core.stages import stage_row
from meshplan.core.time.stage_time import layer_kinds, stage_times
from meshplan.reports.inputs import resolve_cluster, resolve_workload
from meshplan.spec.layout import Layout, Schedule, ZeroStage

MODEL = io.load_model("deepseek-v3")
PP = 16


def _setup(schedule: Schedule, mtp: int):
    model = dataclasses.replace(MODEL, mtp_layers=mtp)
    lay = Layout(pp=PP, ep=8, dp_shard=8, zero=ZeroStage.OPTIMIZER, schedule=schedule, micro_batch=1)
    work = resolve_workload(layout=lay, seq=4096, global_batch=1024)
    cluster = resolve_cluster(gpu="h100-sxm", gpus=lay.num_gpus)
    return model, lay, work, cluster


def _stage(model, lay, work, cluster, stage: int):
    return stage_times(model, lay, work, cluster, stages=(stage,))


def test_the_mtp_module_is_a_moe_layer_a_projection_and_the_head_again() -> None:
    model, lay, work, cluster = _setup(Schedule.ONE_F_ONE_B, mtp=1)
    plain = dataclasses.replace(model, mtp_layers=0)
    kinds = layer_kinds(model, lay, work, cluster)
    with_mtp, without = _stage(model, lay, work, cluster, PP - 1), _stage(plain, lay, work, cluster, PP - 1)
    tokens = 4096 * lay.micro_batch
    g = io.load_gpu("h100-sxm")
    proj_flops = 2 * tokens * 2 * model.hidden * model.hidden
    proj_s = kinds.mtp_extra_fwd_s - kinds.head_fwd_s
    # the projection is one large GEMM of 2 t (2h) h FLOPs: at the kind's sustained matmul share of peak, less
    # the shape law's share for K = 2h and N = h / tp (1 + 0.63 R/K + 0.23 R/N, R the ridge point) and under 1%
    # for its finite rows (t = 4,096)
    peak = g.peak(work.precision.compute)
    ridge = peak / g.hbm_bandwidth_bytes_per_s
    depth = 1 + 0.63 * ridge / (2 * model.hidden) + 0.23 * ridge / (model.hidden / lay.tp)
    ideal_s = proj_flops * depth / (peak * g.calibration.matmul_efficiency_max)
    assert ideal_s <= proj_s < 1.02 * ideal_s
    assert float(with_mtp.fwd_compute_s - without.fwd_compute_s) == pytest.approx(
        float(kinds.moe.forward_s + kinds.head_fwd_s + proj_s)
    )
    assert float(with_mtp.bwd_compute_s - without.bwd_compute_s) == pytest.approx(
        float(kinds.moe.backward_s + kinds.head_bwd_s + 2 * proj_s)
    )
    assert float(with_mtp.moe_layers) == float(without.moe_layers) + 1  # its EP and TP traffic too
    # the other stages do not hold it
    assert float(_stage(model, lay, work, cluster, 3).fwd_compute_s) == float(
        _stage(plain, lay, work, cluster, 3).fwd_compute_s
    )


def test_a_dualpipe_rank_spends_the_mean_of_its_two_stages_per_copy() -> None:
    model, one_f_one_b, work, cluster = _setup(Schedule.ONE_F_ONE_B, mtp=1)
    dual = dataclasses.replace(one_f_one_b, schedule=Schedule.DUALPIPE)
    for i in (0, 5, PP - 1):
        a = stage_row(model, pp=PP, stage=i)
        b = stage_row(model, pp=PP, stage=PP - 1 - i)
        assert int(a.layers) + int(b.layers) <= 2 * -(-model.num_layers // PP)
        pair = _stage(model, dual, work, cluster, i)
        mine = _stage(model, one_f_one_b, work, cluster, i)
        mirror = _stage(model, one_f_one_b, work, cluster, PP - 1 - i)
        for term in ("fwd_compute_s", "bwd_compute_s", "weight_grad_s", "moe_layers"):
            expected = (float(getattr(mine, term)) + float(getattr(mirror, term))) / 2
            assert float(getattr(pair, term)) == pytest.approx(expected), (i, term)
    # the rank holding the last stage also holds the first: lighter than twice the last stage alone
    last = _stage(model, one_f_one_b, work, cluster, PP - 1)
    assert float(_stage(model, dual, work, cluster, PP - 1).fwd_compute_s) < float(last.fwd_compute_s)
