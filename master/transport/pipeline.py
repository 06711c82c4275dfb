"""The one call pipeline every master RPC goes through, whichever transport carried it.

For each call, in this order:

1. **authenticate**: when the master requires tokens, a caller without a known token is
   refused (:attr:`Rejection.UNAUTHENTICATED`) before its bytes are even parsed;
2. **decode**: request bytes that do not parse (bad wire bytes, invalid UTF-8 in a string) are
   refused (:attr:`Rejection.UNDECODABLE`, with the parse error in the text);
3. **bind the tenant**: a request naming another tenant than the token's is refused
   (:attr:`Rejection.PERMISSION_DENIED`); one naming none acts for the token's tenant; then
   the principal's checks (:mod:`.principals`): a ``client_id`` belongs to the tenant that
   first used it, so a call carrying another tenant's client id is refused
   (PERMISSION_DENIED); a shared segment may be mounted only with an admin token
   (PERMISSION_DENIED); a mounted segment's endpoint must name the caller's own host
   (answered INVALID_PARAMS); and ``all_tenants`` of the views (GetStats, ListSegments) is
   set from the token's role, whatever the caller sent;
4. **run**: the request's fields become the target's arguments, the target runs and its
   result becomes the response (all as :mod:`mooncake_py._wire.rpcs` declares);
5. **record**: :class:`~mooncake_py.master.metrics.RpcCounters` counts the call, failed when
   the answer carries a non-zero code;
6. **map errors**: an unexpected exception in step 4 is logged and answered with the RPC's
   INTERNAL_ERROR answer (counted as failed), so one bad request never takes the master down.

Refused calls get no answer message and are not counted. Transports only frame calls and turn
a :class:`Rejection` into their own status: gRPC aborts with UNAUTHENTICATED,
INVALID_ARGUMENT or PERMISSION_DENIED, the stream channel answers with status 3, 1 or 4.

**Sliced calls.** An RPC the table marks ``sliced`` (bulk removals, releases, session
updates and listings: work that grows with the store) has a generator target that yields
between bounded slices (:mod:`mooncake_py.master.service.slices`). Transports start it with
:meth:`CallPipeline.call_sliced` and run it with :func:`drive_on_loop`, one slice per step of
the event loop, so the calls of other connections run in between; the steps above are the
same, and a refusal comes before any slice.

Thread-safety: calls run on the event loop thread (targets never block); the pipeline holds no
per-call state, so a transport may run calls from any single thread.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import operator
import time
from collections.abc import Callable, Generator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from google.protobuf.message import DecodeError

from mooncake_py._wire.rpcs import RPCS, Rpc

from ..metrics import RpcCounters
from ..service.facade import SERVICE_VERSION, MasterService
from ..service.slices import Steps, drive
from .auth import Caller, Denial, Principal, TokenAuthority, bind_tenant, host_of_peer
from .principals import PrincipalChecks

if TYPE_CHECKING:
    from ..ha.replicator import Replicator

log = logging.getLogger(__name__)

T = TypeVar("T")

ENCODE_CHUNK = 2048
"""Items of a batch answer encoded per slice (about a millisecond's work)."""

LOOP_STEPS_BETWEEN_SLICES = 4
"""Steps of the event loop between two slices of a sliced call. A gRPC call needs several
steps of the loop (its completion-queue events come one per step), so with one step between
slices it would wait several slices; a few steps cost little (microseconds each)."""
Answer = tuple["Rejection | None", bytes]

NOT_LEADER_TEXT = "this master lost the leadership: the call's changes were not replicated"
NOT_SERVING_TEXT = "this master is not the leader (any more): the call was not run"


class Rejection(enum.Enum):
    """Why the pipeline refused a call without running it; the value is the text sent back."""

    UNAUTHENTICATED = Denial.UNAUTHENTICATED.value
    UNDECODABLE = "undecodable request"
    PERMISSION_DENIED = Denial.PERMISSION_DENIED.value


_UNAUTHENTICATED_TEXT = Rejection.UNAUTHENTICATED.value.encode()
_PERMISSION_DENIED_TEXT = Rejection.PERMISSION_DENIED.value.encode()


class BoundCall:
    """One RPC bound to its target: everything a call needs, resolved once.

    Attributes:
        rpc: the table entry.
        sliced: the RPC is a sliced call (``rpc.sliced``).
        parse: request bytes -> request message; raises DecodeError.
        run: a parsed, tenant-bound request -> the serialized answer (steps 4 to 6); a
            sliced call runs every slice back to back.
        run_sliced: the same as a sliced operation; None for a plain RPC.
        checked: the per-caller checks (:mod:`.principals`) can apply to its calls on this
            master; False skips them.
    """

    __slots__ = ("rpc", "sliced", "parse", "run", "run_sliced", "checked")

    def __init__(
        self,
        rpc: Rpc,
        runners: tuple[Callable[[Any], bytes], Callable[[Any], Steps[bytes]] | None],
    ) -> None:
        self.rpc = rpc
        self.sliced = rpc.sliced
        self.parse = rpc.request_type.FromString
        self.run, self.run_sliced = runners
        # Whether the per-caller checks apply (set by the pipeline, which knows the master).
        self.checked = True


class CallPipeline:
    """Authenticates, decodes, binds, runs, records and guards every call.

    Args:
        service: the service the RPC targets belong to.
        authority: the known tokens; None when the master requires none.
        counters: where calls are counted.

    Attributes:
        service: as given (targets are paths from here: ``service.exist_key``).
        counters: as given.
        fast_port: the stream channel's port, advertised by ServiceReady (0: none).
        calls: every RPC by name, bound.

    Raises:
        AttributeError: a table target does not exist on ``service``.
    """

    def __init__(
        self,
        service: MasterService,
        authority: TokenAuthority | None,
        counters: RpcCounters,
    ) -> None:
        self.service = service
        self.counters = counters
        self.fast_port = 0
        # Set once the metadata is replicated: transports answer a call that changed
        # something only when the replicator says its change is durable.
        self.replicator: Replicator | None = None
        # Set for an HA leader: whether it may still answer (its election holds); transports
        # refuse calls (UNAVAILABLE) when it says no.
        self.serving: Callable[[], bool] | None = None
        self._authority = authority
        self._checks = PrincipalChecks(service, authority is not None)
        self.calls: Mapping[str, BoundCall] = {
            name: BoundCall(rpc, self._runner(rpc)) for name, rpc in RPCS.items()
        }
        for bound in self.calls.values():
            bound.checked = self._checks.applies_to(bound.rpc)

    @property
    def requires_token(self) -> bool:
        """Whether callers must present a token."""
        return self._authority is not None

    def service_ready(self) -> tuple[str, int]:
        """ServiceReady's answer: ``(version, stream-channel port or 0)``."""
        return SERVICE_VERSION, self.fast_port

    def authenticate(self, token: str | None, peer: object = None) -> Caller | None:
        """The identity of a caller presenting ``token`` (None: no token yet) from ``peer``.

        Args:
            token: the presented token.
            peer: where the call comes from, as the transport saw it (gRPC's
                ``context.peer()`` or a socket's ``peername``); None when unknown.

        Returns:
            Its :class:`~.auth.Caller`; None (unauthenticated) when tokens are required and
            ``token`` is missing or unknown. Without tokens the caller acts for whichever
            tenant it names and counts as admin.
        """
        if self._authority is None:
            return Caller("", True, host_of_peer(peer))
        return self._caller_of(self._authority.principal_of(token), peer)

    def authenticate_bearer(self, header: str | None, peer: object = None) -> Caller | None:
        """:meth:`authenticate` for an ``authorization: Bearer <token>`` header value."""
        if self._authority is None:
            return Caller("", True, host_of_peer(peer))
        return self._caller_of(self._authority.principal_of_header(header), peer)

    @staticmethod
    def _caller_of(principal: Principal | None, peer: object) -> Caller | None:
        if principal is None:
            return None
        return Caller(principal.tenant, principal.admin, host_of_peer(peer), authenticated=True)

    def call(self, bound: BoundCall, payload: bytes, tenant: Caller | str | None) -> Answer:
        """Run one call of ``bound`` with request bytes ``payload`` for identity ``tenant``
        (the :class:`~.auth.Caller` from :meth:`authenticate`; a bare tenant string stands
        for a caller of that tenant from no known address, an admin only when the master
        requires no token); a sliced call runs every slice back to back.

        Returns:
            ``(None, serialized answer)``, or ``(rejection, UTF-8 text)`` for a refused call.

        Complexity: that of the target plus O(payload) for decoding and encoding.
        """
        admitted = self._admit(bound, payload, tenant)
        if isinstance(admitted, tuple):
            return admitted
        return None, bound.run(admitted)

    def call_sliced(
        self, bound: BoundCall, payload: bytes, tenant: Caller | str | None
    ) -> Steps[Answer]:
        """:meth:`call` of a sliced RPC (``bound.sliced``) as a sliced operation, for
        :func:`drive_on_loop`; a refusal comes before the first slice."""
        assert bound.run_sliced is not None, f"{bound.rpc.name} is not sliced"
        admitted = self._admit(bound, payload, tenant)
        if isinstance(admitted, tuple):
            return admitted
        return None, (yield from bound.run_sliced(admitted))

    def _admit(self, bound: BoundCall, payload: bytes, caller: Caller | str | None) -> Any:
        """Steps 1 to 3: the parsed, tenant-bound request, or the refusal or early ``Answer``."""
        if isinstance(caller, str):
            required = self._authority is not None
            caller = Caller(caller, not required, authenticated=required)
        if self._authority is not None and caller is None:
            return Rejection.UNAUTHENTICATED, _UNAUTHENTICATED_TEXT
        try:
            request = bound.parse(payload)
        except DecodeError as exc:
            return Rejection.UNDECODABLE, f"{Rejection.UNDECODABLE.value}: {exc}".encode()
        if caller is None:
            caller = Caller("", True)
        if caller.authenticated and bind_tenant(request, caller.tenant) is not None:
            return Rejection.PERMISSION_DENIED, _PERMISSION_DENIED_TEXT
        if not bound.checked:
            return request
        verdict = self._checks.admit(bound.rpc, request, caller)
        if verdict is None:
            return request
        if verdict.code is None:
            return Rejection.PERMISSION_DENIED, verdict.text.encode()
        self.counters.record(bound.rpc.name, True)
        return None, bound.rpc.response_type(code=verdict.code).SerializeToString()

    def _runner(
        self, rpc: Rpc
    ) -> tuple[Callable[[Any], bytes], Callable[[Any], Steps[bytes]] | None]:
        """The runner of ``rpc`` (steps 4 to 6) and, for a sliced RPC, its sliced form."""
        target = operator.attrgetter(rpc.target)(self)
        if rpc.sliced != inspect.isgeneratorfunction(target):
            raise TypeError(f"{rpc.name}: sliced={rpc.sliced} but its target disagrees")
        decode_args = rpc.args.decode
        encode = plain_encode = rpc.result.encode
        name = rpc.name
        record = self.counters.record
        answers_code = rpc.answers_code
        failure = rpc.failure

        def failed(request: Any) -> bytes:
            log.exception("%s failed", name)
            record(name, True)
            answer: bytes = failure(request).SerializeToString()
            return answer

        batch_answer = rpc.batch_answer
        compact, compact_applies = rpc.result.compact, rpc.result.compact_applies

        def run_sliced(request: Any) -> Generator[None, None, bytes]:
            try:
                value = yield from target(*decode_args(request))
                # A client that reads answers in columns asks for them (see rpcs.Result).
                encode = compact if compact is not None and request.compact else plain_encode
                seen: dict[str, Any] = {}
                if batch_answer and len(value) > ENCODE_CHUNK:
                    # Encoding 100k answers takes most of a second: in parts, between slices.
                    parts: list[bytes] = []
                    start = 0
                    while start < len(value):
                        if start:
                            yield
                        chunk = value[start : start + ENCODE_CHUNK]
                        if encode is compact and not compact_applies(chunk, seen):
                            encode, parts, start = plain_encode, [], 0  # again, per key
                            continue
                        parts.append(encode(chunk).SerializeToString())
                        start += ENCODE_CHUNK
                    record(name, False)
                    return b"".join(parts)
                if encode is compact and not compact_applies(value, seen):
                    encode = plain_encode
                response = encode(value)
                answer: bytes = response.SerializeToString()
            except Exception:
                return failed(request)
            record(name, answers_code and response.code != 0)
            return answer

        if rpc.sliced:
            return lambda request: drive(run_sliced(request)), run_sliced

        def run(request: Any) -> bytes:
            # The hot path of every plain call: no generator.
            try:
                response = encode(target(*decode_args(request)))
                answer: bytes = response.SerializeToString()
            except Exception:
                return failed(request)
            record(name, answers_code and response.code != 0)
            return answer

        return run, None


async def drive_on_loop(steps: Steps[T]) -> T:
    """Run a sliced operation on the running event loop, one slice per step of the loop.

    Between two slices every ready callback runs (other connections' calls, timers), so no
    caller waits for more than about one slice. Cancelling the awaiting task stops the
    operation between two slices (what was done stays done).
    """
    try:
        while True:
            try:
                next(steps)
            except StopIteration as done:
                result: T = done.value
                return result
            # gRPC's completion-queue poller is a thread of its own: give it the GIL now
            # rather than after the interpreter's switch interval (5 ms) into the next slice,
            # once per event of each call it hands over.
            time.sleep(0)
            for _ in range(LOOP_STEPS_BETWEEN_SLICES):
                await asyncio.sleep(0)
    finally:
        steps.close()
