"""The HTTP API under generated requests (schemathesis over /openapi.json, seeded): never a 500.

Every operation of the schema is called with inputs schemathesis derives from it, valid and invalid alike;
the answer must never be a server error (a 500 is a bug, whatever the input). The searches (/api/plan and
/api/recipe/{name}) are left out: each takes up to seconds, and their inputs are checked by the same parsers.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # a few seconds of CPU at the default budget; runs by default and in CI
schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install -e '.[test]')")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402

from meshplan.server.app import create_app  # noqa: E402


def on_loopback(app: Any) -> Any:
    """``app`` reached as 127.0.0.1: the test client names its host "testserver", which the server refuses."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = [(k, v) for k, v in scope["headers"] if k != b"host"] + [(b"host", b"127.0.0.1")]
            scope = {**scope, "headers": headers}
        await app(scope, receive, send)

    return wrapped


schema = schemathesis.openapi.from_asgi("/openapi.json", on_loopback(create_app())).exclude(
    path_regex=r"^/api/(plan|recipe/)"
)
# schemathesis's coverage phase calls every boundary case the schema defines, whatever the budget (over 10,000
# requests, most of this file's CPU): it runs with the thorough profile; the default run keeps the examples and the
# fuzzing phases at the profile's budget.
schema.config.phases.coverage.enabled = os.environ.get("MESHPLAN_HYPOTHESIS_PROFILE") == "meshplan-thorough"


@schema.parametrize()
@settings(  # per operation: the profile's budget (20 by default, 100 thorough: tests/conftest.py)
    max_examples=settings.default.max_examples,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=[not_a_server_error])
