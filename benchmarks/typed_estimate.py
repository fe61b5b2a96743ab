"""`meshplan estimate` (or `serve`) as a user types it, its JSON report back: the outside-reference scripts' helper."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

from meshplan.cli import main


def estimate_json(args: list[str], command: str = "estimate") -> dict[str, Any]:
    """The report of ``meshplan COMMAND ARGS --json`` (estimate unless named; a bad argument fails the script)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([command, *args, "--json"]) == 0
    report: dict[str, Any] = json.loads(out.getvalue())
    return report
