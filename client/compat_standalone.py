"""Upstream's standalone ("dummy client") calls on the drop-in store, and its host allocator.

Upstream Mooncake runs one real client per host (``mooncake_client``) that owns the host's
segment; engine processes attach to it with ``setup_dummy`` and hand it shared host memory.
Here the per-host process is ``mooncake-py-client`` (:mod:`mooncake_py.client.standalone`).

- :class:`MooncakeHostMemAllocator` (module level, as ``mooncake.store``'s): ``alloc(size)``
  returns the address of ``size`` bytes of new shared memory (raises ``RuntimeError`` when
  it cannot, ``TypeError`` for a negative size); ``free(ptr)`` returns 0, or -1 for an address
  that no allocation starts at. It works before any store exists (SGLang allocates its host
  KV pool first). Such memory registered on a standalone store is what ``put_from`` /
  ``get_into`` and their batch forms copy from and into, zero copy, in the service.
- :class:`StandaloneCalls`, a base class of :class:`~mooncake_py.MooncakeDistributedStore`:
  ``setup_dummy(mem_pool_size, local_buffer_size, server_address) -> int`` (0, or a negative
  code) and ``alloc_from_mem_pool(size) -> int`` (an address, 0 on failure or on a store not
  set up with ``setup_dummy``, as upstream's real client answers).

Thread-safety: every method may be called from several threads at once.
"""

from __future__ import annotations

from typing import Any

from mooncake_py.errors import ErrorCode, MooncakeError

from .mixin_bases import StoreBase
from .standalone_attach import Attachment, host_memory
from .standalone_client import StandaloneClient
from .standalone_wire import socket_path_for

INVALID = int(ErrorCode.INVALID_PARAMS)
OK = int(ErrorCode.OK)


def _size_t(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{name} must be a non-negative int: {value!r}")
    return value


class MooncakeHostMemAllocator:
    """Shared host memory for standalone mode (upstream's ``MooncakeHostMemAllocator``).

    Every allocation is anonymous shared memory of its own, so the standalone service can
    map it; it is freed by :meth:`free` or when this process exits. Instances share one
    process-wide registry (as upstream's allocator shares its ``ShmHelper``).
    """

    def alloc(self, size: int) -> int:
        """The address of ``size`` new zero-filled bytes.

        Raises:
            TypeError: ``size`` is not a non-negative int.
            RuntimeError: ``size`` is 0, or the memory cannot be created.

        Complexity: O(log n) in live allocations, plus the kernel's mapping cost.
        """
        return host_memory().allocate(size).address

    def free(self, ptr: int) -> int:
        """Release the allocation starting at ``ptr``: 0, or -1 when none starts there.

        Stores it was registered with stop using it (their service unmaps it) first.
        """
        if isinstance(ptr, bool) or not isinstance(ptr, int):
            raise TypeError(f"ptr must be an int: {ptr!r}")
        return 0 if host_memory().free(ptr) else -1


class StandaloneCalls(StoreBase):
    """``setup_dummy`` and ``alloc_from_mem_pool`` (upstream's names and returns).

    Written against :class:`~mooncake_py.MooncakeDistributedStore`'s ``client`` attribute
    (the typed client, None before setup) and its ``_lock``: after ``setup_dummy`` the
    client is a :class:`~mooncake_py.client.standalone_client.StandaloneClient`, so every
    other store call runs in the service unchanged.
    """

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Attach to this host's standalone client instead of joining the store.

        Args:
            mem_pool_size: bytes of host memory this process means to register (the
                service is told; its own ``--max_pool_size`` is what caps the mapping).
            local_buffer_size: accepted for upstream's sake; no staging buffer is needed.
            server_address: the service's ``host:port`` (the port names its socket, see
                ``mooncake-py-client --port``), or ``unix:/path`` / ``/path`` of its socket.

        Returns:
            0; INVALID_PARAMS (-600) when the store is already set up or the address is not
            one; RPC_FAIL (-900) when no service of this user answers there.

        Raises:
            TypeError: a size is not a non-negative int, or the address not a str (as the
                upstream binding raises).
        """
        pool = _size_t("mem_pool_size", mem_pool_size)
        local = _size_t("local_buffer_size", local_buffer_size)
        if not isinstance(server_address, str):
            raise TypeError(f"server_address must be a str: {server_address!r}")
        try:
            path = socket_path_for(server_address)
        except ValueError:
            return INVALID
        with self._lock:
            if self.client is not None:
                return INVALID
            try:
                attachment = Attachment(path, pool, local)
            except MooncakeError as exc:
                return exc.code
            self.client = StandaloneClient(attachment)
        return OK

    def alloc_from_mem_pool(self, size: int) -> int:
        """``size`` bytes of shared host memory, registered with this store at once (a later
        ``register_buffer`` of it answers 0 too). Free it with
        ``MooncakeHostMemAllocator().free(ptr)``.

        Returns:
            The address; 0 when the store was not set up with :meth:`setup_dummy` (as
            upstream's real client answers), for a size of 0, or when the memory cannot be
            created.

        Raises:
            TypeError: ``size`` is not a non-negative int.
        """
        _size_t("size", size)
        client = self.client
        if not isinstance(client, StandaloneClient) or client.closed or size == 0:
            return 0
        memory = host_memory()
        try:
            region = memory.allocate(size)
        except RuntimeError:
            return 0
        try:
            client.register_buffer(region.address, size)
        except MooncakeError:
            memory.free(region.address)
            return 0
        return region.address
