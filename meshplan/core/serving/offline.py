"""An offline run: N identical requests queued at once, served to the last one (trtllm-bench throughput).

The steady state of serve_load assumes requests staggered evenly, every step carrying its share of prompts. An
offline run of N requests of I + O tokens is not staggered: the engine admits as many as its caps hold, prefills
them first come first served in chunks of its tokens-per-step budget, decodes them, and admits the next ones as
slots free. Its forwards, step by step:

  b_s = sequences decoding in step s        p_s = prompt tokens of step s = min(N_step - b_s, prompts waiting)
  a prompt finished in step s gives its first token there and decodes in steps s+1 .. s+O-1, then frees its slot

The run lasts sum_s pp t(b_s, p_s) (t: serve_phases.decode_step, decode-only steps CUDA-graph padded where the
engine pads them) and delivers N O tokens: its throughput counts the ramp, in which steps carry prompts and few
decode tokens, and the drain, in which the batch empties. The schedule depends on the caps alone, not on the
step times, so it is counted once (integers, one pass over the steps) and priced in one vectorized call.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from meshplan.core.serving.phases import decode_step, pipeline_factor
from meshplan.core.serving.shape import Hardware, ReplicaShape, ServeLayout, graph_batch
from meshplan.spec.model import ModelSpec

MAX_OFFLINE_STEPS = 2_000_000
"""Forwards an offline run may take (the schedule is counted step by step, about a second per million)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OfflineRun:
    """An offline run of one replica."""

    num_requests: int
    steps: int
    run_s: float
    output_tokens_per_s: float
    mean_batch: float
    """Decoding sequences per step, averaged over the run's steps."""
    decode_only_share: float
    """Share of the steps without a prompt chunk (the ones a CUDA graph runs)."""


def offline_schedule(
    *, input_len: int, output_len: int, num_requests: int, max_sequences: int, max_num_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """(decoding sequences, prompt tokens) of every forward of the run, first come first served."""
    if min(input_len, output_len, num_requests, max_sequences, max_num_tokens) < 1:
        raise ValueError("an offline run needs positive lengths, requests, batch cap and tokens per step")
    slots = min(max_sequences, num_requests, max_num_tokens)
    steps = num_requests * (output_len + input_len / max_num_tokens) / slots
    if steps > MAX_OFFLINE_STEPS:
        raise ValueError(
            f"an offline run of {num_requests:,} requests at {slots:,} sequences per step takes about "
            f"{steps:,.0f} forwards (at most {MAX_OFFLINE_STEPS:,} are simulated): fewer requests or a larger batch"
        )
    joins: defaultdict[int, int] = defaultdict(int)  # sequences starting to decode at a step
    leaves: defaultdict[int, int] = defaultdict(int)  # sequences whose last token is at a step
    batches: list[int] = []
    prompts: list[int] = []
    admitted = prefilled = finished = decoding = partial = 0
    step = 0
    while finished < num_requests:
        decoding += joins.pop(step, 0)
        admitted = min(num_requests, finished + max_sequences)
        waiting = (admitted - prefilled) * input_len - partial
        chunk = max(min(max_num_tokens - decoding, waiting), 0)
        batches.append(decoding)
        prompts.append(chunk)
        done = (partial + chunk) // input_len
        partial = (partial + chunk) - done * input_len
        prefilled += done
        if output_len > 1:
            joins[step + 1] += done
            leaves[step + output_len - 1] += done
        else:
            finished += done
        leaving = leaves.pop(step, 0)
        finished += leaving
        decoding -= leaving
        step += 1
    return np.asarray(batches, dtype=np.float64), np.asarray(prompts, dtype=np.float64)


def offline_run(
    model: ModelSpec,
    shape: ReplicaShape,
    hw: Hardware,
    layout: ServeLayout,
    *,
    input_len: int,
    output_len: int,
    num_requests: int,
    max_sequences: int,
) -> OfflineRun:
    """``num_requests`` requests through one replica holding at most ``max_sequences`` (serve_load.capacity)."""
    per_forward = layout.pp * (layout.tp if layout.dp_attention else 1)
    b, p = offline_schedule(
        input_len=input_len,
        output_len=output_len,
        num_requests=num_requests,
        max_sequences=max_sequences,
        max_num_tokens=hw.cal.max_num_tokens * per_forward,
    )
    b, p = b / per_forward, p / per_forward
    rows = np.where(p > 0, b, graph_batch(b)) if hw.cal.cuda_graph_padding else b
    context = input_len + output_len / 2
    step = decode_step(model, shape, hw, layout, batch=b, context=context, prefill_tokens=p, rows=rows)
    run_s = float(np.sum(step.total_s)) * pipeline_factor(hw, layout)
    return OfflineRun(
        num_requests=num_requests,
        steps=int(b.size),
        run_s=run_s,
        output_tokens_per_s=num_requests * output_len / run_s,
        mean_batch=float(np.mean(b)) * per_forward,
        decode_only_share=float(np.mean(p == 0)),
    )
