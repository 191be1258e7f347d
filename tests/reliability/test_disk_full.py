"""Disk full: the data dir on an 8 MiB tmpfs, produced to until ENOSPC.

Needs root (``mount -t tmpfs``); skipped with the reason when mounting is not
permitted. Checks: the failing produce gets KAFKA_STORAGE_ERROR (56) — never a
success for data that was not written — the data dir (the one log dir) goes
offline, so reads of the partition answer 56 too (Kafka's rule: a disk error
takes the whole log dir offline), the broker keeps serving other requests, and
after space is freed the dir comes back online **without a restart** (re-probed
on produce), with nothing acknowledged lost, also after a restart.
The tmpfs is unmounted in teardown.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.conftest import ConfiguredBroker
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.records import build_batch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TMPFS_SIZE = "8m"
VALUE = bytes(range(256)) * 256  # 64 KiB per record, one record per batch


@pytest.fixture
def tmpfs_dir(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _read_all(broker: ConfiguredBroker, topic: str) -> dict[int, bytes]:
    with broker.connect() as conn:
        return {
            batch.offset_of(record): bytes(record.value or b"")
            for batch in conn.fetch_batches(topic)
            for record in batch.records()
        }


def test_disk_full(tmpfs_dir: Path) -> None:
    broker = ConfiguredBroker(tmpfs_dir / "data", config={"log.segment.bytes": 1 << 20})
    filler = tmpfs_dir / "filler"
    topic = "disk-full"
    broker.start()
    try:
        filler.write_bytes(b"\0" * (1 << 20))  # 1 MiB to free again later
        acked: dict[int, bytes] = {}
        errors: list[int] = []
        with broker.connect() as conn:
            conn.metadata([topic])
            for i in range(400):  # 8 MiB / 64 KiB = 128: bounded well above
                value = b"%06d" % i + VALUE
                part = conn.produce(topic, bytes(build_batch([(b"k", value)])))
                if part.error_code == 0:
                    acked[part.base_offset] = value
                    continue
                errors.append(part.error_code)
                if len(errors) >= 3:
                    break
        print(f"disk full after {len(acked)} acknowledged 64 KiB records; errors {errors}")
        assert errors, "the 8 MiB tmpfs never filled up"
        assert set(errors) == {ErrorCode.KAFKA_STORAGE_ERROR}, errors
        assert len(acked) >= 50
        # The dir is offline: reads of its partitions answer 56 as well (before the
        # per-dir rule they went on; Kafka's offline dir serves nothing), and the broker
        # serves other requests.
        with broker.connect() as conn, pytest.raises(AssertionError, match="error 56"):
            conn.end_offset(topic)
        broker.assert_serving()
        # Space returns: free the filler. Without a restart, the offline partition is
        # probed again on produce (1 s back-off) and comes back online.
        filler.unlink()
        recovered, still_failing = None, 0
        with broker.connect() as conn:
            for _ in range(50):  # bounded: 50 x 0.2 s
                part = conn.produce(topic, bytes(build_batch([(b"k", b"recovered")])))
                if part.error_code == 0:
                    recovered = part.base_offset
                    break
                assert part.error_code == ErrorCode.KAFKA_STORAGE_ERROR, part.error_code
                still_failing += 1
                time.sleep(0.2)
        print(f"back online without a restart after {still_failing} more failed produces")
        assert recovered is not None, "the partition did not recover when space returned"
        stored = _read_all(broker, topic)
        assert {o: stored.get(o) for o in acked} == acked, "acknowledged records lost"
        assert stored[recovered] == b"recovered"
        # And after a restart everything acknowledged is still there.
        broker.restart()
        stored = _read_all(broker, topic)
        assert {o: stored.get(o) for o in acked} == acked, "acknowledged records lost"
        with broker.connect() as conn:
            part = conn.produce(topic, bytes(build_batch([(b"k", b"after")])))
            assert part.error_code == 0, f"produce after space returned: {part.error_code}"
        stored = _read_all(broker, topic)
        assert {o: stored.get(o) for o in acked} == acked
        assert stored[part.base_offset] == b"after"
    finally:
        broker.finish()
