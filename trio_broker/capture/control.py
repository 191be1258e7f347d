"""Switching the capture tap on and off while the broker runs.

The broker keeps the tap in ``broker.capture_tap`` for its whole life (its
writer task keeps running) and in ``broker.capture`` only while capture is on:
the connection's hot path checks ``broker.capture is not None``, so switching
off costs nothing per frame. Three ways in: ``SIGUSR1`` (toggles),
``POST /capture/on|off`` and ``GET /capture`` on the metrics listener, and
``trio-broker capture on|off|status`` (a client of that endpoint).
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger("trio_broker.capture")

ON, OFF, UNAVAILABLE = "on", "off", "unavailable"


def capture_state(broker: Any) -> str:
    if getattr(broker, "capture_tap", None) is None:
        return UNAVAILABLE
    return ON if broker.capture is not None else OFF


def set_capture(broker: Any, on: bool) -> str:
    """Switch capture on or off; returns the new state (``unavailable`` without ``--capture``)."""
    tap = getattr(broker, "capture_tap", None)
    if tap is None:
        return UNAVAILABLE
    if on and broker.capture is None:
        tap.switched += 1
        log.info("capture switched on (%s)", tap.directory)
    elif not on and broker.capture is not None:
        tap.switched += 1
        log.info("capture switched off")
    broker.capture = tap if on else None
    return capture_state(broker)


def toggle_capture(broker: Any) -> str:
    """SIGUSR1: on becomes off and off becomes on."""
    return set_capture(broker, capture_state(broker) == OFF)


def _status_body(broker: Any) -> bytes:
    tap = getattr(broker, "capture_tap", None)
    status: dict[str, Any] = {"capture": capture_state(broker)}
    if tap is not None:
        status.update(
            directory=str(tap.directory), captured=tap.captured, dropped=tap.dropped,
            rows_written=tap.rotator.rows_written,
        )  # fmt: skip
    return (json.dumps(status) + "\n").encode()


def http_capture(broker: Any, method: str, path: str) -> tuple[str, bytes]:
    """The metrics listener's ``/capture`` routes: (HTTP status line, JSON body)."""
    if path == "/capture":
        if method != "GET":
            return "405 Method Not Allowed", b"GET /capture, POST /capture/on|off\n"
        return "200 OK", _status_body(broker)
    if path in ("/capture/on", "/capture/off"):
        if method != "POST":
            return "405 Method Not Allowed", b"POST /capture/on|off\n"
        if set_capture(broker, path.endswith("/on")) == UNAVAILABLE:
            return "409 Conflict", b'{"capture": "unavailable", "why": "serve without --capture"}\n'
        return "200 OK", _status_body(broker)
    return "404 Not Found", b"not found\n"


def request_capture(metrics_address: str, action: str, timeout: float = 10.0) -> dict[str, Any]:
    """``trio-broker capture on|off|status``: ask a broker's metrics listener; raises OSError."""
    # Imported here, not at the top: urllib.request loads http.client and email, and
    # every broker imports this module (SIGUSR1) while only the CLI sends requests.
    import urllib.error
    import urllib.request

    path = "/capture" if action == "status" else f"/capture/{action}"
    request = urllib.request.Request(
        f"http://{metrics_address}{path}", method="GET" if action == "status" else "POST",
        data=None if action == "status" else b"",
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            result: dict[str, Any] = json.loads(response.read())
            return result
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace").strip()
        raise OSError(f"{exc.code} {exc.reason}: {body}") from None
