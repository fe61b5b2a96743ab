"""The ``meshplan`` command line: every flag made from the request schema (spec/requests.py) and the
commands that take them."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from meshplan.cli.support import UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


_UNSET: Any = object()
EXPORT_CONDITIONS = ("first_stage_layers", "last_stage_layers", "fp8_recipe", "fp8_all_gather")
"""The run conditions a training export writes into the engine's configuration."""
PIN_FIELDS: tuple[str, ...] = ("tp", "pp", "vpp", "cp", "ep", "dp_shard", "dp_replicate", "zero", "sp", "recompute")
PIN_FIELDS += ("expert_tp", "schedule", "cp_kind", "micro_batch")


def _add_force(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="replace an existing output file (never an input or a link)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _flag_type(name: str) -> Callable[[str], Any]:
    """An argparse type that parses through the schema field (argparse names the flag itself)."""
    from meshplan.spec.requests import field

    f = field(name)

    def parse(text: str) -> Any:
        try:
            return f.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{f.flag}: ")) from None

    parse.__name__ = f.name  # argparse's "invalid <name> value" wording
    return parse


CHOICES_IN_USAGE = 80
"""Longest ``{a,b,...}`` a usage line shows; a field with more choices shows its name there and lists them in its
help (the usage wraps at whole brackets, so a longer one overflows the terminal width)."""


def add_fields(
    p: argparse.ArgumentParser | Any,
    *names: str,
    required: bool = False,
    default: Any = _UNSET,
    default_text: str | None = None,
) -> None:
    """Flags for schema fields (spec/requests.py): type, bounds, choices, unit and help come from there;
    ``default_text`` says what happens when the flag is not given, where the value alone would not (an unset TP
    the report chooses, an unpinned layout field)."""
    from meshplan.spec.requests import field

    for name in names:
        f = field(name)
        value = f.default if default is _UNSET else default
        text = f.describe(value, unset=default is None and f.default is not None, default_text=default_text)
        flags = [f.flag, *(["--" + f.deprecated.replace("_", "-")] if f.deprecated else [])]
        if f.type is bool:
            p.add_argument(*flags, dest=f.name, action="store_true", default=False, help=text)
            continue
        metavar = "{" + ",".join(f.choices) + "}" if f.choices else f.key.upper()
        if len(metavar) > CHOICES_IN_USAGE:  # too long for a usage line: the name there, the choices in the help
            metavar, text = f.key.upper(), f"{text} (one of: {', '.join(f.choices)})"
        p.add_argument(
            *flags, dest=f.name, type=_flag_type(name), default=value, required=required, help=text, metavar=metavar
        )


SERVING_TP = "the largest divisor of gpus / pp within one scale-up domain: 8 on 8 or more H100s"
"""What an unset serving TP becomes (reports/bills.py): each replica's TP group fills one NVLink domain at most."""
SERVE_TP = f"gpus / (pp x replicas) with --replicas, else {SERVING_TP}"
PINNED = "unpinned"


def _stack_set(*names: str) -> dict[str, str]:
    """Help for workload flags a training stack sets when they are not given."""
    from meshplan.spec.requests import field

    return {name: f"the --stack's, else {field(name).default}" for name in names}


def _add_group(p: argparse.ArgumentParser, group: str, texts: dict[str, str] | None = None, **defaults: Any) -> None:
    """The group's fields as flags; ``defaults`` replaces a field's default, ``texts`` says it in words."""
    from meshplan.spec.requests import Group
    from meshplan.spec.requests import group as fields_of

    g = p.add_argument_group(group)
    for f in fields_of(Group(group)):
        given = {"default": defaults[f.name]} if f.name in defaults else {}
        add_fields(g, f.name, default_text=(texts or {}).get(f.name), **given)


def _add_fleet(p: argparse.ArgumentParser) -> None:
    add_fields(p, "gpu", "gpus", required=True)


def _add_finetune(p: argparse.ArgumentParser) -> None:
    _add_group(p, "fine-tuning")


def _add_fleet_shape(p: argparse.ArgumentParser) -> None:
    _add_group(p, "fleet shape")


PUBLISHED_WEIGHTS = "the dtype the model is published in: fp8 for DeepSeek-V3, fp4 for gpt-oss, else bf16"


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    add_fields(p, "input_len", "output_len", required=True)
    add_fields(p, "tp", default=None, default_text=SERVE_TP)
    add_fields(p, "pp", "ep", "dp_attention")
    add_fields(p, "weights_dtype", default=None, default_text=PUBLISHED_WEIGHTS)  # unset: the dtype it is published in
    add_fields(p, "kv_dtype", default=None)  # unset: the engine's default for the weights
    add_fields(p, "quant", "int4_group_size", "engine")
    add_fields(p, "max_batch", "max_num_tokens", "cuda_graph_padding", "launch", "capacity_scheduler")
    add_fields(p, "gpu_memory_utilization", default=None, default_text="the --engine's own")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in [0, 65535], got {value}")
    return value


def _run_sources() -> list[str]:
    """The published-run sources ``validate`` holds (catalog/runs/*.toml), listed without loading them."""
    from importlib import resources

    folder = resources.files("meshplan") / "catalog" / "runs"
    return sorted(e.name.removesuffix(".toml") for e in folder.iterdir() if e.name.endswith(".toml"))


Command = Callable[[str, str], argparse.ArgumentParser]
"""Adds one subcommand (name, one-line description) with its --json flag; cli/commands.py runs it by name."""


README_PLAN = "llama-3.1-70b --gpu h200 --gpus 64 --seq 8k --global-batch-tokens 4M"
EXAMPLES: dict[str, tuple[str, ...]] = {
    "params": ("params llama-3.1-70b", "params deepseek-v3 --json", "params llama-3.1-8b --finetune lora"),
    "memory": (
        "memory llama-3.1-70b --gpu h100-sxm --gpus 64 --tp 8 --pp 4 --zero 1 --sp --seq 8192 --global-batch 128",
        "memory llama-3.1-8b --gpu h200 --gpus 8 --dp-shard 8 --zero 3 --stack torchtitan --seq 8192",
        "memory llama-3.1-70b --gpu h100-sxm --gpus 1 --finetune qlora --seq 4096",
    ),
    "estimate": (
        "estimate llama-3.1-70b --gpu h100-sxm --gpus 64 --tp 8 --pp 2 --zero 1 --seq 8192 --global-batch 256",
        "estimate llama-3.1-8b --gpu h100-sxm --gpus 8 --dp-shard 8 --zero 3 --stack torchtitan --tokens 15T",
    ),
    "validate": ("validate", "validate --source llama3", "validate --serving", "validate --memory"),
    "compare": (
        "compare llama-3.1-8b --gpu h100-sxm --gpus 8 --dp-shard 8 --zero 3 --trace rank0.json --snapshot rank0.pickle",
        "compare llama-3.1-8b --gpu h100-sxm --gpus 8 --dp-shard 8 --zero 3 --step-time-s 1.9 --out runs.json --append",
    ),
    "calibrate": (
        "calibrate runs.json --out cluster.toml",
        "estimate llama-3.1-8b --gpu h100-sxm --gpus 8 --dp-shard 8 --zero 3 --profile cluster.toml",
    ),
    "plan": (
        f"plan {README_PLAN} --explain",
        f"plan {README_PLAN} --engine torchtitan --save p.json",
        f"plan {README_PLAN} --zero 1 --compare tp=8,pp=8,dp=1",
    ),
    "recipe": ("recipe --list", "recipe llama3-405b-8k --no-rank"),
    "export": (
        "export torchtitan --from-plan p.json --out run/",
        "export megatron llama-3.1-70b --gpu h100-sxm --gpus 64 --tp 8 --pp 4 --seq 4096 --global-batch 64",
        "export vllm llama-3.1-70b --gpu h100-sxm --gpus 8 --model-path meta-llama/Llama-3.1-70B-Instruct",
        "export sglang --from-plan s.json",
    ),
    "fit": ("fit llama-3.1-70b --gpu h100-sxm --gpus 8", "fit llama-3.1-8b --gpu a100-40gb --gpus 1 --finetune qlora"),
    "serving": (
        "serving llama-3.1-70b --gpu h100-sxm --gpus 8",
        "serving deepseek-v3 --gpu h200 --gpus 8 --weights-dtype fp8 --context 32k",
    ),
    "serve": (
        "serve llama-3.1-70b --gpu h100-sxm --gpus 8 --input-len 1000 --output-len 200 --concurrency 32",
        "serve llama-3.1-8b --gpu h100-sxm --gpus 8 --tp 1 --input-len 2k --output-len 256 --rate 20",
        "serve llama-3.1-70b --gpu h200 --gpus 8 --weights-dtype fp8 --input-len 1k --output-len 1k --num-requests 500",
    ),
    "serve-plan": (
        "serve-plan llama-3.1-70b --gpu h100-sxm --gpus 8 --input-len 1000 --output-len 200 --tpot-p99 0.05",
        "serve-plan llama-3.1-8b --gpu h100-sxm --gpus 8 --input-len 8k --output-len 300 --search-disaggregated",
        "serve-plan llama-3.1-8b --gpu h100-sxm --gpus 8 --input-len 8k --output-len 300 --save s.json",
    ),
}
"""Each main subcommand's examples, shown at the end of its --help (tests/test_cli_help.py parses every one)."""


class _Examples(argparse.HelpFormatter):
    """argparse's help, the examples epilog kept line by line (the description still wraps)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _epilog(name: str) -> str | None:
    examples = EXAMPLES.get(name)
    return "examples:\n" + "\n".join(f"  meshplan {e}" for e in examples) if examples else None


_COMMAND_PARSERS: dict[str, argparse.ArgumentParser] = {}
FROM_HELP = (
    "read the run from an engine's config: a torchtitan TOML or config module, Megatron-LM flags (a launch script), "
    "a NeMo / Megatron-Bridge YAML, a DeepSpeed JSON, an accelerate YAML, or a vLLM / SGLang / TensorRT-LLM launch "
    "command; flags typed beside it override the file (docs/configs.md)"
)


def command_parser(name: str) -> argparse.ArgumentParser:
    """The sub-parser of command ``name`` (``--from`` reads its flags before parsing)."""
    if name not in _COMMAND_PARSERS:
        build_parser()
    return _COMMAND_PARSERS[name]


def build_parser() -> argparse.ArgumentParser:
    from meshplan import __version__

    parser = _Parser(prog="meshplan", description="Plan how a transformer is split across GPUs.", allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"meshplan {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, text: str) -> argparse.ArgumentParser:  # allow_abbrev: --hel is unknown, not --help
        p = sub.add_parser(
            name,
            help=text,
            description=text,
            allow_abbrev=False,
            epilog=_epilog(name),
            formatter_class=_Examples,
        )
        p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
        if name in ("memory", "estimate", "plan", "serve", "serve-plan"):
            p.add_argument("--from", dest="from_file", metavar="FILE", default=None, help=FROM_HELP)
            p.add_argument("--from-kind", default=None, help="the --from file's engine, when it cannot be told")
        _COMMAND_PARSERS[name] = p
        return p

    for add in (_training_commands, _compare_command, _search_commands, _serving_commands, _tool_commands):
        add(command)
    return parser


def _training_commands(command: Command) -> None:
    """list, params, memory, stacks, estimate, collectives, validate, calibrate."""
    p = command("list", "what the catalog holds: models, GPUs, links or recipes")
    p.add_argument("kind", choices=("models", "gpus", "links", "recipes", "stacks"))

    p = command("params", "exact parameter counts, total and active per token, by component")
    p.add_argument("model", help="catalog name, model TOML, or a Hugging Face config.json")
    _add_finetune(p)

    p = command("memory", "per-GPU training memory, term by term, for a layout")
    p.add_argument("model")
    _add_fleet(p)
    _add_group(p, "layout")
    stack_set = _stack_set("precision", "attention", "kernels")
    _add_group(p, "workload", stack_set, precision=None, attention=None, kernels=None)  # None: the stack's
    _add_finetune(p)
    _add_group(p, "conditions")

    p = command("stacks", "the training stacks and the conditions each sets (for --stack)")

    p = command("estimate", "step time, MFU, every collective and where it runs, for one layout")
    _add_estimate(p)
    p.add_argument(
        "--timeline",
        action="store_true",
        help="add the step drawn stage by stage (forward, backward, bubble, exposed traffic), the memory each stage "
        "holds over it and the placement: a text summary, or the timeline key with --json",
    )

    p = command("collectives", "the bandwidth wall: one all-reduce timed over NVLink, InfiniBand, Ethernet")
    p.add_argument(
        "--model", default=None, help="size the all-reduce as one TP all-reduce of this model (default llama-3.1-70b)"
    )
    p.add_argument(
        "--size-mb",
        type=float,
        default=None,
        help="buffer [MB, 1e6 bytes] instead of the model's TP all-reduce",
    )
    p.add_argument("--group", type=_positive_int, default=8, help="ranks in the ring [GPUs] (default: 8)")
    add_fields(p, "seq", default=8192)
    add_fields(p, "micro_batch")

    p = command("validate", "predictions against published measured runs, with the error of each")
    p.add_argument("--source", default=None, help=f"one source only: {', '.join(_run_sources())}")
    p.add_argument("--serving", action="store_true", help="the published serving measurements instead")
    p.add_argument(
        "--memory", action="store_true", help="the published peak-memory figures, and the fit of published layouts"
    )
    add_fields(p, "profile")

    p = command("calibrate", "fit a cluster profile (--profile) from your own measured runs")
    p.description = (
        "fit a cluster profile (--profile) from your own measured runs: scales on the matmul, network, attention "
        "and memory-bound rates and the host's seconds per step, with the band of step times your runs give"
    )
    p.add_argument(
        "runs",
        help="RUNS.json: a list of {args: [meshplan estimate arguments], step_time_s or tokens_per_s_per_gpu, "
        "peak_memory_bytes (optional)}",
    )
    p.add_argument("--out", default=None, help="write the profile TOML to this file (for --profile)")
    _add_force(p)


def _add_estimate(p: argparse.ArgumentParser) -> None:
    """The model and every field ``estimate`` takes (``compare`` takes them too: the plan it compares)."""
    p.add_argument("model")
    _add_fleet(p)
    _add_group(p, "layout")
    _add_group(
        p, "workload", _stack_set("precision", "attention", "kernels"), precision=None, attention=None, kernels=None
    )
    _add_finetune(p)
    _add_group(p, "conditions")
    _add_fleet_shape(p)
    add_fields(p, "tokens")
    _add_group(p, "cost and goodput")


def _compare_command(command: Command) -> None:
    p = command("compare", "a plan against its run: profiler trace, memory snapshot or logged numbers, term by term")
    _add_estimate(p)
    _add_group(p, "measured")
    p.add_argument("--trace", default=None, help="a PyTorch profiler trace (export_chrome_trace's JSON) of the run")
    p.add_argument("--snapshot", default=None, help="a CUDA memory snapshot (torch.cuda.memory._dump_snapshot)")
    p.add_argument(
        "--logged", default=None, help="logged numbers: JSON or CSV of step_time_s, max_memory_allocated/reserved"
    )
    p.add_argument("--out", default=None, help="write the run as a runs file meshplan calibrate reads (JSON)")
    p.add_argument("--append", action="store_true", help="add the run to the --out runs file if it exists")
    _add_force(p)


def _search_commands(command: Command) -> None:
    """plan, recipe, export, fit."""
    p = command("plan", "search every layout: the fastest that fit, why they win, why the rest lost")
    p.add_argument("model")
    _add_fleet(p)
    add_fields(p, "seq", "global_batch_tokens", required=True)
    add_fields(p, "top", "headroom", "allow_cross_node_tp", "objective", "tokens", "days")
    p.add_argument("--explain", action="store_true", help="compare the winner with the runner-up term by term")
    p.add_argument(
        "--compare", default=None, help="also compare with a named layout, e.g. tp=8,pp=16,dp=128 (layout flags' names)"
    )
    p.add_argument("--save", default=None, help="write the JSON result to this file (for meshplan export)")
    _add_force(p)
    for name, text in _stack_set("precision", "attention", "kernels").items():
        add_fields(p, name, default=None, default_text=text)  # None: the stack's, else the default
    _add_fleet_shape(p)
    _add_finetune(p)
    pins = p.add_argument_group("pins: keep only layouts with these layout values (none by default)")
    add_fields(pins, *PIN_FIELDS, default=None, default_text=PINNED)
    add_fields(pins, "training_engine")
    _add_group(p, "conditions")
    _add_group(p, "cost and goodput")

    p = command("recipe", "published recipes: evaluated, and ranked against the planner's search")
    p.add_argument("name", nargs="?", default=None, help="recipe name (meshplan recipe --list)")
    p.add_argument("--list", action="store_true", help="list the recipes and their factors")
    p.add_argument("--no-rank", action="store_true", help="skip the search that ranks the published layout")

    p = command(
        "export",
        "a plan as the launch configuration of torchtitan, Megatron-LM, DeepSpeed, vLLM, SGLang or TensorRT-LLM",
    )
    p.add_argument("engine", choices=("torchtitan", "megatron", "deepspeed", "vllm", "sglang", "trtllm"))
    p.add_argument("model", nargs="?", default=None)
    add_fields(p, "gpu", "gpus")
    p.add_argument("--from-plan", default=None, help="a file written by meshplan plan --save (serve-plan for servers)")
    p.add_argument("--out", default=None, help="write the files and launch.sh into this folder")
    _add_force(p)
    p.add_argument("--model-path", default=None, help="checkpoint or Hugging Face path to put in the config")
    _add_group(p, "layout", {"tp": f"1 for a trainer; for a server, {SERVING_TP}"}, tp=None)
    _add_group(p, "workload", {"precision": "the stack's: the engine's, or the saved plan's"}, precision=None)
    add_fields(p, *EXPORT_CONDITIONS)
    p.set_defaults(tp=None)  # unset: 1 for a trainer, a server's TP fills one scale-up domain at most
    p.set_defaults(precision=None)  # unset: the stack's (the engine's, or the saved plan's)
    _add_group(p, "serving", {"weights_dtype": PUBLISHED_WEIGHTS}, weights_dtype=None)

    p = command(
        "fit",
        "weights split over N GPUs: per-GPU share, free memory, fewest GPUs; with --finetune, the largest "
        "micro-batch and sequence that fit",
    )
    p.add_argument("model")
    _add_fleet(p)
    add_fields(p, "weights_dtype", default=None, default_text=f"{PUBLISHED_WEIGHTS}; bf16 with --finetune")
    add_fields(p, "seq", "headroom")
    for name, text in _stack_set("precision", "kernels").items():
        add_fields(p, name, default=None, default_text=text)  # None: the stack's
    add_fields(p, "stack")
    _add_finetune(p)


def _serving_commands(command: Command) -> None:
    """serving, serve, serve-plan."""
    p = command("serving", "serving memory: weights, KV cache per token, tokens and sequences that fit")
    p.add_argument("model")
    _add_fleet(p)
    add_fields(p, "node_size")
    add_fields(p, "tp", default=None, default_text=SERVING_TP)
    add_fields(p, "pp", "ep")
    _add_group(p, "serving", {"weights_dtype": PUBLISHED_WEIGHTS}, weights_dtype=None)

    p = command("serve", "serving speed under load: TTFT p50/p99, TPOT, tokens/s per GPU and per user")
    p.add_argument("model")
    _add_fleet(p)
    add_fields(p, "node_size")
    _add_serve_flags(p)
    add_fields(p, "replicas", "disaggregate", "price_per_gpu_hour")
    add_fields(p, "speculative", "spec_acceptance", "draft_model", "prefix_hit_rate")
    load = p.add_mutually_exclusive_group(required=True)
    add_fields(load, "concurrency", "rate", "num_requests", "batch")

    p = command("serve-plan", "every serving layout, dtype and batch cap ranked under TTFT/TPOT targets")
    p.add_argument("model")
    _add_fleet(p)
    add_fields(p, "node_size")
    add_fields(p, "input_len", "output_len", required=True)
    add_fields(p, "ttft_p99", "tpot_p99", "serve_objective", "concurrency", "engine", "weights_dtypes", "top")
    add_fields(p, "allow_quantization", "prefix_hit_rate", "speculative", "spec_acceptance", "launch")
    add_fields(p, "capacity_scheduler")
    p.add_argument("--save", default=None, help="write the JSON result to this file (for meshplan export)")
    _add_force(p)
    add_fields(p, "search_disaggregated")


def _tool_commands(command: Command) -> None:
    """check, ui."""
    p = command(
        "check",
        "run a tiny model on local torch.distributed processes and hold every measured byte and collective "
        "against meshplan's prediction (needs the torch extra)",
    )
    p.add_argument(
        "--world-size", type=_positive_int, default=2, help="local processes (gloo), at least 2 (default: 2)"
    )
    p.add_argument(
        "--layouts",
        default=None,
        help="comma-separated, as the report names them: ddp,fsdp,tp,sp,fsdp_tp,pp,ep,cp (default: all that fit; "
        "pp runs pp_gpipe and pp_1f1b), and on request fsdp_bf16, fsdp_bf16_reduce_bf16, fsdp_reshard_root, "
        "fsdp_no_reshard, fsdp_no_sync, fsdp_sac_op, tp_sac_op, sp_sac_op",
    )
    p.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help="also profile one step of each layout into this folder: per rank a profiler trace, a snapshot-shaped "
        "memory pickle and the logged step time (the files meshplan compare reads)",
    )
    g = p.add_argument_group("tiny model (default 4 layers, hidden 32, 8 heads, 4 KV heads, seq 16, micro-batch 2)")
    g.add_argument(
        "--hidden", type=_positive_int, default=None, help="hidden size; head dim = hidden / heads (default: 32)"
    )
    g.add_argument("--layers", type=_positive_int, default=None, help="transformer layers (default: 4)")
    g.add_argument("--heads", type=_positive_int, default=None, help="attention heads (default: 8)")
    g.add_argument("--kv-heads", type=_positive_int, default=None, help="KV heads (default: 4)")
    g.add_argument("--seq", type=_positive_int, default=None, help="sequence length [tokens] (default: 16)")
    g.add_argument(
        "--micro-batch", type=_positive_int, default=None, help="sequences per micro-batch [sequences] (default: 2)"
    )

    p = command("ui", "the web explorer: the engine's answers as interactive pages in a local browser")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--allow-remote", action="store_true", help="allow a --host other machines can reach")
    p.add_argument("--port", type=_port, default=0, help="port to listen on (default: a free one)")
    p.add_argument("--open", action="store_true", help="open the explorer in the default browser")
