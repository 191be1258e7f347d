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
    REQUEST_PERCENTAGE,
    USER,
    QuotaConfigError,
    QuotaManager,
    QuotaTable,
    SampledRate,
    WindowConfig,
    check_quota,
    format_entity,
    make_entity,
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


# ----------------------------------------------------- edges found by mutation testing


def test_entity_names_keep_their_equals_signs_and_lose_surrounding_blanks() -> None:
    # Only the first "=" separates the type from the name: client ids may contain "=".
    assert parse_entity("client-id=a=b") == ((CLIENT_ID, "a=b"),)
    assert parse_entity(" user = alice ,client-id= <default> ") == (
        (USER, "alice"),
        (CLIENT_ID, None),
    )
    assert parse_entity("  default  ") == ((CLIENT_ID, None),)


def test_entity_errors_tell_the_operator_what_is_allowed() -> None:
    # These messages reach operators: config errors, the admin CLI, AlterClientQuotas.
    expected = "expected user=NAME and/or client-id=NAME (NAME may be <default>), or 'default'"
    for bad in ("user", "group=x", "alice"):  # a type without "=", an unknown type, a name
        with pytest.raises(QuotaConfigError) as error:
            parse_entity(bad)
        assert str(error.value) == f"quota entity {bad!r}: {expected}"
    with pytest.raises(QuotaConfigError) as error:
        parse_entity("user=a,user=b")
    assert str(error.value) == "quota entity 'user=a,user=b': user given twice"


def test_make_entity_refuses_what_alter_client_quotas_may_send() -> None:
    # AlterClientQuotas builds entities from (type, name) pairs, unchecked by the codec.
    assert make_entity([(CLIENT_ID, "c"), (USER, None)]) == ((USER, None), (CLIENT_ID, "c"))
    with pytest.raises(QuotaConfigError) as error:
        make_entity([("ip", "1.2.3.4")])
    assert str(error.value) == "unknown quota entity type 'ip'"
    for pairs in ([], [(USER, "a"), (USER, "b")]):
        with pytest.raises(QuotaConfigError) as error:
            make_entity(pairs)
        assert str(error.value) == "a quota entity needs user and/or client-id, each once"


def test_format_entity_is_what_parse_entity_reads() -> None:
    for text in ("user=alice,client-id=bench", "user=<default>,client-id=x", "client-id=c"):
        assert format_entity(parse_entity(text)) == text


def test_quota_values_any_positive_finite_number() -> None:
    check_quota(PRODUCER_BYTE_RATE, 0.5)  # a fraction of a byte per second is still positive
    check_quota(REQUEST_PERCENTAGE, 250)
    for value in (0, -1, float("inf"), float("nan")):
        with pytest.raises(QuotaConfigError) as error:
            check_quota(CONSUMER_BYTE_RATE, value)
        assert str(error.value) == f"consumer_byte_rate must be a positive number, got {value!r}"
    with pytest.raises(QuotaConfigError) as error:
        check_quota("producer_bytes", 1)
    assert str(error.value) == (
        "unknown quota key 'producer_bytes'; expected one of "
        "['consumer_byte_rate', 'producer_byte_rate', 'request_percentage']"
    )
    with pytest.raises(QuotaConfigError) as error:
        QuotaTable().alter(parse_entity("default"), "producer_bytes", None)
    assert str(error.value) == "unknown quota key 'producer_bytes'"


def test_user_of_keeps_the_whole_name_after_the_principal_type() -> None:
    assert user_of("User:CN=a:b") == "CN=a:b"
    assert user_of("alice") == "alice"  # no principal type: the name as given


def test_each_of_the_eight_precedence_levels_in_kafka_order() -> None:
    levels = [
        "user=alice,client-id=c",
        "user=alice,client-id=<default>",
        "user=alice",
        "user=<default>,client-id=c",
        "user=<default>,client-id=<default>",
        "user=<default>",
        "client-id=c",
        "client-id=<default>",
    ]
    table = QuotaTable(
        {parse_entity(text): {PRODUCER_BYTE_RATE: n + 1} for n, text in enumerate(levels)}
    )
    for n, text in enumerate(levels):
        assert table.lookup(PRODUCER_BYTE_RATE, "alice", "c") == (parse_entity(text), n + 1)
        table.alter(parse_entity(text), PRODUCER_BYTE_RATE, None)
    assert table.lookup(PRODUCER_BYTE_RATE, "alice", "c") is None
    assert table.empty


def test_a_runtime_quota_for_a_new_entity_and_removals_given_at_start() -> None:
    alice = parse_entity("user=alice")
    table = QuotaTable(
        {alice: {PRODUCER_BYTE_RATE: 10}}, dynamic={alice: {PRODUCER_BYTE_RATE: None}}
    )
    assert table.empty  # the stored removal hides the static quota
    table.alter(parse_entity("client-id=new"), CONSUMER_BYTE_RATE, 5)
    assert table.effective() == {parse_entity("client-id=new"): {CONSUMER_BYTE_RATE: 5}}
    assert not table.empty


def test_a_sample_covers_sample_ms_from_its_first_record() -> None:
    rate = SampledRate(WINDOW)
    rate.record(1, 5_000)
    rate.record(2, 5_999)  # same sample as the record at 5000
    rate.record(4, 6_000)  # a new sample begins exactly sample_ms later
    assert rate.total(6_000) == 7
    assert rate.total(15_999) == 7
    assert rate.total(16_000) == 4  # the sample begun at 5000 leaves after 11 x 1 s
    assert rate.total(16_999) == 4
    assert rate.total(17_000) == 0


def test_the_window_is_the_time_since_the_oldest_sample_once_longer_than_the_minimum() -> None:
    rate = SampledRate(WINDOW)
    rate.record(3, 1_000)
    assert rate.window_ms(1_000) == 10_000
    assert rate.window_ms(11_500) == 10_500
    assert rate.rate(11_500) == pytest.approx(3 * 1000 / 10_500)
    assert SampledRate(WINDOW).window_ms(0) == 10_000  # nothing recorded yet


def test_short_windows_still_average_over_at_least_one_sample() -> None:
    # quota.window.num = 1 or 2: the minimum window is one whole sample.
    for samples in (1, 2):
        window = WindowConfig(samples=samples, sample_ms=500)
        rate = SampledRate(window)
        rate.record(100, 0)
        assert rate.window_ms(0) == 500
        quotas = QuotaManager(
            QuotaTable({parse_entity("default"): {CONSUMER_BYTE_RATE: 1000}}), window
        )
        assert quotas.max_in_window(CONSUMER_BYTE_RATE, "u", "c") == 500  # 1000 B/s x 0.5 s
    assert WindowConfig(samples=3, sample_ms=500).max_throttle_ms == 1_500


def test_a_fraction_of_a_millisecond_of_throttle_rounds_up() -> None:
    assert throttle_time_ms(1000.5, 1000, 1000, 11_000) == 1  # 0.5 ms


def test_a_user_quota_is_shared_by_all_that_users_clients() -> None:
    quotas = QuotaManager(QuotaTable({parse_entity("user=alice"): {PRODUCER_BYTE_RATE: 1000}}))
    assert quotas.max_in_window(PRODUCER_BYTE_RATE, "alice", "any") == 10_000
    assert quotas.max_in_window(PRODUCER_BYTE_RATE, "bob", "any") is None
    assert quotas.record(PRODUCER_BYTE_RATE, "alice", "one", 10_000, 0) == 0
    assert quotas.record(PRODUCER_BYTE_RATE, "alice", "two", 5_000, 1) == 5_000
    assert quotas.record(PRODUCER_BYTE_RATE, "bob", "one", 1e9, 2) == 0  # no quota for bob
    quotas.unrecord(PRODUCER_BYTE_RATE, "alice", "two", 5_000, 3)
    assert quotas.record(PRODUCER_BYTE_RATE, "alice", "three", 0, 4) == 0


def test_a_default_user_quota_is_measured_per_user() -> None:
    quotas = QuotaManager(QuotaTable({parse_entity("user=<default>"): {PRODUCER_BYTE_RATE: 1000}}))
    assert quotas.record(PRODUCER_BYTE_RATE, "alice", "c", 10_000, 0) == 0
    assert quotas.record(PRODUCER_BYTE_RATE, "bob", "c", 10_000, 1) == 0  # bob's own budget
    assert quotas.record(PRODUCER_BYTE_RATE, "alice", "c", 5_000, 2) == 5_000


def test_forget_idle_drops_only_rates_that_measured_nothing_for_a_window() -> None:
    quotas = QuotaManager(QuotaTable({parse_entity("default"): {PRODUCER_BYTE_RATE: 1000}}))
    quotas.record(PRODUCER_BYTE_RATE, "u", "idle", 10_000, 0)
    quotas.record(PRODUCER_BYTE_RATE, "u", "busy", 10_000, 5_000)
    quotas.forget_idle(11_000)
    # The memory bound is the point: one rate per client that sent in the last window.
    assert [sensor for _, sensor in quotas._rates] == [parse_entity("client-id=busy")]
    # The busy client's usage is still counted after the sweep.
    assert quotas.record(PRODUCER_BYTE_RATE, "u", "busy", 5_000, 11_000) > 0
