"""``export vllm|sglang|trtllm --from-plan``: a serving plan file is checked field by field and recomputed.

Two plans saved by serve-plan (colocated replicas; split prefill and decode pools) are tampered field by field
(tampered_plans.py): every copy is refused with one line. A newline in the model path is refused through each
way in: --model-path, the plan file's model, the API's model_path=.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tampered_plans import EVIL, tampered

from meshplan.cli import main
from meshplan.reports.export import export_serve_plan
from meshplan.reports.serve_plan import serve_plan_report
from meshplan.reports.serve_plan_file import FILE_KEYS, LAYOUT_KEYS, PLAN_KEYS, load_serving_plan

BASES: dict[str, dict[str, Any]] = {
    "colocated": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8, "input_len": 1024, "output_len": 256,
                  "allow_quantization": True},
    "split": {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8, "input_len": 8000, "output_len": 300,
              "tpot_p99_s": 0.02, "dtypes": ["fp8"], "allow_quantization": True, "disaggregate": True},
}  # fmt: skip
FLAGS = ["llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "8"]
SERVING_ENGINES = ("vllm", "sglang", "trtllm")


@pytest.fixture(scope="module")
def cases(saved: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    """base -> tampered copies of its saved plan: name -> file text."""
    return {base: tampered(plan) for base, plan in saved.items()}


@pytest.fixture(scope="module")
def saved() -> dict[str, dict[str, Any]]:
    """Each base plan as serve-plan --save writes it (the JSON round trip included)."""
    plans = {}
    for name, kwargs in BASES.items():
        args = dict(kwargs)
        plans[name] = json.loads(json.dumps(serve_plan_report(args.pop("model"), **args)))
    assert plans["split"]["best"]["prefill_replicas"] > 0 == plans["colocated"]["best"]["prefill_replicas"]
    return plans


def _write(folder: Path, text: str, name: str = "plan.json") -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], out: Path | None = None) -> str:
    """The CLI in-process: exit 2, one line on stderr, no traceback, nothing on stdout, nothing written."""
    if out is not None:
        argv = [*argv, "--out", str(out)]
    code = main(argv)
    stdout, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (argv, code, err)
    assert len(lines) == 1 and "Traceback" not in err and stdout == "", err
    assert out is None or not out.exists()
    return lines[0]


def test_the_reader_knows_exactly_the_keys_serve_plan_writes(saved: dict[str, dict[str, Any]]) -> None:
    plan = saved["colocated"]
    assert (
        tuple(plan) == FILE_KEYS and tuple(plan["best"]) == PLAN_KEYS and tuple(plan["best"]["layout"]) == LAYOUT_KEYS
    )


@pytest.mark.parametrize("base", list(BASES))
def test_a_saved_plan_exports_with_its_numbers_recomputed(
    base: str, saved: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    path = _write(tmp_path, json.dumps(saved[base]))
    best = saved[base]["best"]
    plan = load_serving_plan(path)
    assert plan.batch_cap_per_replica == best["batch_cap_per_replica"] and plan.replicas == best["replicas"]
    assert dict(plan.predicted) == {k: best[k] for k in ("ttft_s_p99", "tpot_s", "tpot_s_p99", "tokens_per_s_per_gpu",
                                                          "tokens_per_s_per_user")}  # fmt: skip
    for engine in SERVING_ENGINES:
        if engine == "trtllm" and best["prefill_replicas"]:
            with pytest.raises(ValueError, match="splits prefill and decode pools"):
                export_serve_plan(engine, path)
            continue
        out = export_serve_plan(engine, path, model_path="meta-llama/Llama-3.1-8B-Instruct")
        assert out["predicted"] == plan.predicted
        scripts = [text for name, text in out["files"].items() if name.endswith(".sh") and "router" not in name]
        assert scripts and all("meta-llama/Llama-3.1-8B-Instruct" in text for text in scripts)


@pytest.mark.parametrize("base", list(BASES))
def test_every_tampered_plan_is_refused_with_one_line(
    base: str, cases: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    """Each field mutated in turn (wrong type, negative, zero, huge, NaN/inf, a newline, missing, an extra key, TP
    that does not divide the heads, a swapped model, numbers that are not the plan's): none exports."""
    assert len(cases[base]) > 400
    through, crashed = [], []
    for name, text in cases[base].items():
        path = _write(tmp_path, text)
        try:
            export_serve_plan("vllm", path)
        except ValueError as exc:
            message = str(exc)
            if len(message.splitlines()) != 1 or not message.strip():
                crashed.append(f"{name}: {message!r}")
        except Exception as exc:  # a traceback on the command line
            crashed.append(f"{name}: {type(exc).__name__}: {exc}")
        else:
            through.append(name)
    assert through == [] and crashed == []


CLI_CASES = [
    "model newline",
    "model cr",
    "model swapped to llama-3.1-70b",
    "model path",
    "best.layout.tp huge",
    "tp 3",
    "tp 64",
    "tp 3 with the GPUs to match",
    "tp 64 with the GPUs to match",
    "best.tpot_s negative",
    "best.tokens_per_s_per_gpu nan",
    "best.ttft_s_p99 inf",
    "best.batch_cap_per_replica text",
    "best.layout.kv_dtype null",
    "best.layout missing",
    "input_len newline",
    "extra key in best.layout",
    "batch cap doubled",
    "a list",
    "1e999 for a prediction",
    "duplicate model key",
]
"""Tampered plans sent through the whole command line too (the rest go through the same reader above)."""


@pytest.mark.parametrize("i", range(len(CLI_CASES)), ids=CLI_CASES)
def test_tampered_plans_exit_2_through_the_cli_and_write_nothing(
    i: int, cases: dict[str, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = "split" if i % 2 else "colocated"
    engine = ("vllm", "sglang")[i // 2 % 2] if base == "split" else SERVING_ENGINES[i // 2 % 3]
    path = _write(tmp_path, cases[base][CLI_CASES[i]])
    line = refused(capsys, ["export", engine, "--from-plan", path], out=tmp_path / "out")
    assert line.startswith("meshplan: error: ") and "\n" not in line


def test_tp_that_does_not_divide_the_heads_is_refused_as_serve_refuses_it(
    cases: dict[str, dict[str, str]], tmp_path: Path
) -> None:
    for tp in (3, 64):
        path = _write(tmp_path, cases["colocated"][f"tp {tp} with the GPUs to match"])
        refusals = f"tp={tp} does not (divide the 32 attention heads|tile a node)|not a layout serve-plan"
        with pytest.raises(ValueError, match=refusals):
            load_serving_plan(path)
    path = _write(tmp_path, cases["colocated"]["tp 3"])
    with pytest.raises(ValueError, match=r"best.gpus = 8 is not replicas x tp x pp = 8 x 3 x 1"):
        load_serving_plan(path)


def test_edited_numbers_are_refused_naming_the_field_and_the_recomputed_value(
    saved: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    plan = json.loads(json.dumps(saved["colocated"]))
    true = plan["best"]["tpot_s"]
    plan["best"]["tpot_s"] = plan["top"][0]["tpot_s"] = true * (1 + 1e-6)
    with pytest.raises(ValueError, match=rf"best.tpot_s is .* but serve-plan computes {true!r} .* save it again"):
        load_serving_plan(_write(tmp_path, json.dumps(plan)))
    plan["model"] = "llama-3.1-70b"
    plan["best"]["tpot_s"] = plan["top"][0]["tpot_s"] = true
    with pytest.raises(ValueError, match=r"best.batch_cap_per_replica is \d+, but serve-plan computes \d+"):
        load_serving_plan(_write(tmp_path, json.dumps(plan)))


# --- a newline in the model path, through each way in ----------------------------------------------------------


@pytest.mark.parametrize("evil", [EVIL, "m\rid", "m\x1b[2K", "$(id)", "-m"])
def test_model_path_flag_with_control_characters_or_shell_syntax_exits_2(
    evil: str, saved: dict[str, dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _write(tmp_path, json.dumps(saved["colocated"]))
    for engine in SERVING_ENGINES:
        line = refused(capsys, ["export", engine, *FLAGS, f"--model-path={evil}"], out=tmp_path / "out")
        assert "--model-path" in line
        line = refused(capsys, ["export", engine, "--from-plan", plan, f"--model-path={evil}"], out=tmp_path / "out")
        assert "--model-path" in line
    for engine in ("torchtitan", "megatron", "deepspeed"):
        argv = ["export", engine, *FLAGS, "--dp-shard", "8", "--zero", "3", "--seq", "4096", "--global-batch", "64"]
        assert "--model-path" in refused(capsys, [*argv, f"--model-path={evil}"], out=tmp_path / "out")


def test_plan_file_model_with_a_newline_exits_2(
    cases: dict[str, dict[str, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for base in BASES:
        path = _write(tmp_path, cases[base]["model newline"])
        for engine in SERVING_ENGINES:
            line = refused(capsys, ["export", engine, "--from-plan", path], out=tmp_path / "out")
            assert line.endswith("model holds the control character '\\n'; a plan file holds none")


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    pytest.importorskip("fastapi", reason="the API needs the [web] extra")
    if importlib.util.find_spec("httpx2") is None and importlib.util.find_spec("httpx") is None:
        pytest.skip("the API tests need an HTTP client for TestClient: pip install httpx2")
    from fastapi.testclient import TestClient

    from meshplan.server.app import create_app

    with TestClient(create_app(), base_url="http://127.0.0.1") as c:  # the server answers its own address only
        yield c


@pytest.mark.parametrize("evil", [EVIL, "m\rid", "$(id)", "-m", "m'; id; '"])
@pytest.mark.parametrize("engine", ["vllm", "sglang", "torchtitan"])
def test_api_model_path_with_control_characters_or_shell_syntax_is_a_400(client: Any, evil: str, engine: str) -> None:
    query = {"to": engine, "model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8, "model_path": evil}
    if engine == "torchtitan":
        query |= {"dp_shard": 8, "zero": 3, "seq": 4096, "global_batch": 64}
    r = client.get("/api/export", params=query)
    assert r.status_code == 400 and set(r.json()) == {"error"}, r.text
    assert r.json()["error"].startswith("--model-path ") and "\n" not in r.json()["error"]
    ok = client.get("/api/export", params=query | {"model_path": "meta-llama/Llama-3.1-8B"})
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("base", list(BASES))
def test_a_saved_plan_serves_the_catalogs_public_checkpoint(base: str, saved: dict[str, dict[str, Any]],
                                                            tmp_path: Path) -> None:  # fmt: skip
    """`vllm serve llama-3.1-8b` loads nothing: without --model-path a plan serves the model's public repository."""
    path = _write(tmp_path, json.dumps(saved[base]))
    for engine in ("vllm", "sglang") if saved[base]["best"]["prefill_replicas"] else SERVING_ENGINES:
        out = export_serve_plan(engine, path)
        scripts = [text for name, text in out["files"].items() if name.endswith(".sh") and "router" not in name]
        assert scripts and all(" meta-llama/Llama-3.1-8B " in text.replace("\\\n", " ") for text in scripts)
        assert "llama-3.1-8b " not in out["command"] and any("meta-llama/Llama-3.1-8B" in n for n in out["notes"])


def test_a_plan_timed_with_prefix_hits_round_trips(tmp_path: Path) -> None:
    """The hit rate is part of the request a saved plan is recomputed from; a plan timed with a drafting head is
    not saved (exports set no drafting flags)."""
    args = dict(BASES["colocated"]) | {"prefix_hit_rate": 0.75}
    report = serve_plan_report(args.pop("model"), **args)
    plan = load_serving_plan(_write(tmp_path, json.dumps(report)))
    assert plan.predicted["ttft_s_p99"] == report["best"]["ttft_s_p99"]
    argv = ["serve-plan", *FLAGS, "--input-len", "1024", "--output-len", "256", "--speculative", "eagle:3"]
    line = refused_cli([*argv, "--spec-acceptance", "0.8", "--save", str(tmp_path / "spec.json")])
    assert "drop --speculative" in line and not (tmp_path / "spec.json").exists()


def refused_cli(argv: list[str]) -> str:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1, err.getvalue()
    return lines[0]


def test_a_plan_timed_with_max_utilization_exports_its_admission(tmp_path: Path) -> None:
    """serve-plan --capacity-scheduler max-utilization counts a replica's KV cap over I + O/2 tokens a sequence;
    its saved plan recomputes with it, TensorRT-LLM's export writes it (scheduler_config), the paging engines say
    they have no flag for it, and a file edited to another policy is refused."""
    args = dict(BASES["colocated"]) | {"capacity_scheduler": "max-utilization", "engine": "trtllm"}
    model = args.pop("model")
    report = serve_plan_report(model, **args)
    plain = serve_plan_report(model, **{k: v for k, v in args.items() if k != "capacity_scheduler"})
    assert report["capacity_scheduler"] == "max-utilization" and plain["capacity_scheduler"] is None
    assert report["best"]["kv_sequences_per_replica"] > plain["best"]["kv_sequences_per_replica"]
    path = _write(tmp_path, json.dumps(report))
    assert load_serving_plan(path).capacity_scheduler == "max-utilization"
    trt = export_serve_plan("trtllm", path)
    assert (
        "scheduler_config:\n  capacity_scheduler_policy: MAX_UTILIZATION\n" in trt["files"]["extra_llm_api_options.yml"]
    )
    vllm = export_serve_plan("vllm", path)
    assert any("has no flag for" in note and "max-utilization" in note for note in vllm["notes"])
    assert (
        "scheduler_config"
        not in export_serve_plan("trtllm", _write(tmp_path, json.dumps(plain), "plain.json"))["files"][
            "extra_llm_api_options.yml"
        ]
    )
    edited = _write(tmp_path, json.dumps(report | {"capacity_scheduler": "guaranteed-no-evict"}), "edited.json")
    with pytest.raises(ValueError, match=r"best\.batch_cap_per_replica is \d+, but serve-plan computes"):
        load_serving_plan(edited)
    bad = _write(tmp_path, json.dumps(report | {"capacity_scheduler": "fcfs"}), "bad.json")
    with pytest.raises(ValueError, match="capacity_scheduler is refused"):
        load_serving_plan(bad)
    split_args = dict(BASES["split"]) | {"capacity_scheduler": "max-utilization", "engine": "trtllm"}
    split = serve_plan_report(split_args.pop("model"), **split_args)
    assert split["best"]["prefill_replicas"] > 0  # the pools' launchers carry the same note
    pools = export_serve_plan("sglang", _write(tmp_path, json.dumps(split), "split.json"))
    assert any("has no flag for" in note for note in pools["notes"])


def test_a_model_published_quantized_is_planned_and_exported_as_published(tmp_path: Path) -> None:
    """gpt-oss is released with MXFP4 experts: serve-plan searches that dtype without --allow-quantization, on H100
    as weight-only (no FP4 tensor cores), a llama it does not; the saved plan reads back and exports with no
    --quantization flag, the checkpoint's own config saying MXFP4 (a ModelOpt FP4 flag would contradict it)."""
    args = {"gpu": "h100-sxm", "gpus": 8, "input_len": 1024, "output_len": 1024, "engine": "vllm"}
    oss = serve_plan_report("gpt-oss-120b", **args)  # type: ignore[arg-type]
    assert oss["weights_dtypes_searched"] == ["bf16", "fp4"]
    fp4 = [p for p in oss["top"] if p["layout"]["weights_dtype"] == "fp4"]
    assert fp4 and all(p["layout"]["quant"] == "weight-only" for p in fp4)
    llama = serve_plan_report("llama-3.1-8b", **args)  # type: ignore[arg-type]
    assert "fp4" not in llama["weights_dtypes_searched"]
    assert oss["best"]["layout"]["weights_dtype"] == "fp4"  # its own 4-bit experts serve the most tokens here
    path = _write(tmp_path, json.dumps(oss))
    assert load_serving_plan(path).layout.weights_dtype.value == "fp4"
    command = export_serve_plan("vllm", path)["command"]
    assert "vllm serve openai/gpt-oss-120b" in command and "--quantization" not in command


def test_serving_and_its_export_default_to_the_published_dtype() -> None:
    """`serving` and `export vllm MODEL` left without --weights-dtype take the dtype the model is published in, as
    `serve` does: DeepSeek-V3 in FP8, loaded as stored (no --quantization); a dtype typed is kept and named."""
    from meshplan.reports.bills import serving_report
    from meshplan.reports.export import export_serving

    assert serving_report("deepseek-v3", gpu="h200", gpus=8)["dtype"] == "fp8"
    assert serving_report("llama-3.1-8b", gpu="h100-sxm", gpus=1)["dtype"] == "bf16"
    kw = {"gpu": "h200", "gpus": 8, "tp": None, "pp": 1, "ep": 1, "kv_dtype": "bf16", "context": 8192}
    published = export_serving("vllm", "deepseek-v3", dtype=None, gpu_memory_utilization=0.9, **kw)  # type: ignore[arg-type]
    assert "--quantization" not in published["command"]
    int8 = export_serving("vllm", "llama-3.1-70b", dtype="int8", gpu_memory_utilization=0.9, **kw)  # type: ignore[arg-type]
    assert "--quantization compressed-tensors" in int8["command"]
