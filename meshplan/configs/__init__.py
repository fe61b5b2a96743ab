"""Engine configurations in: a torchtitan TOML or config module, Megatron-LM flags, a NeMo or Megatron-Bridge
YAML, a DeepSpeed JSON, an accelerate YAML, a vLLM, SGLang or TensorRT-LLM launch command, vLLM's ``--config``
YAML or TensorRT-LLM's LLM-API options YAML, read as request values.

``read_config`` reads a file through files.py's guarded reader (size, type, UTF-8), tells its kind from its
content unless ``kind`` is given, and hands the text to that engine's reader (one module per engine). The
answer (:class:`ConfigRead`) holds schema values with the key each came from, the model the file names, and
every key not read with what it would change. Any refusal is one ``ValueError`` line naming the file.
"""

from __future__ import annotations

import re
from pathlib import Path

from meshplan.configs.reading import ConfigRead, Unread, catalog_match, check_shape, launches
from meshplan.files import read_text_file

VLLM_OPTIONS = r"^(tensor-parallel-size|gpu-memory-utilization|max-model-len|max-num-seqs|max-num-batched-tokens)\s*:"
"""Top-level keys of a ``vllm serve --config`` YAML (vLLM's long option names, as its docs write them)."""
TRTLLM_OPTIONS = (
    r"^(kv_cache_config|enable_attention_dp|cuda_graph_config|scheduler_config|moe_expert_parallel_size)\s*:"
)
"""Top-level keys that only TensorRT-LLM's LLM-API options hold (the --extra_llm_api_options YAML)."""
KINDS = ("torchtitan", "megatron", "nemo", "deepspeed", "accelerate", "vllm", "sglang", "trtllm")
"""What ``--from-kind`` accepts."""


def detect_kind(text: str, name: str = "") -> str:
    """The kind of a config from its text (and file name); ValueError when it cannot be told."""
    head = text.lstrip()
    suffix = Path(name).suffix.lower()
    if head.startswith("{"):
        if re.search(r'"(model_type|architectures)"\s*:', text[:20000]):
            raise ValueError(
                f"{name or 'the file'} is a Hugging Face config.json: give it as MODEL, and the engine's config "
                "with --from"
            )
        return "deepspeed"
    if suffix == ".py" or re.search(r"^\s*def \w+\(.*\).*:\s*$", text, re.MULTILINE):
        return "torchtitan"
    if suffix == ".toml" or re.search(r"^\s*\[[A-Za-z_][\w.-]*\]\s*(#.*)?$", text, re.MULTILINE):
        return "torchtitan"
    if launches(text, "vllm") or re.search(VLLM_OPTIONS, text, re.MULTILINE):
        return "vllm"
    if launches(text, "sglang"):
        return "sglang"
    if launches(text, "trtllm") or re.search(TRTLLM_OPTIONS, text, re.MULTILINE):
        return "trtllm"
    if re.search(r"--(tensor-model-parallel-size|num-layers|micro-batch-size|seq-length)\b", text):
        return "megatron"
    if re.search(r"^(distributed_type|compute_environment|fsdp_config)\s*:", text, re.MULTILINE):
        return "accelerate"
    if re.search(
        r"^\s*(trainer|ConfigContainer|model_config|train_config|strategy|ddp|mixed_precision|train)\s*:",
        text,
        re.MULTILINE,
    ):
        return "nemo"
    raise ValueError(
        f"cannot tell which engine's config {name or 'the file'} is: give --from-kind ({', '.join(KINDS)})"
    )


def read_config_text(text: str, label: str, kind: str | None = None) -> ConfigRead:
    """A config's text (``label`` names it in errors) read by its engine's reader."""
    kind = kind or detect_kind(text, label)
    if kind not in KINDS:
        raise ValueError(f"--from-kind {kind[:40]!r} is not one of {', '.join(KINDS)}")
    if kind == "torchtitan":
        from meshplan.configs.torchtitan import read_torchtitan_module, read_torchtitan_toml

        python = label.endswith(".py") or re.search(r"^\s*def \w+\(", text, re.MULTILINE)
        return read_torchtitan_module(text, label) if python else read_torchtitan_toml(text, label)
    if kind == "megatron":
        from meshplan.configs.megatron import read_megatron

        return read_megatron(text, label)
    if kind == "nemo":
        from meshplan.configs.nemo import read_nemo

        return read_nemo(text, label)
    if kind == "deepspeed":
        from meshplan.configs.deepspeed import read_deepspeed

        return read_deepspeed(text, label)
    if kind == "accelerate":
        from meshplan.configs.accelerate import read_accelerate

        return read_accelerate(text, label)
    if kind == "trtllm" and not launches(text, kind):
        from meshplan.configs.trtllm import read_trtllm_options

        return read_trtllm_options(text, label)
    from meshplan.configs.serving import read_serving

    return read_serving(text, label, kind)


def read_config(path: str | Path, kind: str | None = None) -> ConfigRead:
    """An engine's config file, read through files.py's guarded reader."""
    text = read_text_file(path, what="--from file")
    return read_config_text(text, str(path), kind)


__all__ = [
    "KINDS",
    "ConfigRead",
    "Unread",
    "catalog_match",
    "check_shape",
    "detect_kind",
    "read_config",
    "read_config_text",
]
