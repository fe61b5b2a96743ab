"""Tampered serving plans: one valid ``serve-plan --save`` file, each field mutated in turn.

``tampered(plan)`` returns name -> the file's text. Every mutation makes a plan that serve-plan could not have
written for its own inputs: a wrong type, a negative, zero, huge or non-finite number, a text with a newline, a
missing or an extra key, a layout the model or the GPU cannot run, a swapped model, numbers that are not the
plan's. ``export ENGINE --from-plan`` must refuse each with one line.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

EVIL = "x\ntouch /tmp/meshplan-tampered-plan"
"""A text that ends a shell comment and starts a command."""

Path = tuple[str | int, ...]

INT_BAD: dict[str, Any] = {
    "text": "8",
    "float": 1.5,
    "true": True,
    "null": None,
    "list": [1],
    "negative": -1,
    "zero": 0,
    "huge": 10**30,
    "nan": float("nan"),
    "inf": float("inf"),
    "newline": EVIL,
}
FLOAT_BAD: dict[str, Any] = {
    "text": "0.5",
    "true": True,
    "null": None,
    "negative": -0.5,
    "zero": 0.0,
    "huge": 1e300,
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
    "newline": EVIL,
}
STR_BAD: dict[str, Any] = {"number": 8, "null": None, "list": ["x"], "empty": "", "newline": EVIL, "cr": "x\rid"}
BOOL_BAD: dict[str, Any] = {"number": 1, "text": "true", "null": None, "newline": EVIL}
LIST_BAD: dict[str, Any] = {"text": "x", "object": {}, "null": None, "newline": EVIL}
OPTIONAL_FLOAT_BAD = {k: v for k, v in FLOAT_BAD.items() if k != "null"}
COUNT_BAD = {k: v for k, v in INT_BAD.items() if k != "zero"}
ELAPSED_BAD = {k: v for k, v in FLOAT_BAD.items() if k != "zero"}

FIELD_BAD: dict[Path, dict[str, Any]] = {
    ("model",): STR_BAD | {"unknown": "no-such-model", "path": "/etc/passwd", "semicolon": "llama-3.1-8b;id"},
    ("gpu",): STR_BAD | {"unknown": "no-such-gpu"},
    ("gpus",): INT_BAD,
    ("engine",): STR_BAD | {"unknown": "tgi"},
    ("objective",): STR_BAD | {"unknown": "speed"},
    ("input_len",): INT_BAD,
    ("output_len",): INT_BAD,
    ("targets",): LIST_BAD,
    ("targets", "ttft_s_p99"): OPTIONAL_FLOAT_BAD,
    ("targets", "tpot_s_p99"): OPTIONAL_FLOAT_BAD,
    ("concurrency_total",): OPTIONAL_FLOAT_BAD,
    ("disaggregate_searched",): BOOL_BAD,
    ("best",): LIST_BAD,
    ("best", "layout"): LIST_BAD,
    ("best", "layout", "tp"): INT_BAD,
    ("best", "layout", "pp"): INT_BAD,
    ("best", "layout", "ep"): INT_BAD,
    ("best", "layout", "dp_attention"): BOOL_BAD,
    ("best", "layout", "weights_dtype"): STR_BAD | {"unknown": "fp3"},
    ("best", "layout", "kv_dtype"): STR_BAD | {"unknown": "int4"},
    ("best", "layout", "quant"): STR_BAD | {"unknown": "awq"},
    ("best", "batch_cap_per_replica"): INT_BAD,
    ("best", "kv_sequences_per_replica"): INT_BAD,
    ("best", "ttft_s_p99"): FLOAT_BAD,
    ("best", "tpot_s"): FLOAT_BAD,
    ("best", "tpot_s_p99"): FLOAT_BAD,
    ("best", "tokens_per_s_per_gpu"): FLOAT_BAD,
    ("best", "tokens_per_s_per_user"): FLOAT_BAD,
    ("best", "gpus"): INT_BAD,
    ("best", "replicas"): INT_BAD,
    ("best", "prefill_replicas"): COUNT_BAD,
    ("top",): LIST_BAD | {"empty": []},
    ("top", 0, "tpot_s"): FLOAT_BAD,
    ("pareto",): LIST_BAD,
    ("pareto", 0, "tokens_per_s_per_gpu"): FLOAT_BAD,
    ("rejected",): LIST_BAD,
    ("pareto_points_total",): COUNT_BAD,
    ("layouts_evaluated",): COUNT_BAD,
    ("points_evaluated",): COUNT_BAD,
    ("layouts_meeting_targets",): COUNT_BAD,
    ("elapsed_s",): ELAPSED_BAD,
    ("uncertainty",): STR_BAD,
    ("weights_dtypes_searched",): LIST_BAD | {"unknown": ["fp3"], "number": [8], "twice": ["fp8", "fp8"]},
    ("warnings",): LIST_BAD,
    ("prefix_hit_rate",): {k: v for k, v in OPTIONAL_FLOAT_BAD.items() if k != "zero"}  # 0: no hits, as null
    | {"above one": 1.5, "another rate": 0.5},
    ("speculative",): {"set": "eagle:3", "number": 8, "newline": EVIL},
    ("spec_acceptance",): {"set": 0.5, "text": "0.5", "nan": float("nan")},
}
"""Each field of a saved plan and the wrong values it is given in turn (those a field may hold are left out:
zero prefill replicas, a null target)."""

EXTRA_KEY_AT: tuple[Path, ...] = ((), ("targets",), ("best",), ("best", "layout"), ("top", 0), ("pareto", 0))


def _parent(plan: Any, path: Path) -> Any:
    for key in path[:-1]:
        plan = plan[key]
    return plan


def _get(plan: Any, path: Path) -> Any:
    return _parent(plan, path)[path[-1]]


def _edit(plan: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    out = copy.deepcopy(plan)
    change(out)
    return out


def _set(path: Path, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(plan: dict[str, Any]) -> None:
        _parent(plan, path)[path[-1]] = value

    return change


def _drop(path: Path) -> Callable[[dict[str, Any]], None]:
    def change(plan: dict[str, Any]) -> None:
        del _parent(plan, path)[path[-1]]

    return change


def _add_key(path: Path) -> Callable[[dict[str, Any]], None]:
    def change(plan: dict[str, Any]) -> None:
        (_get(plan, path) if path else plan)["evil"] = 1

    return change


def _best_and_top(path: Path, value: Any) -> Callable[[dict[str, Any]], None]:
    """The same change to best and to top[0] (serve-plan writes them equal)."""

    def change(plan: dict[str, Any]) -> None:
        for root in (("best",), ("top", 0)):
            _set((*root, *path), value)(plan)

    return change


def _scale(path: Path, factor: float) -> Callable[[dict[str, Any]], None]:
    def change(plan: dict[str, Any]) -> None:
        for root in (("best",), ("top", 0)):
            value = _get(plan, (*root, *path))
            _set((*root, *path), type(value)(value * factor))(plan)

    return change


def _semantic(plan: dict[str, Any]) -> Iterator[tuple[str, Callable[[dict[str, Any]], None]]]:
    """Values of the right type and range that no serve-plan run writes for the file's own inputs."""
    best = plan["best"]
    lay = best["layout"]
    for model in ("llama-3.1-70b", "mixtral-8x7b", "qwen3-30b-a3b"):
        if model != plan["model"]:
            yield f"model swapped to {model}", _set(("model",), model)
    yield "gpu swapped to h200", _set(("gpu",), "h200")
    yield "gpu swapped to a100-sxm-80gb", _set(("gpu",), "a100-sxm-80gb")
    yield "gpus doubled", _set(("gpus",), plan["gpus"] * 2)
    yield "gpus minus one", _set(("gpus",), plan["gpus"] - 1)
    yield "input_len plus one", _set(("input_len",), plan["input_len"] + 1)
    yield "input_len past the longest context", _set(("input_len",), (1 << 24) + 1)
    yield "output_len doubled", _set(("output_len",), plan["output_len"] * 2)
    yield "engine swapped", _set(("engine",), "vllm" if plan["engine"] != "vllm" else "sglang")
    yield "objective swapped", _set(("objective",), "latency" if plan["objective"] != "latency" else "throughput")
    yield "objective fewest-gpus without concurrency", _set(("objective",), "fewest-gpus")
    yield "a TPOT target the plan misses", _set(("targets", "tpot_s_p99"), best["tpot_s"] / 2)
    yield "a TTFT target the plan misses", _set(("targets", "ttft_s_p99"), best["ttft_s_p99"] / 2)
    for tp in (3, 64, lay["tp"] * 2, 5):
        yield f"tp {tp}", _best_and_top(("layout", "tp"), tp)
    yield "tp 3 with the GPUs to match", _tp_with_gpus(3)
    yield "tp 64 with the GPUs to match", _tp_with_gpus(64)
    yield "pp 3", _best_and_top(("layout", "pp"), 3)
    yield "pp past the layers", _best_and_top(("layout", "pp"), 4096)
    yield "ep 2 on a dense model", _best_and_top(("layout", "ep"), 2)
    yield "dp_attention on a dense model", _best_and_top(("layout", "dp_attention"), not lay["dp_attention"])
    yield "fp4 weights on a GPU without fp4", _best_and_top(("layout", "weights_dtype"), "fp4")
    yield "bf16 weights with quantization", _best_and_top(("layout", "weights_dtype"), "bf16")
    yield "fp16 KV cache (not searched)", _best_and_top(("layout", "kv_dtype"), "fp16")
    yield "weight-only quant where serve-plan runs W-A", _best_and_top(("layout", "quant"), "weight-only")
    yield "no quant for quantized weights", _best_and_top(("layout", "quant"), "none")
    yield "batch cap plus one", _best_and_top(("batch_cap_per_replica",), best["batch_cap_per_replica"] + 1)
    yield "batch cap doubled", _scale(("batch_cap_per_replica",), 2)
    yield "batch cap above the KV capacity", _best_and_top(("batch_cap_per_replica",), 10**6)
    yield "kv sequences plus one", _best_and_top(("kv_sequences_per_replica",), best["kv_sequences_per_replica"] + 1)
    for key in ("ttft_s_p99", "tpot_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user"):
        yield f"{key} halved", _scale((key,), 0.5)
    yield "gpus of the plan doubled", _best_and_top(("gpus",), best["gpus"] * 2)
    yield "replicas doubled", _best_and_top(("replicas",), best["replicas"] * 2)
    yield "pareto front out of order", _set(("pareto",), list(reversed(plan["pareto"])))
    yield "every replica prefills", _best_and_top(("prefill_replicas",), best["replicas"])
    yield "more prefill replicas than replicas", _best_and_top(("prefill_replicas",), best["replicas"] + 1)
    yield "another pool split", _best_and_top(("prefill_replicas",), best["prefill_replicas"] % 7 + 1)
    yield "best is not top[0]", _set(("best", "tpot_s"), best["tpot_s"] * 2)
    yield "best null", _set(("best",), None)
    yield "uncertainty changed", _set(("uncertainty",), "none")
    others = [d for d in plan["weights_dtypes_searched"] if d != lay["weights_dtype"]]
    yield "the winner's weights not among those searched", _set(("weights_dtypes_searched",), others)
    yield "a warning that is no text", _set(("warnings",), [8])
    yield "fewer layouts meeting targets than shown", _set(("layouts_meeting_targets",), 0)
    yield "a model given as a relative path", _set(("model",), "../../../../etc/hostname")


def _tp_with_gpus(tp: int) -> Callable[[dict[str, Any]], None]:
    """TP that does not divide the heads, with gpus, the plan's GPUs and replicas made consistent with it."""

    def change(plan: dict[str, Any]) -> None:
        pp = plan["best"]["layout"]["pp"]
        replicas = plan["best"]["replicas"]
        for root in (("best",), ("top", 0)):
            _set((*root, "layout", "tp"), tp)(plan)
            _set((*root, "gpus"), tp * pp * replicas)(plan)
        plan["gpus"] = tp * pp * replicas

    return change


DEFAULTED_BAD: dict[Path, dict[str, Any]] = {
    ("launch",): STR_BAD | {"unknown": "graphs"},
    ("capacity_scheduler",): {k: v for k, v in STR_BAD.items() if k != "null"} | {"unknown": "fcfs"},  # null: unset
}
"""Fields a file saved before they were written may leave out (read as their default), but not hold wrong."""


def tampered(plan: dict[str, Any]) -> dict[str, str]:
    """name -> text of a tampered copy of ``plan`` (a ``serve-plan --save`` file, parsed)."""
    out: dict[str, dict[str, Any] | str] = {}
    for path, values in DEFAULTED_BAD.items():
        for kind, value in values.items():
            out[f"{'.'.join(map(str, path))} {kind}"] = _edit(plan, _set(path, value))
    for path, values in FIELD_BAD.items():
        where = ".".join(map(str, path))
        for kind, value in values.items():
            out[f"{where} {kind}"] = _edit(plan, _set(path, value))
        out[f"{where} missing"] = _edit(plan, _drop(path))
    for path in EXTRA_KEY_AT:
        out[f"extra key in {'.'.join(map(str, path)) or 'the file'}"] = _edit(plan, _add_key(path))
    for name, change in _semantic(plan):
        out[name] = _edit(plan, change)
    out["a list"] = json.dumps([plan])
    out["a string"] = json.dumps("plan")
    out["null"] = "null"
    out["an empty object"] = "{}"
    out["1e999 for a prediction"] = json.dumps(plan).replace(
        json.dumps(plan["best"]["tpot_s"]), "1e999"
    )  # parses to inf
    out["duplicate model key"] = json.dumps(plan).replace('"model": ', '"model": "no-such-model", "model": ', 1)
    return {name: text if isinstance(text, str) else json.dumps(text) for name, text in out.items()}
