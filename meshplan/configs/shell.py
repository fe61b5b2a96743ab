"""The words of a launch script or an argument file, as the shell would pass them, without running anything.

A launch script sets variables (``TP=8``, ``CKPT=${1:-ckpt}``) and lists flags, often in arrays
(``MODEL_ARGS=( --num-layers 32 ... )``) that a last line expands. Reading it as text: comments are dropped, the
variables it sets are substituted (``$TP``, ``${TP}``, ``${1:-default}``), the words are split as the shell
splits them, and a quoted word holding a flag and its value (``"--fp8-format hybrid"``, as an array element
written to be word-split) is split again. Both branches of an ``if`` are read: a flag the two branches set
differently reaches the reader twice, which refuses it when it maps to the schema.
"""

from __future__ import annotations

import re
import shlex

_ASSIGN = re.compile(r"^\s*(?:export\s+|local\s+|readonly\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
MAX_WORDS = 20_000
SHELL_WORDS = frozenset(
    {"fi", "then", "else", "elif", "do", "done", "esac", "if", "for", "while", ";", ";;", "&&", "||", "|"}
)
"""The shell's own words: never a flag's value."""


def _substitute(text: str, variables: dict[str, str]) -> str:
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in variables:
            return variables[name]
        return m.group(2) if m.group(2) is not None else m.group(0)

    return _VAR.sub(one, text)


def _split(line: str, label: str, number: int) -> list[str]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=False)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError as exc:
        raise ValueError(f"{label} line {number}: {exc} (unbalanced quotes?)") from None


def script_words(text: str, label: str) -> list[str]:
    """Every word of ``text`` after substitution, in order; ValueError (one line) for unbalanced quotes."""
    variables: dict[str, str] = {}
    words: list[str] = []
    lines = text.replace("\\\n", " ").splitlines()
    for number, raw in enumerate(lines, 1):
        line = _substitute(raw, variables)
        m = _ASSIGN.match(line)
        if m and not m.group(2).lstrip().startswith("("):
            value = _split(m.group(2), label, number)
            variables[m.group(1)] = value[0] if value else ""
            continue
        if m:  # NAME=( ... or NAME+=( ...: the array's words are the flags
            line = m.group(2).lstrip()[1:]
        for word in _split(line, label, number):
            if word in ("(", ")") or word.endswith("+=("):
                continue
            word = word.removesuffix(")") if word.endswith(")") and "(" not in word else word
            words += word.split() if word.startswith("-") and " " in word else [word]
        if len(words) > MAX_WORDS:
            raise ValueError(f"{label} holds over {MAX_WORDS:,} words: is it a launch script?")
    return words


def flag_pairs(
    words: list[str], switches: frozenset[str] = frozenset(), short: frozenset[str] = frozenset()
) -> list[tuple[str, str | None]]:
    """(flag, value or None) for each flag among ``words``: ``--flag=value``, ``--flag value`` (the next word when
    it is not itself a flag), or a bare ``--flag`` (a switch: listed in ``switches``, or followed by a flag).
    Single-dash words count only when listed in ``short`` (``-tp``); others are the script's own (``mkdir -p``)."""
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        flag, has_value, value = word.partition("=")
        if not (flag.startswith("--") and len(flag) > 2) and flag not in short:
            continue
        if has_value:
            pairs.append((flag, value))
        elif (
            flag in switches
            or i == len(words)
            or words[i] in SHELL_WORDS
            or (words[i].startswith("-") and not _is_number(words[i]))
        ):
            pairs.append((flag, None))
        else:
            pairs.append((flag, words[i]))
            i += 1
    return pairs


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True
