"""Shared fixtures: a real in-process broker on an ephemeral port.

``broker`` runs :class:`Broker` in the test's nursery (pytest-trio) and yields it
once it listens; ``bootstrap`` is its "127.0.0.1:<port>" for real clients. A
module that needs other settings overrides the ``broker_config`` fixture.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from trio_broker.config import BrokerConfig
from trio_broker.server.broker import Broker


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(port=0, data_dir=tmp_path / "data", storage="file")


@pytest.fixture
async def broker(broker_config: BrokerConfig, nursery: trio.Nursery) -> AsyncIterator[Broker]:
    # The test's nursery is cancelled when the test ends, which stops the broker
    # and closes its logs (Broker.run's finally).
    running: Broker = await nursery.start(Broker(broker_config).run)
    yield running


@pytest.fixture
def bootstrap(broker: Broker) -> str:
    host, port = broker.bound[0]
    return f"{host}:{port}"
