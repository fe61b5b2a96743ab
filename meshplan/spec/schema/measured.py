"""What a run measured, as a training loop logs it: ``meshplan compare``'s plain numbers (a profiler trace and a
memory snapshot are files, read by meshplan/traces/)."""

from __future__ import annotations

from meshplan.spec.schema.field import Field, Group

_M = Group.MEASURED
MAX_MEASURED_BYTES = 1e15
"""A petabyte: beyond any one GPU's memory by four orders of magnitude (a larger figure is a unit slip)."""

MEASURED_FIELDS: tuple[Field, ...] = (
    Field(
        name="step_time_s",
        type=float,
        default=None,
        group=_M,
        unit="s",
        lo=1e-6,
        hi=1e6,
        help="the run's measured time of one training step (the median of the logged steps, warm-up left out)",
    ),
    Field(
        name="max_memory_allocated",
        type=float,
        default=None,
        group=_M,
        unit="bytes",
        lo=0,
        hi=MAX_MEASURED_BYTES,
        exclusive_lo=True,
        suffixes=True,
        help="the run's torch.cuda.max_memory_allocated(): the most bytes its tensors held at once on one GPU",
    ),
    Field(
        name="max_memory_reserved",
        type=float,
        default=None,
        group=_M,
        unit="bytes",
        lo=0,
        hi=MAX_MEASURED_BYTES,
        exclusive_lo=True,
        suffixes=True,
        help="the run's torch.cuda.max_memory_reserved(): the most bytes the caching allocator held from the driver",
    ),
)
