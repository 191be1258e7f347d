"""``trio-broker topics|groups|produce|consume|log-dirs``: argument parsing and command bodies."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from trio_broker.admin.client import (
    DEFAULT_BOOTSTRAP as DEFAULT_BOOTSTRAP,  # re-exported: its old home
)
from trio_broker.admin.client import (
    AdminError,
    BlockingClient,
    add_bootstrap_argument,
    check,
    error_name,
)
from trio_broker.protocol import messages as m
from trio_broker.protocol.codec import RecordsChunks
from trio_broker.protocol.records import build_batch, iter_batches

EARLIEST, LATEST = -2, -1
PRODUCE_CHUNK = 500  # stdin lines per Produce request
#: DescribeConfigs ConfigSource values, as Kafka's AdminClient names them.
CONFIG_SOURCES = {
    -1: "UNKNOWN", 1: "DYNAMIC_TOPIC_CONFIG", 2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG", 4: "STATIC_BROKER_CONFIG", 5: "DEFAULT_CONFIG",
    6: "DYNAMIC_BROKER_LOGGER_CONFIG", 7: "CLIENT_METRICS_CONFIG",
}  # fmt: skip


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], out: TextIO) -> None:
    """Print rows as a left-aligned table under ``headers``."""
    cells = [[str(h) for h in headers], *[["" if c is None else str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), file=out)


def add_admin_commands(sub: Any) -> None:
    """Add the admin subcommands to the top-level subparsers ``sub``."""

    def common(p: argparse.ArgumentParser) -> None:
        add_bootstrap_argument(p)
        p.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")

    topics = sub.add_parser("topics", help="list, create, delete and describe topics")
    tsub = topics.add_subparsers(dest="topics_command", required=True)
    common(tsub.add_parser("list", help="list topics"))
    create = tsub.add_parser("create", help="create a topic")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--partitions", type=int, default=1)
    create.add_argument("--config", metavar="KEY=VALUE", nargs="+", action="extend", default=[],
                        help="topic config (repeatable)")  # fmt: skip
    common(create)
    delete = tsub.add_parser("delete", help="delete a topic")
    delete.add_argument("name", metavar="NAME")
    common(delete)
    describe = tsub.add_parser("describe", help="partitions, offsets and configs of a topic")
    describe.add_argument("name", metavar="NAME")
    common(describe)
    alter = tsub.add_parser("alter", help="add partitions to a topic")
    alter.add_argument("name", metavar="NAME")
    alter.add_argument("--partitions", type=int, required=True, metavar="N",
                       help="the new total partition count (more than now)")  # fmt: skip
    common(alter)

    log_dirs = sub.add_parser("log-dirs", help="the broker's log dir and each partition's size")
    log_dirs.add_argument("topics", metavar="TOPIC", nargs="*", help="only these topics")
    common(log_dirs)

    groups = sub.add_parser("groups", help="list and describe consumer groups")
    gsub = groups.add_subparsers(dest="groups_command", required=True)
    common(gsub.add_parser("list", help="list groups"))
    gdesc = gsub.add_parser("describe", help="members, committed offsets and lag of a group")
    gdesc.add_argument("group", metavar="GROUP")
    common(gdesc)

    produce = sub.add_parser("produce", help="produce stdin lines as records (acks=-1)")
    produce.add_argument("topic", metavar="TOPIC")
    produce.add_argument("--partition", type=int, default=0)
    produce.add_argument("--key", default=None, help="key for every record")
    common(produce)

    consume = sub.add_parser("consume", help="fetch records and print key/value")
    consume.add_argument("topic", metavar="TOPIC")
    consume.add_argument("--partition", type=int, default=0)
    consume.add_argument("--from-beginning", action="store_true",
                         help="start at the log start (default: the end)")  # fmt: skip
    consume.add_argument("--max", type=int, default=None, metavar="N", help="stop after N records")
    consume.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                         help="stop when nothing arrives for this long (default 5)")  # fmt: skip
    common(consume)


ADMIN_COMMANDS = ("topics", "groups", "produce", "consume", "log-dirs")


def run_admin(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run one admin command; errors go to stderr and give exit code 1."""
    # sys.stdout looked up per call, not at import: it may have been replaced since.
    out = out or sys.stdout
    try:
        with BlockingClient(args.bootstrap) as client:
            return _dispatch(client, args, out)
    except AdminError as exc:
        print(f"trio-broker: {exc}", file=sys.stderr)
        return 1


def _dispatch(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    if args.command == "topics":
        fn = {"list": topics_list, "create": topics_create, "delete": topics_delete,
              "describe": topics_describe, "alter": topics_alter}[args.topics_command]  # fmt: skip
    elif args.command == "groups":
        fn = {"list": groups_list, "describe": groups_describe}[args.groups_command]
    elif args.command == "log-dirs":
        fn = log_dirs_describe
    elif args.command == "produce":
        fn = produce
    else:
        fn = consume
    return fn(client, args, out)


# ----------------------------------------------------------------------------- topics


def topics_list(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    meta = client.metadata(None)
    rows = [(t.name, len(t.partitions), error_name(t.error_code))
            for t in sorted(meta.topics, key=lambda t: t.name or "")]  # fmt: skip
    table(["TOPIC", "PARTITIONS", "ERROR"], rows, out)
    return 0


def _parse_configs(items: list[str]) -> dict[str, str]:
    configs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise AdminError(f"--config wants KEY=VALUE, got {item!r}")
        configs[key] = value
    return configs


def topics_create(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    result = client.create_topic(args.name, args.partitions, _parse_configs(args.config))
    check(result.error_code, f"create {args.name}", result.error_message)
    print(f"created topic {args.name} with {result.num_partitions} partition(s)", file=out)
    return 0


def topics_delete(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    result = client.delete_topic(args.name)
    check(result.error_code, f"delete {args.name}", result.error_message)
    print(f"deleted topic {args.name}", file=out)
    return 0


def topics_describe(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    meta = client.metadata([args.name])
    topic = meta.topics[0]
    check(topic.error_code, f"describe {args.name}")
    parts = sorted(p.partition_index for p in topic.partitions)
    print(f"Topic: {args.name}  Partitions: {len(parts)}", file=out)
    if len(meta.brokers) > 1:
        _describe_cluster_partitions(meta, args.name, out)
    else:
        start = client.list_offsets(args.name, parts, EARLIEST)
        end = client.list_offsets(args.name, parts, LATEST)
        leaders = {p.partition_index: p.leader_id for p in topic.partitions}
        rows = [(p, leaders[p], start[p], end[p], end[p] - start[p]) for p in parts]
        table(["PARTITION", "LEADER", "START", "END", "RECORDS"], rows, out)
    configs = client.describe_topic_configs(args.name)
    if configs.error_code and len(meta.brokers) > 1:
        # In a cluster only brokers holding a replica know a topic's configs: ask a leader.
        brokers = {b.node_id: f"{b.host}:{b.port}" for b in meta.brokers}
        holder = next((p.leader_id for p in topic.partitions if p.leader_id in brokers), None)
        if holder is not None:
            with BlockingClient(brokers[holder]) as at_leader:
                configs = at_leader.describe_topic_configs(args.name)
    check(configs.error_code, f"DescribeConfigs {args.name}", configs.error_message)
    print("", file=out)
    rows2 = [(c.name, c.value, CONFIG_SOURCES.get(c.config_source, str(c.config_source)))
             for c in sorted(configs.configs, key=lambda c: c.name)]  # fmt: skip
    table(["CONFIG", "VALUE", "SOURCE"], rows2, out)
    return 0


def _describe_cluster_partitions(meta: m.MetadataResponse, name: str, out: TextIO) -> None:
    """A cluster's partitions: leader, replicas, ISR, offsets (asked of each leader) and
    ongoing moves (asked of the controller: "+3 -1" adds broker 3 and removes broker 1)."""
    brokers = {b.node_id: f"{b.host}:{b.port}" for b in meta.brokers}
    partitions = sorted(meta.topics[0].partitions, key=lambda p: p.partition_index)
    offsets: dict[int, tuple[int, int]] = {}
    for leader in {p.leader_id for p in partitions if p.leader_id in brokers}:
        led = [p.partition_index for p in partitions if p.leader_id == leader]
        try:
            with BlockingClient(brokers[leader]) as at_leader:
                start = at_leader.list_offsets(name, led, EARLIEST)
                end = at_leader.list_offsets(name, led, LATEST)
            offsets.update({p: (start[p], end[p]) for p in led})
        except AdminError:
            pass  # leadership moved meanwhile: shown as "-"
    moves: dict[int, Any] = {}
    if meta.controller_id in brokers:
        try:
            with BlockingClient(brokers[meta.controller_id]) as controller:
                moves = controller.list_partition_reassignments(
                    name, [p.partition_index for p in partitions]
                )
        except AdminError:
            pass

    def moving(index: int) -> str:
        move = moves.get(index)
        if move is None:
            return "-"
        return " ".join([*(f"+{b}" for b in move.adding_replicas),
                         *(f"-{b}" for b in move.removing_replicas)])  # fmt: skip

    rows = []
    for p in partitions:
        known = offsets.get(p.partition_index)
        first, last, records = ("-", "-", "-") if known is None else (*known, known[1] - known[0])
        rows.append((
            p.partition_index, p.leader_id, ",".join(map(str, p.replica_nodes)),
            ",".join(map(str, p.isr_nodes)), first, last, records,
            moving(p.partition_index),
        ))  # fmt: skip
    headers = ["PARTITION", "LEADER", "REPLICAS", "ISR", "START", "END", "RECORDS", "MOVING"]
    table(headers, rows, out)


def topics_alter(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    result = client.create_partitions(args.name, args.partitions)
    check(result.error_code, f"alter {args.name}", result.error_message)
    print(f"topic {args.name} now has {args.partitions} partition(s)", file=out)
    return 0


def log_dirs_describe(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    wanted = set(args.topics)
    for log_dir in client.describe_log_dirs():
        check(log_dir.error_code, f"log dir {log_dir.log_dir}")
        total = "-" if log_dir.total_bytes < 0 else log_dir.total_bytes
        usable = "-" if log_dir.usable_bytes < 0 else log_dir.usable_bytes
        print(f"Log dir: {log_dir.log_dir}  Total bytes: {total}  Usable bytes: {usable}", file=out)
        rows = [(t.name, p.partition_index, p.partition_size)
                for t in log_dir.topics if not wanted or t.name in wanted
                for p in t.partitions]  # fmt: skip
        table(["TOPIC", "PARTITION", "SIZE"], rows, out)
    return 0


# ----------------------------------------------------------------------------- groups


def groups_list(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    groups = sorted(client.list_groups(), key=lambda g: g.group_id)
    rows = [(g.group_id, g.group_state, g.protocol_type or "-") for g in groups]
    table(["GROUP", "STATE", "PROTOCOL"], rows, out)
    return 0


def groups_describe(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    group = client.describe_group(args.group)
    check(group.error_code, f"describe group {args.group}", group.error_message)
    protocol = f"{group.protocol_type}/{group.protocol_data}" if group.protocol_type else "-"
    print(f"Group: {group.group_id}  State: {group.group_state}  Protocol: {protocol}  "
          f"Members: {len(group.members)}", file=out)  # fmt: skip
    if group.members:
        rows = [(mb.member_id, mb.client_id, mb.client_host) for mb in group.members]
        table(["MEMBER", "CLIENT ID", "HOST"], rows, out)
    committed = client.offset_fetch(args.group)
    rows3: list[tuple[object, ...]] = []
    by_topic: dict[str, list[int]] = {}
    for topic, part in committed:
        by_topic.setdefault(topic, []).append(part)
    for topic in sorted(by_topic):
        parts = sorted(by_topic[topic])
        try:
            end = client.list_offsets(topic, parts, LATEST)
        except AdminError:
            end = {}
        for p in parts:
            offset = committed[(topic, p)]
            latest = end.get(p)
            lag = latest - offset if latest is not None and offset >= 0 else None
            rows3.append((topic, p, offset, latest, lag))
    print("", file=out)
    table(["TOPIC", "PARTITION", "COMMITTED", "END", "LAG"], rows3, out)
    return 0


# ----------------------------------------------------------------------------- produce / consume


def produce(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    key = None if args.key is None else args.key.encode()
    rows: list[tuple[str, int, int]] = []
    chunk: list[tuple[bytes | None, bytes | None]] = []

    def flush() -> None:
        base = client.produce(args.topic, args.partition, bytes(build_batch(chunk)))
        rows.extend((args.topic, args.partition, base + i) for i in range(len(chunk)))
        chunk.clear()

    for line in sys.stdin.buffer:
        chunk.append((key, line.rstrip(b"\r\n")))
        if len(chunk) >= PRODUCE_CHUNK:
            flush()
    if chunk:
        flush()
    table(["TOPIC", "PARTITION", "OFFSET"], rows, out)
    return 0


def _text(raw: Any) -> str:
    if raw is None:
        return "null"
    return bytes(raw).decode("utf-8", errors="backslashreplace")


def consume(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    which = EARLIEST if args.from_beginning else LATEST
    offset = client.list_offsets(args.topic, [args.partition], which)[args.partition]
    seen = 0
    deadline = time.monotonic() + args.timeout
    print("OFFSET\tKEY\tVALUE", file=out)
    while args.max is None or seen < args.max:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        part = client.fetch(args.topic, args.partition, offset, min(500, int(remaining * 1000)))
        check(part.error_code, f"Fetch {args.topic}[{args.partition}]")
        got = False
        records = part.records
        assert not isinstance(records, RecordsChunks)  # decoded: a view of the frame
        for batch in iter_batches(records or b""):
            if batch.is_control:
                offset = batch.next_offset
                continue
            for record in batch.records():
                at = batch.offset_of(record)
                if at < offset:
                    continue
                print(f"{at}\t{_text(record.key)}\t{_text(record.value)}", file=out)
                out.flush()
                seen += 1
                got = True
                offset = at + 1
                if args.max is not None and seen >= args.max:
                    break
            else:
                offset = max(offset, batch.next_offset)
                continue
            break
        if got:
            deadline = time.monotonic() + args.timeout
    print(f"consumed {seen} record(s)", file=sys.stderr)
    return 0
