"""The text of ``meshplan export``: the stack a training export assumes, the command over lines that paste whole,
the files as written and the notes."""

from __future__ import annotations

from typing import Any

from meshplan.cli.tables_conditions import stack_line
from meshplan.render import WIDTH, fit_width


def export_table(r: dict[str, Any]) -> str:
    """The stack a training export assumes, the command (continued over lines with a backslash, so it pastes
    whole), each file as written (its lines are the engine's), and the notes."""
    out = [f"# {r['engine']} {r['engine_version']}", *(f"# {line}" for line in stack_line(r))]
    out.append(shell_lines(f"$ {r['command']}"))
    for name, text in r["files"].items():
        out += ["", f"--- {name}", text.rstrip()]
    out += [fit_width(f"note: {n}") for n in r["notes"]]
    if "written" in r:
        out.append("written: " + ", ".join(r["written"]))
    return "\n".join(out)


def shell_lines(command: str, width: int = WIDTH) -> str:
    """A shell command over lines of at most ``width`` columns, each but the last ending in `` \\``: broken at
    spaces outside quotes only, so it runs as one line does."""
    words, word, quote = [], "", ""
    for ch in command:
        if ch == " " and not quote:
            words += [word] if word else []
            word = ""
            continue
        quote = "" if ch == quote else ch if not quote and ch in "'\"" else quote
        word += ch
    words += [word] if word else []
    lines, line = [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width - 2:
            lines.append(line + " \\")
            line = "    " + w
        else:
            line = f"{line} {w}" if line else w
    return "\n".join([*lines, line])
