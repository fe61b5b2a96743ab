"""What each ``meshplan`` command does with its parsed flags: build the request, call one report.

Heavy modules are imported inside the command that needs them, so start-up stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from meshplan.cli.parser import EXPORT_CONDITIONS, PIN_FIELDS
from meshplan.cli.support import (
    UsageError,
    check_output,
    save_json,
    search_progress,
    validate_progress,
    write_export,
)


def _finetune_request(args: argparse.Namespace) -> Any:
    from meshplan.reports.typed import finetune_request

    return finetune_request(vars(args))


def _layout_request(args: argparse.Namespace) -> Any:
    from meshplan.reports.typed import layout_request

    return layout_request(vars(args))


def _workload_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.typed import workload_kwargs

    return workload_kwargs(vars(args))


def _cost_request(args: argparse.Namespace) -> Any:
    from meshplan.reports.cost import cost_request

    return cost_request(vars(args))


def _cmd_params(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.params import params_report

    return params_report(args.model, finetune=_finetune_request(args))


def _conditions(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.typed import conditions

    return conditions(vars(args))


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


def _cmd_estimate(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.typed import estimate_from_values

    return estimate_from_values(vars(args))


def _cmd_collectives(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.estimate import collectives_report

    size = None if args.size_mb is None else args.size_mb * 1e6
    return collectives_report(
        model=args.model, size_bytes=size, group=args.group, seq=args.seq, micro_batch=args.micro_batch
    )


def _cmd_validate(args: argparse.Namespace) -> dict[str, Any]:
    if args.memory:
        from meshplan.validation.memory import validate_memory

        return validate_memory()
    if args.serving:
        from meshplan.validation.serving import validate_serving

        return validate_serving()
    from meshplan.validation.training import validate

    with validate_progress(args):
        return validate(args.source, profile=args.profile)


def _cmd_calibrate(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.validation.calibrate import calibrate_report

    return calibrate_report(args.runs, out=args.out, force=args.force)


def _cmd_compare(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.compare import compare_report

    files = {k: getattr(args, k) for k in ("trace", "snapshot", "logged", "out", "append", "force")}
    return compare_report(vars(args), **files)


def _cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    check_output(args, "save", "--save")
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
        nics_per_node=args.nics_per_node,
        oversubscription=args.oversubscription,
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
        cost=_cost_request(args),
    )
    if args.save:
        save_json(args, result)
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


SERVING_FLAGS = ("weights_dtype", "kv_dtype", "context", "gpu_memory_utilization")


SHARED_FLAGS = ("model", "gpu", "gpus", "from_plan", "out", "force", "model_path", "tp", "pp", "ep", "json")


EXPORT_IGNORES = ("optimizer", "optimizer_bytes", "attention")
"""Workload flags export takes (they come with the layout flags) but no engine configuration carries."""


FROM_PLAN_KEEPS = ("engine", "from_plan", "out", "force", "model_path", "precision", "json", "command")
"""What ``export --from-plan`` still reads from the command line: the rest comes from the saved plan."""


def _ignored_flags(args: argparse.Namespace) -> list[str]:
    """Flags given to ``export`` that it would ignore: serving flags on a trainer and back, workload flags no
    engine takes, and with --from-plan everything the saved plan decides."""
    from meshplan.cli.parser import build_parser

    defaults = vars(build_parser().parse_args(["export", args.engine]))
    serving = args.engine in SERVING_ENGINES
    given = [k for k, v in vars(args).items() if k in defaults and v != defaults[k]]
    if args.from_plan:
        ignored = [k for k in given if k not in FROM_PLAN_KEEPS]
    else:
        ignored = [
            k for k in given if k not in SHARED_FLAGS and ((k in SERVING_FLAGS) != serving or k in EXPORT_IGNORES)
        ]
    return ["MODEL" if k == "model" else "--" + k.replace("_", "-") for k in ignored]


def _export_serving(args: argparse.Namespace) -> dict[str, Any]:
    """A server's flags from MODEL --gpu --gpus and the serving flags."""
    from meshplan.reports.export import export_serving

    if not (args.model and args.gpu and args.gpus):
        raise UsageError(f"meshplan export {args.engine}: give MODEL --gpu --gpus and serving flags")
    return export_serving(
        args.engine,
        args.model,
        gpu=args.gpu,
        gpus=args.gpus,
        tp=args.tp,
        pp=args.pp,
        ep=args.ep,
        dtype=args.weights_dtype,
        kv_dtype=args.kv_dtype,
        context=args.context,
        gpu_memory_utilization=args.gpu_memory_utilization,
        model_path=args.model_path,
    )


def _export_training(args: argparse.Namespace) -> dict[str, Any]:
    """A training engine's configuration from a saved plan (--from-plan) or from MODEL and the layout flags."""
    from meshplan.reports.export import export_training, load_saved_plan

    if args.from_plan:
        saved = load_saved_plan(args.from_plan)
        return export_training(
            args.engine,
            saved["model"],
            gpu=saved["gpu"],
            gpus=saved["gpus"],
            layout=saved["layout"],
            seq=saved["seq"],
            global_batch=saved["global_batch"],
            precision=args.precision,
            model_path=args.model_path,
            conditions=saved["conditions"],
            plan_file=args.from_plan,
        )
    if not (args.model and args.gpu and args.gpus):
        raise UsageError(f"meshplan export {args.engine}: give MODEL --gpu --gpus and layout flags, or --from-plan")
    return export_training(
        args.engine,
        args.model,
        gpu=args.gpu,
        gpus=args.gpus,
        layout=_layout_request(args),
        seq=args.seq,
        global_batch=args.global_batch,
        precision=args.precision,
        model_path=args.model_path,
        conditions={k: getattr(args, k) for k in EXPORT_CONDITIONS},
    )


def _replan_advice(args: argparse.Namespace, ignored: list[str]) -> str:
    """What to run to get what the flags ``--from-plan`` overrides ask for: the planner for this engine, with
    the fleet, sequence and batch given and every other flag the planner takes (pins) added."""
    from meshplan.cli.parser import build_parser
    from meshplan.reports.export import load_saved_plan
    from meshplan.reports.export_advice import replan_command

    saved = load_saved_plan(args.from_plan)
    plan_argv = ["plan", "m", "--gpu", "g", "--gpus", "1", "--seq", "1", "--global-batch-tokens", "1"]
    plan_dests = vars(build_parser().parse_args(plan_argv))
    fleet = {k: getattr(args, k) if "--" + k in ignored else saved[k] for k in ("gpu", "gpus", "seq")}
    batch = args.global_batch if "--global-batch" in ignored else saved["global_batch"]
    pins: list[str] = []
    for flag in ignored:
        dest = flag.removeprefix("--").replace("-", "_")
        if flag == "MODEL" or dest in ("gpu", "gpus", "seq", "global_batch") or dest not in plan_dests:
            continue
        value = getattr(args, dest)
        pins += [flag] if value is True else [] if value is False else [flag, str(value)]
    command = replan_command(
        args.engine,
        args.model if "MODEL" in ignored else saved["model"],
        gpu=fleet["gpu"],
        gpus=fleet["gpus"],
        seq=fleet["seq"],
        global_batch_tokens=batch * fleet["seq"],
        precision=args.precision,
        pins=tuple(pins),
    )
    return f"drop them, or plan again with them: {command}"


def _cmd_export(args: argparse.Namespace) -> dict[str, Any]:
    ignored = _ignored_flags(args)
    if ignored and args.from_plan and args.engine not in SERVING_ENGINES:
        raise UsageError(
            f"meshplan export {args.engine}: --from-plan sets what {', '.join(ignored)} would; "
            + _replan_advice(args, ignored)
        )
    if ignored and args.from_plan:
        raise UsageError(
            f"meshplan export {args.engine}: --from-plan sets what {', '.join(ignored)} would; drop them, or give "
            "MODEL --gpu --gpus and the serving flags without --from-plan"
        )
    if ignored:
        kind = "a serving" if args.engine in SERVING_ENGINES else "a training"
        raise UsageError(f"meshplan export {args.engine}: {kind} engine ignores {', '.join(ignored)}; drop them")
    if args.engine in SERVING_ENGINES and args.from_plan:
        from meshplan.reports.export import export_serve_plan

        result = export_serve_plan(args.engine, args.from_plan, model_path=args.model_path)
    elif args.engine in SERVING_ENGINES:
        result = _export_serving(args)
    else:
        result = _export_training(args)
    if args.out:
        result["written"] = write_export(result, args)
    return result


def _cmd_ui(args: argparse.Namespace) -> None:
    try:
        from meshplan.server.app import serve
    except ImportError as exc:
        raise UsageError(
            f"meshplan ui: the web explorer needs the [web] extra: pip install 'meshplan[web]' ({exc})"
        ) from None
    serve(host=args.host, port=args.port, open_browser=args.open, allow_remote=args.allow_remote)


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
        trace_dir=args.trace,
    )


def _cmd_fit(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.bills import fit_report

    return fit_report(
        args.model,
        gpu=args.gpu,
        gpus=args.gpus,
        dtype=args.weights_dtype,
        finetune=_finetune_request(args),
        seq=args.seq,
        precision=args.precision,
        headroom=args.headroom,
        kernels=args.kernels,
        conditions={"stack": args.stack},
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
        dtype=args.weights_dtype,
        kv_dtype=args.kv_dtype,
        context=args.context,
        gpu_memory_utilization=args.gpu_memory_utilization,
        node_size=args.node_size,
    )


SERVE_KEYS: tuple[str, ...] = ("tp", "pp", "ep", "dp_attention", "replicas", "weights_dtype", "kv_dtype", "quant")
SERVE_KEYS += ("engine", "max_batch", "max_num_tokens", "num_requests", "cuda_graph_padding", "disaggregate")
SERVE_KEYS += ("batch", "int4_group_size", "launch", "capacity_scheduler")
SERVE_KEYS += ("speculative", "spec_acceptance", "draft_model", "prefix_hit_rate", "node_size")


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
        price_per_gpu_hour=args.price_per_gpu_hour,
        **{k: getattr(args, k) for k in SERVE_KEYS},
    )


def _cmd_serve_plan(args: argparse.Namespace) -> dict[str, Any]:
    from meshplan.reports.serve_plan import serve_plan_report
    from meshplan.reports.typed import serve_plan_kwargs

    check_output(args, "save", "--save")
    if args.save and args.speculative:
        raise ValueError("--save writes a plan to export, and exports set no drafting flags: drop --speculative")
    result = serve_plan_report(args.model, gpu=args.gpu, gpus=args.gpus, top=args.top, **serve_plan_kwargs(vars(args)))
    if args.save:
        save_json(args, result)
    return result


COMMANDS: dict[str, Callable[[argparse.Namespace], dict[str, Any] | None]] = {
    "list": _cmd_list,
    "params": _cmd_params,
    "memory": _cmd_memory,
    "stacks": _cmd_stacks,
    "estimate": _cmd_estimate,
    "collectives": _cmd_collectives,
    "validate": _cmd_validate,
    "calibrate": _cmd_calibrate,
    "compare": _cmd_compare,
    "plan": _cmd_plan,
    "recipe": _cmd_recipe,
    "export": _cmd_export,
    "fit": _cmd_fit,
    "serving": _cmd_serving,
    "serve": _cmd_serve,
    "serve-plan": _cmd_serve_plan,
    "check": _cmd_check,
    "ui": _cmd_ui,
}
"""Each subcommand's handler, by the name cli/parser.py gives it."""
