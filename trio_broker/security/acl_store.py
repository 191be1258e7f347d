"""Where ACL bindings live: ``<data_dir>/acls.json`` (file storage) or memory.

In a cluster the store holds a copy of the bindings in ZooKeeper
(``trio_broker/cluster/security_store.py`` keeps it with :meth:`AclStore.mirror`).

The file is rewritten whole on every change with ``write_file_atomically`` (temp
file, fsync, rename, fsync of the directory): a crash leaves the old or the new set,
never a torn one. ACL changes are rare; reads come from the in-memory list.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trio_broker.security.acl import (
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from trio_broker.storage.durable import write_file_atomically

ACL_FILE = "acls.json"
_FORMAT_VERSION = 1


def binding_to_json(binding: AclBinding) -> dict[str, Any]:
    return {
        "resource_type": binding.resource_type.name,
        "resource_name": binding.resource_name,
        "pattern_type": binding.pattern_type.name,
        "principal": binding.principal,
        "host": binding.host,
        "operation": binding.operation.name,
        "permission": binding.permission.name,
    }


def binding_from_json(data: dict[str, Any]) -> AclBinding:
    return AclBinding(
        resource_type=ResourceType[data["resource_type"]],
        resource_name=str(data["resource_name"]),
        pattern_type=PatternType[data["pattern_type"]],
        principal=str(data["principal"]),
        host=str(data["host"]),
        operation=Operation[data["operation"]],
        permission=Permission[data["permission"]],
    )


class AclStore:
    """The broker's ACL bindings; persisted when ``data_dir`` is given."""

    def __init__(self, data_dir: Path | None) -> None:
        self.path = None if data_dir is None else Path(data_dir) / ACL_FILE
        #: Insertion-ordered set: DescribeAcls lists bindings in creation order.
        self._bindings: dict[AclBinding, None] = {}
        if self.path is not None and self.path.exists():
            data = json.loads(self.path.read_bytes())
            if data.get("version") != _FORMAT_VERSION:
                raise ValueError(f"{self.path}: unknown ACL file version {data.get('version')!r}")
            for entry in data["acls"]:
                self._bindings[binding_from_json(entry)] = None

    def bindings(self) -> list[AclBinding]:
        return list(self._bindings)

    def current(self) -> Iterable[AclBinding]:
        """The bindings without a copy: changes replace the dict, never mutate it."""
        return self._bindings.keys()

    def __len__(self) -> int:
        return len(self._bindings)

    def add(self, bindings: Iterable[AclBinding]) -> None:
        """Add bindings (already validated); adding an existing one is a no-op, as in Kafka."""
        new = dict(self._bindings)
        for binding in bindings:
            new[binding] = None
        self._replace(new)

    def remove(self, filters: Iterable[AclFilter]) -> list[list[AclBinding]]:
        """Delete every binding each filter matches; the deleted ones, per filter."""
        removed: list[list[AclBinding]] = []
        new = dict(self._bindings)
        for acl_filter in filters:
            matched = [b for b in self._bindings if acl_filter.matches(b)]
            removed.append(matched)
            for binding in matched:
                new.pop(binding, None)
        if len(new) != len(self._bindings):
            self._replace(new)
        return removed

    def mirror(self, bindings: Iterable[AclBinding]) -> None:
        """Hold exactly ``bindings``: a cluster's copy of the ACLs in ZooKeeper
        (cluster/security_store.py), which writes them there, never to a file."""
        assert self.path is None, "a cluster's ACLs live in ZooKeeper, not in acls.json"
        self._bindings = dict.fromkeys(bindings)

    def _replace(self, bindings: dict[AclBinding, None]) -> None:
        if self.path is not None:
            body = {"version": _FORMAT_VERSION, "acls": [binding_to_json(b) for b in bindings]}
            write_file_atomically(self.path, json.dumps(body, indent=1).encode())
        self._bindings = bindings
