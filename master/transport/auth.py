"""Token authentication and tenant binding for master RPCs.

With ``--auth_tokens_file`` (YAML or JSON mapping token -> tenant) every call must present a
token: gRPC calls in the ``authorization: Bearer <token>`` metadata, stream-channel
connections in an ``Authenticate`` frame first. The caller's tenant comes from its token; a
request that names another tenant is refused with PERMISSION_DENIED, and one that names none
is bound to the token's tenant. So no call made with tenant A's token can reach tenant B's
keys or sessions, whichever RPC it uses.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

import yaml

from mooncake_py.types import valid_tenant_id

from ..config import ConfigError

BEARER = "bearer "


class Denial(enum.Enum):
    """Why a call is refused."""

    UNAUTHENTICATED = "missing or invalid token"
    PERMISSION_DENIED = "the request names another tenant than its token's"


class TokenAuthority:
    """Known tokens and the tenant each one acts for. Immutable, so thread-safe.

    Args:
        tokens: token -> tenant.
    """

    def __init__(self, tokens: dict[str, str]) -> None:
        self._tokens = dict(tokens)

    @classmethod
    def from_file(cls, path: str) -> TokenAuthority:
        """Read a YAML or JSON mapping of token -> tenant.

        Raises:
            ConfigError: unreadable file, not a mapping, or empty / invalid entries.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
            data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read auth tokens file {path!r}: {exc}") from exc
        if not isinstance(data, dict) or not data:
            raise ConfigError(f"auth tokens file {path!r} must map tokens to tenants")
        tokens: dict[str, str] = {}
        for token, tenant in data.items():
            if not isinstance(token, str) or not token or not isinstance(tenant, str) or not tenant:
                raise ConfigError(f"auth tokens file {path!r}: bad entry {token!r}: {tenant!r}")
            if not valid_tenant_id(tenant):
                raise ConfigError(f"auth tokens file {path!r}: invalid tenant {tenant!r}")
            tokens[token] = tenant
        return cls(tokens)

    def tenant_of(self, token: str | None) -> str | None:
        """The tenant a token acts for, or None for an unknown or missing token."""
        return self._tokens.get(token) if token else None

    def tenant_of_header(self, value: str | None) -> str | None:
        """The tenant of an ``authorization: Bearer <token>`` header value."""
        if not value or not value.lower().startswith(BEARER):
            return None
        return self.tenant_of(value[len(BEARER) :].strip())


def bind_tenant(request: Any, tenant: str) -> Denial | None:
    """Bind ``request`` to ``tenant``: fill an empty tenant, refuse another one.

    Requests without a tenant (segments, ping) pass unchanged.
    """
    for holder in (request, getattr(request, "put", None)):
        if holder is None or "tenant_id" not in holder.DESCRIPTOR.fields_by_name:
            continue
        if holder.tenant_id and holder.tenant_id != tenant:
            return Denial.PERMISSION_DENIED
        holder.tenant_id = tenant
    return None
