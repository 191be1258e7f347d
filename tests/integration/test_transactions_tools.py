"""Kafka's own kafka-transactions.sh (TransactionsCommand, kafka-tools 4.4) against us.

``list`` (ListTransactions on every broker) and ``describe`` (FindCoordinator key
type 1, then DescribeTransactions) through Kafka's Java admin client, while a
confluent-kafka producer holds a transaction open and after it commits.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from confluent_kafka import Producer

from tests.kafka_tools import tool
from trio_broker.server.broker import Broker

pytestmark = pytest.mark.timeout(300)


tools_classpath = tool.tools_classpath


def transactions_command(classpath: str, bootstrap: str, *args: str) -> list[list[str]]:
    """Run kafka-transactions.sh; its table's rows, split on whitespace (header first)."""
    done = tool.run_tool(classpath, "TransactionsCommand", "--bootstrap-server", bootstrap, *args)
    return [line.split() for line in done.stdout.splitlines() if line.strip()]


async def test_list_and_describe(
    broker: Broker, bootstrap: str, tools_classpath: str, tmp_path: Path
) -> None:
    broker.topics.create("tools-txn", 2)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "tools-1"})

    def open_transaction() -> None:
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce("tools-txn", value=b"x", partition=1)
        producer.flush(30)

    await trio.to_thread.run_sync(open_transaction)
    pid = broker.transactions.get("tools-1").producer_id
    rows = await trio.to_thread.run_sync(transactions_command, tools_classpath, bootstrap, "list")
    assert rows[0][:4] == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    assert ["tools-1", "0", str(pid), "Ongoing"] in rows[1:]
    described = await trio.to_thread.run_sync(
        transactions_command, tools_classpath, bootstrap, "describe",
        "--transactional-id", "tools-1",
    )  # fmt: skip
    header, row = described[0], described[1]
    fields = dict(zip(header, row, strict=False))
    assert (fields["TransactionalId"], fields["ProducerId"], fields["ProducerEpoch"]) == (
        "tools-1", str(pid), "0",
    )  # fmt: skip
    assert fields["TransactionState"] == "Ongoing"
    assert row[-1] == "tools-txn-1"  # TopicPartitions
    await trio.to_thread.run_sync(lambda: producer.commit_transaction(30))
    rows = await trio.to_thread.run_sync(transactions_command, tools_classpath, bootstrap, "list")
    assert ["tools-1", "0", str(pid), "CompleteCommit"] in rows[1:]
