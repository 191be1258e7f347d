"""A ratchet on fixed sleeps in the tests (issue 30: every wait is a condition with a deadline).

A real-time sleep that stands in for synchronisation ("give the follower time to fetch")
passes on an idle machine and turns red on a busy one. This scans the test code for calls
named ``sleep`` or ``sleep_until`` and sets aside those that are not fixed waits:

- a **poll step**: inside a ``while`` loop of its function, or a ``for`` loop that can
  leave early (``break``, ``return``, ``raise``): a bounded retry;
- a **virtual clock**: under ``sim/`` or ``tests/sim/`` (the simulator runs on a
  MockClock), or in a function, or one enclosing it, that takes ``autojump_clock``;
- an entry of :data:`ALLOWED`: a fault's shape, a timing property under test, an
  observation window for something that must not happen, each with its reason.

What is left may only go down: lower :data:`MAX_FIXED` when you remove one. A new fixed
sleep needs a condition to wait for instead (the helpers are listed in
docs/testing-waits.md), or an entry here saying why time itself is the point.
"""

from __future__ import annotations

import ast
import functools
from collections import Counter
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("tests", "sim", "statemachine", "spec", "fuzz")
VIRTUAL = ("sim/", "tests/sim/")

#: Fixed sleeps outside :data:`ALLOWED`: none is left.
MAX_FIXED = 0

FAULT = "fault: the time is the fault's shape (an outage, an uptime, a slow disk), not a wait"
PROPERTY = "timing property under test: a timeout, lifetime or back-off must pass"
WINDOW = "observation window: shows that something does NOT happen within it"
PACING = "pacing: the load's shape (a rate, a slow client), not a wait"
FAKE = "a fake Services.sleep: the code under test sleeps (a yield, or on an autojump clock)"

#: (path, function) -> (sleeps in it, why each is a fixed time and not a wait).
ALLOWED: dict[tuple[str, str], tuple[int, str]] = {
    ("statemachine/test_broker_machine.py", "PowerCutBrokerMachine.power_cut_in_flight"): (
        1, f"{FAULT}: the drawn moment of the kill after an unanswered request is sent"),
    ("tests/cluster/jepsen.py", "run"): (
        3, f"{FAULT}: the seed's schedule: each fault's start and length, the run's end"),
    ("tests/cluster/test_cluster_faults.py", "test_paused_leader_becomes_a_harmless_zombie"): (
        1, f"{WINDOW}: survivors keep the live follower in the ISR for a session"),
    ("tests/cluster/test_loop_stall_session.py",
     "test_a_stall_of_half_the_session_timeout_costs_nothing"): (
        1, f"{WINDOW}: no expiry, reconnect or fence within a session after the stall"),
    ("tests/cluster/test_membership.py",
     "test_a_restart_waits_for_its_previous_runs_registration_to_go.expire_later"): (
        1, f"{FAULT}: the old registration stays 1 s; the test measures the wait for it"),
    ("tests/cluster/test_zookeeper_faults.py",
     "test_zookeeper_paused_within_the_session_changes_nothing"): (
        1, f"{FAULT}: ZooKeeper paused for half a session (no session may expire)"),
    ("tests/cluster/test_zookeeper_faults.py",
     "test_zookeeper_killed_and_restarted_after_the_session"): (
        1, f"{FAULT}: ZooKeeper down for a session and 2 s"),
    ("tests/cluster/test_zookeeper_faults.py", "test_zookeeper_down_acks_wait_for_isr_changes"): (
        3, f"{FAULT}: ZooKeeper down past the session; then a {WINDOW} (past the lag time, "
           "no acks=all while the shrunk ISR cannot be stored: nothing shows the proposal)"),
    ("tests/cluster/test_clean_shutdown.py", "test_sigterm_at_any_point_of_start_and_leadership_changes_exits_cleanly"): (
        1, f"{FAULT}: SIGTERM a drawn delay after the broker listened"),
    ("tests/differential/harness.py", "Pause.run"): (
        1, f"{PROPERTY}: a pause step lets the group timers run on both brokers"),
    ("tests/e2e/test_kafka_streams.py", "test_word_count_is_exact_across_a_broker_kill_9"): (
        1, f"{FAULT}: the outage between kill -9 and the restart"),
    ("tests/e2e/test_kafka_tools.py", "test_every_acknowledged_record_is_consumed_once_across_a_kill_9"): (
        1, f"{FAULT}: the outage between kill -9 and the restart"),
    ("tests/e2e/test_security.py", "test_librdkafka_reauthenticates_when_the_session_ends"): (
        1, f"{PROPERTY}: each produce comes a session lifetime after the last"),
    ("tests/integration/test_idempotence_oos.py", "ReorderingProxy.handle.release_later"): (
        1, f"{FAULT}: the proxy holds a request at most 1 s when no next one comes"),
    ("tests/integration/test_loop_watchdog.py",
     "test_a_stall_is_measured_and_names_the_request.hold_the_loop"): (
        1, f"{FAULT}: the stall of the event loop under test"),
    ("tests/integration/test_sasl.py", "test_an_expired_session_is_closed_even_for_api_versions"): (
        1, f"{PROPERTY}: the 300 ms SASL session runs out"),
    ("tests/reliability/test_create_partitions_crash.py",
     "test_kill9_during_and_after_create_partitions"): (1, f"{FAULT}: kill -9 a drawn time in"),
    ("tests/reliability/test_follower_power_cut.py", "run_driver"): (
        1, f"{FAULT}: the follower's drawn uptime before the power cut"),
    ("tests/reliability/test_fsync_faults.py",
     "test_slow_fsync_times_out_acks_all_produce.<lambda>"): (1, f"{FAULT}: a slow fsync"),
    ("tests/reliability/test_fsync_faults.py", "test_fsync_eio_is_a_storage_error_and_loses_nothing"): (
        1, f"{PROPERTY}: the 1 s back-off of the recovery probe passes (then a wait for it)"),
    ("tests/reliability/test_hostile_load.py", "test_slowloris_byte_at_a_time"): (
        1, f"{PACING}: slowloris clients send a byte every 20 ms"),
    ("tests/reliability/test_txn_crash_loop.py", "test_transactions_survive_kill_9_loop"): (
        2, f"{FAULT}: the drawn uptime and downtime of each kill -9"),
    ("tests/spark/test_spark_kafka.py", "WordProducer.produce"): (
        1, f"{PACING}: words at a steady rate"),
    ("tests/spark/test_spark_kafka.py", "test_word_counts_are_exact_across_a_broker_restart"): (
        2, f"{FAULT}: the broker goes down a third of the way into the words, for 2 s"),
    ("tests/unit/server/test_sync_thread.py",
     "test_a_cancelled_caller_still_waits_for_its_thread.slow"): (
        1, f"{FAULT}: a slow thread, outliving its caller's 10 ms deadline"),
    ("tests/unit/handlers/test_admin_path.py", "Services.sleep"): (1, FAKE),
    ("tests/unit/handlers/test_handler_effects.py", "Services.sleep"): (1, FAKE),
    ("tests/unit/transactions/test_txn_coordinator.py", "Services.sleep"): (1, FAKE),
}  # fmt: skip


@attrs.frozen
class Sleep:
    path: str
    line: int
    function: str  # the enclosing functions and classes, dotted ("<module>" at the top)
    kind: str  # "poll", "virtual" or "fixed"
    text: str


def _leaves_early(loop: ast.For | ast.AsyncFor) -> bool:
    """A ``for`` loop that can stop before its end: a bounded retry, not a schedule."""
    stack: list[ast.AST] = list(loop.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Break | ast.Return | ast.Raise):
            return True
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))
    return False


def _takes_autojump(node: ast.AST) -> bool:
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    return any(arg.arg == "autojump_clock" for arg in node.args.args + node.args.kwonlyargs)


def _classify(path: str, call: ast.Call, ancestors: list[ast.AST]) -> Sleep:
    names: list[str] = []
    in_loop, virtual = False, path.startswith(VIRTUAL)
    in_own_function = True
    for parent in reversed(ancestors):
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(parent.name)
            in_own_function = in_own_function and isinstance(parent, ast.ClassDef)
            virtual = virtual or _takes_autojump(parent)
        elif isinstance(parent, ast.Lambda):
            names.append("<lambda>")
            in_own_function = False
        elif in_own_function and (
            isinstance(parent, ast.While)
            or (isinstance(parent, ast.For | ast.AsyncFor) and _leaves_early(parent))
        ):
            in_loop = True
    kind = "virtual" if virtual else "poll" if in_loop else "fixed"
    function = ".".join(reversed(names)) if names else "<module>"
    return Sleep(path, call.lineno, function, kind, ast.unparse(call))


def sleeps(root: Path) -> list[Sleep]:
    """Every call named ``sleep`` or ``sleep_until`` in the scanned trees, classified."""
    found: list[Sleep] = []

    def visit(path: str, node: ast.AST, ancestors: list[ast.AST]) -> None:
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("sleep", "sleep_until"):
                found.append(_classify(path, node, ancestors))
        ancestors.append(node)
        for child in ast.iter_child_nodes(node):
            visit(path, child, ancestors)
        ancestors.pop()

    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            if "sleep" in source:  # most files have none: skip parsing them
                visit(path.relative_to(root).as_posix(), ast.parse(source), [])
    return found


def unlisted(found: list[Sleep]) -> list[Sleep]:
    return [s for s in found if s.kind == "fixed" and (s.path, s.function) not in ALLOWED]


@functools.cache
def found_here() -> list[Sleep]:
    return sleeps(ROOT)


def test_fixed_sleeps_only_go_down() -> None:
    found = found_here()
    kinds = Counter(s.kind for s in found)
    left = unlisted(found)
    listing = "\n".join(f"  {s.path}:{s.line} {s.function}: {s.text}" for s in left)
    print(
        f"{len(found)} sleep calls: {kinds['poll']} poll steps, {kinds['virtual']} on a "
        f"virtual clock, {kinds['fixed']} fixed ({kinds['fixed'] - len(left)} allowed with "
        f"a reason, {len(left)} not):\n{listing}"
    )
    assert len(left) <= MAX_FIXED, (
        f"{len(left)} fixed sleeps without a reason (at most {MAX_FIXED}): wait for the "
        f"condition the sleep stands for, with a deadline\n{listing}"
    )


def test_every_allowed_entry_is_still_there() -> None:
    """Removing an allowed sleep removes its entry (or lowers its count): the list shrinks."""
    fixed = Counter((s.path, s.function) for s in found_here() if s.kind == "fixed")
    wrong = {key: (count, fixed[key]) for key, (count, _) in ALLOWED.items() if fixed[key] != count}
    assert wrong == {}, f"(path, function): (listed, found) {wrong}"


def test_the_scan_tells_polls_from_fixed_waits(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "sim").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(
        "import time, trio\n"
        "def test_fixed():\n    time.sleep(1)\n"
        "def test_poll():\n    while not done():\n        time.sleep(0.1)\n"
        "def test_retry():\n    for _ in range(9):\n        if ok():\n            break\n"
        "        time.sleep(0.1)\n"
        "def test_schedule():\n    for _ in range(3):\n        time.sleep(1)\n"
        "async def test_virtual(autojump_clock):\n    async def inner():\n"
        "        await trio.sleep(5)\n"
        "def test_lambda():\n    while True:\n        inject(lambda: time.sleep(2))\n"
    )
    (tmp_path / "sim" / "b.py").write_text("import trio\nasync def f():\n    await trio.sleep(1)\n")
    found = {(s.path, s.line): (s.function, s.kind) for s in sleeps(tmp_path)}
    assert found == {
        ("tests/test_a.py", 3): ("test_fixed", "fixed"),
        ("tests/test_a.py", 6): ("test_poll", "poll"),
        ("tests/test_a.py", 11): ("test_retry", "poll"),
        ("tests/test_a.py", 14): ("test_schedule", "fixed"),
        ("tests/test_a.py", 17): ("test_virtual.inner", "virtual"),
        ("tests/test_a.py", 20): ("test_lambda.<lambda>", "fixed"),
        ("sim/b.py", 3): ("f", "virtual"),
    }
