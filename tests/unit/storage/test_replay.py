"""replay_table: the one loop that brings an internal topic's table back from its log
(the offsets store, the transaction log and the share-state log all start with it)."""

from __future__ import annotations

import logging

import pytest

from trio_broker.protocol.records import build_batch
from trio_broker.storage.memory import MemoryLog
from trio_broker.storage.replay import replay_table


def _decode(key: bytes, value: bytes | None) -> tuple[str, int | None]:
    """A key is text; a value a decimal number, None a tombstone; anything else fails."""
    return key.decode("ascii"), None if value is None else int(value)


def test_records_are_applied_in_log_order_with_their_offsets(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = MemoryLog()
    log.append(build_batch([(b"a", b"1"), (None, b"unkeyed"), (b"b", b"2")]), now_ms=1)
    log.append(build_batch([(b"a", b"not a number"), (b"\xff", b"3")]), now_ms=2)
    log.append(build_batch([(b"b", None), (b"a", b"4")]), now_ms=3)
    applied: list[tuple[tuple[str, int | None], int]] = []
    with caplog.at_level(logging.WARNING):
        count = replay_table(
            log, _decode, lambda entry, offset: applied.append((entry, offset)),
            logging.getLogger("test"), "example",
        )  # fmt: skip
    # Every record is counted; the unkeyed one is passed over, the two unreadable ones
    # (a value that is no number, a key that is no ASCII) skipped with a warning each.
    assert count == 7
    assert applied == [(("a", 1), 0), (("b", 2), 2), (("b", None), 5), (("a", 4), 6)]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert warnings[0].startswith("skipping unreadable example record at 3:")
    assert warnings[1].startswith("skipping unreadable example record at 4:")


def test_an_empty_log_replays_nothing() -> None:
    applied: list[object] = []
    count = replay_table(
        MemoryLog(), _decode, lambda entry, offset: applied.append(entry),
        logging.getLogger("test"), "example",
    )  # fmt: skip
    assert (count, applied) == (0, [])
