"""Every view in headless Chromium at a laptop's 1440x900 and a phone's 390x844: axe-core finds no serious or
critical violation, SVG text is at least 11 px, tap targets at least 24 px, the first result is on screen after a
change at phone size, and Enter and Space work on tabs, tiers, ruler rows and sort headers. With
MESHPLAN_SCREENSHOTS=1, screenshots of each view at both sizes go to test-artifacts/explorer-<view>-<wide|phone>.png.

axe-core 4.14.1 (MPL-2.0, Deque Systems) is vendored as tests/server/vendor/axe.min.js, so nothing is fetched.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the web explorer needs the [web] extra: pip install 'meshplan[web]'")
pytest.importorskip("playwright.sync_api", reason="end-to-end tests need: pip install playwright")

AXE = Path(__file__).resolve().parent / "vendor" / "axe.min.js"
SIZES = {"wide": (1440, 900), "phone": (390, 844)}
# What each view shows once its first answer has arrived.
READY = {
    "home": "#api-list li",
    "memory": "#mem-chart svg",
    "strategies": "#st-gpus .gpu",
    "weights": "#w-chart svg",
    "tp": "#race .race-row",
    "recipes": "#rc-ruler svg",
    "tiers": ".tier-head",
    "planner": "#pl-table tbody tr",
    "serving": "#sv-pareto svg",
    "layout": "#ly-gantt svg",
}


@pytest.fixture(params=list(SIZES))
def sized(request: Any, browser: Any, live_server: str) -> Iterator[Any]:
    width, height = SIZES[request.param]
    # the pages forbid inline scripts; the context lets the test inject axe all the same
    context = browser.new_context(viewport={"width": width, "height": height}, is_mobile=width < 500, bypass_csp=True)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.set_default_timeout(20_000)
    pg.base = live_server
    pg.size_name = request.param
    yield pg
    context.close()
    assert not errors, f"script errors in the page: {errors}"


def open_ready(pg: Any, view: str) -> None:
    pg.goto(f"{pg.base}/#{view}")
    pg.wait_for_selector("body[data-ready]")
    pg.wait_for_selector(f"#view-{view} {READY[view]}" if view != "home" else READY[view])
    pg.wait_for_function("() => !document.querySelector('section.view:not([hidden]) [aria-busy=true]')")


@pytest.mark.parametrize("view", list(READY))
def test_axe_finds_no_serious_violation_and_text_and_targets_are_large_enough(sized: Any, shot: Any, view: str) -> None:
    if not AXE.exists():
        pytest.skip(f"axe-core is not vendored at {AXE}")
    open_ready(sized, view)
    if view != "home":  # measured before the folded groups open, as a reader first sees the view
        small = sized.evaluate(
            """() => Array.from(document.querySelectorAll('section.view:not([hidden]) svg text'))
              .filter(t => t.getClientRects().length && t.textContent.trim())
              .map(t => { const m = t.getScreenCTM();
                return [t.textContent, parseFloat(getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b)]; })
              .filter(([, px]) => px < 10.95).slice(0, 5)"""
        )
        assert not small, f"SVG text under 11 px in {view}: {small}"
        tiny = sized.evaluate(
            """() => Array.from(document.querySelectorAll(
                'section.view:not([hidden]) :is(button, select, input, [role=button], [tabindex="0"]), #nav a'))
              .filter(e => e.getClientRects().length && e.type !== 'hidden' && !e.closest('svg rect, p, li'))
              .filter(e => !(e.tagName === 'rect'))
              .map(e => { const b = e.getBoundingClientRect();
                return [e.id || e.dataset.key || e.name || e.textContent.slice(0, 30), b.width, b.height]; })
              .filter(([, w, h]) => w < 24 || h < 24).slice(0, 5)"""
        )
        assert not tiny, f"tap targets under 24 px in {view}: {tiny}"
    # folded groups (run conditions, schedule, adapters, the report's conditions) are checked open
    sized.eval_on_selector_all("section.view:not([hidden]) details", "ds => ds.forEach(d => { d.open = true; })")
    shot(sized, f"{view}-{sized.size_name}")
    # the page makes each region that scrolls sideways focusable in a debounced pass after each render (app.js
    # scrollCues): wait for that pass, so axe sees the page a keyboard user gets, not a render 60 ms old
    sized.wait_for_function(
        """() => Array.from(document.querySelectorAll('.table-wrap, .chart, .cli-row, .nest'))
          .filter(n => n.getClientRects().length && n.scrollWidth > n.clientWidth + 2)
          .every(n => n.getAttribute('tabindex') === '0')""",
        timeout=5000,
    )
    sized.add_script_tag(path=str(AXE))
    found = sized.evaluate(
        """async () => {
          const r = await axe.run(document, { resultTypes: ['violations'] });
          return r.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')
            .map(v => `${v.id} (${v.impact}): ${v.help} -- `
              + v.nodes.slice(0, 4).map(n => n.target.join(' ')).join(' | '));
        }"""
    )
    assert not found, "\\n".join(found)


@pytest.mark.parametrize("view", ["memory", "weights", "planner"])
def test_phone_shows_the_first_result_after_a_change(browser: Any, live_server: str, view: str) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    pg = context.new_page()
    pg.base = live_server
    try:
        open_ready(pg, view)
        field, value = {"memory": ("seq", "8192"), "weights": ("gpus", "4"), "planner": ("gpus", "32")}[view]
        form = {"memory": "#mem-form", "weights": "#w-form", "planner": "#pl-form"}[view]
        results = f"document.querySelector('#view-{view} .results')"
        asked = pg.evaluate(f"() => {results}.dataset.generation || '0'")
        pg.fill(f"{form} input[name={field}]", value)
        if view == "planner":
            pg.click("#pl-run")
        else:  # the change's own request: the form waits 30 ms for typing to pause before it asks
            pg.wait_for_function(f"g => ({results}.dataset.generation || '0') !== g", arg=asked)
        pg.wait_for_function(
            f"() => document.querySelector('#view-{view} .results').getAttribute('aria-busy') === 'false'"
        )
        headline = pg.locator(f"#view-{view} .headline").first
        pg.wait_for_function(
            """h => { const p = document.querySelector('#peek'); const s = document.querySelector(h + ' strong');
              const inView = (e) => { const b = e.getBoundingClientRect();
                return b.height > 0 && b.top >= 0 && b.bottom <= innerHeight; };
              return (s && inView(s)) || (p && !p.hidden && inView(p)); }""",
            arg=f"#view-{view} .headline",
        )
        peek = pg.locator("#peek")
        if peek.is_visible():
            first_words = headline.inner_text().strip()[:40]
            assert peek.inner_text().startswith(first_words)
            peek.click()
            pg.wait_for_function(
                "h => { const b = document.querySelector(h + ' strong').getBoundingClientRect(); "
                "return b.top >= 0 && b.bottom <= innerHeight; }",
                arg=f"#view-{view} .headline",
            )
    finally:
        context.close()


def test_keyboard_works_tabs_tiers_ruler_rows_and_sort_headers(page: Any) -> None:
    def focused(attr: str) -> str | None:
        return page.evaluate(f"() => document.activeElement?.getAttribute('{attr}')")

    page.goto(f"{page.base}/#strategies")
    page.wait_for_selector("#st-tabs button[data-key='tp'].active")
    page.focus("#st-tabs button[data-key='pp']")
    page.keyboard.press("Enter")
    page.wait_for_selector("#st-tabs button[data-key='pp'].active")
    assert focused("data-key") == "pp"
    page.keyboard.press("ArrowRight")  # a roving tabindex: arrows move between tabs, Tab leaves the list
    page.wait_for_selector("#st-tabs button[data-key='cp'].active")
    assert focused("data-key") == "cp"

    page.goto(f"{page.base}/#tiers")
    page.wait_for_selector("button[data-tier='specific']")
    page.focus("button[data-tier='specific']")
    page.keyboard.press("Space")
    page.wait_for_selector("[data-tier-body='specific']")
    assert focused("data-tier") == "specific"
    page.keyboard.press("Enter")
    page.wait_for_selector("[data-tier-body='specific']", state="detached")
    assert focused("data-tier") == "specific"

    page.goto(f"{page.base}/#recipes")
    page.wait_for_selector("#rc-ruler g.ruler-row")
    page.focus("#rc-ruler g.ruler-row[data-recipe='deepseek-v3']")
    page.keyboard.press("Enter")
    page.wait_for_selector("#rc-gpus[data-gpus='2048']")
    assert focused("data-recipe") == "deepseek-v3"
    page.focus("#rc-tabs button[data-key='llama3-405b-8k']")
    page.keyboard.press("Space")
    page.wait_for_selector("#rc-tabs button[data-key='llama3-405b-8k'].active")
    assert focused("data-key") == "llama3-405b-8k"

    page.goto(f"{page.base}/#planner")
    page.wait_for_selector("#pl-table tbody tr")
    page.focus("#pl-table th[data-sort='mem']")
    page.keyboard.press("Enter")
    page.wait_for_selector("#pl-table th[data-sort='mem'][aria-sort='ascending']")
    assert focused("data-sort") == "mem"
    page.keyboard.press("Space")
    page.wait_for_selector("#pl-table th[data-sort='mem'][aria-sort='descending']")
    assert focused("data-sort") == "mem"


CONTRAST = """() => {
  const lum = (c) => { const v = c.match(/\\d+(\\.\\d+)?/g).slice(0, 3).map(Number).map(x => x / 255)
    .map(x => x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4);
    return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
  const out = [];
  for (const t of document.querySelectorAll('section.view:not([hidden]) svg text.on-color')) {
    const b = t.getBoundingClientRect();
    if (!b.width) continue;
    const under = document.elementsFromPoint(b.x + b.width / 2, b.y + b.height / 2).find(e => e.tagName === 'rect');
    if (!under) continue;
    const [a, c] = [lum(getComputedStyle(t).fill), lum(getComputedStyle(under).fill)];
    const ratio = (Math.max(a, c) + 0.05) / (Math.min(a, c) + 0.05);
    if (ratio < 4.5) out.push([t.textContent, getComputedStyle(under).fill, ratio.toFixed(2)]);
  }
  return out;
}"""


def test_text_on_colored_fills_has_contrast(page: Any) -> None:
    for view, ready, clicks in (
        ("strategies", "#st-work svg", ["#st-tabs button[data-key='dp']", "#st-tabs button[data-key='pp']"]),
        ("recipes", "#rc-ruler svg", []),
    ):
        page.goto(f"{page.base}/#{view}")
        page.wait_for_selector(ready)
        for sel in [None, *clicks]:
            if sel:
                page.click(sel)
                page.wait_for_selector(f"{sel}.active")
            low = page.evaluate(CONTRAST)
            assert not low, f"text under 4.5:1 on a fill in {view}: {low}"


@pytest.mark.parametrize("view", [v for v in READY if v != "home"])
def test_tab_walks_the_view_without_a_trap(page: Any, view: str) -> None:
    page.goto(f"{page.base}/#{view}")
    page.wait_for_selector(f"#view-{view} {READY[view]}")
    seen: list[str] = []
    for _ in range(40):
        page.keyboard.press("Tab")
        info = page.evaluate(
            """() => { const e = document.activeElement; const b = e.getBoundingClientRect();
              return [e === document.body ? 'body' : (e.id || e.getAttribute('name') || e.dataset.key || e.dataset.sort
                || e.dataset.tier || e.dataset.recipe || e.dataset.term
                || e.tagName + ':' + e.textContent.slice(0, 20)),
                b.width > 0 && b.height > 0]; }"""
        )
        assert info[1] or info[0] == "body", f"focus on something invisible in {view}: {info[0]}"
        seen.append(info[0])
    assert len(set(seen)) >= 12, f"the Tab key visits only {sorted(set(seen))} in {view}"
