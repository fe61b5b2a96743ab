"""Megatron-LM / Megatron-Core arguments: a launch script or a file of ``pretrain_gpt.py`` flags.

Flag names are Megatron-LM's (megatron/training/arguments.py at the commit exports/megatron.py pins, the same
names older releases use). What a flag's absence means is Megatron's own default: gradient reduction and
parameter gathers do not overlap without ``--overlap-grad-reduce`` / ``--overlap-param-gather``, and bf16
training accumulates and reduces main gradients in fp32 unless ``--main-grads-dtype bf16`` or
``--grad-reduce-in-bf16`` says otherwise. The torchrun (or deepspeed) launcher's node and process counts give
the GPU count. The model is found in the catalog by the dimensions the flags state.
"""

from __future__ import annotations

import re

from meshplan.configs.reading import NO_EFFECT, UNKNOWN, ConfigRead, Reading
from meshplan.configs.shell import flag_pairs, script_words

VALUES = {
    "--tensor-model-parallel-size": "tp",
    "--pipeline-model-parallel-size": "pp",
    "--num-virtual-stages-per-pipeline-rank": "vpp",
    "--virtual-pipeline-model-parallel-size": "vpp",
    "--context-parallel-size": "cp",
    "--expert-model-parallel-size": "ep",
    "--expert-tensor-parallel-size": "expert_tp",
    "--micro-batch-size": "micro_batch",
    "--global-batch-size": "global_batch",
    "--seq-length": "seq",
    "--decoder-first-pipeline-num-layers": "first_stage_layers",
    "--decoder-last-pipeline-num-layers": "last_stage_layers",
    "--cpu-offloading-num-layers": "offload_layers",
    "--microbatch-group-size-per-virtual-pipeline-stage": "microbatch_group",
}
SWITCHES = {
    "--sequence-parallel": ("sp", True),
    "--use-distributed-optimizer": ("zero", 1),
    "--overlap-grad-reduce": ("overlap_dp", "on"),
    "--overlap-param-gather": ("overlap_param_gather", "on"),
    "--tp-comm-overlap": ("overlap_tp", "on"),
    "--cross-entropy-loss-fusion": ("loss_fusion", "on"),
    "--no-gradient-accumulation-fusion": ("grad_accum_fusion", "off"),
    "--overlap-p2p-comm": ("pp_host_sync", "off"),
}
SHAPE = {
    "--num-layers": "num_layers",
    "--hidden-size": "hidden",
    "--ffn-hidden-size": "ffn_hidden",
    "--num-attention-heads": "num_heads",
    "--num-query-groups": "num_kv_heads",
    "--vocab-size": "vocab_size",
}
PRECISION_FLAGS = (
    "--bf16",
    "--fp16",
    "--fp8-format",
    "--fp8-recipe",
    "--main-grads-dtype",
    "--accumulate-allreduce-grads-in-fp32",
    "--grad-reduce-in-bf16",
    "--use-precision-aware-optimizer",
    "--exp-avg-dtype",
    "--exp-avg-sq-dtype",
    "--main-params-dtype",
)
LAYOUT_FLAGS = (
    "--use-torch-fsdp2",
    "--num-layers-per-virtual-pipeline-stage",
    "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy",
    "--num-distributed-optimizer-instances",
    "--cp-comm-type",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--recompute-modules",
    "--optimizer",
    "--sgd-momentum",
    "--attention-backend",
)
LAUNCHER = ("--nproc_per_node", "--nproc-per-node", "--nnodes", "--num_gpus", "--num_nodes")
MODEL_DEFINITION = re.compile(
    r"^--(swiglu|normalization|kv-channels|group-query-attention|position-embedding-type|max-position-embeddings|"
    r"rotary-.*|untie-embeddings-and-output-weights|disable-bias-linear|add-qkv-bias|qk-layernorm|apply-layernorm-1p|"
    r"use-mcore-models|use-rotary-position-embeddings|attention-dropout|hidden-dropout|init-method-std|"
    r"make-vocab-size-divisible-by|norm-epsilon|transformer-impl|num-experts|moe-.*|multi-latent-attention|"
    r"kv-lora-rank|q-lora-rank|qk-head-dim|qk-pos-emb-head-dim|v-head-dim|mtp-num-layers|use-rope-scaling|"
    r"rope-scaling-factor|no-rope-fusion|no-position-embedding)$"
)
NOTHING_BILLED = re.compile(
    r"^--(.*lr.*|.*log.*|save.*|load.*|eval.*|data.*|.*tokenizer.*|seed|.*split|.*mmap.*|num-workers|"
    r"train-(iters|samples)|exit-.*|tensorboard.*|wandb.*|profile.*|ckpt-.*|distributed-timeout-minutes|manual-gc.*|"
    r"clip-grad|weight-decay|adam-.*|.*warmup.*|.*decay.*|mock-data|vocab-file|merge-file|tiktoken-.*|"
    r"no-create-attention-mask-in-dataloader|calculate-per-token-loss|empty-unused-memory-level|"
    r"use-flash-attn|fp8-amax-.*|fp8-margin|fp8-interval|master_addr|master_port|node_rank|master-addr|"
    r"master-port|node-rank|rdzv.*|hostfile|deepspeed.*|use-mcore-models|bias-.*-fusion|no-bias-.*-fusion|"
    r"no-masked-softmax-fusion|use-checkpoint-.*|finetune|no-load-.*|dist-ckpt-.*|async-save|"
    r"check-for-.*|rerun-.*|timing-.*|barrier-with-L1-time|no-check-for-nan-in-loss-and-grad|"
    r"use-distributed-checkpoint|short-seq-prob|reset-position-ids)$"
)
_FSDP_ZERO = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}


def read_megatron(text: str, label: str) -> ConfigRead:
    words = script_words(text, label)
    pairs = flag_pairs(words, switches=frozenset(SWITCHES))
    r = Reading("megatron", label)
    if "if" in words or "case" in words:
        r.notes.append(
            "the script has if (or case) blocks: the flags of every branch are read, whichever would run; check "
            "the values above, or type the flags of the branch that runs"
        )
    r.take("stack", "megatron-core", "the file's kind (Megatron-LM flags)")
    seen: dict[str, str | None] = {}
    for flag, value in pairs:
        if flag in seen and seen[flag] != value and _counts(flag):
            raise ValueError(f"{label}: {flag} is given twice, as {seen[flag]!r} and {value!r}")
        seen.setdefault(flag, value)
    for flag, value in seen.items():
        _one(r, flag, value, seen)
    _precision(r, seen)
    _layout(r, seen)
    _launcher(r, seen)
    _replicas(r, seen)
    taken = {f: v for f, v in seen.items() if f in PRECISION_FLAGS or f in LAYOUT_FLAGS or f in LAUNCHER}
    r.account(taken, "read, and moot with the other flags given (Megatron ignores it here)")
    return r.done()


def _number(r: Reading, flag: str, value: str | None, default: float, kind: type = int) -> float:
    """A flag's value as a number, or one line naming the file and the flag."""
    if value is None:
        return default
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"{r.label}: {flag} {value[:40]!r} is not a number") from None


def _counts(flag: str) -> bool:
    """A flag whose value meshplan reads (a repeat of another with a new value is refused)."""
    return flag in VALUES or flag in SHAPE or flag in PRECISION_FLAGS or flag in LAYOUT_FLAGS or flag in LAUNCHER


def _one(r: Reading, flag: str, value: str | None, seen: dict[str, str | None]) -> None:
    if flag in VALUES:
        if value is None:
            raise ValueError(f"{r.label}: {flag} needs a value")
        r.take(VALUES[flag], value, flag)
    elif flag in SWITCHES:
        name, v = SWITCHES[flag]
        r.take(name, v, flag)
    elif flag in SHAPE:
        if flag != "--num-query-groups" or "--group-query-attention" in seen:
            r.shape(SHAPE[flag], value, flag)
        else:
            r.skip(flag, value, "query groups count only with --group-query-attention (absent: one per head)")
    elif flag in PRECISION_FLAGS or flag in LAYOUT_FLAGS or flag in LAUNCHER:
        return  # read below, together
    elif flag in ("--reset-attention-mask",):
        r.skip(flag, value, "attention stays inside packed documents: give --doc-tokens (their mean length)")
    elif flag == "--fp8-param-gather":
        r.skip(flag, value, "primary weights kept in FP8 (half their bytes) and gathered in FP8: not billed")
    elif MODEL_DEFINITION.match(flag):
        r.skip(flag, value, "the model's definition: meshplan uses the model named (catalog or config.json)")
    elif NOTHING_BILLED.match(flag):
        r.skip(flag, value, NO_EFFECT)
    else:
        r.skip(flag, value, UNKNOWN)


def _precision(r: Reading, seen: dict[str, str | None]) -> None:
    if "--fp16" in seen:
        r.take("precision", "fp16", "--fp16")
    elif "--fp8-format" in seen:
        r.take("precision", "fp8", "--fp8-format" + (" on --bf16" if "--bf16" in seen else ""))
        if "--main-grads-dtype" not in seen and "--grad-reduce-in-bf16" not in seen:
            r.take("grad_dtype", "fp32", "--fp8-format (Megatron keeps fp32 main gradients)")
    elif "--bf16" in seen:
        main_bf16 = seen.get("--main-grads-dtype") == "bf16"
        fp32 = "--accumulate-allreduce-grads-in-fp32" if "--accumulate-allreduce-grads-in-fp32" in seen else "Megatron"
        key = "--bf16 --main-grads-dtype bf16" if main_bf16 else f"--bf16 (main gradients in fp32: {fp32})"
        r.take("precision", "bf16" if main_bf16 else "bf16-fp32-grads", key)
    else:
        r.take("precision", "fp32", "no --bf16, --fp16 or --fp8-format (Megatron trains in fp32)")
    if "--grad-reduce-in-bf16" in seen:
        r.take("grad_dtype", "bf16", "--grad-reduce-in-bf16")
    main = seen.get("--main-grads-dtype")
    if main not in (None, "bf16", "fp32"):
        r.skip("--main-grads-dtype", main, UNKNOWN)
    if "--fp8-format" in seen and "--fp8-recipe" not in seen:
        r.take("fp8_recipe", "delayed", "--fp8-format without --fp8-recipe (Megatron's default recipe: delayed)")
    if "--fp8-recipe" in seen:
        recipe = seen["--fp8-recipe"]
        if recipe in ("tensorwise", "delayed", "mxfp8"):
            r.take("fp8_recipe", recipe, "--fp8-recipe")
        else:
            r.skip("--fp8-recipe", recipe, "an FP8 scaling meshplan does not model (billed as tensorwise)")
    if "--use-precision-aware-optimizer" in seen:
        for flag in ("--exp-avg-dtype", "--exp-avg-sq-dtype"):
            if seen.get(flag) in ("bf16", "fp32"):
                r.take("moment_dtype", seen[flag], flag)
            elif flag in seen:
                r.skip(flag, seen[flag], "optimizer moments in a dtype meshplan does not bill (fp8, fp16)")
    if seen.get("--main-params-dtype") in ("bf16", "fp32"):
        r.take("master_dtype", seen["--main-params-dtype"], "--main-params-dtype")


def _layout(r: Reading, seen: dict[str, str | None]) -> None:
    if "--use-torch-fsdp2" in seen:
        r.take("zero", 3, "--use-torch-fsdp2 (PyTorch FSDP2 shards weights, gradients and optimizer state)")
    per_chunk = seen.get("--num-layers-per-virtual-pipeline-stage")
    if per_chunk is not None:
        layers, pp = r.model_shape.get("num_layers"), int(r.values.get("pp", 1))
        chunk = int(_number(r, "--num-layers-per-virtual-pipeline-stage", per_chunk, 1))
        if layers is None or chunk < 1 or layers % (pp * chunk):
            r.skip("--num-layers-per-virtual-pipeline-stage", per_chunk, "virtual stages: give --vpp")
        else:
            r.take(
                "vpp",
                layers // (pp * chunk),
                "--num-layers / (--pipeline-model-parallel-size x --num-layers-per-virtual-pipeline-stage)",
            )
    if "--use-megatron-fsdp" in seen:
        strategy = seen.get("--data-parallel-sharding-strategy") or "no_shard"
        if strategy not in _FSDP_ZERO:
            raise ValueError(f"{r.label}: --data-parallel-sharding-strategy {strategy!r} is not one of Megatron's")
        r.take("zero", _FSDP_ZERO[strategy], f"--use-megatron-fsdp --data-parallel-sharding-strategy {strategy}")
    kind = seen.get("--cp-comm-type")
    if kind in ("p2p", "allgather"):
        r.take("cp_kind", "ring" if kind == "p2p" else "all-gather", "--cp-comm-type")
    elif kind is not None:
        r.skip("--cp-comm-type", kind, "a context-parallel exchange meshplan does not model (billed as a ring)")
    else:
        r.take("cp_kind", "ring", "no --cp-comm-type (Megatron's default: p2p, a ring)")
    _recompute(r, seen)
    opt = seen.get("--optimizer")
    if opt == "sgd":
        momentum = _number(r, "--sgd-momentum", seen.get("--sgd-momentum"), 0.9, float)
        r.take("optimizer", "sgd" if momentum == 0 else "sgd-momentum", "--optimizer sgd --sgd-momentum")
    elif opt in (None, "adam"):
        r.take("optimizer", "adamw", "--optimizer adam" if opt else "Megatron's default optimizer (adam)")
    else:
        r.skip("--optimizer", opt, "an optimizer whose state meshplan does not bill (billed as AdamW)")
    backend = seen.get("--attention-backend")
    names = {"flash": "flash", "fused": "cudnn", "unfused": "eager", "auto": "flash"}
    if backend in names:
        r.take("attention", names[backend], "--attention-backend")
    elif backend is not None:
        r.skip("--attention-backend", backend, UNKNOWN)
    if "--overlap-grad-reduce" not in seen:
        r.take("overlap_dp", "off", "no --overlap-grad-reduce (Megatron's default)")
    if "--overlap-param-gather" not in seen:
        r.take("overlap_param_gather", "off", "no --overlap-param-gather (Megatron's default)")


def _recompute(r: Reading, seen: dict[str, str | None]) -> None:
    granularity = seen.get("--recompute-granularity")
    if granularity is None:
        r.take("recompute", "none", "no --recompute-granularity (Megatron's default: none)")
        for flag in ("--recompute-method", "--recompute-num-layers", "--recompute-modules"):
            if flag in seen:
                r.skip(flag, seen[flag], "applies only with --recompute-granularity")
        return
    if granularity == "selective":
        r.take("recompute", "selective", "--recompute-granularity")
        if "--recompute-modules" in seen:
            r.take("selective", "modules", "--recompute-modules")
            r.take("recompute_modules", ",".join((seen["--recompute-modules"] or "").split()), "--recompute-modules")
        return
    if granularity != "full":
        raise ValueError(f"{r.label}: --recompute-granularity {granularity!r} is not full or selective")
    r.take("recompute", "full", "--recompute-granularity")
    method = seen.get("--recompute-method")
    layers = int(_number(r, "--recompute-num-layers", seen.get("--recompute-num-layers"), 1))
    if method == "block":
        r.take("recompute_layers", layers, "--recompute-method block --recompute-num-layers")
    elif layers != 1:
        r.skip(
            "--recompute-num-layers",
            layers,
            f"uniform groups of {layers} layers keep one input per group (billed as one per layer)",
        )


def _launcher(r: Reading, seen: dict[str, str | None]) -> None:
    per_flag = next((f for f in ("--nproc_per_node", "--nproc-per-node", "--num_gpus") if f in seen), None)
    node_flag = next((f for f in ("--nnodes", "--num_nodes") if f in seen), None)
    per_node = seen.get(per_flag) if per_flag else None
    nodes = (seen.get(node_flag) if node_flag else None) or "1"
    if per_node is None:
        return
    try:
        gpus = int(per_node) * int(nodes)
    except ValueError:
        r.skip("--nproc-per-node", per_node, "the GPU count, not a plain number here: give --gpus")
        return
    r.take("gpus", gpus, f"the launcher's {node_flag or 'one node'} x {per_flag}")


def _replicas(r: Reading, seen: dict[str, str | None]) -> None:
    """--num-distributed-optimizer-instances: replicas of the optimizer's shard group (HSDP)."""
    flag = "--num-distributed-optimizer-instances"
    if flag not in seen:
        return
    replicas = int(_number(r, flag, seen[flag], 1))
    ranks = int(r.values.get("tp", 1)) * int(r.values.get("pp", 1)) * int(r.values.get("cp", 1))
    gpus = r.values.get("gpus")
    if gpus is None or gpus % ranks or (gpus // ranks) % replicas:
        r.skip(flag, replicas, "replicas of the optimizer's shard group (HSDP): give --dp-replicate with --gpus")
        return
    r.take("dp_replicate", replicas, flag)
    r.take("dp_shard", gpus // ranks // replicas, f"{flag} (the data-parallel ranks / instances)")
