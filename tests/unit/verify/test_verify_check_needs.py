"""checks.NEEDS: which fact kinds and views a check's violations are made of, and the
checks query leaving out those whose needs the job has no rows of."""

from __future__ import annotations

import re
from typing import Any

from trio_broker.verify import checks
from trio_broker.verify.checks import (
    CHECKS,
    MATERIALIZED,
    NEEDS,
    VIEWS,
    all_checks_sql,
    checks_to_run,
    sql,
)
from trio_broker.verify.compact import KINDS


def test_every_check_states_its_needs() -> None:
    assert set(NEEDS) == set(CHECKS)


def test_each_need_is_a_kind_or_a_view_the_check_reads() -> None:
    for name, needs in NEEDS.items():
        text = CHECKS[name][1]
        for need in needs:
            assert need in KINDS or need in MATERIALIZED, (name, need)
            # A kind is read as its {placeholder}, a view by its name.
            pattern = rf"\{{{need}\}}" if need in KINDS else rf"\b{need}\b"
            assert re.search(pattern, text), (name, need)


def test_checks_whose_needs_are_missing_are_left_out() -> None:
    assert checks_to_run(None) == list(CHECKS)
    everything = set(KINDS) | set(MATERIALIZED)
    assert checks_to_run(everything) == list(CHECKS)
    # No group traffic and no transactions (bench/verify.py's plain capture).
    plain = everything - {"offset_fetch_request", "sync_assign", "txn_batches", "rc_batches"}
    left_out = set(CHECKS) - set(checks_to_run(plain))
    assert left_out == {
        "offset_fetch_current",
        "group_assignment_exclusive",
        "read_committed_no_aborted",
        "committed_transaction_atomic",
    }
    query = all_checks_sql(plain)
    for name in CHECKS:
        assert (f"'{name}' AS check_name" in query) == (name not in left_out)


def test_a_query_with_every_check_left_out_selects_nothing(monkeypatch: Any) -> None:
    assert checks_to_run(set()) == ["one_leader_per_epoch"]
    monkeypatch.setattr(checks, "NEEDS", {name: ("fetch_batch",) for name in CHECKS})
    assert checks_to_run(set()) == []
    query = all_checks_sql(set())
    assert "WHERE false" in query
    assert all(f"'{name}'" not in query for name in CHECKS)


def test_gates_say_whether_the_job_holds_a_kind_or_view() -> None:
    text = "SELECT * FROM t WHERE kind = {topic_id} AND {has_topic_id} AND {has_txn_batches}"
    assert sql(text).endswith("AND true AND true")
    assert sql(text, {"topic_id"}).endswith(f"kind = {KINDS.index('topic_id')} AND true AND false")
    # A check whose gated parts are off still reads as SQL with every placeholder filled.
    for name, (_, check) in CHECKS.items():
        assert "{" not in sql(check, set()), name


def test_materialized_views_come_in_the_order_they_are_made() -> None:
    assert [name for name in VIEWS if name in MATERIALIZED] == list(MATERIALIZED)


def test_a_view_is_gated_only_by_kinds_and_views_made_before_it() -> None:
    # The job knows a materialized view's rows only once it is made: a gate on a later one
    # would read as present (true) and gate nothing.
    made: set[str] = set()
    for name, view in VIEWS.items():
        for gate in re.findall(r"\{has_(\w+)\}", view):
            assert gate in KINDS or gate in made, (name, gate)
        if name in MATERIALIZED:
            made.add(name)
    assert "WHERE false" in sql(VIEWS["rc_batches"], set(KINDS) - {"rc_parts"})
