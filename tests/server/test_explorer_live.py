"""The explorer as a live tool, in headless Chromium: exports that are the plan, results that never outlive their
inputs, time beside memory, a phone that keeps the headline and the edited field on screen, pictures drawn from
the model itself, GPU names as people say them, and the keyboard paths (roving tabs, skip link, plot points)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshplan.cli import main

pytest.importorskip("fastapi", reason="the web explorer needs the [web] extra: pip install 'meshplan[web]'")
pytest.importorskip("playwright.sync_api", reason="end-to-end tests need: pip install playwright")


def cli_json(argv: list[str]) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(argv)
    body: dict[str, Any] = json.loads(out.getvalue())
    return body


def ready(pg: Any, address: str, selector: str) -> None:
    pg.goto(f"{pg.base}/{address}")
    pg.wait_for_selector("body[data-ready]")
    pg.wait_for_selector(selector)


def download(pg: Any, click: str) -> tuple[str, dict[str, Any]]:
    with pg.expect_download() as got:
        pg.click(click)
    return got.value.suggested_filename, json.loads(Path(got.value.path()).read_text())


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_serving_export_is_the_cli_export_of_the_same_plan(page: Any, tmp_path: Path, engine: str) -> None:
    ready(page, "#serving?model=llama-3.1-8b&gpus=4&output_len=128&tpot_p99=0.02", "#sv-command")
    page.wait_for_selector("#sv-results[aria-busy='false']")
    _, plan = download(page, "#sv-json")
    assert plan["best"]["replicas"] > 1
    page.select_option("#sv-engine", engine)
    name, shown = download(page, "#sv-export")
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(plan))
    cli = cli_json(["export", engine, "--from-plan", str(saved), "--json"])
    assert shown["command"] == cli["command"] and shown["files"] == cli["files"]
    best = plan["best"]
    assert f"dp{best['replicas']}" in name and f"seqs{best['batch_cap_per_replica']}" in name
    assert name.startswith(f"llama-3.1-8b_{best['gpus']}xh100-sxm_tp{best['layout']['tp']}")


def test_a_changed_input_dims_the_planner_within_a_frame_and_search_replaces_search(page: Any) -> None:
    ready(page, "#planner?model=llama-3.1-8b&gpus=16&seq=4096", "#pl-results[aria-busy='false'] #pl-table tbody tr")
    assert "llama-3.1-8b on 16 × H200 141 GB" in page.inner_text("#pl-fleet")
    # the change and the check in one task, then one frame later: dimmed and labelled
    state = page.evaluate(
        """() => new Promise((done) => {
          const f = document.querySelector('#pl-form input[name=gpus]');
          f.value = '32'; f.dispatchEvent(new Event('input', { bubbles: true }));
          const now = document.querySelector('#pl-results').dataset.stale;
          requestAnimationFrame(() => done([now, getComputedStyle(document.querySelector('#pl-summary')).opacity,
            getComputedStyle(document.querySelector('#pl-results'), '::before').content,
            document.querySelector('#pl-stale-note').hidden]));
        })"""
    )
    assert state[0] == "inputs" and state[1] == "0.35" and "press Search" in state[2] and state[3] is False
    # back to the inputs searched: current again
    page.fill("#pl-form input[name=gpus]", "16")
    page.wait_for_selector("#pl-results:not([data-stale])")

    held: list[Any] = []
    page.route("**/api/plan?*", lambda route: held.append(route))
    page.fill("#pl-form input[name=gpus]", "32")
    page.click("#pl-run")
    page.wait_for_selector("#pl-cancel:visible")
    page.wait_for_function("() => document.querySelector('#pl-progress-text').textContent.includes('32 ×')")
    page.unroute("**/api/plan?*")
    page.fill("#pl-form input[name=gpus]", "8")
    page.click("#pl-run")  # replaces the held search: its request is aborted
    page.wait_for_selector("#pl-results[aria-busy='false']:not([data-stale])")
    assert "on 8 ×" in page.inner_text("#pl-fleet")
    assert page.evaluate("() => document.querySelector('#pl-cancel').hidden")
    for route in held:
        with contextlib.suppress(Exception):
            route.continue_()
    page.wait_for_timeout(200)
    assert "on 8 ×" in page.inner_text("#pl-fleet")  # the first search never draws over the second

    # a search edited while it runs is drawn for what it asked, dimmed; Cancel ends a running search
    held.clear()
    page.route("**/api/plan?*", lambda route: held.append(route))
    page.fill("#pl-form input[name=gpus]", "4")
    page.click("#pl-run")
    page.wait_for_selector("#pl-cancel:visible")
    page.click("#pl-cancel")
    page.wait_for_function("() => document.querySelector('#pl-error').textContent.includes('cancelled')")
    assert page.get_attribute("#pl-results", "data-stale") in ("inputs", "error")
    assert "on 8 ×" in page.inner_text("#pl-fleet")
    page.unroute("**/api/plan?*")


def test_a_planner_row_opens_its_layout_and_its_bars(page: Any) -> None:
    ready(page, "#planner?model=llama-3.1-8b&gpus=16&seq=4096", "#pl-results[aria-busy='false'] #pl-table tbody tr")
    _, plan = download(page, "#pl-json")
    link = page.get_attribute("#pl-table tr[data-rank='1'] a.open-layout", "href")
    assert link.startswith("#layout?") and "tp=" in link and "model=llama-3.1-8b" in link
    page.click("#pl-table tr[data-rank='1'] a.open-memory")
    page.wait_for_selector("#mem-results[aria-busy='false'] #mem-training-total")
    page.wait_for_function(
        "v => Number(document.querySelector('#mem-training-total').dataset.bytes) === v",
        arg=plan["plans"][0]["per_gpu"]["total_bytes"],
    )
    # and its step time and MFU, from /api/estimate, as the planner scored it
    page.wait_for_selector("#mem-step-time")
    shown = float(page.get_attribute("#mem-step-time", "data-value"))
    assert shown == pytest.approx(plan["plans"][0]["step_time_s"], rel=1e-9)


def test_a_hand_set_layout_gets_the_step_time_of_meshplan_estimate(page: Any) -> None:
    ready(page, "#memory?gpus=64&tp=8&pp=4&sp=1&zero=1", "#mem-step-time")
    want = cli_json(
        [
            "estimate",
            "llama-3.1-70b",
            "--gpu",
            "h100-sxm",
            "--gpus",
            "64",
            "--tp",
            "8",
            "--pp",
            "4",
            "--sp",
            "--zero",
            "1",
            "--json",
        ]
    )
    assert float(page.get_attribute("#mem-step-time", "data-value")) == want["step_time_s"]
    assert float(page.get_attribute("#mem-mfu", "data-value")) == want["mfu"]
    assert page.get_attribute("#mem-layout-link", "href").startswith("#layout?gpus=64&tp=8")
    # the GPU as people name it, its HBM in GiB as nvidia-smi shows it, the bytes in the detail
    assert page.inner_text("#mem-form select[name=gpu] option[value='h100-sxm']") == "H100 SXM 80 GB"
    assert "79.6 GiB" in page.inner_text("#mem-fits") and "× H100 SXM 80 GB" in page.inner_text("#mem-headline")
    assert "81,559 MiB" in page.get_attribute("#mem-fits", "title")
    assert "85,520,809,984 bytes" in page.get_attribute("#mem-fits", "title")


def test_an_export_over_hbm_warns_and_needs_forcing(page: Any) -> None:
    ready(page, "#memory?model=llama-3.1-70b&gpus=8", "#mem-export")
    assert "over by" in page.inner_text("#mem-fits")
    page.select_option("#mem-engine", "megatron")
    page.click("#mem-export")
    page.wait_for_selector("#mem-over")
    assert "does not fit" in page.inner_text("#mem-status").lower()
    name, export = download(page, "#mem-force")
    assert name == "llama-3.1-70b_8xh100-sxm_tp1-pp1-dp8_megatron.json"
    assert export["notes"][0].startswith("warning: this layout needs")


def test_planner_exports_of_different_plans_get_different_names(page: Any) -> None:
    ready(page, "#planner?model=llama-3.1-8b&gpus=16&seq=4096", "#pl-results[aria-busy='false'] #pl-table tbody tr")
    page.select_option("#pl-engine", "megatron")
    names = []
    for i in ("0", "2"):
        page.select_option("#pl-export-plan", i)
        names.append(download(page, "#pl-export")[0])
    assert names[0] != names[1] and all(n.startswith("llama-3.1-8b_16xh200_tp") for n in names)


@pytest.fixture()
def phone(browser: Any, live_server: str) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    pg = context.new_page()
    pg.base = live_server
    pg.set_default_timeout(10_000)
    yield pg
    context.close()


IN_VIEW = """(sel) => { const e = document.querySelector(sel); const b = e.getBoundingClientRect();
  return b.height > 0 && b.top >= 0 && b.bottom <= innerHeight; }"""


@pytest.mark.parametrize("field", ["gpus", "zero"])
def test_phone_keeps_the_headline_and_the_edited_field_on_screen(phone: Any, field: str) -> None:
    ready(phone, "#memory?model=llama-3.1-70b", "#mem-results[aria-busy='false'] #mem-training-total")
    sel = f"#mem-form [name={field}]"
    asked = phone.evaluate("() => document.querySelector('#mem-results').dataset.generation")
    phone.locator(sel).scroll_into_view_if_needed()
    if field == "zero":
        phone.focus(sel)
        phone.select_option(sel, "3")
    else:
        phone.fill(sel, "16")
    phone.wait_for_function("g => document.querySelector('#mem-results').dataset.generation !== g", arg=asked)
    phone.wait_for_selector("#mem-results[aria-busy='false']")
    phone.wait_for_timeout(100)  # the bar is placed in the frame after the answer is drawn
    headline_seen = phone.evaluate(IN_VIEW, "#mem-training-total") or phone.evaluate(
        "() => { const p = document.querySelector('#peek'); return !p.hidden && p.textContent.includes('over by'); }"
    )
    assert headline_seen
    assert phone.evaluate(IN_VIEW, sel)
    overlap = phone.evaluate(
        """(sel) => { const p = document.querySelector('#peek'); if (p.hidden) return false;
          const a = p.getBoundingClientRect(), b = document.querySelector(sel).getBoundingClientRect();
          return a.top < b.bottom && b.top < a.bottom; }""",
        sel,
    )
    assert not overlap


def test_phone_tables_scroll_instead_of_fading(phone: Any) -> None:
    ready(phone, "#planner?model=llama-3.1-8b&gpus=16&seq=4096", "#pl-results[aria-busy='false'] #pl-table tbody tr")
    phone.wait_for_selector("#pl-results .table-wrap.scrolls")
    style = phone.evaluate(
        """() => { const w = document.querySelector('#pl-results .table-wrap.scrolls'); const s = getComputedStyle(w);
          return [s.maskImage || s.webkitMaskImage || 'none', s.overflowX, w.scrollWidth > w.clientWidth]; }"""
    )
    assert style[0] == "none" and style[1] == "auto" and style[2]


def test_pictures_follow_the_model(page: Any) -> None:
    ready(page, "#strategies?model=llama-3.1-8b&seq=4096&strategy=pp", "#st-gpus .gpu")
    pieces = page.eval_on_selector_all("#st-work svg text.on-color", "ts => ts.map(t => t.textContent)")
    assert pieces[0] == "layers 1\u20134" and pieces[-1] == "layers 29\u201332"  # 32 layers, not 80
    page.click("#st-tabs button[data-key='cp']")
    page.wait_for_selector("#st-tabs button[data-key='cp'].active")
    assert "4,096 tokens" in page.inner_text("#st-work")
    page.click("#st-tabs button[data-key='ep']")
    page.wait_for_selector("#st-no-experts")
    assert page.locator("#st-work rect.expert").count() == 0

    ready(page, "#weights?model=llama-3.1-70b&gpu=h100-sxm&gpus=1", "#w-chart svg")
    page.wait_for_selector("#w-results[aria-busy='false']")
    text = page.inner_text("#w-summary")
    assert "Split 1 ways" not in text and "On one H100 SXM 80 GB" in text
    assert "over by" in text and "leaving" not in text and "-" not in page.inner_text("#w-free")
    assert page.locator("#w-chart line.hbm-top").count() == 1  # the HBM's top stays visible over a red bar


def test_keyboard_tabs_skip_link_and_plot_points(page: Any) -> None:
    ready(page, "#strategies", "#st-tabs button[data-key='tp'].active")
    tabs = page.eval_on_selector_all("#st-tabs [role=tab]", "ts => ts.map(t => [t.dataset.key, t.tabIndex])")
    assert [k for k, i in tabs if i == 0] == ["tp"] and all(i == -1 for k, i in tabs if k != "tp")
    page.focus("#st-tabs button[data-key='tp']")
    page.keyboard.press("ArrowRight")
    page.wait_for_selector("#st-tabs button[data-key='pp'].active")
    assert page.evaluate("() => document.activeElement.dataset.key") == "pp"
    page.keyboard.press("End")
    page.wait_for_selector("#st-tabs button[data-key='ep'].active")
    page.keyboard.press("ArrowLeft")
    page.wait_for_selector("#st-tabs button[data-key='cp'].active")

    page.goto("about:blank")
    page.goto(f"{page.base}/#weights")
    page.wait_for_selector("body[data-ready]")
    page.keyboard.press("Tab")
    assert page.evaluate("() => document.activeElement.id") == "skip"
    page.keyboard.press("Enter")
    assert page.evaluate("() => document.activeElement.closest('#view-weights') !== null")
    assert page.evaluate("() => location.hash").startswith("#weights")

    ready(page, "#serving?model=llama-3.1-8b&gpus=4", "#sv-pareto g.pt")
    page.focus("#sv-pareto g.pt[data-front='0']")
    page.keyboard.press("Enter")
    assert page.inner_text("#sv-point").startswith("Front point 1:")
    assert "llama-3.1-8b on 4 × H100 SXM 80 GB" in page.inner_text("#sv-summary")
