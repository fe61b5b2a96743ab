"""The YAML engine configs are written in, read without a YAML library: block mappings and sequences, flow lists
and maps on one line, plain and quoted scalars, comments.

meshplan declares no YAML dependency, and the configs it reads (accelerate's, NeMo's and Megatron-Bridge's)
use only this part of YAML. What could make a small file large or mean something else is refused with one
line: anchors and aliases (the "billion laughs"), tags, block scalars (``|``, ``>``), several documents, a key
stated twice, nesting over ``MAX_DEPTH``. The text's size is capped by files.py's reader before it gets here.
"""

from __future__ import annotations

import re
from typing import Any

from meshplan.files import MAX_DEPTH

_INT = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")
_FLOAT = re.compile(r"^[-+]?(\d[\d_]*)?\.?\d*([eE][-+]?\d+)?$")
_NULL = ("", "~", "null", "Null", "NULL")
_TRUE = ("true", "True", "TRUE")
_FALSE = ("false", "False", "FALSE")


class _Lines:
    def __init__(self, text: str, label: str) -> None:
        self.label = label
        self.items: list[tuple[int, int, str]] = []  # (line number, indent, content)
        for number, raw in enumerate(text.splitlines(), 1):
            if "\t" in raw[: len(raw) - len(raw.lstrip())]:
                raise ValueError(f"{label} line {number}: YAML indents with spaces, not tabs")
            content = _strip_comment(raw, label, number).rstrip()
            if not content.strip():
                continue
            if content.strip() in ("---", "..."):
                if self.items:
                    raise ValueError(f"{label} line {number}: one YAML document per file")
                continue
            self.items.append((number, len(content) - len(content.lstrip()), content.strip()))

    def error(self, i: int, what: str) -> ValueError:
        number = self.items[i][0] if i < len(self.items) else "end"
        return ValueError(f"{self.label} line {number}: {what}")


def _strip_comment(line: str, label: str, number: int) -> str:
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"" and (i == 0 or line[i - 1] in " :-[{,"):
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def parse_yaml(text: str, label: str) -> Any:
    """The YAML text's value; ValueError (one line naming ``label`` and the line) for what it refuses."""
    lines = _Lines(text, label)
    if not lines.items:
        return {}
    value, i = _block(lines, 0, lines.items[0][1], 1)
    if i != len(lines.items):
        raise lines.error(i, "unexpected indentation")
    return value


def _block(lines: _Lines, i: int, indent: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise lines.error(i, f"nests more than {MAX_DEPTH} deep")
    content = lines.items[i][2]
    if content == "-" or content.startswith("- "):
        return _sequence(lines, i, indent, depth)
    return _mapping(lines, i, indent, depth)


def _mapping(lines: _Lines, i: int, indent: int, depth: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    while i < len(lines.items):
        _, ind, content = lines.items[i]
        if ind < indent:
            break
        if ind > indent:
            raise lines.error(i, "unexpected indentation")
        key, sep, rest = _split_key(content)
        if not sep:
            raise lines.error(i, f"expected 'key: value', got {content[:60]!r}")
        key = _scalar(key, lines, i)
        if not isinstance(key, str | int | float | bool) or isinstance(key, float):
            raise lines.error(i, "keys must be plain words")
        key = str(key)
        if key in out:
            raise lines.error(i, f"the key {key[:40]!r} appears twice")
        i += 1
        if rest:
            out[key] = _inline(rest, lines, i - 1, depth)
        elif i < len(lines.items) and (
            lines.items[i][1] > ind or (lines.items[i][1] == ind and lines.items[i][2].startswith("- "))
        ):
            out[key], i = _block(lines, i, lines.items[i][1], depth + 1)
        else:
            out[key] = None
    return out, i


def _sequence(lines: _Lines, i: int, indent: int, depth: int) -> tuple[list[Any], int]:
    out: list[Any] = []
    while i < len(lines.items):
        _, ind, content = lines.items[i]
        if ind < indent or not (content == "-" or content.startswith("- ")):
            break
        if ind > indent:
            raise lines.error(i, "unexpected indentation")
        rest = content[1:].strip()
        i += 1
        if not rest:
            if i < len(lines.items) and lines.items[i][1] > ind:
                value, i = _block(lines, i, lines.items[i][1], depth + 1)
                out.append(value)
            else:
                out.append(None)
        elif _split_key(rest)[1] and not rest.startswith(("[", "{", "'", '"')):
            # "- key: value" then more keys indented to the first one's column
            inner = ind + 1 + (len(content[1:]) - len(content[1:].lstrip()))
            lines.items.insert(i, (lines.items[i - 1][0], inner, rest))
            value, i = _mapping(lines, i, inner, depth + 1)
            out.append(value)
        else:
            out.append(_inline(rest, lines, i - 1, depth))
    return out, i


def _split_key(content: str) -> tuple[str, bool, str]:
    """(key, whether a 'key:' separator was found, the rest) of a mapping line."""
    if content[:1] in "'\"":
        end = content.find(content[0], 1)
        if end > 0 and content[end + 1 : end + 2] == ":":
            return content[: end + 1], True, content[end + 2 :].strip()
    m = re.match(r"^([^\s:'\"\[\]{},#&*!|>][^:]*?):(\s+|$)", content)
    if not m:
        return content, False, ""
    return m.group(1).strip(), True, content[m.end() :].strip()


def _inline(text: str, lines: _Lines, i: int, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise lines.error(i, f"nests more than {MAX_DEPTH} deep")
    if text[0] in "[{":
        value, end = _flow(text, 0, lines, i, depth)
        if text[end:].strip():
            raise lines.error(i, f"unexpected text after {text[0]}: {text[end:][:40]!r}")
        return value
    return _scalar(text, lines, i)


def _flow(text: str, pos: int, lines: _Lines, i: int, depth: int) -> tuple[Any, int]:
    if depth > MAX_DEPTH:
        raise lines.error(i, f"nests more than {MAX_DEPTH} deep")
    close = "]" if text[pos] == "[" else "}"
    items: list[Any] = []
    mapping: dict[str, Any] = {}
    pos += 1
    while True:
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if pos >= len(text):
            raise lines.error(i, f"unclosed {'[' if close == ']' else '{'}")
        if text[pos] == close:
            return (items if close == "]" else mapping), pos + 1
        if text[pos] in "[{":
            value, pos = _flow(text, pos, lines, i, depth + 1)
        else:
            end = pos
            quote = text[pos] if text[pos] in "'\"" else ""
            if quote:
                end = text.find(quote, pos + 1)
                if end < 0:
                    raise lines.error(i, "unclosed quote")
                end += 1
            while end < len(text) and text[end] not in ",]}":
                end += 1
            word = text[pos:end].strip()
            if close == "}":
                key, sep, rest = _split_key(word)
                if not sep:
                    raise lines.error(i, f"expected 'key: value' in {{...}}, got {word[:40]!r}")
                if key in mapping:
                    raise lines.error(i, f"the key {key[:40]!r} appears twice")
                mapping[str(_scalar(key, lines, i))] = _scalar(rest, lines, i)
                value = None
            else:
                value = _scalar(word, lines, i)
            pos = end
        if close == "]":
            items.append(value)
        while pos < len(text) and text[pos] == " ":
            pos += 1
        if pos < len(text) and text[pos] == ",":
            pos += 1


def _scalar(text: str, lines: _Lines, i: int) -> Any:
    text = text.strip()
    if text[:1] in ("&", "*"):
        raise lines.error(i, "YAML anchors and aliases are not read (write the values out)")
    if text[:1] == "!":
        raise lines.error(i, "YAML tags are not read")
    if text[:1] in ("|", ">"):
        raise lines.error(i, "YAML block scalars (| and >) are not read")
    if text[:1] in "'\"":
        if len(text) < 2 or text[-1] != text[0]:
            raise lines.error(i, "unclosed quote")
        body = text[1:-1]
        return body.replace("''", "'") if text[0] == "'" else body.replace('\\"', '"').replace("\\\\", "\\")
    if text in _NULL:
        return None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    if _INT.match(text):
        return int(text.replace("_", ""))
    if _FLOAT.match(text) and any(c.isdigit() for c in text):
        return float(text.replace("_", ""))
    if text.lower() in (".inf", "-.inf", "+.inf", ".nan"):
        raise lines.error(i, f"{text} is not a finite number")
    return text
