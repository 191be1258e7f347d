"""The web console: ``GET /`` on the metrics listener (docs/console.md).

A thin shell over the Kafka handlers: every page is answered by calling the handler
a Kafka client would reach (Metadata, DescribeConfigs, ListGroups, DescribeGroups,
OffsetFetch, ListOffsets, Fetch, CreateTopics, DeleteTopics) with a request built
here, so the console shows what a client would see, with the same authorization, and
in a cluster the same view. Only sizes (the local logs) and the live counters (the
broker's stats and latency histogram) are read directly.

Every answer is bounded: lists are pages (``limit`` capped), a record page holds at
most :data:`MAX_RECORDS` records of at most :data:`MAX_RECORD_BYTES` fetched bytes, and
decoding them runs in a worker thread.

Writes (create and delete a topic) are refused unless ``console.writes.enable`` is
true. When the broker authenticates its clients (an authorizer, or a SASL listener),
a write needs HTTP Basic credentials of a user the broker knows (``trio-broker users
add``, checked as a SASL PLAIN login), and runs as that principal, so ACLs decide.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote

import attrs
import trio

from trio_broker.handlers.base import ANONYMOUS, ClientInfo, Deferred, RequestContext
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.protocol.messages import API_KEY_NAMES, RequestHeader
from trio_broker.protocol.records import iter_batches
from trio_broker.security.sasl import PasswordCheck, SaslSession
from trio_broker.server.handler_pool import _run_deferred

log = logging.getLogger("trio_broker.console")

Broker = Any

#: Page sizes: the default and the cap of ``limit``.
DEFAULT_LIMIT = 50
MAX_LIMIT = 200
#: A topic page lists at most this many partitions of one topic.
MAX_PARTITIONS = 1000
MAX_RECORDS = 100
MAX_RECORD_BYTES = 1 << 20
#: A record's key or value is shown up to this many bytes.
MAX_SHOWN_BYTES = 2048
#: The largest request body (a topic to create) accepted.
MAX_BODY_BYTES = 64 * 1024
#: How long a verified Basic credential is trusted without salting the password again.
AUTH_CACHE_S = 60.0
CLIENT_ID = "trio-broker-console"
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
#: Kafka's ConfigResource.Type TOPIC.
TOPIC_RESOURCE = 2
LATEST = -1
FETCH_BY_NAME = 12
EARLIEST = -2


@attrs.frozen
class HttpRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    client_host: str


@attrs.frozen
class HttpAnswer:
    status: str
    body: bytes
    content_type: str = "application/json"
    extra_headers: tuple[tuple[str, str], ...] = ()


class ConsoleError(Exception):
    def __init__(self, status: str, message: str, *headers: tuple[str, str]) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


def is_console_path(path: str) -> bool:
    return path == "/" or path.startswith(("/console/", "/api/"))


def _json(data: Any, status: str = "200 OK") -> HttpAnswer:
    return HttpAnswer(status, json.dumps(data, separators=(",", ":")).encode())


def _asset(name: str) -> bytes:
    return resources.files("trio_broker.server").joinpath("console_assets", name).read_bytes()


def _int_arg(args: dict[str, list[str]], name: str, default: int, lo: int, hi: int) -> int:
    text = args.get(name, [str(default)])[0]
    try:
        value = int(text)
    except ValueError:
        raise ConsoleError("400 Bad Request", f"{name} must be an integer") from None
    return max(lo, min(hi, value))


def _show(data: bytes | None) -> str | None:
    """A key or value for the page: UTF-8 where it is, else hex; cut at MAX_SHOWN_BYTES."""
    if data is None:
        return None
    cut = data[:MAX_SHOWN_BYTES]
    try:
        text = cut.decode("utf-8")
    except UnicodeDecodeError:
        text = "0x" + cut.hex()
    return text + ("…" if len(data) > MAX_SHOWN_BYTES else "")


def decode_records(raw: bytes, start: int, limit: int) -> list[dict[str, Any]]:
    """Records from offset ``start`` on in fetched batches (worker thread: may decompress)."""
    out: list[dict[str, Any]] = []
    for batch in iter_batches(raw):
        if batch.is_control or batch.last_offset < start:
            continue
        for record in batch.records():
            offset = batch.offset_of(record)
            if offset < start:
                continue
            out.append({
                "offset": offset, "timestamp": batch.timestamp_of(record),
                "key": _show(record.key), "value": _show(record.value),
                "headers": [[h.key, _show(h.value)] for h in record.headers],
            })  # fmt: skip
            if len(out) >= limit:
                return out
    return out


class Console:
    """Answers the console's pages and JSON endpoints for one broker."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        #: sha256 of a verified "user:password" -> (principal, when verified).
        self._verified: dict[bytes, tuple[str, float]] = {}

    # ------------------------------------------------------------------ dispatch

    async def answer(self, request: HttpRequest) -> HttpAnswer:
        try:
            return await self._route(request)
        except ConsoleError as exc:
            return HttpAnswer(exc.status, json.dumps({"error": str(exc)}).encode(),
                              extra_headers=exc.headers)  # fmt: skip
        except Exception:  # a page's bug must not take the listener (and broker) down
            log.exception("console: %s %s failed", request.method, request.path)
            return HttpAnswer("500 Internal Server Error", b'{"error":"internal error"}')

    async def _route(self, request: HttpRequest) -> HttpAnswer:
        path, method = request.path, request.method
        args = parse_qs(request.query)
        if path == "/":
            self._only(method, "GET")
            return HttpAnswer("200 OK", _asset("index.html"), "text/html; charset=utf-8")
        if path.startswith("/console/"):
            self._only(method, "GET")
            name = path.removeprefix("/console/")
            if name not in ASSETS:
                raise ConsoleError("404 Not Found", "no such asset")
            return HttpAnswer("200 OK", _asset(name), ASSETS[name])
        if method not in ("GET", "POST", "DELETE"):
            raise ConsoleError("405 Method Not Allowed", "only GET, POST and DELETE")
        principal = await self._principal(request, write=method != "GET")
        parts = [unquote(p) for p in path.removeprefix("/api/").split("/")]
        match (method, parts):
            case ("GET", ["overview"]):
                return _json(await self.overview(principal))
            case ("GET", ["stats"]):
                return _json(self.stats())
            case ("GET", ["topics"]):
                offset = _int_arg(args, "offset", 0, 0, 1 << 31)
                limit = _int_arg(args, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
                return _json(await self.topics(principal, offset, limit))
            case ("POST", ["topics"]):
                return await self.create_topic(principal, request)
            case ("GET", ["topics", name]):
                return _json(await self.topic(principal, name))
            case ("DELETE", ["topics", name]):
                return await self.delete_topic(principal, name)
            case ("GET", ["topics", name, "partitions", partition, "records"]):
                index = _int_arg({"partition": [partition]}, "partition", 0, 0, 1 << 31)
                offset = _int_arg(args, "offset", 0, 0, 1 << 62)
                limit = _int_arg(args, "limit", 20, 1, MAX_RECORDS)
                return _json(await self.records(principal, name, index, offset, limit))
            case ("GET", ["groups"]):
                offset = _int_arg(args, "offset", 0, 0, 1 << 31)
                limit = _int_arg(args, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
                return _json(await self.groups(principal, offset, limit))
            case ("GET", ["groups", group_id]):
                return _json(await self.group(principal, group_id))
        raise ConsoleError("404 Not Found", "not found")

    @staticmethod
    def _only(method: str, allowed: str) -> None:
        if method != allowed:
            raise ConsoleError("405 Method Not Allowed", f"only {allowed}")

    # ------------------------------------------------------------------ who is asking

    @property
    def auth_required(self) -> bool:
        """Whether the broker authenticates its clients: an authorizer or a SASL listener."""
        broker = self.broker
        return bool(broker.config.authorizer_class_name) or any(
            spec.uses_sasl for spec in broker.listeners
        )

    async def _principal(self, request: HttpRequest, *, write: bool) -> str:
        """The principal the console asks the handlers as; refuses writes it may not do."""
        if write:
            if not self.broker.config.console_writes_enable:
                raise ConsoleError("403 Forbidden",
                                   "console writes are off (console.writes.enable=false)")  # fmt: skip
            # A JSON body or DELETE: a cross-site form cannot send either without CORS.
            if request.method == "POST" and not request.headers.get("content-type", "").startswith(
                "application/json"
            ):
                raise ConsoleError("415 Unsupported Media Type", "send application/json")
        credential = request.headers.get("authorization", "")
        if not credential:
            if write and self.auth_required:
                raise ConsoleError("401 Unauthorized", "log in with a broker user",
                                   ("WWW-Authenticate", 'Basic realm="trio-broker"'))  # fmt: skip
            return ANONYMOUS
        principal = await self._verify(credential)
        if principal is None:
            raise ConsoleError("401 Unauthorized", "wrong user or password",
                               ("WWW-Authenticate", 'Basic realm="trio-broker"'))  # fmt: skip
        return principal

    async def _verify(self, credential: str) -> str | None:
        """HTTP Basic checked as a SASL PLAIN login against the broker's SCRAM users."""
        scheme, _, token = credential.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, sep, password = base64.b64decode(token, validate=True).decode().partition(":")
        except ValueError:
            return None
        if not sep or not user or not password:
            return None
        key = hashlib.sha256(f"{user}:{password}".encode()).digest()
        now = time.monotonic()
        cached = self._verified.get(key)
        if cached is not None and now - cached[1] < AUTH_CACHE_S:
            return cached[0]
        broker = self.broker
        session = SaslSession(["PLAIN"], broker.credentials, 0, broker.sasl_decoy_secret)
        session.handshake("PLAIN")
        now_ms = broker.now_ms()
        check = session.authenticate(f"\0{user}\0{password}".encode(), now_ms)
        if isinstance(check, PasswordCheck):  # salting the password: off the event loop
            ok = await trio.to_thread.run_sync(check.run)
            session.password_checked(check, ok, now_ms)
        principal = session.principal if session.authenticated else None
        if principal is not None:
            if len(self._verified) > 1000:
                self._verified.clear()
            self._verified[key] = (principal, now)
        return principal

    async def _call(
        self, api_key: int, request: Any, principal: str, host: str = "", version: int = -1
    ) -> Any:
        """Ask the Kafka handler, as a client with ``principal`` would (at its newest
        version unless ``version`` is given)."""
        spec = self.broker.router[api_key]
        version = spec.max_version if version < 0 else version
        header = RequestHeader(api_key=api_key, api_version=version,
                               correlation_id=0, client_id=CLIENT_ID)  # fmt: skip
        ctx = RequestContext(header=header, services=self.broker,
                             client=ClientInfo(connection_id=-1, host=host or "127.0.0.1", port=0),
                             principal=principal)  # fmt: skip
        result = await spec.fn(ctx, request)
        if isinstance(result, Deferred):
            result = await _run_deferred(result)
        # A handler that answers at once never yields: a page making many calls (a page
        # of groups) gives the loop back between them.
        await trio.lowlevel.checkpoint()
        return result

    # ------------------------------------------------------------------ reads

    async def _metadata(self, principal: str, names: list[str] | None) -> Any:
        Req = m.MetadataRequest
        topics = None if names is None else [Req.MetadataRequestTopic(name=n) for n in names]
        return await self._call(m.ApiKey.METADATA, Req(
            topics=topics, allow_auto_topic_creation=False), principal)  # fmt: skip

    async def overview(self, principal: str) -> dict[str, Any]:
        meta = await self._metadata(principal, [])
        return {
            "cluster_id": meta.cluster_id, "controller_id": meta.controller_id,
            "node_id": self.broker.config.node_id,
            "brokers": [{"id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack,
                         "state": "controller" if b.node_id == meta.controller_id else "online"}
                        for b in meta.brokers],
            "writes_enabled": self.broker.config.console_writes_enable,
            "auth_required": self.auth_required,
            "serving": bool(self.broker.bound) and not self.broker.shutting_down,
        }  # fmt: skip

    def stats(self) -> dict[str, Any]:
        """Running totals; the page turns two of them into rates."""
        stats = self.broker.stats
        latency = self.broker.handler_pool.latency
        apis = {}
        for key in sorted(latency.buckets):
            apis[API_KEY_NAMES.get(key, str(key)).lower()] = {
                "count": latency.count(key), "seconds": latency.sums[key]}  # fmt: skip
        return {
            "time": time.monotonic(),
            "messages_in": sum(stats.topic_messages_in.values()),
            "bytes_in": sum(stats.topic_bytes_in.values()),
            "bytes_out": sum(stats.topic_bytes_out.values()),
            "apis": apis,
        }

    def _local_size(self, name: str, partition: int) -> int | None:
        topic = self.broker.topics.get(name)
        if topic is None or partition >= len(topic.logs):
            return None
        log_ = topic.logs[partition]
        return None if log_ is None else int(log_.size_bytes)

    async def _end_offsets(
        self, principal: str, partitions: dict[str, list[int]], when: int = LATEST
    ) -> dict[tuple[str, int], int | None]:
        Req = m.ListOffsetsRequest
        topics = [Req.ListOffsetsTopic(name=name, partitions=[
            Req.ListOffsetsTopic.ListOffsetsPartition(partition_index=p, timestamp=when,
                                                      current_leader_epoch=-1)
            for p in indexes]) for name, indexes in partitions.items()]  # fmt: skip
        if not topics:
            return {}
        response = await self._call(m.ApiKey.LIST_OFFSETS, Req(
            replica_id=-1, isolation_level=0, topics=topics), principal)  # fmt: skip
        return {(t.name, p.partition_index): p.offset if p.error_code == ErrorCode.NONE else None
                for t in response.topics for p in t.partitions}  # fmt: skip

    async def topics(self, principal: str, offset: int, limit: int) -> dict[str, Any]:
        meta = await self._metadata(principal, None)
        ordered = sorted(meta.topics, key=lambda t: t.name)
        page = ordered[offset : offset + limit]
        rows = []
        for i, t in enumerate(page):
            partitions = t.partitions
            rows.append({
                "name": t.name, "internal": t.is_internal, "partitions": len(partitions),
                "replication_factor": max((len(p.replica_nodes) for p in partitions), default=0),
                "under_replicated": sum(len(p.isr_nodes) < len(p.replica_nodes)
                                        for p in partitions),
                "size_bytes": sum(self._local_size(t.name, p.partition_index) or 0
                                  for p in partitions[:MAX_PARTITIONS]),
            })  # fmt: skip
            if i % 20 == 19:
                await trio.lowlevel.checkpoint()
        return {"total": len(ordered), "offset": offset, "limit": limit, "topics": rows}

    async def topic(self, principal: str, name: str) -> dict[str, Any]:
        meta = await self._metadata(principal, [name])
        [t] = meta.topics
        if t.error_code != ErrorCode.NONE:
            raise ConsoleError("404 Not Found", ErrorCode(t.error_code).name)
        partitions = sorted(t.partitions, key=lambda p: p.partition_index)[:MAX_PARTITIONS]
        indexes = [p.partition_index for p in partitions]
        ends = await self._end_offsets(principal, {name: indexes})
        starts = await self._end_offsets(principal, {name: indexes}, EARLIEST)
        Req = m.DescribeConfigsRequest
        described = await self._call(m.ApiKey.DESCRIBE_CONFIGS, Req(resources=[
            Req.DescribeConfigsResource(resource_type=TOPIC_RESOURCE, resource_name=name,
                                        configuration_keys=None)],
            include_synonyms=False, include_documentation=False), principal)  # fmt: skip
        [result] = described.results
        configs = [{"name": c.name, "value": None if c.is_sensitive else c.value,
                    "default": c.config_source == 5, "source": c.config_source}
                   for c in result.configs]  # fmt: skip
        return {
            "name": t.name, "internal": t.is_internal, "topic_id": str(t.topic_id),
            "partition_count": len(t.partitions),
            "partitions": [{
                "partition": p.partition_index, "leader": p.leader_id,
                "leader_epoch": p.leader_epoch, "replicas": list(p.replica_nodes),
                "isr": list(p.isr_nodes), "offline": list(p.offline_replicas),
                "start_offset": starts.get((name, p.partition_index)),
                "end_offset": ends.get((name, p.partition_index)),
                "size_bytes": self._local_size(name, p.partition_index),
            } for p in partitions],
            "configs_error": ErrorCode(result.error_code).name if result.error_code else None,
            "configs": configs,
        }  # fmt: skip

    async def records(
        self, principal: str, name: str, partition: int, offset: int, limit: int
    ) -> dict[str, Any]:
        Req = m.FetchRequest
        request = Req(
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=MAX_RECORD_BYTES,
            isolation_level=0, session_id=0, session_epoch=-1,
            topics=[Req.FetchTopic(topic=name, partitions=[Req.FetchTopic.FetchPartition(
                partition=partition, current_leader_epoch=-1, fetch_offset=offset,
                last_fetched_epoch=-1, log_start_offset=-1,
                partition_max_bytes=MAX_RECORD_BYTES)])],
            forgotten_topics_data=[], rack_id="",
        )  # fmt: skip
        # v12: the last version that names topics (v13+ take topic ids).
        response = await self._call(m.ApiKey.FETCH, request, principal, version=FETCH_BY_NAME)
        if response.error_code != ErrorCode.NONE:
            raise ConsoleError("400 Bad Request", ErrorCode(response.error_code).name)
        [topic] = response.responses
        [data] = topic.partitions
        answer: dict[str, Any] = {
            "topic": name, "partition": partition, "offset": offset,
            "high_watermark": data.high_watermark, "log_start_offset": data.log_start_offset,
            "error": ErrorCode(data.error_code).name if data.error_code else None,
            "records": [],
        }  # fmt: skip
        if data.error_code != ErrorCode.NONE or data.records is None:
            return answer
        raw = _records_bytes(data.records)
        answer["records"] = await trio.to_thread.run_sync(decode_records, raw, offset, limit)
        return answer

    async def groups(self, principal: str, offset: int, limit: int) -> dict[str, Any]:
        listed = await self._call(m.ApiKey.LIST_GROUPS, m.ListGroupsRequest(
            states_filter=[], types_filter=[]), principal)  # fmt: skip
        ordered = sorted(listed.groups, key=lambda g: g.group_id)
        rows = []
        for g in ordered[offset : offset + limit]:
            lag = await self._lag(principal, g.group_id, share=g.group_type == "share")
            rows.append({"group_id": g.group_id, "state": g.group_state, "type": g.group_type,
                         "protocol_type": g.protocol_type,
                         "lag": sum(p["lag"] or 0 for p in lag),
                         "partitions": len(lag)})  # fmt: skip
        return {"total": len(ordered), "offset": offset, "limit": limit, "groups": rows}

    async def group(self, principal: str, group_id: str) -> dict[str, Any]:
        share = await self._call(m.ApiKey.SHARE_GROUP_DESCRIBE, m.ShareGroupDescribeRequest(
            group_ids=[group_id], include_authorized_operations=False), principal)  # fmt: skip
        [s] = share.groups
        if s.error_code == ErrorCode.NONE:
            members = [{"member_id": mb.member_id, "client_id": mb.client_id,
                        "client_host": mb.client_host, "instance_id": None}
                       for mb in s.members]  # fmt: skip
            return {"group_id": group_id, "state": s.group_state, "protocol_type": "share",
                    "protocol": s.assignor_name, "members": members, "error": None,
                    "partitions": await self._lag(principal, group_id, share=True)}  # fmt: skip
        lag = await self._lag(principal, group_id)
        # A KIP-848 consumer group answers ConsumerGroupDescribe; a classic one does not.
        modern = await self._call(m.ApiKey.CONSUMER_GROUP_DESCRIBE, m.ConsumerGroupDescribeRequest(
            group_ids=[group_id], include_authorized_operations=False), principal)  # fmt: skip
        [c] = modern.groups
        if c.error_code == ErrorCode.NONE:
            members = [{"member_id": mb.member_id, "client_id": mb.client_id,
                        "client_host": mb.client_host, "instance_id": mb.instance_id}
                       for mb in c.members]  # fmt: skip
            return {"group_id": group_id, "state": c.group_state, "protocol_type": "consumer",
                    "protocol": c.assignor_name, "members": members, "error": None,
                    "partitions": lag}  # fmt: skip
        described = await self._call(m.ApiKey.DESCRIBE_GROUPS, m.DescribeGroupsRequest(
            groups=[group_id], include_authorized_operations=False), principal)  # fmt: skip
        [g] = described.groups
        members = [{"member_id": mb.member_id, "client_id": mb.client_id,
                    "client_host": mb.client_host, "instance_id": mb.group_instance_id}
                   for mb in g.members]  # fmt: skip
        return {"group_id": group_id, "state": g.group_state, "protocol_type": g.protocol_type,
                "protocol": g.protocol_data, "members": members,
                "error": ErrorCode(g.error_code).name if g.error_code else None,
                "partitions": lag}  # fmt: skip

    async def _lag(
        self, principal: str, group_id: str, share: bool = False
    ) -> list[dict[str, Any]]:
        """Per partition: committed offset, end offset (the high watermark), and lag. A
        share group's "committed" is its share-partition start offset (every record
        below it is acknowledged), and its lag is DescribeShareGroupOffsets' (Kafka's
        kafka-share-groups shows the same two)."""
        committed = await (self._share_starts if share else self._committed)(principal, group_id)
        wanted: dict[str, list[int]] = {}
        for name, index in committed:
            wanted.setdefault(name, []).append(index)
        ends = await self._end_offsets(principal, wanted)
        rows = []
        for (name, index), (at, share_lag) in sorted(committed.items()):
            end = ends.get((name, index))
            lag = share_lag if share_lag is not None else None if end is None else max(0, end - at)
            rows.append({"topic": name, "partition": index, "committed": at, "end": end,
                         "lag": lag})  # fmt: skip
        return rows

    async def _committed(
        self, principal: str, group_id: str
    ) -> dict[tuple[str, int], tuple[int, int | None]]:
        """A consumer group's committed offsets (its lag is counted from the end)."""
        Req = m.OffsetFetchRequest
        fetched = await self._call(m.ApiKey.OFFSET_FETCH, Req(
            groups=[Req.OffsetFetchRequestGroup(group_id=group_id, topics=None)],
            require_stable=False), principal)  # fmt: skip
        committed: dict[tuple[str, int], tuple[int, int | None]] = {}
        for g in fetched.groups:
            for t in g.topics:
                for p in t.partitions[:MAX_PARTITIONS]:
                    if p.error_code == ErrorCode.NONE and p.committed_offset >= 0:
                        committed[(t.name, p.partition_index)] = (p.committed_offset, None)
        return committed

    async def _share_starts(
        self, principal: str, group_id: str
    ) -> dict[tuple[str, int], tuple[int, int | None]]:
        """A share group's start offsets and lags, as DescribeShareGroupOffsets answers."""
        Req = m.DescribeShareGroupOffsetsRequest
        described = await self._call(m.ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, Req(
            groups=[Req.DescribeShareGroupOffsetsRequestGroup(group_id=group_id, topics=None)]),
            principal)  # fmt: skip
        starts: dict[tuple[str, int], tuple[int, int | None]] = {}
        for g in described.groups:
            for t in g.topics:
                for p in t.partitions[:MAX_PARTITIONS]:
                    if p.error_code == ErrorCode.NONE and p.start_offset >= 0:
                        lag = p.lag if p.lag >= 0 else None
                        starts[(t.topic_name, p.partition_index)] = (p.start_offset, lag)
        return starts

    # ------------------------------------------------------------------ writes

    async def create_topic(self, principal: str, request: HttpRequest) -> HttpAnswer:
        try:
            body = json.loads(request.body)
            name = str(body["name"])
            partitions = int(body.get("partitions", -1))
            replication = int(body.get("replication_factor", -1))
            configs = {str(k): str(v) for k, v in dict(body.get("configs", {})).items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ConsoleError("400 Bad Request", "expected {name, partitions?, "
                               "replication_factor?, configs?}") from None  # fmt: skip
        Req = m.CreateTopicsRequest
        Topic = Req.CreatableTopic
        response = await self._call(m.ApiKey.CREATE_TOPICS, Req(topics=[Topic(
            name=name, num_partitions=partitions, replication_factor=replication,
            assignments=[],
            configs=[Topic.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()],
        )], timeout_ms=30_000, validate_only=False), principal, request.client_host)  # fmt: skip
        [result] = response.topics
        return _write_answer(name, result.error_code, result.error_message, "201 Created")

    async def delete_topic(self, principal: str, name: str) -> HttpAnswer:
        Req = m.DeleteTopicsRequest
        response = await self._call(m.ApiKey.DELETE_TOPICS, Req(
            topics=[Req.DeleteTopicState(name=name)], topic_names=[], timeout_ms=30_000,
        ), principal)  # fmt: skip
        [result] = response.responses
        return _write_answer(name, result.error_code, result.error_message, "200 OK")


def _write_answer(name: str, code: int, message: str | None, ok: str) -> HttpAnswer:
    if code == ErrorCode.NONE:
        return _json({"name": name, "error": None}, ok)
    error = ErrorCode(code).name
    status = "403 Forbidden" if "AUTHORIZATION" in error else "400 Bad Request"
    if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        status = "404 Not Found"
    return _json({"name": name, "error": error, "message": message}, status)


def _records_bytes(records: Any) -> bytes:
    """The fetched bytes, file regions read here (at most MAX_RECORD_BYTES, page cache)."""
    parts = getattr(records, "parts", None)
    if parts is None:
        return bytes(records)
    return b"".join(p.read_bytes() if hasattr(p, "read_bytes") else bytes(p) for p in parts)
