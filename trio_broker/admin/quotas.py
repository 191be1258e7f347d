"""``trio-broker quotas set|list``: change and show a running broker's client quotas over
AlterClientQuotas and DescribeClientQuotas (the connecting principal needs ALTER_CONFIGS /
DESCRIBE_CONFIGS on the cluster when ACLs are on). Changes apply at once and are kept in
the broker's data dir (``client-quotas.json``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from trio_broker.admin.client import AdminError, BlockingClient, add_bootstrap_argument, check
from trio_broker.admin.commands import table
from trio_broker.protocol import messages as m
from trio_broker.state.quota import (
    QuotaConfigError,
    check_quota,
    format_entity,
    parse_entity,
)

QUOTAS_API_VERSION = 1
MATCH_EXACT, MATCH_DEFAULT = 0, 1


def add_quotas_command(sub: Any) -> None:
    quotas = sub.add_parser("quotas", help="set and list client quotas (produce/fetch byte rates)")
    qsub = quotas.add_subparsers(dest="quotas_command", required=True)
    set_ = qsub.add_parser("set", help="set and/or remove quotas of one entity")
    set_.add_argument(
        "--entity", required=True, metavar="ENTITY",
        help="client-id=NAME, user=NAME, user=NAME,client-id=NAME, NAME may be <default>; "
        "'default' = client-id=<default>",
    )  # fmt: skip
    set_.add_argument("values", nargs="*", metavar="KEY=VALUE",
                      help="producer_byte_rate=BYTES/S, consumer_byte_rate=BYTES/S")  # fmt: skip
    set_.add_argument("--remove", action="append", default=[], metavar="KEY",
                      help="remove this quota key (repeatable)")  # fmt: skip
    list_ = qsub.add_parser("list", help="list the quotas in force")
    list_.add_argument("--entity", metavar="ENTITY", help="only this entity (exact match)")
    for p in (set_, list_):
        add_bootstrap_argument(p)
        p.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")


def _parse_values(items: list[str]) -> list[tuple[str, float]]:
    values = []
    for item in items:
        key, sep, text = item.partition("=")
        try:
            if not sep:
                raise ValueError
            value = float(text)
        except ValueError:
            raise AdminError(f"expected KEY=NUMBER, got {item!r}") from None
        try:
            check_quota(key, value)
        except QuotaConfigError as exc:
            raise AdminError(str(exc)) from None
        values.append((key, value))
    return values


def quotas_set(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    try:
        entity = parse_entity(args.entity)
    except QuotaConfigError as exc:
        raise AdminError(str(exc)) from None
    Req = m.AlterClientQuotasRequest
    ops = [
        Req.EntryData.OpData(key=k, value=v, remove=False) for k, v in _parse_values(args.values)
    ]
    ops += [Req.EntryData.OpData(key=k, value=0.0, remove=True) for k in args.remove]
    if not ops:
        raise AdminError("nothing to change: give KEY=VALUE and/or --remove KEY")
    body = Req(
        entries=[Req.EntryData(
            entity=[Req.EntryData.EntityData(entity_type=t, entity_name=n) for t, n in entity],
            ops=ops,
        )],
        validate_only=False,
    )  # fmt: skip
    response = client.call(m.ApiKey.ALTER_CLIENT_QUOTAS, QUOTAS_API_VERSION, body)
    for entry in response.entries:
        check(entry.error_code, f"quotas of {format_entity(entity)}", entry.error_message)
    print(f"quotas of {format_entity(entity)} changed", file=out)
    return 0


def quotas_list(client: BlockingClient, args: argparse.Namespace, out: TextIO) -> int:
    Req = m.DescribeClientQuotasRequest
    components = []
    strict = False
    if args.entity is not None:
        try:
            entity = parse_entity(args.entity)
        except QuotaConfigError as exc:
            raise AdminError(str(exc)) from None
        components = [
            Req.ComponentData(
                entity_type=t, match_type=MATCH_DEFAULT if n is None else MATCH_EXACT, match=n
            )
            for t, n in entity
        ]
        strict = True
    response = client.call(
        m.ApiKey.DESCRIBE_CLIENT_QUOTAS, QUOTAS_API_VERSION,
        Req(components=components, strict=strict),
    )  # fmt: skip
    check(response.error_code, "describe quotas", response.error_message)
    rows = [
        (format_entity(tuple((e.entity_type, e.entity_name) for e in entry.entity)), v.key,
         f"{v.value:g}")
        for entry in response.entries
        for v in entry.values
    ]  # fmt: skip
    table(["ENTITY", "QUOTA", "VALUE"], rows, out)
    return 0


def run_quotas(args: argparse.Namespace, out: TextIO | None = None) -> int:
    # sys.stdout looked up per call, not at import: it may have been replaced since.
    out = out or sys.stdout
    fn = {"set": quotas_set, "list": quotas_list}[args.quotas_command]
    try:
        with BlockingClient(args.bootstrap) as client:
            return fn(client, args, out)
    except AdminError as exc:
        print(f"trio-broker: {exc}", file=sys.stderr)
        return 1
