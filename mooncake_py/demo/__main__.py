"""``python -m mooncake_py.demo``: run the KV-sessions demo (see ``--help``)."""

from mooncake_py.demo.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
