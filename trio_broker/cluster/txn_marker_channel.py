"""Transaction markers in a cluster: each partition's leader writes the marker.

(And the partition leader's question to a coordinator on another broker, KIP-890's
verify-only AddPartitionsToTxn: :meth:`TxnMarkerChannel.ask_coordinator`, on the same
inter-broker connections.)

The coordinator (``transactions/coordinator.py``, one table per led
``__transaction_state`` partition) ends a transaction by calling
:meth:`TxnMarkerChannel.send`: every partition of the transaction, and the
``__consumer_offsets`` partition of every group it committed offsets for, gets a commit
or abort marker from its current leader (the cluster view):

- a partition this broker leads: appended here in this leader's epoch, and waited for
  until committed (synced, below the high watermark);
- another leader's: one WriteTxnMarkers request per broker over the inter-broker client,
  which answers once its markers are committed.

Partitions that answer a retriable error (NOT_LEADER_OR_FOLLOWER while leadership moves,
a broker that cannot be reached) are routed again after a back-off, as Kafka's
TransactionMarkerChannelManager does, until done; a partition whose topic is gone from
the cluster needs no marker. The attempt ends early (CoordinatorUnavailable, the
coordinator's ``recover`` retries later) when this broker no longer leads the
transaction's ``__transaction_state`` partition in the epoch the markers carry, or after
``MARKER_ATTEMPT_S``.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from trio_broker.cluster.broker_client import BrokerConnectionError
from trio_broker.cluster.peer_clients import PeerClients
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.replication.controller_rules import NO_LEADER
from trio_broker.services.internal_topics import CONSUMER_OFFSETS, TRANSACTION_STATE, partition_for
from trio_broker.services.txn_markers import write_marker_as_leader
from trio_broker.transactions.coordinator import CoordinatorUnavailable
from trio_broker.transactions.state import TopicPartition, TxnMetadata

__all__ = ["TxnMarkerChannel", "marker_targets", "route_markers"]

log = logging.getLogger("trio_broker.transactions")

#: WriteTxnMarkers v1 (flexible; v2 adds only transaction_version).
WRITE_TXN_MARKERS_VERSION = 1
#: One attempt to get every marker of a transaction written; then recover() goes on.
MARKER_ATTEMPT_S = 30.0
#: Between rounds for partitions that answered a retriable error.
RETRY_BACKOFF_S = 0.1
#: How long one WriteTxnMarkers request may take (its markers wait for the HW).
REQUEST_TIMEOUT_S = 15.0
#: AddPartitionsToTxn v4: the first with verify_only (KIP-890), broker to broker.
VERIFY_VERSION = 4
#: A Produce waits this long at most for the coordinator's verification.
VERIFY_TIMEOUT_S = 5.0
#: Answers after which a partition needs no more marker: done, or nothing of this
#: producer's transaction left to end there (a newer epoch already wrote).
FINISHED = frozenset({ErrorCode.NONE, ErrorCode.INVALID_PRODUCER_EPOCH})


def marker_targets(prepared: TxnMetadata, offsets_partitions: int) -> set[TopicPartition]:
    """Every partition that needs the transaction's marker: its data partitions and the
    ``__consumer_offsets`` partition of each of its groups."""
    targets = set(prepared.partitions)
    for group in prepared.groups:
        targets.add((CONSUMER_OFFSETS, partition_for(group, offsets_partitions)))
    return targets


def route_markers(
    targets: set[TopicPartition], view: Any
) -> tuple[dict[int, list[TopicPartition]], list[TopicPartition], list[TopicPartition]]:
    """(leader broker -> its partitions, partitions without a leader now, partitions whose
    topic or partition the cluster no longer has)."""
    by_leader: dict[int, list[TopicPartition]] = {}
    leaderless: list[TopicPartition] = []
    gone: list[TopicPartition] = []
    for topic, partition in sorted(targets):
        info = view.topics.get(topic)
        held = None if info is None else info.partitions.get(partition)
        if held is None:
            gone.append((topic, partition))
        elif held.leader == NO_LEADER or held.leader not in view.brokers:
            leaderless.append((topic, partition))
        else:
            by_leader.setdefault(held.leader, []).append((topic, partition))
    return by_leader, leaderless, gone


class TxnMarkerChannel:
    def __init__(self, broker: Any, replication: Any, *, offsets_partitions: int) -> None:
        #: The broker (topics, producers, durability, appends, groups, now_ms).
        self.broker = broker
        self.replication = replication
        #: offsets.topic.num.partitions: where each group's offsets live.
        self.offsets_partitions = offsets_partitions
        #: One connection per other broker, one request at a time on each.
        self._peers = PeerClients(replication, "txn")

    async def send(
        self, prepared: TxnMetadata, committed: bool, coordinator_epoch: int, txn_partition: int
    ) -> None:
        """Write every marker of ``prepared``; return once each is committed (or not
        needed). Raises CoordinatorUnavailable (module docstring)."""
        remaining = marker_targets(prepared, self.offsets_partitions)
        outcome = "commit" if committed else "abort"
        with trio.move_on_after(MARKER_ATTEMPT_S):
            while remaining:
                self._check_still_coordinator(txn_partition, coordinator_epoch)
                by_leader, _leaderless, gone = route_markers(remaining, self.replication.view)
                for tp in gone:
                    log.warning("%s: %s marker for %s-%d not needed: the partition is gone",
                                prepared.transactional_id, outcome, *tp)  # fmt: skip
                    remaining.discard(tp)
                answers: dict[TopicPartition, ErrorCode] = {}
                async with trio.open_nursery() as nursery:
                    for leader, partitions in by_leader.items():
                        nursery.start_soon(self._write_at, leader, partitions, prepared,
                                           committed, coordinator_epoch, answers)  # fmt: skip
                for tp, error in answers.items():
                    if error in FINISHED:
                        remaining.discard(tp)
                    elif error == ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                        raise CoordinatorUnavailable(
                            f"{tp[0]}-{tp[1]}: a newer coordinator wrote markers",
                            ErrorCode.NOT_COORDINATOR,
                        )
                    else:
                        log.info("%s: %s marker for %s-%d: %s; retrying",
                                 prepared.transactional_id, outcome, *tp, error.name)  # fmt: skip
                if remaining:
                    await trio.sleep(RETRY_BACKOFF_S)
            return
        raise CoordinatorUnavailable(
            f"{outcome} markers for {sorted(remaining)} not written within {MARKER_ATTEMPT_S} s"
        )

    def _check_still_coordinator(self, txn_partition: int, coordinator_epoch: int) -> None:
        term = self.replication.leader_term(TRANSACTION_STATE, txn_partition)
        if term is None or term.leader_epoch != coordinator_epoch:
            raise CoordinatorUnavailable(
                f"no longer the leader of {TRANSACTION_STATE}-{txn_partition} in epoch "
                f"{coordinator_epoch}",
                ErrorCode.NOT_COORDINATOR,
            )

    async def _write_at(
        self, leader: int, partitions: list[TopicPartition], prepared: TxnMetadata,
        committed: bool, coordinator_epoch: int, answers: dict[TopicPartition, ErrorCode],
    ) -> None:  # fmt: skip
        if leader == self.replication.view.broker_id:
            async with trio.open_nursery() as nursery:
                for topic, partition in partitions:
                    nursery.start_soon(self._write_here, topic, partition, prepared, committed,
                                       coordinator_epoch, answers)  # fmt: skip
            return
        answers.update(
            await self._write_remote(leader, partitions, prepared, committed, coordinator_epoch)
        )

    async def _write_here(
        self, topic: str, partition: int, prepared: TxnMetadata, committed: bool,
        coordinator_epoch: int, answers: dict[TopicPartition, ErrorCode],
    ) -> None:  # fmt: skip
        answers[topic, partition] = await write_marker_as_leader(
            self.broker, topic, partition, prepared.producer_id, prepared.producer_epoch,
            committed, coordinator_epoch, self.broker.now_ms(),
        )  # fmt: skip

    async def _write_remote(
        self, leader: int, partitions: list[TopicPartition], prepared: TxnMetadata,
        committed: bool, coordinator_epoch: int,
    ) -> dict[TopicPartition, ErrorCode]:  # fmt: skip
        """One WriteTxnMarkers request to ``leader``; its per-partition answers (every
        partition NETWORK_EXCEPTION when it cannot be asked)."""
        Marker = m.WriteTxnMarkersRequest.WritableTxnMarker
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        request = m.WriteTxnMarkersRequest(markers=[Marker(
            producer_id=prepared.producer_id, producer_epoch=prepared.producer_epoch,
            transaction_result=committed, coordinator_epoch=coordinator_epoch,
            topics=[Marker.WritableTxnMarkerTopic(name=t, partition_indexes=ps)
                    for t, ps in by_topic.items()],
        )])  # fmt: skip
        unreachable = dict.fromkeys(partitions, ErrorCode.NETWORK_EXCEPTION)
        client = self._peers.client(leader)
        if client is None:
            return unreachable
        broker_client, lock = client
        async with lock:
            try:
                response = await broker_client.call(
                    m.ApiKey.WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION, request,
                    REQUEST_TIMEOUT_S,
                )  # fmt: skip
            except BrokerConnectionError as exc:
                log.info("WriteTxnMarkers to broker %d: %s", leader, exc)
                self._peers.forget(leader)
                return unreachable
        answers: dict[TopicPartition, ErrorCode] = {}
        for result in response.markers:
            for topic_result in result.topics:
                for part in topic_result.partitions:
                    answers[topic_result.name, part.partition_index] = ErrorCode(part.error_code)
        return {tp: answers.get(tp, ErrorCode.UNKNOWN_SERVER_ERROR) for tp in partitions}

    async def ask_coordinator(
        self, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: list[TopicPartition], txn_partition: int,
    ) -> dict[TopicPartition, ErrorCode]:  # fmt: skip
        """KIP-890's verification: AddPartitionsToTxn v4 with ``verify_only`` to the
        leader of ``__transaction_state``-``txn_partition``; each partition's error
        (NOT_COORDINATOR / NETWORK_EXCEPTION when that broker cannot answer now)."""
        info = self.replication.partition(TRANSACTION_STATE, txn_partition)
        leader = NO_LEADER if info is None else info.leader
        if leader == NO_LEADER or leader == self.replication.view.broker_id:
            return dict.fromkeys(partitions, ErrorCode.NOT_COORDINATOR)
        Txn = m.AddPartitionsToTxnRequest.AddPartitionsToTxnTransaction
        by_topic: dict[str, list[int]] = {}
        for topic, partition in partitions:
            by_topic.setdefault(topic, []).append(partition)
        request = m.AddPartitionsToTxnRequest(transactions=[Txn(
            transactional_id=transactional_id, producer_id=producer_id,
            producer_epoch=producer_epoch, verify_only=True,
            topics=[Txn.AddPartitionsToTxnTopic(name=t, partitions=ps)
                    for t, ps in by_topic.items()],
        )])  # fmt: skip
        client = self._peers.client(leader)
        if client is None:
            return dict.fromkeys(partitions, ErrorCode.NETWORK_EXCEPTION)
        broker_client, lock = client
        async with lock:
            try:
                response = await broker_client.call(
                    m.ApiKey.ADD_PARTITIONS_TO_TXN, VERIFY_VERSION, request, VERIFY_TIMEOUT_S
                )
            except BrokerConnectionError as exc:
                log.info("AddPartitionsToTxn (verify) to broker %d: %s", leader, exc)
                self._peers.forget(leader)
                return dict.fromkeys(partitions, ErrorCode.NETWORK_EXCEPTION)
        if response.error_code != ErrorCode.NONE:
            return dict.fromkeys(partitions, ErrorCode(response.error_code))
        answers: dict[TopicPartition, ErrorCode] = {}
        for result in response.results_by_transaction:
            for topic_result in result.topic_results:
                for part in topic_result.results_by_partition:
                    answers[topic_result.name, part.partition_index] = ErrorCode(
                        part.partition_error_code
                    )
        return {tp: answers.get(tp, ErrorCode.NETWORK_EXCEPTION) for tp in partitions}

    async def close(self) -> None:
        await self._peers.close()
