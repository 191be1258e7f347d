"""One append path (issue 29): a leader's log is written only through
``trio_broker/partition/append.py``, a follower's only through its ``Partition``
(``partition/partition.py``'s ``append_as_follower``, the replica fetcher's); and that
append takes a ``Partition`` (log, term, producer state found by one lookup), made only
by ``partition/partition.py`` and ``Topic.make_leader``/``make_follower``, so that
nothing outside ``partition/`` pairs a log with a term for a write; ``Topic.make_leader``
and ``make_follower`` are called only where the broker takes a partition (the
replication), never on a lookup; and a log is truncated only through the follower's
``Partition`` (``truncate_to``, ``truncate_fully_and_start_at``: they keep its producer
state with the cut), which only the replica fetcher calls (the storage layer itself is
the listed exception, :data:`LOG_TRUNCATORS`).

Read from the source (``ast``, nothing imported), as tests/unit/project/test_import_cycles.py
reads imports. A call counts as a log append when its method is ``append`` or
``append_replicated``/``append_replicated_batches`` and either its receiver is named as
a log (``log``, ``log_``, ``self.log``, ``store.log``, ``partition_log``, an item of
``logs``) or it passes ``now_ms=`` (every log append does; ``list.append`` takes no
keyword). The tests on snippets below pin down what is and is not seen.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

from trio_broker.partition.append import append

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = ROOT / "trio_broker"

#: Where each kind of append may be called, relative to trio_broker/.
ALLOWED = {
    # The leader's write path: produce, coordinators, markers.
    "append": {"partition/append.py"},
    # The follower's: batches copied from the leader, through the follower's Partition
    # (``Partition.append_as_follower``, which the replica fetcher calls).
    "append_replicated": {"partition/partition.py"},
    "append_replicated_batches": {"partition/partition.py"},
}
#: The logs themselves (one log's method may call another's); not callers.
LOG_IMPLEMENTATIONS = {"storage/log.py", "storage/memory.py"}

_LOG_NAME = re.compile(r"(^|_)log_?$")


def _terminal_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript | ast.Call):
        return _terminal_name(node.value if isinstance(node, ast.Subscript) else node.func)
    return ""


def log_appends(source: str) -> list[tuple[int, str, str]]:
    """(line, method, receiver) of every call in ``source`` that appends to a log."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        method = node.func.attr
        if method not in ALLOWED:
            continue
        receiver = node.func.value
        name = _terminal_name(receiver)
        named_log = bool(_LOG_NAME.search(name)) or (
            isinstance(receiver, ast.Subscript) and name.endswith("logs")
        )
        if named_log or any(keyword.arg == "now_ms" for keyword in node.keywords):
            found.append((node.lineno, method, ast.unparse(receiver)))
    return found


def stray_appends(package: Path) -> list[str]:
    """Log appends outside the modules allowed to make them, as "file:line: call"."""
    stray = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative in LOG_IMPLEMENTATIONS:
            continue
        for line, method, receiver in log_appends(path.read_text(encoding="utf-8")):
            if relative not in ALLOWED[method]:
                stray.append(f"trio_broker/{relative}:{line}: {receiver}.{method}(...)")
    return stray


def test_logs_are_appended_to_only_through_the_partition_write_path() -> None:
    stray = stray_appends(PACKAGE)
    assert not stray, (
        "a log is appended to outside trio_broker/partition/append.py (the leader's one "
        "write path) and partition/partition.py (the follower's):\n" + "\n".join(stray)
    )


def test_the_write_path_itself_is_seen() -> None:
    # Guards the check: if it found nothing at all it would pass on any tree.
    source = (PACKAGE / "partition" / "append.py").read_text(encoding="utf-8")
    assert [method for _, method, _ in log_appends(source)] == ["append", "append"]
    follower = (PACKAGE / "partition" / "partition.py").read_text(encoding="utf-8")
    assert "append_replicated_batches" in [method for _, method, _ in log_appends(follower)]


def test_what_counts_as_a_log_append() -> None:
    source = textwrap.dedent(
        """
        log.append(buf, now_ms=now)
        self.log.append(batch, now_ms=now)
        store.log.append(batch)
        partition_log.append(batch)
        log_.append_replicated_batches(data, now_ms=1)
        topic.logs[index].append(buf)
        services.topics.log("t", 0).append(buf)
        writer.append(buf, now_ms=1, leader_epoch=3)

        parts.append(part)
        logs.append(log)
        log_lines.append("x")
        changelog.append(entry)
        log.appendleft(x)
        """
    )
    found = [receiver for _, _, receiver in log_appends(source)]
    assert found == [
        "log", "self.log", "store.log", "partition_log", "log_", "topic.logs[index]",
        "services.topics.log('t', 0)", "writer",
    ]  # fmt: skip


def test_a_stray_append_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "trio_broker"
    (package / "handlers").mkdir(parents=True)
    (package / "partition").mkdir()
    (package / "partition" / "append.py").write_text("log.append(b, now_ms=1)\n")
    (package / "handlers" / "produce.py").write_text("x = 1\nlog.append(b, now_ms=1)\n")
    (package / "handlers" / "fetch.py").write_text("log.append_replicated_batches(b)\n")
    assert stray_appends(package) == [
        "trio_broker/handlers/fetch.py:1: log.append_replicated_batches(...)",
        "trio_broker/handlers/produce.py:2: log.append(...)",
    ]


#: A log's truncations: a follower agreeing with its leader (``truncate_to``) or emptied
#: below its leader's log start (``truncate_fully_and_start_at``).
TRUNCATIONS = ("truncate_to", "truncate_fully_and_start_at")
#: Where a log's truncation may be named (called, or handed to a worker thread), relative
#: to trio_broker/, each with its reason. Recovery (``storage/recovery.py``,
#: ``storage/loader.py``) cuts a torn tail in its files before a log object exists and
#: the cleaner swaps segments (``storage/log_cleaning.py``): neither truncates through
#: the log's API, so neither is listed.
LOG_TRUNCATORS = {
    # The follower's Partition: the log cut, then the producer state of what was cut
    # dropped with it (Partition.truncate_to, Partition.truncate_fully_and_start_at).
    "partition/partition.py": "the follower's Partition keeps its producer state with the cut",
    # The storage layer itself: a backend's method may call another of its own.
    "storage/log.py": "the file log itself",
    "storage/log_truncation.py": "the file log's truncation itself",
    "storage/memory.py": "the memory log itself",
}
#: Where a Partition's truncation (its receiver named as a partition) may be called: the
#: replica fetcher, the follower's copy of its leader (Kafka's fetcher thread calling
#: Partition.truncateTo / truncateFullyAndStartAt).
PARTITION_TRUNCATORS = {"cluster/replica_fetcher.py"}

_PARTITION_NAME = re.compile(r"(^|_)partition_?$")


def truncations(source: str) -> list[tuple[int, str, str, bool]]:
    """(line, method, receiver, a Partition's) of every truncation in ``source``: a call
    ``x.truncate_to(...)``, or the method handed to a worker thread (the first argument
    of a ``run_sync(...)``); an attribute of that name read otherwise is data (a
    truncation plan's offset, ``step.truncate_to``). A receiver named as a partition
    (``partition``, ``partition_``, ``follower_partition``) counts as a Partition's; any
    other as a log's."""
    named: list[ast.Attribute] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr in TRUNCATIONS:
            named.append(node.func)
        if _terminal_name(node.func) == "run_sync" and node.args:
            handed = node.args[0]
            if isinstance(handed, ast.Attribute) and handed.attr in TRUNCATIONS:
                named.append(handed)
    return sorted(
        (
            attribute.lineno,
            attribute.attr,
            ast.unparse(attribute.value),
            bool(_PARTITION_NAME.search(_terminal_name(attribute.value))),
        )
        for attribute in named
    )


def stray_truncations(package: Path) -> list[str]:
    """A log's truncation outside :data:`LOG_TRUNCATORS`, a Partition's outside
    :data:`PARTITION_TRUNCATORS`, as "file:line: receiver.method"."""
    stray = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        for line, method, receiver, partition in truncations(path.read_text(encoding="utf-8")):
            allowed = PARTITION_TRUNCATORS if partition else LOG_TRUNCATORS
            if relative not in allowed:
                stray.append(f"trio_broker/{relative}:{line}: {receiver}.{method}")
    return stray


def test_logs_are_truncated_only_through_the_followers_partition() -> None:
    stray = stray_truncations(PACKAGE)
    assert not stray, (
        "a log is truncated outside partition/partition.py (the follower's Partition) and "
        "the storage layer, or a Partition outside the replica fetcher:\n" + "\n".join(stray)
    )
    # Guards the check: the Partition's two truncations of its log, and the fetcher's
    # two of its Partition, are seen.
    follower = truncations((PACKAGE / "partition" / "partition.py").read_text())
    assert [(m, r, p) for _, m, r, p in follower] == [
        ("truncate_to", "self.log", False),
        ("truncate_fully_and_start_at", "self.log", False),
    ]
    fetcher = truncations((PACKAGE / "cluster" / "replica_fetcher.py").read_text())
    assert sorted(m for _, m, _, p in fetcher if p) == list(sorted(TRUNCATIONS))


def test_what_counts_as_a_log_truncation(tmp_path: Path) -> None:
    package = tmp_path / "trio_broker"
    (package / "cluster").mkdir(parents=True)
    (package / "partition").mkdir()
    (package / "partition" / "partition.py").write_text("self.log.truncate_to(3)\n")
    (package / "cluster" / "replica_fetcher.py").write_text(
        "await trio.to_thread.run_sync(partition_.truncate_to, step.truncate_to)\n"
        "await trio.to_thread.run_sync(log_.truncate_fully_and_start_at, 9)\n"
        "if step.truncate_to < log_.log_end_offset:\n    pass\n"
    )
    (package / "cluster" / "replica_manager.py").write_text(
        "topic.logs[0].truncate_to(1)\npartition.truncate_fully_and_start_at(2)\n"
    )
    assert stray_truncations(package) == [
        "trio_broker/cluster/replica_fetcher.py:2: log_.truncate_fully_and_start_at",
        "trio_broker/cluster/replica_manager.py:1: topic.logs[0].truncate_to",
        "trio_broker/cluster/replica_manager.py:2: partition.truncate_fully_and_start_at",
    ]


#: The one place a ``Partition`` is constructed, relative to trio_broker/, and the
#: function doing it.
PARTITION_CONSTRUCTOR = ("partition/partition.py", "take_partition")
#: Where that constructor may be called, and in which function: the catalogue's
#: ``Topic.make_leader`` and ``Topic.make_follower`` (which keep the Partition they make)
#: and the coordinators' lookup (``coordinator_partition``).
PARTITION_TAKERS = {
    "partition/partition.py": {"coordinator_partition"},
    "services/topics.py": {"make_leader", "make_follower"},
}
#: Where ``Topic.make_leader`` may be called: where the broker takes a partition to lead
#: (a node alone when a log is opened, a cluster's replica manager when a term begins or
#: a led log is moved), never on a lookup (the guard, the marker writer, ``leading``).
LEADER_MAKERS = {
    "services/local_replication.py": {"take"},
    "cluster/replica_manager.py": {"_take"},
}
#: Where ``Topic.make_follower`` may be called: where a cluster's replica manager takes
#: a partition to follow (a new follower's role, a followed log moved), never on a
#: lookup (the replica fetcher only looks it up: ``Topic.replica``).
FOLLOWER_MAKERS = {"cluster/replica_manager.py": {"_follow"}}


def _imports_partition(tree: ast.Module) -> bool:
    """Whether ``tree`` imports the data path's ``Partition`` module or a name of it
    (a response message's ``Partition`` class is another)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.module == "trio_broker.partition.partition" or (
            node.module == "trio_broker.partition"
            and any(alias.name == "partition" for alias in node.names)
        ):
            return True
    return False


def calls_named(source: str, callee: str, *, defines: bool = False) -> list[tuple[int, str]]:
    """(line, enclosing function) of every call of ``callee`` (by its last name) in
    ``source``, if the module imports the data path's Partition module (or ``defines``
    it)."""
    found: list[tuple[int, str]] = []
    tree = ast.parse(source)
    if not defines and not _imports_partition(tree):
        return found

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = child.name
            if isinstance(child, ast.Call) and _terminal_name(child.func) == callee:
                found.append((child.lineno, inner))
            visit(child, inner)

    visit(tree, "")
    return found


def partitions_made(source: str, *, defines: bool = False) -> list[tuple[int, str]]:
    """(line, enclosing function) of every ``Partition(...)`` call of the data path's."""
    return calls_named(source, "Partition", defines=defines)


def stray_partitions(package: Path) -> list[str]:
    """``Partition(...)`` outside :data:`PARTITION_CONSTRUCTOR`, and ``take_partition(...)``
    outside :data:`PARTITION_TAKERS`, as "file:line: in f"."""
    stray = []
    home, constructor = PARTITION_CONSTRUCTOR
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        source = path.read_text(encoding="utf-8")
        defines = relative == home
        for line, function in partitions_made(source, defines=defines):
            if (relative, function) != PARTITION_CONSTRUCTOR:
                stray.append(f"trio_broker/{relative}:{line}: in {function or 'the module'}")
        for line, function in calls_named(source, constructor, defines=defines):
            if function not in PARTITION_TAKERS.get(relative, set()):
                stray.append(
                    f"trio_broker/{relative}:{line}: {constructor} in {function or 'the module'}"
                )
    return sorted(stray, key=lambda found: (found.split(":")[0], int(found.split(":")[1])))


def test_a_partition_is_constructed_in_one_place_called_by_its_two_takers() -> None:
    stray = stray_partitions(PACKAGE)
    assert not stray, (
        "a Partition (a log paired with a term) is constructed outside "
        "partition/partition.py's take_partition, or taken outside Topic.make_leader and "
        "coordinator_partition:\n" + "\n".join(stray)
    )
    # Guards the check: the constructor and both callers are seen.
    home, constructor = PARTITION_CONSTRUCTOR
    made = partitions_made((PACKAGE / home).read_text(), defines=True)
    assert [function for _, function in made] == [constructor]
    seen = {
        relative: {
            f
            for _, f in calls_named(
                (PACKAGE / relative).read_text(), constructor, defines=relative == home
            )
        }
        for relative in PARTITION_TAKERS
    }
    assert seen == PARTITION_TAKERS


def method_calls(source: str, method: str) -> list[tuple[int, str]]:
    """(line, enclosing function) of every call ``<x>.<method>(...)`` in ``source``."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = child.name
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Attribute)
                and child.func.attr == method
            ):
                found.append((child.lineno, inner))
            visit(child, inner)

    visit(ast.parse(source), "")
    return found


def stray_leader_makers(
    package: Path, method: str = "make_leader", makers: dict[str, set[str]] = LEADER_MAKERS
) -> list[str]:
    """``.make_leader(...)`` (or ``method``) calls outside :data:`LEADER_MAKERS` (or
    ``makers``), as "file:line: in f"."""
    stray = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        for line, function in method_calls(path.read_text(encoding="utf-8"), method):
            if function not in makers.get(relative, set()):
                stray.append(f"trio_broker/{relative}:{line}: in {function or 'the module'}")
    return stray


def test_a_partition_is_taken_where_the_broker_takes_it_never_on_a_lookup() -> None:
    stray = stray_leader_makers(PACKAGE)
    assert not stray, (
        "Topic.make_leader (a Partition taken to lead) is called outside the "
        "replication's take (LocalReplication.take, ReplicaManager._take):\n" + "\n".join(stray)
    )
    seen = {
        relative: {f for _, f in method_calls((PACKAGE / relative).read_text(), "make_leader")}
        for relative in LEADER_MAKERS
    }
    assert seen == LEADER_MAKERS  # guards the check: both takers are seen


def test_a_partition_is_followed_where_the_broker_follows_it_never_on_a_lookup() -> None:
    stray = stray_leader_makers(PACKAGE, "make_follower", FOLLOWER_MAKERS)
    assert not stray, (
        "Topic.make_follower (a Partition taken to follow) is called outside the replica "
        "manager's _follow:\n" + "\n".join(stray)
    )
    seen = {
        relative: {f for _, f in method_calls((PACKAGE / relative).read_text(), "make_follower")}
        for relative in FOLLOWER_MAKERS
    }
    assert seen == FOLLOWER_MAKERS  # guards the check: the taker is seen


def test_a_stray_leader_maker_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "trio_broker"
    (package / "handlers").mkdir(parents=True)
    (package / "services").mkdir()
    (package / "handlers" / "topic_lookup.py").write_text(
        "def leading_partition(topic):\n    return topic.make_leader(0, t, p)\n"
    )
    (package / "services" / "local_replication.py").write_text(
        "class L:\n    def take(self, topic):\n        topic.make_leader(0, t, p)\n"
    )
    assert stray_leader_makers(package) == [
        "trio_broker/handlers/topic_lookup.py:2: in leading_partition"
    ]


def test_the_catalogue_partition_is_made_when_taken_and_only_looked_up() -> None:
    """A node alone takes every partition when it opens its log (the catalogue's at
    start, a created topic's, partitions added); ``Topic.leading`` returns the one it
    took, the same object each time; a recreated topic gets a fresh one."""
    from trio_broker.partition.append import NotLeader
    from trio_broker.services.local_replication import LocalReplication
    from trio_broker.services.producers import ProducerStateRegistry
    from trio_broker.services.topics import TopicManager
    from trio_broker.storage.log import LogConfig

    topics = TopicManager(None, LogConfig(), lambda: 0)
    loaded = topics.create("loaded", 1)  # before the replication: as the catalogue's
    assert loaded.partitions == {}
    producers = ProducerStateRegistry(None, lambda: 0)
    leaders = LocalReplication.over(topics, producers=producers)
    assert loaded.leading(0).term is leaders.leader_term("loaded", 0)
    topic = topics.create("t", 1)
    first = topic.leading(0)
    assert topic.leading(0) is first and first.log is topics.log("t", 0)
    assert leaders.leader_term("t", 0) is first.term
    topics.add_partitions("t", 2)
    assert topic.leading(1).log is topics.log("t", 1) and topic.leading(0) is first
    topics.delete("t")
    again = topics.create("t", 1).leading(0)
    assert again is not first and again.log is topics.log("t", 0)
    topic.drop_partition(0)
    try:
        topic.leading(0)
    except NotLeader:
        pass
    else:
        raise AssertionError("a partition not taken is not led here")


def test_a_stray_partition_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "trio_broker"
    (package / "services").mkdir(parents=True)
    (package / "partition").mkdir()
    (package / "partition" / "partition.py").write_text(
        "def take_partition():\n    return Partition(1)\n"
        "def coordinator_partition():\n    return take_partition()\n"
        "def elsewhere():\n    return Partition(3)\n"
    )
    imports = "from trio_broker.partition.partition import Partition, take_partition\n"
    (package / "services" / "topics.py").write_text(
        imports + "def make_leader():\n    return take_partition(1)\n"
        "def other():\n    return take_partition(2)\n"
        "def direct():\n    return Partition(2)\n"
    )
    (package / "services" / "txn_markers.py").write_text(
        "from trio_broker.partition import partition as p\nled = p.Partition(t, i, log, x, term)\n"
    )
    # A response message's Partition class is not the data path's.
    (package / "services" / "answers.py").write_text("part = Partition(error_code=0)\n")
    assert stray_partitions(package) == [
        "trio_broker/partition/partition.py:6: in elsewhere",
        "trio_broker/services/topics.py:5: take_partition in other",
        "trio_broker/services/topics.py:7: in direct",
        "trio_broker/services/txn_markers.py:2: in the module",
    ]


def test_the_append_takes_a_partition_and_nothing_it_holds() -> None:
    """The write entry is given the Partition, never its log, term (or the epoch read
    from it), topic, index or producer state one by one: a caller cannot pair a log
    with another partition's term."""
    parameters = list(inspect.signature(append).parameters.values())
    assert parameters[0].name == "partition"
    assert parameters[0].annotation == "LedPartition"
    names = {p.name for p in parameters}
    assert not names & {"log", "term", "leader_epoch", "topic", "producers"}
