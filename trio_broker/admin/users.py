"""``trio-broker users add|delete|list``: SCRAM users in a data dir, or a cluster's.

Passwords are never stored: ``add`` keeps a salt, the iteration count and the
SCRAM stored/server keys (see trio_broker.security.credentials). A running broker
re-reads the file at the next login, so no restart is needed. With ``--zookeeper``
the users are a cluster's, in ZooKeeper (``/config/users``), which every broker of it
follows (cluster/security_store.py).
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path
from typing import Any, TextIO

from trio_broker.admin.cluster_zookeeper import zookeeper_login_argument
from trio_broker.security.credentials import (
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    CredentialError,
    CredentialStore,
)


def add_users_command(sub: Any) -> None:
    users = sub.add_parser("users", help="add, delete and list SASL/SCRAM users (offline)")
    usub = users.add_subparsers(dest="users_command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", type=Path, default=Path("data"),
                       help="the broker's data dir (default ./data)")  # fmt: skip
        p.add_argument("--zookeeper", metavar="HOST:PORT[/CHROOT]",
                       help="a cluster's users, in its ZooKeeper (the brokers' "
                            "zookeeper.connect) instead of a data dir")  # fmt: skip
        zookeeper_login_argument(p)

    add = usub.add_parser("add", help="add a user or change its password")
    common(add)
    add.add_argument("--user", required=True)
    add.add_argument("--mechanism", action="append", choices=SCRAM_MECHANISMS,
                     help="repeatable; default both SCRAM-SHA-256 and SCRAM-SHA-512")  # fmt: skip
    secret = add.add_mutually_exclusive_group()
    secret.add_argument("--password", help="the password (visible in ps; prefer --password-file)")
    secret.add_argument("--password-file", type=Path, help="read the password from this file")
    add.add_argument("--iterations", type=int, default=MIN_ITERATIONS,
                     help=f"PBKDF2 iterations (default {MIN_ITERATIONS}, Kafka's minimum)")  # fmt: skip
    delete = usub.add_parser("delete", help="delete a user (or one of its mechanisms)")
    common(delete)
    delete.add_argument("--user", required=True)
    delete.add_argument("--mechanism", choices=SCRAM_MECHANISMS)
    common(usub.add_parser("list", help="list users and their mechanisms"))
    users.add_argument("--log-level", default="WARNING", help=argparse.SUPPRESS)


def run_users(args: argparse.Namespace, out: TextIO | None = None) -> int:
    # sys.stdout looked up per call, not at import: it may have been replaced since.
    out = out or sys.stdout
    if getattr(args, "zookeeper", None):
        from trio_broker.admin.cluster_users import run_cluster_users

        return run_cluster_users(args, _password(args) if args.users_command == "add" else "", out)
    store = CredentialStore.in_data_dir(args.data_dir)
    try:
        if args.users_command == "add":
            password = _password(args)
            for mechanism in args.mechanism or SCRAM_MECHANISMS:
                store.add(args.user, mechanism, password, args.iterations)
            print(f"user {args.user}: {', '.join(args.mechanism or SCRAM_MECHANISMS)}", file=out)
            return 0
        if args.users_command == "delete":
            if not store.delete(args.user, args.mechanism):
                print(f"trio-broker: no such user/mechanism: {args.user}", file=sys.stderr)
                return 1
            print(f"deleted {args.user}" + (f" {args.mechanism}" if args.mechanism else ""),
                  file=out)  # fmt: skip
            return 0
        for user, mechs in sorted(store.users().items()):
            described = ", ".join(
                f"{m} (iterations={c.iterations})" for m, c in sorted(mechs.items())
            )
            print(f"{user}\t{described}", file=out)
        return 0
    except (CredentialError, OSError, ValueError) as exc:
        print(f"trio-broker: {exc}", file=sys.stderr)
        return 2


def _password(args: argparse.Namespace) -> str:
    if args.password is not None:
        return str(args.password)
    if args.password_file is not None:
        return Path(args.password_file).read_text().rstrip("\n")
    return getpass.getpass(f"password for {args.user}: ")
