"""A ratchet on the Produce handler's shape (issue 29: handlers read as the Kafka API
they implement, the per-partition guard written once).

``handle_produce`` reads as Kafka's handleProduceRequest: the request's checks, then
for each partition one guard (``produce_target``), its append (``append_batch``) and
the answer acks asks for (``answer_when_acked``). Guards written back into the loop
show up as ``continue`` statements and length: both may only go down.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PRODUCE = ROOT / "trio_broker" / "handlers" / "produce.py"

#: The lines of ``handle_produce`` (from ``async def`` to its last statement); 199 before
#: the guard was taken out of the loop.
MAX_LINES = 90
#: Its ``continue`` statements: the request's or topic's refusal, the guard's, the
#: append's (14 before).
MAX_CONTINUES = 3


def handler() -> ast.AsyncFunctionDef:
    tree = ast.parse(PRODUCE.read_text())
    found = [
        node
        for node in tree.body
        if isinstance(node, ast.AsyncFunctionDef) and node.name == "handle_produce"
    ]
    assert len(found) == 1, "handle_produce is no longer one top-level function"
    return found[0]


def test_handle_produce_stays_short() -> None:
    node = handler()
    assert node.end_lineno is not None
    lines = node.end_lineno - node.lineno + 1
    assert lines <= MAX_LINES, (
        f"handle_produce has {lines} lines (at most {MAX_LINES}): put a new per-partition "
        "check in produce_target, or a step of the append in append_batch"
    )


def test_handle_produce_guards_in_one_place() -> None:
    continues = sum(isinstance(n, ast.Continue) for n in ast.walk(handler()))
    assert continues <= MAX_CONTINUES, (
        f"handle_produce has {continues} continue statements (at most {MAX_CONTINUES}): "
        "a partition's refusal belongs in produce_target"
    )


#: The per-partition APIs whose guard is ``topic_lookup.leading_partition`` (Kafka's
#: getPartitionOrError, then Partition.getLocalLog): none writes its own.
GUARDED_HANDLERS = (
    "produce.py",
    "fetch.py",
    "list_offsets.py",
    "offset_for_leader_epoch.py",
    "delete_records.py",
)


def test_per_partition_handlers_share_the_partition_guard() -> None:
    """The partition known here and led by this broker: one function, not a copy per
    handler (ListOffsets, OffsetForLeaderEpoch and DeleteRecords kept their own loops of
    ``missing_partition_error`` and ``check_leader`` before)."""
    for module in GUARDED_HANDLERS:
        source = (PRODUCE.parent / module).read_text()
        assert "leading_partition(" in source, module
        for own_guard in ("missing_partition_error(", "check_leader(", "topics.log("):
            assert own_guard not in source, f"{module} calls {own_guard}...)"


def test_fetch_reads_through_the_partition_read_entry() -> None:
    """Fetch reads a partition's records only through ``partition/read.py`` (Kafka's
    Partition.fetchRecords), never a log's ``read`` of its own."""
    source = (PRODUCE.parent / "fetch.py").read_text()
    assert "from trio_broker.partition.read import" in source
    assert ".read(" not in source, "fetch.py reads a log directly: use partition.read.read"


#: Where a guarded handler still indexes a topic's logs itself: ListOffsets from the
#: debugging replica id reads a follower's copy, which has no Partition (no term here).
OWN_LOG_LOOKUPS = {"list_offsets.py": 1}


def test_guarded_handlers_reach_a_log_only_through_the_partition() -> None:
    """The guard's one lookup gives the partition whole (``partition/partition.py``:
    log, term, producer state); a handler that indexed ``topic.logs`` again would
    look up a second time what the guard found, and could find another log."""
    for module in GUARDED_HANDLERS:
        source = (PRODUCE.parent / module).read_text()
        found = source.count(".logs[")
        assert found <= OWN_LOG_LOOKUPS.get(module, 0), (
            f"{module} indexes topic.logs {found} time(s): use the Partition's log"
        )
