"""Traffic capture: every request and response frame as Parquet rows (see docs/traffic-verification.md)."""

from trio_broker.capture.schema import CAPTURE_SCHEMA, CaptureRow

__all__ = ["CAPTURE_SCHEMA", "CaptureRow"]
