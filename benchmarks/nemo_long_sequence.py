"""Context parallelism from 4K to 1M tokens against NeMo's long-sequence table, which is not a validation source.

    python benchmarks/nemo_long_sequence.py

NVIDIA NeMo, docs/source/performance/performance_long_sequence.md (NeMo 24.03.01, Llama 2 7B in FP8 on DGX H100,
as many GPUs as thousands of tokens): the layout of every row with context parallelism (TP, PP, DP, CP) and its
model TFLOP/s per GPU. The table states neither the global batch nor the activation recompute, so it is not a
source of `meshplan validate`; this script types each row as `meshplan estimate` with NeMo's stack and prints the
prediction (Megatron's FLOP count, the one NeMo reports) with no recompute and with selective recompute, at one
and at eight micro-batches a step, beside the published number.
"""

from __future__ import annotations

import contextlib
import io as text_io
import json

from meshplan import io
from meshplan.cli import main as meshplan_cli
from meshplan.validate import megatron_flops

ROWS = (  # thousands of tokens (= GPUs), published TFLOP/s per GPU, tp, pp, dp, cp
    (4, 768, 1, 1, 4, 1),
    (8, 730, 1, 2, 4, 1),
    (16, 660, 2, 1, 8, 1),
    (32, 610, 2, 1, 8, 2),
    (64, 574, 4, 1, 8, 2),
    (128, 555, 4, 1, 8, 4),
    (256, 549, 4, 1, 8, 8),
    (512, 549, 8, 1, 4, 16),
    (1024, 536, 8, 1, 4, 32),
)


def predicted_tflops(seq_k: int, tp: int, pp: int, dp: int, cp: int, *, recompute: str, steps: int) -> float:
    """Model TFLOP/s per GPU of one row as `meshplan estimate` gives it, ``steps`` micro-batches a step."""
    gpus, seq, batch = seq_k, seq_k * 1024, dp * steps
    args = ["estimate", "llama-2-7b", "--gpu", "h100-sxm", "--scale-out", "ib-ndr", "--stack", "nemo"]
    args += ["--precision", "fp8", "--gpus", str(gpus), "--seq", str(seq), "--global-batch", str(batch)]
    args += ["--tp", str(tp), "--pp", str(pp), "--cp", str(cp), "--dp-shard", str(dp), "--zero", "1"]
    args += ["--micro-batch", "1", "--recompute", recompute, "--json", *(["--sp"] if tp > 1 else [])]
    out = text_io.StringIO()
    with contextlib.redirect_stdout(out):
        assert meshplan_cli(args) in (0, None)
    step_s = json.loads(out.getvalue())["step_time_s"]
    m = io.load_model("llama-2-7b")
    flops = megatron_flops(
        batch=batch,
        layers=m.num_layers,
        seq=seq,
        hidden=m.hidden,
        vocab=m.vocab_size,
        ffn_hidden=m.ffn_hidden,
        kv_heads=m.num_kv_heads,
        heads=m.num_heads,
        gated=True,
    )
    return flops / (step_s * gpus) / 1e12


def main() -> None:
    print("tokens  layout              published  none, m=1  none, m=8  selective, m=1  selective, m=8")
    for seq_k, published, tp, pp, dp, cp in ROWS:
        cells = []
        for recompute in ("none", "selective"):
            for steps in (1, 8):
                tf = predicted_tflops(seq_k, tp, pp, dp, cp, recompute=recompute, steps=steps)
                cells.append(f"{tf:4.0f} ({tf / published - 1:+.0%})")
        layout = f"TP{tp} PP{pp} DP{dp} CP{cp}"
        print(f"{seq_k:5d}K  {layout:18s}  {published:9d}  " + "  ".join(f"{c:>14s}" for c in cells))


if __name__ == "__main__":
    main()
