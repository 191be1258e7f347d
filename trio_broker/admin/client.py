"""A small blocking Kafka client over :mod:`socket`, built on our codec (no Kafka libraries)."""

from __future__ import annotations

import argparse
import socket
import struct
from typing import Any

from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.schema import Message


class AdminError(Exception):
    """A request failed; ``code`` is the Kafka error code (or None for local failures)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"ERROR_{code}"


def check(code: int, what: str, message: str | None = None) -> None:
    """Raise :class:`AdminError` naming the Kafka error unless ``code`` is NONE."""
    if code != ErrorCode.NONE:
        detail = f" ({message})" if message else ""
        raise AdminError(f"{what}: {error_name(code)}{detail}", code)


DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    """``--bootstrap``, under Kafka's tools' name ``--bootstrap-server`` and kcat's ``-b``
    too, so their command lines carry over: HOST:PORT, or a comma-separated list of them
    tried in order."""
    parser.add_argument("--bootstrap", "--bootstrap-server", "-b", dest="bootstrap",
                        metavar="HOST:PORT[,HOST:PORT...]", default=DEFAULT_BOOTSTRAP,
                        help=f"broker address(es) (default {DEFAULT_BOOTSTRAP})")  # fmt: skip


def parse_bootstrap(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise AdminError(f"--bootstrap must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def parse_bootstrap_list(text: str) -> list[tuple[str, int]]:
    """HOST:PORT[,HOST:PORT...] (Kafka's bootstrap.servers form)."""
    addresses = [parse_bootstrap(item) for item in text.split(",") if item.strip()]
    if not addresses:
        raise AdminError(f"--bootstrap must be HOST:PORT, got {text!r}")
    return addresses


class BlockingClient:
    """One connection; :meth:`call` sends a request and returns the decoded response."""

    def __init__(self, bootstrap: str, *, timeout: float = 15.0, client_id: str = "trio-admin"):
        """``bootstrap``: HOST:PORT or a comma-separated list; the first that accepts the
        connection is used."""
        failures = []
        for host, port in parse_bootstrap_list(bootstrap):
            try:
                self.sock = socket.create_connection((host, port), timeout=timeout)
                break
            except ConnectionRefusedError:
                failures.append(f"{host}:{port}: connection refused")
            except OSError as exc:
                failures.append(f"{host}:{port}: {exc}")
        else:
            raise AdminError(f"cannot connect to {'; '.join(failures)}")
        self.client_id = client_id
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read_exactly(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise AdminError("broker closed the connection")
            buf += chunk
        return bytes(buf)

    def call(self, api_key: int, version: int, request: Message) -> Any:
        """Send ``request``, return the decoded response (Any: its class is the API key's;
        the helpers below name it)."""
        self.correlation_id += 1
        frame = m.encode_request(api_key, version, self.correlation_id, self.client_id, request)
        try:
            self.sock.sendall(frame)
            (size,) = struct.unpack(">i", self._read_exactly(4))
            body = self._read_exactly(size)
        except TimeoutError:
            raise AdminError("timed out waiting for the broker") from None
        except OSError as exc:
            raise AdminError(f"connection error: {exc}") from None
        correlation_id, response = m.decode_response(api_key, version, body)
        if correlation_id != self.correlation_id:
            raise AdminError(f"correlation id {correlation_id} != {self.correlation_id}")
        return response

    # ---------------------------------------------------------------- requests

    def metadata(self, topics: list[str] | None = None) -> m.MetadataResponse:
        Req = m.MetadataRequest
        req = Req(
            topics=None if topics is None else [Req.MetadataRequestTopic(name=t) for t in topics],
            allow_auto_topic_creation=False,
        )
        response: m.MetadataResponse = self.call(m.ApiKey.METADATA, 9, req)
        return response

    def create_topic(
        self, name: str, partitions: int, configs: dict[str, str], replication_factor: int = 1
    ) -> m.CreateTopicsResponse.CreatableTopicResult:
        Req = m.CreateTopicsRequest
        topic = Req.CreatableTopic(
            name=name,
            num_partitions=partitions,
            replication_factor=replication_factor,
            assignments=[],
            configs=[Req.CreatableTopic.CreatableTopicConfig(name=k, value=v)
                     for k, v in configs.items()],
        )  # fmt: skip
        resp: m.CreateTopicsResponse = self.call(
            m.ApiKey.CREATE_TOPICS, 5, Req(topics=[topic], timeout_ms=10000)
        )
        return resp.topics[0]

    def create_partitions(
        self, name: str, total: int
    ) -> m.CreatePartitionsResponse.CreatePartitionsTopicResult:
        Req = m.CreatePartitionsRequest
        topic = Req.CreatePartitionsTopic(name=name, count=total, assignments=None)
        req = Req(topics=[topic], timeout_ms=10000, validate_only=False)
        resp: m.CreatePartitionsResponse = self.call(m.ApiKey.CREATE_PARTITIONS, 3, req)
        return resp.results[0]

    def describe_log_dirs(self) -> list[m.DescribeLogDirsResponse.DescribeLogDirsResult]:
        """Every log dir of the broker with all its partitions (DescribeLogDirs v4)."""
        req = m.DescribeLogDirsRequest(topics=None)
        resp: m.DescribeLogDirsResponse = self.call(m.ApiKey.DESCRIBE_LOG_DIRS, 4, req)
        check(resp.error_code, "DescribeLogDirs")
        return resp.results

    def delete_topic(self, name: str) -> m.DeleteTopicsResponse.DeletableTopicResult:
        req = m.DeleteTopicsRequest(topic_names=[name], timeout_ms=10000)
        resp: m.DeleteTopicsResponse = self.call(m.ApiKey.DELETE_TOPICS, 4, req)
        return resp.responses[0]

    def describe_topic_configs(self, name: str) -> m.DescribeConfigsResponse.DescribeConfigsResult:
        Req = m.DescribeConfigsRequest
        res = Req.DescribeConfigsResource(resource_type=2, resource_name=name,
                                          configuration_keys=None)  # fmt: skip
        req = Req(resources=[res], include_synonyms=False, include_documentation=False)
        resp: m.DescribeConfigsResponse = self.call(m.ApiKey.DESCRIBE_CONFIGS, 4, req)
        return resp.results[0]

    def list_offsets(self, topic: str, partitions: list[int], timestamp: int) -> dict[int, int]:
        """partition -> offset for ``timestamp`` (-2 earliest, -1 latest)."""
        Req = m.ListOffsetsRequest
        parts = [Req.ListOffsetsTopic.ListOffsetsPartition(
            partition_index=p, current_leader_epoch=-1, timestamp=timestamp)
            for p in partitions]  # fmt: skip
        req = Req(replica_id=-1, isolation_level=0,
                  topics=[Req.ListOffsetsTopic(name=topic, partitions=parts)])  # fmt: skip
        resp: m.ListOffsetsResponse = self.call(m.ApiKey.LIST_OFFSETS, 5, req)
        out: dict[int, int] = {}
        for t in resp.topics:
            for p in t.partitions:
                check(p.error_code, f"ListOffsets {topic}[{p.partition_index}]")
                out[p.partition_index] = int(p.offset)
        return out

    def list_partition_reassignments(self, topic: str, partitions: list[int]) -> dict[int, Any]:
        """partition -> its ongoing move (replicas, adding, removing); ask the controller."""
        Req = m.ListPartitionReassignmentsRequest
        req = Req(timeout_ms=10000, topics=[
            Req.ListPartitionReassignmentsTopics(name=topic, partition_indexes=partitions)])  # fmt: skip
        resp: m.ListPartitionReassignmentsResponse = self.call(
            m.ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, req
        )
        check(resp.error_code, f"ListPartitionReassignments {topic}", resp.error_message)
        return {p.partition_index: p for t in resp.topics for p in t.partitions}

    def list_groups(self) -> list[m.ListGroupsResponse.ListedGroup]:
        resp: m.ListGroupsResponse = self.call(m.ApiKey.LIST_GROUPS, 4, m.ListGroupsRequest())
        check(resp.error_code, "ListGroups")
        return resp.groups

    def describe_group(self, group: str) -> m.DescribeGroupsResponse.DescribedGroup:
        req = m.DescribeGroupsRequest(groups=[group], include_authorized_operations=False)
        resp: m.DescribeGroupsResponse = self.call(m.ApiKey.DESCRIBE_GROUPS, 4, req)
        return resp.groups[0]

    def offset_fetch(self, group: str) -> dict[tuple[str, int], int]:
        """(topic, partition) -> committed offset for every committed partition."""
        resp: m.OffsetFetchResponse = self.call(
            m.ApiKey.OFFSET_FETCH, 7, m.OffsetFetchRequest(group_id=group, topics=None)
        )
        check(resp.error_code, f"OffsetFetch {group}")
        out: dict[tuple[str, int], int] = {}
        for t in resp.topics:
            for p in t.partitions:
                check(p.error_code, f"OffsetFetch {group} {t.name}[{p.partition_index}]")
                out[(t.name, p.partition_index)] = int(p.committed_offset)
        return out

    def produce(self, topic: str, partition: int, batch: bytes) -> int:
        Req = m.ProduceRequest
        data = Req.TopicProduceData(name=topic, partition_data=[
            Req.TopicProduceData.PartitionProduceData(index=partition, records=batch)])  # fmt: skip
        req = Req(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[data])
        resp: m.ProduceResponse = self.call(m.ApiKey.PRODUCE, 8, req)
        part = resp.responses[0].partition_responses[0]
        check(part.error_code, f"Produce {topic}[{partition}]", part.error_message)
        return int(part.base_offset)

    def fetch(
        self, topic: str, partition: int, offset: int, max_wait_ms: int
    ) -> m.FetchResponse.FetchableTopicResponse.PartitionData:
        Req = m.FetchRequest
        part = Req.FetchTopic.FetchPartition(partition=partition, current_leader_epoch=-1,
                                             fetch_offset=offset, log_start_offset=-1,
                                             partition_max_bytes=1 << 20)  # fmt: skip
        req = Req(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=4 << 20,
                  isolation_level=0, session_id=0, session_epoch=-1,
                  topics=[Req.FetchTopic(topic=topic, partitions=[part])],
                  forgotten_topics_data=[], rack_id="")  # fmt: skip
        resp: m.FetchResponse = self.call(m.ApiKey.FETCH, 11, req)
        check(resp.error_code, "Fetch")
        return resp.responses[0].partitions[0]
