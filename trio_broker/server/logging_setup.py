"""Log output formats (``serve --log-format``) and the slow-request log line.

``text`` (the default) is the classic ``time level logger: message`` line.
``json`` writes one JSON object per line: ``time`` (UTC, ISO 8601), ``level``,
``logger``, ``message``, ``exception`` when there is one, and the structured
fields a caller passed with ``extra={"fields": {...}}`` (the slow-request line
does) as top-level keys.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

#: The slow-request logger (request.log.slow.ms).
request_log = logging.getLogger("trio_broker.requests")

#: Keys of the JSON object that structured fields may not replace.
_RESERVED = frozenset({"time", "level", "logger", "message", "exception"})


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        created = time.gmtime(record.created)
        millis = int(record.msecs)
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", created) + f".{millis:03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                if key not in _RESERVED:
                    entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, default=str)


def use_json_logs(root: logging.Logger | None = None) -> None:
    """Switch every handler of the root logger (set up by basicConfig) to JSON lines."""
    for handler in (root or logging.getLogger()).handlers:
        handler.setFormatter(JsonFormatter())


def log_slow_request(fields: dict[str, Any]) -> None:
    """One line per slow request: ``key=value`` pairs in text, the same keys in JSON."""
    text = " ".join(f"{key}={_text_value(value)}" for key, value in fields.items())
    request_log.info("slow request %s", text, extra={"fields": fields})


def _text_value(value: Any) -> str:
    # Quote strings a reader could not split on spaces (a client id may hold anything).
    if isinstance(value, str) and (not value or any(c in value for c in ' ="\n\\')):
        return json.dumps(value)
    return str(value)
