"""A ratchet on the single-node branches (issue 29: a single node is a cluster of one).

A line of ``trio_broker/`` saying ``replication is None``, ``term is None`` (or ``is not
None``) is, most of the time, code that tells a broker alone from a cluster's. So is
``in_cluster`` (the group coordinator's flag, gone: a node alone's coordinator is elected
leader of its one offsets partition as a cluster's is), and ``zookeeper_connect is (not)
None`` outside the configuration (``config.py``) and the cluster's own wiring
(``cluster/``): elsewhere it chooses a mode where a cluster of one would do. The data
path reads ``services.leaders`` instead, never None (services/local_replication.py), and
the admin handlers hand their changes to ``services.admin``, never None either
(services/topic_admin.py); what is left is mostly the coordinators.
The count may only go down: lower ``MAX_BRANCHES`` when you remove some.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PATTERN = re.compile(r"(replication|term) is (not )?None|\bin_cluster\b")
#: Counted outside :data:`WIRING`, where choosing by it is the point.
MODE_PATTERN = re.compile(r"zookeeper_connect is (not )?None")
WIRING = ("trio_broker/config.py", "trio_broker/cluster/")
#: An ``isinstance`` on a leader term's type: telling a cluster's term
#: (``LeaderPartition``) from a node alone's (``LocalTerm``) is the same branch by
#: another name (``partition/read.py``'s ``record_progress`` had one). Both are one
#: ``Term`` to the data path; only :data:`TERM_HOMES`, where the types are defined
#: and their rules written, may look at the type.
TERM_TYPE_PATTERN = re.compile(r"isinstance\([^)]*\b(LeaderPartition|LocalTerm|Term|LeaderTerm)\b")
TERM_HOMES = ("trio_broker/partition/", "trio_broker/replication/")

#: The count left by the wiring slice of issue 29 (70 in 29 files before the data-path
#: slice, 50 after it, 39 after the metadata-view slice, 20 after the admin slice, 13
#: after the coordinators' slice). With ``in_cluster`` and ``zookeeper_connect is None``
#: counted (the group coordinator's slice, which removed its ``in_cluster``): two more,
#: both in server/broker.py's wiring; the transaction coordinator's slice removed one of
#: them (a node alone's is the partitioned one, elected over its one
#: ``__transaction_state`` partition by an ``OwnPartition``, as its groups' is), and the
#: share coordinator's slice (issues 32 and 29) the other: a node alone is a share
#: coordinator of one, its ``__share_group_state`` partition led by an
#: ``OwnPartition``, its share state read and written through the same coordinator
#: and tables as a cluster's (no restore of its own at start). The 8 left are all
#: "this broker has no term for the partition" (``check_leader``, the write path's
#: NotLeader in partition/partition.py's ``led_term``, the marker channel, five in the
#: replica manager):
#: a fact about leadership, true alone too for a partition that does not exist, not a
#: mode; a node alone has a term for every partition it holds (``LocalReplication``),
#: so none of them tells one broker from many.
MAX_BRANCHES = 8

#: The data path's handlers: no branch at all (a node alone has a term too).
DATA_PATH = (
    "trio_broker/handlers/produce.py",
    "trio_broker/handlers/fetch.py",
    "trio_broker/handlers/list_offsets.py",
    "trio_broker/handlers/offset_for_leader_epoch.py",
    "trio_broker/handlers/share_fetch.py",
    "trio_broker/handlers/describe_producers.py",
)


#: The admin handlers, and those that find a coordinator or a topic for one: no branch
#: either (a node alone is its own controller and coordinator).
ADMIN = (
    "trio_broker/handlers/create_topics.py",
    "trio_broker/handlers/delete_topics.py",
    "trio_broker/handlers/create_partitions.py",
    "trio_broker/handlers/alter_configs.py",
    "trio_broker/handlers/incremental_alter_configs.py",
    "trio_broker/handlers/describe_configs.py",
    "trio_broker/handlers/elect_leaders.py",
    "trio_broker/handlers/alter_partition_reassignments.py",
    "trio_broker/handlers/list_partition_reassignments.py",
    "trio_broker/handlers/find_coordinator.py",
    "trio_broker/handlers/offsets.py",
)


#: The coordinators and the write path they share: no branch either (a node alone's
#: coordinators write their own logs through an ``OwnLog``, a cluster of one).
COORDINATORS = (
    "trio_broker/services/internal_topics.py",
    "trio_broker/services/txn_markers.py",
    "trio_broker/handlers/write_txn_markers.py",
    "trio_broker/handlers/share_persist.py",
    "trio_broker/handlers/share_group_state.py",
    "trio_broker/handlers/share_admin.py",
    "trio_broker/groups/share_coordinator.py",
    "trio_broker/handlers/consumer_group_heartbeat.py",
    "trio_broker/transactions/coordinator.py",
    "trio_broker/transactions/partitioned.py",
    "trio_broker/groups/coordinator.py",
    "trio_broker/groups/offsets_store.py",
    "trio_broker/groups/own_offsets.py",
)

#: The one write path keeps one line: ``led_term``'s "no term here: NotLeader" (moved
#: from partition/append.py's ``leader_epoch_of`` when the append came to take a
#: Partition), a cluster's fact (this broker leads elsewhere), not a mode.
APPEND_PATH = "trio_broker/partition/partition.py"


def branch_lines(root: Path) -> Counter[str]:
    """Lines matching :data:`PATTERN` (or :data:`MODE_PATTERN` outside :data:`WIRING`),
    per file (relative to the repository)."""
    counts: Counter[str] = Counter()
    for path in sorted((root / "trio_broker").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        wiring = name.startswith(WIRING)
        term_home = name.startswith(TERM_HOMES)
        for line in path.read_text(encoding="utf-8").splitlines():
            if (
                PATTERN.search(line)
                or (not wiring and MODE_PATTERN.search(line))
                or (not term_home and TERM_TYPE_PATTERN.search(line))
            ):
                counts[name] += 1
    return counts


def test_the_count_of_single_node_branches_only_goes_down() -> None:
    counts = branch_lines(ROOT)
    total = sum(counts.values())
    listing = "\n".join(f"  {n:3d} {name}" for name, n in sorted(counts.items()))
    print(f"{total} single-node branch lines in {len(counts)} files:\n{listing}")
    assert total <= MAX_BRANCHES, (
        f"{total} lines match {PATTERN.pattern!r} (at most {MAX_BRANCHES}): read "
        f"services.leaders (never None) on the data path instead\n{listing}"
    )


def test_the_data_path_handlers_have_none() -> None:
    counts = branch_lines(ROOT)
    assert {name: counts[name] for name in DATA_PATH if counts[name]} == {}


def test_the_admin_handlers_have_none() -> None:
    counts = branch_lines(ROOT)
    assert {name: counts[name] for name in ADMIN if counts[name]} == {}
    assert all((ROOT / name).exists() for name in ADMIN)


def test_the_coordinators_have_none() -> None:
    counts = branch_lines(ROOT)
    assert {name: counts[name] for name in COORDINATORS if counts[name]} == {}
    assert all((ROOT / name).exists() for name in COORDINATORS)
    assert counts[APPEND_PATH] <= 1


def test_the_pattern_finds_what_it_counts(tmp_path: Path) -> None:
    package = tmp_path / "trio_broker" / "handlers"
    package.mkdir(parents=True)
    (package / "a.py").write_text(
        "if replication is None:\n    pass\n"
        "x = None if term is None else 1\n"
        "if ctx.services.replication is not None and term is not None:\n    pass\n"
        "leaders = services.leaders  # no branch\n"
    )
    (package / "b.py").write_text(
        "if self.in_cluster:\n    pass\n"
        "def _coordinator_in_cluster() -> None: ...\n"  # a name that only contains it
        "if config.zookeeper_connect is None:\n    pass\n"
    )
    (tmp_path / "trio_broker" / "cluster").mkdir()
    (tmp_path / "trio_broker" / "cluster" / "c.py").write_text(
        "assert config.zookeeper_connect is not None\n"
    )
    (tmp_path / "trio_broker" / "config.py").write_text("if self.zookeeper_connect is not None:\n")
    (tmp_path / "trio_broker" / "services").mkdir()
    (tmp_path / "trio_broker" / "services" / "d.py").write_text(
        "if not isinstance(term, LeaderPartition):\n    return\n"
        "alone = isinstance(led.term, (LocalTerm, int))\n"
        "if isinstance(exc, OffsetOutOfRange):\n    pass\n"  # not a term type
    )
    (tmp_path / "trio_broker" / "replication").mkdir()
    (tmp_path / "trio_broker" / "replication" / "e.py").write_text(
        "assert isinstance(term, LeaderPartition)\n"  # where the term types live
    )
    assert branch_lines(tmp_path) == Counter(
        {
            "trio_broker/handlers/a.py": 3,
            "trio_broker/handlers/b.py": 2,
            "trio_broker/services/d.py": 2,
        }
    )


def test_the_data_path_asks_no_term_its_type() -> None:
    """A term's type is asked nowhere outside its homes (issue 29: a node alone's term
    takes a replica's fetch by the cluster's rules, so the data path never tells them
    apart); inside partition/ not either, where the one such branch was."""
    counts = Counter[str]()
    for path in sorted((ROOT / "trio_broker").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name.startswith("trio_broker/replication/"):
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if TERM_TYPE_PATTERN.search(line):
                counts[name] += 1
    assert counts == Counter()
