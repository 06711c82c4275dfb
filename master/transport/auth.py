"""Token authentication and tenant binding for master RPCs.

With ``--auth_tokens_file`` (YAML or JSON mapping) every call must present a token: gRPC calls
in the ``authorization: Bearer <token>`` metadata, stream-channel connections in an
``Authenticate`` frame first. Each entry is either ``token: tenant`` (role ``tenant``) or
``token: {tenant: T, role: admin|tenant}``. The caller's tenant comes from its token; a
request that names another tenant is refused with PERMISSION_DENIED, and one that names none
is bound to the token's tenant. So no call made with tenant A's token can reach tenant B's
keys or sessions, whichever RPC it uses. An ``admin`` token acts for its tenant's keys like
any other, and in addition sees every tenant's segments and figures and may mount shared
segments.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import json
import socket
from pathlib import Path
from typing import Any

import yaml

from mooncake_py.types import valid_tenant_id

from ..config import ConfigError

BEARER = "bearer "
ROLE_ADMIN = "admin"
ROLE_TENANT = "tenant"
ROLES = (ROLE_ADMIN, ROLE_TENANT)


class Denial(enum.Enum):
    """Why a call is refused."""

    UNAUTHENTICATED = "missing or invalid token"
    PERMISSION_DENIED = "the request names another tenant than its token's"


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    """What a token stands for.

    Attributes:
        tenant: the tenant it acts for.
        admin: the token has the ``admin`` role.
    """

    tenant: str
    admin: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Caller:
    """The identity of one call, as the pipeline sees it.

    Attributes:
        tenant: the token's tenant; "" when the master requires no token (the call acts for
            whichever tenant it names).
        admin: the token is an admin's, or the master requires no token (everything is
            visible to everyone then, as without authentication).
        peer_host: the address the call came from as its transport saw it (an IP address
            without port or brackets); None when unknown (in-process calls, unix sockets).
        authenticated: tokens are required and this caller presented a known one.
    """

    tenant: str
    admin: bool
    peer_host: str | None = None
    authenticated: bool = False


def _parse_entry(path: str, token: Any, value: Any) -> Principal:
    """One tokens-file entry to its principal.

    Raises:
        ConfigError: naming the entry, for an empty token, a tenant that is not a valid
            tenant id, an unknown role or unknown keys.
    """
    if not isinstance(token, str) or not token:
        raise ConfigError(f"auth tokens file {path!r}: bad entry {token!r}: {value!r}")
    role = ROLE_TENANT
    tenant = value
    if isinstance(value, dict):
        unknown = set(value) - {"tenant", "role"}
        if unknown:
            raise ConfigError(
                f"auth tokens file {path!r}: entry {token!r} has unknown keys {sorted(unknown)}"
            )
        tenant = value.get("tenant")
        role = value.get("role", ROLE_TENANT)
        if role not in ROLES:
            raise ConfigError(
                f"auth tokens file {path!r}: entry {token!r} has role {role!r}, "
                f"expected one of {', '.join(ROLES)}"
            )
    if not isinstance(tenant, str) or not tenant:
        raise ConfigError(f"auth tokens file {path!r}: bad entry {token!r}: {value!r}")
    if not valid_tenant_id(tenant):
        raise ConfigError(f"auth tokens file {path!r}: entry {token!r}: invalid tenant {tenant!r}")
    return Principal(tenant, role == ROLE_ADMIN)


class TokenAuthority:
    """Known tokens and the principal each one stands for. Immutable, so thread-safe.

    Args:
        tokens: token -> tenant (role tenant) or :class:`Principal`.
    """

    def __init__(self, tokens: dict[str, str | Principal]) -> None:
        self._principals = {
            token: p if isinstance(p, Principal) else Principal(p) for token, p in tokens.items()
        }

    @classmethod
    def from_file(cls, path: str) -> TokenAuthority:
        """Read a YAML or JSON mapping of token -> tenant or ``{tenant, role}``.

        Raises:
            ConfigError: unreadable file, not a mapping, or a bad entry (named).
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
            data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read auth tokens file {path!r}: {exc}") from exc
        if not isinstance(data, dict) or not data:
            raise ConfigError(f"auth tokens file {path!r} must map tokens to tenants")
        tokens: dict[str, str | Principal] = {
            token: _parse_entry(path, token, value) for token, value in data.items()
        }
        return cls(tokens)

    def principal_of(self, token: str | None) -> Principal | None:
        """What a token stands for, or None for an unknown or missing token. O(1)."""
        return self._principals.get(token) if token else None

    def tenant_of(self, token: str | None) -> str | None:
        """The tenant a token acts for, or None for an unknown or missing token."""
        principal = self.principal_of(token)
        return principal.tenant if principal is not None else None

    def principal_of_header(self, value: str | None) -> Principal | None:
        """The principal of an ``authorization: Bearer <token>`` header value."""
        if not value or not value.lower().startswith(BEARER):
            return None
        return self.principal_of(value[len(BEARER) :].strip())

    def tenant_of_header(self, value: str | None) -> str | None:
        """The tenant of an ``authorization: Bearer <token>`` header value."""
        principal = self.principal_of_header(value)
        return principal.tenant if principal is not None else None


def bind_tenant(request: Any, tenant: str) -> Denial | None:
    """Bind ``request`` to ``tenant``: fill an empty tenant, refuse another one.

    Requests without a tenant field pass unchanged.
    """
    for holder in (request, getattr(request, "put", None)):
        if holder is None or "tenant_id" not in holder.DESCRIPTOR.fields_by_name:
            continue
        if holder.tenant_id and holder.tenant_id != tenant:
            return Denial.PERMISSION_DENIED
        holder.tenant_id = tenant
    return None


def host_of_peer(peer: object) -> str | None:
    """The IP address of a transport's peer, normalized (no port, no brackets, no zone).

    Accepts gRPC's ``context.peer()`` strings (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``,
    ``ipv6:%5B::1%5D:5``) and asyncio's ``peername`` tuples (``(host, port, ...)``).

    Returns:
        The address, or None for anything else (unix sockets, unknown forms). O(len).
    """
    if isinstance(peer, tuple) and peer and isinstance(peer[0], str):
        host = peer[0]
    elif isinstance(peer, str):
        kind, _, rest = peer.partition(":")
        if kind not in ("ipv4", "ipv6"):
            return None
        rest = rest.replace("%5B", "[").replace("%5D", "]")
        host = rest.rpartition(":")[0].strip("[]")
    else:
        return None
    return normalize_host(host)


def normalize_host(host: str) -> str | None:
    """``host`` as a canonical IP address (IPv4-mapped IPv6 as IPv4, zone dropped), or None
    when it is not an IP address. O(len(host))."""
    try:
        address = ipaddress.ip_address(host.strip("[]").partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


def endpoint_attributed(endpoint: str, peer_host: str) -> bool:
    """Whether a segment's ``host:port`` endpoint names the host the caller connects from.

    A loopback caller runs on this host: it may declare any loopback address (``localhost``
    included) or any other address of this host (one a socket can bind to here); any other
    caller must declare exactly its own address. O(len(endpoint)), plus one ``bind`` for a
    loopback caller declaring a non-loopback address.
    """
    declared_text = endpoint.rpartition(":")[0]
    peer = ipaddress.ip_address(peer_host)
    if declared_text.strip("[]").lower() == "localhost":
        return peer.is_loopback
    declared = normalize_host(declared_text)
    if declared is None:
        return False
    if peer.is_loopback:
        return ipaddress.ip_address(declared).is_loopback or _is_local_address(declared)
    return declared == peer_host


def _is_local_address(host: str) -> bool:
    """Whether ``host`` (an IP address) is one of this host's own addresses."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
    except OSError:
        return False
    return True
