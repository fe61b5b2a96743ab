"""``meshplan params``: exact parameter counts (standard library only, for a fast start)."""

from __future__ import annotations

from typing import Any

from meshplan import io
from meshplan.core.params import count_params


def params_report(model_name: str) -> dict[str, Any]:
    """``meshplan params``: exact counts by component."""
    model = io.load_model(model_name)
    p = count_params(model)
    return {
        "model": model.name,
        "total_params": p.total,
        "active_params_per_token": p.active_per_token,
        "by_component": p.by_component(),
        "mtp_params": p.mtp,
    }
