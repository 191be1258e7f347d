"""The loop watchdog (server/loop_watchdog.py): a stall is measured, counted and named.

An in-process broker with /metrics; ApiVersions is wrapped in a stand-in that holds
the event loop 400 ms without a checkpoint (``time.sleep``), as a CPU-bound handler
does. The watchdog must log one WARN on ``trio_broker.loop`` naming api_versions and
its correlation id, and /metrics must show the stall in the lag histogram and counter.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from tests.integration.raw_client import RawClient
from tests.integration.test_metrics import Key, scrape, value
from trio_broker.config import BrokerConfig
from trio_broker.handlers.base import RequestContext
from trio_broker.protocol import messages as m
from trio_broker.server.broker import Broker

HOLD_S = 0.4


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0, data_dir=tmp_path / "data", storage="memory", metrics_listener="127.0.0.1:0"
    )


def lag_bucket(samples: dict[Key, float], le: str) -> float:
    return value(samples, "trio_broker_event_loop_lag_seconds_bucket", le=le)


async def test_a_stall_is_measured_and_names_the_request(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trio_broker.loop")
    real = broker.router[m.ApiKey.API_VERSIONS]

    async def hold_the_loop(ctx: RequestContext, request: Any) -> Any:
        time.sleep(HOLD_S)  # noqa: ASYNC251 - the stall under test
        return await real.fn(ctx, request)

    before = await scrape(broker)
    assert value(before, "trio_broker_event_loop_stalls_total") == 0
    broker.router[m.ApiKey.API_VERSIONS] = attrs.evolve(real, fn=hold_the_loop)
    host, port = broker.bound[0]
    client = RawClient(await trio.open_tcp_stream(host, port), client_id="stalling-client")
    response = await client.call(m.ApiKey.API_VERSIONS, 3, m.ApiVersionsRequest(
        client_software_name="t", client_software_version="1"))  # fmt: skip
    assert response.error_code == 0
    with trio.fail_after(10):
        while broker.loop_watchdog.stalls == 0:  # noqa: ASYNC110 - polls a counter
            await trio.sleep(0.01)
    [warning] = [r for r in caplog.records if r.name == "trio_broker.loop"]
    assert warning.levelno == logging.WARNING
    text = warning.getMessage()
    assert "event loop stalled" in text
    assert f"api_versions (key {m.ApiKey.API_VERSIONS} v3, correlation id 1" in text
    assert "'stalling-client'" in text

    after = await scrape(broker)
    assert value(after, "trio_broker_event_loop_stalls_total") == 1
    assert value(after, "trio_broker_event_loop_lag_max_seconds") >= HOLD_S - 0.1
    # The stall's sample is above the 0.2 s bucket; the watchdog kept sampling.
    assert lag_bucket(after, "+Inf") - lag_bucket(after, "0.2") >= 1
    assert lag_bucket(after, "+Inf") > lag_bucket(before, "+Inf")
    await client.stream.aclose()
