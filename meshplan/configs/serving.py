"""vLLM, SGLang and TensorRT-LLM launch commands (``vllm serve MODEL --tensor-parallel-size 8 ...``,
``python -m sglang.launch_server --model-path MODEL --tp 8 ...``, ``trtllm-serve MODEL --tp_size 8 ...`` or
``trtllm-bench --model MODEL throughput --tp 8 ...``), in a file or a launch script.

Flag names and choices are those exports/vllm.py, exports/sglang.py and exports/trtllm.py write (vLLM 0.33.0's
EngineArgs, SGLang 0.5.23's ServerArgs, TensorRT-LLM's trtllm-serve options) and their short spellings, and
trtllm-bench's throughput options (``--tp``, ``--kv_cache_free_gpu_mem_fraction``, ``--scheduler_policy``). The
GPU count is tp x pp x dp (one trtllm-serve or trtllm-bench process runs one replica). A ``vllm serve --config``
YAML is read as the command line it stands for (``_yaml_words``). A Hugging Face repository
as the model is the catalog model of that repository; a local folder is read as the model's config.json.
"""

from __future__ import annotations

import json

from meshplan.configs.reading import NO_EFFECT, UNKNOWN, ConfigRead, Reading, hf_repos, launches
from meshplan.configs.shell import flag_pairs, script_words
from meshplan.configs.speculative import sglang_speculative, vllm_speculative
from meshplan.configs.trtllm import take_policy
from meshplan.configs.yamlish import parse_yaml

VLLM = {
    "--tensor-parallel-size": "tp",
    "-tp": "tp",
    "--pipeline-parallel-size": "pp",
    "-pp": "pp",
    "--data-parallel-size": "replicas",
    "-dp": "replicas",
    "--max-model-len": "context",
    "--gpu-memory-utilization": "gpu_memory_utilization",
    "--max-num-seqs": "max_batch",
    "--max-num-batched-tokens": "max_num_tokens",
}
SGLANG = {
    "--tp-size": "tp",
    "--tp": "tp",
    "--pp-size": "pp",
    "--pp": "pp",
    "--dp-size": "replicas",
    "--dp": "replicas",
    "--ep-size": "ep",
    "--ep": "ep",
    "--context-length": "context",
    "--mem-fraction-static": "gpu_memory_utilization",
    "--max-running-requests": "max_batch",
    "--chunked-prefill-size": "max_num_tokens",
}
TRTLLM = {
    "--tp_size": "tp",
    "--tp": "tp",
    "--pp_size": "pp",
    "--pp": "pp",
    "--ep_size": "ep",
    "--ep": "ep",
    "--max_batch_size": "max_batch",
    "--max_num_tokens": "max_num_tokens",
    "--max_seq_len": "context",
    "--kv_cache_free_gpu_memory_fraction": "gpu_memory_utilization",
    "--kv_cache_free_gpu_mem_fraction": "gpu_memory_utilization",
    "--gpus_per_node": "node_size",
}
"""trtllm-serve's options (tensorrt_llm/commands/serve.py) and trtllm-bench throughput's (its --tp, --pp, --ep and
--kv_cache_free_gpu_mem_fraction spellings); the memory fraction is of the memory free after the weights, as
serve's --gpu-memory-utilization reads it for trtllm."""
TRTLLM_OPTIONS_FILE = (
    "a second file, the LLM-API YAML (--from reads it on its own), or type what it sets with serve's flags "
    "(kv_cache_config.dtype: --kv-dtype; enable_attention_dp: --dp-attention; scheduler_config."
    "capacity_scheduler_policy: --capacity-scheduler; cuda_graph_config.enable_padding: --cuda-graph-padding)"
)
TABLES = {"vllm": VLLM, "sglang": SGLANG, "trtllm": TRTLLM}
KV_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "fp8": "fp8", "fp8_e4m3": "fp8"}
WEIGHT_QUANT = {"fp8": "fp8", "fbgemm_fp8": "fp8", "modelopt": "fp8", "awq": "int4", "gptq": "int4"}
WEIGHT_QUANT |= {"awq_marlin": "int4", "gptq_marlin": "int4", "modelopt_fp4": "fp4", "mxfp4": "fp4", "nvfp4": "fp4"}
NOTHING = frozenset(
    {
        "--host",
        "--port",
        "--served-model-name",
        "--api-key",
        "--trust-remote-code",
        "--disable-log-requests",
        "--disable-log-stats",
        "--log-level",
        "--seed",
        "--tokenizer",
        "--tokenizer-path",
        "--download-dir",
        "--revision",
        "--uvicorn-log-level",
        "--enable-metrics",
        "--chat-template",
        "--load-format",
        "--log_level",
        "--trust_remote_code",
        "--num_postprocess_workers",
        "--backend",
        "--workspace",
        "--warmup",
        "--streaming",
    }
)
LOAD = frozenset({"--concurrency", "--num_requests", "--dataset", "--target_input_len", "--target_output_len"})
"""trtllm-bench's load and dataset: serve takes the load as its own flags (--concurrency, --num-requests) and the
lengths as --input-len and --output-len."""
SWITCHES = frozenset({"--enable-expert-parallel", "--enable-dp-attention", "--trust-remote-code"})
SWITCHES |= {"--enforce-eager", "--disable-cuda-graph", "--trust_remote_code", "--streaming"}
EAGER = {"vllm": "--enforce-eager", "sglang": "--disable-cuda-graph"}
"""Each engine's switch that runs every forward op by op, without CUDA graphs (``--launch eager``)."""
SHORT = frozenset({"-tp", "-pp", "-dp", "-q"})
SGLANG_SPECULATIVE = frozenset(
    {"--speculative-algorithm", "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"}
)


def read_serving(text: str, label: str, kind: str) -> ConfigRead:
    yaml = kind == "vllm" and not launches(text, kind)
    words, off = _yaml_words(text, label) if yaml else (script_words(text, label), {})
    table = TABLES[kind]
    r = Reading(kind, label)
    r.take("engine", kind, f"the file's kind ({kind}{': a vllm serve --config YAML' if yaml else ''})")
    for key, value in off.items():
        r.skip(key, value, "a switch turned off or a value left unset: the engine's default")
    model = None if yaml else _model_word(words, kind)
    pairs = flag_pairs(words, switches=SWITCHES, short=SHORT)
    seen: dict[str, str | None] = {}
    for flag, value in pairs:
        if flag in seen and seen[flag] != value:
            raise ValueError(f"{label}: {flag} is given twice, as {seen[flag]!r} and {value!r}")
        seen[flag] = value
    if {"--model-path", "--model", "--model_path"} & set(seen):
        # trtllm-bench's --model names the model (its Hugging Face repository) and --model_path its local checkpoint
        model = seen.pop("--model-path", None) or seen.pop("--model", None) or seen.pop("--model_path", None)
    if model is not None:
        name = hf_repos().get(model.lower())
        if name is not None:
            r.name_model(name, f"the catalog model of {model}")
        else:
            r.name_model(model, "the served model (a folder with its config.json)")
    attention_dp = kind == "sglang" and "--enable-dp-attention" in seen
    for flag, value in seen.items():
        if attention_dp and flag in ("--dp-size", "--dp"):
            r.skip(flag, value, "attention data-parallel ranks inside the TP group (--enable-dp-attention)")
        elif flag in table:
            if value is None:
                raise ValueError(f"{label}: {flag} needs a value")
            r.take(table[flag], value, flag)
        elif flag == "--kv-cache-dtype":
            if str(value).lower() in KV_DTYPES:
                r.take("kv_dtype", KV_DTYPES[str(value).lower()], flag)
            elif value != "auto":
                r.skip(flag, value, "a KV-cache dtype meshplan does not bill (bf16, fp16, fp8)")
        elif flag in ("--quantization", "-q"):
            if str(value).lower() in WEIGHT_QUANT:
                r.take("weights_dtype", WEIGHT_QUANT[str(value).lower()], flag)
            else:
                r.skip(flag, value, "a quantization method meshplan does not map: give --weights-dtype")
        elif flag == "--enable-dp-attention":
            r.take("dp_attention", True, flag)
        elif flag == EAGER.get(kind):
            r.take("launch", "eager", flag)
        elif kind == "trtllm" and flag == "--scheduler_policy":
            take_policy(r, value, flag)
        elif kind == "trtllm" and flag == "--model_path":
            r.skip(flag, value, "the local checkpoint of --model: its weights, the model --model names")
        elif kind == "trtllm" and flag == "--extra_llm_api_options":
            r.skip(flag, value, TRTLLM_OPTIONS_FILE)
        elif kind == "trtllm" and flag in LOAD:
            r.skip(
                flag,
                value,
                "the load and its lengths: serve's --concurrency / --num-requests, --input-len, --output-len",
            )
        elif kind == "vllm" and flag == "--speculative-config":
            vllm_speculative(r, value)
        elif kind == "sglang" and flag in SGLANG_SPECULATIVE:
            continue  # read below, together
        elif flag in ("--enable-expert-parallel", "--moe-dp-size", "--dtype"):
            continue  # read below
        elif flag in NOTHING:
            r.skip(flag, value, NO_EFFECT)
        else:
            r.skip(flag, value, UNKNOWN)
    _parallel(r, seen, kind)
    if kind == "sglang":
        sglang_speculative(r, seen)
        r.account(
            {k: v for k, v in seen.items() if k in SGLANG_SPECULATIVE},
            "the draft tree's shape: priced as a chain as deep as the steps",
        )
    return r.done()


def _yaml_words(text: str, label: str) -> tuple[list[str], dict[str, object]]:
    """A ``vllm serve --config`` YAML as the command line it stands for: each key a long option (``--key value``; a
    true switch bare; a mapping as the JSON the option takes), and the keys set false or null (no option: listed)."""
    data = parse_yaml(text, label)
    if not isinstance(data, dict):
        raise ValueError(f"{label} must hold a YAML mapping (vllm serve --config: option names as keys)")
    words: list[str] = []
    off: dict[str, object] = {}
    for key, value in data.items():
        flag = "--" + str(key).lstrip("-").replace("_", "-")  # vLLM's parser takes either spelling
        if value is True:
            words.append(flag)
        elif value is False or value is None:
            off[flag] = value
        else:
            words += [flag, json.dumps(value) if isinstance(value, dict | list) else str(value)]
    return words, off


def _model_word(words: list[str], kind: str) -> str | None:
    """The model after ``vllm serve`` or ``trtllm-serve [serve]`` (the engines' positional), or None."""
    for i, word in enumerate(words[:-1]):
        after = words[i + 1]
        if kind == "vllm" and word == "serve" and i > 0 and words[i - 1].endswith("vllm"):
            return None if after.startswith("-") else after
        if kind == "trtllm" and word.endswith("trtllm-serve"):
            if after == "serve" and i + 2 < len(words):
                after = words[i + 2]
            return None if after.startswith("-") else after
    return None


def _parallel(r: Reading, seen: dict[str, str | None], kind: str) -> None:
    tp = int(r.values.get("tp", 1))
    pp = int(r.values.get("pp", 1))
    dp = int(r.values.get("replicas", 1))
    if kind == "vllm" and "--enable-expert-parallel" in seen:
        r.take("ep", tp * dp, "--enable-expert-parallel (experts over tp x dp)")
    if kind == "sglang" and "--moe-dp-size" in seen:
        r.skip("--moe-dp-size", seen["--moe-dp-size"], "expert replicas inside a replica: follows from tp / ep")
    dtype = seen.get("--dtype")
    if dtype is not None:
        names = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "half": "fp16", "fp16": "fp16"}
        if str(dtype).lower() in names and "weights_dtype" not in r.values:
            r.take("weights_dtype", names[str(dtype).lower()], "--dtype")
        elif str(dtype).lower() != "auto":
            r.skip("--dtype", dtype, "the activations' dtype: billed as the weights'")
    r.take("gpus", tp * pp * dp, "tp x pp x dp of the launch flags")
