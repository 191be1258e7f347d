"""Record-batch validation before an append: ``RecordBatchView.validate`` (the batch's own
consistency) and ``handlers.produce.validate_batch`` (Kafka's Produce v3+ rules), each
rule at its boundary, with the error code a client sees and the message an operator
reads. The broker-level answers are in tests/integration (real clients).
"""

from __future__ import annotations

import struct

import pytest

from trio_broker.handlers.produce import (
    FIRST_ZSTD_VERSION,
    BatchRejected,
    RecordsRejected,
    validate_batch,
)
from trio_broker.protocol.batch_header import HEADER_SIZE, LOG_OVERHEAD, MIN_BATCH_LENGTH
from trio_broker.protocol.compression import Compression
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.errors import (
    CorruptRecordError,
    InvalidRecordError,
    UnsupportedCompressionError,
)
from trio_broker.protocol.records import RecordBatchView, build_batch
from trio_broker.storage.topic_configs import DEFAULT_MAX_MESSAGE_BYTES

_CRC = struct.Struct(">I")


def sample(count: int = 3, **kwargs: object) -> bytearray:
    kwargs.setdefault("base_timestamp", 1_700_000_000_000)
    return build_batch([(b"k%d" % i, b"v%d" % i) for i in range(count)], **kwargs)  # type: ignore[arg-type]


def patched(raw: bytearray, offset: int, fmt: str, value: int, fix_crc: bool = True) -> bytearray:
    """``raw`` with one header field overwritten (and the CRC recomputed, unless told)."""
    out = bytearray(raw)
    struct.pack_into(fmt, out, offset, value)
    if fix_crc:
        import crc32c

        _CRC.pack_into(out, 17, crc32c.crc32c(bytes(out[21:])))
    return out


def rejected(
    raw: object, version: int = 9, limit: int = DEFAULT_MAX_MESSAGE_BYTES
) -> tuple[int, str]:
    with pytest.raises(BatchRejected) as info:
        validate_batch(raw, version, limit)
    return info.value.error_code, str(info.value)


# ------------------------------------------------------------------ RecordBatchView.validate


def test_a_sound_batch_validates() -> None:
    for codec in Compression:
        RecordBatchView(sample(compression=codec)).validate()
    RecordBatchView(sample(count=1)).validate()


def test_batch_length_must_match_the_buffer_exactly() -> None:
    raw = sample()
    length = len(raw) - LOG_OVERHEAD
    for wrong in (length - 1, length + 1, MIN_BATCH_LENGTH - 1, -1):
        with pytest.raises(
            CorruptRecordError,
            match=rf"^batch length {wrong} does not match the {len(raw)} bytes of the batch$",
        ):
            RecordBatchView(patched(raw, 8, ">i", wrong)).validate()


def test_a_header_only_batch_has_the_minimum_length() -> None:
    assert MIN_BATCH_LENGTH == HEADER_SIZE - LOG_OVERHEAD
    header = patched(sample(count=1)[:HEADER_SIZE], 8, ">i", MIN_BATCH_LENGTH)
    view = RecordBatchView(header)
    assert view.batch_length == MIN_BATCH_LENGTH
    with pytest.raises(CorruptRecordError, match=r"^1 records cannot fit in 0 bytes$"):
        view.records()


def test_a_batch_whose_records_do_not_parse_is_refused() -> None:
    # Kafka's LogValidator walks the records of every produced batch: a header
    # and CRC that are sound do not make the records inside valid (INVALID_RECORD).
    header = patched(sample(count=1)[:HEADER_SIZE], 8, ">i", MIN_BATCH_LENGTH)
    code, message = rejected(header)
    assert code == ErrorCode.INVALID_RECORD
    assert message == "1 records cannot fit in 0 bytes"


def _with_count(raw: bytearray, count: int) -> bytearray:
    """The header claims ``count`` records (count and last offset delta agree)."""
    return patched(patched(raw, 23, ">i", count - 1), 57, ">i", count)


@pytest.mark.parametrize("codec", list(Compression))
def test_the_record_count_must_match_the_records(codec: Compression) -> None:
    raw = sample(count=3, compression=codec)
    validate_batch(raw, 9, DEFAULT_MAX_MESSAGE_BYTES)
    code, message = rejected(_with_count(raw, 2))
    assert code == ErrorCode.INVALID_RECORD, message
    assert message.endswith("bytes after the last of 2 records"), message
    code, message = rejected(_with_count(raw, 4))
    assert code == ErrorCode.INVALID_RECORD, message
    assert message in ("record length runs past the end of the batch", "invalid record length 0")


def test_a_record_length_past_the_batch_is_refused() -> None:
    raw = sample(count=2)
    # The first record's length varint sits right after the 61-byte header.
    length_byte = HEADER_SIZE
    for wrong in (0x7E, 0x02):  # zigzag 63 (past the end) and 1 (below the minimum)
        bad = bytearray(raw)
        bad[length_byte] = wrong
        bad = patched(bad, 8, ">i", len(bad) - LOG_OVERHEAD)  # recompute the CRC
        code, message = rejected(bad)
        assert code == ErrorCode.INVALID_RECORD
        assert message.startswith("invalid record length"), message


def test_a_decompression_bomb_in_a_produced_batch_is_refused() -> None:
    from trio_broker.protocol.records import DEFAULT_MAX_UNCOMPRESSED

    big = build_batch([(None, bytes(DEFAULT_MAX_UNCOMPRESSED + 1))], compression=Compression.ZSTD)
    assert len(big) < DEFAULT_MAX_MESSAGE_BYTES  # small on the wire, huge inside
    code, message = rejected(big)
    assert code == ErrorCode.CORRUPT_MESSAGE
    assert "exceeds the limit" in message


def test_magic_other_than_2_is_invalid_record() -> None:
    for magic in (0, 1, 3):
        with pytest.raises(InvalidRecordError, match=rf"^unsupported record batch magic {magic}$"):
            RecordBatchView(patched(sample(), 16, ">b", magic)).validate()


def test_crc_mismatch_is_corrupt() -> None:
    raw = sample()
    with pytest.raises(CorruptRecordError, match=r"^record batch CRC mismatch$"):
        RecordBatchView(
            patched(raw, 17, ">I", RecordBatchView(raw).crc ^ 1, fix_crc=False)
        ).validate()
    flipped = bytearray(raw)
    flipped[-1] ^= 0x40  # a record byte under the CRC
    with pytest.raises(CorruptRecordError, match=r"^record batch CRC mismatch$"):
        RecordBatchView(flipped).validate()


def test_codec_ids_above_zstd_are_unsupported() -> None:
    assert int(Compression.ZSTD) == 4
    RecordBatchView(patched(sample(compression=Compression.ZSTD), 21, ">h", 4)).validate()
    for codec in (5, 6, 7):
        with pytest.raises(
            UnsupportedCompressionError, match=rf"^unknown compression codec {codec}$"
        ):
            RecordBatchView(patched(sample(), 21, ">h", codec)).validate()


def test_record_count_must_be_last_offset_delta_plus_one() -> None:
    raw = sample(count=3)  # last offset delta 2
    for count in (0, -1, 2, 4):
        with pytest.raises(
            InvalidRecordError,
            match=rf"^record count {count} does not match last offset delta 2$",
        ):
            RecordBatchView(patched(raw, 57, ">i", count)).validate()
    with pytest.raises(
        InvalidRecordError, match=r"^record count 3 does not match last offset delta 3$"
    ):
        RecordBatchView(patched(raw, 23, ">i", 3)).validate()


# ------------------------------------------------------------------ Produce v3+ rules


def test_validate_batch_returns_the_one_batch() -> None:
    raw = sample(producer_id=7, producer_epoch=0, base_sequence=0)
    view = validate_batch(raw, 9, DEFAULT_MAX_MESSAGE_BYTES)
    assert (view.record_count, view.producer_id, view.size_in_bytes) == (3, 7, len(raw))
    assert validate_batch(memoryview(raw), 3, len(raw)).size_in_bytes == len(raw)  # at the limit


def test_no_records_is_invalid_record() -> None:
    assert rejected(None) == (ErrorCode.INVALID_RECORD, "no records")
    assert rejected(b"") == (ErrorCode.INVALID_RECORD, "no records")


def test_unparsable_records_are_corrupt_message() -> None:
    raw = sample()
    truncated = "record batch at byte 0 runs past the end of the buffer"
    assert rejected(raw[:-1]) == (ErrorCode.CORRUPT_MESSAGE, truncated)
    assert rejected(b"\x00" * 11) == (ErrorCode.CORRUPT_MESSAGE, truncated)


def test_exactly_one_batch() -> None:
    two = sample() + sample()
    assert rejected(two) == (ErrorCode.INVALID_RECORD, "Produce v3+ needs exactly one batch")


def test_batch_over_max_message_bytes() -> None:
    raw = sample()
    assert rejected(raw, limit=len(raw) - 1) == (
        ErrorCode.MESSAGE_TOO_LARGE,
        f"batch of {len(raw)} bytes",
    )


def test_inconsistent_batch_answers_its_own_error_code() -> None:
    raw = sample()
    assert rejected(patched(raw, 17, ">I", 0, fix_crc=False)) == (
        ErrorCode.CORRUPT_MESSAGE,
        "record batch CRC mismatch",
    )
    assert rejected(patched(raw, 57, ">i", 9)) == (
        ErrorCode.INVALID_RECORD,
        "record count 9 does not match last offset delta 2",
    )
    assert rejected(patched(raw, 21, ">h", 6)) == (
        ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
        "unknown compression codec 6",
    )


def test_zstd_needs_produce_v7() -> None:
    raw = sample(compression=Compression.ZSTD)
    assert rejected(raw, version=FIRST_ZSTD_VERSION - 1) == (
        ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
        "zstd needs Produce v7+",
    )
    assert validate_batch(raw, FIRST_ZSTD_VERSION, DEFAULT_MAX_MESSAGE_BYTES).compression is (
        Compression.ZSTD
    )
    validate_batch(sample(compression=Compression.LZ4), 3, DEFAULT_MAX_MESSAGE_BYTES)


def test_control_batches_and_transactional_ones_without_producer_are_refused() -> None:
    assert rejected(sample(is_control=True)) == (
        ErrorCode.INVALID_RECORD,
        "clients may not write control batches",
    )
    assert rejected(sample(producer_id=-1, is_transactional=True)) == (
        ErrorCode.INVALID_RECORD,
        "transactional batch without a producer id",
    )
    # A transactional batch is valid as records; the coordinator decides (handler).
    txn = sample(producer_id=3, producer_epoch=0, base_sequence=0, is_transactional=True)
    assert validate_batch(txn, 9, DEFAULT_MAX_MESSAGE_BYTES).is_transactional


def test_idempotent_batch_needs_a_sequence() -> None:
    # Producer id 0 is a real id (the first one a fresh broker hands out).
    for pid in (0, 5):
        assert rejected(sample(producer_id=pid, producer_epoch=0, base_sequence=-1)) == (
            ErrorCode.INVALID_RECORD,
            "idempotent batch without a sequence",
        )
        validate_batch(sample(producer_id=pid, producer_epoch=0, base_sequence=0), 9, 1 << 20)
    # No producer id: no sequence needed (librdkafka sends -1, aiokafka 0).
    validate_batch(sample(producer_id=-1, base_sequence=-1), 9, 1 << 20)
    validate_batch(sample(producer_id=-1, base_sequence=0), 9, 1 << 20)


# ---------------------------------------------------------------- compacted topics need keys


def test_a_compacted_partition_refuses_a_batch_with_keyless_records() -> None:
    """Kafka's LogValidator: every keyless record is named (its index in the batch),
    the whole batch is INVALID_RECORD; an empty key is a key."""
    keyed_and_not = [(b"k0", b"v0"), (None, b"v1"), (b"", b"v2"), (None, None), (None, b"v4")]
    for codec in (Compression.NONE, Compression.GZIP):
        raw = build_batch(keyed_and_not, base_timestamp=1, compression=codec)
        with pytest.raises(RecordsRejected) as info:
            validate_batch(raw, 9, DEFAULT_MAX_MESSAGE_BYTES, compacted_partition="t-3")
        why = "Compacted topic cannot accept message without key in topic partition t-3"
        assert info.value.error_code == ErrorCode.INVALID_RECORD
        assert info.value.record_errors == [(1, why), (3, why), (4, why)]
        assert str(info.value) == (
            "One or more records have been rejected due to 3 record errors in total, and only "
            f"showing the first three errors at most: [RecordError(batchIndex=1, message='{why}'), "
            f"RecordError(batchIndex=3, message='{why}'), RecordError(batchIndex=4, message='{why}')]"
        )
        # The same batch goes to a partition that is not compacted.
        validate_batch(raw, 9, DEFAULT_MAX_MESSAGE_BYTES)
    keyed = sample(count=3)
    assert validate_batch(keyed, 9, DEFAULT_MAX_MESSAGE_BYTES, compacted_partition="t-0")
