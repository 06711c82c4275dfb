"""An etcd v3 client over a list of endpoints: failover, a per-call timeout, and the few
operations the election and the log store use.

It rides on ``aetcd`` (its gRPC channel, generated stubs and messages); the calls go to the
stubs directly because the election and the log store need what aetcd's wrappers leave out:
range limits and response revisions, a txn's raw responses, and watches that report a
cancelled or compacted stream instead of hiding it.

Failover: one endpoint is used at a time, the first of the list to begin with. A call that
finds it unreachable (gRPC ``UNAVAILABLE``) or gets no answer within the timeout
(``DEADLINE_EXCEEDED``: a member cut off from its quorum hangs requests) moves the client to
the next endpoint, and the call is tried there: once per endpoint, twice with a single endpoint
(the second time on a fresh connection). A failover closes the old channel once the calls in
flight on it have had their timeout; its watches end with :class:`EtcdError`. Every operation
here is safe to repeat (txns are built so by their callers: see :meth:`EtcdClient.txn`).

Thread-safety: one event loop; coroutines may be awaited concurrently.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aetcd
from aetcd import rpc
from aetcd.utils import prefix_range_end
from grpc import aio as grpc_aio

from mooncake_py.ha_names import parse_etcd_endpoints

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 2.0
"""Per-call timeout: a healthy etcd answers in milliseconds, a member without quorum never."""

MAX_RESPONSE_BYTES = 64 << 20
"""gRPC's receive limit on the channel (its default, 4 MiB, is below a few snapshot chunks)."""

_FAILOVER_CODES = (rpc.StatusCode.UNAVAILABLE, rpc.StatusCode.DEADLINE_EXCEEDED)
_CHANNEL_OPTIONS = {
    "grpc.max_receive_message_length": MAX_RESPONSE_BYTES,
    "grpc.max_send_message_length": MAX_RESPONSE_BYTES,
    # gRPC's default reconnect backoff grows to 120 s: far too slow to notice a restarted
    # member within a lease TTL.
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
}


class EtcdError(Exception):
    """etcd refused a request or answered it with an error."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered within the timeout."""


class EtcdCompacted(EtcdError):
    """A watch asked for history that etcd has compacted away."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"etcd history is compacted up to revision {compact_revision}")
        self.compact_revision = compact_revision


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd stores it (``create_revision`` is 0 for a key that does not exist)."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def of(cls, kv: Any) -> KeyValue:
        return cls(kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease)


@dataclass(frozen=True)
class RangeResult:
    """A range read: the keys in key order, whether more matched past the limit, and the
    store revision the read saw."""

    kvs: list[KeyValue]
    more: bool
    revision: int


@dataclass(frozen=True)
class TxnResult:
    """A txn's outcome: whether the compares held, the revision after it, and the results of
    the range operations of the branch that ran (in order; other operations are left out)."""

    succeeded: bool
    revision: int
    ranges: list[list[KeyValue]]


@dataclass(frozen=True)
class WatchEvent:
    """A change seen by a watch: ``deleted`` is False for a put."""

    deleted: bool
    kv: KeyValue


def compare_create_revision(key: bytes, revision: int) -> Any:
    """A txn compare: ``create_revision(key) == revision`` (0: the key does not exist)."""
    return rpc.Compare(
        key=key,
        target=rpc.Compare.CREATE,
        result=rpc.Compare.EQUAL,
        create_revision=revision,
    )


def compare_version(key: bytes, version: int) -> Any:
    """A txn compare: ``version(key) == version`` (0: the key does not exist)."""
    return rpc.Compare(
        key=key, target=rpc.Compare.VERSION, result=rpc.Compare.EQUAL, version=version
    )


def put_op(key: bytes, value: bytes, lease: int = 0) -> Any:
    """A txn operation storing ``value`` at ``key`` (under ``lease`` when non-zero)."""
    return rpc.RequestOp(request_put=rpc.PutRequest(key=key, value=value, lease=lease))


def range_op(
    key: bytes,
    range_end: bytes | None = None,
    *,
    limit: int = 0,
    descending: bool = False,
    keys_only: bool = False,
) -> Any:
    """A txn operation reading ``key`` (or ``[key, range_end)`` in key order, descending when
    asked, up to ``limit`` keys: 0 for all)."""
    return rpc.RequestOp(request_range=_range_request(key, range_end, limit, descending, keys_only))


def _range_request(
    key: bytes, range_end: bytes | None, limit: int, descending: bool, keys_only: bool
) -> Any:
    return rpc.RangeRequest(
        key=key,
        range_end=range_end or b"",
        limit=limit,
        keys_only=keys_only,
        sort_order=rpc.RangeRequest.DESCEND if descending else rpc.RangeRequest.ASCEND,
        sort_target=rpc.RangeRequest.KEY,
    )


def delete_op(key: bytes, range_end: bytes | None = None) -> Any:
    """A txn operation deleting ``key`` (or every key in ``[key, range_end)``)."""
    request = rpc.DeleteRangeRequest(key=key, range_end=range_end or b"")
    return rpc.RequestOp(request_delete_range=request)


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover exactly the keys starting with ``prefix``."""
    return prefix_range_end(prefix)


class EtcdClient:
    """A connection to an etcd cluster through any of its endpoints.

    Args:
        endpoints: ``etcd://h:p;h:p`` / ``h:p,h:p`` (see
            :func:`~mooncake_py.ha_names.parse_etcd_endpoints`) or ``(host, port)`` pairs.
        timeout_s: the limit of one attempt of one call on one endpoint.

    Raises:
        ValueError: no valid endpoint.
    """

    def __init__(
        self,
        endpoints: str | Sequence[tuple[str, int]],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        parsed = parse_etcd_endpoints(endpoints) if isinstance(endpoints, str) else endpoints
        self._endpoints: list[tuple[str, int]] = list(parsed)
        if not self._endpoints:
            raise ValueError("no etcd endpoint")
        self.timeout_s = timeout_s
        self._index = 0
        self._client: aetcd.Client | None = None
        self._connecting = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def endpoint(self) -> str:
        """``host:port`` of the endpoint in use (or to be used by the next call)."""
        host, port = self._endpoints[self._index]
        return f"{host}:{port}"

    async def _session(self) -> aetcd.Client:
        if self._closed:
            raise EtcdError("etcd client is closed")
        async with self._connecting:
            if self._client is None:
                host, port = self._endpoints[self._index]
                client = aetcd.Client(host, port, timeout=None, options=dict(_CHANNEL_OPTIONS))
                await client.connect()
                self._client = client
            return self._client

    async def _fail_over(self, broken: aetcd.Client) -> None:
        """Drop the channel of ``broken`` and move to the next endpoint (unless another call
        already did)."""
        if id(self._client) != id(broken):
            return
        self._client = None
        self._index = (self._index + 1) % len(self._endpoints)
        # Other calls may still be in flight on the old channel: it closes once they finish
        # (within their timeout); its watches then end with an EtcdError (see watch()).
        task = asyncio.get_running_loop().create_task(self._retire(broken))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, broken: aetcd.Client) -> None:
        try:
            if broken.channel is not None:
                await broken.channel.close(grace=self.timeout_s)
        except Exception as error:  # a dying channel may fail to close; it is dropped anyway
            log.debug("closing etcd channel: %r", error)

    async def _call(self, what: str, invoke: Callable[[aetcd.Client], Awaitable[T]]) -> T:
        """Run ``invoke`` on the current endpoint, failing over on ``UNAVAILABLE`` and
        timeouts, one attempt per endpoint (two with one endpoint)."""
        last: BaseException | None = None
        reason = ""
        # With one endpoint, a second attempt goes out on a fresh channel: the first may have
        # failed on a connection that broke when the member restarted.
        for _ in range(max(2, len(self._endpoints))):
            client = await self._session()
            try:
                return await invoke(client)
            except rpc.AioRpcError as error:
                if error.code() not in _FAILOVER_CODES:
                    raise EtcdError(f"etcd {what}: {error.code().name}: {error.details()}") from (
                        error
                    )
                last, reason = error, f"{error.code().name}: {error.details()}"
            except (TimeoutError, aetcd.ConnectionFailedError, aetcd.ConnectionTimeoutError) as e:
                last, reason = e, repr(e)
            log.debug(
                "etcd %s failed on %s (%s); trying the next endpoint", what, self.endpoint, reason
            )
            await self._fail_over(client)
        raise EtcdUnavailable(f"etcd {what}: no endpoint answered (last: {reason})") from last

    async def range(
        self,
        key: bytes,
        range_end: bytes | None = None,
        *,
        limit: int = 0,
        keys_only: bool = False,
        descending: bool = False,
    ) -> RangeResult:
        """Read ``key``, or the keys in ``[key, range_end)`` in key order (descending when
        asked), at most ``limit`` of them (0: all). A linearizable read.

        Raises:
            EtcdError, EtcdUnavailable.
        """
        request = _range_request(key, range_end, limit, descending, keys_only)

        async def invoke(client: aetcd.Client) -> RangeResult:
            response = await client.kvstub.Range(request, timeout=self.timeout_s)
            return RangeResult(
                [KeyValue.of(kv) for kv in response.kvs], response.more, response.header.revision
            )

        return await self._call("range", invoke)

    async def get(self, key: bytes) -> KeyValue | None:
        """The key, or None when it does not exist."""
        result = await self.range(key)
        return result.kvs[0] if result.kvs else None

    async def txn(
        self, compare: Sequence[Any], success: Sequence[Any], failure: Sequence[Any] = ()
    ) -> TxnResult:
        """An atomic "if every ``compare`` holds then ``success`` else ``failure``" (messages
        from :func:`compare_version`, :func:`put_op`, ...).

        A txn whose first attempt was lost in transit may have been applied before it is
        tried again on the next endpoint: callers build txns whose repetition is harmless or
        recognisable (a compare that the first application falsifies, with ranges in
        ``failure`` that show it).

        Raises:
            EtcdError: etcd refused the txn (too large, too many operations, ...).
            EtcdUnavailable: no endpoint answered.
        """
        request = rpc.TxnRequest(
            compare=list(compare), success=list(success), failure=list(failure)
        )

        async def invoke(client: aetcd.Client) -> TxnResult:
            response = await client.kvstub.Txn(request, timeout=self.timeout_s)
            ranges = [
                [KeyValue.of(kv) for kv in op.response_range.kvs]
                for op in response.responses
                if op.WhichOneof("response") == "response_range"
            ]
            return TxnResult(response.succeeded, response.header.revision, ranges)

        return await self._call("txn", invoke)

    async def delete_range(self, key: bytes, range_end: bytes | None = None) -> int:
        """Delete ``key`` or every key of ``[key, range_end)``; returns the revision after."""
        result = await self.txn([], [delete_op(key, range_end)])
        return result.revision

    async def lease_grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease; returns ``(lease_id, granted_ttl_s)`` (etcd may grant more than asked:
        it enforces a minimum of about 1.5 election timeouts)."""

        async def invoke(client: aetcd.Client) -> tuple[int, int]:
            response = await client.leasestub.LeaseGrant(
                rpc.LeaseGrantRequest(TTL=ttl_s), timeout=self.timeout_s
            )
            if response.error:
                raise EtcdError(f"etcd lease grant: {response.error}")
            return response.ID, response.TTL

        return await self._call("lease grant", invoke)

    async def lease_keepalive(self, lease_id: int) -> int:
        """Refresh a lease once; returns its new TTL in seconds, 0 when it no longer exists."""

        async def invoke(client: aetcd.Client) -> int:
            stream = client.leasestub.LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=self.timeout_s
            )
            async for reply in stream:
                return max(0, int(reply.TTL))
            raise EtcdError("etcd lease keepalive: stream ended without a reply")

        return await self._call("lease keepalive", invoke)

    async def lease_revoke(self, lease_id: int) -> None:
        """Revoke a lease: its keys are deleted at once. Revoking a lease that is already gone
        is not an error."""

        async def invoke(client: aetcd.Client) -> None:
            try:
                await client.leasestub.LeaseRevoke(
                    rpc.LeaseRevokeRequest(ID=lease_id), timeout=self.timeout_s
                )
            except rpc.AioRpcError as error:
                if error.code() != rpc.StatusCode.NOT_FOUND:
                    raise

        await self._call("lease revoke", invoke)

    async def compact(self, revision: int) -> None:
        """Drop etcd's history before ``revision`` (deleted keys give their space back once
        the backend is defragmented or reuses the pages). A revision already compacted is not
        an error."""

        async def invoke(client: aetcd.Client) -> None:
            try:
                await client.kvstub.Compact(
                    rpc.CompactionRequest(revision=revision), timeout=self.timeout_s
                )
            except rpc.AioRpcError as error:
                if "compacted" not in (error.details() or ""):
                    raise

        await self._call("compact", invoke)

    async def watch(
        self, key: bytes, range_end: bytes | None = None, *, start_revision: int = 0
    ) -> AsyncGenerator[list[WatchEvent], None]:
        """The changes to ``key`` (or ``[key, range_end)``) from ``start_revision`` on (0: from
        now), one list per etcd response, in revision order, until the caller stops iterating.

        Raises (from the iteration):
            EtcdCompacted: ``start_revision`` is older than etcd's compacted history, or the
                history was compacted while the watch lagged.
            EtcdError: etcd cancelled the watch or the stream ended.
            EtcdUnavailable: no endpoint accepted the watch within the timeout.
        """
        create = rpc.WatchCreateRequest(
            key=key, range_end=range_end or b"", start_revision=start_revision
        )

        async def open_stream(client: aetcd.Client) -> Any:
            stream = rpc.WatchStub(client.channel).Watch()
            try:
                await stream.write(rpc.WatchRequest(create_request=create))
                created = await asyncio.wait_for(stream.read(), self.timeout_s)
            except BaseException:
                stream.cancel()
                raise
            if created is grpc_aio.EOF:
                stream.cancel()
                raise EtcdError("etcd watch: stream ended before the watch was created")
            _check_watch_response(created, stream)
            return stream

        stream = await self._call("watch", open_stream)
        session = self._client
        try:
            while True:
                try:
                    response = await stream.read()
                except rpc.AioRpcError as error:
                    raise EtcdError(f"etcd watch: {error.code().name}: {error.details()}") from (
                        error
                    )
                except asyncio.CancelledError:
                    # Closing a channel (failover, close()) cancels its streams; only a
                    # cancellation of the caller's own task is passed on as one.
                    if self._client is session or _task_is_cancelling():
                        raise
                    raise EtcdError("etcd watch: its connection was closed") from None
                if response is grpc_aio.EOF:
                    raise EtcdError("etcd watch: stream ended")
                _check_watch_response(response, stream)
                if response.events:
                    yield [
                        WatchEvent(event.type == rpc.Event.DELETE, KeyValue.of(event.kv))
                        for event in response.events
                    ]
        finally:
            stream.cancel()

    async def close(self) -> None:
        """Close the channel; idempotent. Calls made afterwards raise :class:`EtcdError`, and
        so do open watches."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)


def _task_is_cancelling() -> bool:
    """Whether the running task was asked to cancel (always assumed on Python 3.10, which
    cannot tell)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling is None or cancelling() > 0


def _check_watch_response(response: Any, stream: Any) -> None:
    if response.compact_revision:
        stream.cancel()
        raise EtcdCompacted(response.compact_revision)
    if response.canceled:
        stream.cancel()
        raise EtcdError(f"etcd watch cancelled: {response.cancel_reason or 'no reason given'}")
