"""Reference model of idempotent producer checks in one partition, in eight sentences.

1. A batch without a producer id (-1) is appended unchecked.
2. A producer the partition remembers nothing of is appended at any sequence.
3. A batch older than the producer's newest appended epoch is refused: INVALID_PRODUCER_EPOCH.
4. A batch of a newer epoch is appended iff its first sequence is 0, else
   OUT_OF_ORDER_SEQUENCE_NUMBER.
5. In the same epoch, a batch whose first and last sequence equal those of one of the
   producer's five most recently appended batches of that epoch is a duplicate: it is not
   appended and is answered with that batch's offsets.
6. Otherwise it is appended iff its first sequence is the last appended sequence plus one,
   modulo 2**31; else OUT_OF_ORDER_SEQUENCE_NUMBER.
7. A producer (with no open transaction) whose last appended batch's timestamp is
   producer.id.expiration.ms or more in the past is forgotten when the partition checks
   for expired producers; a duplicate does not refresh it.
8. Moving the log start (retention, DeleteRecords) forgets nothing, even a producer
   whose every batch it removed (Kafka 2.5+, KAFKA-7190): sentences 3-6 still apply.

The model keeps *every* appended batch per producer (no window, no entry object) and
derives the answer from that history, so it shares no data structure with
``trio_broker.state.producer``; ``statemachine/test_producer_machine.py`` drives both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trio_broker.protocol.error_codes import ErrorCode

SEQUENCE_MODULUS = 2**31
WINDOW = 5


@dataclass(frozen=True)
class Appended:
    epoch: int
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    #: The batch's max timestamp (sentence 7).
    timestamp: int = 0


@dataclass
class ModelPartition:
    """Producer id -> every batch appended for it, oldest first (since it was last forgotten)."""

    history: dict[int, list[Appended]] = field(default_factory=dict)

    def verdict(
        self, producer_id: int, epoch: int, first_seq: int, last_seq: int
    ) -> tuple[str, ErrorCode | Appended | None]:
        """('append', None) | ('duplicate', original batch) | ('reject', error code)."""
        if producer_id == -1:  # sentence 1
            return ("append", None)
        past = self.history.get(producer_id, [])
        if not past:  # sentence 2
            return ("append", None)
        newest_epoch = past[-1].epoch
        if epoch < newest_epoch:  # sentence 3
            return ("reject", ErrorCode.INVALID_PRODUCER_EPOCH)
        if epoch > newest_epoch:  # sentence 4
            if first_seq == 0:
                return ("append", None)
            return ("reject", ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
        same_epoch = [b for b in past if b.epoch == epoch]
        for b in same_epoch[-WINDOW:]:  # sentence 5
            if (b.first_seq, b.last_seq) == (first_seq, last_seq):
                return ("duplicate", b)
        if first_seq == (past[-1].last_seq + 1) % SEQUENCE_MODULUS:  # sentence 6
            return ("append", None)
        return ("reject", ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)

    def appended(self, producer_id: int, batch: Appended) -> None:
        if producer_id != -1:
            self.history.setdefault(producer_id, []).append(batch)

    def expire(self, now_ms: int, expiration_ms: int) -> None:
        """Sentence 7."""
        for pid in [
            p for p, h in self.history.items() if now_ms - h[-1].timestamp >= expiration_ms
        ]:
            del self.history[pid]
