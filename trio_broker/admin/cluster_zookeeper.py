"""``trio-broker cluster secure-zookeeper``: lock (or unlock) an existing cluster's znodes.

What Kafka's ``zookeeper-security-migration`` does: a cluster that ran without
``zookeeper.set.acl`` has open znodes (``world:anyone:cdrwa``), and turning the setting
on only protects the znodes made afterwards. This walks the cluster's tree (its root,
the chroot or ``/``, and every znode under the top-level paths the brokers use) and sets
each znode's ACL: the brokers' user may do anything, the world may read, except the
SCRAM credentials and broker configs, which only the brokers may read
(cluster/zk_security.py). ``--unsecure`` sets ZooKeeper's open ACL again.

The order, as with Kafka: give every broker the login (``zookeeper.jaas.file``) and
restart them one at a time; then ``zookeeper.set.acl=true`` and restart them again; then
run this, with the same JAAS file. docs/security.md, "Cluster mode: threat model".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from trio_broker.config_errors import ConfigError
from trio_broker.security.zookeeper_login import read_client_login
from trio_broker.security.zookeeper_tls import ZooKeeperTls, read_tls_config_file

__all__ = [
    "add_secure_zookeeper_command",
    "run_secure_zookeeper",
    "zookeeper_login_argument",
    "zookeeper_tls_of",
]

CONNECT_TIMEOUT_S = 15.0


def zookeeper_login_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--zookeeper-jaas", type=Path, metavar="FILE",
                        help="log in to ZooKeeper as the Client section of this JAAS file "
                        "(the brokers' zookeeper.jaas.file); needed once the cluster's "
                        "znodes have ACLs")  # fmt: skip
    parser.add_argument("--zk-tls-config-file", type=Path, metavar="FILE",
                        help="reach ZooKeeper over TLS as this properties file says "
                        "(the brokers' zookeeper.ssl.* keys, as Kafka's tools take them)")  # fmt: skip


def zookeeper_tls_of(args: argparse.Namespace) -> ZooKeeperTls | None:
    """The TLS settings of ``--zk-tls-config-file`` (ConfigError if unusable); None: none."""
    path = getattr(args, "zk_tls_config_file", None)
    return read_tls_config_file(path) if path is not None else None


def add_secure_zookeeper_command(csub: Any) -> None:
    secure = csub.add_parser(
        "secure-zookeeper",
        help="set the ACLs of an existing cluster's znodes (after zookeeper.set.acl=true)",
    )
    secure.add_argument("--zookeeper", required=True, metavar="HOST:PORT[/CHROOT]",
                        help="the brokers' zookeeper.connect")  # fmt: skip
    zookeeper_login_argument(secure)
    secure.add_argument("--unsecure", action="store_true",
                        help="set ZooKeeper's open ACL instead (world:anyone:cdrwa)")  # fmt: skip
    secure.add_argument("--log-level", default="WARNING", help=argparse.SUPPRESS)


def run_secure_zookeeper(args: argparse.Namespace) -> int:
    # trio and the ZooKeeper client are imported here, not at the top: every CLI process
    # imports this module to build its parser (``cluster`` subcommands), few run it.
    import trio

    from trio_broker.cluster.coordination import CoordinationError

    if args.zookeeper_jaas is None:
        print("trio-broker: --zookeeper-jaas is required: the ACLs name its user, and "
              "changing ACLs it set needs its login", file=sys.stderr)  # fmt: skip
        return 2
    try:
        login = read_client_login(args.zookeeper_jaas)
        tls = zookeeper_tls_of(args)
        changed = trio.run(_run, args.zookeeper, login, tls, not args.unsecure)
    except ConfigError as exc:
        print(f"trio-broker: {exc}", file=sys.stderr)
        return 2
    except (CoordinationError, trio.TooSlowError) as exc:
        print(f"trio-broker: ZooKeeper at {args.zookeeper}: {exc or 'no answer'}", file=sys.stderr)
        return 1
    acl = "open" if args.unsecure else f"sasl:{login.username}"
    print(f"set the ACL of {len(changed)} znodes ({acl})")
    return 0


async def _run(hosts: str, login: Any, tls: ZooKeeperTls | None, secure: bool) -> list[str]:
    import trio

    from trio_broker.cluster.coordination import ZooKeeperCoordination

    # No set_acl: start() would lock the root before the walk, even with --unsecure.
    coord = ZooKeeperCoordination(hosts, login=login, tls=tls)
    with trio.fail_after(CONNECT_TIMEOUT_S):
        await coord.start(timeout_s=CONNECT_TIMEOUT_S)
    try:
        return await coord.set_acls_recursively(secure=secure)
    finally:
        await coord.stop()
