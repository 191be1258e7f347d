"""Running Apache Kafka 4.4's command-line tools (kafka-topics, kafka-consumer-groups, ...)
from the tests, the way an operator runs them against a broker.

A test module takes the classpath fixture by name::

    from tests.kafka_tools import tool

    tools_classpath = tool.tools_classpath

and runs a tool class with :func:`run_tool`.
"""

from __future__ import annotations

import subprocess
from typing import NamedTuple

import pytest

from tests.kafka_tools.classpath import (
    TOOL_JVM,
    cds_options,
    kafka_tools_classpath,
    keep_cds_archive,
)


@pytest.fixture(scope="module")
def tools_classpath(tmp_path_factory: pytest.TempPathFactory) -> str:
    """kafka-tools and its dependencies, resolved by Maven (cached in ~/.m2)."""
    return kafka_tools_classpath(tmp_path_factory.mktemp("kafka-tools"))


def tool_argv(classpath: str, main: str, *args: str, cds: tuple[str, ...] = ()) -> list[str]:
    """The command line of Kafka tool class ``main`` (``org.apache.kafka.tools.`` may be left
    off) with ``args``; ``cds``: class data sharing options (:func:`cds_options`)."""
    if not main.startswith("org."):
        main = f"org.apache.kafka.tools.{main}"
    return ["java", *TOOL_JVM, *cds, "-cp", classpath, main, *args]


class ToolRun(NamedTuple):
    returncode: int
    stdout: str
    #: stdout, then stderr without slf4j's note that no logging binding is on the
    #: classpath (not the tool's output).
    output: str


def run_tool(
    classpath: str, main: str, *args: str, check: bool = True, timeout: float = 180
) -> ToolRun:
    """Run Kafka tool class ``main`` with ``args`` to its end. With ``check``, a non-zero
    exit fails the test with the tool's output."""
    cds, pending_archive = cds_options(classpath)
    try:
        done = subprocess.run(
            tool_argv(classpath, main, *args, cds=cds),
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    finally:
        keep_cds_archive(classpath, pending_archive)
    errors = [line for line in done.stderr.splitlines() if not line.startswith("SLF4J:")]
    output = "\n".join([done.stdout, *errors])
    if check:
        assert done.returncode == 0, f"{main} {' '.join(args)}: exit {done.returncode}\n{output}"
    return ToolRun(done.returncode, done.stdout, output)


def share_groups(classpath: str, bootstrap: str, *args: str) -> str:
    """kafka-share-groups.sh's output (its exit status is not checked: the tests assert on
    the refusals it prints)."""
    command = "consumer.group.ShareGroupCommand"
    return run_tool(classpath, command, "--bootstrap-server", bootstrap, *args, check=False).output


def consumer_groups(classpath: str, bootstrap: str, *args: str) -> str:
    """kafka-consumer-groups.sh's output; it must succeed."""
    command = "consumer.group.ConsumerGroupCommand"
    return run_tool(classpath, command, "--bootstrap-server", bootstrap, *args).output
