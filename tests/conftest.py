"""Shared test settings: the package on sys.path, and a small deterministic hypothesis profile."""

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Running plain `pytest` from a checkout without an installed package still imports this tree.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

settings.register_profile(
    "meshplan",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("meshplan")


@pytest.fixture(scope="session")
def validation_report() -> dict:
    """`meshplan validate` over every source, computed once a session (about a minute on 2 cores): the golden
    targets read it, and the CLI's table test renders it."""
    from meshplan.validation.training import validate

    return validate()
