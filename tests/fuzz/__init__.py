"""Property-based fuzzing of the public API and of every master RPC on both transports.

The default ``pytest`` run executes a small, derandomized version; ``make fuzz`` sets
``MOONCAKE_PY_FUZZ_EXAMPLES`` for the large one (see :mod:`tests.fuzz.common`).
"""
