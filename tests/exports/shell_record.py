"""What bash would run for a launcher script, recorded without running any of it.

bash reads the script (``source``) with a DEBUG trap under ``extdebug``: the trap writes each simple command's
text and returns 1, which makes bash skip the command before expanding its words. Nothing the script names is
started, no command substitution runs, and PATH points nowhere besides. The recorded texts are split with shlex
into the argument lists the commands would get.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

BASH = shutil.which("bash")
SCRIPT = "launcher.sh"
LOG = "commands.log"
RECORDER = f"""
shopt -s extdebug
__record() {{
    [[ $BASH_COMMAND == "source ./{SCRIPT}" ]] && return 0
    printf '%s\\0' "$BASH_COMMAND" >> {LOG}
    return 1
}}
trap __record DEBUG
source ./{SCRIPT}
"""
ENV = {"PATH": "/nonexistent", "LC_ALL": "C"}


def recorded_commands(script: str, folder: Path) -> list[list[str]]:
    """The argument lists of the commands bash would run for ``script`` (syntax checked with ``bash -n`` first);
    ``folder`` is an empty scratch folder, left holding only the script and the log."""
    assert BASH is not None
    (folder / SCRIPT).write_bytes(script.encode("utf-8"))
    check = subprocess.run([BASH, "-n", SCRIPT], cwd=folder, env=ENV, capture_output=True, timeout=20)
    assert check.returncode == 0, check.stderr.decode(errors="replace")
    run = subprocess.run(
        [BASH, "--norc", "--noprofile", "-c", RECORDER], cwd=folder, env=ENV, capture_output=True, timeout=20
    )
    assert run.returncode == 0, run.stderr.decode(errors="replace")
    assert {p.name for p in folder.iterdir()} <= {SCRIPT, LOG}  # the script created nothing
    log = folder / LOG
    texts = log.read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1] if log.exists() else []
    log.unlink(missing_ok=True)
    return [shlex.split(_unescaped(text)) for text in texts]


def _unescaped(text: str) -> str:
    """BASH_COMMAND as written in the script: bash marks a quoted \\x01 or \\x7f (its own CTLESC and CTLNUL)
    with a \\x01 in front, which it drops again when it builds the arguments."""
    return re.sub("\x01([\x01\x7f])", r"\1", text)
