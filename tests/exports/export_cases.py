"""Models and plans the export tests share."""

from __future__ import annotations

from meshplan.exports import ServingPlan
from meshplan.spec.layout import ContextParallel, Layout, Recompute, Schedule, ZeroStage
from meshplan.spec.model import MLASpec, MlpKind, ModelSpec, MoESpec, NormKind
from meshplan.spec.workload import PRECISIONS, Attention, Optimizer, OptimizerKind, Workload
from meshplan.units import DType

LLAMA_405B = ModelSpec(
    name="llama-3.1-405b",
    num_layers=126,
    hidden=16384,
    num_heads=128,
    num_kv_heads=8,
    head_dim=128,
    ffn_hidden=53248,
    vocab_size=128256,
    max_seq_len=131072,
)
LLAMA_70B = ModelSpec(
    name="llama-3.3-70b",
    num_layers=80,
    hidden=8192,
    num_heads=64,
    num_kv_heads=8,
    head_dim=128,
    ffn_hidden=28672,
    vocab_size=128256,
    max_seq_len=131072,
)
LLAMA_8B = ModelSpec(
    name="llama-3.1-8b",
    num_layers=32,
    hidden=4096,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    ffn_hidden=14336,
    vocab_size=128256,
    max_seq_len=131072,
)
LLAMA2_7B = ModelSpec(
    name="llama-2-7b",
    num_layers=32,
    hidden=4096,
    num_heads=32,
    num_kv_heads=32,
    head_dim=128,
    ffn_hidden=11008,
    vocab_size=32000,
    max_seq_len=4096,
)
QWEN3_30B_A3B = ModelSpec(
    name="qwen3-30b-a3b",
    num_layers=48,
    hidden=2048,
    num_heads=32,
    num_kv_heads=4,
    head_dim=128,
    ffn_hidden=6144,
    vocab_size=151936,
    qk_norm=True,
    max_seq_len=40960,
    moe=MoESpec(num_experts=128, experts_per_token=8, expert_ffn_hidden=768),
)

DEEPSEEK_V3 = ModelSpec(
    name="deepseek-v3",
    num_layers=61,
    hidden=7168,
    num_heads=128,
    num_kv_heads=128,
    head_dim=128,
    ffn_hidden=18432,
    vocab_size=129280,
    mtp_layers=1,
    moe=MoESpec(
        num_experts=256,
        experts_per_token=8,
        expert_ffn_hidden=2048,
        num_shared_experts=1,
        num_dense_layers=3,
        router_bias=True,
    ),
    mla=MLASpec(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536),
)
GPT3_XL = ModelSpec(
    name="gpt3-xl",
    num_layers=24,
    hidden=2048,
    num_heads=16,
    num_kv_heads=16,
    head_dim=128,
    ffn_hidden=8192,
    vocab_size=50257,
    mlp=MlpKind.PLAIN,
    norm=NormKind.LAYERNORM,
    tied_embeddings=True,
    learned_positions=2048,
    qkv_bias=True,
    out_bias=True,
    mlp_bias=True,
    dropout=True,
)
QWEN2_MOE = ModelSpec(
    name="qwen2-57b-a14b-like",
    num_layers=24,
    hidden=2048,
    num_heads=16,
    num_kv_heads=16,
    head_dim=128,
    ffn_hidden=5632,
    vocab_size=151936,
    qkv_bias=True,
    moe=MoESpec(
        num_experts=60, experts_per_token=4, expert_ffn_hidden=1408, num_shared_experts=4, shared_expert_gate=True
    ),
)

FEATURE_CASES: list[tuple[str, ModelSpec, Layout, Workload]] = [
    (
        "mla-moe-mtp-bf16-moments",
        DEEPSEEK_V3,
        Layout(tp=8, pp=8, dp_shard=16, ep=16, zero=ZeroStage.OPTIMIZER, sp=True),
        Workload(seq_len=4096, global_batch=1024, precision=PRECISIONS["deepseek-fp8"]),
    ),
    (
        "learned-positions-fp16-sgd-eager",
        GPT3_XL,
        Layout(tp=2, dp_replicate=4),
        Workload(
            seq_len=2048,
            global_batch=64,
            precision=PRECISIONS["fp16"],
            attention=Attention.EAGER,
            optimizer=Optimizer(kind=OptimizerKind.SGD),
        ),
    ),
    (
        "shared-experts-fsdp-hsdp",
        QWEN2_MOE,
        Layout(dp_shard=4, ep=4, zero=ZeroStage.GRADIENTS, dp_replicate=2),
        Workload(seq_len=4096, global_batch=64, optimizer=Optimizer(kind=OptimizerKind.SGD_MOMENTUM)),
    ),
    (
        "ring-cp-fp8-selective",
        LLAMA_8B,
        Layout(cp=2, dp_shard=2, zero=ZeroStage.PARAMETERS, recompute=Recompute.SELECTIVE),
        Workload(seq_len=8192, global_batch=8, precision=PRECISIONS["fp8"]),
    ),
    (
        "allgather-cp-uneven-pp-fp32",
        LLAMA_8B,
        Layout(cp=2, cp_kind=ContextParallel.ALL_GATHER, tp=2, pp=3, dp_replicate=2, recompute=Recompute.FULL),
        Workload(seq_len=8192, global_batch=8, precision=PRECISIONS["fp32"]),
    ),
    (
        "interleaved-ddp",
        QWEN3_30B_A3B,
        Layout(pp=4, vpp=2, schedule=Schedule.INTERLEAVED, dp_replicate=2),
        Workload(seq_len=8192, global_batch=8),
    ),
]
"""Megatron plans that between them use every model, precision and parallel flag the export can write."""


Case = tuple[str, ModelSpec, Layout, Workload]

RECIPE_405B = Layout(tp=8, pp=16, vpp=2, dp_shard=128, zero=ZeroStage.GRADIENTS, sp=True, schedule=Schedule.INTERLEAVED)
BF16_FP32_GRADS = PRECISIONS["bf16-fp32-grads"]

TRAINING: list[Case] = [
    ("405b-recipe", LLAMA_405B, RECIPE_405B, Workload(seq_len=8192, global_batch=2048, precision=BF16_FP32_GRADS)),
    (
        "70b-hsdp-zero3-full",
        LLAMA_70B,
        Layout(
            tp=8,
            dp_shard=16,
            dp_replicate=2,
            zero=ZeroStage.PARAMETERS,
            sp=True,
            recompute=Recompute.FULL,
            micro_batch=2,
        ),
        Workload(seq_len=4096, global_batch=512),
    ),
    (
        "8b-ddp-selective",
        LLAMA_8B,
        Layout(dp_replicate=8, recompute=Recompute.SELECTIVE, micro_batch=4),
        Workload(seq_len=8192, global_batch=256),
    ),
    (
        "8b-tp-cp-zero3",
        LLAMA_8B,
        Layout(tp=2, cp=2, cp_kind=ContextParallel.ALL_GATHER, dp_shard=4, zero=ZeroStage.PARAMETERS, sp=True),
        Workload(seq_len=32768, global_batch=64),
    ),
    (
        "70b-uneven-pp",
        LLAMA_70B,
        Layout(tp=8, pp=6, dp_shard=2, zero=ZeroStage.PARAMETERS, sp=True, micro_batch=1),
        Workload(seq_len=8192, global_batch=64),
    ),
    (
        "moe-ep8",
        QWEN3_30B_A3B,
        Layout(dp_shard=8, ep=8, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL),
        Workload(seq_len=4096, global_batch=64),
    ),
    (
        "8b-uneven-interleaved",
        LLAMA_8B,
        Layout(tp=4, pp=3, vpp=2, schedule=Schedule.INTERLEAVED, dp_replicate=2),
        Workload(seq_len=4096, global_batch=12),
    ),
]

MEGATRON_ONLY: list[Case] = [
    (
        "70b-distributed-optimizer-hsdp",
        LLAMA_70B,
        Layout(tp=4, pp=4, dp_shard=4, dp_replicate=2, zero=ZeroStage.OPTIMIZER, sp=True, micro_batch=1),
        Workload(seq_len=4096, global_batch=256),
    ),
    (
        "8b-ring-cp",
        LLAMA_8B,
        Layout(tp=2, cp=4, dp_shard=2, zero=ZeroStage.OPTIMIZER, recompute=Recompute.SELECTIVE),
        Workload(seq_len=65536, global_batch=16),
    ),
]

DEEPSPEED: list[Case] = [
    (
        "7b-zero3-finetune",
        LLAMA2_7B,
        Layout(dp_shard=64, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL, micro_batch=4),
        Workload(seq_len=4096, global_batch=1024),
    ),
    (
        "7b-autotp-zero2",
        LLAMA2_7B,
        Layout(tp=2, dp_shard=4, zero=ZeroStage.GRADIENTS, micro_batch=2),
        Workload(seq_len=2048, global_batch=64),
    ),
    ("7b-ddp", LLAMA2_7B, Layout(dp_replicate=8), Workload(seq_len=2048, global_batch=32)),
    (
        "moe-autoep",
        QWEN3_30B_A3B,
        Layout(dp_shard=8, ep=8, zero=ZeroStage.GRADIENTS),
        Workload(seq_len=4096, global_batch=64),
    ),
]

MEGATRON_CASES = TRAINING + MEGATRON_ONLY + FEATURE_CASES

SERVING = ServingPlan(
    model_path="meta-llama/Llama-3.3-70B-Instruct",
    tp=8,
    max_model_len=32768,
    gpu_memory_utilization=0.9,
    max_num_seqs=128,
    kv_cache_dtype=DType.FP8,
)
