"""The queries and removals of the typed :class:`~mooncake_py.Client`: existence checks and
probes, sizes, replica descriptors, and removal by key, pattern or tenant.

None of them moves an object's bytes. The lookups among them (``get_size`` and the replica
descriptors) end their read leases at once, so they hold no memory; ``is_exist`` leaves an
existence hold, as upstream's contract needs (see :meth:`QueryCalls.is_exist`). Errors are the
typed exceptions of :mod:`mooncake_py.errors`; every call is thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence

from mooncake_py.errors import ErrorCode, InvalidParamsError, raise_for
from mooncake_py.types import ProbeLeaseMode

from .buffers import keys_ok
from .core import ClientCore
from .replica_desc import ReplicaDescriptor, SegmentDirectory
from .results import BatchResult

OK = 0
INVALID = int(ErrorCode.INVALID_PARAMS)


def invalid_params(message: str, key: str | None = None) -> InvalidParamsError:
    """The INVALID_PARAMS exception for a malformed call (shared by the Client's modules)."""
    return InvalidParamsError(INVALID, message, key)


def check_keys(keys: Sequence[str]) -> None:
    """Raise INVALID_PARAMS unless every key is a non-empty UTF-8 string."""
    if not keys_ok(keys):
        raise invalid_params("keys must be non-empty UTF-8 strings")


class ClientPart:
    """A part of :class:`~mooncake_py.Client` kept in a module of its own (a base class of
    it): its calls reach the joined core through :meth:`_joined`."""

    def _joined(self) -> ClientCore:
        """The joined core; :class:`~mooncake_py.Client` overrides this."""
        raise NotImplementedError


class QueryCalls(ClientPart):
    """The query and removal half of :class:`~mooncake_py.Client` (a base class of it).

    Attributes:
        _segments: where replica descriptors find segment base addresses (set by the client).
    """

    _segments: SegmentDirectory

    def is_exist(self, key: str) -> bool:
        """Whether ``key`` is readable, as upstream's ``is_exist``: a key found now can still
        be read next.

        A found key gets an *existence hold* for this client: until this client's next read
        of the key takes it over (that read's end gives it back), or the lease TTL passes, the
        object cannot be removed without ``force`` (OBJECT_HAS_LEASE) and is evicted only
        after objects nobody holds. It protects no bytes. Use :meth:`probe_key` for a check
        that holds nothing.

        Raises:
            InvalidParamsError: a bad key.
        """
        result = self.batch_is_exist([key])
        return result[0].unwrap()

    def batch_is_exist(self, keys: Sequence[str]) -> BatchResult[bool]:
        """Per key whether it is readable, in one round trip; found keys get existence holds
        as with :meth:`is_exist`."""
        core = self._joined()
        check_keys(keys)
        if not keys:
            return BatchResult(keys, [], [])
        if len(keys) == 1:
            raw = [core.master.exist_key(core.tenant, keys[0], core.client_id)]
        else:
            raw = core.master.batch_exist_key(core.tenant, keys, core.client_id)
        return BatchResult(keys, [min(c, 0) for c in raw], [c == 1 for c in raw])

    def probe_key(self, key: str) -> bool:
        """Whether ``key`` is readable, holding nothing (upstream's lease-free probe): a
        remove or eviction may take the key right after.

        Raises:
            InvalidParamsError: a bad key.
        """
        core = self._joined()
        check_keys([key])
        code = core.master.probe_key(core.tenant, key)
        raise_for(code, key=key)
        return code == 1

    def batch_probe_key(
        self,
        keys: Sequence[str],
        lease_mode: ProbeLeaseMode = ProbeLeaseMode.NONE,
        candidate_size: int = 1,
    ) -> BatchResult[bool]:
        """Per key whether it is readable, in one round trip.

        Args:
            keys: the keys to probe.
            lease_mode: ``NONE`` holds nothing (``candidate_size`` is then ignored).
                ``LAST_HIT_ONLY``: the keys form consecutive candidates of ``candidate_size``
                keys (e.g. the pages of successively longer prefixes); only the last candidate
                whose every key is readable is selected: its keys answer True and get
                existence holds for this client (as :meth:`is_exist`), every other key answers
                False (not selected, not necessarily absent).
            candidate_size: keys per candidate for ``LAST_HIT_ONLY``.

        Raises:
            InvalidParamsError: a bad key, an unknown mode, a negative ``candidate_size``, or
                for ``LAST_HIT_ONLY`` one that is 0 or does not divide ``len(keys)``.
        """
        core = self._joined()
        check_keys(keys)
        try:
            mode = ProbeLeaseMode(lease_mode)
        except ValueError:
            raise invalid_params(f"unknown probe lease mode {lease_mode!r}") from None
        if not isinstance(candidate_size, int) or candidate_size < 0:
            raise invalid_params(f"candidate_size must be a non-negative int: {candidate_size!r}")
        if not keys:
            return BatchResult(keys, [], [])
        if mode == ProbeLeaseMode.LAST_HIT_ONLY and (
            candidate_size == 0 or len(keys) % candidate_size
        ):
            raise invalid_params(
                f"candidate_size {candidate_size} does not divide {len(keys)} keys"
            )
        raw = core.master.batch_probe_key(core.tenant, keys, core.client_id, mode, candidate_size)
        return BatchResult(keys, [min(c, 0) for c in raw], [c == 1 for c in raw])

    def get_size(self, key: str) -> int:
        """The size of ``key`` in bytes (a lookup whose read lease ends at once). Raises as
        :meth:`get`."""
        core = self._joined()
        check_keys([key])
        located = core.locate([key])
        core.drop_reads(located)
        raise_for(located[0].code, key=key)
        return located[0].size

    def remove(self, key: str, force: bool = False) -> None:
        """Delete ``key``. With ``force``, readers copying it meanwhile finish on the old
        bytes (its memory is reused once they are done).

        Raises:
            NotFoundError: no such key. BusyError: OBJECT_HAS_LEASE while a read is in flight
                or an ``is_exist`` hold lasts (unless ``force``); being written.
        """
        raise_for(self.batch_remove([key], force).codes[0], key=key)

    def batch_remove(self, keys: Sequence[str], force: bool = False) -> BatchResult[None]:
        """Delete each key; per-key outcomes as :meth:`remove`."""
        core = self._joined()
        check_keys(keys)
        if not keys:
            return BatchResult.of_codes(keys, [])
        if len(keys) == 1:
            codes = [core.master.remove(core.tenant, keys[0], force)]
        else:
            codes = core.master.batch_remove(core.tenant, keys, force)
        return BatchResult.of_codes(keys, codes)

    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Delete every key of this tenant matching the pattern; returns the count removed.

        Raises:
            InvalidParamsError: the pattern is not a valid regular expression.
        """
        core = self._joined()
        if not isinstance(regex_pattern, str):
            raise invalid_params("the pattern must be a string")
        count = core.master.remove_by_regex(core.tenant, regex_pattern, force)
        raise_for(count)
        return count

    def remove_all(self, force: bool = False) -> int:
        """Delete every removable key of this tenant; returns the count removed."""
        core = self._joined()
        count = core.master.remove_all(core.tenant, force)
        raise_for(count)
        return count

    def batch_demote(self, keys: Sequence[str]) -> BatchResult[None]:
        """Move each key from memory to its owner's disk tier now (an operator's demotion:
        the master spills it, or drops its memory when it is on disk already); it stays
        readable throughout. Per key: OK, or NotFoundError, BusyError (being written or
        read), NotSupportedError (UNABLE_OFFLOAD: no disk tier may hold it)."""
        core = self._joined()
        check_keys(keys)
        if not keys:
            return BatchResult.of_codes(keys, [])
        return BatchResult.of_codes(keys, core.master.demote_objects(core.tenant, keys))

    def batch_replica_clear(self, keys: Sequence[str], segment_name: str = "") -> list[str]:
        """Drop this client's own objects that nothing holds (upstream's
        ``batch_replica_clear``): with no ``segment_name`` the whole object, when every
        replica is complete; with one, only the object's replicas on segments of that name
        (the object too when none is left). Keys this client did not write, keys being read
        or held by an ``is_exist``, writes in flight and missing keys are skipped. Memory
        comes back at once.

        Returns:
            The keys cleared, in the order given.

        Raises:
            InvalidParamsError: ``keys`` is not a sequence of strings, ``segment_name`` not a
                string, or more keys than the master's batch limit.
        """
        core = self._joined()
        if isinstance(keys, str) or not isinstance(segment_name, str):
            raise invalid_params("keys must be a sequence of strings, segment_name a string")
        names = list(keys)
        if not all(isinstance(k, str) for k in names):
            raise invalid_params("keys must be strings")
        code, cleared = core.master.batch_replica_clear(
            core.client_id, core.tenant, names, segment_name
        )
        raise_for(code)
        return list(cleared)

    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        """Where the replicas of ``key`` are (upstream's ``get_replica_desc``): one
        :class:`~mooncake_py.ReplicaDescriptor` per readable replica.

        A probe: the lookup's read lease ends at once (as :meth:`get_size`), so it holds no
        memory; the descriptors tell where the bytes were, and a remove or eviction may move
        them right after. Like every read, it takes over this client's existence hold on
        the key (see :meth:`is_exist`).

        Raises:
            NotFoundError: no such key. BusyError: its first write is still in flight.
            InvalidParamsError: a bad key.
        """
        return self.batch_get_replica_desc([key])[0].unwrap()

    def batch_get_replica_desc(self, keys: Sequence[str]) -> BatchResult[list[ReplicaDescriptor]]:
        """:meth:`get_replica_desc` for each key, in one lookup (plus, the first time a
        replica names a segment this client has not seen, one segment listing); per-key
        outcomes."""
        core = self._joined()
        check_keys(keys)
        if not keys:
            return BatchResult(keys, [], [])
        located = core.locate(keys)
        core.drop_reads(located)
        values: list[list[ReplicaDescriptor] | None] = [
            self._segments.describe(core, loc) if loc.code == OK else None for loc in located
        ]
        return BatchResult(keys, [loc.code for loc in located], values)
