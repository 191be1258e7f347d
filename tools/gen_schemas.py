"""Generate ``trio_broker/protocol/_schemas.py`` from Kafka's JSON message schemas.

Kafka publishes one JSON file per request and response that says which fields
exist in which versions. kafka-python's wheel ships copies under
``kafka/protocol/schemas/resources/``; this development-time tool reads them and
writes only the field layouts (names, types, version ranges, tags, defaults) as
compact Python literals. No prose is carried over.

Schemas kafka-python does not ship (the KIP-848 and KIP-932 APIs) are read from
``tools/message_json/``: the field layouts of Kafka's files with the prose left out.

Run: ``.venv/bin/python tools/gen_schemas.py`` (needs kafka-python installed).
"""

from __future__ import annotations

import json
import pprint
import re
import sys
from pathlib import Path
from typing import Any

#: The APIs trio-broker declares. Add a name here and regenerate to grow the codec.
APIS = [
    "Produce",
    "Fetch",
    "ListOffsets",
    "Metadata",
    "OffsetCommit",
    "OffsetFetch",
    "FindCoordinator",
    "JoinGroup",
    "Heartbeat",
    "LeaveGroup",
    "SyncGroup",
    "DescribeGroups",
    "ListGroups",
    "SaslHandshake",
    "ApiVersions",
    "CreateTopics",
    "DeleteTopics",
    "DeleteRecords",
    "InitProducerId",
    "OffsetForLeaderEpoch",
    "DescribeConfigs",
    "AlterConfigs",
    "AlterReplicaLogDirs",
    "DescribeLogDirs",
    "SaslAuthenticate",
    "CreatePartitions",
    "DeleteGroups",
    "IncrementalAlterConfigs",
    "OffsetDelete",
    "DescribeCluster",
    "DescribeProducers",
    "DescribeAcls",
    "CreateAcls",
    "DeleteAcls",
    "DescribeClientQuotas",
    "AlterClientQuotas",
    "DescribeUserScramCredentials",
    "AlterUserScramCredentials",
    "AddPartitionsToTxn",
    "AddOffsetsToTxn",
    "EndTxn",
    "WriteTxnMarkers",
    "TxnOffsetCommit",
    "DescribeTransactions",
    "ListTransactions",
    "ElectLeaders",
    "AlterPartitionReassignments",
    "ListPartitionReassignments",
    "ListConfigResources",
    "DescribeTopicPartitions",
    "ConsumerGroupHeartbeat",
    "ConsumerGroupDescribe",
    "ShareGroupHeartbeat",
    "ShareGroupDescribe",
    "ShareFetch",
    "ShareAcknowledge",
    "DescribeShareGroupOffsets",
    "AlterShareGroupOffsets",
    "DeleteShareGroupOffsets",
    # Broker to broker: the share coordinator (groups/share_coordinator.py).
    "InitializeShareGroupState",
    "ReadShareGroupState",
    "WriteShareGroupState",
    "DeleteShareGroupState",
]

#: Layouts kafka-python's wheel lacks, taken from apache/kafka's message JSON (fields only).
EXTRA_RESOURCES = Path(__file__).resolve().parent / "message_json"

UNBOUNDED = 32767


def parse_versions(spec: str | None) -> tuple[int, int]:
    """'3+' -> (3, UNBOUNDED); '0-12' -> (0, 12); '5' -> (5, 5); 'none'/None -> (-1, -1)."""
    if spec is None or spec == "none":
        return (-1, -1)
    if spec.endswith("+"):
        return (int(spec[:-1]), UNBOUNDED)
    if "-" in spec:
        lo, hi = spec.split("-")
        return (int(lo), int(hi))
    return (int(spec), int(spec))


def load(path: Path) -> dict[str, Any]:
    text = re.sub(r"^\s*//.*$", "", path.read_text(), flags=re.M)
    return json.loads(text)


def convert_fields(fields: list[dict[str, Any]], common: dict[str, list[Any]]) -> tuple[Any, ...]:
    out = []
    for f in fields:
        ftype = f["type"]
        elem = ftype[2:] if ftype.startswith("[]") else ftype
        sub = f.get("fields")
        if sub is None and elem in common:
            sub = common[elem]
        versions = parse_versions(f.get("versions"))
        nullable = parse_versions(f.get("nullableVersions"))
        tagged = parse_versions(f.get("taggedVersions"))
        default = f.get("default")
        out.append(
            (
                f["name"],
                ftype,
                versions[0],
                versions[1],
                nullable[0],
                nullable[1],
                f.get("tag", -1),
                tagged[0],
                tagged[1],
                None if default is None else str(default),
                convert_fields(sub, common) if sub else None,
            )
        )
    return tuple(out)


def main() -> None:
    import kafka

    resources = Path(kafka.__file__).parent / "protocol" / "schemas" / "resources"
    messages: dict[str, Any] = {}
    for api in APIS:
        for kind in ("Request", "Response"):
            path = resources / f"{api}{kind}.json"
            if not path.exists():
                path = EXTRA_RESOURCES / path.name
            data = load(path)
            common = {c["name"]: c["fields"] for c in data.get("commonStructs", [])}
            valid = parse_versions(data["validVersions"])
            flexible = parse_versions(data.get("flexibleVersions"))[0]
            messages[data["name"]] = (
                data["apiKey"],
                kind.lower(),
                valid,
                flexible,
                convert_fields(data["fields"], common),
            )
    target = Path(__file__).resolve().parent.parent / "trio_broker" / "protocol" / "_schemas.py"
    header = (
        '"""Field layouts of Kafka messages, generated by tools/gen_schemas.py. Do not edit.\n\n'
        "MESSAGES[name] = (api_key, kind, (min_version, max_version), first_flexible_version,\n"
        "fields); a field is (name, type, min_v, max_v, nullable_min_v, nullable_max_v, tag,\n"
        'tagged_min_v, tagged_max_v, default, subfields). -1 means "never".\n"""\n\n'
        "# fmt: off\n"
        "from typing import Any\n\n"
        f"UNBOUNDED = {UNBOUNDED}\n\n"
        "MESSAGES: dict[str, Any] = "
    )
    target.write_text(header + pprint.pformat(messages, width=110, sort_dicts=True) + "\n")
    print(f"wrote {target} ({len(messages)} messages)", file=sys.stderr)


if __name__ == "__main__":
    main()
