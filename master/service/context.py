"""What the master's services share: one lock, the state it guards, the clock, and the tenant rule.

:class:`MasterService` builds one :class:`ServiceContext` and hands it to each service it
composes (KV sessions, release), so a service depends on these four things and nothing else
of the facade.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from mooncake_py.types import valid_tenant_id

from ..state.store import StoreState

DEFAULT_TENANT = "default"


@dataclasses.dataclass(frozen=True, slots=True)
class TenantResolver:
    """Maps a request's tenant id to the key space it addresses.

    Attributes:
        multi_tenant: True when tenants have separate key spaces; otherwise every request
            addresses ``DEFAULT_TENANT`` whatever id it carries.

    Thread-safety: immutable; safe from any thread.
    """

    multi_tenant: bool

    def resolve(self, tenant: str) -> str | None:
        """The effective tenant of a request. O(len(tenant)).

        Returns:
            ``DEFAULT_TENANT`` without multi-tenancy or for an empty id; the id itself when
            :func:`mooncake_py.types.valid_tenant_id` accepts it; None for an invalid id (the
            caller answers INVALID_PARAMS).
        """
        if not self.multi_tenant or not tenant:
            return DEFAULT_TENANT
        return tenant if valid_tenant_id(tenant) else None


@dataclasses.dataclass(frozen=True, slots=True)
class ServiceContext:
    """The dependencies every master service shares.

    Attributes:
        lock: the one lock over all master state; hold it for every read or change of
            ``state``. No other lock exists, so there is no lock order to respect.
        state: the master's state (objects, segments, clients, sessions, eviction policy).
        clock: returns the service time in seconds (a ``FakeClock`` in tests); read it under
            ``lock`` when the result is stored in ``state``.
        tenants: the tenant rule every request goes through.
    """

    lock: threading.Lock
    state: StoreState
    clock: Callable[[], float]
    tenants: TenantResolver
