"""The fields that turn a step time into days, dollars and goodput: the price of a GPU-hour (training and
serving share it), how checkpoints are written and how often GPUs fail (core/goodput.py holds the formulas)."""

from __future__ import annotations

from meshplan.spec.schema.field import Field, Group

_G = Group.COST
RESTART_MINUTES = 10.0
"""The default time from a failure to training again: an assumption (requeue, process start, NCCL set-up, the
checkpoint read back), not a measurement; with it Llama 3's failure rate gives about the 90% effective training
time its paper reports (docs/formulas.md, section 11)."""

COST_FIELDS: tuple[Field, ...] = (
    Field(
        name="price_per_gpu_hour",
        type=float,
        default=None,
        group=_G,
        unit="currency per GPU-hour",
        lo=0,
        hi=1e4,
        exclusive_lo=True,
        help="what one GPU-hour costs: adds the cost to train (per million tokens, and in total with --tokens) "
        "and, on serve, per million output tokens; unset, no cost is printed",
    ),
    Field(
        name="mtbf_gpu_hours",
        type=float,
        default=None,
        group=_G,
        unit="GPU-hours per failure of one GPU",
        lo=1,
        hi=1e9,
        help="mean time between failures of one GPU (the job fails N times as often): adds goodput, the time "
        "to train with failures paid (needs --checkpoint-bandwidth); Llama 3's 466 interruptions in 54 days on "
        "16,384 GPUs give 45566; unset, failures are not counted",
    ),
    Field(
        name="checkpoint_bandwidth",
        type=float,
        default=None,
        group=_G,
        unit="GB/s per node",
        lo=0.001,
        hi=1e4,
        help="storage write bandwidth of each node (host): every node writes its GPUs' share of the checkpoint "
        "at once; adds the checkpoint's size and save time",
    ),
    Field(
        name="checkpoint_interval",
        type=int,
        default=None,
        group=_G,
        unit="steps",
        lo=1,
        hi=1e9,
        help="optimizer steps between checkpoints (default: the Young/Daly optimum, sqrt(2 x save time x the "
        "job's MTBF), in whole steps)",
    ),
    Field(
        name="checkpoint_interval_minutes",
        type=float,
        default=None,
        group=_G,
        unit="minutes",
        lo=0.01,
        hi=525_600,
        help="minutes of training between checkpoints, instead of --checkpoint-interval steps",
    ),
    Field(
        name="restart_minutes",
        type=float,
        default=RESTART_MINUTES,
        group=_G,
        unit="minutes",
        lo=0,
        hi=10_080,
        help="time from a failure to training again: requeue, start, load the checkpoint (an assumption; "
        "measure yours)",
    ),
)
