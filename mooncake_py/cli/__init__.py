"""``mooncake-py``: the operators' command line for a running mooncake-py store.

One module per command group (:mod:`~mooncake_py.cli.session_commands`,
:mod:`~mooncake_py.cli.admin_commands`); each exposes ``register(commands, parents)``, which
adds its subcommands and sets a ``handler`` taking a :class:`~mooncake_py.cli.common.Context`
and returning the exit code. New groups are added to :data:`GROUPS`.

The commands reach the master through :attr:`Context.client
<mooncake_py.cli.common.Context.client>` (a :class:`~mooncake_py.cli.backend.StoreBackend`):
the gRPC client, or with ``--http`` the HTTP memory API
(:mod:`~mooncake_py.cli.http_backend`); a command's parser sets ``over_http`` when it needs no
more than that interface, and the others are refused under ``--http`` (exit code 2).

Exit codes: 0 ok; 1 aborted or not confirmed; 2 usage error; 3 master unreachable; 4 unknown
session or key; 5 permission denied or unauthenticated; 6 any other store error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from mooncake_py import __version__
from mooncake_py.cli import admin_commands, session_commands
from mooncake_py.cli.common import (
    EXIT_ABORTED,
    EXIT_DENIED,
    EXIT_STORE_ERROR,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
    CommonParents,
    Context,
    add_common_options,
    exit_code_of,
)
from mooncake_py.cli.output import UsageError
from mooncake_py.demo.cli import add_demo_subcommand
from mooncake_py.errors import (
    AuthenticationError,
    MasterUnavailableError,
    MooncakeError,
    PermissionDeniedError,
)

PROG = "mooncake-py"

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]", CommonParents], None]
GROUPS: tuple[Register, ...] = (
    session_commands.register,
    admin_commands.register,
    add_demo_subcommand,
)

_EPILOG = """\
Global options may also follow the command. Destructive commands (close, release,
release-stale, release-all, release-kv-cache, keys rm) ask for confirmation unless --yes.

--http URL talks to the master's HTTP memory API (its --metrics_port) instead of gRPC, with
the same output: sessions ls/show/release/release-stale/release-all, release-kv-cache,
segments ls and stats. Other commands need gRPC (--master).

exit codes: 0 ok, 1 aborted/not confirmed, 2 usage error, 3 master unreachable,
4 session or key not found, 5 permission denied/unauthenticated, 6 other store error
"""


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (global options, then one subcommand per group)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect and manage a mooncake-py store: sessions, segments, keys, stats.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_common_options(parser, suppress=False, files=True)
    parents = CommonParents.create()
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in GROUPS:
        register(commands, parents)
    return parser


def _fail(exit_code: int, message: str) -> int:
    sys.stderr.write(f"{PROG}: {message}\n")
    return exit_code


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def run(ctx: Context) -> int:
    """Run the parsed command, turning every failure into a message and an exit code."""
    try:
        return int(ctx.args.handler(ctx))
    except CliError as exc:
        return _fail(exc.exit_code, exc.message)
    except UsageError as exc:
        return _fail(EXIT_USAGE, str(exc))
    except AuthenticationError:
        return _fail(
            EXIT_DENIED,
            f"unauthenticated: the master at {ctx.address} needs a valid token "
            "(--token or MOONCAKE_AUTH_TOKEN)",
        )
    except PermissionDeniedError:
        return _fail(
            EXIT_DENIED, f"permission denied: the token may not act for tenant {ctx.tenant!r}"
        )
    except MasterUnavailableError as exc:
        return _fail(
            EXIT_UNREACHABLE, f"cannot reach the master at {ctx.address}: {_one_line(str(exc))}"
        )
    except MooncakeError as exc:
        return _fail(exit_code_of(exc.code), _one_line(str(exc)))
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): stop quietly, and keep the interpreter's
        # final flush from failing again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ABORTED
    except OSError as exc:
        return _fail(EXIT_STORE_ERROR, _one_line(str(exc)))
    except KeyboardInterrupt:
        return _fail(130, "interrupted")
    finally:
        ctx.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mooncake-py`` console script.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The exit code.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    try:
        ctx = Context.from_args(args)
    except UsageError as exc:
        return _fail(EXIT_USAGE, str(exc))
    return run(ctx)


__all__ = ["GROUPS", "build_parser", "main"]
