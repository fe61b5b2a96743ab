"""Exports: a plan becomes the launch configuration of a real engine.

Training exports take the plan's specs; serving exports take a :class:`ServingPlan`, the handful of numbers
a server needs. Each returns an :class:`Export` (files, one command line, notes) or raises
:class:`UnsupportedByEngine` naming what the engine lacks and the closest plan it can run.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Protocol

from meshplan.exports.common import (
    DisaggregatedPlan,
    Engine,
    Export,
    ServingPlan,
    UnsupportedByEngine,
    check_model_path,
    model_path_error,
)
from meshplan.exports.deepspeed import export_deepspeed
from meshplan.exports.megatron import export_megatron
from meshplan.exports.sglang import export_sglang, export_sglang_disaggregated
from meshplan.exports.torchtitan import export_torchtitan
from meshplan.exports.trtllm import export_trtllm
from meshplan.exports.vllm import export_vllm, export_vllm_disaggregated
from meshplan.spec.layout import Layout
from meshplan.spec.model import ModelSpec
from meshplan.spec.workload import Workload


class TrainingExporter(Protocol):
    def __call__(
        self,
        model: ModelSpec,
        layout: Layout,
        workload: Workload,
        *,
        model_path: str | None = None,
        predicted: Mapping[str, float] | None = None,
        gpus_per_node: int = 8,
    ) -> Export: ...


class ServingExporter(Protocol):
    def __call__(self, plan: ServingPlan, *, predicted: Mapping[str, float] | None = None) -> Export: ...


class DisaggregatedExporter(Protocol):
    def __call__(self, plan: DisaggregatedPlan, *, predicted: Mapping[str, float] | None = None) -> Export: ...


TRAINING_EXPORTERS: Mapping[Engine, TrainingExporter] = MappingProxyType(
    {Engine.TORCHTITAN: export_torchtitan, Engine.MEGATRON: export_megatron, Engine.DEEPSPEED: export_deepspeed}
)
SERVING_EXPORTERS: Mapping[Engine, ServingExporter] = MappingProxyType(
    {Engine.VLLM: export_vllm, Engine.SGLANG: export_sglang, Engine.TRTLLM: export_trtllm}
)
DISAGGREGATED_EXPORTERS: Mapping[Engine, DisaggregatedExporter] = MappingProxyType(
    {Engine.VLLM: export_vllm_disaggregated, Engine.SGLANG: export_sglang_disaggregated}
)
"""Engines whose launchers express split prefill and decode pools (TensorRT-LLM's disaggregated server
takes a YAML of context and generation servers meshplan does not write)."""

__all__ = [
    "DISAGGREGATED_EXPORTERS",
    "SERVING_EXPORTERS",
    "TRAINING_EXPORTERS",
    "DisaggregatedExporter",
    "DisaggregatedPlan",
    "Engine",
    "Export",
    "ServingExporter",
    "ServingPlan",
    "TrainingExporter",
    "UnsupportedByEngine",
    "check_model_path",
    "export_deepspeed",
    "export_megatron",
    "export_sglang",
    "export_sglang_disaggregated",
    "export_torchtitan",
    "export_trtllm",
    "export_vllm",
    "export_vllm_disaggregated",
    "model_path_error",
]
