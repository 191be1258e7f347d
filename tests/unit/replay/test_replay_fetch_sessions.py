"""Replay maps fetch session ids (KIP-227) from the capture's broker to the target."""

from __future__ import annotations

from typing import Any

import attrs

from trio_broker.protocol import messages as m
from trio_broker.protocol.messages import decode_request, encode_request, encode_response
from trio_broker.replay.ids import IdMap, fetch_session_handed_out

FETCH = m.ApiKey.FETCH


@attrs.define
class Captured:
    api_key: int
    api_version: int
    frame: bytes


def fetch_request(version: int, session_id: int, epoch: int) -> Captured:
    body = m.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
                          session_id=session_id, session_epoch=epoch, topics=[],
                          forgotten_topics_data=[], rack_id="")  # fmt: skip
    return Captured(FETCH, version, encode_request(FETCH, version, 7, "c", body)[4:])


def fetch_response(version: int, session_id: int, error_code: int = 0) -> bytes:
    body = m.FetchResponse(error_code=error_code, session_id=session_id, responses=[])
    return b"".join(bytes(p) for p in encode_response(FETCH, version, 7, body))[4:]


def test_the_session_id_is_read_from_the_head_of_a_fetch_response() -> None:
    for version in (7, 11, 12, 13, 17):
        frame = fetch_response(version, 4242)
        assert fetch_session_handed_out(version, frame) == 4242
        # A capture may hold only a prefix of a large response: the head is enough.
        assert fetch_session_handed_out(version, frame[:15]) == 4242
        assert fetch_session_handed_out(version, fetch_response(version, 0)) is None
        assert fetch_session_handed_out(version, fetch_response(version, 5, 70)) is None
    assert fetch_session_handed_out(6, fetch_response(6, 0)) is None


def test_requests_naming_a_captured_session_name_the_targets() -> None:
    ids = IdMap(source_names={})
    opening = fetch_request(12, 0, 0)
    assert ids.frame_for_target(opening) == opening.frame  # nothing learnt: unchanged
    ids.learn(opening, fetch_response(12, 777), fetch_session=4242)
    assert ids.session_ids == {4242: 777}
    rewritten: Any = decode_request(ids.frame_for_target(fetch_request(12, 4242, 3)))[1]
    assert (rewritten.session_id, rewritten.session_epoch) == (777, 3)
    other: Any = decode_request(ids.frame_for_target(fetch_request(12, 99, 1)))[1]
    assert other.session_id == 99  # a session the capture never saw opened stays as it is
