"""Speculative decoding as the serving engines' configs state it, read as serve's ``--speculative METHOD:K``.

vLLM: ``--speculative-config`` (JSON: ``method``, ``num_speculative_tokens``; vllm/config SpeculativeConfig).
SGLang: ``--speculative-algorithm`` (EAGLE, EAGLE3, NEXTN, MTP) and ``--speculative-num-steps`` (the draft's depth;
``--speculative-eagle-topk`` above 1 makes a tree of drafts, priced as a chain of that depth). TensorRT-LLM:
``speculative_config`` (``decoding_type`` MTP with ``num_nextn_predict_layers``, Eagle or Eagle3 with
``max_draft_len``). A separate draft model is listed, not read (serve's ``draft:K`` takes it as ``--draft-model``),
and so is any method serve does not price (n-gram, Medusa). The acceptance rate is the user's to state
(``--spec-acceptance``): no config holds it.
"""

from __future__ import annotations

from typing import Any

from meshplan.configs.reading import UNKNOWN, Reading, integer, short
from meshplan.files import parse_json

DRAFT = "a separate draft model: type --speculative draft:K --draft-model NAME and --spec-acceptance"
OTHER = "a drafting method serve does not price (eagle, mtp and draft only)"
SGLANG_METHODS = {"EAGLE": "eagle", "EAGLE3": "eagle", "NEXTN": "mtp", "MTP": "mtp"}
TRTLLM_METHODS = {"MTP": ("mtp", "num_nextn_predict_layers"), "EAGLE": ("eagle", "max_draft_len")}
TRTLLM_METHODS["EAGLE3"] = TRTLLM_METHODS["EAGLE"]


def _method(name: str) -> str | None:
    """serve's method for an engine's name of it: EAGLE heads, MTP layers (vLLM's deepseek_mtp, qwen3_next_mtp and
    the like), None for the rest."""
    text = name.lower()
    if text.startswith("eagle"):
        return "eagle"
    if text == "mtp" or text.endswith("_mtp"):
        return "mtp"
    return None


def vllm_speculative(r: Reading, value: str | None) -> None:
    """``--speculative-config JSON``."""
    try:
        cfg = parse_json(value or "", "--speculative-config")
    except ValueError as exc:
        raise ValueError(f"{r.label}: --speculative-config {short(value)} is not JSON we read ({exc})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{r.label}: --speculative-config must be a JSON object, got {short(cfg)}")
    method = _method(str(cfg.get("method", "")))
    if method is None:
        r.skip("--speculative-config", value, DRAFT if "model" in cfg and "method" not in cfg else OTHER)
        return
    k = integer(cfg.get("num_speculative_tokens"), "--speculative-config num_speculative_tokens", r.label, low=1)
    r.take("speculative", f"{method}:{k}", "--speculative-config")


def sglang_speculative(r: Reading, seen: dict[str, str | None]) -> None:
    """``--speculative-algorithm`` with ``--speculative-num-steps``."""
    algorithm = seen.get("--speculative-algorithm")
    if algorithm is None:
        return
    method = SGLANG_METHODS.get(str(algorithm).upper())
    if method is None:
        r.skip("--speculative-algorithm", algorithm, OTHER if str(algorithm).upper() != "STANDALONE" else DRAFT)
        return
    steps = integer(seen.get("--speculative-num-steps"), "--speculative-num-steps", r.label, low=1)
    r.take("speculative", f"{method}:{steps}", "--speculative-algorithm, --speculative-num-steps")
    topk = seen.get("--speculative-eagle-topk")
    if topk is not None and str(topk) != "1":
        r.notes.append(f"--speculative-eagle-topk {short(topk)}: a tree of drafts, priced as a chain {steps} deep")


def trtllm_speculative(r: Reading, cfg: Any) -> None:
    """LLM-API ``speculative_config``."""
    if not isinstance(cfg, dict):
        raise ValueError(f"{r.label}: speculative_config must be a mapping, got {short(cfg)}")
    kind = str(cfg.get("decoding_type", "")).upper()
    if kind not in TRTLLM_METHODS:
        r.skip("speculative_config", cfg, DRAFT if kind == "DRAFT_TARGET" else OTHER)
        return
    method, key = TRTLLM_METHODS[kind]
    k = integer(cfg.get(key), f"speculative_config.{key}", r.label, low=1)
    r.take("speculative", f"{method}:{k}", f"speculative_config.decoding_type, {key}")
    for extra, item in cfg.items():
        if extra not in ("decoding_type", key):
            r.skip(f"speculative_config.{extra}", item, UNKNOWN)
