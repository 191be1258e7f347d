"""One module per Kafka API. Importing a module registers its handler (see base.handles)."""

from __future__ import annotations

import importlib

#: Handler modules, imported once by :func:`load_handlers`.
MODULES = [
    "api_versions", "metadata", "produce", "fetch", "list_offsets", "create_topics",
    "delete_topics", "create_partitions", "describe_log_dirs", "alter_replica_log_dirs", "describe_configs", "describe_cluster", "offset_for_leader_epoch",
    "delete_records", "init_producer_id", "find_coordinator", "groups", "offsets",
    "describe_acls", "create_acls", "delete_acls", "alter_configs", "incremental_alter_configs",
    "describe_client_quotas", "alter_client_quotas",
    "sasl_handshake", "sasl_authenticate", "user_scram_credentials",
    "describe_producers", "describe_topic_partitions", "list_config_resources",
    "consumer_group_heartbeat", "consumer_group_describe",
    "share_group_heartbeat", "share_group_describe", "share_fetch", "share_acknowledge",
    "share_admin",
    "add_partitions_to_txn", "add_offsets_to_txn", "end_txn", "write_txn_markers",
    "describe_transactions", "list_transactions", "txn_offset_commit",
    "elect_leaders", "alter_partition_reassignments", "list_partition_reassignments",
]  # fmt: skip


def load_handlers() -> None:
    for name in MODULES:
        try:
            importlib.import_module(f"trio_broker.handlers.{name}")
        except ModuleNotFoundError as exc:
            # Modules land one issue at a time; a missing one just isn't advertised.
            if exc.name != f"trio_broker.handlers.{name}":
                raise
