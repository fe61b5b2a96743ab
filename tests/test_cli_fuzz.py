"""Generated command lines: every refusal is exit 2 with one line, every answer is finite and physical.

Hypothesis builds argument lists for the commands that take numbers (good values, edge values and hostile
ones: zero, negatives, 2^63 and above, NaN, infinities, subnormals, text) and runs the CLI in-process. A
programming error would raise out of ``main`` and fail the test with its traceback; a refusal must be exit
code 2 and one line; an answer must hold no NaN, no infinity, no negative size or time, and a plan's layouts
must use exactly the GPUs given.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from meshplan.cli import main

pytestmark = pytest.mark.slow  # about 8 s on 2 busy cores; runs by default and in CI

MODELS = ["llama-3.2-1b", "llama-3.1-8b", "mixtral-8x7b", "qwen3-8b", "deepseek-v3"]
GPUS = ["h100-sxm", "a100-40gb", "l40s", "mi300x"]
HOSTILE = Path(__file__).resolve().parent / "hostile"
HOSTILE_MODELS = [str(HOSTILE / "gpt2-n-head-0.json"), str(HOSTILE / "llama-1e9-layers.json"), "no-such-model"]

hostile_ints = st.one_of(
    st.integers(min_value=-3, max_value=70_000),
    st.sampled_from([0, -1, 3, 2**31, 2**63, 2**70, 10**12]),
).map(str)
hostile_floats = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "-1e12", "5e-324", "1e400", "-0.0", "1e30", "abc"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


def mostly(good: list[str], hostile: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """A good value three times in four, a hostile one otherwise: both refusals and answers get checked."""
    return st.one_of(st.sampled_from(good), st.sampled_from(good), st.sampled_from(good), hostile)


def optional(flag: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.one_of(st.just([]), values.map(lambda v: [f"{flag}={v}"]))


def flags(*parts: st.SearchStrategy[list[str]]) -> st.SearchStrategy[list[str]]:
    return st.tuples(*parts).map(lambda groups: [arg for group in groups for arg in group])


degree = mostly(["1", "2", "4", "8"], hostile_ints)
seq = mostly(["1024", "4096", "8192"], hostile_ints)
fleet = flags(
    mostly(MODELS, st.sampled_from(HOSTILE_MODELS)).map(lambda m: [m]),
    mostly(GPUS, st.just("no-such-gpu")).map(lambda g: ["--gpu", g]),
    mostly(["8", "16", "64", "256"], hostile_ints).map(lambda n: [f"--gpus={n}"]),
)
layout = flags(
    optional("--tp", degree),
    optional("--pp", degree),
    optional("--seq", seq),
    optional("--micro-batch", degree),
    optional("--zero", st.sampled_from(["0", "1", "3", "4"])),
    optional("--optimizer-bytes", mostly(["0", "4", "12"], hostile_floats)),
    optional("--cp", degree),
    optional("--ep", degree),
    optional("--expert-tp", degree),  # above --tp it once raised ZeroDivisionError out of the data-parallel calls
    optional("--dp-shard", degree),
    st.one_of(st.just([]), st.just(["--sp"])),
)
command_lines = st.one_of(
    flags(st.just(["memory"]), fleet, layout),
    flags(st.just(["estimate"]), fleet, layout, optional("--tokens", mostly(["1e9", "1.5e13"], hostile_floats))),
    flags(st.just(["fit"]), fleet, optional("--seq", seq)),
    flags(
        st.just(["serving"]),
        fleet,
        optional("--tp", degree),
        optional("--context", seq),
        optional("--gpu-memory-utilization", mostly(["0.5", "0.9"], hostile_floats)),
    ),
    flags(
        st.just(["collectives"]),
        optional("--size-mb", mostly(["1", "256", "1e4"], hostile_floats)),
        optional("--group", degree),
    ),
    flags(
        st.just(["plan"]),
        st.sampled_from(MODELS[:4]).map(lambda m: [m, "--gpu", "h100-sxm"]),
        st.sampled_from(["8", "16", "64", "12", "3", "0", "1000000000000"]).map(lambda n: [f"--gpus={n}"]),
        st.sampled_from(["1024", "4096", "4096", "0", "100000000"]).map(lambda s: [f"--seq={s}"]),
        st.sampled_from(["1048576", "1048576", "1000", "-5"]).map(lambda t: [f"--global-batch-tokens={t}"]),
        optional("--headroom", mostly(["0", "0.1", "0.3"], hostile_floats)),
        optional("--tokens", mostly(["1e12"], hostile_floats)),
    ),
)

SIGNED = ("free", "headroom", "delta", "diff", "vs_", "change", "saved", "error")
"""Keys whose value may rightly be negative: free memory of a layout that does not fit, differences."""


def _check_numbers(value: Any, key: str = "") -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _check_numbers(v, str(k))
    elif isinstance(value, list):
        for v in value:
            _check_numbers(v, key)
    elif isinstance(value, float | int) and not isinstance(value, bool):
        assert math.isfinite(value), (key, value)
        if key.endswith(("_bytes", "_s", "_flops", "_params")) and not any(word in key for word in SIGNED):
            assert value >= 0, (key, value)


def _check_plan(result: dict[str, Any]) -> None:
    for plan in result.get("plans", []):
        lay = plan["layout"]
        used = lay["dp_replicate"] * lay["dp_shard"] * lay["cp"] * lay["tp"] * lay["pp"]
        assert used == result["gpus"], (lay, result["gpus"])


@settings(  # five times the profile's budget: 100 command lines by default, 500 thorough (tests/conftest.py)
    max_examples=5 * settings.default.max_examples,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(argv=command_lines)
@example(argv=["estimate", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus=8", "--expert-tp=2"])
def test_generated_command_lines(argv: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*argv, "--json"])
    text = err.getvalue()
    assert "Traceback" not in text, (argv, text)
    if code == 2:
        assert len(text.strip().splitlines()) == 1, (argv, text)
        assert out.getvalue() == ""
        return
    assert code == 0, (argv, code, text)
    result = json.loads(out.getvalue())
    _check_numbers(result)
    if argv[0] == "plan":
        _check_plan(result)
