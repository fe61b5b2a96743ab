"""The last lines of ``meshplan validate``'s table say which checks and which generalization goals hold."""

from meshplan.cli.tables_validation import validate_table


def _result(goals: list[bool]) -> dict:
    return {
        "runs": [],
        "sources": [],
        "all_ok": True,
        "goals": [{"check": f"goal {i}", "value": 1.0, "bound": 0.5, "ok": ok} for i, ok in enumerate(goals)],
    }


def test_missed_goals_are_counted_on_the_last_line() -> None:
    text = validate_table(_result([True, False, False]))
    assert text.splitlines()[-2:] == [
        "every per-source check holds",
        "2 of 3 generalization goals not met (listed above)",
    ]


def test_all_goals_met_is_said_only_when_every_goal_holds() -> None:
    assert validate_table(_result([True, True])).splitlines()[-1] == "all 2 generalization goals met"
