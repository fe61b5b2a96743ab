"""A command's inputs as typed, by schema field name, turned into the requests a report takes.

Light to import (the CLI's start-up reads it): the reports and the core load inside the functions that need them.

The CLI's parsed flags (``vars(args)``) and a calibration run's words (spec/argv.py) go through these same
functions, so a run in RUNS.json means exactly what the same words mean on the command line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from meshplan.spec.requests import Field, Group, field, group

if TYPE_CHECKING:
    from meshplan.reports.inputs import FinetuneRequest, LayoutRequest

ESTIMATE_GROUPS = (Group.FLEET, Group.LAYOUT, Group.WORKLOAD, Group.FINETUNE, Group.CONDITIONS, Group.FLEET_SHAPE)
STACK_DEFAULTED = ("precision", "attention", "kernels")
"""Workload fields whose unset value means "the stack's, else the schema's default" on memory, estimate, plan."""


def estimate_fields() -> tuple[Field, ...]:
    """Every field ``meshplan estimate`` takes, in the order its help lists them."""
    return (*(f for g in ESTIMATE_GROUPS for f in group(g)), field("tokens"), *group(Group.COST))


def estimate_defaults() -> dict[str, Any]:
    """Each of those fields' value when it is not given."""
    return {f.name: None if f.name in STACK_DEFAULTED else f.default for f in estimate_fields()}


def finetune_request(values: Mapping[str, Any]) -> FinetuneRequest | None:
    """None unless a fine-tuning field was given (so the default path loads nothing more)."""
    given = (values["finetune"], values["freeze"], values["lora_targets"], values["lora_rank"])
    given += (values.get("qlora_base"), values.get("quant_group_size"))
    if all(x is None for x in given) and not values["lora_train_embeddings"]:
        return None
    from meshplan.reports.inputs import FinetuneRequest  # numpy and the core load only when needed

    return FinetuneRequest(
        mode=values["finetune"] or "full",
        lora_rank=values["lora_rank"],
        lora_targets=values["lora_targets"],
        freeze=values["freeze"],
        lora_train_embeddings=values["lora_train_embeddings"],
        qlora_base=values.get("qlora_base"),
        quant_group_size=values.get("quant_group_size"),
    )


def layout_request(values: Mapping[str, Any]) -> LayoutRequest:
    from meshplan.reports.inputs import LayoutRequest

    layout = {f.name: values[f.name] for f in group(Group.LAYOUT)}
    return LayoutRequest(**(layout | {"tp": layout["tp"] or 1}))  # export leaves tp unset for servers


def workload_kwargs(values: Mapping[str, Any]) -> dict[str, Any]:
    names = ("seq", "global_batch", "precision", "optimizer", "optimizer_bytes", "attention", "kernels")
    return {name: values[name] for name in names}


def conditions(values: Mapping[str, Any]) -> dict[str, Any]:
    return {f.name: values[f.name] for f in group(Group.CONDITIONS)}


def estimate_from_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """``estimate_report`` for the values of every field ``estimate`` takes, and the model."""
    from meshplan.reports.cost import cost_request
    from meshplan.reports.estimate import estimate_report

    return estimate_report(
        finetune=finetune_request(values),
        model=values["model"],
        gpu=values["gpu"],
        gpus=values["gpus"],
        layout=layout_request(values),
        node_size=values["node_size"],
        scale_out_bandwidth=values["scale_out_bandwidth"],
        nics_per_node=values["nics_per_node"],
        oversubscription=values["oversubscription"],
        scale_out=values["scale_out"],
        axis_order=values["axis_order"],
        tokens=values["tokens"],
        conditions=conditions(values),
        profile=values["profile"],
        cost=cost_request(values),
        timeline=bool(values.get("timeline")),
        **workload_kwargs(values),
    )


SERVE_PLAN_FIELDS = ("input_len", "output_len", "ttft_p99", "tpot_p99", "serve_objective", "concurrency", "engine")
SERVE_PLAN_FIELDS += ("weights_dtypes", "search_disaggregated", "allow_quantization", "prefix_hit_rate", "speculative")
SERVE_PLAN_FIELDS += ("spec_acceptance", "launch", "node_size", "capacity_scheduler")
"""The request fields serve-plan takes beside its model, fleet and ``top``: the CLI's flags and the API's query."""
SERVE_PLAN_KEYWORDS = {
    "ttft_p99": "ttft_p99_s",
    "tpot_p99": "tpot_p99_s",
    "serve_objective": "objective",
    "search_disaggregated": "disaggregate",
    "weights_dtypes": "dtypes",
}
"""serve_plan_report's name for a field where it is not the field's own."""


def serve_plan_kwargs(values: Mapping[str, Any]) -> dict[str, Any]:
    """``serve_plan_report``'s keywords from the values of ``SERVE_PLAN_FIELDS`` by field name (the CLI's parsed
    flags, the API's query): one mapping, so a field the CLI takes reaches the search from the API too."""
    out = {SERVE_PLAN_KEYWORDS.get(name, name): values[name] for name in SERVE_PLAN_FIELDS}
    dtypes = out["dtypes"]
    out["dtypes"] = [field("weights_dtype").parse(d) for d in dtypes.split(",")] if dtypes else None
    return out
