"""``trio-broker users ... --zookeeper HOST:PORT[/CHROOT]``: a cluster's SCRAM users.

The same conditional writes as AlterUserScramCredentials on a broker
(cluster/security_store.py), made from the command line: every broker of the cluster
follows ``/config/users`` and takes the change at once. Works while no broker runs too.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

import trio

from trio_broker.admin.cluster_zookeeper import zookeeper_tls_of
from trio_broker.cluster.coordination import (
    CoordinationError,
    NotAuthorized,
    ZooKeeperCoordination,
)
from trio_broker.cluster.security_store import ClusterSecurity
from trio_broker.config_errors import ConfigError
from trio_broker.security.credentials import (
    SCRAM_MECHANISMS,
    CredentialError,
    CredentialStore,
    credential_from_password,
)
from trio_broker.security.shared_store import SharedStoreError
from trio_broker.security.zookeeper_login import read_client_login

#: How long to wait for ZooKeeper to answer at all.
CONNECT_TIMEOUT_S = 15.0


def run_cluster_users(args: argparse.Namespace, password: str, out: TextIO) -> int:
    try:
        return trio.run(_run, args, password, out)
    except NotAuthorized as exc:
        hint = "" if args.zookeeper_jaas else " (its znodes have ACLs: pass --zookeeper-jaas)"
        print(f"trio-broker: ZooKeeper refused: {exc}{hint}", file=sys.stderr)
        return 2
    except (ConfigError, CoordinationError, SharedStoreError, CredentialError) as exc:
        print(f"trio-broker: {exc}", file=sys.stderr)
        return 2
    except trio.TooSlowError:
        print(f"trio-broker: ZooKeeper at {args.zookeeper} did not answer", file=sys.stderr)
        return 2


async def _run(args: argparse.Namespace, password: str, out: TextIO) -> int:
    # Logged in as the brokers, the znodes it makes get their ACLs too (as Kafka's tools
    # set ACLs when their ZooKeeper client has a SASL login).
    login = read_client_login(args.zookeeper_jaas) if args.zookeeper_jaas else None
    coord = ZooKeeperCoordination(
        args.zookeeper, login=login, set_acl=login is not None, tls=zookeeper_tls_of(args)
    )
    with trio.fail_after(CONNECT_TIMEOUT_S):
        await coord.start(timeout_s=CONNECT_TIMEOUT_S)
    try:
        users = ClusterSecurity(coord, None, CredentialStore(None))
        if args.users_command == "add":
            mechanisms = args.mechanism or SCRAM_MECHANISMS
            if not password:
                raise CredentialError("the password must not be empty")
            for mechanism in mechanisms:
                credential = credential_from_password(mechanism, password, args.iterations)
                await users.put_credential(args.user, mechanism, credential)
            print(f"user {args.user}: {', '.join(mechanisms)} (in ZooKeeper)", file=out)
            return 0
        if args.users_command == "delete":
            which = [args.mechanism] if args.mechanism else SCRAM_MECHANISMS
            found = [await users.delete_credential(args.user, m) for m in which]
            if not any(found):
                print(f"trio-broker: no such user/mechanism: {args.user}", file=sys.stderr)
                return 1
            print(f"deleted {args.user}" + (f" {args.mechanism}" if args.mechanism else ""),
                  file=out)  # fmt: skip
            return 0
        with trio.fail_after(CONNECT_TIMEOUT_S):
            await users.load(None)
        for user, mechs in sorted(users.credential_store.users().items()):
            described = ", ".join(
                f"{m} (iterations={c.iterations})" for m, c in sorted(mechs.items())
            )
            print(f"{user}\t{described}", file=out)
        return 0
    finally:
        await coord.stop()
