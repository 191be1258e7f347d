"""The names of API keys come from one table, the schema table: ApiKey agrees with it."""

from __future__ import annotations

from trio_broker.protocol.messages import API_KEY_NAMES, ApiKey
from trio_broker.protocol.schema import REQUESTS, uses_topic_ids


def test_api_key_constants_are_the_schema_tables_names() -> None:
    constants = {
        value: name
        for name, value in vars(ApiKey).items()
        if name.isupper() and isinstance(value, int)
    }
    assert constants == API_KEY_NAMES
    assert set(API_KEY_NAMES) == set(REQUESTS)


def test_topic_id_versions_come_from_the_schema() -> None:
    # KIP-516: Produce and Fetch v13, OffsetCommit and OffsetFetch v10 name topics by id.
    assert not uses_topic_ids(ApiKey.PRODUCE, 12) and uses_topic_ids(ApiKey.PRODUCE, 13)
    assert not uses_topic_ids(ApiKey.FETCH, 12) and uses_topic_ids(ApiKey.FETCH, 13)
    assert uses_topic_ids(ApiKey.OFFSET_COMMIT, 10) and not uses_topic_ids(ApiKey.OFFSET_COMMIT, 9)
    assert uses_topic_ids(ApiKey.OFFSET_FETCH, 10) and not uses_topic_ids(ApiKey.OFFSET_FETCH, 9)
    # Metadata v10+ takes names and ids side by side: not "by id".
    assert not uses_topic_ids(ApiKey.METADATA, 12)
