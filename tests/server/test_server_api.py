"""The HTTP API in-process: every endpoint's answer equals its report function's, and bad input is a 4xx JSON error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshplan.reports import LayoutRequest, fit_report, memory_report, serving_report
from meshplan.reports.estimate import collectives_report, estimate_report
from meshplan.reports.export import export_serving, export_training
from meshplan.reports.plan import plan_report
from meshplan.reports.recipes import list_report, recipe_report
from meshplan.spec.requests import field

pytest.importorskip("fastapi", reason="the web explorer needs the [web] extra: pip install 'meshplan[web]'")

LLAMA_CONFIG = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
}


def ok(client: Any, path: str, **params: Any) -> dict[str, Any]:
    r = client.get(path, params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    body: dict[str, Any] = r.json()
    return body


def refused(client: Any, path: str, status: int | tuple[int, ...] = (400, 404, 413, 422), **params: Any) -> str:
    r = client.get(path, params=params)
    statuses = (status,) if isinstance(status, int) else status
    assert r.status_code in statuses, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and body["error"], body
    return str(body["error"])


def same(a: Any, b: Any) -> None:
    """Equal after the JSON round trip the API makes (inf and nan become null)."""
    assert json.loads(json.dumps(a, default=str).replace("Infinity", "null").replace("NaN", "null")) == b


# --- happy paths: each endpoint returns exactly its report ---------------------------------------------------------


def test_catalog_lists_every_choice(client: Any) -> None:
    c = ok(client, "/api/catalog")
    assert {"models", "gpus", "links", "recipes", "precisions", "optimizers", "recompute", "limits"} <= set(c)
    assert "llama-3.1-70b" in c["models"] and any(g["name"] == "h200" for g in c["gpus"])
    assert {"nvlink5", "nvlink4", "ib-ndr", "eth-100g"} <= {lk["name"] for lk in c["links"]}
    assert [r["name"] for r in c["recipes"]] == [r["name"] for r in list_report()["recipes"]]
    assert {"bf16", "fp8"} <= {p["name"] for p in c["precisions"]}


def test_catalog_unset_layout_is_what_estimate_takes_when_nothing_is_given(client: Any) -> None:
    unset = ok(client, "/api/catalog")["unset"]
    assert {"tp", "pp", "vpp", "cp", "ep", "zero", "sp", "micro_batch", "seq", "global_batch"} <= set(unset)
    given = {k: str(v).lower() for k, v in unset.items() if v is not None}
    fleet = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "gpus": 8}
    bare, typed = ok(client, "/api/estimate", **fleet), ok(client, "/api/estimate", **fleet, **given)
    assert bare["step_time_s"] == typed["step_time_s"] and bare["layout"] == typed["layout"]
    assert bare["seq"] == unset["seq"] and bare["layout"]["tp"] == unset["tp"] == 1


def test_memory_equals_the_report(client: Any) -> None:
    got = ok(client, "/api/memory", model="llama-3.1-70b", gpu="h100-sxm", gpus=64, tp=8, pp=4, zero=1)
    want = memory_report("llama-3.1-70b", gpu="h100-sxm", gpus=64, layout=LayoutRequest(tp=8, pp=4, zero=1))
    same(want, got)
    assert [t["name"] for t in got["terms"]][:5] == [
        "weights_bytes",
        "adapter_weights_bytes",
        "gradients_bytes",
        "master_weights_bytes",
        "optimizer_moments_bytes",
    ]
    assert all({"title", "what", "formula", "source", "value_bytes"} <= set(t) for t in got["terms"])


def test_memory_takes_workload_flags(client: Any) -> None:
    got = ok(
        client,
        "/api/memory",
        model="llama-3.1-8b",
        gpu="h100-sxm",
        gpus=1,
        seq=8192,
        micro_batch=2,
        global_batch=2,
        precision="bf16-fp32-grads",
        optimizer="sgd",
        recompute="full",
    )
    want = memory_report(
        "llama-3.1-8b",
        gpu="h100-sxm",
        gpus=1,
        layout=LayoutRequest(micro_batch=2, recompute="full"),
        seq=8192,
        global_batch=2,
        precision="bf16-fp32-grads",
        optimizer="sgd",
    )
    same(want, got)
    assert got["per_gpu"]["optimizer_moments_bytes"] == 0


def test_fit_equals_the_report(client: Any) -> None:
    got = ok(client, "/api/fit", model="llama-3.3-70b", gpu="h200", gpus=8)
    same(fit_report("llama-3.3-70b", gpu="h200", gpus=8), got)
    # 141.1 GB of weights: under 150.75e9 bytes of HBM, over the 90% fit keeps in use (the planner's headroom)
    assert got["fits"] and got["min_gpus_for_weights"] == 2


def test_fit_and_serving_left_without_a_dtype_take_the_published_one_as_the_cli_does(client: Any) -> None:
    """DeepSeek-V3 is released in FP8: /api/fit and /api/serving without weights_dtype answer in it, the same JSON as
    the reports called without it."""
    fit = ok(client, "/api/fit", model="deepseek-v3", gpu="h200", gpus=8)
    same(fit_report("deepseek-v3", gpu="h200", gpus=8), fit)
    assert fit["dtype"] == "fp8"
    assert ok(client, "/api/serving", model="deepseek-v3", gpu="h200", gpus=8)["dtype"] == "fp8"


def test_serving_adds_a_bill_of_the_report_terms(client: Any) -> None:
    got = ok(client, "/api/serving", model="llama-3.1-70b", gpu="h200", gpus=8, context=8192, sequences=4)
    want = serving_report("llama-3.1-70b", gpu="h200", gpus=8, context=8192)
    same(want, {k: v for k, v in got.items() if k != "bill"})
    terms = {t["name"]: t["value_bytes"] for t in got["bill"]["terms"]}
    assert terms["weights_bytes"] == want["weights_bytes_per_gpu"]
    assert terms["kv_cache_bytes"] == pytest.approx(4 * want["kv_bytes_per_sequence_per_gpu"])
    assert got["bill"]["total_bytes"] == pytest.approx(sum(terms.values()))
    assert all(t["what"] and t["formula"] for t in got["bill"]["terms"])


def test_estimate_equals_the_report(client: Any) -> None:
    got = ok(client, "/api/estimate", model="llama-3.1-70b", gpu="h100-sxm", gpus=64, tp=8, pp=4, zero=1, sp=True)
    want = estimate_report("llama-3.1-70b", gpu="h100-sxm", gpus=64, layout=LayoutRequest(tp=8, pp=4, zero=1, sp=True))
    same(want, got)
    assert got["collectives"] and got["placement"]["tp"]["crosses_fabric"] is False


def test_collectives_equals_the_report(client: Any) -> None:
    got = ok(client, "/api/collectives")
    same(collectives_report(), got)
    assert [r["link"] for r in got["links"]] == ["nvlink5", "nvlink4", "ib-ndr", "eth-100g"]
    assert got["links"][0]["ratio_bandwidth_only"] == 1.0
    sized = ok(client, "/api/collectives", size_mb=100, group=4)
    assert sized["size_bytes"] == 100e6 and sized["group_size"] == 4


def test_params(client: Any) -> None:
    got = ok(client, "/api/params", model="llama-3.1-8b")
    assert got["total_params"] > 7e9


def test_fine_tuning_flags_reach_every_training_report(client: Any) -> None:
    from meshplan.reports import params_report
    from meshplan.reports.inputs import FinetuneRequest

    qlora = FinetuneRequest(mode="qlora", lora_rank=64, lora_targets="q,v")
    flags = dict(finetune="qlora", lora_rank=64, lora_targets="q,v")
    same(params_report("llama-3.1-8b", finetune=qlora), ok(client, "/api/params", model="llama-3.1-8b", **flags))
    got = ok(client, "/api/memory", model="llama-3.1-8b", gpu="a100-40gb", gpus=2, zero=3, **flags)
    same(memory_report("llama-3.1-8b", gpu="a100-40gb", gpus=2, layout=LayoutRequest(zero=3), finetune=qlora), got)
    assert got["trainable_params"] == 32 * 64 * ((4096 + 4096) + (4096 + 1024))  # q and v (GQA: 1024 wide)
    assert got["per_gpu"]["dequant_workspace_bytes"] > 0
    got = ok(client, "/api/fit", model="llama-3.1-8b", gpu="h100-sxm", gpus=1, seq=8192, **flags)
    same(fit_report("llama-3.1-8b", gpu="h100-sxm", gpus=1, finetune=qlora, seq=8192), got)
    assert got["max_seq_len"] > 8192
    frozen = ok(client, "/api/estimate", model="llama-3.1-8b", gpu="h100-sxm", gpus=8, zero=3, freeze="layers=4")
    assert frozen["frozen"] == {"embeddings": False, "layers": 4}
    plan = ok(client, "/api/plan", model="llama-3.1-8b", gpu="h100-sxm", gpus=8, seq=4096,
              global_batch_tokens=64 * 4096, finetune="lora")  # fmt: skip
    assert plan["finetune"] == "lora" and plan["plans"]
    assert "cannot split" in refused(client, "/api/memory", model="llama-3.1-8b", gpu="h100-sxm", gpus=2, tp=2,
                                     finetune="qlora")  # fmt: skip
    assert "'full', 'lora' or 'qlora'" in refused(client, "/api/memory", model="llama-3.1-8b", gpu="h100-sxm", gpus=1,
                                         finetune="dora")  # fmt: skip
    assert "lora and qlora modes only" in refused(client, "/api/memory", model="llama-3.1-8b", gpu="h100-sxm", gpus=1,
                                             lora_rank=8)  # fmt: skip


def test_recipes_and_one_recipe(client: Any) -> None:
    same(list_report(), ok(client, "/api/recipes"))
    got = ok(client, "/api/recipe/llama3-405b-128k")
    same(recipe_report("llama3-405b-128k", rank=False), got)
    assert got["placement"]["cp"]["crosses_fabric"] is True
    assert got["factors"]["gpus"] == 16384
    ranked = ok(client, "/api/recipe/llama3-405b-8k", rank="true")
    assert ranked["search"]["rank_of_published"] >= 1 and ranked["search"]["feasible"] > 0


def test_plan_equals_the_report_and_is_cached(client: Any) -> None:
    params = dict(model="llama-3.1-70b", gpu="h200", gpus=64, seq=8192, global_batch_tokens=4194304, top=5)
    got = ok(client, "/api/plan", **params)
    want = plan_report("llama-3.1-70b", gpu="h200", gpus=64, seq=8192, global_batch_tokens=4194304, top=5, explain=True)
    for key in ("plans", "pareto", "rejections", "evaluated", "feasible", "explain"):
        same(want[key], got[key])
    again = ok(client, "/api/plan", **params)
    assert again == got


def test_plan_compare_names_a_layout(client: Any) -> None:
    got = ok(
        client,
        "/api/plan",
        model="llama-3.1-8b",
        gpu="h100-sxm",
        gpus=16,
        seq=4096,
        global_batch_tokens=1048576,
        compare="tp=8,pp=2",
    )
    named = got["explain"][-1]
    assert named["b"] == "tp=8,pp=2" and "named" in named
    assert {"term", "unit", "value_a", "value_b", "difference"} == set(named["rows"][0])


def test_strategies_carry_each_gpu_bill(client: Any) -> None:
    got = ok(client, "/api/strategies", model="llama-3.1-70b", gpu="h100-sxm")
    cards = {c["key"]: c for c in got["strategies"]}
    assert list(cards) == ["dp", "zero", "tp", "pp", "cp", "ep"]
    for key in ("dp", "zero", "tp", "pp", "cp"):
        card = cards[key]
        assert card["applies"] and len(card["gpus"]) == 8
        assert {"cuts", "holds", "collective", "how_often", "interconnect", "when", "example"} <= set(card)
    tp = memory_report("llama-3.1-70b", gpu="h100-sxm", gpus=8, layout=LayoutRequest(tp=8, sp=True))
    assert cards["tp"]["gpus"][0]["total_bytes"] == tp["per_gpu"]["total_bytes"]
    pp = memory_report("llama-3.1-70b", gpu="h100-sxm", gpus=8, layout=LayoutRequest(pp=8))
    assert [g["total_bytes"] for g in cards["pp"]["gpus"]] == [s["total_bytes"] for s in pp["stages"]]
    assert cards["pp"]["gpus"][0]["piece"] == "layers 1\u201310"
    assert not cards["ep"]["applies"] and "experts" in cards["ep"]["reason"]
    moe = ok(client, "/api/strategies", model="mixtral-8x7b", gpu="h100-sxm")
    assert moe["strategies"][5]["applies"]


def test_tiers_name_each_strategy_once(client: Any) -> None:
    tiers = ok(client, "/api/tiers")["tiers"]
    assert [t["key"] for t in tiers] == ["universal", "standard", "specific"]
    assert sorted(k for t in tiers for k in t["strategies"]) == sorted(["dp", "zero", "tp", "pp", "cp", "ep"])
    assert all(t["reason"] and t["names"] for t in tiers)
    assert {t["name"] for t in ok(client, "/api/serving-terms")["terms"]} >= {"weights_bytes", "kv_cache_bytes"}


def test_tp_split(client: Any) -> None:
    got = ok(client, "/api/tp-split", ranks=8, activation="silu", seed=3)
    assert got["matches"] and got["max_abs_difference"] <= got["tolerance"]
    assert len(got["ranks_detail"]) == 8 and len(got["steps"]) == 4


def test_openapi_schema_lists_every_endpoint(client: Any) -> None:
    schema = ok(client, "/openapi.json")
    paths = set(schema["paths"])
    for path in (
        "/api/catalog",
        "/api/memory",
        "/api/fit",
        "/api/serving",
        "/api/estimate",
        "/api/collectives",
        "/api/plan",
        "/api/recipes",
        "/api/recipe/{name}",
        "/api/strategies",
        "/api/tiers",
        "/api/tp-split",
        "/api/model",
        "/api/export",
    ):
        assert path in paths, path
    gpus = next(p for p in schema["paths"]["/api/memory"]["get"]["parameters"] if p["name"] == "gpus")
    assert gpus["schema"]["maximum"] == field("gpus").hi == 10_000_000  # the schema's bound, on every edge
    assert client.get("/docs").status_code == 404  # the interactive docs would load scripts from a CDN


def test_pages_are_served_offline(client: Any) -> None:
    r = client.get("/")
    assert r.status_code == 200 and "meshplan" in r.text
    assert "http://" not in r.text and "https://" not in r.text
    assert "default-src 'self'" in r.headers["content-security-policy"]
    for asset in ("/static/style.css", "/static/js/app.js", "/static/js/planner.js"):
        res = client.get(asset)
        assert res.status_code == 200 and "https://" not in res.text, asset


# A layout each engine can express (each refuses, with the closest it can, what its config cannot set).
EXPORT_LAYOUTS = {
    "torchtitan": {"tp": 2, "pp": 2, "zero": 3, "sp": True, "micro_batch": 2},
    "megatron": {"tp": 2, "pp": 2, "zero": 1, "sp": True, "micro_batch": 2},
    "deepspeed": {"tp": 2, "zero": 1, "micro_batch": 1, "recompute": "full"},  # under HBM: exported unforced
}


@pytest.mark.parametrize("engine", sorted(EXPORT_LAYOUTS))
def test_export_training_equals_the_cli_export(client: Any, engine: str) -> None:
    lay = EXPORT_LAYOUTS[engine]
    query = {k: str(v).lower() for k, v in lay.items()}
    got = ok(
        client,
        "/api/export",
        to=engine,
        model="llama-3.1-8b",
        gpu="h100-sxm",
        gpus=16,
        seq=8192,
        precision="bf16",
        **query,
    )
    layout = LayoutRequest(**lay)  # type: ignore[arg-type]
    want = export_training(
        engine, "llama-3.1-8b", gpu="h100-sxm", gpus=16, layout=layout, seq=8192, global_batch=None, precision="bf16"
    )
    assert got == json.loads(json.dumps({"engine": engine} | want))
    assert got["files"] and got["command"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_export_serving_equals_the_cli_export(client: Any, engine: str) -> None:
    got = ok(client, "/api/export", to=engine, model="llama-3.1-70b", gpu="h100-sxm", gpus=8, tp=4, context=8192)
    want = export_serving(
        engine,
        "llama-3.1-70b",
        gpu="h100-sxm",
        gpus=8,
        tp=4,
        pp=1,
        ep=1,
        dtype="bf16",
        kv_dtype="bf16",
        context=8192,
        gpu_memory_utilization=0.9,
    )
    assert got == json.loads(json.dumps({"engine": engine} | want))


def test_export_refuses_an_unknown_engine(client: Any) -> None:
    message = refused(client, "/api/export", status=422, to="jax", model="llama-3.1-8b", gpu="h100-sxm", gpus=8)
    assert message.startswith("to: ") and "torchtitan" in message


def test_sizes_take_the_suffixes_the_cli_takes(client: Any) -> None:
    """Every field that takes k/M/G/T on the command line takes them as a query parameter, with the same value."""
    base = dict(model="llama-3.1-8b", gpu="h100-sxm", gpus=8)
    assert ok(client, "/api/memory", **base, seq="8k") == ok(client, "/api/memory", **base, seq=8192)
    assert ok(client, "/api/memory", **base, seq="1.5k")["seq"] == 1536
    serving = ok(client, "/api/serving", **base, context="128k", runtime_reserve="2G")
    assert serving == ok(client, "/api/serving", **base, context=131072, runtime_reserve=2e9)
    est = ok(client, "/api/estimate", **base, seq="8k", global_batch="1k", tokens="15T")
    assert est == ok(client, "/api/estimate", **base, seq=8192, global_batch=1024, tokens=15e12)
    assert est["time_to_train"]["tokens_total"] == 15e12 and est["global_batch"] == 1024
    assert "optional k, M, G or T suffix" in refused(client, "/api/memory", **base, seq="8q")
    assert "less than or equal" in refused(client, "/api/memory", **base, seq="1G")  # the bound applies after


@pytest.mark.parametrize("query", [{"tp": 1}, {}])
def test_export_serving_reads_tp_1_as_given_and_no_tp_as_unset(client: Any, query: dict[str, int]) -> None:
    """tp=1 asks for one-GPU replicas (as ``meshplan export vllm --tp 1``); no tp lets the bill pick one domain."""
    got = ok(client, "/api/export", to="vllm", model="llama-3.1-8b", gpu="h100-sxm", gpus=8, **query)
    kw: dict[str, Any] = dict(gpu="h100-sxm", gpus=8, pp=1, ep=1, dtype="bf16", kv_dtype="bf16", context=None)
    want = export_serving("vllm", "llama-3.1-8b", tp=query.get("tp"), gpu_memory_utilization=0.9, **kw)
    assert got == json.loads(json.dumps({"engine": "vllm"} | want))
    other = export_serving("vllm", "llama-3.1-8b", tp=None if query else 1, gpu_memory_utilization=0.9, **kw)
    assert got != json.loads(json.dumps({"engine": "vllm"} | other))  # the two requests do differ


def test_compare_takes_logged_numbers_and_refuses_none(client: Any) -> None:
    query = "model=llama-3.1-8b&gpu=h100-sxm&gpus=8&dp_shard=8&zero=3"
    r = client.get(f"/api/compare?{query}&step_time_s=2.5&max_memory_reserved=60e9")
    assert r.status_code == 200, r.text
    body = r.json()
    estimate = client.get(f"/api/estimate?{query}").json()
    assert body["time"]["step_time_s_predicted"] == estimate["step_time_s"]
    assert body["time"]["measured_over_predicted"] == pytest.approx(2.5 / estimate["step_time_s"])
    reserve = {t["term"]: t for t in body["memory"]["terms"]}["reserved"]
    assert reserve["measured_bytes"] == 60e9 and reserve["predicted_bytes"] == estimate["per_gpu"]["reserved_bytes"]
    r = client.get(f"/api/compare?{query}")
    assert r.status_code == 400 and "nothing measured" in r.json()["error"]
