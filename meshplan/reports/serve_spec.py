"""``serve --speculative`` and ``--prefix-hit-rate``: the drafter resolved from the flags, and the terms the report
shows (core/serving/speculative.py, core/serving/load.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from meshplan import io
from meshplan.core.serving.load import LoadPoint, Requests
from meshplan.core.serving.phases import decode_step, pipeline_factor
from meshplan.core.serving.shape import replica_shape
from meshplan.core.serving.speculative import MAX_DRAFT_TOKENS, SpecMethod, Speculation, draft_s, verify_step
from meshplan.reports.serve_setup import Setup
from meshplan.spec.model import ModelSpec


def parse_speculative(text: str, acceptance: float | None) -> tuple[SpecMethod, int, float]:
    """(method, K, a) of ``--speculative METHOD:K`` and ``--spec-acceptance a``, refused without a stated rate."""
    methods = ", ".join(m.value for m in SpecMethod)
    method_text, _, k_text = text.partition(":")
    try:
        method, k = SpecMethod(method_text.strip().lower()), int(k_text)
    except ValueError:
        raise ValueError(
            f"--speculative takes METHOD:K ({methods}; K drafted tokens a step, e.g. eagle:3), got {text!r}"
        ) from None
    if not 1 <= k <= MAX_DRAFT_TOKENS:
        raise ValueError(f"--speculative {text}: K must be 1..{MAX_DRAFT_TOKENS} drafted tokens a step")
    if acceptance is None:
        raise ValueError(
            "--speculative needs --spec-acceptance A, the chance a drafted token is accepted: it depends on the "
            "drafter, the model and the data, and meshplan assumes none"
        )
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"--spec-acceptance is a probability (0..1), got {acceptance}")
    return method, k, acceptance


def head_speculation(model: ModelSpec, text: str | None, acceptance: float | None) -> Speculation | None:
    """The drafting head of ``serve-plan --speculative`` (eagle:K or mtp:K: the same on every layout searched)."""
    if text is None:
        if acceptance is not None:
            raise ValueError("--spec-acceptance goes with --speculative METHOD:K; give it or drop --spec-acceptance")
        return None
    method, k, a = parse_speculative(text, acceptance)
    if method is SpecMethod.DRAFT:
        raise ValueError(
            "serve-plan searches eagle:K and mtp:K; a draft model's own split follows each layout: time a layout "
            "with it in meshplan serve --speculative draft:K --draft-model M"
        )
    if method is SpecMethod.MTP and model.mtp_layers < 1:
        raise ValueError(f"{model.name} has no multi-token-prediction layer: use eagle:K")
    return Speculation(method=method, k=k, acceptance=a)


def speculation(
    setup: Setup,
    text: str | None,
    *,
    acceptance: float | None,
    draft_model: ModelSpec | str | None,
    context: int,
) -> Speculation | None:
    """The drafter of ``--speculative METHOD:K``: refused without a stated acceptance rate, a draft model only
    with draft:K, MTP only for a model that has an MTP layer."""
    if text is None:
        if acceptance is not None or draft_model is not None:
            given = "--spec-acceptance" if acceptance is not None else "--draft-model"
            raise ValueError(f"{given} goes with --speculative METHOD:K; give it or drop {given}")
        return None
    method, k, acceptance = parse_speculative(text, acceptance)
    if method is not SpecMethod.DRAFT:
        if draft_model is not None:
            raise ValueError(f"--draft-model goes with draft:K, not {method.value}:K; drop it")
        if method is SpecMethod.MTP and setup.model.mtp_layers < 1:
            raise ValueError(f"{setup.model.name} has no multi-token-prediction layer: use eagle:K or draft:K")
        return Speculation(method=method, k=k, acceptance=acceptance)
    if draft_model is None:
        raise ValueError("--speculative draft:K needs --draft-model NAME, the model that drafts")
    draft = io.load_model(draft_model) if isinstance(draft_model, str) else draft_model
    if draft.vocab_size != setup.model.vocab_size:
        raise ValueError(
            f"--draft-model {draft.name}: its vocabulary ({draft.vocab_size:,}) is not {setup.model.name}'s "
            f"({setup.model.vocab_size:,}); a draft model shares the target's tokenizer"
        )
    lay = setup.layout
    tp = lay.tp if draft.num_heads % lay.tp == 0 else 1  # vLLM: the draft's TP is the target's or 1
    layout = dataclasses.replace(lay, tp=tp, pp=1, ep=1, dp_attention=False)
    shape = replica_shape(draft, setup.hw, layout, context=context)
    return Speculation(
        method=method, k=k, acceptance=acceptance, draft_model=draft, draft_shape=shape, draft_layout=layout
    )


def spec_dict(setup: Setup, req: Requests, pt: LoadPoint) -> dict[str, Any]:
    """The speculative step's terms at the load point's batch (decode-only steps): verify, draft, tokens a step,
    and the same batch's plain decode step beside them."""
    spec = req.speculation
    assert spec is not None
    lay, hw, model, shape = setup.layout, setup.hw, setup.model, setup.shape
    rounds = pipeline_factor(hw, lay)
    b = pt.batch / pt.capacity.per_forward
    context = req.input_len + req.output_len / 2
    verify = rounds * float(verify_step(model, shape, hw, lay, batch=b, context=context, k=spec.k).total_s)
    drafting = rounds * float(draft_s(model, shape, hw, lay, spec, batch=b, context=context).total_s)
    plain = rounds * float(decode_step(model, shape, hw, lay, batch=b, context=context).total_s)
    e = spec.tokens_per_step
    return {
        "method": spec.method.value,
        "draft_tokens": spec.k,
        "acceptance": spec.acceptance,
        "draft_model": None if spec.draft_model is None else spec.draft_model.name,
        "tokens_per_step": e,
        "verify_s": verify,
        "draft_s": drafting,
        "decode_step_s_without": plain,
        "decode_speedup": plain / ((verify + drafting) / e),
        "formula": (
            "tokens a step E = (1 - a^(K+1)) / (1 - a) (Leviathan et al. 2023); a step = one verify forward of "
            "K + 1 tokens a sequence + K draft forwards; TPOT = step / E"
        ),
    }


def prefix_dict(req: Requests) -> dict[str, Any]:
    """What the prefix cache leaves the prefill to compute."""
    return {
        "hit_rate": req.prefix_hit_rate,
        "cached_tokens": req.cached_tokens,
        "prefill_tokens": req.prompt_tokens,
    }
