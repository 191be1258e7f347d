"""What a power cut threw away: built by the daemon, sent to the client as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class FileCut:
    """One surviving file whose content or size the cut changed (it had un-synced changes)."""

    path: str
    live_size: int  # size before the cut, as the processes on the mount saw it
    durable_size: int  # size at the file's last fsync
    result_size: int  # size after the cut
    unsynced_bytes: int  # bytes written (or zero-extended) since the last fsync
    dropped_bytes: int  # of those, reverted to the durable content or cut off
    kept_bytes: int  # of those, kept as written (tear)
    garbled_bytes: int  # of those, overwritten with random bytes (garble)


@dataclass
class CutReport:
    mode: str
    seed: str
    cut_number: int
    files_lost: list[str] = field(
        default_factory=list
    )  # files and symlinks gone (entry not durable)
    files_restored: list[str] = field(default_factory=list)  # back (unlink or rename not durable)
    files_replaced: list[str] = field(default_factory=list)  # same path, another file (rename over)
    dirs_lost: list[str] = field(default_factory=list)
    dirs_restored: list[str] = field(default_factory=list)
    # directories whose un-synced entry changes were kept anyway (dir_survival)
    dirs_synced_anyway: list[str] = field(default_factory=list)
    files: list[FileCut] = field(default_factory=list)
    bytes_dropped: int = 0
    bytes_kept: int = 0
    bytes_garbled: int = 0
    # files the daemon still had open when the mount went down (a killed process's close may
    # not have reached it before the unmount: not an error in itself)
    open_handles: int = 0
    aborted_connection: bool = False  # something still held the mount: its connection was cut
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        """True if the cut lost anything at all."""
        return bool(
            self.files_lost
            or self.files_restored
            or self.files_replaced
            or self.dirs_lost
            or self.dirs_restored
            or self.files
        )

    def file(self, path: str) -> FileCut | None:
        """The entry for ``path`` ("/dir/name", relative to the mount), if the cut changed it."""
        for f in self.files:
            if f.path == path:
                return f
        return None

    def summary(self) -> str:
        parts = [f"power cut #{self.cut_number} ({self.mode}, seed {self.seed})"]
        if not self.changed:
            return parts[0] + ": nothing lost"
        for label, items in (
            ("lost", self.files_lost),
            ("restored", self.files_restored),
            ("replaced", self.files_replaced),
            ("dirs lost", self.dirs_lost),
            ("dirs restored", self.dirs_restored),
        ):
            if items:
                parts.append(f"{label}: {', '.join(items)}")
        if self.files:
            parts.append(
                f"{len(self.files)} file(s) rolled back: {self.bytes_dropped} B dropped, "
                f"{self.bytes_kept} B kept torn, {self.bytes_garbled} B garbled"
            )
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CutReport:
        data = dict(data)
        files = [FileCut(**f) for f in data.pop("files", [])]
        return cls(files=files, **data)
