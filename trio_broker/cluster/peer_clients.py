"""One connection to each other broker's inter-broker endpoint, for a broker's own
requests to its peers (transaction markers and verification, share-group state).

Each connection carries one request at a time (its lock): a Kafka connection answers in
order, and these callers wait for their answer anyway. A connection that failed is
forgotten, and the next request to that broker opens a new one; so is one whose broker
registered another endpoint since.
"""

from __future__ import annotations

from typing import Any

import trio

from trio_broker.cluster.broker_client import BrokerClient


class PeerClients:
    def __init__(self, replication: Any, purpose: str) -> None:
        """``purpose`` ends the client id (``broker-<id>-<purpose>``)."""
        self.replication = replication
        self.purpose = purpose
        self._clients: dict[int, tuple[BrokerClient, trio.Lock]] = {}

    def client(self, broker_id: int) -> tuple[BrokerClient, trio.Lock] | None:
        """The connection to ``broker_id`` and its lock; None while it is not registered."""
        found = self._clients.get(broker_id)
        registered = self.replication.view.brokers.get(broker_id)
        # The other broker's inter-broker endpoint, as the replica fetchers use.
        address = (
            None
            if registered is None
            else registered.endpoint(getattr(self.replication, "inter_broker_listener", None))
        )
        if address is None:
            return None
        if found is not None and (found[0].host, found[0].port) == address:
            return found
        host, port = address
        client = BrokerClient(
            host, port, f"broker-{self.replication.view.broker_id}-{self.purpose}",
            # A secured inter-broker listener: streams that log in (cluster/broker_node.py).
            getattr(self.replication, "open_marker_stream", None),
        )  # fmt: skip
        self._clients[broker_id] = (client, trio.Lock())
        return self._clients[broker_id]

    def forget(self, broker_id: int) -> None:
        """The connection failed: the next request opens a new one."""
        self._clients.pop(broker_id, None)

    async def close(self) -> None:
        for client, _lock in self._clients.values():
            await client.close()
        self._clients.clear()
