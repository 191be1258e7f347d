"""``trio-broker`` command line.

``trio-broker serve`` is a stable interface: scripts and operators drive the
broker through its flags, and it logs ``listening on HOST:PORT`` once it
accepts connections.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

from trio_broker.config_errors import ConfigError, parse_host_port


def say(message: str) -> None:
    """``trio-broker: message`` on stderr in one write: print() writes the newline apart,
    and a log line from another thread (kazoo's) could land between the two."""
    sys.stderr.write(f"trio-broker: {message}\n")
    sys.stderr.flush()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trio-broker",
        description="A Kafka-compatible broker on Trio, and the tools around it.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the broker until SIGINT/SIGTERM")
    serve.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="address to listen on (default 127.0.0.1:9092; port 0 picks a free port)",
    )
    serve.add_argument(
        "--data-dir", metavar="DIR", type=Path, help="where logs live (default ./data)"
    )
    serve.add_argument(
        "--storage",
        choices=["file", "memory"],
        help="file (durable, default) or memory (throwaway)",
    )
    serve.add_argument(
        "--processing-model",
        choices=["serial", "pipelined"],
        help="serial (Kafka's one request per connection) or pipelined (default)",
    )
    serve.add_argument(
        "--advertised-listener", metavar="HOST:PORT", help="address given to clients in Metadata"
    )
    serve.add_argument(
        "--config",
        metavar="FILE",
        type=Path,
        help="config file: Kafka's server.properties (*.properties) or TOML, Kafka's key names",
    )
    serve.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    serve.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text (default) or json: one JSON object per log line",
    )
    serve.add_argument(
        "--capture",
        metavar="DIR",
        type=Path,
        help="write every request and response frame to Parquet files in DIR",
    )
    serve.add_argument(
        "--capture-paused",
        action="store_true",
        help="start with capture switched off (on: SIGUSR1 or trio-broker capture on)",
    )
    serve.add_argument(
        "--capture-records",
        choices=["headers", "full"],
        default="headers",
        help="record batches of Produce requests and Fetch responses: headers only "
        "(default: all verify needs) or full (needed by trio-broker replay)",
    )
    serve.add_argument(
        "--broker-id", metavar="N", type=int, help="this broker's id (node.id; default 0)"
    )
    serve.add_argument(
        "--zookeeper",
        metavar="HOST:PORT[/CHROOT]",
        help="join the cluster whose metadata is in this ZooKeeper (zookeeper.connect); "
        "without it the broker runs alone",
    )
    serve.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="serve Prometheus /metrics, /health and the web console on HOST:PORT "
        "(port 0 picks a free port)",
    )
    serve.add_argument(
        "--console-writes",
        action="store_true",
        default=None,
        help="let the web console create and delete topics (console.writes.enable=true)",
    )
    _add_verify_commands(sub)
    _add_admin_commands(sub)
    from trio_broker.admin.users import add_users_command

    add_users_command(sub)
    from trio_broker.admin.acls import add_acls_command

    add_acls_command(sub)
    from trio_broker.admin.quotas import add_quotas_command

    add_quotas_command(sub)
    from trio_broker.admin.cluster_up import add_cluster_command

    add_cluster_command(sub)
    return parser  # fmt: skip


def _add_verify_commands(sub: Any) -> None:
    verify = sub.add_parser("verify", help="check captured traffic with a PySpark job")
    verify.add_argument(
        "capture_dir", metavar="CAPTURE_DIR", type=Path, nargs="+",
        help="a capture directory; several (or one holding a capture per subdirectory) are "
        "checked together, e.g. the captures of every broker of a cluster",
    )  # fmt: skip
    verify.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    verify.add_argument("--report", metavar="DIR", type=Path, help="write report.json/html here")
    verify.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")
    capture = sub.add_parser("capture", help="capture tools")
    capture_sub = capture.add_subparsers(dest="capture_command", required=True)
    imp = capture_sub.add_parser("import", help="turn a tcpdump pcap into capture Parquet")
    imp.add_argument("pcap", metavar="FILE.pcap", type=Path)
    imp.add_argument(
        "--port", type=int, action="append", required=True, help="Kafka port (repeatable)"
    )
    imp.add_argument("--out", metavar="DIR", type=Path, required=True)
    imp.add_argument("--broker-id", type=int, default=0)
    imp.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    for action in ("on", "off", "status"):
        switch = capture_sub.add_parser(action, help=f"capture {action} on a running broker")
        switch.add_argument(
            "--metrics", metavar="HOST:PORT", required=True, help="the broker's --metrics-listen"
        )
        switch.add_argument("--log-level", default="WARNING", help="logging level")
    replay = sub.add_parser("replay", help="re-send a capture's requests to a broker")
    replay.add_argument("capture_dir", metavar="CAPTURE_DIR", type=Path)
    replay.add_argument("--to", metavar="HOST:PORT", required=True, help="the target broker")
    replay.add_argument(
        "--speed", type=_speed, default=1.0, help="pace x SPEED (default 1; 0: no pauses)"
    )
    replay.add_argument(
        "--capture", metavar="OUT_DIR", type=Path, help="record requests and responses here"
    )
    replay.add_argument("--log-level", default="WARNING", help="logging level")


def _add_admin_commands(sub: Any) -> None:
    """``topics``, ``groups``, ``produce``, ``consume``, ``log-dirs``: see trio_broker.admin."""
    from trio_broker.admin.commands import add_admin_commands

    add_admin_commands(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if getattr(args, "log_format", "text") == "json":
        from trio_broker.server.logging_setup import use_json_logs

        use_json_logs()
    if args.command == "serve":
        return _serve(args)
    if args.command == "verify":
        from trio_broker.verify.job import run_verify

        return run_verify(args.capture_dir, master=args.master, report_dir=args.report)
    if args.command == "users":
        from trio_broker.admin.users import run_users

        return run_users(args)
    if args.command == "acls":
        from trio_broker.admin.acls import run_acls

        return run_acls(args)
    if args.command == "quotas":
        from trio_broker.admin.quotas import run_quotas

        return run_quotas(args)
    if args.command == "cluster" and args.cluster_command == "secure-zookeeper":
        from trio_broker.admin.cluster_zookeeper import run_secure_zookeeper

        return run_secure_zookeeper(args)
    if args.command == "cluster":
        from trio_broker.admin.cluster_up import run_cluster

        return run_cluster(args)
    if args.command in ("topics", "groups", "produce", "consume", "log-dirs"):
        from trio_broker.admin.commands import run_admin

        return run_admin(args)
    if args.command == "capture" and args.capture_command == "import":
        from trio_broker.capture.pcap import import_pcap

        try:
            summary = import_pcap(args.pcap, set(args.port), args.out, broker_id=args.broker_id)
        except (OSError, ValueError) as exc:
            say(str(exc))
            return 2
        print(summary.describe())
        if not summary.requests:
            say(f"no Kafka requests to port(s) {args.port}")
            return 1
        return 0
    if args.command == "replay":
        from trio_broker.replay.driver import replay

        try:
            host, port = parse_host_port(args.to, "--to")
            replayed = replay(
                args.capture_dir, (host, port), speed=args.speed, out_dir=args.capture
            )
        except (ConfigError, OSError) as exc:
            say(str(exc))
            return 2
        print(replayed.describe())
        if replayed.partial:
            say(
                f"{replayed.partial} requests were captured only in part (batch "
                "headers or a prefix) and were not sent; to replay them, capture with "
                "`trio-broker serve --capture DIR --capture-records full`"
            )
        return 0 if replayed.sent and not replayed.failed_connections else 1
    if args.command == "capture":
        from trio_broker.capture.control import request_capture

        try:
            print(json.dumps(request_capture(args.metrics, args.capture_command)))
        except OSError as exc:
            say(str(exc))
            return 1
        return 0
    return 2


def _speed(text: str) -> float:
    """``replay --speed``: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _serve(args: argparse.Namespace) -> int:
    # The broker's modules (trio, the cluster's, the config's storage defaults) are imported
    # here, not at the top: the other commands are clients that need none of them, and
    # the suite starts hundreds of those processes.
    import trio

    from trio_broker.cluster.coordination import NotAuthorized
    from trio_broker.cluster.membership import BrokerIdInUse
    from trio_broker.config import load_config
    from trio_broker.server.broker import serve
    from trio_broker.server.gc_policy import GcPolicyError, apply_gc_policy, gen0_threshold

    overrides: dict[str, object] = {
        "data_dir": args.data_dir,
        "storage": args.storage,
        "processing_model": args.processing_model,
        "capture_dir": args.capture,
        "metrics_listener": args.metrics_listen,
        "console_writes_enable": args.console_writes,
        "node_id": args.broker_id,
        "zookeeper_connect": args.zookeeper,
    }
    try:
        if args.listen:
            overrides["host"], overrides["port"] = parse_host_port(args.listen, "--listen")
        if args.metrics_listen:
            parse_host_port(args.metrics_listen, "--metrics-listen")
        if args.advertised_listener:
            host, port = parse_host_port(args.advertised_listener, "--advertised-listener")
            overrides["advertised_host"], overrides["advertised_port"] = host, port
        config = load_config(args.config, **overrides)
        threshold = gen0_threshold(os.environ)
    except (ConfigError, GcPolicyError) as exc:
        say(str(exc))
        return 2
    raise_open_files_limit()
    # Last before the loop starts: what exists now (modules, the config) is frozen.
    apply_gc_policy(threshold)
    try:
        capture_full = args.capture_records == "full"
        trio.run(
            partial(serve, config, capture_on=not args.capture_paused, capture_full=capture_full)
        )
    except OSError as exc:
        say(str(exc))
        return 1
    except (BrokerIdInUse, NotAuthorized, BaseExceptionGroup) as exc:
        # Raised from inside the broker's nurseries: one line, not a traceback. (A
        # ZooKeeper login refused, or not the user the znodes' ACLs name, is no retry's.)
        fatal = _leaf(exc, BrokerIdInUse) or _leaf(exc, NotAuthorized)
        if fatal is None:
            raise
        say(str(fatal))
        return 1
    return 0


#: Where the soft limit stops when the hard one is unlimited (Linux's default nr_open).
OPEN_FILES_CEILING = 1 << 20


def raise_open_files_limit() -> None:
    """Raise the soft limit on open files to the hard one, as the JVM does for Kafka
    (HotSpot's MaxFDLimit, on by default): every segment, index and client connection is
    a descriptor, and the default soft limit (often 1024) runs out long before the
    hard one. Left as it is if the system refuses."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = OPEN_FILES_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass


def _leaf(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` if it is a ``kind``, else the first ``kind`` inside its exception groups."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _leaf(inner, kind)
            if found is not None:
                return found
    return None


if __name__ == "__main__":
    sys.exit(main())
