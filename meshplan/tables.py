"""Readable text for each report (the CLI without --json)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshplan.render import count, gb, percent, table


def _params(r: dict[str, Any]) -> str:
    rows = [(name, f"{n:,}", count(n)) for name, n in r["by_component"].items() if n]
    out = [f"{r['model']}: {r['total_params']:,} parameters ({count(r['total_params'])})"]
    if r["active_params_per_token"] != r["total_params"]:
        out.append(f"active per token: {r['active_params_per_token']:,} ({count(r['active_params_per_token'])})")
    if r.get("mtp_params"):
        out.append(f"multi-token-prediction modules (not in the total): {r['mtp_params']:,}")
    out += ["", table(rows, ["component", "parameters", ""])]
    return "\n".join(out)


def _layout_line(lay: dict[str, Any]) -> str:
    parts = [f"{k}={lay[k]}" for k in ("tp", "pp", "vpp", "cp", "ep", "dp_shard", "dp_replicate") if lay[k] != 1]
    parts += [f"zero={lay['zero']}", f"recompute={lay['recompute']}", f"micro_batch={lay['micro_batch']}"]
    if lay["sp"]:
        parts.append("sp")
    if lay["pp"] > 1:
        parts.append(f"schedule={lay['schedule']}")
    return " ".join(parts)


def _memory(r: dict[str, Any]) -> str:
    bill = r["per_gpu"]
    rows = [(t["title"], gb(t["value_bytes"]), t["formula"]) for t in r["terms"] if t["value_bytes"]]
    rows.append(("total", gb(bill["total_bytes"]), f"of {gb(r['hbm_bytes'])} HBM"))
    head = [
        f"{r['model']} on {r['gpus']} x {r['gpu']}: {_layout_line(r['layout'])}",
        f"seq {r['seq']}, global batch {r['global_batch']} sequences, precision {r['precision']}",
    ]
    if len(r["stages"]) > 1:
        head.append(f"heaviest pipeline stage: {r['heaviest_stage']} of {len(r['stages'])}")
    verdict = "fits" if r["fits"] else "does NOT fit"
    tail = f"{verdict}: {gb(bill['total_bytes'])} of {gb(r['hbm_bytes'])} ({gb(abs(r['free_bytes']))} "
    tail += "free)" if r["fits"] else "over)"
    return "\n".join([*head, "", table(rows, ["term", "per GPU", "formula"], align="lrl"), "", tail])


def _fit(r: dict[str, Any]) -> str:
    verdict = "fits" if r["fits"] else "does NOT fit"
    return "\n".join(
        [
            f"{r['model']} weights in {r['dtype']}: {gb(r['weights_bytes_total'])}",
            f"split over {r['gpus']} x {r['gpu']}: {gb(r['weights_bytes_per_gpu'])} per GPU "
            f"({percent(r['hbm_fraction_per_gpu'])} of {gb(r['hbm_bytes_per_gpu'])}) - {verdict}",
            f"free: {gb(r['free_bytes_per_gpu'])} per GPU, {gb(r['free_bytes_total'])} in total, "
            "for the KV cache and activations",
            f"fewest GPUs for the weights alone: {r['min_gpus_for_weights']}; "
            f"for the training state ({gb(r['training_state_bytes'])}, 16 bytes/param): {r['min_gpus_for_training']}",
        ]
    )


def _serving(r: dict[str, Any]) -> str:
    rows = [
        ("weights per GPU", gb(r["weights_bytes_per_gpu"])),
        ("prefill activations", gb(r["activations_bytes"])),
        ("framework", gb(r["framework_bytes"])),
        ("KV budget per GPU", gb(r["kv_budget_bytes"])),
        ("KV per token per GPU", gb(r["kv_bytes_per_token"])),
        (f"KV per {r['context']}-token sequence", gb(r["kv_bytes_per_sequence"])),
        ("KV tokens that fit per GPU", f"{r['kv_capacity_tokens']:,}"),
        ("concurrent sequences", f"{r['max_concurrent_sequences']:,}"),
    ]
    head = f"{r['model']} serving on {r['gpus']} x {r['gpu']}: tp={r['tp']} pp={r['pp']} x {r['replicas']} replicas"
    return "\n".join([head, f"weights {r['dtype']}, KV cache {r['kv_dtype']}", "", table(rows, ["", "value"])])


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "params": _params,
    "memory": _memory,
    "fit": _fit,
    "serving": _serving,
}


def render_table(command: str, result: dict[str, Any]) -> str:
    return RENDERERS[command](result)
