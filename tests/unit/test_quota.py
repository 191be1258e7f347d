"""Client quotas, sans-I/O: sampled rates, Kafka's throttle time, entity precedence, config."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_broker.config import ConfigError, load_config
from trio_broker.state.quota import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    USER,
    QuotaConfigError,
    QuotaManager,
    QuotaTable,
    SampledRate,
    WindowConfig,
    format_entity,
    parse_entity,
    throttle_time_ms,
    user_of,
)

WINDOW = WindowConfig()  # Kafka's 11 x 1 s
bounds = st.floats(min_value=1.0, max_value=1e9, allow_nan=False)
windows = st.floats(min_value=1.0, max_value=60_000.0, allow_nan=False)


@given(bound=bounds, fraction=st.floats(min_value=0.0, max_value=1.0), window=windows)
def test_no_throttle_at_or_under_the_quota(bound: float, fraction: float, window: float) -> None:
    assert throttle_time_ms(bound * fraction, bound, window, WINDOW.max_throttle_ms) == 0


@given(
    bound=bounds,
    window=windows,
    over=st.floats(min_value=1.0001, max_value=1e6),
    more=st.floats(min_value=1.0, max_value=10.0),
)
def test_throttle_grows_with_the_overshoot_and_is_bounded(
    bound: float, window: float, over: float, more: float
) -> None:
    cap = WINDOW.max_throttle_ms
    small = throttle_time_ms(bound * over, bound, window, cap)
    large = throttle_time_ms(bound * over * more, bound, window, cap)
    assert 0 < small <= large <= cap


def test_throttle_is_the_time_to_fall_back_to_the_quota() -> None:
    # 20 MB over a 10 s window at 1 MB/s: 2 MB/s, 10 s of silence brings it to 1 MB/s.
    assert throttle_time_ms(2e6, 1e6, 10_000, 11_000) == 10_000
    assert throttle_time_ms(1.5e6, 1e6, 10_000, 11_000) == 5_000
    assert throttle_time_ms(100e6, 1e6, 10_000, 11_000) == 11_000


@given(
    records=st.lists(
        st.tuples(st.integers(0, 2_000), st.floats(min_value=0, max_value=1e7)), max_size=50
    )
)
def test_sampled_rate_keeps_only_the_window(records: list[tuple[int, float]]) -> None:
    rate = SampledRate(WINDOW)
    now = 0
    for step, value in records:
        now += step
        rate.record(value, now)
    horizon = WINDOW.samples * WINDOW.sample_ms
    assert rate.window_ms(now) >= (WINDOW.samples - 1) * WINDOW.sample_ms
    assert rate.window_ms(now) <= horizon
    assert rate.total(now + horizon) == 0  # everything ages out
    assert rate.rate(now) >= 0


def test_a_first_burst_is_averaged_over_the_minimum_window() -> None:
    rate = SampledRate(WINDOW)
    rate.record(5_000_000, 0)
    assert rate.window_ms(1) == 10_000
    assert rate.rate(1) == pytest.approx(500_000)


def test_manager_throttles_only_clients_over_their_quota() -> None:
    table = QuotaTable({parse_entity("client-id=bench"): {PRODUCER_BYTE_RATE: 1_000_000}})
    quotas = QuotaManager(table)
    assert quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "free", 50e6, 0) == 0
    assert quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "bench", 5e6, 0) == 0
    delay = quotas.record(PRODUCER_BYTE_RATE, "ANONYMOUS", "bench", 10e6, 10)
    assert delay == 5_000  # 15 MB over 10 s at 1 MB/s: 5 s more
    assert quotas.record(CONSUMER_BYTE_RATE, "ANONYMOUS", "bench", 50e6, 20) == 0


def test_unrecord_and_the_largest_response_allowed() -> None:
    table = QuotaTable({parse_entity("client-id=r"): {CONSUMER_BYTE_RATE: 1_000}})
    quotas = QuotaManager(table)
    assert quotas.max_in_window(CONSUMER_BYTE_RATE, "u", "r") == 10_000  # bound x 10 s
    assert quotas.max_in_window(CONSUMER_BYTE_RATE, "u", "other") is None
    assert quotas.record(CONSUMER_BYTE_RATE, "u", "r", 9_000, 0) == 0
    assert quotas.record(CONSUMER_BYTE_RATE, "u", "r", 9_000, 1) > 0
    quotas.unrecord(CONSUMER_BYTE_RATE, "u", "r", 9_000, 2)  # answered empty instead
    assert quotas.record(CONSUMER_BYTE_RATE, "u", "r", 1_000, 3) == 0


def test_kafka_precedence_most_specific_entity_wins() -> None:
    table = QuotaTable(
        {
            parse_entity("default"): {PRODUCER_BYTE_RATE: 1},
            parse_entity("client-id=c"): {PRODUCER_BYTE_RATE: 2},
            parse_entity("user=<default>"): {PRODUCER_BYTE_RATE: 3},
            parse_entity("user=alice"): {PRODUCER_BYTE_RATE: 4},
            parse_entity("user=alice,client-id=c"): {PRODUCER_BYTE_RATE: 5},
        }
    )

    def bound(user: str, client: str) -> float | None:
        found = table.lookup(PRODUCER_BYTE_RATE, user, client)
        return None if found is None else found[1]

    assert bound("alice", "c") == 5
    assert bound("alice", "d") == 4
    assert bound("bob", "c") == 3  # any user entity beats client-id alone
    table.alter(parse_entity("user=<default>"), PRODUCER_BYTE_RATE, None)
    assert bound("bob", "c") == 2
    assert bound("bob", "x") == 1
    assert table.lookup(CONSUMER_BYTE_RATE, "alice", "c") is None


def test_runtime_changes_layer_over_the_static_table() -> None:
    entity = parse_entity("client-id=bench")
    table = QuotaTable({entity: {PRODUCER_BYTE_RATE: 10}})
    table.alter(entity, PRODUCER_BYTE_RATE, 20)
    assert table.effective() == {entity: {PRODUCER_BYTE_RATE: 20}}
    table.alter(entity, PRODUCER_BYTE_RATE, None)  # a removal hides the static value
    assert table.effective() == {}
    with pytest.raises(QuotaConfigError):
        table.alter(entity, "producer_bytes", 1)
    with pytest.raises(QuotaConfigError):
        table.alter(entity, PRODUCER_BYTE_RATE, 0)


def test_entities_parse_and_format() -> None:
    assert parse_entity("user=alice, client-id=bench") == ((USER, "alice"), (CLIENT_ID, "bench"))
    assert parse_entity("client-id=x,user=<default>") == ((USER, None), (CLIENT_ID, "x"))
    assert parse_entity("default") == ((CLIENT_ID, None),)
    assert format_entity(parse_entity("user=<default>")) == "user=<default>"
    for bad in ("alice", "group=x", "user=a,user=b", ""):
        with pytest.raises(QuotaConfigError):
            parse_entity(bad)
    assert user_of("User:ANONYMOUS") == "ANONYMOUS"


def test_config_file_quota_tables(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(
        '"quota.window.num" = 3\n'
        '[quotas."client-id=bench"]\nproducer_byte_rate = 1048576\n'
        "[quotas.default]\nconsumer_byte_rate = 2097152.5\n"
        '[quotas."user=alice"]\nproducer_byte_rate = 1000\nrequest_percentage = 50\n'
    )
    config = load_config(path)
    assert config.quota_window_num == 3
    assert config.quotas["client-id=bench"] == {"producer_byte_rate": 1048576}
    assert config.quotas["user=alice"]["request_percentage"] == 50
    assert set(config.quotas) == {"client-id=bench", "default", "user=alice"}
    for body in (
        '[quotas."client=x"]\nproducer_byte_rate = 1\n',
        "[quotas.default]\nproducer_byte_rate = -1\n",
        "[quotas.default]\nproduce_rate = 1\n",
        '[quotas.default]\nrequest_percentage = "50"\n',
    ):
        path.write_text(body)
        with pytest.raises(ConfigError, match="quotas"):
            load_config(path)


def test_an_infinite_rate_is_throttled_for_the_whole_cap() -> None:
    # Found by CrossHair: math.ceil(inf) raised OverflowError.
    assert throttle_time_ms(float("inf"), 0.5, 0.5, 0) == 0
    assert throttle_time_ms(float("inf"), 1024.0, 11_000.0, 11_000) == 11_000
