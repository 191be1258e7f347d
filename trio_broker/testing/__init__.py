"""Test helpers for applications that use trio-broker: the pytest plugin (pytest_plugin.py)."""
