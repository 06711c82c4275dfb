"""The common batch put start in one flat pass over a run of keys.

Most batch writes are the same request: new keys, one replica each, no placement preference,
no group, no KV-session tag, every segment everyone's and the random strategy. For such a
call :class:`BatchStart` starts a run of keys (a slice's share of the batch) with a handful of
bulk steps instead of the per-key layers of :meth:`.writes.WritePath.start`:

1. sort the run's keys: a key that is new (no tenant has an object under it, and it does not
   come earlier in the run) and valid goes to the flat pass; any other key (an existing one,
   a repeat, an invalid one) waits for the general path;
2. place the new keys with :meth:`~..state.segments.SegmentManager.place_batch` (one allocator
   step per segment name), build their records and file each allocator's run at once
   (:meth:`~..state.objects.ObjectTable.insert_run`), minting the write capabilities per run;
3. start every other key through :meth:`.writes.WritePath.start`, in key order.

Each key gets the answer the general path would have given it when started in order. The new
keys cannot see one another, and the keys of step 3 see the objects of step 2 (a repeat of a
new key finds it being written: OBJECT_ALREADY_EXISTS). Only new keys take memory in a run
that goes this way: a run with a key that would take memory on the general path (a stale
object's key, which is preempted and written anew; another tenant's key) goes key by key in
order, and so does a run whose new keys do not all fit (``place_batch`` then places none), so
which keys find room, and what is evicted for them, is decided in key order as for single
writes. Placement differs in one way: a run's keys are spread over the names in contiguous
parts instead of one random name each (so with fragmented memory one way may need an eviction
the other does not).

Thread-safety: called by the service under its lock, one run per call.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from mooncake_py._wire.builders import frozen_builder
from mooncake_py.capability import MAP, WRITE
from mooncake_py.errors import ErrorCode
from mooncake_py.types import PutStartResult, ReplicaDescriptor, ReplicaStatus, ReplicateConfig

from ..state.objects import ObjectMetadata, PendingSoftPin, Replica, valid_key
from ..state.segments import PlacedRun
from ..state.store import StoreState
from .writes import WritePath

_PROCESSING = ReplicaStatus.PROCESSING
_OK = ErrorCode.OK
# One of each per key started (see frozen_builder).
_build_descriptor = frozen_builder(ReplicaDescriptor)
_build_started = frozen_builder(PutStartResult)


def flat_start_applies(config: ReplicateConfig, upsert: bool) -> bool:
    """Whether a write call with ``config`` may be started by :class:`BatchStart`: a put
    (not an upsert) of one replica per key, with no placement preference, group or KV-session
    tag. The store's side (:meth:`BatchStart.start_run`) is checked per run. O(1)."""
    return (
        not upsert
        and config.replica_num == 1
        and config.group_ids is None
        and config.kv_sessions is None
        and not config.preferred_segment
        and not config.preferred_segments
        and not config.prefer_alloc_in_same_node
    )


class BatchStart:
    """Starts runs of a batch put whose config :func:`flat_start_applies` (see the module)."""

    def __init__(self, state: StoreState, writes: WritePath, max_value_bytes: int) -> None:
        self._state = state
        self._writes = writes
        self._max_value_bytes = max_value_bytes

    def start_run(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
        pin: PendingSoftPin,
        attempt_id: int,
        first: int,
        stop: int,
        now: float,
    ) -> list[PutStartResult]:
        """The start results of ``keys[first:stop]`` (``sizes`` alike), in order: each what
        :meth:`.writes.WritePath.start` of the keys one by one would answer (INVALID_PARAMS
        for a bad key or size).

        Args:
            tenant: the resolved tenant.
            pin: the call's resolved soft pin.
            attempt_id: the call's attempt id (0: none), recorded for every key started.

        Complexity: O(run) bulk steps, plus the general path's cost for the keys it takes.
        """
        state = self._state
        # The records keep interned strings (as WritePath.start's): one copy per writer.
        client_id, tenant = sys.intern(client_id), sys.intern(tenant)
        fresh = self._fresh_keys(tenant, keys, sizes, first, stop, now)
        runs = state.segments.place_batch([sizes[i] for i in fresh]) if fresh else []
        if fresh is None or (fresh and not runs):
            # Order matters here (see _fresh_keys), or memory is short: every key in order,
            # as single starts.
            return [
                self._start_one(client_id, tenant, keys[i], sizes[i], config, pin, attempt_id, now)
                for i in range(first, stop)
            ]
        results: list[PutStartResult | None] = [None] * (stop - first)
        for run in runs:
            self._create_run(
                client_id,
                tenant,
                keys,
                sizes,
                config,
                pin,
                attempt_id,
                fresh,
                run,
                first,
                results,
                now,
            )
        for j, result in enumerate(results):
            if result is None:
                i = first + j
                results[j] = self._start_one(
                    client_id, tenant, keys[i], sizes[i], config, pin, attempt_id, now
                )
        return results  # type: ignore[return-value]  # every entry was filled above

    def _fresh_keys(
        self,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        first: int,
        stop: int,
        now: float,
    ) -> list[int] | None:
        """The positions in ``[first, stop)`` of the keys the flat pass starts: valid, new (no
        tenant has an object under the key) and not named earlier in the run. None when the
        run must go key by key in order: placement is not spread (see
        :attr:`~..state.segments.SegmentManager.spreads_batches`), or another key of the run
        would take memory on the general path (an object of the key is stale and would be
        preempted, or the key is another tenant's), so that its place in the order could
        decide which keys find room. The other keys (invalid ones, repeats, objects of the
        tenant that are readable or being written) take none. O(stop - first)."""
        state = self._state
        if not state.segments.spreads_batches:
            return None
        objects = state.objects
        holds_key, get, is_stale = objects.holds_key, objects.get, self._writes.is_stale
        limit = self._max_value_bytes
        fresh: list[int] = []
        seen: set[str] = set()
        for i in range(first, stop):
            key = keys[i]
            if not valid_key(key) or not 0 < sizes[i] <= limit or key in seen:
                continue
            seen.add(key)
            if not holds_key(key):
                fresh.append(i)
                continue
            existing = get((tenant, key))
            if existing is None or is_stale(existing, now):
                return None
        return fresh

    def _start_one(
        self,
        client_id: str,
        tenant: str,
        key: str,
        size: int,
        config: ReplicateConfig,
        pin: PendingSoftPin,
        attempt_id: int,
        now: float,
    ) -> PutStartResult:
        """The general path's start of one key (with the batch path's validation)."""
        if not valid_key(key) or not 0 < size <= self._max_value_bytes:
            return PutStartResult(ErrorCode.INVALID_PARAMS)
        return self._writes.start(
            client_id, tenant, key, size, config, None, [], pin, now, False, attempt_id
        )

    def _create_run(
        self,
        client_id: str,
        tenant: str,
        keys: Sequence[str],
        sizes: Sequence[int],
        config: ReplicateConfig,
        pin: PendingSoftPin,
        attempt_id: int,
        fresh: list[int],
        run: PlacedRun,
        first: int,
        results: list[PutStartResult | None],
        now: float,
    ) -> None:
        """Create the objects of one placed run and put their answers into ``results``."""
        state = self._state
        segment = run.segment
        info = segment.info
        segment_id = info.id
        offsets = run.offsets
        positions = fresh[run.first : run.first + len(offsets)]
        run_keys = [keys[i] for i in positions]
        next_replica_id, next_write_id = state.next_replica_id, state.next_write_id
        data_type, hard_pin = int(config.data_type), config.with_hard_pin
        replicas = [
            Replica(next_replica_id(), segment_id, offset, sizes[i], _PROCESSING)
            for i, offset in zip(positions, offsets, strict=True)
        ]
        metas = [
            ObjectMetadata(
                tenant,
                key,
                replica.size,
                client_id,
                now,
                (replica,),
                data_type,
                0.0,
                next_write_id(),
                hard_pin,
                0.0,
                pin,
            )
            for key, replica in zip(run_keys, replicas, strict=True)
        ]
        state.objects.insert_run(
            tenant, run_keys, metas, segment_id, segment.allocator, offsets, now, attempt_id
        )
        signer = segment.signer
        if signer is None or info.shared or info.disk:
            # The rare segments (no key, shared: grants are recorded): the general describe.
            describe = state.describe
            for meta, replica, i in zip(metas, replicas, positions, strict=True):
                described = (describe(meta, replica, WRITE),)
                results[i - first] = _build_started(
                    code=_OK, replicas=described, write_id=meta.write_id, retry_after_ms=0
                )
            return
        # What StoreState.describe mints for a writer of its own tenant's object.
        mode = WRITE | MAP if not segment.tenant or segment.tenant == tenant else WRITE
        expires = state.segments.wall_ms() + state.write_grant_ms
        mint = signer.mint
        name, endpoint, host_id = info.name, info.te_endpoint, info.host_id
        for meta, replica, i in zip(metas, replicas, positions, strict=True):
            offset, size = replica.offset, replica.size
            descriptor = _build_descriptor(
                id=replica.id,
                status=_PROCESSING,
                segment_id=segment_id,
                segment_name=name,
                offset=offset,
                size=size,
                te_endpoint=endpoint,
                host_id=host_id,
                capability=mint(offset, size, mode, expires),
                disk=False,
            )
            results[i - first] = _build_started(
                code=_OK, replicas=(descriptor,), write_id=meta.write_id, retry_after_ms=0
            )
