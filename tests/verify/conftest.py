"""One local[2] Spark session per test process, shared by every verify module.

A session starts in 7-10 s (more on a busy machine) and each module used to start its
own; CI runs the suite with ``--dist loadfile``, so each xdist worker starts it at most
once, on first use, and stops it when the worker ends.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="the verify extra (pyspark) is not installed")
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime (java not on PATH)")
    from trio_broker.verify.job import spark_session

    session = spark_session("local[2]")
    yield session
    session.stop()
