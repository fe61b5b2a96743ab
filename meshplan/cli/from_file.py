"""``--from FILE``: an engine's config read into the command's flags, the flags typed beside it winning.

Before argparse runs, the file is read (meshplan.configs) and its values become flag words placed before the
words typed, so a typed flag overrides the file's and argparse checks both alike. ``plan`` searches layouts:
the file's layout becomes its ``--compare`` layout, not a pin. The report's ``from_file`` section says where each
value came from (a key of the file, a typed flag, or the stack's default), which values the command does not
take, and every key of the file not read with what it would change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshplan.cli.support import UsageError

FROM_COMMANDS = ("memory", "estimate", "plan", "serve", "serve-plan")
SERVING_COMMANDS = ("serve", "serve-plan")
STACK_SET = ("precision", "attention", "kernels")


def _take_from(words: list[str]) -> tuple[str | None, str | None, list[str]]:
    """(--from's value, --from-kind's value, the other words)."""
    found: dict[str, str | None] = {"--from": None, "--from-kind": None}
    rest: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, value = word.partition("=")
        if flag in found:
            if not eq:
                if i + 1 >= len(words):
                    raise UsageError(f"meshplan: error: {flag} needs a value")
                value = words[i + 1]
                i += 1
            if found[flag] is not None:
                raise UsageError(f"meshplan: error: {flag} is given twice")
            found[flag] = value
        else:
            rest.append(word)
        i += 1
    return found["--from"], found["--from-kind"], rest


def _scan(words: list[str], options: dict[str, Any]) -> tuple[dict[str, str | None], list[str], list[str]]:
    """(destination -> value of each flag typed, positional words, the other words in order)."""
    typed: dict[str, str | None] = {}
    positional: list[str] = []
    others: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word.startswith("--"):
            flag, eq, _ = word.partition("=")
            action = options.get(flag)
            others.append(word)
            if action is None:
                continue
            typed[action.dest] = word.partition("=")[2] if eq else None
            if action.nargs != 0 and not eq and i < len(words):
                typed[action.dest] = words[i]
                others.append(words[i])
                i += 1
        else:
            positional.append(word)
    return typed, positional, others


def expand(argv: Sequence[str]) -> tuple[list[str], dict[str, Any] | None]:
    """``argv`` with ``--from FILE`` replaced by the flags the file sets, and the provenance for the report (None
    when ``--from`` is not given)."""
    words = list(argv)
    if not words or words[0] not in FROM_COMMANDS:
        return words, None
    command = words[0]
    path, kind, rest = _take_from(words[1:])
    if path is None:
        if kind is not None:
            raise UsageError(f"meshplan {command}: error: --from-kind needs --from FILE")
        return words, None
    from meshplan.cli.parser import command_parser
    from meshplan.configs import read_config

    parser = command_parser(command)
    options = {opt: a for a in parser._actions for opt in a.option_strings}
    dests = {a.dest for a in parser._actions}
    typed, positional, others = _scan(rest, options)
    cfg = read_config(path, kind)
    serving = command in SERVING_COMMANDS
    if cfg.training == serving:
        what = "a training" if cfg.training else "a serving"
        use = "serve or serve-plan" if not cfg.training else "memory, estimate or plan"
        raise UsageError(f"meshplan {command}: error: {path} is {what} config ({cfg.kind}): read it with {use}")
    model, model_from = _model(command, path, cfg, positional)
    values: dict[str, Any] = {}
    sources = dict(cfg.sources)
    not_used: list[dict[str, Any]] = []
    layout: dict[str, Any] = {}
    from meshplan.spec.requests import Group, field

    for name, value in cfg.values.items():
        if name in typed:
            continue
        if command == "plan" and field(name).group is Group.LAYOUT:
            layout[name] = value
        elif name in dests:
            values[name] = value
        elif command == "plan" and name == "global_batch" and "global_batch_tokens" not in typed:
            seq, seq_from = _seq(cfg, typed)
            if seq is not None:
                values["global_batch_tokens"] = value * seq
                sources["global_batch_tokens"] = f"{sources[name]} x {seq_from}"
            else:
                not_used.append({"field": name, "value": value, "why": "plan takes --global-batch-tokens"})
        else:
            not_used.append({"field": name, "value": value, "why": f"meshplan {command} does not take it"})
    extra: list[str] = []
    if layout and "compare" in dests and "compare" not in typed:
        extra = ["--compare", ",".join(f"{k}={_word(v)}" for k, v in layout.items())]
    elif layout:
        not_used += [{"field": k, "value": v, "why": "--compare was typed"} for k, v in layout.items()]
    from meshplan.spec.argv import flag_args

    # --from stays among the words: the command knows the file it read (an output may never overwrite it)
    new = [command, *([model] if model else []), *flag_args(values), *extra, *others, "--from", path]
    provenance = _provenance(cfg, values, sources, typed, dests, model, model_from, not_used, extra)
    return new, provenance


def _seq(cfg: Any, typed: dict[str, str | None]) -> tuple[int | None, str]:
    """The sequence length plan's tokens per step take: the typed --seq, else the file's."""
    from meshplan.spec.requests import field

    if typed.get("seq") is not None:
        try:
            return int(field("seq").parse(typed["seq"])), "--seq (typed)"
        except ValueError:
            return None, ""  # argparse refuses it with its own line
    seq = cfg.values.get("seq")
    return (seq, cfg.sources["seq"]) if seq is not None else (None, "")


def _typed_value(name: str, raw: str | None) -> Any:
    """A typed flag's value as the schema parses it (its text when argparse is left to refuse it)."""
    from meshplan.spec.requests import field

    if raw is None:
        return True
    try:
        return field(name).parse(raw)
    except ValueError:
        return raw


def _word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _model(command: str, path: str, cfg: Any, positional: list[str]) -> tuple[str | None, str]:
    if len(positional) > 1:
        raise UsageError(f"meshplan {command}: error: unrecognized arguments: {' '.join(positional[1:])}")
    if positional:
        if cfg.model_shape:
            from meshplan.configs import check_shape
            from meshplan.io import load_model

            check_shape(load_model(positional[0]), cfg.model_shape, path)
        return positional[0], "MODEL (typed)"
    if cfg.model is None:
        raise UsageError(
            f"meshplan {command}: error: {path} names no model meshplan knows: give MODEL (a catalog name, a model "
            "TOML or a Hugging Face config.json)"
        )
    return cfg.model, f"file: {cfg.model_source}"


def _provenance(
    cfg: Any,
    values: dict[str, Any],
    sources: dict[str, str],
    typed: dict[str, str | None],
    dests: set[str],
    model: str | None,
    model_from: str,
    not_used: list[dict[str, Any]],
    compare: list[str],
) -> dict[str, Any]:
    from meshplan.spec.requests import BY_NAME, STACKS

    rows = [{"field": n, "value": v, "from": f"file: {sources[n]}"} for n, v in values.items()]
    for name, raw in typed.items():
        if name in BY_NAME:
            row = {"field": name, "value": _typed_value(name, raw), "from": "flag (typed)"}
            rows.append(row | ({"file_had": cfg.values[name]} if name in cfg.values else {}))
    out: dict[str, Any] = {
        "file": cfg.label,
        "kind": cfg.kind,
        "model": {"value": model, "from": model_from}
        | ({"file_had": cfg.model} if cfg.model and cfg.model != model else {}),
        "values": rows,
    }
    if compare:
        out["compared_layout"] = {"value": compare[1], "from": "the file's layout (plan searches; it compares)"}
    stack = typed.get("stack") or values.get("stack")
    if cfg.training and isinstance(stack, str) and stack in STACKS:
        from meshplan.io import load_stack

        given = set(values) | set(typed)
        defaults = load_stack(stack).defaults
        out["stack_defaults"] = {
            "stack": stack,
            "values": {k: v for k, v in defaults.items() if k not in given and k in dests},
        }
    out["not_used"] = not_used
    out["not_read"] = [u.as_dict() for u in cfg.unread]
    out["notes"] = list(cfg.notes)
    return out


def _wrapped(line: str) -> list[str]:
    import textwrap

    return textwrap.wrap(line, width=118, subsequent_indent="    ", break_on_hyphens=False) or [line]


def render(provenance: dict[str, Any]) -> str:
    """The ``from_file`` section as text, after the command's own table (long lines wrapped as the tables wrap)."""
    lines = ["", f"read from {provenance['file']} ({provenance['kind']}):"]
    m = provenance["model"]
    had = f" (the file had {m['file_had']})" if "file_had" in m else ""
    lines.append(f"  model {m['value']}  <- {m['from']}{had}")
    for row in provenance["values"]:
        value = row.get("value", "")
        had = f" (the file had {row['file_had']})" if "file_had" in row else ""
        lines.append(f"  {row['field']} {value}  <- {row['from']}{had}")
    if "compared_layout" in provenance:
        lines.append(f"  --compare {provenance['compared_layout']['value']}  <- the file's layout")
    defaults = provenance.get("stack_defaults")
    if defaults and defaults["values"]:
        text = ", ".join(f"{k}={v}" for k, v in defaults["values"].items())
        lines.append(f"  from the stack {defaults['stack']}'s defaults: {text}")
    for row in provenance["not_used"]:
        lines.append(f"  not used: {row['field']} {row['value']} ({row['why']})")
    if provenance["not_read"]:
        lines.append("not read, and what it would change:")
        effects: dict[str, list[str]] = {}
        for u in provenance["not_read"]:
            effects.setdefault(u["would_change"], []).append(f"{u['key']}={u['value']}")
        for effect, keys in effects.items():
            lines.append(f"  {effect}: {', '.join(keys)}")
    lines += [f"note: {n}" for n in provenance["notes"]]
    return "\n".join(part for line in lines for part in _wrapped(line))
