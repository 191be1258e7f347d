"""Verification of captured Kafka traffic (``trio-broker verify``); see docs/traffic-verification.md."""
