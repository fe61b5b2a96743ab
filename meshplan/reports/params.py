"""``meshplan params``: exact parameter counts (standard library only, for a fast start)."""

from __future__ import annotations

from typing import Any

from meshplan import io
from meshplan.core.params import count_params


def params_report(model_name: str, *, finetune: Any = None) -> dict[str, Any]:
    """``meshplan params``: exact counts by component, and what trains (a FinetuneRequest, or None: all)."""
    model = io.load_model(model_name)
    p = count_params(model)
    trained: dict[str, Any] = {"trainable_params": p.total, "finetune": "full"}
    if finetune is not None:  # imported here: counting adapters needs numpy, a plain count does not
        from meshplan.core.finetune import trainable_params
        from meshplan.reports.inputs import resolve_finetune

        ft = resolve_finetune(finetune, model)
        counts = trainable_params(model, ft)
        trained = {
            "trainable_params": counts.trainable,
            "finetune": ft.mode.value,
            "frozen_params": counts.frozen,
            "adapter_params": counts.adapters,
            "trainable_fraction": counts.trainable / p.total,
        }
    return trained | {
        "model": model.name,
        "total_params": p.total,
        "active_params_per_token": p.active_per_token,
        "by_component": p.by_component(),
        "mtp_params": p.mtp,
    }
