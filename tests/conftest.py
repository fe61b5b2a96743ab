"""Shared test settings: the package on sys.path, and a small deterministic hypothesis profile."""

import copy
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Running plain `pytest` from a checkout without an installed package still imports this tree.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

# The default run's budget: each property test (and the API fuzz, and the CLI fuzz, as multiples of it) tries a
# fixed, derandomized set of examples. `pytest --hypothesis-profile meshplan-thorough` (or the environment's
# MESHPLAN_HYPOTHESIS_PROFILE) runs five times as many, as the suite did before its CPU time was cut.
settings.register_profile(
    "meshplan",
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("meshplan-thorough", settings.get_profile("meshplan"), max_examples=100)
settings.load_profile(os.environ.get("MESHPLAN_HYPOTHESIS_PROFILE", "meshplan"))


@pytest.fixture(scope="session")
def validation_report() -> dict:
    """`meshplan validate` over every source, computed once a session (about 9 s of CPU): the golden
    targets read it, and the CLI's table test renders it."""
    from meshplan.validation.training import validate

    return validate()


@pytest.fixture(scope="session")
def serving_validation_report() -> dict:
    """`meshplan validate --serving`, computed once a session (about 8 s of CPU): its bounds, the CLI's JSON and
    table, and the pinned JSON read it."""
    from meshplan.validation.serving import validate_serving

    return validate_serving()


@pytest.fixture(scope="session")
def memory_validation_report() -> dict:
    """`meshplan validate --memory`, computed once a session: its bounds and the pinned JSON read it."""
    from meshplan.validation.memory import validate_memory

    return validate_memory()


@pytest.fixture
def shared_validation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``use(kind)``: the CLI's ``validate`` (kind "training"), ``validate --serving`` or ``--memory`` answers with
    the session's report (a copy) instead of computing it again; each still checks the CLI asked for exactly the
    report the fixture computed (every source, no profile)."""

    def use(kind: str) -> None:
        import meshplan.validation.memory
        import meshplan.validation.serving
        import meshplan.validation.training

        if kind == "training":
            report = request.getfixturevalue("validation_report")

            def training(source: str | None = None, profile: str | None = None) -> dict:
                assert (source, profile) == (None, None), (source, profile)
                return copy.deepcopy(report)

            monkeypatch.setattr(meshplan.validation.training, "validate", training)
        elif kind == "serving":
            served = request.getfixturevalue("serving_validation_report")
            monkeypatch.setattr(meshplan.validation.serving, "validate_serving", lambda: copy.deepcopy(served))
        else:
            memory = request.getfixturevalue("memory_validation_report")
            monkeypatch.setattr(meshplan.validation.memory, "validate_memory", lambda: copy.deepcopy(memory))

    return use


@pytest.fixture(scope="session")
def ranked_recipe() -> Callable[[str], dict]:
    """``ranked_recipe(name)``: ``recipe_report(name)`` with its ranking search, computed once a session (the
    DeepSeek-V3 recipe's search is about 10 s on 2 cores); each caller gets its own copy."""
    from meshplan.reports.recipes import recipe_report

    done: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in done:
            done[name] = recipe_report(name)
        return copy.deepcopy(done[name])

    return get
