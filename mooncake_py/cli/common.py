"""What every command of the ops CLI shares: exit codes, errors, the connection to the master,
tenant selection and confirmation of destructive commands."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable, Iterator

from mooncake_py.cli.backend import StoreBackend
from mooncake_py.cli.http_backend import HttpMemoryBackend, HttpTarget
from mooncake_py.cli.output import OutputOptions, UsageError, parse_duration
from mooncake_py.client.api import Client
from mooncake_py.client.config import ClientConfig
from mooncake_py.errors import (
    ErrorCode,
    InvalidParamsError,
    MooncakeError,
    NotFoundError,
    PermissionDeniedError,
    UnavailableError,
    error_class_of,
)
from mooncake_py.tls import TlsConfig
from mooncake_py.units import ConfigError

EXIT_OK = 0
EXIT_ABORTED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_NOT_FOUND = 4
EXIT_DENIED = 5
EXIT_STORE_ERROR = 6

DEFAULT_MASTER = "127.0.0.1:50051"
PAGE_LIMIT = 1024

Handler = Callable[["Context"], int]


class CliError(Exception):
    """A failure to report on one line of stderr, with the process exit code.

    Attributes:
        exit_code: one of the ``EXIT_*`` codes.
        message: what went wrong, for humans.
    """

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message


_EXIT_OF_FAMILY: tuple[tuple[type[MooncakeError], int], ...] = (
    (NotFoundError, EXIT_NOT_FOUND),
    (UnavailableError, EXIT_UNREACHABLE),
    (PermissionDeniedError, EXIT_DENIED),
    (InvalidParamsError, EXIT_USAGE),
)


def exit_code_of(code: int) -> int:
    """The exit code for a (non-zero) store error code, by its exception family."""
    family = error_class_of(code)
    return next((exit for cls, exit in _EXIT_OF_FAMILY if issubclass(family, cls)), 6)


def describe_failure(exc: MooncakeError, what: str) -> CliError:
    """The :class:`CliError` reporting ``exc`` about ``what`` (e.g. ``"session 'conv-1'"``)."""
    if isinstance(exc, NotFoundError):
        message = f"{what} not found"
    elif isinstance(exc, InvalidParamsError):
        message = f"invalid request for {what} ({ErrorCode.name_of(exc.code)})"
    else:
        message = f"{what}: {ErrorCode.name_of(exc.code)} ({exc.code})"
    return CliError(exit_code_of(exc.code), message)


@contextlib.contextmanager
def about(what: str) -> Iterator[None]:
    """Report a store error raised in the block as a :class:`CliError` naming ``what``.

    Unreachable masters and refused tokens pass through: the command runner reports them
    with the master's address and the tenant.
    """
    try:
        yield
    except (UnavailableError, PermissionDeniedError):
        raise
    except MooncakeError as exc:
        raise describe_failure(exc, what) from exc


def duration_ms(text: str) -> int:
    """``argparse`` type: a duration (``90s``, ``30m``, ``1h30m``, seconds) in milliseconds."""
    try:
        return round(parse_duration(text) * 1000)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def positive_int(text: str) -> int:
    """``argparse`` type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


@dataclasses.dataclass
class Context:
    """The parsed command line plus a lazily opened connection to the master.

    The connection is gRPC (``--master``), or the HTTP memory API with ``--http``; commands
    the memory API covers set ``over_http`` in their parser defaults, the others are refused
    under ``--http`` (:meth:`from_args`).

    Attributes:
        args: the parsed arguments (command-specific ones included).
        address: the master's ``host:port``, or the ``--http`` URL.
        token: the bearer token, or "".
        tenant: the tenant to name in requests; "" lets the token decide.
        timeout_s: deadline of each master call.
        out: output options.
        yes: skip confirmations.
        http: where the memory API is served (``--http``), or None for gRPC.
    """

    args: argparse.Namespace
    address: str
    token: str
    tenant: str
    timeout_s: float
    out: OutputOptions
    yes: bool
    http: HttpTarget | None = None
    _client: Client | None = None
    _http_backend: HttpMemoryBackend | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Context:
        """Build from parsed arguments.

        Raises:
            UsageError: a bad address or output combination, TLS options with an
                ``http://`` URL, or a command the memory API does not cover under ``--http``.
        """
        http_url = getattr(args, "http", "") or ""
        http = HttpTarget.parse(http_url) if http_url else None
        address = http_url or args.master
        if http is None:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise UsageError(f"--master must be HOST:PORT, got {address!r}")
        elif not getattr(args, "over_http", False):
            raise UsageError(_not_over_http(args))
        if args.timeout <= 0:
            raise UsageError("--timeout must be positive")
        _check_tls_options(args)
        if http is not None and http.scheme == "http" and any(tls_settings(args).values()):
            raise UsageError("the --tls-* options need an https:// --http URL")
        token = args.token or ""
        tenant = args.tenant if args.tenant is not None else ("" if token else "default")
        out = OutputOptions.resolve(
            args.json, getattr(args, "format", None), getattr(args, "output", None)
        )
        return cls(args, address, token, tenant, args.timeout, out, args.yes, http)

    @property
    def client(self) -> StoreBackend:
        """The master calls the memory API covers: over HTTP with ``--http``, else the gRPC
        :attr:`grpc_client`.

        Raises:
            UnavailableError, AuthenticationError: (gRPC) the master is unreachable or refused
                the token (the command runner reports them).
            UsageError: (HTTP) a TLS file that is not valid PEM.
        """
        if self.http is None:
            return self.grpc_client
        if self._http_backend is None:
            try:
                self._http_backend = HttpMemoryBackend(
                    self.http, self.token, self.tenant, self.timeout_s, _tls_config(self.args)
                )
            except ConfigError as exc:
                raise UsageError(str(exc).replace("_file", "")) from exc
        return self._http_backend

    @property
    def grpc_client(self) -> Client:
        """The gRPC store client, joined on first use; it contributes no memory.

        Raises:
            UnavailableError, AuthenticationError: the master is unreachable or refused the
                token (the command runner reports them).
            CliError: EXIT_USAGE under ``--http`` (commands that need gRPC are refused before
                they run; this guards any that is not).
        """
        if self.http is not None:
            raise CliError(EXIT_USAGE, _not_over_http(self.args))
        if self._client is None:
            tls = tls_settings(self.args)
            config = ClientConfig(
                master_server_addr=self.address,
                global_segment_size=0,
                auth_token=self.token,
                # With a token, "default" lets the token decide the tenant.
                tenant_id=self.tenant or "default",
                rpc_timeout_s=self.timeout_s,
                tls_ca_file=tls["tls_ca_file"],
                tls_cert_file=tls["tls_cert_file"],
                tls_key_file=tls["tls_key_file"],
                tls_server_name=tls["tls_server_name"],
            )
            self._client = Client(config)
        return self._client

    @property
    def tenant_label(self) -> str:
        """The tenant as shown to humans."""
        return f"tenant {self.tenant!r}" if self.tenant else "the token's tenant"

    def close(self) -> None:
        """Close the connection, if one was opened."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._http_backend is not None:
            self._http_backend.close()
            self._http_backend = None

    def confirm(self, action: str) -> None:
        """Ask ``<action> proceed? [y/N]`` on stderr and read the answer from stdin.

        Passes at once with ``--yes``.

        Raises:
            CliError: EXIT_ABORTED when the answer is not yes, stdin is not a terminal or it
                ended.
        """
        if self.yes:
            return
        stdin = sys.stdin
        if stdin is None or not stdin.isatty():
            raise CliError(
                EXIT_ABORTED, f"not confirmed: {action} (stdin is not a terminal; pass --yes)"
            )
        sys.stderr.write(f"{action} proceed? [y/N] ")
        sys.stderr.flush()
        answer = stdin.readline()
        if answer.strip().lower() not in ("y", "yes"):
            raise CliError(EXIT_ABORTED, "aborted: not confirmed")


# CLI option (namespace attribute) -> ClientConfig field, for TLS to the master.
_TLS_OPTIONS = {
    "tls_ca": "tls_ca_file",
    "tls_cert": "tls_cert_file",
    "tls_key": "tls_key_file",
    "tls_server_name": "tls_server_name",
}


def tls_settings(args: argparse.Namespace) -> dict[str, str]:
    """The ClientConfig TLS fields the command line (or its environment defaults) set."""
    return {field: getattr(args, option, "") or "" for option, field in _TLS_OPTIONS.items()}


def _tls_config(args: argparse.Namespace) -> TlsConfig:
    """The TLS settings of the command line (all empty: the system's trust store).

    Raises:
        ConfigError: a TLS file that does not exist, or a certificate without its key.
    """
    settings = tls_settings(args)
    return TlsConfig(
        cert_file=settings["tls_cert_file"],
        key_file=settings["tls_key_file"],
        ca_file=settings["tls_ca_file"],
        server_name=settings["tls_server_name"],
        setting_prefix="--tls-",
    )


def _check_tls_options(args: argparse.Namespace) -> None:
    """Raise UsageError for a TLS file that does not exist or a certificate without its key."""
    settings = tls_settings(args)
    if not (settings["tls_ca_file"] or settings["tls_cert_file"] or settings["tls_key_file"]):
        return
    try:
        _tls_config(args)
    except ConfigError as exc:
        raise UsageError(str(exc).replace("_file", "")) from exc


def command_name(args: argparse.Namespace) -> str:
    """The command as typed, e.g. ``sessions keys`` or ``stats``."""
    words = [getattr(args, "command", None), getattr(args, "subcommand", None)]
    return " ".join(word for word in words if word)


def _not_over_http(args: argparse.Namespace) -> str:
    """Why the command cannot run under ``--http`` (its parser's ``http_gap``, if any)."""
    gap = getattr(args, "http_gap", "") or "the HTTP memory API does not cover it"
    return (
        f"`{command_name(args)}` is not available with --http ({gap}); "
        "use --master HOST:PORT (gRPC) instead"
    )


@dataclasses.dataclass(frozen=True)
class CommonParents:
    """Parent parsers that let the global options also follow a subcommand.

    Attributes:
        base: ``--master``, ``--token``, ``--tenant``, ``--timeout``, ``--json``, ``--yes``.
        listing: ``base`` plus ``--format`` and ``--output``.
    """

    base: argparse.ArgumentParser
    listing: argparse.ArgumentParser

    @classmethod
    def create(cls) -> CommonParents:
        """Parents whose options default to "not given", so they never override the values
        parsed before the subcommand."""
        base = argparse.ArgumentParser(add_help=False)
        add_common_options(base, suppress=True, files=False)
        listing = argparse.ArgumentParser(add_help=False)
        add_common_options(listing, suppress=True, files=True)
        return cls(base, listing)


def add_common_options(parser: argparse.ArgumentParser, suppress: bool, files: bool) -> None:
    """Add the global options to ``parser``.

    Args:
        parser: the parser.
        suppress: leave unset options out of the namespace (for subcommand parsers).
        files: also add ``--format`` and ``--output``.
    """

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    group = parser.add_argument_group("global options")
    group.add_argument(
        "--master",
        metavar="HOST:PORT",
        default=default(os.environ.get("MOONCAKE_MASTER") or DEFAULT_MASTER),
        help=f"the master (env MOONCAKE_MASTER; default {DEFAULT_MASTER})",
    )
    group.add_argument(
        "--http",
        metavar="URL",
        default=default(os.environ.get("MOONCAKE_PY_HTTP", "")),
        help="use the master's HTTP memory API at URL (its --metrics_port, e.g. "
        "http://HOST:9003 or https://...) instead of gRPC, for the commands it covers; "
        "wins over --master, --http '' turns it off (env MOONCAKE_PY_HTTP)",
    )
    group.add_argument(
        "--token",
        default=default(os.environ.get("MOONCAKE_AUTH_TOKEN", "")),
        help="bearer token for a master with --auth_tokens_file (env MOONCAKE_AUTH_TOKEN)",
    )
    group.add_argument(
        "--tenant",
        default=default(os.environ.get("MOONCAKE_TENANT_ID") or None),
        help='tenant (env MOONCAKE_TENANT_ID; default "default", or the token\'s tenant)',
    )
    group.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        default=default(10.0),
        help="deadline of each master call (default 10)",
    )
    for option, variable, what in (
        ("--tls-ca", "MOONCAKE_PY_TLS_CA", "PEM CA that signs the master's certificate: TLS on"),
        ("--tls-cert", "MOONCAKE_PY_TLS_CERT", "PEM client certificate (mutual TLS)"),
        ("--tls-key", "MOONCAKE_PY_TLS_KEY", "PEM private key of --tls-cert"),
        (
            "--tls-server-name",
            "MOONCAKE_PY_TLS_SERVER_NAME",
            "name to check the master's certificate against instead of the --master host",
        ),
    ):
        group.add_argument(
            option,
            metavar="NAME" if option == "--tls-server-name" else "FILE",
            default=default(os.environ.get(variable, "")),
            help=f"{what} (env {variable})",
        )
    group.add_argument(
        "--json", action="store_true", default=default(False), help="print JSON for scripts"
    )
    group.add_argument(
        "--yes",
        "-y",
        action="store_true",
        default=default(False),
        help="do not ask before destructive commands",
    )
    if files:
        group.add_argument(
            "--format",
            choices=("csv", "parquet"),
            default=default(None),
            help="write the listing as CSV or Parquet (with --output FILE)",
        )
        group.add_argument(
            "--output",
            "-o",
            metavar="FILE",
            default=default(None),
            help="file for --format (CSV may go to stdout)",
        )
