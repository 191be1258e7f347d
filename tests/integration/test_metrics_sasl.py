"""``trio_broker_sasl_failures_total{mechanism}``: librdkafka logs in with a wrong password.

An in-process broker with a SASL_PLAINTEXT listener and /metrics; a confluent-kafka
AdminClient with the right password succeeds, one with a wrong password is refused
(SASL_AUTHENTICATION_FAILED, then the broker closes the connection) and the
counter for its mechanism moves; the other mechanism's does not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from tests.integration.test_metrics import scrape, value
from trio_broker.config import BrokerConfig
from trio_broker.security.credentials import CredentialStore
from trio_broker.server.broker import Broker

USER, PASSWORD = "metrics-user", "right password"
MECHANISM = "SCRAM-SHA-256"


@pytest.fixture
def broker_config(tmp_path: Path) -> BrokerConfig:
    data_dir = tmp_path / "data"
    CredentialStore.in_data_dir(data_dir).add(USER, MECHANISM, PASSWORD)
    return BrokerConfig(
        port=0,
        data_dir=data_dir,
        storage="memory",
        metrics_listener="127.0.0.1:0",
        listeners="PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        security={"sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256"},
    )


def list_topics(port: int, password: str) -> bool:
    """True if the login worked (metadata arrived), False if it was refused."""
    admin = AdminClient(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": MECHANISM,
            "sasl.username": USER,
            "sasl.password": password,
            "reconnect.backoff.ms": 1000,
        }
    )
    try:
        admin.list_topics(timeout=3)
    except KafkaException:
        return False
    return True


async def test_failed_logins_are_counted_per_mechanism(broker: Broker) -> None:
    port = broker.listener_bound["SASL_PLAINTEXT"][1]
    assert await trio.to_thread.run_sync(list_topics, port, PASSWORD)
    ok = await scrape(broker)
    assert value(ok, "trio_broker_sasl_failures_total", mechanism=MECHANISM) == 0

    assert not await trio.to_thread.run_sync(list_topics, port, "wrong password")
    failed = await scrape(broker)
    assert value(failed, "trio_broker_sasl_failures_total", mechanism=MECHANISM) >= 1
    assert value(failed, "trio_broker_sasl_failures_total", mechanism="PLAIN") == 0
