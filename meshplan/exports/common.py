"""What every engine export shares: the result type, the refusal, the serving plan, batch arithmetic, shell text.

Exports are pure: they turn specs into text and never touch files, the network or an engine.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from meshplan.spec.conditions import CapacityScheduler, EpDispatch
from meshplan.spec.layout import Layout, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload
from meshplan.units import DType


class Engine(StrEnum):
    """An engine a plan can be exported to."""

    TORCHTITAN = "torchtitan"
    """PyTorch-native pre-training (FSDP2, TP, PP, CP, EP), configured by Python config functions."""
    MEGATRON = "megatron"
    """Megatron-LM / Megatron-Core pre-training, configured by command-line arguments."""
    DEEPSPEED = "deepspeed"
    """DeepSpeed ZeRO training, configured by a JSON file and its launcher."""
    VLLM = "vllm"
    """vLLM serving, configured by `vllm serve` engine arguments."""
    SGLANG = "sglang"
    """SGLang serving, configured by `sglang.launch_server` server arguments."""
    TRTLLM = "trtllm"
    """TensorRT-LLM serving, configured by `trtllm-serve` options and an extra LLM-API YAML file."""


class UnsupportedByEngine(ValueError):
    """The plan uses something the engine cannot express; the message names the closest plan it can run."""

    def __init__(self, engine: Engine, missing: str, closest: str, *, advice: str = "") -> None:
        self.engine = engine
        self.missing = missing
        self.closest = closest
        self.advice = advice
        """What to run instead, where the caller knows the command line (it replaces ``closest`` in the message)."""
        super().__init__(f"{engine} cannot {missing}; {advice or f'closest: {closest}'}")

    def with_advice(self, advice: str) -> UnsupportedByEngine:
        """The same refusal, its message ending in ``advice`` (a command that works) instead of the closest plan."""
        return UnsupportedByEngine(self.engine, self.missing, self.closest, advice=advice)


@dataclass(frozen=True, slots=True, kw_only=True)
class Export:
    """A ready launch configuration: the files to write, the command that starts the job, and remarks."""

    engine: Engine
    engine_version: str
    """The engine release whose configuration format and flag names this export follows."""
    files: Mapping[str, str]
    """File name -> text; the command expects them in its working directory."""
    command: str
    """One shell command line that launches the job."""
    notes: tuple[str, ...] = field(default=())
    """What the user still has to do or should know (data, checkpoints, engine-side caveats)."""


def one_line(text: str) -> str:
    """``text`` with every character that is not printable (newline, carriage return, other control and format
    characters, line separators) written as its escape, so it stays on one line of a script or a config."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


def comment(text: str, *, prefix: str = "# ") -> str:
    """One comment line of a shell or Python file: whatever ``text`` holds cannot end the comment."""
    return prefix + one_line(text)


def predicted_lines(predicted: Mapping[str, float] | None, *, prefix: str = "# ") -> list[str]:
    """The numbers meshplan predicted for the plan, one comment line each (units are in the key names)."""
    if not predicted:
        return []
    lines = [comment("meshplan predicted:", prefix=prefix)]
    lines += [comment(f"  {key} = {float(value):.6g}", prefix=prefix) for key, value in predicted.items()]
    return lines


MAX_MODEL_PATH_CHARS = 1024
_MODEL_PATH_PUNCTUATION = frozenset("._-/~+@:=, ")


def model_path_error(text: object) -> str | None:
    """Why ``text`` cannot be a model path (a Hugging Face repository id or a checkpoint folder), or None.

    A model path holds letters, digits, spaces and ``. _ - / ~ + @ : = ,`` only: no control character (a
    newline would end a launcher's comment and start a command), no quote, ``$``, backtick or other shell
    syntax, and it does not start with ``-`` (an engine would read it as an option).
    """
    if not isinstance(text, str):
        return f"must be a string, got {type(text).__name__}"
    if not text.strip():
        return "is empty"
    if len(text) > MAX_MODEL_PATH_CHARS:
        return f"is {len(text):,} characters; the limit is {MAX_MODEL_PATH_CHARS:,}"
    shown = repr(text) if len(text) <= 80 else repr(text[:77]) + "..."
    for ch in text:
        if not (ch.isalnum() or ch in _MODEL_PATH_PUNCTUATION) or not ch.isprintable():
            return (
                f"{shown} holds {ch!r} (U+{ord(ch):04X}); a model path holds letters, digits, spaces "
                "and . _ - / ~ + @ : = , only"
            )
    if text.startswith("-"):
        return f"{shown} starts with '-', which an engine reads as an option"
    return None


def check_model_path(text: object, *, what: str = "model path") -> str:
    """``text`` if it can be a model path (see :func:`model_path_error`); a one-line ValueError otherwise."""
    error = model_path_error(text)
    if error is not None:
        raise ValueError(f"{what} {error}")
    assert isinstance(text, str)
    return text


def effective_zero(layout: Layout) -> ZeroStage:
    """The ZeRO stage that really shards something: the state is sharded over dp_shard x cp (the group the bill
    shards over: Megatron's distributed optimizer and FSDP's mesh both take the context-parallel ranks), so with
    both 1 there is nothing to shard."""
    return layout.zero if layout.dp_shard * layout.cp > 1 else ZeroStage.NONE


def grad_accumulation_steps(layout: Layout, workload: Workload) -> int:
    """Micro-batches each data-parallel rank runs per optimizer step."""
    per_pass = layout.micro_batch * layout.dp
    if workload.global_batch % per_pass:
        raise ValueError(
            f"global_batch={workload.global_batch} is not a multiple of micro_batch * dp = "
            f"{layout.micro_batch} * {layout.dp} = {per_pass}"
        )
    return workload.global_batch // per_pass


def check_experts(engine: Engine, model: ModelSpec, layout: Layout, workload: Workload | None = None) -> None:
    """Expert parallelism needs experts; DeepEP's dispatcher, an engine that runs it (``workload``: None for one
    that does)."""
    if layout.ep > 1 and model.moe is None:
        raise UnsupportedByEngine(engine, f"split experts (ep={layout.ep}) of the dense model {model.name}", "ep=1")
    if workload is not None and workload.conditions.ep_dispatch is EpDispatch.DEEPEP and model.moe is not None:
        raise UnsupportedByEngine(engine, "dispatch tokens through DeepEP", "ep_dispatch alltoall")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingPlan:
    """The handful of numbers a server needs: one plan feeds every serving engine, each maps it to its own flags.

    The fields carry vLLM's names. Construction refuses what no engine could run (a degree or a limit below 1,
    a memory fraction outside (0, 1]) with a plain ValueError; what only one engine cannot express is refused
    by that engine's export with UnsupportedByEngine.
    """

    model_path: str
    """Checkpoint directory or Hugging Face repository the server loads."""
    tp: int = 1
    """Tensor-parallel degree inside each replica."""
    pp: int = 1
    """Pipeline-parallel degree inside each replica."""
    ep: int = 1
    """Expert-parallel degree; each engine has its own rule for which values it can express."""
    dp: int = 1
    """Data-parallel replicas."""
    max_model_len: int
    """Longest sequence, prompt and output together, in tokens."""
    gpu_memory_utilization: float
    """Fraction of each GPU's memory the engine may take, in (0, 1]."""
    max_num_seqs: int
    """Sequences a replica runs at once."""
    kv_cache_dtype: DType | None = None
    """Storage type of the KV cache; None keeps the model's dtype."""
    quantization: str | None = None
    """The engine's name for the weights' quantization method; None loads them as stored."""
    dp_attention: bool = False
    """Attention data-parallel over the tp ranks of a replica, experts over all of them (MoE)."""
    enforce_eager: bool = False
    """Every forward launched op by op, no CUDA graphs (the plan was timed with ``--launch eager``)."""
    capacity_scheduler: str | None = None
    """TensorRT-LLM's admission policy the plan was timed with (guaranteed-no-evict or max-utilization); None: the
    engine's own. The paging engines admit as the cache grows whatever it says."""

    def __post_init__(self) -> None:
        check_model_path(self.model_path, what="model_path")
        counts = {
            "tp": self.tp,
            "pp": self.pp,
            "ep": self.ep,
            "dp": self.dp,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
        }
        for name, value in counts.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.gpu_memory_utilization, int | float) or not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.capacity_scheduler not in (None, *CapacityScheduler):
            raise ValueError(
                f"capacity_scheduler must be one of {', '.join(CapacityScheduler)} or None, "
                f"got {self.capacity_scheduler!r}"
            )

    @property
    def num_gpus(self) -> int:
        """GPUs of the whole deployment: tp x pp per replica, dp replicas (experts borrow these, add none)."""
        return self.tp * self.pp * self.dp


def precision_flags(
    engine: Engine,
    plan: ServingPlan,
    kv_cache_flag: str,
    kv_cache_dtypes: Mapping[DType, str],
    kv_cache_closest: str,
    quantization_flag: str,
    quantization_methods: Collection[str],
) -> list[str]:
    """The flags for the plan's KV-cache dtype and weight quantization, in one engine's names and choices.

    Each engine passes its flag names and tables: ``kv_cache_dtypes`` maps a dtype to the engine's choice,
    ``quantization_methods`` lists the methods it loads. Unset fields write no flag (the engine's default);
    a dtype or method the engine lacks is refused, ``kv_cache_closest`` naming the KV-cache dtypes it offers.
    """
    args: list[str] = []
    if plan.kv_cache_dtype is not None:
        if plan.kv_cache_dtype not in kv_cache_dtypes:
            raise UnsupportedByEngine(engine, f"store the KV cache in {plan.kv_cache_dtype}", kv_cache_closest)
        args += [kv_cache_flag, kv_cache_dtypes[plan.kv_cache_dtype]]
    if plan.quantization is not None:
        if plan.quantization not in quantization_methods:
            raise UnsupportedByEngine(
                engine, f"load {plan.quantization!r} quantized weights", "quantization=None or fp8"
            )
        args += [quantization_flag, plan.quantization]
    return args


def nodes(num_gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node) for a launcher; a job smaller than one node runs on one node."""
    if gpus_per_node < 1:
        raise ValueError(f"gpus_per_node must be >= 1, got {gpus_per_node}")
    if num_gpus <= gpus_per_node:
        return 1, num_gpus
    if num_gpus % gpus_per_node:
        raise ValueError(f"{num_gpus} GPUs do not fill whole nodes of {gpus_per_node}")
    return num_gpus // gpus_per_node, gpus_per_node


class ShellExpansion(str):
    """A token the shell must expand, such as ``${MASTER_ADDR}:${MASTER_PORT}``: written unquoted.

    Only ``${NAME}`` references and characters shlex leaves unquoted may appear in one; every other token of a
    command line is quoted with shlex.quote, whatever it holds.
    """

    __slots__ = ()

    def __new__(cls, text: str) -> ShellExpansion:
        if not _EXPANSION.fullmatch(text):
            raise ValueError(f"{text!r} is not a plain ${{NAME}} expansion")
        return super().__new__(cls, text)


_EXPANSION = re.compile(r"(?:\$\{[A-Z_][A-Z0-9_]*\}|[A-Za-z0-9_@%+=:,./-])+", re.ASCII)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
RENDEZVOUS_ENDPOINT = ShellExpansion("${MASTER_ADDR}:${MASTER_PORT}")
"""torchrun's --rdzv-endpoint on more than one node: the variables each node sets."""


def shell_word(token: str | int | float) -> str:
    """One token as the shell must read it: quoted unless it is a :class:`ShellExpansion`."""
    text = str(token)
    if "\0" in text:
        raise ValueError(f"{text[:40]!r} holds a NUL character, which no command-line argument can")
    return text if isinstance(token, ShellExpansion) else shlex.quote(text)


def shell_join(tokens: Iterable[str | int | float]) -> str:
    """A command line: every token quoted with shlex.quote except ShellExpansion ones, which the shell expands."""
    return " ".join(map(shell_word, tokens))


def _wrapped(tokens: list[str]) -> str:
    """The command one flag per line, continued with backslashes."""
    lines: list[list[str]] = [[]]
    for token in tokens:
        program = token == "-m" or token.endswith(".py")
        if lines[-1] and (token.startswith("--") or (program and lines[-1][0].startswith("--"))):
            lines.append([])
        lines[-1].append(token)
    return " \\\n    ".join(shell_join(line) for line in lines)


def shell_script(
    *, title: str, predicted: Mapping[str, float] | None, env: Mapping[str, str], tokens: list[str]
) -> str:
    """A bash launcher: a header comment, the predictions, exported variables, then the command.

    Safe by construction: the title and the predictions are comment lines that cannot hold a newline, each
    value is quoted with shlex.quote, and each token too unless it is a ShellExpansion."""
    lines = ["#!/usr/bin/env bash", comment(title), *predicted_lines(predicted), "set -euo pipefail"]
    for key, value in env.items():
        if not _ENV_NAME.fullmatch(key):
            raise ValueError(f"{key!r} is not an environment variable name")
        lines.append(f"export {key}={shell_word(value)}")
    return "\n".join([*lines, _wrapped(tokens), ""])


def launcher_export(
    engine: Engine,
    engine_version: str,
    script: str,
    *,
    title: str,
    tokens: list[str],
    predicted: Mapping[str, float] | None,
    notes: Iterable[str],
) -> Export:
    """An export whose one file is a bash launcher of ``tokens`` (the serving engines need no more)."""
    return Export(
        engine=engine,
        engine_version=engine_version,
        files={script: shell_script(title=title, predicted=predicted, env={}, tokens=tokens)},
        command=shell_join(tokens),
        notes=tuple(notes),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class DisaggregatedPlan:
    """Two pools of one model: prefill replicas hand each request's KV cache to decode replicas."""

    prefill: ServingPlan
    decode: ServingPlan

    @property
    def num_gpus(self) -> int:
        return self.prefill.num_gpus + self.decode.num_gpus


def pool_devices(plan: DisaggregatedPlan, *, gpus_per_node: int = 8) -> tuple[dict[str, str], dict[str, str]]:
    """CUDA_VISIBLE_DEVICES of the prefill and decode launchers when both pools share one node (none else)."""
    p, d = plan.prefill.num_gpus, plan.decode.num_gpus
    if p + d > gpus_per_node:
        return {}, {}
    first = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(p)))}
    return first, {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(p, p + d)))}


def pools_export(
    engine: Engine,
    engine_version: str,
    *,
    plan: DisaggregatedPlan,
    title: str,
    pools: Mapping[str, list[str]],
    predicted: Mapping[str, float] | None,
    notes: Iterable[str],
) -> Export:
    """An export of one launcher per pool (``pools``: role -> command line; prefill and decode first, then
    any router), started together by the command."""
    envs = dict(zip(("prefill", "decode"), pool_devices(plan), strict=True))
    files = {
        f"serve_{engine.value}_{role}.sh": shell_script(
            title=f"{title}: the {role}", predicted=predicted, env=envs.get(role, {}), tokens=tokens
        )
        for role, tokens in pools.items()
    }
    extra = [] if envs["prefill"] else ["the pools span more than one node: run each launcher on its own nodes"]
    return Export(
        engine=engine,
        engine_version=engine_version,
        files=files,
        command=" & ".join(shell_join(["bash", name]) for name in files) + " & wait",
        notes=(*notes, *extra),
    )
