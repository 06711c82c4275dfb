"""Runnable examples (``python -m mooncake_py.examples.<name>``)."""
