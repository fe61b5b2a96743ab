"""The batch caps trtllm-bench chooses for a run: max batch size and max tokens per step from the KV cache.

``trtllm-bench`` (TensorRT-LLM 0.13 onwards, both the TensorRT and the PyTorch backend) sizes the engine from the
dataset's mean lengths when the user gives no caps (tensorrt_llm/bench/build/tuning.py, calc_engine_setting and
finetune_setting): the KV cache it expects is 0.95 of the driver's memory left after the weights (GiB; weights
at 2 bytes, 1 for FP8 and 0.5 for NVFP4), the requests it holds are that over (I + O) tokens of K and V for
max(tp, kv_heads) heads, and

  raw_bs  = min(requests, 4096) / pp              raw_tok = min(raw_bs (1 + I / O), 32768)
  max_batch_size:  < 256: max(64, 32 ceil(raw_bs / 32));  < 1024: 128 ceil(raw_bs / 128);  else 256 ceil(raw_bs / 256)
  max_num_tokens:  < 4096: max(2048, 256 ceil(raw_tok / 256));  < 8192: 512 ceil(/ 512);  else 1024 ceil(/ 1024)

The caps are the engine's own; the KV cache the runtime then allocates is billed apart (core/serving/bill.py). Every
argument broadcasts (numpy), so a search can size every layout at once.
"""

from __future__ import annotations

import numpy as np

from meshplan.core.num import Num
from meshplan.core.params import count_params
from meshplan.spec.cluster import GPU
from meshplan.spec.model import ModelSpec
from meshplan.units import DType

GIB = 2.0**30
BENCH_KV_FRACTION = 0.95
"""calc_engine_setting's kv_cache_gpu_mem_fraction default (the runtime's own fraction, 0.90, is the bill's)."""
BENCH_MAX_REQUESTS = 4096
"""'Cap total batch size to avoid decoder buffer size becoming too large.'"""
BENCH_MAX_TOKENS = 32768
"""'Cap num tokens to avoid TRT activation buffer becoming too large.'"""
BENCH_WEIGHT_BYTES = {DType.FP8: 1.0, DType.FP4: 0.5}
"""BYTES_PER_ELEM of tuning.py (FP8 and FP8 block scales 1, NVFP4 0.5, everything else 2)."""


def _round_up(x: Num, step: float) -> Num:
    return step * np.ceil(x / step)


def trtllm_bench_caps(
    model: ModelSpec,
    *,
    gpu: GPU,
    tp: Num,
    pp: Num = 1,
    weights_dtype: DType,
    kv_dtype: DType,
    input_len: Num,
    output_len: Num,
) -> tuple[Num, Num]:
    """(max_batch_size, max_num_tokens) trtllm-bench builds a ``tp`` x ``pp`` engine with for requests of
    ``input_len`` + ``output_len`` tokens (its heuristic, module docstring)."""
    kv_bytes = 1.0 if kv_dtype is DType.FP8 else 2.0
    weight_bytes = BENCH_WEIGHT_BYTES.get(weights_dtype, 2.0)
    per_token = 2 * model.num_layers * np.maximum(tp, model.num_kv_heads) * model.head_dim * kv_bytes / GIB
    engine = count_params(model).total * weight_bytes / GIB
    free = gpu.hbm_bytes / GIB * tp * pp - engine
    requests = np.maximum(free, 0.0) * BENCH_KV_FRACTION / per_token / (input_len + output_len)
    raw_bs = np.minimum(requests, BENCH_MAX_REQUESTS) / pp
    raw_tok = np.minimum(raw_bs * (1 + input_len / output_len), BENCH_MAX_TOKENS)
    batch = np.where(
        raw_bs < 256,
        np.maximum(64, _round_up(raw_bs, 32)),
        np.where(raw_bs < 1024, _round_up(raw_bs, 128), _round_up(raw_bs, 256)),
    )
    tokens = np.where(
        raw_tok < 4096,
        np.maximum(2048, _round_up(raw_tok, 256)),
        np.where(raw_tok < 8192, _round_up(raw_tok, 512), _round_up(raw_tok, 1024)),
    )
    if np.ndim(batch) == 0:
        return int(batch), int(tokens)
    return batch, tokens
