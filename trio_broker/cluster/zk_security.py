"""Which znodes the brokers lock, and how (``zookeeper.set.acl``; the login is
security/zookeeper_login.py).

As Kafka does: every znode gets an ACL that gives the brokers' ZooKeeper user everything
and the world read access, except under the sensitive roots (SCRAM credentials, broker
configs), which only the brokers may read. Pure: no trio, no kazoo.
"""

from __future__ import annotations

__all__ = ["SECURE_ROOTS", "SENSITIVE_ROOTS", "sensitive_path"]

#: The top-level znodes of a cluster's tree (those of Kafka's secure root paths that this
#: layout uses): what ``trio-broker cluster secure-zookeeper`` walks, besides the root.
SECURE_ROOTS = (
    "/brokers",
    "/cluster",
    "/config",
    "/controller",
    "/controller_epoch",
    "/kafka-acl",
    "/kafka-acl-extended",
    "/latest_producer_id_block",
    "/log_dir_event_notification",
)
#: Subtrees only the brokers may read (Kafka's sensitive paths): SCRAM salts and keys,
#: and per-broker configs, which may hold passwords.
SENSITIVE_ROOTS = ("/config/users", "/config/brokers")


def sensitive_path(path: str) -> bool:
    return any(path == root or path.startswith(root + "/") for root in SENSITIVE_ROOTS)
