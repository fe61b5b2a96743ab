"""torchtitan export: a Python config function for `torchtitan.train`, and its torchrun launcher.

Target: torchtitan 0.3.0, the release the registry serves. Its configuration is Python: a
``config_registry`` function returns a ``Trainer.Config`` (torchtitan/config/manager.py loads it
with ``--module M --config F``; TOML job files are gone). The export writes such a module: it
calls the model's own registered recipe (e.g. ``llama3_405b``) and overrides only what the plan
decides, so the recipe's optimizer, data and checkpoint settings stay as torchtitan ships them.

How the plan maps (torchtitan/config/configs.py, distributed/fsdp.py, parallel_dims.py):
- dp_replicate / dp_shard -> data_parallel_replicate_degree / data_parallel_shard_degree (HSDP);
  ZeRO-3 is FSDP2 with fsdp_reshard_after_forward="always", ZeRO-2 is "never" (parameters stay
  gathered from forward to backward). FSDP2 always shards gradients, so ZeRO-1 has no equivalent. FSDP2
  shards over dp_shard x cp (its dp_shard_cp mesh), so a layout with CP > 1 is ZeRO-2 or 3 there.
- vpp -> pipeline_parallel_layers_per_stage, chosen so the stage count is pp * vpp (embedding and
  output count as one layer each unless that breaks the split).
- CP all-gathers keys and values (distributed/context_parallel); EP borrows ranks from dp_shard x cp x tp.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from meshplan.exports.common import (
    RENDEZVOUS_ENDPOINT,
    Engine,
    Export,
    UnsupportedByEngine,
    check_experts,
    effective_zero,
    grad_accumulation_steps,
    nodes,
    one_line,
    predicted_lines,
    shell_join,
    shell_script,
)
from meshplan.spec.layout import ContextParallel, Layout, Recompute, Schedule, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import OptimizerKind, Workload
from meshplan.units import DType

ENGINE_VERSION = "0.3.0"
ENGINE = Engine.TORCHTITAN
CONFIG_MODULE = "meshplan_torchtitan"
CONFIG_FUNCTION = "meshplan_plan"
SCRIPT = "train_torchtitan.sh"


@dataclass(frozen=True, slots=True, kw_only=True)
class Recipe:
    """A model torchtitan registers: its package, recipe function and model flavor."""

    module: str
    function: str
    flavor: str
    float8: bool = False
    """The recipe already converts linears to float8."""


# (num_layers, hidden) -> recipe, from torchtitan 0.3.0 models/*/__init__.py and config_registry.py.
RECIPES: dict[tuple[int, int], Recipe] = {
    (32, 4096): Recipe(module="llama3", function="llama3_8b", flavor="8B"),
    (80, 8192): Recipe(module="llama3", function="llama3_70b", flavor="70B"),
    (126, 16384): Recipe(module="llama3", function="llama3_405b", flavor="405B", float8=True),
    (28, 1024): Recipe(module="qwen3", function="qwen3_0_6b", flavor="0.6B"),
    (28, 2048): Recipe(module="qwen3", function="qwen3_1_7b", flavor="1.7B"),
    (40, 5120): Recipe(module="qwen3", function="qwen3_14b", flavor="14B"),
    (64, 5120): Recipe(module="qwen3", function="qwen3_32b", flavor="32B"),
    (48, 2048): Recipe(module="qwen3", function="qwen3_30b_a3b", flavor="30B-A3B"),
    (27, 2048): Recipe(module="deepseek_v3", function="deepseek_v3_16b", flavor="16B"),
    (61, 7168): Recipe(module="deepseek_v3", function="deepseek_v3_671b", flavor="671B"),
    (24, 2880): Recipe(module="gpt_oss", function="gpt_oss_20b", flavor="20b"),
    (36, 2880): Recipe(module="gpt_oss", function="gpt_oss_120b", flavor="120b"),
}

SCHEDULES = {
    Schedule.GPIPE: "GPipe",
    Schedule.ONE_F_ONE_B: "1F1B",
    Schedule.INTERLEAVED: "Interleaved1F1B",
}
"""meshplan schedule -> torch.distributed.pipelining schedule name."""

_RESHARD = {ZeroStage.GRADIENTS: "never", ZeroStage.PARAMETERS: "always"}
_CHECKPOINTING = {Recompute.SELECTIVE: "SelectiveAC", Recompute.FULL: "FullAC"}
"""meshplan recompute -> torchtitan activation-checkpointing policy (none: ``None``)."""


def recipe_for(model: ModelSpec) -> Recipe:
    """The registered torchtitan recipe of a model with the same depth and width."""
    recipe = RECIPES.get((model.num_layers, model.hidden))
    if recipe is None:
        known = ", ".join(r.function for r in RECIPES.values())
        raise UnsupportedByEngine(
            ENGINE,
            f"build {model.name} ({model.num_layers} layers x {model.hidden}): torchtitan {ENGINE_VERSION} "
            "registers no such model",
            f"one of its recipes ({known})",
        )
    return recipe


def _layers_per_stage(num_layers: int, layout: Layout) -> tuple[int, int]:
    """(layers per stage, layers the embedding and the output each count for) giving pp * vpp stages."""
    stages = layout.pp * layout.vpp
    for extra in (1, 0):
        total = num_layers + 2 * extra
        per_stage = -(-total // stages)
        if -(-total // per_stage) == stages:
            return per_stage, extra
    raise UnsupportedByEngine(
        ENGINE, f"cut {num_layers} layers into pp*vpp = {stages} stages of near-equal size", "fewer stages"
    )


def _check(model: ModelSpec, layout: Layout, workload: Workload) -> None:
    check_experts(ENGINE, model, layout, workload)
    if effective_zero(layout) is ZeroStage.OPTIMIZER:
        raise UnsupportedByEngine(
            ENGINE,
            "shard only the optimizer state (ZeRO-1): FSDP2 shards gradients too",
            'zero=2 (fsdp_reshard_after_forward="never")',
        )
    if layout.cp > 1 and layout.zero is ZeroStage.NONE:
        raise UnsupportedByEngine(
            ENGINE,
            f"keep the training state whole over dp_shard*cp = {layout.dp_shard * layout.cp} ranks: it applies "
            "FSDP2 over the data and context-parallel ranks together",
            "zero=2 or zero=3",
        )
    if layout.pp > 1 and layout.schedule not in SCHEDULES:
        raise UnsupportedByEngine(
            ENGINE,
            f"run the {layout.schedule.name.lower()} schedule with one stage per rank "
            "(its ZBVZeroBubble and DualPipeV use two stages per rank)",
            "schedule=1f1b",
        )
    if layout.cp > 1 and layout.cp_kind is ContextParallel.RING:
        raise UnsupportedByEngine(ENGINE, "pass keys and values around a ring", "cp_kind=all-gather")
    borrowed = layout.dp_shard * layout.cp * layout.tp
    if borrowed % layout.ep:
        raise UnsupportedByEngine(
            ENGINE, f"carve ep={layout.ep} out of dp_shard*cp*tp = {borrowed}", "an ep that divides dp_shard*cp*tp"
        )
    if workload.precision.compute not in (DType.BF16, DType.FP8, DType.FP32, DType.TF32):
        raise UnsupportedByEngine(ENGINE, f"compute in {workload.precision.compute}", "precision bf16")
    if workload.conditions.fp8_recipe is not None or workload.conditions.fp8_all_gather:
        raise UnsupportedByEngine(
            ENGINE, "take an FP8 recipe from this export (its float8 section is not pinned here)", "no --fp8-recipe"
        )
    if workload.conditions.stage_split.stated:
        raise UnsupportedByEngine(
            ENGINE, "state the layers of the first and last stage (it cuts stages of near-equal size)", "an even split"
        )


def _parallelism_lines(model: ModelSpec, layout: Layout) -> list[str]:
    values: dict[str, object] = {
        "data_parallel_replicate_degree": layout.dp_replicate,
        "data_parallel_shard_degree": layout.dp_shard,
        "tensor_parallel_degree": layout.tp,
        "enable_sequence_parallel": layout.sp or layout.tp == 1,
        "pipeline_parallel_degree": layout.pp,
        "context_parallel_degree": layout.cp,
        "expert_parallel_degree": layout.ep,
    }
    if effective_zero(layout) in _RESHARD:
        values["fsdp_reshard_after_forward"] = _RESHARD[effective_zero(layout)]
    if layout.pp > 1:
        per_stage, extra = _layers_per_stage(model.num_layers, layout)
        values["pipeline_parallel_schedule"] = SCHEDULES[layout.schedule]
        values["pipeline_parallel_layers_per_stage"] = per_stage
        values["pipeline_parallel_first_stage_less_layers"] = extra
        values["pipeline_parallel_last_stage_less_layers"] = extra
        values["pipeline_parallel_microbatch_size"] = layout.micro_batch
    return [f"    config.parallelism.{key} = {value!r}" for key, value in values.items()]


def _training_lines(layout: Layout, workload: Workload) -> list[str]:
    # With PP one pass carries all of a rank's micro-batches; without, one pass is one micro-batch.
    local = workload.global_batch // layout.dp if layout.pp > 1 else layout.micro_batch
    param = "float32" if workload.precision.compute in (DType.FP32, DType.TF32) else "bfloat16"
    values: dict[str, object] = {
        "local_batch_size": local,
        "global_batch_size": workload.global_batch,
        "seq_len": workload.seq_len,
        "mixed_precision_param": param,
        "mixed_precision_reduce": "float32",
    }
    if layout.pp > 1 or layout.ep > 1:
        values["disable_cuda_graphs"] = True  # the 0.3.0 trainer refuses CUDA graphs with PP and most EP paths
    return [f"    config.training.{key} = {value!r}" for key, value in values.items()]


def _model_lines(recipe: Recipe, workload: Workload) -> tuple[list[str], list[str]]:
    """(imports, body lines) that swap the recipe's float8 setting when the plan's precision differs."""
    fp8 = workload.precision.compute is DType.FP8
    if fp8 == recipe.float8:
        return [], []
    registry = f"from torchtitan.models.{recipe.module} import model_registry"
    if not fp8:
        return [registry], [f"    config.model_spec = model_registry({recipe.flavor!r})"]
    converter = (
        "Float8LinearConverter.Config(filter_fqns=['lm_head'], "
        "model_compile_enabled=config.compile.enable and 'model' in config.compile.components)"
    )
    imports = [registry, "from torchtitan.components.quantization import Float8LinearConverter"]
    return imports, [f"    config.model_spec = model_registry({recipe.flavor!r}, converters=[{converter}])"]


def _docstring_text(text: str) -> str:
    """``text`` as it may stand in a triple-quoted docstring: on one line, its backslashes and quotes escaped."""
    return one_line(text).replace("\\", "\\\\").replace('"', '\\"')


def config_module(
    model: ModelSpec,
    layout: Layout,
    workload: Workload,
    *,
    model_path: str | None = None,
    predicted: Mapping[str, float] | None = None,
) -> str:
    """The Python source of the config module `torchtitan.train --module` loads."""
    _check(model, layout, workload)
    grad_accumulation_steps(layout, workload)
    recipe = recipe_for(model)
    model_imports, model_body = _model_lines(recipe, workload)
    policy = _CHECKPOINTING.get(layout.recompute)
    name = _docstring_text(model.name)
    head = [
        f'"""torchtitan {ENGINE_VERSION} config from meshplan: {name} on {layout.num_gpus} GPUs.',
        "",
        f"Launch: torchrun ... -m torchtitan.train --module {CONFIG_MODULE} --config {CONFIG_FUNCTION}",
        '"""',
        *predicted_lines(predicted),
        "",
        *([f"from torchtitan.distributed.activation_checkpoint import {policy}"] if policy else []),
        f"from torchtitan.models.{recipe.module}.config_registry import {recipe.function}",
        *model_imports,
        "from torchtitan.trainer import Trainer",
        "",
        "",
        f"def {CONFIG_FUNCTION}() -> Trainer.Config:",
        f"    config = {recipe.function}()",
        *model_body,
    ]
    if model_path:
        head.append(f"    config.hf_assets_path = {model_path!r}")
    body = [*_parallelism_lines(model, layout), *_training_lines(layout, workload)]
    body.append(f"    config.activation_checkpoint = {f'{policy}.Config()' if policy else None}")
    return "\n".join([*head, *body, "    return config", ""])


def export_torchtitan(
    model: ModelSpec,
    layout: Layout,
    workload: Workload,
    *,
    model_path: str | None = None,
    predicted: Mapping[str, float] | None = None,
    gpus_per_node: int = 8,
) -> Export:
    """A torchtitan config module for the plan and the torchrun command that runs it."""
    source = config_module(model, layout, workload, model_path=model_path, predicted=predicted)
    num_nodes, per_node = nodes(layout.num_gpus, gpus_per_node)
    tokens = ["torchrun", "--nnodes", str(num_nodes), "--nproc-per-node", str(per_node)]
    if num_nodes > 1:
        tokens += ["--rdzv-backend", "c10d", "--rdzv-endpoint", RENDEZVOUS_ENDPOINT]
    tokens += ["-m", "torchtitan.train", "--module", CONFIG_MODULE, "--config", CONFIG_FUNCTION]
    title = f"torchtitan {ENGINE_VERSION} launcher from meshplan: {model.name} on {layout.num_gpus} GPUs"
    notes = [f"keep {CONFIG_MODULE}.py beside the script (it is put on PYTHONPATH)"]
    if layout.recompute is Recompute.SELECTIVE:
        notes.append("torchtitan's selective checkpointing is per-op (it keeps matmul outputs, recomputes the rest)")
    if workload.optimizer.kind is not OptimizerKind.ADAMW:
        notes.append(f"the recipe's AdamW is kept: set config.optimizer for {workload.optimizer.kind}")
    if layout.ep > 1 and layout.tp > 1:
        notes.append("torchtitan experts borrow the TP ranks: experts are not tensor-parallel inside")
    return Export(
        engine=ENGINE,
        engine_version=ENGINE_VERSION,
        files={
            f"{CONFIG_MODULE}.py": source,
            SCRIPT: shell_script(title=title, predicted=predicted, env={"PYTHONPATH": "."}, tokens=tokens),
        },
        command=shell_join(["PYTHONPATH=.", *tokens]),
        notes=tuple(notes),
    )
