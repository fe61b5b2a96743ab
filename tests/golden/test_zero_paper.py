"""ZeRO paper (Rajbhandari et al. 2020): model-state memory per GPU, Figure 1 and Table 1.

The paper's bill is 2 + 2 + K bytes per parameter (K = 12 for mixed-precision
Adam), divided by N_d from the stage that partitions each part. meshplan's
bill of a real model divided by its parameter count must give the same bytes
per parameter, and times the paper's model sizes it must give the table's
GB values to the paper's rounding.
"""

import pytest

from meshplan import io
from meshplan.core.memory.bill import stage_bill
from meshplan.core.params import count_params
from meshplan.spec.cluster import GpuCalibration
from meshplan.spec.layout import Layout, ZeroStage
from meshplan.spec.workload import Workload

MODEL = io.load_model("llama-2-7b")
PSI = count_params(MODEL).total


def state_bytes_per_param(zero: int, nd: int) -> float:
    layout = Layout(dp_shard=nd if zero else 1, dp_replicate=1 if zero else nd, zero=ZeroStage(zero))
    work = Workload(seq_len=128, global_batch=nd)
    bill = stage_bill(MODEL, count_params(MODEL), layout, work, calibration=GpuCalibration(), stage=0)
    return bill.model_state_bytes / PSI


def paper(zero: int, nd: int) -> float:
    """The paper's formulas, written out independently (Sec. 5.1-5.3)."""
    k = 12
    return {0: 2 + 2 + k, 1: 2 + 2 + k / nd, 2: 2 + (2 + k) / nd, 3: (2 + 2 + k) / nd}[zero]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("nd", [1, 4, 16, 64, 256, 1024])
def test_bytes_per_parameter_match_the_paper(zero: int, nd: int) -> None:
    assert state_bytes_per_param(zero, nd) == pytest.approx(paper(zero, nd), rel=1e-12)


# Figure 1: 7.5B parameters, N_d = 64 (GB = 1e9 bytes)
@pytest.mark.parametrize(("zero", "published_gb"), [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_figure_1(zero: int, published_gb: float) -> None:
    gb = state_bytes_per_param(zero, 64) * 7.5e9 / 1e9
    assert gb == pytest.approx(published_gb, abs=0.05)  # the figure prints one decimal


TABLE_1 = {  # model size -> stage -> GB at N_d = 1, 4, 16, 64, 256, 1024 (Table 1)
    7.5e9: {
        1: [120, 52.5, 35.6, 31.4, 30.4, 30.1],
        2: [120, 41.3, 21.6, 16.6, 15.4, 15.1],
        3: [120, 30, 7.5, 1.88, 0.47, 0.12],
    },
    128e9: {1: [2048, 896, 608, 536, 518, 513], 2: [2048, 704, 368, 284, 263, 257], 3: [2048, 512, 128, 32, 8, 2]},
    1e12: {
        1: [16000, 7000, 4750, 4187, 4046, 4011],
        2: [16000, 5500, 2875, 2218, 2054, 2013],
        3: [16000, 4000, 1000, 250, 62.5, 15.6],
    },
}


@pytest.mark.parametrize("size", sorted(TABLE_1))
def test_table_1(size: float) -> None:
    for zero, row in TABLE_1[size].items():
        for nd, published in zip([1, 4, 16, 64, 256, 1024], row, strict=True):
            gb = state_bytes_per_param(zero, nd) * size / 1e9
            # the table rounds to 3 significant digits (and truncates 4187.5 to 4187)
            assert gb == pytest.approx(published, rel=6e-3, abs=0.01), (size, zero, nd)
