"""`meshplan estimate` as a user types it, its JSON report back: the outside-reference scripts' one helper."""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

from meshplan.cli import main


def estimate_json(args: list[str]) -> dict[str, Any]:
    """The report of ``meshplan estimate ARGS --json`` (a bad argument fails the script)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["estimate", *args, "--json"]) == 0
    report: dict[str, Any] = json.loads(out.getvalue())
    return report
