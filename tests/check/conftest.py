"""One real gloo run of every harness layout that fits, at world sizes 2 and 4, shared by the check tests that
hold closed forms against it (test_measure.py) and by those that hold meshplan's report against it
(test_predict.py): each launch takes most of a minute on two cores."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def harness_runs() -> dict[int, list[Any]]:
    pytest.importorskip("torch", reason="meshplan check needs torch (pip install torch==2.13.0)")
    from meshplan.check.runner import run_check

    return {n: run_check(n) for n in (2, 4)}
