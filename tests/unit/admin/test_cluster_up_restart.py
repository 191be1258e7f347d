"""``cluster up``'s supervisor (trio_broker/admin/cluster_up.py): when a broker that died
is started again. No processes: ``_Broker.start`` is replaced by a record of its calls."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from trio_broker.admin import cluster_up
from trio_broker.admin.cluster_up import REGISTRATION_WAIT_S, RESTART_BACKOFF_S, _Broker


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    calls: list[list[str]] = []
    monkeypatch.setattr(_Broker, "start", lambda self, argv: calls.append(argv))
    monkeypatch.setattr(cluster_up, "_say", lambda line: None)
    return calls


def argv(port: int) -> list[str]:
    return ["serve", str(port)]


def killed_broker(now: float) -> _Broker:
    """Broker 2, just killed by SIGKILL: waiting out its restart backoff."""
    broker = _Broker(2, Path("broker-2.log"), 9093)
    broker._died(now, -signal.SIGKILL)
    assert broker.state == "restarting" and broker.restart_at == now + RESTART_BACKOFF_S[0]
    return broker


def test_a_killed_broker_restarts_only_once_its_registration_is_gone(
    starts: list[list[str]],
) -> None:
    broker = killed_broker(100.0)
    held = {2}
    after_backoff = 100.0 + RESTART_BACKOFF_S[0]
    # The dead process's session has not expired: its registration stands.
    assert not broker.supervise(after_backoff, argv, lambda i: i in held)
    assert not broker.supervise(after_backoff + 3, argv, lambda i: i in held)
    assert starts == []
    held.clear()  # ZooKeeper expired the session: the controller sees broker 2 gone
    assert broker.supervise(after_backoff + 3.5, argv, lambda i: i in held)
    assert starts == [["serve", "9093"]]


def test_a_registration_that_never_goes_delays_the_restart_only_so_long(
    starts: list[list[str]],
) -> None:
    broker = killed_broker(0.0)
    restart_at = RESTART_BACKOFF_S[0]
    assert not broker.supervise(restart_at + REGISTRATION_WAIT_S - 0.5, argv, lambda i: True)
    assert broker.supervise(restart_at + REGISTRATION_WAIT_S, argv, lambda i: True)
    assert starts == [["serve", "9093"]]
