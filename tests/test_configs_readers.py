"""Each reader's keys, one by one, on small files: what each key sets, what its absence means, and what the YAML
and shell readers make of the text."""

from __future__ import annotations

import pytest

from meshplan.configs import detect_kind, read_config_text
from meshplan.configs.shell import flag_pairs, script_words
from meshplan.configs.yamlish import parse_yaml


def test_yaml_subset() -> None:
    text = """
# a comment
a: 1
b: [1, 2.5, "x, y", 'it''s']
c:
  d: true
  e: ~
  f: {g: 3, h: "4"}
list:
  - 1
  - k: v
    m: 2
  -
    n: 3
empty:
"""
    assert parse_yaml(text, "t") == {
        "a": 1,
        "b": [1, 2.5, "x, y", "it's"],
        "c": {"d": True, "e": None, "f": {"g": 3, "h": "4"}},
        "list": [1, {"k": "v", "m": 2}, {"n": 3}],
        "empty": None,
    }
    with pytest.raises(ValueError, match="line 2: the key 'a' appears twice"):
        parse_yaml("a: 1\na: 2\n", "t")
    with pytest.raises(ValueError, match="block scalars"):
        parse_yaml("a: |\n  text\n", "t")
    with pytest.raises(ValueError, match="one YAML document"):
        parse_yaml("a: 1\n---\nb: 2\n", "t")


def test_shell_words_substitute_and_split() -> None:
    words = script_words(
        'TP=${TP:-4}\nARGS=(\n  --tensor-model-parallel-size $TP  # four\n  "--fp8-format hybrid"\n)\n'
        "if [[ x ]]; then\n  X+=( --flag )\nfi\ntorchrun ${ARGS[@]} --seq-length=${SEQ:-2048}\n",
        "t",
    )
    assert words[:4] == ["--tensor-model-parallel-size", "4", "--fp8-format", "hybrid"]
    pairs = flag_pairs(words)
    assert ("--flag", None) in pairs and ("--seq-length", "2048") in pairs
    assert ("--fp8-format", "hybrid") in pairs


def test_torchtitan_pipeline_toml() -> None:
    read = read_config_text(
        "[model]\nname = 'llama3'\nflavor = '8B'\n[parallelism]\npipeline_parallel_degree = 2\n"
        "pipeline_parallel_schedule = 'Interleaved1F1B'\npipeline_parallel_layers_per_stage = 9\n"
        "pipeline_parallel_microbatch_size = 2\ndata_parallel_shard_degree = 4\n"
        "fsdp_reshard_after_forward = 'default'\n"
        "enable_async_tensor_parallel = true\ndisable_loss_parallel = true\n"
        "[training]\nlocal_batch_size = 16\nglobal_batch_size = 64\n[activation_checkpoint]\nmode = 'none'\n",
        "job.toml",
    )
    v = read.values
    # (32 layers + 1 + 1) / 9 per stage = 4 stages over pp 2: 2 virtual stages each; FSDP keeps grads under PP
    assert (v["pp"], v["vpp"], v["schedule"], v["micro_batch"], v["zero"], v["dp_shard"]) == (
        2,
        2,
        "interleaved",
        2,
        2,
        4,
    )
    assert (v["overlap_tp"], v["loss_parallel"], v["recompute"], v["global_batch"]) == ("on", "off", "none", 64)
    assert any(u.key == "training.local_batch_size" for u in read.unread)


def test_megatron_hsdp_and_recompute_block() -> None:
    read = read_config_text(
        "torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 --vocab-size 128256 "
        "--tensor-model-parallel-size 2 --use-distributed-optimizer --num-distributed-optimizer-instances 2 "
        "--recompute-granularity full --recompute-method block --recompute-num-layers 4 --bf16 "
        "--main-grads-dtype bf16 --optimizer sgd --sgd-momentum 0\n",
        "run.sh",
    )
    v = read.values
    assert (v["gpus"], v["tp"], v["zero"], v["dp_replicate"], v["dp_shard"]) == (16, 2, 1, 2, 4)
    assert (v["recompute"], v["recompute_layers"], v["precision"], v["optimizer"]) == ("full", 4, "bf16", "sgd")
    assert (v["overlap_dp"], v["overlap_param_gather"]) == ("off", "off")  # Megatron's defaults without the flags
    assert read.model == "llama-3.1-8b"


def test_bridge_config_container() -> None:
    read = read_config_text(
        "ConfigContainer:\n  model:\n    tensor_model_parallel_size: 4\n    num_layers: 80\n    hidden_size: 8192\n"
        "    recompute_granularity: selective\n    recompute_modules: [core_attn, mlp]\n    cp_comm_type: a2a\n"
        "  train:\n    micro_batch_size: 1\n    global_batch_size: 128\n  mixed_precision: bf16_mixed\n"
        "  ddp:\n    grad_reduce_in_fp32: false\n    overlap_grad_reduce: true\n",
        "bridge.yaml",
    )
    v = read.values
    assert (v["tp"], v["recompute"], v["selective"], v["recompute_modules"]) == (
        4,
        "selective",
        "modules",
        "core_attn,mlp",
    )
    assert (v["precision"], v["overlap_dp"], v["global_batch"]) == ("bf16", "on", 128)
    assert read.model is None  # six catalog models have 80 layers of 8192
    assert "fits llama-2-70b, llama-3.1-70b, llama-3.3-70b, llama-65b, mpt-70b, qwen2.5-72b: name" in read.notes[0]
    assert any(u.key == "model.cp_comm_type" for u in read.unread)


def test_accelerate_deepspeed_and_fsdp2() -> None:
    read = read_config_text(
        "distributed_type: DEEPSPEED\nnum_processes: 16\nmixed_precision: bf16\ndeepspeed_config:\n"
        "  zero_stage: 3\n  offload_optimizer_device: cpu\n",
        "acc.yaml",
    )
    assert (read.values["stack"], read.values["zero"], read.values["gpus"], read.values["precision"]) == (
        "deepspeed",
        3,
        16,
        "bf16",
    )
    assert "offload" in next(u.effect for u in read.unread if u.key.endswith("offload_optimizer_device"))
    read = read_config_text(
        "distributed_type: FSDP\nnum_processes: 8\nfsdp_config:\n  fsdp_version: 2\n"
        "  fsdp_reshard_after_forward: false\n"
        "  fsdp_activation_checkpointing: true\n",
        "acc.yaml",
    )
    v = read.values
    assert (v["zero"], v["fsdp_copies"], v["recompute"]) == (2, "on", "full")


def test_sglang_attention_dp_and_vllm_expert_parallel() -> None:
    read = read_config_text(
        "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8 --dp 8 --enable-dp-attention "
        "--ep-size 8 --kv-cache-dtype fp8_e4m3\n",
        "s.sh",
    )
    v = read.values
    assert (v["tp"], v["dp_attention"], v["ep"], v["gpus"], v["kv_dtype"]) == (8, True, 8, 8, "fp8")
    assert "replicas" not in v
    read = read_config_text("vllm serve Qwen/Qwen3-30B-A3B -tp 4 -dp 2 --enable-expert-parallel -q fp8\n", "v.sh")
    v = read.values
    assert (v["tp"], v["replicas"], v["ep"], v["gpus"], v["weights_dtype"]) == (4, 2, 8, 8, "fp8")


def test_detect_kind() -> None:
    assert detect_kind("[training]\nseq_len = 1\n") == "torchtitan"
    assert detect_kind('{"zero_optimization": {}}') == "deepspeed"
    assert detect_kind("distributed_type: FSDP\n") == "accelerate"
    assert detect_kind("trainer:\n  devices: 8\n") == "nemo"
    assert detect_kind("python pretrain_gpt.py --num-layers 2\n") == "megatron"
    assert detect_kind("vllm serve m\n") == "vllm"
    assert detect_kind("python -m sglang.launch_server --model-path m\n") == "sglang"
    assert detect_kind("trtllm-serve m --tp_size 2\n") == "trtllm"
    assert detect_kind("trtllm-bench --model m throughput\n") == "trtllm"


def test_trtllm_serve_and_bench_commands() -> None:
    """trtllm-serve's options (the ones exports/trtllm.py writes) and trtllm-bench throughput's spellings; the
    LLM-API YAML named by --extra_llm_api_options is a second file, listed with the flags that type it."""
    read = read_config_text(
        "trtllm-serve serve meta-llama/Llama-3.1-70B --backend pytorch --tp_size 4 --pp_size 2 --ep_size 1 "
        "--max_batch_size 256 --max_num_tokens 4096 --max_seq_len 8192 --kv_cache_free_gpu_memory_fraction 0.85 "
        "--gpus_per_node 4 --extra_llm_api_options extra.yml\n",
        "serve.sh",
    )
    assert read.kind == "trtllm" and read.model == "llama-3.1-70b"
    assert read.values == {
        "engine": "trtllm",
        "tp": 4,
        "pp": 2,
        "ep": 1,
        "max_batch": 256,
        "max_num_tokens": 4096,
        "context": 8192,
        "gpu_memory_utilization": 0.85,
        "node_size": 4,
        "gpus": 8,
    }
    (options,) = [u for u in read.unread if u.key == "--extra_llm_api_options"]
    assert "--capacity-scheduler" in options.effect and "--kv-dtype" in options.effect
    bench = read_config_text(
        "trtllm-bench --model Qwen/Qwen3-30B-A3B throughput --tp 2 --ep 2 --scheduler_policy max_utilization "
        "--kv_cache_free_gpu_mem_fraction 0.95 --concurrency 64 --dataset d.jsonl\n",
        "bench.sh",
    )
    assert bench.model == "qwen3-30b-a3b"
    v = bench.values
    assert (v["tp"], v["ep"], v["capacity_scheduler"], v["gpu_memory_utilization"], v["gpus"]) == (
        2,
        2,
        "max-utilization",
        0.95,
        2,
    )
    assert {u.key for u in bench.unread} >= {"--concurrency", "--dataset"}  # the load is serve's own flags
    refusal = r"b\.sh: --scheduler_policy fcfs is not one of GUARANTEED_NO_EVICT, MAX_UTILIZATION \(either case"
    with pytest.raises(ValueError, match=refusal):
        read_config_text("trtllm-bench --model m throughput --scheduler_policy fcfs\n", "b.sh")


def test_megatron_torch_fsdp2_and_layers_per_virtual_stage() -> None:
    read = read_config_text(
        "pretrain_gpt.py --num-layers 32 --hidden-size 4096 --vocab-size 128256 --pipeline-model-parallel-size 4 "
        "--num-layers-per-virtual-pipeline-stage 2 --use-torch-fsdp2\n",
        "run.sh",
    )
    assert (read.values["vpp"], read.values["zero"]) == (4, 3)  # 32 layers / (4 stages x 2 per chunk)


def test_trtllm_llm_api_options_yaml() -> None:
    """The YAML trtllm-serve reads with --extra_llm_api_options (as meshplan export trtllm writes it, its comment
    naming trtllm-serve, and as NVIDIA's recipes publish it): each LlmArgs key a serve field, or listed."""
    from meshplan.exports import ServingPlan, export_trtllm
    from meshplan.units import DType

    plan = ServingPlan(
        model_path="deepseek-ai/DeepSeek-V3",
        tp=8,
        ep=8,
        dp_attention=True,
        max_model_len=4096,
        gpu_memory_utilization=0.9,
        max_num_seqs=64,
        kv_cache_dtype=DType.FP8,
        capacity_scheduler="max-utilization",
    )
    yaml = export_trtllm(plan).files["extra_llm_api_options.yml"]
    assert detect_kind(yaml, "extra_llm_api_options.yml") == "trtllm"
    read = read_config_text(yaml, "extra_llm_api_options.yml")
    assert read.values == {
        "engine": "trtllm",
        "kv_dtype": "fp8",
        "dp_attention": True,
        "capacity_scheduler": "max-utilization",
    }
    recipe = read_config_text(
        "tensor_parallel_size: 4\npipeline_parallel_size: 2\nmax_batch_size: 128\nmax_seq_len: 8192\n"
        "kv_cache_config:\n  free_gpu_memory_fraction: 0.8\n  enable_block_reuse: false\n"
        "cuda_graph_config:\n  enable_padding: true\n  batch_sizes: [1, 2, 4]\n"
        "speculative_config:\n  decoding_type: MTP\n  num_nextn_predict_layers: 1\n",
        "recipe.yaml",
    )
    v = recipe.values
    assert (v["tp"], v["pp"], v["gpus"], v["max_batch"], v["context"]) == (4, 2, 8, 128, 8192)
    assert (v["gpu_memory_utilization"], v["cuda_graph_padding"]) == (0.8, True)
    unread = {u.key: u.effect for u in recipe.unread}
    assert "--prefix-hit-rate" in unread["kv_cache_config.enable_block_reuse"]
    assert v["speculative"] == "mtp:1"  # decoding_type MTP, num_nextn_predict_layers 1
    with pytest.raises(ValueError, match=r"s\.yaml: scheduler_config\.capacity_scheduler_policy STATIC_BATCH is not"):
        read_config_text("scheduler_config:\n  capacity_scheduler_policy: STATIC_BATCH\n", "s.yaml")


def test_speculative_decoding_as_each_engine_states_it() -> None:
    """vLLM's --speculative-config, SGLang's --speculative-algorithm and -num-steps, TensorRT-LLM's
    speculative_config: each read as serve's --speculative METHOD:K (the acceptance rate stays the user's); a draft
    model or a method serve does not price is listed with what would type it."""
    eagle = read_config_text(
        "vllm serve meta-llama/Llama-3.1-8B --speculative-config "
        """'{"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}'\n""",
        "v.sh",
    )
    assert eagle.values["speculative"] == "eagle:3"
    mtp = read_config_text(
        "python -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V3 --tp 8 --speculative-algorithm NEXTN "
        "--speculative-num-steps 2 --speculative-eagle-topk 4 --speculative-num-draft-tokens 4\n",
        "s.sh",
    )
    assert mtp.values["speculative"] == "mtp:2"
    assert any("a tree of drafts, priced as a chain 2 deep" in n for n in mtp.notes)
    trt = read_config_text("speculative_config:\n  decoding_type: Eagle\n  max_draft_len: 4\n", "o.yaml", "trtllm")
    assert trt.values["speculative"] == "eagle:4"
    ngram = read_config_text(
        """vllm serve m --speculative-config '{"method": "ngram", "num_speculative_tokens": 3}'\n""", "n.sh"
    )
    assert "speculative" not in ngram.values
    assert "does not price" in {u.key: u.effect for u in ngram.unread}["--speculative-config"]
    draft = read_config_text(
        """vllm serve m --speculative-config '{"model": "meta-llama/Llama-3.2-1B", "num_speculative_tokens": 4}'\n""",
        "d.sh",
    )
    assert "--draft-model" in {u.key: u.effect for u in draft.unread}["--speculative-config"]
    with pytest.raises(ValueError, match=r"b\.sh: --speculative-config .* is not JSON"):
        read_config_text("vllm serve m --speculative-config '{eagle'\n", "b.sh")
    deep = "[" * 100_000 + "]" * 100_000  # the guarded parser's depth limit, not a RecursionError
    with pytest.raises(ValueError, match="nests arrays or objects too deeply"):
        read_config_text(f"vllm serve m --speculative-config '{deep}'\n", "deep.sh")


def test_vllm_serve_config_yaml() -> None:
    """``vllm serve --config FILE``: the long option names as keys (dashes or underscores), a true switch on, a
    false one listed, a mapping read as the JSON its option takes; told from a command by having none."""
    text = (
        "model: meta-llama/Llama-3.1-70B\ntensor-parallel-size: 4\ndata_parallel_size: 2\nmax-model-len: 8192\n"
        "enforce-eager: true\nenable-prefix-caching: false\nport: 8000\n"
        "speculative-config:\n  method: eagle\n  num_speculative_tokens: 3\n"
    )
    assert detect_kind(text, "v.yaml") == "vllm"
    read = read_config_text(text, "v.yaml")
    assert read.model == "llama-3.1-70b"
    v = read.values
    assert (v["tp"], v["replicas"], v["gpus"], v["context"]) == (4, 2, 8, 8192)
    assert (v["launch"], v["speculative"]) == ("eager", "eagle:3")
    assert {u.key for u in read.unread} == {"--enable-prefix-caching", "--port"}
