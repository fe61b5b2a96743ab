"""The ``meshplan`` command: parse arguments, call a report, print a table or JSON.

Bad input exits with code 2 and one line on stderr. Heavy modules are
imported inside the command that needs them, so start-up stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from meshplan.cli_support import UsageError, check_numbers, error_line, interrupted, save_json, search_progress


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


_UNSET: Any = object()


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


def add_fields(p: argparse.ArgumentParser | Any, *names: str, required: bool = False, default: Any = _UNSET) -> None:
    """Flags for schema fields (spec/requests.py): type, bounds, choices, unit and help come from there."""
    from meshplan.spec.requests import field

    for name in names:
        f = field(name)
        value = f.default if default is _UNSET else default
        text = f.describe(value)
        if f.type is bool:
            p.add_argument(f.flag, dest=f.name, action="store_true", default=False, help=text)
            continue
        metavar = "{" + ",".join(f.choices) + "}" if f.choices else f.key.upper()
        p.add_argument(
            f.flag, dest=f.name, type=_flag_type(name), default=value, required=required, help=text, metavar=metavar
        )


def _add_group(p: argparse.ArgumentParser, group: str, **defaults: Any) -> None:
    from meshplan.spec.requests import Group
    from meshplan.spec.requests import group as fields_of

    g = p.add_argument_group(group)
    for f in fields_of(Group(group)):
        add_fields(g, f.name, **({"default": defaults[f.name]} if f.name in defaults else {}))


def _add_fleet(p: argparse.ArgumentParser) -> None:
    add_fields(p, "gpu", "gpus", required=True)


def _add_layout(p: argparse.ArgumentParser) -> None:
    _add_group(p, "layout")
    _add_group(p, "workload")


def _add_finetune(p: argparse.ArgumentParser) -> None:
    _add_group(p, "fine-tuning")


def _finetune_request(args: argparse.Namespace) -> Any:
    """None unless a fine-tuning flag was given (so the default path loads nothing more)."""
    given = (args.finetune, args.freeze, args.lora_targets, args.lora_rank)
    if all(x is None for x in given) and not args.lora_train_embeddings:
        return None
    from meshplan.reports.inputs import FinetuneRequest

    return FinetuneRequest(
        mode=args.finetune or "full",
        lora_rank=args.lora_rank,
        lora_targets=args.lora_targets,
        freeze=args.freeze,
        lora_train_embeddings=args.lora_train_embeddings,
    )


def _layout_request(args: argparse.Namespace) -> Any:
    from meshplan.reports import LayoutRequest
    from meshplan.spec.requests import Group, group

    return LayoutRequest(**{f.name: getattr(args, f.name) for f in group(Group.LAYOUT)})


def _workload_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        seq=args.seq,
        global_batch=args.global_batch,
        precision=args.precision,
        optimizer=args.optimizer,
        optimizer_bytes=args.optimizer_bytes,
        attention=args.attention,
        kernels=args.kernels,
    )


def _cmd_params(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.params import params_report

    return params_report(args.model, finetune=_finetune_request(args))


def _conditions(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.spec.requests import Group, group

    return {f.name: getattr(args, f.name) for f in group(Group.CONDITIONS)}


def _cmd_memory(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.bills import memory_report

    return memory_report(
        args.model,
        gpu=args.gpu,
        gpus=args.gpus,
        layout=_layout_request(args),
        finetune=_finetune_request(args),
        conditions=_conditions(args),
        **_workload_kwargs(args),
    )


def _cmd_stacks(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.listing import stacks_report

    return stacks_report()


def _add_fleet_shape(p: argparse.ArgumentParser) -> None:
    _add_group(p, "fleet shape")


def _cmd_estimate(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.estimate import estimate_report

    return estimate_report(
        finetune=_finetune_request(args),
        model=args.model,
        gpu=args.gpu,
        gpus=args.gpus,
        layout=_layout_request(args),
        node_size=args.node_size,
        scale_out_bandwidth=args.scale_out_bandwidth,
        scale_out=args.scale_out,
        axis_order=args.axis_order,
        tokens=args.tokens,
        conditions=_conditions(args),
        profile=args.profile,
        **_workload_kwargs(args),
    )


def _cmd_collectives(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.estimate import collectives_report

    size = None if args.size_mb is None else args.size_mb * 1e6
    return collectives_report(
        model=args.model, size_bytes=size, group=args.group, seq=args.seq, micro_batch=args.micro_batch
    )


def _cmd_validate(args: argparse.Namespace) -> dict[str, Any]:
    if args.memory:
        from meshplan.validate_memory import validate_memory

        return validate_memory()
    if args.serving:
        from meshplan.validate_serving import validate_serving

        return validate_serving()
    from meshplan.validate import validate

    return validate(args.source, profile=args.profile)


def _cmd_calibrate(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.calibrate import calibrate_report

    return calibrate_report(args.runs, out=args.out)


def _add_serve_flags(p: argparse.ArgumentParser) -> None:
    add_fields(p, "input_len", "output_len", required=True)
    add_fields(p, "tp", default=None)
    add_fields(p, "pp", "ep", "dp_attention", "weights_dtype", "kv_dtype", "quant", "engine", "max_batch")
    add_fields(p, "gpu_memory_utilization", default=None)


PIN_FIELDS: tuple[str, ...] = ("tp", "pp", "vpp", "cp", "ep", "dp_shard", "dp_replicate", "zero", "sp", "recompute")
PIN_FIELDS += ("schedule", "cp_kind", "micro_batch")


def _cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    with search_progress(args):
        return _plan(args)


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.plan import plan_report

    result = plan_report(
        finetune=_finetune_request(args),
        model=args.model,
        gpu=args.gpu,
        gpus=args.gpus,
        seq=args.seq,
        global_batch_tokens=args.global_batch_tokens,
        top=args.top,
        headroom=args.headroom,
        allow_cross_node_tp=args.allow_cross_node_tp,
        objective=args.objective,
        precision=args.precision,
        attention=args.attention,
        kernels=args.kernels,
        node_size=args.node_size,
        scale_out_bandwidth=args.scale_out_bandwidth,
        scale_out=args.scale_out,
        axis_order=args.axis_order,
        profile=args.profile,
        explain=args.explain,
        compare=args.compare,
        tokens=args.tokens,
        days=args.days,
        pins={name: getattr(args, name) for name in PIN_FIELDS},
        training_engine=args.training_engine,
        conditions=_conditions(args),
    )
    if args.save:
        save_json(args.save, result, command="plan")
    return result


def _cmd_list(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.listing import list_report

    return list_report(args.kind)


def _cmd_recipe(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.recipes import list_report, recipe_report

    if args.list or not args.name:
        return list_report()
    with search_progress(args):
        return recipe_report(args.name, rank=not args.no_rank)


SERVING_ENGINES = ("vllm", "sglang", "trtllm")
SERVING_FLAGS = ("dtype", "kv_dtype", "context", "gpu_memory_utilization")
SHARED_FLAGS = ("model", "gpu", "gpus", "from_plan", "out", "model_path", "tp", "pp", "ep", "json")


EXPORT_IGNORES = ("optimizer", "optimizer_bytes", "attention")
"""Workload flags export takes (they come with the layout flags) but no engine configuration carries."""
FROM_PLAN_KEEPS = ("engine", "from_plan", "out", "model_path", "precision", "json", "command", "handler")
"""What ``export --from-plan`` still reads from the command line: the rest comes from the saved plan."""


def _ignored_flags(args: argparse.Namespace) -> list[str]:
    """Flags given to ``export`` that it would ignore: serving flags on a trainer and back, workload flags no
    engine takes, and with --from-plan everything the saved plan decides."""
    defaults = vars(build_parser().parse_args(["export", args.engine]))
    serving = args.engine in SERVING_ENGINES
    given = [k for k, v in vars(args).items() if k in defaults and v != defaults[k]]
    if args.from_plan and not serving:
        ignored = [k for k in given if k not in FROM_PLAN_KEEPS]
    else:
        ignored = [
            k for k in given if k not in SHARED_FLAGS and ((k in SERVING_FLAGS) != serving or k in EXPORT_IGNORES)
        ]
    return ["MODEL" if k == "model" else "--" + k.replace("_", "-") for k in ignored]


def _cmd_export(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.export import export_serving, export_training, load_saved_plan

    ignored = _ignored_flags(args)
    if ignored and args.from_plan and args.engine not in SERVING_ENGINES:
        raise UsageError(f"meshplan export {args.engine}: --from-plan sets what {', '.join(ignored)} would; drop them")
    if ignored:
        kind = "a serving" if args.engine in SERVING_ENGINES else "a training"
        raise UsageError(f"meshplan export {args.engine}: {kind} engine ignores {', '.join(ignored)}")
    if args.engine in SERVING_ENGINES and args.from_plan:
        from meshplan.reports.export import export_serve_plan

        result = export_serve_plan(args.engine, args.from_plan, model_path=args.model_path)
    elif args.engine in SERVING_ENGINES:
        if not (args.model and args.gpu and args.gpus):
            raise UsageError(f"meshplan export {args.engine}: give MODEL --gpu --gpus and serving flags")
        result = export_serving(
            args.engine,
            args.model,
            gpu=args.gpu,
            gpus=args.gpus,
            tp=None if args.tp == 1 and args.pp == 1 else args.tp,
            pp=args.pp,
            ep=args.ep,
            dtype=args.dtype,
            kv_dtype=args.kv_dtype,
            context=args.context,
            gpu_memory_utilization=args.gpu_memory_utilization,
            model_path=args.model_path,
        )
    elif args.from_plan:
        saved = load_saved_plan(args.from_plan)
        result = export_training(
            args.engine,
            saved["model"],
            gpu=saved["gpu"],
            gpus=saved["gpus"],
            layout=saved["layout"],
            seq=saved["seq"],
            global_batch=saved["global_batch"],
            precision=args.precision,
            model_path=args.model_path,
        )
    else:
        if not (args.model and args.gpu and args.gpus):
            raise UsageError(f"meshplan export {args.engine}: give MODEL --gpu --gpus and layout flags, or --from-plan")
        result = export_training(
            args.engine,
            args.model,
            gpu=args.gpu,
            gpus=args.gpus,
            layout=_layout_request(args),
            seq=args.seq,
            global_batch=args.global_batch,
            precision=args.precision,
            model_path=args.model_path,
        )
    if args.out:
        from pathlib import Path

        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in result["files"].items():
            (folder / name).write_text(text, encoding="utf-8")
        (folder / "launch.sh").write_text("#!/bin/sh\n" + result["command"] + "\n", encoding="utf-8")
        result["written"] = sorted([*result["files"], "launch.sh"])
    return result


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in [0, 65535], got {value}")
    return value


def _cmd_ui(args: argparse.Namespace) -> None:
    try:
        from meshplan.server.app import serve
    except ImportError as exc:
        raise UsageError(
            f"meshplan ui: the web explorer needs the [web] extra: pip install 'meshplan[web]' ({exc})"
        ) from None
    serve(host=args.host, port=args.port, open_browser=args.open)


def _cmd_check(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.check import check_report

    if sys.stderr.isatty() and not args.json:  # the runs take 10 s to minutes: say so while they go
        sys.stderr.write(f"running {args.world_size} local torch.distributed processes (Ctrl-C stops them)...")
        sys.stderr.flush()
    try:
        return _check(args, check_report)
    finally:
        if sys.stderr.isatty() and not args.json:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _check(args: argparse.Namespace, check_report: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    return check_report(
        world_size=args.world_size,
        layouts=args.layouts,
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        kv_heads=args.kv_heads,
        seq=args.seq,
        micro_batch=args.micro_batch,
    )


def _cmd_fit(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.bills import fit_report

    return fit_report(
        args.model,
        gpu=args.gpu,
        gpus=args.gpus,
        dtype=args.dtype,
        finetune=_finetune_request(args),
        seq=args.seq,
        precision=args.precision,
        headroom=args.headroom,
    )


def _cmd_serving(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.bills import serving_report

    return serving_report(
        args.model,
        gpu=args.gpu,
        gpus=args.gpus,
        tp=args.tp,
        pp=args.pp,
        ep=args.ep,
        dtype=args.dtype,
        kv_dtype=args.kv_dtype,
        context=args.context,
        gpu_memory_utilization=args.gpu_memory_utilization,
    )


SERVE_KEYS: tuple[str, ...] = ("tp", "pp", "ep", "dp_attention", "replicas", "weights_dtype", "kv_dtype", "quant")
SERVE_KEYS += ("engine", "max_batch", "disaggregate")


def _cmd_serve(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.serve import serve_report

    return serve_report(
        args.model,
        gpu=args.gpu,
        gpus=args.gpus,
        input_len=args.input_len,
        output_len=args.output_len,
        concurrency=args.concurrency,
        rate=args.rate,
        gpu_memory_utilization=args.gpu_memory_utilization,
        **{k: getattr(args, k) for k in SERVE_KEYS},
    )


def _cmd_serve_plan(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.serve_plan import serve_plan_report

    result = serve_plan_report(
        args.model,
        gpu=args.gpu,
        gpus=args.gpus,
        input_len=args.input_len,
        output_len=args.output_len,
        ttft_p99_s=args.ttft_p99,
        tpot_p99_s=args.tpot_p99,
        objective=args.serve_objective,
        concurrency=args.concurrency,
        engine=args.engine,
        dtypes=args.weights_dtypes.split(",") if args.weights_dtypes else None,
        top=args.top,
        disaggregate=args.search_disaggregated,
    )
    if args.save:
        import json
        from pathlib import Path

        Path(args.save).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


def _run_sources() -> list[str]:
    """The published-run sources ``validate`` holds (catalog/runs/*.toml), listed without loading them."""
    from importlib import resources

    folder = resources.files("meshplan") / "catalog" / "runs"
    return sorted(e.name.removesuffix(".toml") for e in folder.iterdir() if e.name.endswith(".toml"))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="meshplan", description="Plan how a transformer is split across GPUs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(
        name: str, handler: Callable[[argparse.Namespace], dict[str, Any] | None], text: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
        p.set_defaults(handler=handler)
        return p

    p = command("list", _cmd_list, "what the catalog holds: models, GPUs, links or recipes")
    p.add_argument("kind", choices=("models", "gpus", "links", "recipes", "stacks"))

    p = command("params", _cmd_params, "exact parameter counts, total and active per token, by component")
    p.add_argument("model", help="catalog name, model TOML, or a Hugging Face config.json")
    _add_finetune(p)

    p = command("memory", _cmd_memory, "per-GPU training memory, term by term, for a layout")
    p.add_argument("model")
    _add_fleet(p)
    _add_group(p, "layout")
    _add_group(p, "workload", precision=None, attention=None, kernels=None)  # None: the stack's, else the default
    _add_finetune(p)
    _add_group(p, "conditions")

    p = command("stacks", _cmd_stacks, "the training stacks and the conditions each sets (for --stack)")

    p = command("estimate", _cmd_estimate, "step time, MFU, every collective and where it runs, for one layout")
    p.add_argument("model")
    _add_fleet(p)
    _add_group(p, "layout")
    _add_group(p, "workload", precision=None, attention=None, kernels=None)
    _add_finetune(p)
    _add_group(p, "conditions")
    _add_fleet_shape(p)
    add_fields(p, "tokens")

    p = command(
        "collectives", _cmd_collectives, "the bandwidth wall: one all-reduce timed over NVLink, InfiniBand, Ethernet"
    )
    p.add_argument(
        "--model", default=None, help="size the all-reduce as one TP all-reduce of this model (default llama-3.1-70b)"
    )
    p.add_argument("--size-mb", type=float, default=None, help="buffer size in MB (1e6 bytes) instead")
    p.add_argument("--group", type=_positive_int, default=8, help="ranks in the ring")
    add_fields(p, "seq", default=8192)
    add_fields(p, "micro_batch")

    p = command("validate", _cmd_validate, "predictions against published measured runs, with the error of each")
    p.add_argument("--source", default=None, help=f"one source only: {', '.join(_run_sources())}")
    p.add_argument("--serving", action="store_true", help="the published serving measurements instead")
    p.add_argument(
        "--memory", action="store_true", help="the published peak-memory figures, and the fit of published layouts"
    )
    add_fields(p, "profile")

    p = command("calibrate", _cmd_calibrate, "fit a cluster profile (--profile) from your own measured runs")
    p.add_argument(
        "runs",
        help="RUNS.json: a list of {args: [meshplan estimate arguments], step_time_s or tokens_per_s_per_gpu, "
        "peak_memory_bytes (optional)}",
    )
    p.add_argument("--out", default=None, help="write the profile TOML to this file (for --profile)")

    p = command("plan", _cmd_plan, "search every layout: the fastest that fit, why they win, why the rest lost")
    p.add_argument("model")
    _add_fleet(p)
    add_fields(p, "seq", "global_batch_tokens", required=True)
    add_fields(p, "top", "headroom", "allow_cross_node_tp", "objective", "tokens", "days")
    p.add_argument("--explain", action="store_true", help="compare the winner with the runner-up term by term")
    p.add_argument(
        "--compare", default=None, help="also compare with a named layout, e.g. tp=8,pp=16,dp=128 (layout flags' names)"
    )
    p.add_argument("--save", default=None, help="write the JSON result to this file (for meshplan export)")
    add_fields(p, "precision", "attention", "kernels", default=None)  # None: the stack's, else the default
    _add_fleet_shape(p)
    _add_finetune(p)
    pins = p.add_argument_group("pins: keep only layouts with these layout values (none by default)")
    add_fields(pins, *PIN_FIELDS, default=None)
    add_fields(pins, "training_engine")
    _add_group(p, "conditions")

    p = command("recipe", _cmd_recipe, "published recipes: evaluated, and ranked against the planner's search")
    p.add_argument("name", nargs="?", default=None, help="recipe name (meshplan recipe --list)")
    p.add_argument("--list", action="store_true", help="list the recipes and their factors")
    p.add_argument("--no-rank", action="store_true", help="skip the search that ranks the published layout")

    p = command(
        "export",
        _cmd_export,
        "a plan as the launch configuration of torchtitan, Megatron-LM, DeepSpeed, vLLM, SGLang or TensorRT-LLM",
    )
    p.add_argument("engine", choices=("torchtitan", "megatron", "deepspeed", "vllm", "sglang", "trtllm"))
    p.add_argument("model", nargs="?", default=None)
    add_fields(p, "gpu", "gpus")
    p.add_argument("--from-plan", default=None, help="a file written by meshplan plan --save (serve-plan for servers)")
    p.add_argument("--out", default=None, help="write the files and launch.sh into this folder")
    p.add_argument("--model-path", default=None, help="checkpoint or Hugging Face path to put in the config")
    _add_layout(p)
    _add_group(p, "serving")

    p = command(
        "fit",
        _cmd_fit,
        "weights split over N GPUs: per-GPU share, free memory, fewest GPUs; with --finetune, the largest "
        "micro-batch and sequence that fit",
    )
    p.add_argument("model")
    _add_fleet(p)
    add_fields(p, "dtype", "seq", "precision", "headroom")
    _add_finetune(p)

    p = command("serving", _cmd_serving, "serving memory: weights, KV cache per token, tokens and sequences that fit")
    p.add_argument("model")
    _add_fleet(p)
    add_fields(p, "tp", default=None)
    add_fields(p, "pp", "ep")
    _add_group(p, "serving")

    p = command("serve", _cmd_serve, "serving speed under load: TTFT p50/p99, TPOT, tokens/s per GPU and per user")
    p.add_argument("model")
    _add_fleet(p)
    _add_serve_flags(p)
    add_fields(p, "replicas", "disaggregate")
    load = p.add_mutually_exclusive_group(required=True)
    add_fields(load, "concurrency", "rate")

    p = command(
        "serve-plan", _cmd_serve_plan, "every serving layout, dtype and batch cap ranked under TTFT/TPOT targets"
    )
    p.add_argument("model")
    _add_fleet(p)
    add_fields(p, "input_len", "output_len", required=True)
    add_fields(p, "ttft_p99", "tpot_p99", "serve_objective", "concurrency", "engine", "weights_dtypes", "top")
    p.add_argument("--save", default=None, help="write the JSON result to this file (for meshplan export)")
    add_fields(p, "search_disaggregated")

    p = command(
        "check",
        _cmd_check,
        "run a tiny model on local torch.distributed processes and hold every measured byte and collective "
        "against meshplan's prediction (needs the torch extra)",
    )
    p.add_argument("--world-size", type=_positive_int, default=2, help="local processes (gloo), at least 2")
    p.add_argument(
        "--layouts",
        default=None,
        help="comma-separated, as the report names them: ddp,fsdp,tp,sp,fsdp_tp,pp,ep,cp (default: all that fit; "
        "pp runs pp_gpipe and pp_1f1b), and fsdp_bf16, fsdp_bf16_reduce_bf16, fsdp_reshard_root, fsdp_no_reshard",
    )
    g = p.add_argument_group("tiny model (default 4 layers, hidden 32, 8 heads, 4 KV heads, seq 16, micro-batch 2)")
    g.add_argument("--hidden", type=_positive_int, default=None, help="hidden size (head dim = hidden / heads)")
    g.add_argument("--layers", type=_positive_int, default=None)
    g.add_argument("--heads", type=_positive_int, default=None)
    g.add_argument("--kv-heads", type=_positive_int, default=None)
    g.add_argument("--seq", type=_positive_int, default=None, help="sequence length in tokens")
    g.add_argument("--micro-batch", type=_positive_int, default=None, help="sequences per micro-batch")

    p = command("ui", _cmd_ui, "the web explorer: the engine's answers as interactive pages in a local browser")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=_port, default=0, help="port to listen on (default: a free one)")
    p.add_argument("--open", action="store_true", help="open the explorer in the default browser")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("meshplan: interrupted", file=sys.stderr)
        return 130
    except ImportError as exc:  # numpy turns a Ctrl-C during its import into an ImportError
        if not interrupted(exc):
            raise
        print("meshplan: interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
        check_numbers(args)
        result = args.handler(args)
        if result is None:
            return 0
        text = None if args.json else _render(args.command, result)
    except UsageError as exc:
        print(f"{exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:  # ValueError: a refused input; OSError: a file we were told to use
        print(f"meshplan: error: {error_line(exc)}", file=sys.stderr)
        return 2
    if text is None:
        from meshplan.render import to_json

        text = to_json(result)
    try:
        print(text)
    except BrokenPipeError:  # the reader (head, less) closed the pipe: not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    return exit_code(args.command, result)


def _render(command: str, result: dict[str, Any]) -> str:
    from meshplan.tables import render_table

    return render_table(command, result)


def exit_code(command: str, result: dict[str, Any]) -> int:
    """0, or 1 when a check the command runs did not hold (validate, check)."""
    if command in ("validate", "check"):
        return 0 if result.get("all_ok") else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
