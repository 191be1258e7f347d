"""Rotated Parquet files of capture rows.

Each flush becomes one file, written under a temporary name, fsynced and renamed
(:mod:`trio_broker.storage.durable`), so a reader (or a crash, or a power cut)
never sees half a file: ``capture-b<broker>-<start>-<seq>.parquet``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path

from trio_broker.capture.schema import CaptureRow, rows_to_table
from trio_broker.storage.durable import make_dirs_durable, publish_file, write_file_atomically


class ParquetRotator:
    def __init__(self, directory: Path, broker_id: int, *, name: str = "capture") -> None:
        self.directory = Path(directory)
        make_dirs_durable(self.directory)
        self.prefix = f"{name}-b{broker_id}-{time.time_ns()}"
        self.sequence = 0
        self.rows_written = 0
        self.files: list[Path] = []

    def write(self, rows: Iterable[CaptureRow]) -> Path | None:
        import pyarrow.parquet as pq

        rows = list(rows)
        if not rows:
            return None
        path = self.directory / f"{self.prefix}-{self.sequence:06d}.parquet"
        self.sequence += 1
        tmp = path.with_suffix(".parquet.tmp")
        pq.write_table(rows_to_table(rows), tmp, compression="zstd")
        publish_file(tmp, path)
        self.rows_written += len(rows)
        self.files.append(path)
        return path

    def write_stats(self, **stats: int) -> None:
        path = self.directory / f"{self.prefix}.stats.json"
        body = json.dumps({"rows_written": self.rows_written, **stats}) + "\n"
        write_file_atomically(path, body.encode())
