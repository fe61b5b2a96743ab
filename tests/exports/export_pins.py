"""Flag names, config keys and choices pinned from each engine's source, by version.

- Megatron-LM: megatron/training/arguments.py (+ argument_utils.py, which generates flags from the
  dataclasses in megatron/training/config and megatron/core) at commit
  d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22), listed from the parser that code builds.
- torchtitan 0.3.0 wheel: torchtitan/config/configs.py (ParallelismConfig, TrainingConfig),
  models/*/config_registry.py (recipe functions), torch.distributed.pipelining schedule names.
- DeepSpeed 0.19.8 wheel: runtime/config.py, runtime/constants.py, runtime/zero/config.py,
  runtime/tensor_parallel/config.py, module_inject/auto_ep_config.py.
- vLLM 0.33.0 wheel: vllm/engine/arg_utils.py, vllm/config/{parallel,cache,scheduler,model}.py; for the
  disaggregated pools, --kv-transfer-config (vllm/config/kv_transfer.py, the NixlConnector Usage Guide) and
  the OpenAI server's --port.
- SGLang 0.5.23 wheel: sglang/srt/arg_groups/fields/{parallel,model,schedule}.py; for the disaggregated pools,
  fields/disagg.py (--disaggregation-mode, --disaggregation-transfer-backend, --disaggregation-bootstrap-port)
  and fields/serving.py (--port).
"""

from __future__ import annotations


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


MEGATRON_FLAGS = _words(
    """
    --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split
    --accumulate-allreduce-grads-in-fp32 --add-qkv-bias --attention-backend --attention-dropout --bf16 --ckpt-format
    --context-parallel-size --cp-comm-type --data-parallel-sharding-strategy --decoder-first-pipeline-num-layers
    --decoder-last-pipeline-num-layers --disable-bias-linear --exp-avg-dtype
    --exp-avg-sq-dtype --expert-model-parallel-size --expert-tensor-parallel-size --ffn-hidden-size --fp16
    --fp8-format --fp8-recipe --global-batch-size --group-query-attention --hidden-dropout --hidden-size --kv-channels
    --kv-lora-rank --main-grads-dtype --max-position-embeddings --micro-batch-size --moe-ffn-hidden-size
    --moe-grouped-gemm --moe-layer-freq --moe-router-enable-expert-bias --moe-router-topk --moe-shared-expert-gate
    --moe-shared-expert-intermediate-size --moe-token-dispatcher-type --mtp-num-layers --multi-latent-attention
    --normalization --num-attention-heads --num-distributed-optimizer-instances --num-experts --num-layers
    --num-query-groups --num-virtual-stages-per-pipeline-rank --optimizer --overlap-grad-reduce
    --overlap-param-gather --pipeline-model-parallel-layout --pipeline-model-parallel-size --position-embedding-type
    --q-lora-rank --qk-head-dim --qk-layernorm --qk-pos-emb-head-dim --recompute-granularity --recompute-method
    --recompute-num-layers --reset-attention-mask --reset-position-ids --seq-length --sequence-parallel
    --sgd-momentum --swiglu --tensor-model-parallel-size
    --tokenizer-model --tokenizer-type --untie-embeddings-and-output-weights --use-distributed-optimizer
    --use-megatron-fsdp --use-precision-aware-optimizer --v-head-dim --vocab-size
    """
)
MEGATRON_CHOICES = {
    "--data-parallel-sharding-strategy": {"no_shard", "optim", "optim_grads", "optim_grads_params"},
    "--ckpt-format": {"torch", "torch_dist", "torch_dcp", "fsdp_dtensor"},
    "--normalization": {"LayerNorm", "RMSNorm"},
    "--position-embedding-type": {"learned_absolute", "rope", "yarn", "mrope", "relative", "none"},
    "--recompute-granularity": {"full", "selective"},
    "--recompute-method": {"uniform", "block"},
    "--fp8-format": {"e4m3", "hybrid"},
    "--fp8-recipe": {"tensorwise", "delayed", "mxfp8", "blockwise"},
    "--main-grads-dtype": {"fp32", "bf16"},
    "--exp-avg-dtype": {"fp32", "fp16", "bf16", "fp8"},
    "--optimizer": {"adam", "sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon"},
    "--moe-token-dispatcher-type": {"allgather", "alltoall", "flex"},
    "--tokenizer-type": {"HuggingFaceTokenizer", "NullTokenizer"},  # two of its choices
    "--attention-backend": {"flash", "fused", "unfused", "local", "auto"},
}
MEGATRON_CP_COMM = {"p2p", "a2a", "allgather", "a2a+p2p"}

TORCHTITAN_PARALLELISM = _words(
    """
    context_parallel_degree context_parallel_load_balancer context_parallel_ptrr_mask_key
    data_parallel_replicate_degree data_parallel_shard_degree enable_fsdp_symm_mem enable_sequence_parallel
    expert_parallel_degree fsdp_reshard_after_forward module_fqns_per_model_part pipeline_parallel_degree
    pipeline_parallel_first_stage_less_layers pipeline_parallel_last_stage_less_layers
    pipeline_parallel_layers_per_stage pipeline_parallel_microbatch_size pipeline_parallel_schedule
    pipeline_parallel_schedule_csv spmd_backend tensor_parallel_degree
    """
)
TORCHTITAN_TRAINING = _words(
    """
    disable_cuda_graphs dtype enable_cpu_offload gc_debug gc_freq global_batch_size local_batch_size max_norm
    mixed_precision_param mixed_precision_reduce seq_len steps
    """
)
TORCHTITAN_RECIPES = frozenset(
    {
        ("llama3", "llama3_8b"),
        ("llama3", "llama3_70b"),
        ("llama3", "llama3_405b"),
        ("qwen3", "qwen3_0_6b"),
        ("qwen3", "qwen3_1_7b"),
        ("qwen3", "qwen3_14b"),
        ("qwen3", "qwen3_32b"),
        ("qwen3", "qwen3_30b_a3b"),
        ("deepseek_v3", "deepseek_v3_16b"),
        ("deepseek_v3", "deepseek_v3_671b"),
        ("gpt_oss", "gpt_oss_20b"),
        ("gpt_oss", "gpt_oss_120b"),
    }
)
TORCH_PIPELINE_SCHEDULES = _words(
    """
    1F1B DualPipeV GPipe Interleaved1F1B InterleavedZeroBubble LoopedBFS ZBVZeroBubble
    """
)

DEEPSPEED_KEYS = _words(
    """
    activation_checkpointing bf16 data_types expert_parallel fp16 gradient_accumulation_steps gradient_clipping
    tensor_parallel train_batch_size train_micro_batch_size_per_gpu zero_optimization
    """
)
DEEPSPEED_ZERO_KEYS = _words(
    """
    allgather_bucket_size contiguous_gradients overlap_comm reduce_bucket_size stage
    stage3_gather_16bit_weights_on_model_save stage3_param_persistence_threshold stage3_prefetch_bucket_size
    """
)
DEEPSPEED_CHECKPOINTING_KEYS = _words(
    """
    contiguous_memory_optimization cpu_checkpointing number_checkpoints partition_activations profile
    synchronize_checkpoint_boundary
    """
)

VLLM_FLAGS = _words(
    """
    --data-parallel-size --enable-expert-parallel --gpu-memory-utilization --kv-cache-dtype --max-model-len
    --max-num-seqs --pipeline-parallel-size --quantization --tensor-parallel-size --kv-transfer-config --port
    """
)
VLLM_KV_CACHE_DTYPES = _words(
    """
    auto bfloat16 float16 fp8 fp8_ds_mla fp8_e4m3 fp8_e5m2 fp8_inc fp8_per_token_head int4_per_token_head
    int8_per_token_head nvfp4 nvfp4_4over6 nvfp4_ds_mla
    """
)
SGLANG_FLAGS = _words(
    """
    --context-length --dp-size --enable-dp-attention --ep-size --kv-cache-dtype --max-running-requests
    --mem-fraction-static --model-path --moe-dp-size --pp-size --quantization --tp-size --port
    --disaggregation-mode --disaggregation-transfer-backend --disaggregation-bootstrap-port
    """
)
SGLANG_KV_CACHE_DTYPES = _words(
    """
    auto bf16 bfloat16 fp4_mx_block16 fp8_e4m3 fp8_e5m2 mxfp8 nvfp4
    """
)
