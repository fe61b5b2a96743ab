"""Inputs as users state them (names, plain numbers) resolved into specs, with one-line errors."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from meshplan import io
from meshplan.core.finetune import trainable_params, validate_finetune
from meshplan.core.placement import DEFAULT_ORDER, parse_order
from meshplan.spec import requests
from meshplan.spec.cluster import Cluster, Link, LinkKind
from meshplan.spec.conditions import Conditions
from meshplan.spec.finetune import LORA_TARGETS, Finetune, FinetuneMode, QuantBase
from meshplan.spec.layout import ContextParallel, Layout, Recompute, Schedule, ZeroStage
from meshplan.spec.model import ModelSpec
from meshplan.spec.profile import apply_profile, parse_profile
from meshplan.spec.workload import (
    PRECISIONS,
    Attention,
    Framework,
    Kernels,
    Optimizer,
    OptimizerKind,
    Overlap,
    PrecisionPolicy,
    Workload,
)

LAYOUT_ALIASES = {"mb": "micro_batch"}
"""Short keys a layout's ``key=value`` items accept beside the field names."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayoutRequest:
    """A layout as a user states it: unset data-parallel degrees are resolved from the GPU count."""

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1
    expert_tp: int | None = None
    dp_shard: int | None = None
    zero: int = 0
    sp: bool = False
    recompute: str = "none"
    schedule: str | None = None
    cp_kind: str = "ring"
    micro_batch: int = 1
    dp: int | None = None
    """Data-parallel ranks as the user counted them: checked against gpus / (tp * pp * cp), never used as-is."""
    dp_replicate: int | None = None
    """Replicas of the shard group: checked against dp / dp_shard (a plan's JSON layout reads back as it is)."""

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> LayoutRequest:
        """A layout from raw values (a run file's table, ``--compare``'s items), parsed by the schema."""
        layout = requests.group(requests.Group.LAYOUT)
        return cls(**requests.parse_values(values, allowed=layout, what="layout", aliases=LAYOUT_ALIASES))


def choice(enum_type: Any, value: str, what: str) -> Any:
    key = value.strip().lower().replace("-", "_")
    aliases = {"1f1b": "one_f_one_b", "zb": "zero_bubble", "allgather": "all_gather"}
    key = aliases.get(key, key)
    for member in enum_type:
        if member.name.lower() == key:
            return member
    names = ", ".join(m.name.lower().replace("one_f_one_b", "1f1b") for m in enum_type)
    raise ValueError(f"unknown {what} {value!r} (choose from {names})")


def resolve_layout(req: LayoutRequest, *, gpus: int) -> Layout:
    """Turn a user's layout into resolved degrees; dp_replicate takes what is left of the GPUs."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    for name in ("tp", "pp", "cp", "vpp", "ep", "micro_batch"):
        if getattr(req, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(req, name)}")
    model_ranks = req.tp * req.pp * req.cp
    if gpus % model_ranks:
        raise ValueError(f"tp*pp*cp = {req.tp}*{req.pp}*{req.cp} = {model_ranks} does not divide gpus = {gpus}")
    data = gpus // model_ranks
    if req.dp is not None and req.dp != data:
        raise ValueError(
            f"dp={req.dp} does not match the fleet: gpus / (tp*pp*cp) = {gpus} / {model_ranks} = {data} "
            "data-parallel ranks"
        )
    if req.zero not in (0, 1, 2, 3):
        raise ValueError(f"zero must be 0, 1, 2 or 3, got {req.zero}")
    dp_shard = req.dp_shard if req.dp_shard is not None else (data if req.zero else 1)
    if dp_shard < 1 or data % dp_shard:
        raise ValueError(f"dp_shard={dp_shard} must divide the data-parallel ranks gpus/(tp*pp*cp) = {data}")
    if req.dp_replicate is not None and req.dp_replicate != data // dp_shard:
        raise ValueError(
            f"dp_replicate={req.dp_replicate} does not match dp / dp_shard = {data} / {dp_shard} = {data // dp_shard}"
        )
    schedule = req.schedule or ("interleaved" if req.vpp > 1 else "1f1b")
    return Layout(
        tp=req.tp,
        pp=req.pp,
        vpp=req.vpp,
        cp=req.cp,
        ep=req.ep,
        expert_tp=req.expert_tp,
        dp_shard=dp_shard,
        dp_replicate=data // dp_shard,
        sp=req.sp,
        zero=ZeroStage(req.zero),
        recompute=choice(Recompute, req.recompute, "recompute"),
        schedule=choice(Schedule, schedule, "schedule"),
        cp_kind=choice(ContextParallel, req.cp_kind, "cp kind"),
        micro_batch=req.micro_batch,
    )


def resolve_workload(
    *,
    layout: Layout,
    seq: int,
    global_batch: int | None = None,
    precision: str = "bf16",
    optimizer: str = "adamw",
    optimizer_bytes: float | None = None,
    attention: str = "flash",
    kernels: str = "fused",
    overlap: Mapping[str, bool] | None = None,
    finetune: Finetune | None = None,
    framework: str = "megatron",
    conditions: Conditions | None = None,
    policy: PrecisionPolicy | None = None,
) -> Workload:
    """A workload; the global batch defaults to pp micro-batches per data-parallel rank (a full 1F1B pipeline).

    ``policy`` replaces the named ``precision`` (a policy with dtypes the conditions override)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
    batch = global_batch if global_batch is not None else layout.micro_batch * layout.dp * layout.pp
    return Workload(
        seq_len=seq,
        global_batch=batch,
        framework=choice(Framework, framework, "framework"),
        conditions=conditions or Conditions(),
        precision=policy or PRECISIONS[precision],
        optimizer=Optimizer(kind=choice(OptimizerKind, optimizer, "optimizer"), state_bytes_per_param=optimizer_bytes),
        attention=choice(Attention, attention, "attention"),
        kernels=choice(Kernels, kernels, "kernels"),
        overlap=_overlap(overlap or {}),
        finetune=finetune or Finetune(),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class FinetuneRequest:
    """Fine-tuning as a user states it on the command line."""

    mode: str = "full"
    lora_rank: int | None = None
    """None: 16."""
    lora_targets: str | None = None
    """Comma-separated projections (q,k,v,o,gate,up,down); None: all of them."""
    freeze: str | None = None
    """Comma-separated frozen parts: 'embeddings' and/or 'layers=N' (full fine-tuning)."""
    lora_train_embeddings: bool = False
    """LoRA / QLoRA: the embedding and the output head train too."""
    qlora_base: str | None = None
    """QLoRA's base format: nf4 (None) or gptq-int4."""
    quant_group_size: int | None = None
    """GPTQ int4: weights per scale and zero (None: 128)."""


def resolve_finetune(req: FinetuneRequest, model: ModelSpec) -> Finetune:
    """A validated Finetune for ``model``: known targets, a rank below every adapted matrix, frozen parts."""
    mode = choice(FinetuneMode, req.mode, "fine-tuning mode")
    if mode is FinetuneMode.FULL and (req.lora_rank is not None or req.lora_targets is not None):
        raise ValueError(
            "a LoRA rank or targets apply to the lora and qlora modes only (full fine-tuning has no adapters)"
        )
    targets = (
        LORA_TARGETS
        if req.lora_targets is None
        else tuple(t.strip().lower() for t in req.lora_targets.split(",") if t.strip())
    )
    freeze_embeddings, freeze_layers = False, 0
    for part in filter(None, (p.strip().lower() for p in (req.freeze or "").split(","))):
        if part in ("embeddings", "embedding"):
            freeze_embeddings = True
        elif part.startswith("layers="):
            try:
                freeze_layers = int(part.split("=", 1)[1])
            except ValueError:
                raise ValueError(f"--freeze {part!r}: the number of layers must be an integer") from None
        else:
            raise ValueError(f"unknown frozen part {part!r} (use embeddings and/or layers=N)")
    ft = Finetune(
        mode=mode,
        lora_rank=16 if req.lora_rank is None else req.lora_rank,
        lora_targets=targets,
        freeze_embeddings=freeze_embeddings,
        freeze_layers=freeze_layers,
        train_embeddings=req.lora_train_embeddings,
        base_quant=choice(QuantBase, req.qlora_base or "nf4", "QLoRA base format"),
        quant_group_size=128 if req.quant_group_size is None else req.quant_group_size,
    )
    if req.quant_group_size is not None and ft.base_quant is not QuantBase.GPTQ_INT4:
        raise ValueError("--quant-group-size applies to --qlora-base gptq-int4 only")
    validate_finetune(model, ft)
    return ft


def _overlap(settings: Mapping[str, bool]) -> Overlap:
    known = {f.name for f in dataclasses.fields(Overlap)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"unknown overlap setting {unknown[0]!r} (known: {', '.join(sorted(known))})")
    return Overlap(**settings)


def finetune_fields(model: ModelSpec, ft: Finetune) -> dict[str, Any]:
    """What trains, as every training report names it: the mode, trainable parameters, adapters or frozen parts."""
    out: dict[str, Any] = {"finetune": ft.mode.value, "trainable_params": trainable_params(model, ft).trainable}
    if ft.adapted:
        out |= {"lora_rank": ft.lora_rank, "lora_targets": list(ft.lora_targets)}
        out |= {"lora_train_embeddings": ft.train_embeddings} if ft.train_embeddings else {}
        if ft.base_quant is QuantBase.GPTQ_INT4:
            out |= {"qlora_base": ft.base_quant.value, "quant_group_size": ft.quant_group_size}
    elif ft.freeze_embeddings or ft.freeze_layers:
        out |= {"frozen": {"embeddings": ft.freeze_embeddings, "layers": ft.freeze_layers}}
    return out


def layout_dict(layout: Layout) -> dict[str, Any]:
    """The layout as the JSON contract names it."""
    return {
        "tp": layout.tp,
        "pp": layout.pp,
        "vpp": layout.vpp,
        "cp": layout.cp,
        "ep": layout.ep,
        "expert_tp": layout.etp,
        "dp_shard": layout.dp_shard,
        "dp_replicate": layout.dp_replicate,
        "zero": int(layout.zero),
        "sp": layout.sp,
        "recompute": layout.recompute.name.lower(),
        "schedule": layout.schedule.name.lower().replace("one_f_one_b", "1f1b").replace("_", "-"),
        "cp_kind": layout.cp_kind.name.lower().replace("_", "-"),
        "micro_batch": layout.micro_batch,
    }


class FleetArgs(TypedDict, total=False):
    """The fleet's keyword arguments beyond the GPU kind and count (``resolve_cluster``'s)."""

    node_size: int | None
    scale_out: str | None
    scale_out_bandwidth: float | None
    nics_per_node: int | None
    oversubscription: float | None
    profile: str | None


def resolve_cluster(
    *,
    gpu: str,
    gpus: int,
    node_size: int | None = None,
    scale_out: str | None = None,
    scale_out_bandwidth: float | None = None,
    nics_per_node: int | None = None,
    oversubscription: float | None = None,
    profile: str | None = None,
) -> Cluster:
    """The fleet: ``gpus`` of one catalog GPU, its scale-up link, and a scale-out link (default: the GPU's NIC),
    whose bandwidth per NIC ``scale_out_bandwidth`` replaces when given (bytes/s per direction), ``nics_per_node``
    of them shared by a host's GPUs (default: one per GPU), behind leaf switches ``oversubscription`` to 1
    (default non-blocking); its constants scaled by a cluster ``profile`` (``--profile``) when one is given."""
    spec = io.load_gpu(gpu)
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    domain = node_size if node_size is not None else spec.scale_up_domain
    if domain < 1:
        raise ValueError(f"node size must be >= 1, got {domain}")
    scale_up = io.load_link(spec.scale_up_link)
    cluster = Cluster(
        gpu=spec,
        num_gpus=gpus,
        scale_up=scale_up,
        scale_out=_shared(
            _with_bandwidth(io.load_link(scale_out or spec.scale_out_link), scale_out_bandwidth),
            nics_per_node=nics_per_node,
            gpus_per_node=spec.gpus_per_node,
        ),
        domain_size=domain,
        scale_up_switched=scale_up_switched(scale_up, domain=domain, catalog_domain=spec.scale_up_domain),
        oversubscription=1.0 if oversubscription is None else oversubscription,
    )
    return apply_profile(cluster, parse_profile(profile))


DIRECT_BOARD_MAX_GPUS = 4
"""NVLink domains of this many GPUs or fewer, smaller than the kind's own switched domain, are boards of direct
links: NVIDIA's NVSwitch baseboards hold 8 GPUs (HGX A100/H100/H200 8-GPU, 72 in NVL72), and the 4-GPU boards
(HGX A100 4-GPU: 4 NVLink 3 links to each of 3 peers; HGX H100/H200 4-GPU: 6 NVLink 4 links to each) join
their GPUs pairwise with no switch."""


def scale_up_switched(link: Link, *, domain: int, catalog_domain: int) -> bool:
    """Whether a group inside the scale-up domain gets every GPU's whole scale-up bandwidth (a switch) or only
    its peers' links (core/comm/call.py ``scale_up_share``): the link's own wiring, and an NVLink domain of at
    most 4 GPUs below the kind's own (``--node-size 4`` on an 8-GPU kind) is a direct-link board."""
    if not link.switched:
        return False
    small_board = domain <= DIRECT_BOARD_MAX_GPUS and domain < catalog_domain
    return not (link.kind == LinkKind.NVLINK and small_board)


def _with_bandwidth(link: Link, bandwidth_bytes_per_s: float | None) -> Link:
    if bandwidth_bytes_per_s is None:
        return link
    if bandwidth_bytes_per_s <= 0:
        raise ValueError(f"scale-out bandwidth must be positive, got {bandwidth_bytes_per_s:g} bytes/s")
    return dataclasses.replace(link, bandwidth_bytes_per_s=bandwidth_bytes_per_s)


def _shared(link: Link, *, nics_per_node: int | None, gpus_per_node: int) -> Link:
    """The scale-out link as one GPU sees it when ``nics_per_node`` NICs serve a host's ``gpus_per_node`` GPUs:
    each GPU's share of the host's NIC bandwidth (NCCL spreads its rings' channels over every NIC of the host)."""
    if nics_per_node is None or nics_per_node == gpus_per_node:
        return link
    if nics_per_node < 1:
        raise ValueError(f"nics_per_node must be >= 1, got {nics_per_node}")
    share = nics_per_node / gpus_per_node
    return dataclasses.replace(link, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s * share)


def resolve_order(text: str | None) -> tuple[str, ...]:
    return DEFAULT_ORDER if not text else parse_order(text)
