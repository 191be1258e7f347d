"""The admin CLI (``trio-broker topics|groups|produce|consume``) run as a real subprocess
against a ``trio-broker serve`` subprocess: a create -> produce -> consume -> describe ->
groups -> delete round trip, Kafka errors by name with exit code 1, connection refused."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from trio_broker.cluster.child_process import die_with_parent

LISTENING = re.compile(r"listening on ([0-9.]+):(\d+)")
CLI = [sys.executable, "-m", "trio_broker.cli"]


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data_dir = tmp_path_factory.mktemp("admin-cli") / "data"
    proc = subprocess.Popen(
        [*CLI, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )
    found: list[str] = []
    ready = threading.Event()
    log: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line)
            match = LISTENING.search(line)
            if match and not found:
                found.append(f"{match.group(1)}:{match.group(2)}")
                ready.set()
        ready.set()

    drainer = threading.Thread(target=drain, daemon=True)
    drainer.start()
    try:
        assert ready.wait(30) and found, "broker did not start:\n" + "".join(log)
        yield found[0]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
            finally:  # a hang, or an interrupted wait
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        drainer.join(5)


def cli(*args: str, bootstrap: str | None, stdin: str | None = None) -> subprocess.CompletedProcess:
    argv = [*CLI, *args]
    if bootstrap is not None:
        argv += ["--bootstrap", bootstrap]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)


#: Runs ``trio_broker.cli.main`` once per argv of a JSON list in one subprocess (one
#: import of trio_broker instead of one per call), each with its own stdout and stderr,
#: and prints a JSON list of [exit code, stdout, stderr].
_MANY = """
import contextlib, io, json, sys
from trio_broker.cli import main
results = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def cli_many(*argvs: list[str]) -> list[subprocess.CompletedProcess]:
    """Admin commands that need no stdin, run in order in one subprocess: what each
    would have printed and returned as ``trio-broker ...`` of its own."""
    run = subprocess.run([sys.executable, "-c", _MANY], input=json.dumps(argvs),
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, (run.stdout, run.stderr)
    return [subprocess.CompletedProcess(argv, code, out, err)
            for argv, (code, out, err) in zip(argvs, json.loads(run.stdout), strict=True)]  # fmt: skip


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


def rows(output: str) -> list[list[str]]:
    """Whitespace-split lines of a table (header included)."""
    return [line.split() for line in output.splitlines() if line.strip()]


def new_topic() -> str:
    return f"cli-{uuid.uuid4().hex[:8]}"


def test_round_trip(bootstrap: str) -> None:
    topic = new_topic()
    out = ok(cli("topics", "create", topic, "--partitions", "2",
                 "--config", "retention.ms=3600000", bootstrap=bootstrap))  # fmt: skip
    assert f"created topic {topic} with 2 partition(s)" in out
    assert [topic, "2", "NONE"] in rows(ok(cli("topics", "list", bootstrap=bootstrap)))

    out = ok(cli("produce", topic, "--key", "k1", bootstrap=bootstrap, stdin="one\ntwo\nthree\n"))
    assert rows(out) == [["TOPIC", "PARTITION", "OFFSET"],
                         [topic, "0", "0"], [topic, "0", "1"], [topic, "0", "2"]]  # fmt: skip
    out = ok(cli("produce", topic, "--partition", "1", bootstrap=bootstrap, stdin="solo\n"))
    assert rows(out)[1:] == [[topic, "1", "0"]]

    out = ok(cli("consume", topic, "--from-beginning", "--max", "3", bootstrap=bootstrap))
    assert out.splitlines() == ["OFFSET\tKEY\tVALUE", "0\tk1\tone", "1\tk1\ttwo", "2\tk1\tthree"]
    out = ok(cli("consume", topic, "--from-beginning", "--max", "2", bootstrap=bootstrap))
    assert out.splitlines()[1:] == ["0\tk1\tone", "1\tk1\ttwo"]
    out = ok(cli("consume", topic, "--partition", "1", "--from-beginning", "--max", "5",
                 "--timeout", "1", bootstrap=bootstrap))  # fmt: skip
    assert out.splitlines()[1:] == ["0\tnull\tsolo"]
    # without --from-beginning it starts at the end: nothing, bounded by the timeout
    started = time.monotonic()
    out = ok(cli("consume", topic, "--timeout", "1", bootstrap=bootstrap))
    assert out.splitlines() == ["OFFSET\tKEY\tVALUE"]
    assert time.monotonic() - started < 30

    out = ok(cli("topics", "describe", topic, bootstrap=bootstrap))
    table = rows(out)
    assert ["0", "0", "0", "3", "3"] in table
    assert ["1", "0", "0", "1", "1"] in table
    assert ["retention.ms", "3600000", "DYNAMIC_TOPIC_CONFIG"] in table

    # a real consumer group commits offsets; groups list/describe show them with lag
    group = f"cli-group-{uuid.uuid4().hex[:8]}"
    _commit_with_confluent(bootstrap, topic, group, records=3)
    ok(cli("produce", topic, bootstrap=bootstrap, stdin="four\nfive\n"))
    listed = {row[0]: row for row in rows(ok(cli("groups", "list", bootstrap=bootstrap)))}
    assert group in listed, listed  # assign() + commit: a group with offsets and no members
    assert listed[group][1] == "Empty"
    out = ok(cli("groups", "describe", group, bootstrap=bootstrap))
    assert f"Group: {group}" in out
    table = rows(out)
    # partition 0: committed 3 of 5 -> lag 2
    assert [topic, "0", "3", "5", "2"] in table, out

    out = ok(cli("topics", "delete", topic, bootstrap=bootstrap))
    assert f"deleted topic {topic}" in out
    assert topic not in ok(cli("topics", "list", bootstrap=bootstrap))


def test_alter_adds_partitions_and_log_dirs_shows_their_sizes(bootstrap: str) -> None:
    topic = new_topic()
    ok(cli("topics", "create", topic, bootstrap=bootstrap))
    out = ok(cli("topics", "alter", topic, "--partitions", "3", bootstrap=bootstrap))
    assert f"topic {topic} now has 3 partition(s)" in out
    assert [topic, "3", "NONE"] in rows(ok(cli("topics", "list", bootstrap=bootstrap)))
    ok(cli("produce", topic, "--partition", "2", bootstrap=bootstrap, stdin="x\ny\n"))
    out = ok(cli("consume", topic, "--partition", "2", "--from-beginning", "--max", "2",
                 bootstrap=bootstrap))  # fmt: skip
    assert out.splitlines()[1:] == ["0\tnull\tx", "1\tnull\ty"]

    shrink = cli("topics", "alter", topic, "--partitions", "2", bootstrap=bootstrap)
    assert shrink.returncode == 1
    assert f"alter {topic}: INVALID_PARTITIONS" in shrink.stderr
    missing = cli("topics", "alter", new_topic(), "--partitions", "2", bootstrap=bootstrap)
    assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr

    out = ok(cli("log-dirs", topic, bootstrap=bootstrap))
    assert out.startswith("Log dir: /") and "Usable bytes: " in out
    sizes = {(row[0], row[1]): int(row[2]) for row in rows(out)[2:]}
    assert set(sizes) == {(topic, "0"), (topic, "1"), (topic, "2")}
    assert sizes[(topic, "0")] == sizes[(topic, "1")] == 0 < sizes[(topic, "2")]


def _commit_with_confluent(bootstrap: str, topic: str, group: str, records: int) -> None:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })  # fmt: skip
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen = 0
        deadline = time.monotonic() + 30
        while seen < records and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                seen += 1
        assert seen == records
        consumer.commit(offsets=[TopicPartition(topic, 0, records)], asynchronous=False)
    finally:
        consumer.close()


def test_duplicate_topic_is_named_error(bootstrap: str) -> None:
    topic = new_topic()
    ok(cli("topics", "create", topic, bootstrap=bootstrap))
    result = cli("topics", "create", topic, bootstrap=bootstrap)
    assert result.returncode == 1
    assert "TOPIC_ALREADY_EXISTS" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("topics", "describe", "no-such-topic"),
        ("topics", "delete", "no-such-topic"),
        ("produce", "no-such-topic"),
        ("consume", "no-such-topic", "--from-beginning", "--max", "1"),
    ],
)
def test_unknown_topic_is_named_error(bootstrap: str, args: tuple[str, ...]) -> None:
    result = cli(*args, bootstrap=bootstrap, stdin="x\n")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "UNKNOWN_TOPIC_OR_PARTITION" in result.stderr


def test_bad_config_is_named_error(bootstrap: str) -> None:
    result = cli("topics", "create", new_topic(), "--config", "retention.ms=abc",
                 bootstrap=bootstrap)  # fmt: skip
    assert result.returncode == 1
    assert "INVALID_CONFIG" in result.stderr


def test_connection_refused() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = cli("topics", "list", bootstrap=f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert "connection refused" in result.stderr
    assert "Traceback" not in result.stderr


def _refused_address() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_kafka_tools_spellings_of_bootstrap(bootstrap: str) -> None:
    """Kafka's tools say ``--bootstrap-server`` and kcat says ``-b``: both work, for every
    admin command, and so does Kafka's comma-separated list (the first broker that
    answers is used)."""
    topic = new_topic()
    out = ok(cli("topics", "create", topic, "--bootstrap-server", bootstrap, bootstrap=None))
    assert f"created topic {topic}" in out
    ok(cli("produce", topic, "-b", bootstrap, bootstrap=None, stdin="hello\n"))
    listed = f"{_refused_address()},{bootstrap}"
    out = ok(cli("consume", topic, "--from-beginning", "--max", "1",
                 "--bootstrap-server", listed, bootstrap=None))  # fmt: skip
    assert out.splitlines()[1:] == ["0\tnull\thello"]
    assert [topic, "1", "NONE"] in rows(ok(cli("topics", "list", "-b", bootstrap, bootstrap=None)))
    # Every admin command under both spellings: one process parses and runs them all.
    flags = ("--bootstrap-server", "-b")
    commands = (["groups", "list"], ["log-dirs"], ["quotas", "list"], ["acls", "list"])
    results = cli_many(*([*command, flag, bootstrap] for flag in flags for command in commands))
    for result in results:
        if result.args[0] == "acls":
            # This broker has no authorizer: the answer shows the request reached it.
            assert result.returncode == 1 and "SECURITY_DISABLED" in result.stderr, result
        else:
            ok(result)


def test_no_broker_of_a_list_answers() -> None:
    first, second = _refused_address(), _refused_address()
    result = cli("topics", "list", "--bootstrap-server", f"{first},{second}", bootstrap=None)
    assert result.returncode == 1
    assert f"{first}: connection refused" in result.stderr
    assert f"{second}: connection refused" in result.stderr
    assert "Traceback" not in result.stderr
