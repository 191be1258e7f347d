"""``trio-broker replay``: re-send a capture's requests to a broker (see driver.py)."""
