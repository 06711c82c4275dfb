"""``python -m mooncake_py.cli``: the same as the ``mooncake-py`` console script."""

import sys

from mooncake_py.cli import main

if __name__ == "__main__":
    sys.exit(main())
