"""The replayer keeps the capture's cross-connection order: a request waits for the
responses the capture shows arriving before it was sent."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from trio_broker.replay.driver import CAUSALITY_TIMEOUT_S, Plan, Request, order_responses


def _request(at_ns: int, correlation_id: int) -> Request:
    return Request(at_ns, 18, 0, correlation_id, "t", b"")


def _plans() -> list[Plan]:
    # Connection A asks at 0 and is answered at 10; B asks at 5 (before that
    # answer) and at 20 (after it); B's first request is answered at 30.
    a = Plan("run", 1, "a", [_request(0, 1)], responses={1: 10})
    b = Plan("run", 2, "b", [_request(5, 7), _request(20, 8)], responses={7: 30})
    return [a, b]


def test_each_request_counts_the_responses_captured_before_it() -> None:
    plans = _plans()
    runs = order_responses(plans)
    assert [r.after_responses for r in plans[0].requests] == [0]
    assert [r.after_responses for r in plans[1].requests] == [0, 1]
    assert runs["run"].order == {(0, 1): 0, (1, 7): 1}
    assert runs["run"].received == [False, False]


def test_runs_are_ordered_separately() -> None:
    plans = _plans()
    plans.append(Plan("other", 1, "c", [_request(25, 1)], responses={}))
    runs = order_responses(plans)
    assert plans[2].requests[0].after_responses == 0  # the other run's clock is its own
    assert set(runs) == {"run"}


async def test_a_request_waits_until_the_earlier_responses_arrived() -> None:
    causality = order_responses(_plans())["run"]
    sent: list[str] = []

    async def second_request_of_b() -> None:
        assert await causality.wait_for(1)
        sent.append("b2")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second_request_of_b)
        await trio.testing.wait_all_tasks_blocked()
        assert sent == []  # A's answer (place 0) has not arrived yet
        causality.arrived(1)  # B's own later answer does not release it
        await trio.testing.wait_all_tasks_blocked()
        assert sent == [] and causality.done == 0
        causality.arrived(0)
    assert sent == ["b2"]
    assert causality.done == 2  # both leading answers are now counted


async def test_a_response_that_never_comes_is_given_up_after_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    causality = order_responses(_plans())["run"]
    start = trio.current_time()
    assert not await causality.wait_for(1)
    assert trio.current_time() - start >= CAUSALITY_TIMEOUT_S
    assert causality.done == 1


def test_replay_of_a_missing_or_empty_capture_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trio_broker.cli import main

    assert main(["replay", str(tmp_path / "missing"), "--to", "127.0.0.1:1"]) == 2
    assert "missing is not a directory" in capsys.readouterr().err
    assert main(["replay", str(tmp_path), "--to", "127.0.0.1:1"]) == 2
    assert f"no capture Parquet files in {tmp_path}" in capsys.readouterr().err


@pytest.mark.parametrize("speed", ["-1", "nan", "inf", "fast"])
def test_replay_refuses_a_speed_that_is_not_a_number_from_zero_up(
    speed: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trio_broker.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["replay", str(tmp_path), "--to", "127.0.0.1:1", "--speed", speed])
    assert exited.value.code == 2
    assert "expected a number >= 0" in capsys.readouterr().err
