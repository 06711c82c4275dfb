"""Opt-in tests that run the serving engines' own Mooncake store modules against mooncake-py.

Run with ``tests/engines/setup_venv.sh`` once, then
``MOONCAKE_PY_ENGINES=1 .engines-venv/bin/python -m pytest -q tests/engines``.
"""
