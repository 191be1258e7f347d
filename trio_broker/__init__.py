"""trio-broker: a Kafka-compatible broker on Trio."""

__version__ = "0.1.0"
