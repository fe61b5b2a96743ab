"""The layout page in headless Chromium, on a laptop (1440x900) and a phone (390x844): its timeline totals are
`estimate --json`'s step time and exposed communication, its bars `memory --json`'s stages, its cost the CLI's,
and its address reloads to the same state. Skipped when playwright or chromium is missing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshplan.cli import main

pytest.importorskip("fastapi", reason="the web explorer needs the [web] extra: pip install 'meshplan[web]'")
pytest.importorskip("playwright.sync_api", reason="end-to-end tests need: pip install playwright")

SIZES = {"desktop": (1440, 900), "phone": (390, 844)}
LAYOUT = {"model": "mixtral-8x7b", "gpus": "64", "tp": "2", "pp": "4", "vpp": "2", "ep": "8", "schedule": "interleaved",
          "global_batch": "64", "zero": "1"}  # fmt: skip
FLAGS = ["--gpu", "h100-sxm", "--gpus", "64", "--tp", "2", "--pp", "4", "--vpp", "2", "--ep", "8", "--schedule",
         "interleaved", "--global-batch", "64", "--zero", "1"]  # fmt: skip


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def opened(browser: Any, base: str, size: str, query: str) -> Any:
    w, h = SIZES[size]
    pg = browser.new_context(viewport={"width": w, "height": h}).new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.errors = errors
    pg.set_default_timeout(15_000)
    pg.goto(f"{base}/#layout?{query}")
    pg.wait_for_selector("body[data-ready]")
    pg.wait_for_selector("#ly-gantt svg")
    pg.wait_for_selector("#ly-results:not([data-stale])")
    return pg


def numbers(pg: Any) -> dict[str, Any]:
    return pg.evaluate(
        """() => ({
            step: Number(document.querySelector('#ly-totals').dataset.stepS),
            exposed: Number(document.querySelector('#ly-totals').dataset.exposedS),
            agree: document.querySelector('#ly-totals').dataset.rowsAgree,
            headline: Number(document.querySelector('#ly-step').dataset.seconds),
            bars: Array.from(document.querySelectorAll('#ly-bars .ly-bar')).map(b => Number(b.dataset.bytes)),
            peaks: Array.from(document.querySelectorAll('#ly-memline .ly-mem')).map(p => Number(p.dataset.peak)),
            width: document.documentElement.scrollWidth,
        })"""
    )


@pytest.mark.parametrize("size", sorted(SIZES))
def test_the_page_draws_estimates_step_and_memorys_bars(
    browser: Any, live_server: str, size: str, capsys: pytest.CaptureFixture[str]
) -> None:
    est = cli(["estimate", "mixtral-8x7b", *FLAGS], capsys)
    mem = cli(["memory", "mixtral-8x7b", *FLAGS], capsys)
    pg = opened(browser, live_server, size, "&".join(f"{k}={v}" for k, v in LAYOUT.items()))
    try:
        got = numbers(pg)
        assert got["step"] == pytest.approx(est["step_time_s"], rel=1e-6)
        assert got["exposed"] == pytest.approx(est["breakdown"]["exposed_comm_s"], rel=1e-6)
        assert got["headline"] == est["step_time_s"] and got["agree"] == "true"
        assert got["bars"] == [s["total_bytes"] for s in mem["stages"]]
        assert got["peaks"] == [s["total_bytes"] for s in mem["stages"]]
        assert got["width"] <= SIZES[size][0]  # the page scrolls inside its charts, never the whole page sideways
        # every drawing is there: a row per stage, a node box per node, the axis that crosses the fabric picked
        assert pg.locator("#ly-gantt g[role=list]").count() == 4
        assert pg.locator("#ly-place .ly-node").count() == 8
        assert "crosses the fabric" in pg.inner_text("#ly-axes .tab.active")
        assert not pg.errors
    finally:
        pg.context.close()


def test_the_address_reloads_to_the_same_state(browser: Any, live_server: str) -> None:
    pg = opened(browser, live_server, "desktop", "")
    try:
        pg.fill("#ly-form input[name=pp]", "2")
        pg.fill("#ly-form input[name=tp]", "4")
        pg.check("#ly-form input[name=sp]")
        pg.select_option("#ly-form select[name=zero]", "3")
        pg.fill("#ly-form input[name=price_per_gpu_hour]", "3")
        pg.wait_for_function("() => location.hash.includes('price_per_gpu_hour=3')")
        pg.wait_for_function("() => document.querySelector('#ly-money') !== null")
        pg.wait_for_selector("#ly-results:not([data-stale])")
        pg.click("#ly-axes button[data-axis=pp]")
        pg.wait_for_function("() => location.hash.includes('axis=pp')")
        before = numbers(pg) | {"form": form(pg), "axis": pg.inner_text("#ly-axes .tab.active")}
        pg.reload()
        pg.wait_for_selector("#ly-gantt svg")
        pg.wait_for_selector("#ly-results:not([data-stale])")
        pg.wait_for_function(
            "s => document.querySelector('#ly-step')?.dataset.seconds === s", arg=str(before["headline"])
        )
        after = numbers(pg) | {"form": form(pg), "axis": pg.inner_text("#ly-axes .tab.active")}
        assert after == before and before["form"]["zero"] == "3" and before["axis"].startswith("pp")
        assert not pg.errors
    finally:
        pg.context.close()


def form(pg: Any) -> dict[str, Any]:
    return pg.eval_on_selector(
        "#ly-form",
        "f => Object.fromEntries(Array.from(f.elements).filter(e => e.name)"
        ".map(e => [e.name, e.type === 'checkbox' ? e.checked : e.value]))",
    )


def test_the_cost_is_the_clis(browser: Any, live_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    est = cli(["estimate", "mixtral-8x7b", *FLAGS, "--tokens", "2T", "--price-per-gpu-hour", "2.5"], capsys)
    query = "&".join(f"{k}={v}" for k, v in LAYOUT.items()) + "&tokens=2T&price_per_gpu_hour=2.5"
    pg = opened(browser, live_server, "phone", query)
    try:
        money = pg.evaluate("() => ({...document.querySelector('#ly-money').dataset})")
        train = pg.evaluate("() => ({...document.querySelector('#ly-train').dataset})")
        assert float(money["perMillion"]) == est["cost"]["cost_per_million_tokens"]
        assert float(money["total"]) == est["cost"]["cost_total"]
        assert float(train["gpuHours"]) == est["time_to_train"]["gpu_hours_total"]
        assert float(train["days"]) == est["time_to_train"]["wall_time_days"]
        assert "--price-per-gpu-hour 2.5" in pg.inner_text("#ly-command")
    finally:
        pg.context.close()


def test_the_timeline_answers_the_keyboard_and_bad_input_is_refused(browser: Any, live_server: str) -> None:
    pg = opened(browser, live_server, "desktop", "pp=4&tp=2")
    try:
        pg.focus("#ly-gantt .ly-iv[data-row='0'][tabindex='0']")
        first = pg.inner_text("#ly-detail")
        assert first.startswith("stage 0: forward of micro-batch 0")
        pg.keyboard.press("ArrowRight")
        pg.keyboard.press("ArrowDown")
        moved = pg.evaluate(
            "() => [document.activeElement.dataset.row, document.activeElement.getAttribute('aria-label')]"
        )
        assert moved[0] == "1" and moved[1].startswith("stage 1:") and pg.inner_text("#ly-detail") == moved[1]
        pg.fill("#ly-form input[name=pp]", "3")
        pg.wait_for_selector("#ly-error:not([hidden])")
        assert "does not divide" in pg.inner_text("#ly-error")
        assert pg.get_attribute("#ly-results", "data-stale") == "error"
    finally:
        pg.context.close()


def test_a_link_carries_the_stack_and_conditions(
    browser: Any, live_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """layoutHref (what a planner row or another view links to) opens the layout page on the CLI's numbers for a
    layout with a stack and a run condition of its own."""
    est = cli(["estimate", "llama-3.1-8b", "--gpu", "h100-sxm", "--gpus", "64", "--dp-shard", "64", "--zero", "3",
               "--stack", "torchtitan", "--grad-sync", "off", "--global-batch", "128"], capsys)  # fmt: skip
    pg = opened(browser, live_server, "desktop", "")
    try:
        href = pg.evaluate(
            """async () => (await import('/static/js/layout.js')).layoutHref({model: 'llama-3.1-8b', gpu: 'h100-sxm',
                gpus: 64, tp: 1, pp: 1, dp_shard: 64, zero: 3, sp: false, stack: 'torchtitan', grad_sync: 'off',
                global_batch: 128, timeline: 'true', precision: null})"""
        )
        assert href.startswith("#layout?") and "timeline" not in href and "precision" not in href
        pg.goto(f"{live_server}/{href}")
        pg.wait_for_function(
            "s => Number(document.querySelector('#ly-step')?.dataset.seconds) === s", arg=est["step_time_s"]
        )
        assert form(pg)["stack"] == "torchtitan" and form(pg)["grad_sync"] == "off"
        assert numbers(pg)["bars"] == [s["total_bytes"] for s in est["stages"]]
    finally:
        pg.context.close()


@pytest.mark.parametrize("recipe", ["deepseek-v3"])
def test_a_recipe_opens_its_layout_page_at_the_recipes_step_time(
    browser: Any, live_server: str, recipe: str, capsys: pytest.CaptureFixture[str]
) -> None:
    published = cli(["recipe", recipe, "--no-rank"], capsys)
    pg = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
    pg.set_default_timeout(15_000)
    try:
        pg.goto(f"{live_server}/#recipes?recipe={recipe}")
        pg.wait_for_selector("body[data-ready]")
        pg.wait_for_selector(f"#rc-gpus[data-gpus='{published['gpus']}']")
        pg.click("#rc-layout-link")
        pg.wait_for_selector("#ly-gantt svg")
        pg.wait_for_selector("#ly-results:not([data-stale])")
        pg.wait_for_function(
            "v => Number(document.querySelector('#ly-step').dataset.seconds) > 0 && location.hash.includes(v)",
            arg=f"tp={published['factors']['tp']}",
        )
        assert numbers(pg)["headline"] == pytest.approx(published["step_time_s"], rel=1e-9)
    finally:
        pg.context.close()


@pytest.mark.parametrize(
    "config", ["nemo_llama3_8b_pretrain.yaml", "megatron_train_llama3_8b_h100_fp8.sh", "torchtitan_llama3_8b.toml"]
)
def test_an_engine_config_opens_as_estimate_from_reads_it(
    browser: Any, live_server: str, config: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "configs" / config
    pg = opened(browser, live_server, "desktop", "gpus=16")
    try:
        pg.set_input_files("#ly-config", str(path))
        pg.wait_for_function("() => !document.querySelector('#ly-config-note').hidden")
        pg.wait_for_function("() => location.hash.includes('stack=')")
        pg.wait_for_selector("#ly-results:not([data-stale])")
        gpus = pg.input_value("#ly-form input[name=gpus]")
        est = cli(["estimate", "--from", str(path), "--gpu", "h100-sxm", "--gpus", gpus], capsys)
        pg.wait_for_function(
            "v => Math.abs(Number(document.querySelector('#ly-step').dataset.seconds) / v - 1) < 1e-9",
            arg=est["step_time_s"],
        )
        assert pg.is_hidden("#ly-error")
    finally:
        pg.context.close()


def test_a_file_that_is_no_training_config_is_one_line_and_changes_nothing(
    browser: Any, live_server: str, tmp_path: Any
) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("these are not the flags of any engine\n" * 3)
    launcher = tmp_path / "serve.sh"
    launcher.write_text("vllm serve meta-llama/Llama-3.1-8B-Instruct --tensor-parallel-size 2\n")
    pg = opened(browser, live_server, "desktop", "gpus=16&tp=2")
    try:
        before = pg.evaluate("() => location.hash")
        for path, says in ((junk, "notes.txt"), (launcher, "serving launcher")):
            pg.set_input_files("#ly-config", str(path))
            pg.wait_for_function("t => document.querySelector('#ly-error').textContent.includes(t)", arg=says)
            assert "\n" not in pg.inner_text("#ly-error").strip()
            assert pg.evaluate("() => location.hash") == before
    finally:
        pg.context.close()
