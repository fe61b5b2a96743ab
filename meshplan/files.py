"""Files a user names, in and out: the one guarded reader and the one safe writer.

Reading: every file a user gives (a model's config.json or TOML, a GPU, link or stack TOML, ``--profile FILE``,
``calibrate``'s RUNS.json, ``export --from-plan``'s saved plan, ``compare``'s trace, snapshot and logged numbers)
is read by ``read_text_file`` (a snapshot's pickle by ``read_bytes_file``): a regular file of at
most ``MAX_FILE_BYTES``, its type checked before it is opened (a FIFO, ``/dev/zero`` or a folder is refused without
reading a byte), its JSON or TOML nested at most ``MAX_DEPTH`` deep, every number in it finite and every integer
within 64 bits (TOML's own range). Each refusal is one ``ValueError`` line that names the file.

Writing: every file a user names for output (``plan --save``, ``serve-plan --save``, ``calibrate --out``,
``export --out``'s files) is written by ``write_text_safely``: never over a file the same command reads, never
through a symbolic link, never over an existing file unless ``force``, and through a temporary file in the same
folder renamed over the target (``os.replace``), so a reader never sees half a file.

Standard library only, so the CLI starts fast.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MAX_FILE_BYTES = 4 * 1024 * 1024
"""Largest input file read (a config.json is a few KB; a saved plan a few hundred KB)."""
MAX_DEPTH = 64
"""Deepest nesting of tables and arrays accepted in a JSON or TOML input."""
MAX_INT = 2**63 - 1
"""Largest integer magnitude accepted in a JSON or TOML input: TOML's own 64-bit range (no count meshplan reads
comes near it; beyond, a number no longer converts to a float, or loses its meaning as one)."""


# --- reading -----------------------------------------------------------------------------------------------------


def _refuse_number(value: Any) -> str | None:
    """Why a parsed number is refused (None: it is fine)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"is not a finite number ({value})"
    if isinstance(value, int) and abs(value) > MAX_INT:
        return "is an integer beyond 64 bits"
    return None


def _checked(data: Any, label: str) -> Any:
    """``data`` when it nests at most MAX_DEPTH deep and all its numbers are finite and in range; ValueError
    otherwise (walked without recursion)."""
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    while stack:
        item, level, where = stack.pop()
        if level > MAX_DEPTH:
            raise ValueError(f"{label} nests tables or arrays more than {MAX_DEPTH} deep")
        if isinstance(item, dict):
            stack.extend((v, level + 1, f"{where}.{k}" if where else str(k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, level + 1, f"{where}[{i}]") for i, v in enumerate(item))
        elif (why := _refuse_number(item)) is not None:
            raise ValueError(f"{label}: '{where[:80] or 'the value'}' {why}")
    return data


def parse_json(text: str, label: str, *, unique_keys: bool = False) -> Any:
    """JSON text parsed, with the depth and number limits and one-line errors naming ``label``; ``unique_keys``
    refuses an object that states a key twice (parsers disagree on which value such a file means)."""
    hook = _unique_object if unique_keys else None
    try:  # NaN and Infinity (not JSON, but Python writes them) parse, and are refused by key just below
        data = json.loads(text, object_pairs_hook=hook)
    except ValueError as exc:  # JSONDecodeError, integers of over 4,300 digits, a repeated key
        raise ValueError(f"malformed JSON in {label}: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ValueError(f"{label} nests arrays or objects too deeply") from None
    return _checked(data, label)


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key[:40]!r} appears twice in one object")
        out[key] = value
    return out


def parse_toml(text: str, label: str) -> dict[str, Any]:
    """TOML text parsed, with the depth and number limits and one-line errors naming ``label``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"malformed TOML in {label}: {exc}") from None
    except RecursionError:
        raise ValueError(f"{label} nests tables or arrays too deeply") from None
    return dict(_checked(data, label))


def _kind(mode: int) -> str:
    return "a folder" if stat.S_ISDIR(mode) else "not a regular file"


def read_bytes_file(path: Path | str, *, what: str = "file", limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ValueError otherwise (FIFOs, devices, folders).

    The file's type is checked before it is opened (a FIFO is never opened, so it cannot block), then again on
    the open descriptor (opened without blocking, in case the name changed between), and read no further than
    the limit, so a FIFO, ``/dev/zero`` or a symlink to either costs nothing.
    """
    path = Path(path)
    try:
        before = os.stat(path)
    except FileNotFoundError:
        raise ValueError(f"no such {what}: {path}") from None
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(before.st_mode):
        raise ValueError(f"{what} {path} is {_kind(before.st_mode)}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise ValueError(f"no such {what}: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {path} is a folder, not a file") from None
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    info = os.fstat(fd)  # before fdopen, which refuses a folder with an OSError of its own
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ValueError(f"{what} {path} is {_kind(info.st_mode)}")
    with os.fdopen(fd, "rb") as f:
        if info.st_size > limit:
            raise ValueError(f"{what} {path} is {info.st_size:,} bytes; the limit is {limit:,}")
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise ValueError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise ValueError(f"{what} {path} is over {limit:,} bytes")
    return data


def read_text_file(path: Path | str, *, what: str = "file", limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes (``read_bytes_file``'s checks); ValueError
    otherwise."""
    data = read_bytes_file(path, what=what, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {path} is not UTF-8 text (byte {exc.start} is 0x{data[exc.start]:02x})") from None


def load_json_file(path: Path | str, *, what: str = "file") -> Any:
    """A JSON file read by ``read_text_file`` and parsed by ``parse_json`` (errors name ``what`` and the path)."""
    return parse_json(read_text_file(path, what=what), f"{what} {path}")


def load_toml_file(path: Path | str, *, what: str = "file") -> dict[str, Any]:
    """A TOML file read by ``read_text_file`` and parsed by ``parse_toml`` (errors name ``what`` and the path)."""
    return parse_toml(read_text_file(path, what=what), f"{what} {path}")


# --- writing -----------------------------------------------------------------------------------------------------


def _same_file(a: Path, b: os.stat_result) -> bool:
    try:
        info = os.stat(a)
    except (OSError, ValueError):  # absent, unreadable, or a name no file can have (a NUL byte)
        return False
    return (info.st_dev, info.st_ino) == (b.st_dev, b.st_ino)


def _input_files(inputs: Iterable[str | os.PathLike[str] | None]) -> list[Path]:
    """The files the command reads among ``inputs`` (any text: a catalog name is not a file and drops out; a
    folder counts with the config.json a model folder is read from)."""
    out = []
    for item in inputs:
        if item is None or (isinstance(item, str) and not item.strip()):
            continue
        path = Path(item)
        out += [path, path / "config.json"]
    return out


def writable(
    path: str | os.PathLike[str],
    *,
    what: str,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
    force: bool = False,
) -> Path:
    """``path`` when ``write_text_safely`` may write it; ValueError (one line, naming ``what``) when its folder is
    missing, when it is a symbolic link or not a regular file, when it is one of the command's ``inputs``
    (compared by device and inode, so another spelling, a hard link or a link to it are caught), or when it
    exists and ``force`` is not set. Call it before the work, to refuse at once, and ``write_text_safely`` after."""
    target = Path(path)
    name = f"{what} {path}"
    if not str(path).strip() or target.name in ("", ".", ".."):
        raise ValueError(f"{name}: name a file")
    if not target.parent.is_dir():
        raise ValueError(f"{name}: the folder {target.parent} does not exist")
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return target
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        raise ValueError(f"{name}: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISLNK(info.st_mode):
        raise ValueError(f"{name} is a symbolic link: meshplan does not write through links; name the file itself")
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{name} is {_kind(info.st_mode)}; meshplan writes only regular files")
    if any(_same_file(p, info) for p in _input_files(inputs)):
        raise ValueError(f"{name} is a file this command reads; write to another file (--force does not apply)")
    if not force:
        raise ValueError(f"{name} exists; add --force to replace it")
    return target


def write_text_safely(
    path: str | os.PathLike[str],
    text: str,
    *,
    what: str,
    inputs: Iterable[str | os.PathLike[str] | None] = (),
    force: bool = False,
) -> Path:
    """Write ``text`` (UTF-8) to ``path`` under ``writable``'s rules: into a new temporary file in the same folder,
    flushed to disk, then renamed over ``path`` (an existing file keeps its permissions); ValueError on any
    refusal or failure, with nothing left behind."""
    target = writable(path, what=what, inputs=inputs, force=force)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = None
    data = text.encode("utf-8")
    for _ in range(16):
        temp = target.with_name(f".{target.name}.{os.urandom(6).hex()}.tmp")
        try:  # O_EXCL and O_NOFOLLOW: a new file of ours, whatever else appears in the folder meanwhile
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
            break
        except FileExistsError:
            continue
        except OSError as exc:
            raise ValueError(f"{what} {path}: {exc.strerror or exc}") from None
    else:
        raise ValueError(f"{what} {path}: no free temporary name in {target.parent}")
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        writable(target, what=what, inputs=inputs, force=force)  # again, just before the rename
        os.replace(temp, target)
    except BaseException as exc:
        temp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ValueError(f"{what} {path}: {exc.strerror or exc}") from None
        raise
    return target


__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_INT",
    "load_json_file",
    "load_toml_file",
    "parse_json",
    "parse_toml",
    "read_bytes_file",
    "read_text_file",
    "writable",
    "write_text_safely",
]
