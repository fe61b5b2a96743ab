"""The ``meshplan`` command: parse arguments, call a report, print a table or JSON.

Bad input exits with code 2 and one line on stderr; Ctrl-C with 130 and one line. The flags are made in
cli/parser.py from the request schema, the commands live in cli/commands.py.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from meshplan.cli.parser import add_fields as add_fields
from meshplan.cli.parser import build_parser as build_parser
from meshplan.cli.support import UsageError, check_numbers, error_line, interrupted

__all__ = ["build_parser", "exit_code", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("meshplan: interrupted", file=sys.stderr)
        return 130
    except ImportError as exc:  # numpy turns a Ctrl-C during its import into an ImportError
        if not interrupted(exc):
            raise
        print("meshplan: interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    try:
        from meshplan.cli.from_file import expand

        argv, provenance = expand(sys.argv[1:] if argv is None else argv)
        args = build_parser().parse_args(argv)
        check_numbers(args)
        from meshplan.cli.commands import COMMANDS

        result = COMMANDS[args.command](args)
        if result is None:
            return 0
        if provenance is not None:
            result = {**result, "from_file": provenance}
        text = None if args.json else _render(args.command, result, provenance)
    except UsageError as exc:
        print(_bounded(f"{exc}"), file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:  # ValueError: a refused input; OSError: a file we were told to use
        print(_bounded(f"meshplan: error: {error_line(exc)}"), file=sys.stderr)
        return 2
    if text is None:
        from meshplan.render import to_json

        text = to_json(result)
    try:
        print(text)
    except BrokenPipeError:  # the reader (head, less) closed the pipe: not an error of ours
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    return exit_code(args.command, result)


def _bounded(line: str) -> str:
    from meshplan.io import bounded_message

    return bounded_message(line)


def _render(command: str, result: dict[str, Any], provenance: dict[str, Any] | None = None) -> str:
    from meshplan.cli.tables import render_table

    if provenance is None:
        return render_table(command, result)
    from meshplan.cli.from_file import render

    return render_table(command, result) + "\n" + render(provenance)


def exit_code(command: str, result: dict[str, Any]) -> int:
    """0, or 1 when a check the command runs did not hold (validate, check) or a search found no layout that fits
    (plan: its answer still says why, and what would fit), so a script can stop before it launches anything."""
    if command in ("validate", "check"):
        return 0 if result.get("all_ok") else 1
    if command == "plan" and result.get("feasible") == 0:
        return 1
    return 0
