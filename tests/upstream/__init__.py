"""Runs upstream Mooncake's own Python store tests against mooncake-py (see ``run.py``)."""
