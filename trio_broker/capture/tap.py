"""The broker's capture tap: frames go through a bounded channel to a background writer.

The connection calls :meth:`CaptureTap.request` after decoding a request and
:meth:`CaptureTap.stage_response` after encoding a response, then ``sent`` once the
response went out (``not_sent`` drops it if the send was cut short). Both only copy the
frame's buffers (log file regions are ``dup``-ed, not read) and ``send_nowait``;
when the channel or the byte budget is full the row is dropped and counted —
capture never blocks the broker. The writer task reads file regions with
``os.pread`` (of a Fetch response, by default only each batch's header) and
writes Parquet in a worker thread.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from trio_broker.capture.compact import (
    FETCH,
    PRODUCE,
    compact_fetch_response,
    compact_produce_request,
    fetch_records,
)
from trio_broker.capture.schema import REQUEST, RESPONSE, CaptureRow, redact, rows_to_table
from trio_broker.capture.writer import ParquetRotator
from trio_broker.protocol.batch_header import HEADER_SIZE
from trio_broker.protocol.codec import Records, RecordsChunks, part_length
from trio_broker.storage.log import FileRegion

log = logging.getLogger("trio_broker.capture")

#: A response piece for the writer: bytes, or a FileRegion on an fd the tap dup-ed.
Piece = bytes | FileRegion


#: Request frames are copied into reused chunks of this size (see _Arena).
ARENA_CHUNK_BYTES = 8 * 1024 * 1024
#: Free chunks kept for reuse (more are left to the garbage collector).
ARENA_FREE_CHUNKS = 8
#: Produce requests at least this big are compacted on the event loop (smaller: by the writer).
COMPACT_ON_LOOP_BYTES = 64 * 1024


@attrs.define(slots=True)
class PendingRow:
    row: CaptureRow
    pieces: list[Piece]
    size: int
    #: The arena chunk holding the row's frame, released once written or dropped.
    chunk: bytearray | None = None
    #: A Fetch response to compact: (version, message, its partitions' records with
    #: file regions on fds of the tap's own), see CaptureTap.stage_response.
    fetch: tuple[int, Any, list[Any]] | None = None


class _Arena:
    """Reused buffers for request frame copies.

    Copying a megabyte frame into a fresh ``bytes`` costs about ten times more
    than into memory already touched (page faults), and the copy runs on the
    broker's event loop. Frames up to a quarter chunk are copied into the
    current chunk; a chunk goes back to the free list when every row in it has
    been written (or dropped). Only the Trio thread calls these methods.
    """

    def __init__(self, chunk_bytes: int = ARENA_CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self.free: list[bytearray] = []
        self.current: bytearray | None = None
        self.position = 0
        #: id(chunk) -> rows still pointing into it
        self.users: dict[int, int] = {}

    def copy(self, data: Any) -> tuple[Any, bytearray | None]:
        size = len(data)
        if size > self.chunk_bytes // 4:
            return bytes(data), None
        if self.current is None or self.position + size > self.chunk_bytes:
            self._retire_current()
            self.current = self.free.pop() if self.free else bytearray(self.chunk_bytes)
            self.position = 0
            self.users[id(self.current)] = 0
        chunk = self.current
        view = memoryview(chunk)[self.position : self.position + size]
        view[:] = data
        self.position += size
        self.users[id(chunk)] += 1
        return view, chunk

    def release(self, chunk: bytearray | None) -> None:
        if chunk is None:
            return
        left = self.users[id(chunk)] - 1
        self.users[id(chunk)] = left
        if left == 0 and chunk is not self.current:
            self._recycle(chunk)

    def _retire_current(self) -> None:
        chunk, self.current = self.current, None
        if chunk is not None and self.users[id(chunk)] == 0:
            self._recycle(chunk)

    def _recycle(self, chunk: bytearray) -> None:
        del self.users[id(chunk)]
        if len(self.free) < ARENA_FREE_CHUNKS:
            self.free.append(chunk)


def _pread(fd: int, n: int, position: int) -> bytes:
    """Up to ``n`` bytes at ``position``: fewer only where the file ends."""
    out = b""
    while len(out) < n:
        chunk = os.pread(fd, n - len(out), position + len(out))
        if not chunk:
            break
        out += chunk
    return out


def _read_part(part: Any, position: int, n: int) -> bytes:
    """``n`` bytes at ``position`` of a records part: a buffer, a file region or a
    MemoryRegion (compact.ReadPart)."""
    if isinstance(part, FileRegion):
        return _pread(part.fd, n, part.position + position)
    data = part.data if hasattr(part, "data") else part
    return bytes(memoryview(data).cast("B")[position : position + n])


def _own_region(region: Any, length: int) -> FileRegion | None:
    """The first ``length`` bytes of a log file region on a dup-ed fd of the tap's own,
    readable after the log closes the segment (retention, shutdown); None if the fd
    could not be duplicated."""
    try:
        return FileRegion(os.dup(region.fd), region.position, length)
    except OSError:
        return None


def _own_regions(records: Records | None) -> Records | None:
    """``records`` with each file region on a dup-ed fd (_own_region)."""
    if not isinstance(records, RecordsChunks):
        return records
    parts = []
    for part in records.parts:
        if getattr(part, "fd", None) is not None:
            part = _own_region(part, part.length) or b""
        parts.append(part)
    return RecordsChunks(parts)


def _owned_fds(item: PendingRow) -> list[int]:
    """The fds the tap dup-ed for ``item``: its pieces' regions and its fetch records'."""
    parts = list(item.pieces)
    if item.fetch is not None:
        for value in item.fetch[2]:
            if isinstance(value, RecordsChunks):
                parts += value.parts
    return [part.fd for part in parts if isinstance(part, FileRegion)]


def _materialize(item: PendingRow) -> CaptureRow:
    """Resolve file regions (pread from a dup-ed fd) into the row's frame bytes."""
    if item.fetch is not None:
        version, message, records = item.fetch
        row = item.row
        try:
            row.frame = compact_fetch_response(
                version, row.correlation_id, message, records, _read_part
            )
        except Exception:
            # Kept as an empty prefix: verify skips it, the other rows of the batch stay.
            log.warning("capture: could not compact a fetch response", exc_info=True)
        finally:
            _release(item)
        return row
    if not item.pieces:
        return item.row
    out = bytearray()
    for piece in item.pieces:
        if not isinstance(piece, FileRegion):
            out += piece
            continue
        try:
            out += _read_part(piece, 0, piece.length)
        except OSError:
            log.warning("capture: could not read a log region", exc_info=True)
        finally:
            os.close(piece.fd)
    row = item.row
    row.frame = redact(row.direction, row.api_key, bytes(out[4:]))  # drop the size prefix
    if row.frame_length < 0:
        row.frame_length = len(out) - 4
    return row


def _release(item: PendingRow) -> None:
    for fd in _owned_fds(item):
        os.close(fd)
    item.pieces = []
    item.fetch = None


class CaptureTap:
    """A broker service (``run``/``close``) that records every frame it is given."""

    def __init__(
        self,
        directory: Path,
        broker_id: int = 0,
        *,
        max_rows: int = 100_000,
        max_bytes: int = 256 * 1024 * 1024,
        flush_rows: int = 10_000,
        flush_seconds: float = 1.0,
        flush_bytes: int = 32 * 1024 * 1024,
        prefix_bytes: int | None = None,
        full_records: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.broker_id = broker_id
        self.max_bytes = max_bytes
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self.flush_bytes = flush_bytes
        self.prefix_bytes = prefix_bytes
        #: False: the batches of Produce requests and Fetch responses are stored as
        #: headers only (compact.py); ``serve --capture-records full`` keeps them
        #: whole (needed by ``replay``).
        self.full_records = full_records
        self.rotator = ParquetRotator(self.directory, broker_id)
        # Warmed up now, not by the first flush: pyarrow's imports (hundreds of modules,
        # ~0.5 s of CPU holding the GIL) would stall the broker's event loop mid-traffic.
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(rows_to_table([]), pa.BufferOutputStream(), compression="zstd")

        self._send, self._receive = trio.open_memory_channel[PendingRow](max_rows)
        self._buffer: list[PendingRow] = []
        self.queued_bytes = 0
        self.captured = 0
        self.dropped = 0
        #: Times capture was switched on or off at runtime (trio_broker.capture.control).
        self.switched = 0
        self.closed = False
        self._arena = _Arena()

    # ------------------------------------------------------------------ hot path

    def _offer(self, item: PendingRow) -> None:
        if self.queued_bytes + item.size > self.max_bytes:
            self._drop(item)
            return
        try:
            self._send.send_nowait(item)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self._drop(item)
            return
        self.queued_bytes += item.size
        self.captured += 1

    def _drop(self, item: PendingRow) -> None:
        self.dropped += 1
        _release(item)
        self._arena.release(item.chunk)

    def request(self, connection_id: int, address: str, header: Any, frame: Any) -> None:
        length = len(frame)
        data = frame if self.prefix_bytes is None else frame[: self.prefix_bytes]
        copy: Any = None
        chunk = None
        if header.api_key == PRODUCE and length >= COMPACT_ON_LOOP_BYTES and not self.full_records:
            # Cutting a big Produce request to its batch headers here costs about what
            # copying it would, and spares the copy, the writer and the disk.
            try:
                copy = compact_produce_request(data)
            except Exception:
                copy = None  # not decodable: kept whole
        if copy is None:
            copy, chunk = self._arena.copy(redact(REQUEST, header.api_key, data))
        row = CaptureRow(
            self.broker_id, connection_id, address, header.client_id, REQUEST,
            time.monotonic_ns(), time.time_ns(), header.api_key, header.api_version,
            header.correlation_id, length, copy,
        )  # fmt: skip
        self._offer(PendingRow(row, [], len(copy), chunk))

    def sent(self, staged: PendingRow) -> None:
        """The staged response went out whole: it joins the capture."""
        self._offer(staged)

    def not_sent(self, staged: PendingRow) -> None:
        """The staged response's send was cut short (a close, a reset): no client read
        it whole, so it is not captured (a pcap of the link holds no such frame)."""
        _release(staged)
        self._arena.release(staged.chunk)

    def stage_response(
        self,
        connection_id: int,
        address: str,
        header: Any,
        version: int,
        parts: list[Any],
        message: Any = None,
    ) -> PendingRow:
        """A response frame, given as the ``parts`` it is sent as, copied and stamped now.

        Stamped before its send, because the client's next request can only be read
        after the client has the response: ordered by stamp, an answer always comes
        before what it caused. Offered (``sent``) only once the send completed.

        With ``message`` (the decoded response) a Fetch response is kept as batch
        headers only, unless the tap keeps full records or a prefix: its records are
        not read, only each batch's header (by the writer).
        """
        if (
            header.api_key == FETCH
            and message is not None
            and not self.full_records
            and self.prefix_bytes is None
        ):
            records = [_own_regions(value) for value in fetch_records(message)]
            row = self._response_row(
                connection_id, address, header, version, sum(map(part_length, parts)) - 4
            )
            # What the row will take once written: a header per batch, counted roughly.
            size = 256 + HEADER_SIZE * sum(
                len(value.parts) for value in records if isinstance(value, RecordsChunks)
            )
            return PendingRow(row, [], size, fetch=(version, message, records))
        pieces: list[Piece] = []
        budget = None if self.prefix_bytes is None else self.prefix_bytes + 4
        total = 0
        kept = 0
        for part in parts:
            if isinstance(part, bytes | bytearray | memoryview):
                n = memoryview(part).nbytes
                if budget is None or kept < budget:
                    take = n if budget is None else min(n, budget - kept)
                    pieces.append(bytes(memoryview(part).cast("B")[:take]))
                    kept += take
                total += n
                continue
            n = part.length
            if budget is None or kept < budget:
                take = n if budget is None else min(n, budget - kept)
                if getattr(part, "fd", None) is None:
                    pieces.append(bytes(part.read_bytes()[:take]))
                else:
                    pieces.append(_own_region(part, take) or b"\0" * take)
                kept += take
            total += n
        row = self._response_row(connection_id, address, header, version, total - 4)
        return PendingRow(row, pieces, kept)

    def _response_row(
        self, connection_id: int, address: str, header: Any, version: int, frame_length: int
    ) -> CaptureRow:
        """A response row stamped now; its frame is filled in by the writer."""
        return CaptureRow(
            self.broker_id, connection_id, address, header.client_id, RESPONSE,
            time.monotonic_ns(), time.time_ns(), header.api_key, version,
            header.correlation_id, frame_length, b"",
        )  # fmt: skip

    # ------------------------------------------------------------------ writer task

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            buffered = 0
            with trio.move_on_after(self.flush_seconds):
                # Also by bytes: written rows free their arena chunks for reuse.
                while len(self._buffer) < self.flush_rows and buffered < self.flush_bytes:
                    item = await self._receive.receive()
                    self._buffer.append(item)
                    buffered += item.size
            if self._buffer:
                batch, self._buffer = self._buffer, []
                self.queued_bytes -= sum(item.size for item in batch)
                await trio.to_thread.run_sync(self._write, batch)
                for item in batch:
                    self._arena.release(item.chunk)

    def _compact(self, row: CaptureRow) -> CaptureRow:
        """In the writer thread: cut Produce request batches to their headers (compact.py)."""
        if self.full_records or row.api_key != PRODUCE or row.direction != REQUEST:
            return row
        if len(row.frame) < row.frame_length:
            return row  # already a prefix
        try:
            row.frame = compact_produce_request(row.frame)
        except Exception:
            log.debug("capture: produce request kept whole (not decodable)", exc_info=True)
        return row

    def _write(self, batch: list[PendingRow]) -> None:
        try:
            self.rotator.write(self._compact(_materialize(item)) for item in batch)
        except Exception:
            log.exception("capture: writing %d rows failed", len(batch))
            self.dropped += len(batch)

    def close(self) -> None:
        """Write what is still queued (synchronously: the broker is stopping)."""
        if self.closed:
            return
        self.closed = True
        self._send.close()
        while True:
            try:
                self._buffer.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        batch, self._buffer = self._buffer, []
        self.queued_bytes = 0
        self._write(batch)
        self.rotator.write_stats(
            captured=self.captured, dropped=self.dropped, switched=self.switched
        )
        if self.dropped:
            log.warning("capture: %d frames dropped (queue full)", self.dropped)
        log.info("capture: %d rows in %s", self.rotator.rows_written, self.directory)
