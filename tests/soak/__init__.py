"""Soak: client processes against a master process for minutes, content-hashed, with the
master's RSS sampled (``make soak``, ``python -m tests.soak.run``)."""
