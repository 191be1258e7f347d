"""Test-only launcher: ``trio-broker`` with fsync and fdatasync turned into no-ops.

The planted bug for the power-cut harness (``bench/power_cut.py``,
``tests/reliability/test_power_cut.py``): a broker that never makes anything durable must
be caught losing acknowledged data at the first power cut, or the harness proves nothing.

    python tests/reliability/nofsync_broker.py serve --data-dir DIR ...

Every argument goes to ``trio_broker.cli.main``. The broker's code calls ``os.fsync`` and
``os.fdatasync`` through the ``os`` module, so replacing them there reaches every sync it
makes (the durable-write helper, segment and directory syncs). The no-ops still check the
descriptor, as the real calls would.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def _no_sync(fd: Any) -> None:
    """Nothing is synced; a bad descriptor still raises EBADF, as the real call would."""
    os.fstat(fd if isinstance(fd, int) else fd.fileno())


def main(argv: list[str] | None = None) -> int:
    os.fsync = _no_sync
    os.fdatasync = _no_sync
    from trio_broker.cli import main as cli_main

    return cli_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
