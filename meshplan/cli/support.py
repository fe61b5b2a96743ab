"""What the CLI does around a command: input checks, one-line errors, progress on a terminal.

Kept apart from ``cli/__init__.py`` (which declares the flags) so the checks apply to every flag, whoever declares it.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any


class UsageError(Exception):
    """A mistake in the command line, reported in one line with exit code 2."""


FLOAT_BOUNDS: dict[str, tuple[float, float]] = {"size_mb": (1e-6, 1e7)}
"""Ranges of the float flags the request schema does not declare (collectives' buffer: one byte to 10 TB);
the schema's own fields are parsed and bounded where argparse reads them (spec/requests.py)."""


def check_numbers(args: argparse.Namespace) -> None:
    """Every float flag finite and within its range, or UsageError naming the flag."""
    for name, value in vars(args).items():
        if not isinstance(value, float):
            continue
        flag = "--" + name.replace("_", "-")
        low, high = FLOAT_BOUNDS.get(name, (-math.inf, math.inf))
        if not math.isfinite(value):
            raise UsageError(f"meshplan {args.command}: {flag} must be a finite number, got {value}")
        if not low <= value <= high:
            raise UsageError(f"meshplan {args.command}: {flag} must be in [{low:g}, {high:g}], got {value:g}")


def interrupted(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt caused ``exc`` (numpy, for one, re-raises it as an ImportError)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def error_line(exc: BaseException) -> str:
    """One line for a refused input: the message of a ValueError, or what an OSError was about."""
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or type(exc).__name__}"
    text = str(exc.args[0]) if exc.args else type(exc).__name__
    return text.splitlines()[0] if text.strip() else type(exc).__name__


READ_FLAGS = ("model", "gpu", "scale_out", "stack", "profile", "from_plan", "runs", "from_file")
"""The flags (dests) that may name a file a command reads: MODEL (a config.json, a model TOML or a folder), --gpu,
--scale-out and --stack (TOML files), --profile FILE, export's --from-plan, calibrate's RUNS.json and --from FILE."""


def input_words(args: argparse.Namespace) -> list[str]:
    """The values of the command's READ_FLAGS: the files it reads are among them, and no output may overwrite one
    (a catalog name or an inline profile names no file, and drops out where the writer compares files)."""
    return [v for k, v in vars(args).items() if k in READ_FLAGS and isinstance(v, str)]


def check_output(args: argparse.Namespace, dest: str, flag: str) -> None:
    """Refuse at once, before any work, an output file files.py's safe writer would refuse (a folder that does
    not exist, a link, an input of the command, an existing file without --force)."""
    from meshplan.files import writable

    if getattr(args, dest):
        writable(getattr(args, dest), what=flag, inputs=input_words(args), force=args.force)


def save_json(args: argparse.Namespace, result: dict[str, Any], *, dest: str = "save", flag: str = "--save") -> None:
    """``result`` as JSON in the file flag ``dest`` names, through files.py's one safe writer."""
    import json

    from meshplan.files import write_text_safely

    text = json.dumps(result, indent=2) + "\n"
    write_text_safely(getattr(args, dest), text, what=flag, inputs=input_words(args), force=args.force)


SHOW_AFTER_S = 1.0
"""Seconds a search or a validation runs before its progress line appears (a quick one shows none)."""


class _Progress:
    """Layouts searched and time spent, on one stderr line that rewrites itself, once a search passes 1 s."""

    def __init__(self) -> None:
        self.shown = False

    def __call__(self, evaluated: int, share: float, elapsed_s: float) -> None:
        if elapsed_s >= SHOW_AFTER_S:
            self.show(f"searching: {evaluated:,} layouts evaluated ({share:.0%}), {elapsed_s:.1f} s")

    def show(self, line: str) -> None:
        sys.stderr.write(f"\r{line}")
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


class _Runs(_Progress):
    """Published runs predicted and time spent, for ``validate`` (every run, then each held-out fit's)."""

    def __init__(self) -> None:
        import time

        super().__init__()
        self.clock = time.monotonic
        self.start, self.last, self.runs = self.clock(), -1.0, 0

    def run(self) -> None:
        self.runs += 1
        now = self.clock() - self.start
        if now >= SHOW_AFTER_S and now - self.last >= 0.1:
            self.last = now
            self.show(f"validating: {self.runs:,} predictions of published runs, {now:.1f} s")


def validate_progress(args: argparse.Namespace) -> Any:
    """A context that shows validate's progress on a terminal's stderr (never with --json or into a pipe)."""
    import contextlib

    if args.json or not sys.stderr.isatty():
        return contextlib.nullcontext()
    from meshplan.validation.training import progress

    shown = _Runs()

    @contextlib.contextmanager
    def showing() -> Any:
        try:
            with progress(shown.run):
                yield
        finally:
            shown.clear()

    return showing()


def search_progress(args: argparse.Namespace) -> Any:
    """A context that shows search progress on a terminal's stderr (never with --json or into a pipe)."""
    import contextlib

    if args.json or not sys.stderr.isatty():
        return contextlib.nullcontext()
    from meshplan.search.limits import progress

    shown = _Progress()

    @contextlib.contextmanager
    def showing() -> Any:
        try:
            with progress(shown):
                yield
        finally:
            shown.clear()

    return showing()


def write_export(result: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """The export's files and a launch.sh in folder ``--out``, each through files.py's safe writer, all checked
    before any is written; the names written."""
    from pathlib import Path

    from meshplan.files import writable, write_text_safely

    folder, inputs = Path(args.out), input_words(args)
    files = {**result["files"], "launch.sh": "#!/bin/sh\n" + result["command"] + "\n"}
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"meshplan export: --out {args.out} is not a folder")
    if folder.is_dir():
        for name in files:
            writable(folder / name, what="--out", inputs=inputs, force=args.force)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"meshplan export: --out {args.out}: {exc.strerror or exc}") from None
    for name, text in files.items():
        write_text_safely(folder / name, text, what="--out", inputs=inputs, force=args.force)
    return sorted(files)
