"""The training stack and the run conditions in the explorer (headless Chromium): the memory view bills each stage
as `meshplan memory --stack ...` does, keeps the stack and the conditions in its address, and copies a command that
prints the same bill; the planner sends them too. Skipped when playwright or chromium is missing.
"""

from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the web explorer needs the [web] extra: pip install 'meshplan[web]'")
pytest.importorskip("playwright.sync_api", reason="end-to-end tests need: pip install playwright")


def open_view(pg: Any, view: str) -> None:
    pg.goto(f"{pg.base}/#{view}")
    pg.wait_for_selector("body[data-ready]")


def cli_json(args: list[str]) -> Any:
    from meshplan.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(args) in (0, None)
    return json.loads(out.getvalue())


def wait_number(pg: Any, selector: str, value: float) -> None:
    pg.wait_for_function(
        "([sel, v]) => { const e = document.querySelector(sel); return !!e && Number(e.dataset.bytes) === v; }",
        arg=[selector, value],
    )


def test_the_catalog_lists_the_stacks_and_the_conditions_with_their_choices(client: Any) -> None:
    from meshplan import io as mio
    from meshplan.spec.requests import Group, group

    catalog = client.get("/api/catalog").json()
    assert [s["name"] for s in catalog["stacks"]] == mio.list_stacks()
    assert all(s["description"] for s in catalog["stacks"])
    by_name = {c["name"]: c for c in catalog["conditions"]}
    for f in group(Group.CONDITIONS):
        assert by_name[f.key]["choices"] == list(f.choices)
        assert (by_name[f.key]["lo"], by_name[f.key]["hi"]) == (f.lo, f.hi)


def test_a_stack_bills_each_stage_as_the_cli_and_survives_a_reload(page: Any, browser: Any, shot: Any) -> None:
    open_view(page, "memory")
    page.wait_for_selector("#mem-chart svg")
    for name, value in {"gpus": "16", "tp": "2", "pp": "2"}.items():
        page.fill(f"#mem-form input[name={name}]", value)
    page.select_option("#mem-form select[name=zero]", "3")
    page.select_option("#mem-form select[name=stack]", "torchtitan")
    page.click("#mem-form summary:has-text('Run conditions')")
    page.select_option("#mem-form select[name=loss]", "fused")
    args = "memory llama-3.1-70b --gpu h100-sxm --gpus 16 --tp 2 --pp 2 --zero 3 --stack torchtitan --loss fused --json"
    cli = cli_json(args.split())
    assert cli["stack"] == "torchtitan" and cli["conditions"]["loss"]["source"] == "flag"
    wait_number(page, "#mem-training-total", cli["per_gpu"]["total_bytes"])
    for i in sorted({0, cli["heaviest_stage"], len(cli["stages"]) - 1}):
        wait_number(page, f"#mem-headline .stage-total[data-stage='{i}']", cli["stages"][i]["total_bytes"])
    # the report's conditions, each with where its value came from
    page.wait_for_selector("#mem-conditions [data-condition='loss'][data-source='flag']", state="attached")
    assert page.get_attribute("#mem-conditions [data-condition='loss_parallel']", "data-source") == "stack"
    # the stack, where it came from and what differs from it: what the CLI's report says
    assert cli["stack_source"] == "flag" and cli["differs_from_stack"] == ["loss"]
    summary = page.inner_text("#mem-stack")
    assert "stack torchtitan (as asked); differs from it: loss=fused" in summary
    page.click("#mem-conditions summary")
    shot(page, "memory-conditions")

    # the address holds the stack and the condition: a shared link restores both, and the same bill
    page.wait_for_function("() => location.hash.includes('stack=torchtitan') && location.hash.includes('loss=fused')")
    other = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    other.base = page.base
    other.goto(page.url)
    other.wait_for_selector("body[data-ready]")
    assert other.input_value("#mem-form select[name=stack]") == "torchtitan"
    assert other.input_value("#mem-form select[name=loss]") == "fused"
    wait_number(other, "#mem-training-total", cli["per_gpu"]["total_bytes"])
    other.context.close()

    # the copied command, run as the CLI, prints the same bill
    page.wait_for_function("() => document.querySelector('#mem-command')?.textContent.includes('--stack torchtitan')")
    command = page.inner_text("#mem-command")
    assert "--loss fused" in command and "--precision" not in command
    again = cli_json(shlex.split(command)[1:])
    assert again["per_gpu"]["total_bytes"] == cli["per_gpu"]["total_bytes"]

    # a condition out of the schema's bounds is refused in the page's words, and the bill comes back when fixed
    page.fill("#mem-form input[name=runtime_reserve]", "-1")
    page.wait_for_selector("#mem-error:not([hidden])")
    assert page.inner_text("#mem-error").startswith("The engine refused this input. Runtime reserve (bytes):")
    page.fill("#mem-form input[name=runtime_reserve]", "2e9")
    page.wait_for_selector("#mem-error", state="hidden")
    page.wait_for_selector("#mem-conditions [data-condition='runtime_reserve'][data-source='flag']", state="attached")


def test_the_planner_sends_the_stack_and_keeps_it_in_the_address_and_command(page: Any) -> None:
    open_view(page, "planner")
    page.wait_for_selector("#pl-command")
    page.select_option("#pl-form select[name=stack]", "megatron-core")
    page.click("#pl-form summary:has-text('Run conditions')")
    page.select_option("#pl-form select[name=grad_sync]", "off")
    page.select_option("#pl-form select[name=overlap_tp]", "on")
    page.fill("#pl-form input[name=scale_out_bandwidth]", "25e9")
    page.fill("#pl-form input[name=profile]", "compute_scale=0.9,comm_scale=1.1")
    page.click("#pl-run")
    page.wait_for_function(
        "() => /--stack megatron-core.*--grad-sync off/.test(document.querySelector('#pl-command')?.textContent)"
    )
    command = page.inner_text("#pl-command")
    assert "--overlap-tp on" in command and "--scale-out-bandwidth 25e9" in command and "--profile" in command
    assert "stack=megatron-core" in page.url and "grad_sync=off" in page.url and "scale_out_bandwidth=25e9" in page.url
    page.wait_for_selector("#pl-results[aria-busy='false']:not([data-stale])")
    with page.expect_download() as got:
        page.click("#pl-json")
    shown = json.loads(Path(got.value.path()).read_text())
    assert shown["stack"] == "megatron-core" and shown["conditions"]["grad_sync"] == {"value": "off", "source": "flag"}
    stack_text = page.inner_text("#pl-stack")  # the summary names the stack the plans were scored under
    assert "stack megatron-core (as asked)" in stack_text
    assert all(f"{name}=" in stack_text for name in shown["differs_from_stack"])
    # the copied command, run as the CLI, finds the same best plan
    cli = cli_json(shlex.split(page.inner_text("#pl-command"))[1:])
    assert cli["plans"][0]["layout"] == shown["plans"][0]["layout"]
    assert cli["plans"][0]["free_bytes_per_gpu"] == shown["plans"][0]["free_bytes_per_gpu"]


def test_expert_tp_folds_the_experts_as_the_cli_and_the_copied_command_says_so(page: Any) -> None:
    open_view(page, "memory")
    page.wait_for_selector("#mem-chart svg")
    page.select_option("#mem-form select[name=model]", "mixtral-8x7b")
    for name, value in {"gpus": "16", "tp": "4", "ep": "4"}.items():
        page.fill(f"#mem-form input[name={name}]", value)
    page.check("#mem-form input[name=sp]")
    page.select_option("#mem-form select[name=zero]", "1")
    page.click("#mem-form summary:has-text('expert TP')")
    page.fill("#mem-form input[name=expert_tp]", "1")
    args = "memory mixtral-8x7b --gpu h100-sxm --gpus 16 --tp 4 --sp --ep 4 --expert-tp 1 --zero 1 --json"
    cli = cli_json(args.split())
    folded = cli_json(args.replace(" --expert-tp 1", "").split())
    assert cli["per_gpu"]["total_bytes"] != folded["per_gpu"]["total_bytes"]  # the field changes the bill
    wait_number(page, "#mem-training-total", cli["per_gpu"]["total_bytes"])
    page.wait_for_function("() => document.querySelector('#mem-command')?.textContent.includes('--expert-tp 1')")
    page.wait_for_function("() => location.hash.includes('expert_tp=1')")
    again = cli_json(shlex.split(page.inner_text("#mem-command"))[1:])
    assert again["per_gpu"]["total_bytes"] == cli["per_gpu"]["total_bytes"]
