"""A static batch: N identical prompts prefilled together, then decoded together (``serve --batch``).

Benchmark scripts (vLLM's benchmark_latency, TensorRT-LLM's static-batch tables) and profilers (Splitwise's
perf_model.csv) time one batch that enters and leaves together. Its N x I prompt tokens go through the engine's
forwards in order, at most N_step = max_num_tokens of them a forward (a short prompt whole beside others, a long
one in chunks after its earlier ones); a prompt's first token comes out of the forward that finishes it, and the
batch's TTFT is the forward that finishes the last one. Then O - 1 decode steps of the N sequences:

  forward k carries tokens [k N_step, min((k + 1) N_step, N I)) of the prompts laid end to end: the rest of a prompt
  begun before it, whole prompts, the start of the next; a piece of t tokens after c of its prompt attends
  t (c + t/2) (query, key) pairs (``prefill_keys``: at most its window in a sliding layer)
  TTFT  = sum_k t(forward k), pipelined over pp stages as micro-batches: + (pp - 1) x the longest forward, over the
          engine's pipeline efficiency
  TPOT  = pp x t(decode step of N / pp sequences at mean context I + O/2) (static_batch_s's step)
  run   = TTFT + (O - 1) TPOT;  output tokens/s = N O / run
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.core.serving.offline import MAX_OFFLINE_STEPS
from meshplan.core.serving.phases import Forward, decode_step, forward, pipeline_factor, prefill
from meshplan.core.serving.shape import Hardware, ReplicaShape, ServeLayout, graph_batch, prefill_keys
from meshplan.spec.model import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticBatch:
    """One static batch through one replica."""

    batch: int
    """Sequences of the batch (on this replica)."""
    prefill_forwards: int
    """Forwards the batch's prompts take at the engine's tokens per step."""
    ttft_s: float
    """The batch's prefill: until the last prompt's first token."""
    tpot_s: float
    """One decode step of the whole batch at the mean context."""
    decode_s: float
    """The O - 1 decode steps."""
    run_s: float
    output_tokens_per_s: float
    step: Forward
    """The decode step (per GPU, per micro-batch), term by term."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillPieces:
    """The prompts' tokens laid end to end and cut every ``max_num_tokens``: per forward (arrays), a head piece of
    ``head`` tokens of the prompt begun before it after its ``cached`` ones, ``whole`` prompts, and a ``tail``
    piece of a prompt it begins."""

    cached: np.ndarray
    head: np.ndarray
    whole: np.ndarray
    tail: np.ndarray
    input_len: int

    @property
    def tokens(self) -> np.ndarray:
        return self.head + self.whole * self.input_len + self.tail

    @property
    def finished(self) -> np.ndarray:
        """Prompts whose last token is in the forward (their first output token comes out of it)."""
        return (self.cached + self.head == self.input_len) + self.whole

    def pairs(self, model: ModelSpec) -> np.ndarray:
        """(query, key) pairs of each forward, averaged over the model's layers (``prefill_keys``)."""
        i = float(self.input_len)
        return (
            self.head * prefill_keys(model, cached=self.cached, chunk=self.head)
            + self.whole * i * prefill_keys(model, cached=0.0, chunk=i)
            + self.tail * prefill_keys(model, cached=0.0, chunk=self.tail)
        )


def prefill_pieces(*, batch: int, input_len: int, max_num_tokens: int) -> PrefillPieces:
    """The forwards of a static batch's prefill (``PrefillPieces``), first prompt first."""
    if min(batch, input_len, max_num_tokens) < 1:
        raise ValueError("a static batch needs positive sequences, prompt length and tokens per step")
    total = batch * input_len
    forwards = -(-total // max_num_tokens)
    if forwards > MAX_OFFLINE_STEPS:
        raise ValueError(
            f"a static batch of {batch:,} prompts of {input_len:,} tokens takes {forwards:,} prefill forwards at "
            f"{max_num_tokens:,} tokens each (at most {MAX_OFFLINE_STEPS:,} are priced): fewer prompts or a larger "
            "--max-num-tokens"
        )
    start = np.arange(forwards, dtype=np.int64) * max_num_tokens
    tokens = np.minimum(start + max_num_tokens, total) - start
    cached = start % input_len
    head = np.minimum(input_len - cached, tokens)
    whole, tail = np.divmod(tokens - head, input_len)
    f = np.float64
    return PrefillPieces(
        cached=cached.astype(f), head=head.astype(f), whole=whole.astype(f), tail=tail.astype(f), input_len=input_len
    )


def static_batch(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    *,
    batch: int,
    input_len: int,
    output_len: int,
) -> StaticBatch:
    """``batch`` prompts of ``input_len`` tokens prefilled in the engine's chunks, then ``output_len`` - 1 decode
    steps of the whole batch (module docstring)."""
    ranks = layout.tp if layout.dp_attention else 1
    per_forward = layout.pp * ranks  # micro-batches (pp) and attention-DP ranks share the batch
    pieces = prefill_pieces(batch=batch, input_len=input_len, max_num_tokens=hw.cal.max_num_tokens * ranks)
    tokens = pieces.tokens / ranks
    pre = forward(
        model,
        shape,
        hw,
        layout,
        new_tokens=tokens,
        decode_pairs=0.0,
        prefill_pairs=pieces.pairs(model) / ranks,
        kv_tokens_read=0.0 * tokens,
        group_tokens=tokens * ranks,
        logits=pieces.finished / ranks,
        layer_overhead_s=hw.cal.prefill_layer_overhead_s,
        ep_per_node=True,
    )
    times = np.asarray(pre.total_s, dtype=np.float64) * np.ones_like(tokens)
    fill = (layout.pp - 1) * float(np.max(times))  # the last forward still crosses the stages after the first
    ttft = (float(np.sum(times)) + fill) * pipeline_factor(hw, layout) / layout.pp
    b = batch / per_forward
    rows = graph_batch(b) if hw.cal.cuda_graph_padding else b
    step = decode_step(model, shape, hw, layout, batch=b, context=input_len + output_len / 2, rows=rows)
    tpot = float(step.total_s) * pipeline_factor(hw, layout)
    decode = max(output_len - 1, 0) * tpot
    run = ttft + decode
    return StaticBatch(
        batch=batch,
        prefill_forwards=int(tokens.size),
        ttft_s=ttft,
        tpot_s=tpot,
        decode_s=decode,
        run_s=run,
        output_tokens_per_s=batch * output_len / run,
        step=step,
    )


def static_batch_s(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    *,
    batch: int,
    input_len: int,
    output_len: int,
) -> tuple[float, float]:
    """(prefill, decode) seconds of a static batch: all prompts prefilled at once, then O - 1 decode steps
    at the mean context (the KV read is linear in context, so the mean step is the step at the mean)."""
    b = batch / layout.pp
    pre = pipeline_factor(hw, layout) * prefill(model, shape, hw, layout, tokens=b * input_len, sequences=b).total_s
    steps = max(output_len - 1, 0)
    dec = (
        pipeline_factor(hw, layout)
        * decode_step(model, shape, hw, layout, batch=b, context=input_len + output_len / 2).total_s
    )
    return float(pre), float(steps * dec)
