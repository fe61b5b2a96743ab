"""The explorer's address and take-aways in headless Chromium: every input of a view lives in the URL (a reload and
a shared link restore it), and every bill and plan gives its `meshplan` command, its JSON and an engine's
configuration. Skipped when playwright or chromium is missing, as the other browser tests.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the web explorer needs the [web] extra: pip install 'meshplan[web]'")
pytest.importorskip("playwright.sync_api", reason="end-to-end tests need: pip install playwright")


def open_view(pg: Any, view: str) -> None:
    pg.goto(f"{pg.base}/#{view}")
    pg.wait_for_selector("body[data-ready]")


def values(pg: Any, form: str) -> dict[str, Any]:
    return pg.eval_on_selector(
        form,
        """f => Object.fromEntries(Array.from(f.elements).filter(e => e.name && e.type !== 'file')
            .map(e => [e.name, e.type === 'checkbox' ? e.checked : e.value]))""",
    )


def reopened(pg: Any, browser: Any) -> Any:
    """The same address in a fresh page of a fresh context: what a shared link shows."""
    other = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    other.base = pg.base
    other.goto(pg.url)
    other.wait_for_selector("body[data-ready]")
    return other


def test_memory_inputs_survive_a_reload_and_a_shared_link(page: Any, browser: Any) -> None:
    open_view(page, "memory")
    page.wait_for_selector("#mem-chart svg")
    for name, value in {"gpus": "32", "tp": "4", "pp": "2", "seq": "8192", "micro_batch": "2"}.items():
        page.fill(f"#mem-form input[name={name}]", value)
    page.check("#mem-form input[name=sp]")
    page.select_option("#mem-form select[name=zero]", "3")
    page.select_option("#mem-form select[name=model]", "mixtral-8x7b")
    page.select_option("#mem-form select[name=kv_dtype]", "fp8")
    page.wait_for_function("() => location.hash.includes('kv_dtype=fp8')")
    want = values(page, "#mem-form")
    page.wait_for_selector("#mem-results:not([data-stale])")
    total = page.get_attribute("#mem-training-total", "data-bytes")
    page.reload()
    page.wait_for_selector("#mem-chart svg")
    assert values(page, "#mem-form") == want
    page.wait_for_function("t => document.querySelector('#mem-training-total')?.dataset.bytes === t", arg=total)
    other = reopened(page, browser)
    try:
        other.wait_for_function("t => document.querySelector('#mem-training-total')?.dataset.bytes === t", arg=total)
        assert values(other, "#mem-form") == want
    finally:
        other.context.close()


def test_every_view_restores_its_inputs_and_choices(page: Any) -> None:
    open_view(page, "weights")
    page.fill("#w-form input[name=gpus]", "4")
    page.select_option("#w-form select[name=dtype]", "fp8")
    want = values(page, "#w-form")
    page.wait_for_function("() => location.hash.includes('dtype=fp8')")
    page.reload()
    page.wait_for_selector("#w-chart svg")
    assert values(page, "#w-form") == want

    open_view(page, "strategies")
    page.wait_for_selector("#st-tabs button[data-key='tp'].active")
    page.fill("#st-form input[name=seq]", "8192")
    page.click("#st-tabs button[data-key='pp']")
    page.reload()
    page.wait_for_selector("#st-tabs button[data-key='pp'].active")
    assert page.input_value("#st-form input[name=seq]") == "8192"

    open_view(page, "tp")
    page.wait_for_selector("#tp-matches.ok")
    page.select_option("#tp-form select[name=ranks]", "8")
    page.fill("#race-form input[name=group]", "4")
    page.click("#tp-next")
    page.click("#tp-next")
    page.reload()
    page.wait_for_selector("#tp-step-label[data-step='2']")
    assert page.input_value("#tp-form select[name=ranks]") == "8"
    assert page.input_value("#race-form input[name=group]") == "4"

    open_view(page, "recipes")
    page.click("#rc-tabs button[data-key='deepseek-v3']")
    page.wait_for_selector("#rc-gpus[data-gpus='2048']")
    page.reload()
    page.wait_for_selector("#rc-tabs button[data-key='deepseek-v3'].active")
    page.wait_for_selector("#rc-gpus[data-gpus='2048']")

    open_view(page, "tiers")
    page.click("button[data-tier='specific']")
    page.reload()
    page.wait_for_selector("[data-tier-body='specific']")

    open_view(page, "planner")
    page.wait_for_selector("#pl-table tbody tr")
    page.fill("#pl-form input[name=gpus]", "32")
    page.select_option("#pl-form select[name=objective]", "tokens-per-gpu")
    page.click("#pl-run")
    page.wait_for_selector("#pl-results[aria-busy='false']:not([data-stale])")
    page.click("#pl-table th[data-sort='mem']")
    want = values(page, "#pl-form")
    page.reload()
    page.wait_for_selector("#pl-table th[data-sort='mem'].sorted.up")
    assert values(page, "#pl-form") == want


def test_a_bill_and_a_plan_give_their_command_json_and_exports(page: Any, tmp_path: Path) -> None:
    from meshplan.cli import main

    open_view(page, "memory")
    page.fill("#mem-form input[name=gpus]", "16")
    page.fill("#mem-form input[name=tp]", "2")
    page.fill("#mem-form input[name=pp]", "2")
    page.wait_for_function("() => document.querySelector('#mem-command')?.textContent.includes('--pp 2')")
    command = page.inner_text("#mem-command")
    assert command.startswith("meshplan memory llama-3.1-70b --gpu h100-sxm --gpus 16 --tp 2 --pp 2")
    with page.expect_download() as got:
        page.click("#mem-json")
    saved = json.loads(Path(got.value.path()).read_text())
    total = float(page.get_attribute("#mem-training-total", "data-bytes") or "nan")
    assert saved["per_gpu"]["total_bytes"] == total and saved["layout"]["tp"] == 2

    # the command, run as the CLI, prints the same bill
    import contextlib
    import io
    import shlex

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(shlex.split(command)[1:])
    assert json.loads(out.getvalue())["per_gpu"]["total_bytes"] == total

    page.select_option("#mem-engine", "megatron")
    assert "over by" in page.inner_text("#mem-fits")  # 70B at TP 2 x PP 2 on 16 GPUs: exported only when forced
    page.click("#mem-export")
    with page.expect_download() as got:
        page.click("#mem-force")
    megatron = json.loads(Path(got.value.path()).read_text())
    assert megatron["engine"] == "megatron" and megatron["files"] and megatron["command"]
    page.select_option("#mem-engine", "vllm")
    with page.expect_download() as got:
        page.click("#mem-export")
    assert json.loads(Path(got.value.path()).read_text())["engine"] == "vllm"

    open_view(page, "planner")
    page.wait_for_selector("#pl-command")
    assert page.inner_text("#pl-command").startswith("meshplan plan llama-3.1-70b --gpu h200 --gpus 64")
    with page.expect_download() as got:
        page.click("#pl-json")
    plan = json.loads(Path(got.value.path()).read_text())
    assert plan["plans"] and plan["gpus"] == 64
    page.select_option("#pl-engine", "torchtitan")
    page.click("#pl-export")
    done = "() => /^(Saved|torchtitan cannot take this layout)/.test(document.querySelector('#pl-status').textContent)"
    page.wait_for_function(done)  # a saved file, or the engine's reason (torchtitan has no ZeRO-1)


def test_leaving_a_typed_field_asks_nothing_and_keeps_the_export_status(page: Any) -> None:
    # A typed field fires "change" when a click elsewhere takes the focus: that event changes no value, so it must
    # not ask for the bill again (a redraw arriving after the export's answer cleared its status and its button).
    open_view(page, "memory")
    page.fill("#mem-form input[name=gpus]", "16")
    page.fill("#mem-form input[name=tp]", "2")
    page.fill("#mem-form input[name=pp]", "2")  # the focus stays in pp: its "change" comes with the next click
    page.wait_for_function("() => document.querySelector('#mem-command')?.textContent.includes('--pp 2')")
    page.wait_for_selector("#mem-results[aria-busy='false']")
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/api/memory" in r.url else None)
    page.select_option("#mem-engine", "megatron")
    page.click("#mem-export")
    page.wait_for_selector("#mem-force")
    page.wait_for_timeout(300)  # several frames: a redraw would have been asked by now
    assert asked == [] and page.is_visible("#mem-force")
    page.fill("#mem-form input[name=pp]", "4")  # a real change still asks
    page.wait_for_function("() => document.querySelector('#mem-command')?.textContent.includes('--pp 4')")
    assert len(asked) == 1


def test_the_selected_strategy_gives_the_cli_command_of_its_bill(page: Any) -> None:
    import contextlib
    import io
    import shlex

    from meshplan.cli import main

    page.goto(f"{page.base}/#strategies?strategy=zero")
    page.wait_for_selector("body[data-ready]")
    page.wait_for_selector("#st-command")
    command = page.inner_text("#st-command")
    assert command.startswith("meshplan memory llama-3.1-70b --gpu h100-sxm --gpus 8 --zero 3")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(shlex.split(command)[1:])
    bill = json.loads(out.getvalue())
    worst = max(
        float(b) for b in page.eval_on_selector_all("#st-gpus .gpu-bytes", "es => es.map(e => e.dataset.bytes)")
    )
    assert bill["per_gpu"]["total_bytes"] == worst


def test_a_link_naming_a_strategy_keeps_the_inputs(page: Any) -> None:
    open_view(page, "strategies")
    page.wait_for_selector("#st-tabs button[data-key='tp'].active")
    page.select_option("#st-form select[name=model]", "mixtral-8x7b")
    page.wait_for_function("() => location.hash.includes('model=mixtral-8x7b')")
    page.goto(f"{page.base}/#tiers")
    page.click("button[data-tier='specific']")
    page.click("[data-tier-body='specific'] a[href='#strategies?ep']")
    page.wait_for_selector("#st-tabs button[data-key='ep'].active")
    assert page.input_value("#st-form select[name=model]") == "mixtral-8x7b"
    page.wait_for_function("() => location.hash.includes('strategy=ep') && location.hash.includes('model=mixtral')")


def test_a_slow_answer_dims_and_labels_the_old_numbers(page: Any) -> None:
    open_view(page, "weights")
    page.wait_for_selector("#w-results[aria-busy='false']")
    held: list[Any] = []  # the request is held until the old numbers have been checked

    def hold(route: Any) -> None:
        held.append(route)

    page.route("**/api/fit?*", hold)
    page.fill("#w-form input[name=gpus]", "2")
    page.wait_for_selector("#w-results[aria-busy='true'][data-stale='busy']")
    assert page.evaluate("() => getComputedStyle(document.querySelector('#w-summary')).opacity") == "0.35"
    label = page.evaluate("() => getComputedStyle(document.querySelector('#w-results'), '::before').content")
    assert "previous inputs" in label
    page.unroute("**/api/fit?*", hold)
    for route in held:
        with contextlib.suppress(Exception):  # a request the page aborted for a newer one is handled already
            route.continue_()
    page.wait_for_selector("#w-results[aria-busy='false']:not([data-stale])", timeout=10_000)


def test_the_planner_keeps_layouts_an_engine_runs_and_exports_them(page: Any) -> None:
    page.goto(f"{page.base}/#planner?engine=torchtitan&pin_tp=8")
    page.wait_for_selector("body[data-ready]")
    page.wait_for_selector("#pl-results[aria-busy='false']:not([data-stale]) #pl-table tbody tr")
    layouts = page.eval_on_selector_all("#pl-table td[data-col='layout']", "t => t.map(e => e.textContent)")
    assert layouts and all(text.startswith("TP 8") for text in layouts)
    command = page.inner_text("#pl-command")
    assert "--engine torchtitan --tp 8" in command
    page.select_option("#pl-engine", "torchtitan")
    with page.expect_download() as got:
        page.click("#pl-export")
    export = json.loads(Path(got.value.path()).read_text())
    assert export["engine"] == "torchtitan" and export["files"]


def test_the_serving_view_keeps_its_inputs_and_gives_its_command(page: Any) -> None:
    page.goto(f"{page.base}/#serving?gpus=4&output_len=128")
    page.wait_for_selector("body[data-ready]")
    page.wait_for_selector("#sv-command")
    assert page.input_value("#sv-form input[name=gpus]") == "4"
    command, shown, cli = _shown_and_run(page, "sv")
    assert "--gpus 4" in command and "--output-len 128" in command and "--engine trtllm" in command
    assert cli["best"] == shown["best"]
    # the form states its engine: the command says so, and its band is the page's (no unstated engine's widening)
    assert cli["uncertainty"] == shown["uncertainty"] and cli["engine_source"] == shown["engine_source"] == "flag"
    # the best serving plan as a server's configuration, from the same export code as `meshplan export vllm`
    page.select_option("#sv-engine", "vllm")
    with page.expect_download() as got:
        page.click("#sv-export")
    export = json.loads(Path(got.value.path()).read_text())
    layout = shown["best"]["layout"]
    assert export["engine"] == "vllm" and f"--tensor-parallel-size {layout['tp']}" in export["command"]


def test_the_serving_view_plans_kernels_launched_op_by_op_as_the_cli_does(page: Any) -> None:
    """Kernels op by op: the command carries --launch eager and gives the page's plan, the step bar sums to the
    step, and the vLLM export of that plan launches with --enforce-eager."""
    page.goto(f"{page.base}/#serving?model=llama-3.1-8b&gpus=2&output_len=128&engine=vllm")
    page.wait_for_selector("body[data-ready]")
    page.wait_for_selector("#sv-command")
    page.select_option("#sv-form select[name=launch]", "eager")
    page.wait_for_function("() => document.querySelector('#sv-command')?.textContent.includes('--launch eager')")
    page.wait_for_selector("#sv-results[aria-busy='false']")
    page.wait_for_selector("#sv-steps #sv-step")
    _, shown, cli = _shown_and_run(page, "sv")
    assert cli["launch"] == shown["launch"] == "eager" and cli["best"] == shown["best"]
    parts = [float(v) for v in page.eval_on_selector_all("#sv-steps rect.phase", "rs => rs.map(r => r.dataset.value)")]
    assert sum(parts) == pytest.approx(float(page.get_attribute("#sv-step", "data-value") or "nan"), rel=1e-9)
    page.select_option("#sv-engine", "vllm")
    with page.expect_download() as got:
        page.click("#sv-export")
    assert "--enforce-eager" in json.loads(Path(got.value.path()).read_text())["command"]


def test_the_serving_view_admits_as_tensorrt_llms_capacity_scheduler_says(page: Any) -> None:
    """KV admission as it grows: the command carries --capacity-scheduler max-utilization and gives the page's
    plan, and the TensorRT-LLM export of that plan writes the policy to its LLM-API YAML."""
    page.goto(f"{page.base}/#serving?model=llama-3.1-8b&gpus=2&output_len=128&engine=trtllm")
    page.wait_for_selector("body[data-ready]")
    page.wait_for_selector("#sv-command")
    page.select_option("#sv-form select[name=capacity_scheduler]", "max-utilization")
    page.wait_for_function(
        "() => document.querySelector('#sv-command')?.textContent.includes('--capacity-scheduler max-utilization')"
    )
    page.wait_for_selector("#sv-results[aria-busy='false']")
    _, shown, cli = _shown_and_run(page, "sv")
    assert cli["capacity_scheduler"] == shown["capacity_scheduler"] == "max-utilization"
    assert cli["best"] == shown["best"]
    page.select_option("#sv-engine", "trtllm")
    with page.expect_download() as got:
        page.click("#sv-export")
    assert "capacity_scheduler_policy: MAX_UTILIZATION" in Path(got.value.path()).read_text()


def test_the_serving_view_reads_a_serving_launcher(page: Any, tmp_path: Path) -> None:
    """A trtllm-bench line opened in the serving view sets its fleet, engine and admission as --from reads them (the
    command then carries them); a training config is refused in one line, pointing at the Layout view."""
    page.goto(f"{page.base}/#serving?model=llama-3.1-8b&gpus=8&output_len=128")
    page.wait_for_selector("body[data-ready]")
    page.wait_for_selector("#sv-command")
    bench = tmp_path / "bench.sh"
    line = "trtllm-bench --model meta-llama/Llama-3.1-8B throughput --tp 2 --scheduler_policy max_utilization"
    bench.write_text(line + "\n")
    page.set_input_files("#sv-config", str(bench))
    page.wait_for_function(
        "() => document.querySelector('#sv-command')?.textContent.includes('--capacity-scheduler max-utilization')"
    )
    command = page.inner_text("#sv-command")
    assert "--gpus 2 " in command and "--engine trtllm" in command and "llama-3.1-8b" in command
    assert "bench.sh (trtllm)" in page.inner_text("#sv-config-note")
    toml = tmp_path / "train.toml"
    toml.write_text("[training]\nseq_len = 4096\n")
    page.set_input_files("#sv-config", str(toml))
    page.wait_for_function("() => document.querySelector('#sv-error').textContent.includes('the Layout view plans it')")
    assert "\n" not in page.inner_text("#sv-error").strip()


def _shown_and_run(page: Any, bar: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The bar's command, the answer the page downloads, and what that command prints when the CLI runs it."""
    import shlex

    from meshplan.cli import main

    command = page.inner_text(f"#{bar}-command")
    with page.expect_download() as got:
        page.click(f"#{bar}-json")
    shown = json.loads(Path(got.value.path()).read_text())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(shlex.split(command)[1:])
    return command, shown, json.loads(out.getvalue())
