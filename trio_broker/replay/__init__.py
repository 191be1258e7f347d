"""``trio-broker replay``: re-send a capture's requests to a broker (see driver.py).

``plan.py`` (what is sent, and when) and ``ids.py`` (the capture's ids mapped to the
target's) are sans-I/O; ``driver.py`` is the Trio shell around them.
"""
