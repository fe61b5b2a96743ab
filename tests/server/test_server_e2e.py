"""The explorer in headless Chromium: change inputs, click segments and strategies, check what appears.

Every number checked on a page is compared with the API's answer for the same inputs. Each test saves a
screenshot of its view in test-artifacts/. Skipped when playwright or chromium is missing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the web explorer needs the [web] extra: pip install 'meshplan[web]'")
pytest.importorskip("playwright.sync_api", reason="end-to-end tests need: pip install playwright")

CONFIG = {
    "model_type": "qwen2",
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
}


def api(pg: Any, path: str, **params: Any) -> Any:
    r = pg.request.get(pg.base + path, params={k: str(v) for k, v in params.items()})
    assert r.ok, r.text()
    return r.json()


def open_view(pg: Any, view: str) -> None:
    pg.goto(f"{pg.base}/#{view}")
    pg.wait_for_selector("body[data-ready]")


def wait_number(pg: Any, selector: str, value: float, attr: str = "bytes") -> None:
    """Wait until the element's data-ATTR holds exactly ``value`` (the API's number, not a re-computation)."""
    pg.wait_for_function(
        "([sel, attr, v]) => { const e = document.querySelector(sel); return !!e && Number(e.dataset[attr]) === v; }",
        arg=[selector, attr, value],
    )


def test_home_links_every_view_and_lists_the_api(page: Any, shot: Any) -> None:
    open_view(page, "home")
    hrefs = page.eval_on_selector_all(".cards a", "as => as.map(a => a.getAttribute('href'))")
    assert hrefs == [
        "#memory",
        "#strategies",
        "#weights",
        "#tp",
        "#recipes",
        "#tiers",
        "#planner",
        "#serving",
        "#layout",
    ]
    page.wait_for_selector("#api-list li >> nth=12")
    assert "/api/plan" in page.inner_text("#api-list")
    shot(page, "home")


def test_memory_bill_segments_inputs_and_upload(page: Any, shot: Any) -> None:
    open_view(page, "memory")
    base = {"model": "llama-3.1-70b", "gpu": "h100-sxm", "gpus": 1, "micro_batch": 1}
    train = api(page, "/api/memory", **base, seq=4096)
    serve = api(page, "/api/serving", model="llama-3.1-70b", gpu="h100-sxm", gpus=1, context=4096, sequences=1)
    wait_number(page, "#mem-training-total", train["per_gpu"]["total_bytes"])
    wait_number(page, "#mem-serving-total", serve["bill"]["total_bytes"])

    page.click("#mem-chart rect[data-bar='stage-0'][data-term='optimizer_moments_bytes']")
    moments = next(t for t in train["terms"] if t["name"] == "optimizer_moments_bytes")
    wait_number(page, "#mem-detail-value", moments["value_bytes"])
    detail = page.inner_text("#mem-detail")
    assert moments["title"] in detail and moments["formula"] in detail and moments["source"] in detail
    page.click("#mem-legend button[data-bar='serving'][data-term='kv_cache_bytes']")  # too thin to tap in the chart
    kv = next(t for t in serve["bill"]["terms"] if t["name"] == "kv_cache_bytes")
    wait_number(page, "#mem-detail-value", kv["value_bytes"])

    longer = api(page, "/api/memory", **base, seq=8192, recompute="full")
    page.select_option("#mem-form select[name=recompute]", "full")
    page.fill("#mem-form input[name=seq]", "8192")  # how fast it follows: benchmarks/explorer_latency.py
    wait_number(page, "#mem-training-total", longer["per_gpu"]["total_bytes"])

    qlora = api(page, "/api/memory", **base, seq=8192, recompute="full", finetune="qlora")
    page.select_option("#mem-form select[name=finetune]", "qlora")
    wait_number(page, "#mem-training-total", qlora["per_gpu"]["total_bytes"])
    assert qlora["per_gpu"]["total_bytes"] < longer["per_gpu"]["total_bytes"] / 3  # 4-bit base, adapters train
    assert f"{qlora['trainable_params']:,} adapter parameters train" in page.inner_text("#mem-headline")
    page.wait_for_selector("#mem-chart rect[data-bar='stage-0'][data-term='dequant_workspace_bytes']")
    shot(page, "memory-qlora")
    page.select_option("#mem-form select[name=finetune]", "full")
    wait_number(page, "#mem-training-total", longer["per_gpu"]["total_bytes"])

    page.fill("#mem-form input[name=seq]", "abc")
    page.wait_for_selector("#mem-error:not([hidden])")
    assert "Sequence length: expected an integer, with an optional k, M, G or T suffix" in page.inner_text("#mem-error")
    page.fill("#mem-form input[name=seq]", "4096")
    page.wait_for_selector("#mem-error", state="hidden")

    page.set_input_files(
        "#mem-upload",
        files=[{"name": "config.json", "mimeType": "application/json", "buffer": json.dumps(CONFIG).encode()}],
    )
    page.wait_for_function("() => document.querySelector('#mem-form select[name=model]').value.startsWith('upload:')")
    model_id = page.eval_on_selector("#mem-form select[name=model]", "s => s.value")
    mine = api(page, "/api/memory", **(base | {"model": model_id}), seq=4096, recompute="full")
    wait_number(page, "#mem-training-total", mine["per_gpu"]["total_bytes"])
    shot(page, "memory-upload")

    page.set_input_files(
        "#mem-upload",
        files=[{"name": "config.json", "mimeType": "application/json", "buffer": b'{"model_type": "bert"}'}],
    )
    page.wait_for_selector("#mem-error:not([hidden])")
    assert "unsupported model_type" in page.inner_text("#mem-error")


def cli_json(*args: str) -> Any:
    """``meshplan ... --json`` run as the CLI runs it, in-process."""
    import contextlib
    import io

    from meshplan.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*args, "--json"]) in (0, None)
    return json.loads(out.getvalue())


def test_memory_layout_bills_each_stage_as_the_cli_does(page: Any, shot: Any) -> None:
    open_view(page, "memory")
    page.wait_for_selector("#mem-chart svg")
    layout = {"gpus": "64", "tp": "4", "pp": "4", "vpp": "2", "cp": "2", "micro_batch": "2", "seq": "16384"}
    for name, value in layout.items():
        page.fill(f"#mem-form input[name={name}]", value)
    page.check("#mem-form input[name=sp]")
    page.select_option("#mem-form select[name=zero]", "1")
    page.select_option("#mem-form select[name=recompute]", "selective")
    page.select_option("#mem-form select[name=precision]", "fp8")
    args = "memory llama-3.1-70b --gpu h100-sxm --gpus 64 --tp 4 --pp 4 --vpp 2 --cp 2 --sp --zero 1"
    args += " --micro-batch 2 --seq 16384 --recompute selective --precision fp8"
    cli = cli_json(*args.split())
    wait_number(page, "#mem-training-total", cli["per_gpu"]["total_bytes"])
    shown = sorted({0, cli["heaviest_stage"], len(cli["stages"]) - 1})
    assert len(shown) >= 2
    for i in shown:
        wait_number(page, f"#mem-headline .stage-total[data-stage='{i}']", cli["stages"][i]["total_bytes"])
        segments = page.eval_on_selector_all(
            f"#mem-chart rect[data-bar='stage-{i}']", "rs => rs.map(r => Number(r.dataset.bytes))"
        )
        terms = {t["name"] for t in cli["terms"]}
        expect = sum(v for k, v in cli["stages"][i].items() if k in terms)
        assert sum(segments) == pytest.approx(expect, rel=1e-9)
        assert expect == pytest.approx(cli["stages"][i]["total_bytes"], rel=1e-9)
    # each term explains itself on focus, as on hover and tap
    page.mouse.move(0, 0)  # a resting pointer over the chart would pick the segment under it
    page.focus(f"#mem-chart rect[data-bar='stage-{shown[-1]}'][data-term='activations_bytes']")
    acts = next(t for t in cli["terms"] if t["name"] == "activations_bytes")
    wait_number(page, "#mem-detail-value", cli["stages"][shown[-1]]["activations_bytes"])
    detail = page.inner_text("#mem-detail")
    assert acts["formula"] in detail and acts["source"] in detail
    assert page.locator("#mem-chart rect[data-bar='serving']").count() >= 1
    shot(page, "memory")
    # a layout the engine refuses leaves the bars marked as not current
    page.fill("#mem-form input[name=tp]", "7")
    page.wait_for_selector("#mem-error:not([hidden])")
    page.wait_for_selector("#mem-results[data-stale='error']")
    page.fill("#mem-form input[name=tp]", "4")
    page.wait_for_selector("#mem-error", state="hidden")
    page.wait_for_selector("#mem-results:not([data-stale])")


def test_strategies_show_each_gpu_piece_and_bill(page: Any, shot: Any) -> None:
    open_view(page, "strategies")
    cards = {c["key"]: c for c in api(page, "/api/strategies", model="llama-3.1-70b", gpu="h100-sxm")["strategies"]}
    page.wait_for_selector("#st-tabs button[data-key='tp'].active")
    wait_number(page, "#st-gpus .gpu[data-gpu='0'] .gpu-bytes", cards["tp"]["gpus"][0]["total_bytes"])
    page.click("#st-tabs button[data-key='pp']")
    for g in cards["pp"]["gpus"]:
        wait_number(page, f"#st-gpus .gpu[data-gpu='{g['gpu']}'] .gpu-bytes", g["total_bytes"])
        assert g["piece"] in page.inner_text(f"#st-gpus .gpu[data-gpu='{g['gpu']}']")
    assert cards["pp"]["collective"] in page.inner_text("#st-collective-title")
    assert cards["pp"]["when"] in page.inner_text("#st-facts")
    page.click("#st-tabs button[data-key='ep']")
    page.wait_for_selector("#st-na")
    assert "experts" in page.inner_text("#st-na")
    page.select_option("#st-form select[name=model]", "mixtral-8x7b")
    moe = {c["key"]: c for c in api(page, "/api/strategies", model="mixtral-8x7b", gpu="h100-sxm")["strategies"]}
    wait_number(page, "#st-gpus .gpu[data-gpu='7'] .gpu-bytes", moe["ep"]["gpus"][7]["total_bytes"])
    assert page.locator("#st-traffic svg path.link").count() == 28  # all-to-all between 8 GPUs
    shot(page, "strategies")


def test_weights_split_follows_gpu_count_and_kind(page: Any, shot: Any) -> None:
    open_view(page, "weights")
    fit = api(page, "/api/fit", model="llama-3.3-70b", gpu="h200", gpus=8)
    wait_number(page, "#w-per-gpu", fit["weights_bytes_per_gpu_even_split"])
    wait_number(page, "#w-free-total", fit["free_bytes_total"])
    assert page.locator("#w-chart rect.weights").count() == 8
    page.select_option("#w-form select[name=gpu]", "h100-sxm")
    page.fill("#w-form input[name=gpus]", "4")
    four = api(page, "/api/fit", model="llama-3.3-70b", gpu="h100-sxm", gpus=4)
    wait_number(page, "#w-per-gpu", four["weights_bytes_per_gpu_even_split"])
    assert page.locator("#w-chart rect.weights").count() == 4
    assert page.input_value("#w-form input[name=gpus_range]") == "4"
    shot(page, "weights")
    page.fill("#w-form input[name=gpus]", "1")
    page.wait_for_function("() => document.querySelector('#w-fits')?.textContent === 'Does not fit.'")
    assert page.inner_text("#w-min-weights") == str(four["min_gpus_for_weights"])
    page.fill("#w-form input[name=gpus]", "many")
    page.wait_for_selector("#w-error:not([hidden])")
    assert "GPU count" in page.inner_text("#w-error")
    # the last accepted split stays on the page, marked as not current
    page.wait_for_selector("#w-results[data-stale='error'][aria-busy='false']")
    page.fill("#w-form input[name=gpus]", "2")
    page.wait_for_selector("#w-results:not([data-stale])")


def test_tp_split_steps_and_link_race(page: Any, shot: Any) -> None:
    open_view(page, "tp")
    split = api(page, "/api/tp-split", ranks=4, activation="gelu", seed=0, rows=4, hidden=8, ffn=16)
    page.wait_for_selector("#tp-matches.ok")
    for _ in range(3):
        page.click("#tp-next")
    assert page.get_attribute("#tp-step-label", "data-step") == "3"
    wait_number(page, "#tp-diff", split["max_abs_difference"], attr="value")
    page.select_option("#tp-form select[name=ranks]", "8")
    page.wait_for_selector("#tp-chart text:has-text('Y_7')")

    race = api(page, "/api/collectives", model="llama-3.1-70b", group=8, seq=8192)
    page.wait_for_selector("#race .race-row >> nth=3")
    for row in race["links"]:
        wait_number(page, f"#race .race-row[data-link='{row['link']}'] .ratio", row["ratio_bandwidth_only"], "ratio")
    page.select_option("#race-form select[name=timing]", "ratio_modeled")
    for row in race["links"]:
        wait_number(page, f"#race .race-row[data-link='{row['link']}'] .ratio", row["ratio_modeled"], "ratio")
    page.click("#race-play")
    page.wait_for_selector("#race .race-row[data-link='nvlink5'] .pct[data-done='1']")
    assert page.get_attribute("#race .race-row[data-link='eth-100g'] .pct", "data-done") == "0"
    shot(page, "tp")


def test_recipes_nest_axes_and_mark_the_fabric(page: Any, shot: Any) -> None:
    open_view(page, "recipes")
    report = api(page, "/api/recipe/llama3-405b-128k")
    wait_number(page, "#rc-gpus", report["factors"]["gpus"], "gpus")
    for axis, p in report["placement"].items():
        if axis == "ep":
            continue
        kind = "crosses" if p["crosses_fabric"] else "inside"
        assert page.locator(f"#rc-nest .nest-box.{kind}[data-axis='{axis}']").count() >= 1, axis
    recipes = api(page, "/api/recipes")["recipes"]
    assert page.locator("#rc-ruler g.ruler-row").count() == len(recipes)
    page.click("#rc-play")
    page.wait_for_selector("#rc-nest .gpu-dot.solo")
    page.wait_for_selector("#rc-nest .nest-box[data-axis='tp']")
    page.click("#rc-all")
    shot(page, "recipes")
    page.click("#rc-ruler g.ruler-row[data-recipe='deepseek-v3']")
    wait_number(page, "#rc-gpus", 2048, "gpus")
    assert "EP 64" in page.inner_text("#rc-notes")


def test_tiers_open_with_reasons(page: Any, shot: Any) -> None:
    open_view(page, "tiers")
    tiers = {t["key"]: t for t in api(page, "/api/tiers")["tiers"]}
    page.click("button[data-tier='specific']")
    body = page.inner_text("[data-tier-body='specific']")
    assert tiers["specific"]["reason"] in body
    shot(page, "tiers")
    page.click("[data-tier-body='specific'] a[href='#strategies?cp']")
    page.wait_for_selector("#st-tabs button[data-key='cp'].active")


def test_planner_table_pareto_rejections_and_comparison(page: Any, shot: Any) -> None:
    open_view(page, "planner")
    params = dict(model="llama-3.1-70b", gpu="h200", gpus=64, seq=8192, global_batch_tokens=4194304, top=10)
    plan = api(page, "/api/plan", **params, objective="step-time", headroom="0.10", allow_cross_node_tp="false")
    page.wait_for_selector("#pl-table tbody tr")
    assert page.locator("#pl-table tbody tr").count() == len(plan["plans"])
    wait_number(page, "#pl-table tbody tr[data-rank='1'] td[data-col='step']", plan["plans"][0]["step_time_s"], "value")
    assert page.locator("#pl-pareto circle.pareto-pt").count() == len(plan["pareto"])
    assert page.locator("#pl-rejections tbody tr").count() == len(plan["rejections"])
    assert plan["explain"][0]["why"] in page.inner_text("#pl-explain")

    def column(name: str) -> list[float]:
        values = page.eval_on_selector_all(f"#pl-table td[data-col='{name}']", "t => t.map(e => e.dataset.value)")
        return [float(v) for v in values]

    page.click("#pl-table th[data-sort='mem']")
    assert column("mem") == sorted(column("mem"))
    page.click("#pl-table th[data-sort='mem']")
    assert column("mem") == sorted(column("mem"), reverse=True)

    page.evaluate(
        """() => { window.seenBusy = false; const r = document.querySelector('#pl-results');
        const busy = () => r.getAttribute('aria-busy') === 'true';
        new MutationObserver(() => { if (busy()) window.seenBusy = true; }).observe(r, { attributes: true }); }"""
    )
    page.click("#pl-table tbody tr >> nth=2 >> button")
    page.wait_for_selector("#pl-explain .explain[data-b^='tp=']")
    assert page.evaluate("() => window.seenBusy"), "the old table was not marked while the search ran"
    page.wait_for_selector("#pl-results[aria-busy='false']:not([data-stale])")
    named = page.locator("#pl-explain .explain[data-b^='tp='] tbody tr >> nth=0 >> td")
    assert named.count() == 4 and named.nth(2).inner_text().endswith("s")
    shot(page, "planner")

    page.fill("#pl-form input[name=gpus]", "0")
    page.click("#pl-run")
    page.wait_for_selector("#pl-error:not([hidden])")
    assert "GPUs: input should be greater than or equal to 1" in page.inner_text("#pl-error")
    page.wait_for_selector("#pl-results[data-stale='error']")


def test_serving_pareto_best_plan_and_step(page: Any, shot: Any) -> None:
    open_view(page, "serving")
    params = dict(model="llama-2-70b", gpu="h100-sxm", gpus=8, input_len=1024, output_len=256, ttft_p99=2, tpot_p99=0.2)
    plan = api(page, "/api/serve-plan", **params, engine="trtllm", top=5)
    best = plan["best"]
    wait_number(page, "#sv-tps", best["tokens_per_s_per_gpu"], "value")
    shape = f"{best['replicas']} × TP {best['layout']['tp']}"
    assert shape in page.inner_text("#sv-best")
    assert page.locator("#sv-pareto circle.pareto-pt").count() == len(plan["pareto"])
    assert page.locator("#sv-best-pt").count() == 1
    page.wait_for_selector("#sv-steps rect.phase", state="attached")  # a phase may be 0 s wide
    assert page.locator("#sv-steps rect.phase").count() == 5
    shown = sum(float(v) for v in page.eval_on_selector_all("#sv-steps rect.phase", "r => r.map(e => e.dataset.value)"))
    assert shown == pytest.approx(float(page.get_attribute("#sv-step", "data-value")), rel=1e-9)
    # the engine's mean step is what the bars draw; a request's TPOT leaves its own prompt's step out (TTFT has it)
    load = dict(concurrency=best["batch_cap_per_replica"] * best["replicas"], replicas=best["replicas"])
    served = api(page, "/api/serve", **{k: v for k, v in params.items() if "p99" not in k}, **load, engine="trtllm",
                 tp=best["layout"]["tp"], pp=best["layout"]["pp"], ep=best["layout"]["ep"],
                 weights_dtype=best["layout"]["weights_dtype"], kv_dtype=best["layout"]["kv_dtype"])  # fmt: skip
    assert shown == pytest.approx(sum(served["step_s"].values()), rel=1e-9)
    assert float(page.get_attribute("#sv-tpot", "data-value")) == pytest.approx(served["tpot_s"], rel=1e-9)
    lo, hi = served["load_band"]["tpot_s_p99"]
    assert lo < served["tpot_s_p99"] < hi and "P10-P90 of the p99s" in page.inner_text("#sv-band")
    assert served["tpot_s"] <= shown
    shot(page, "serving")

    page.fill("#sv-form input[name=tpot_p99]", "0.001")
    page.wait_for_function("() => document.querySelector('#sv-summary').textContent.startsWith('No layout')")
    page.fill("#sv-form input[name=gpus]", "0")
    page.wait_for_selector("#sv-error:not([hidden])")
    assert "GPUs: input should be greater than or equal to 1" in page.inner_text("#sv-error")


@pytest.mark.parametrize("view", ["memory", "strategies", "planner", "serving"])
def test_phone_width_has_no_sideways_scroll(browser: Any, live_server: str, shot: Any, view: str) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    pg = context.new_page()
    pg.base = live_server
    try:
        open_view(pg, view)
        ready = {"memory": "#mem-chart svg", "strategies": "#st-gpus .gpu", "planner": "#pl-table tbody tr",
                 "serving": "#sv-pareto svg"}[view]  # fmt: skip
        pg.wait_for_selector(ready, timeout=15_000)
        width = pg.evaluate("() => document.documentElement.scrollWidth")
        assert width <= 392, f"{view} is {width} px wide at a 390 px viewport"
        shot(pg, f"{view}-phone")
    finally:
        context.close()
