"""Fuzz of every master RPC (:data:`mooncake_py._wire.rpcs.RPCS`) on both transports, gRPC and
the stream channel, with generated request messages and raw bytes
(:mod:`tests.fuzz.rpc_strategies`).

Properties, against a real master (in this process, and as a child process) that a real
client fills with objects and KV sessions:

- a generated message (which always serializes) is answered: gRPC OK, stream status 0, with
  a response that parses as the RPC's response type;
- raw bytes are answered so too, or refused as undecodable (gRPC INVALID_ARGUMENT naming
  "undecodable request", stream status 1), never anything else;
- no answer carries INTERNAL_ERROR and no exception escapes a handler (the pipeline logs each
  one it turns into INTERNAL_ERROR; the test watches that log);
- after every example the master still serves a value stored before the fuzz (in a tenant no
  request names) byte-exact, over the stream channel, and (in-process) its ``check()`` passes.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import socket
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given
from hypothesis import strategies as st

from mooncake_py import ErrorCode, MooncakeDistributedStore, MooncakeError, ReplicateConfig
from mooncake_py._proto import master_pb2 as pb
from mooncake_py._wire.frames import (
    STATUS_OK,
    STATUS_UNDECODABLE,
    read_response,
    request_frame,
)
from mooncake_py._wire.rpcs import RPCS, Rpc
from mooncake_py.testing import InProcessMaster, MasterProcess
from tests.fuzz import rpc_strategies as gen
from tests.fuzz.api_strategies import KEY_POOL, SESSION_POOL
from tests.fuzz.common import (
    TALLY,
    assert_no_unexpected,
    describe_exception,
    fuzz_settings,
    watch_master_exceptions,
)
from tests.soak.run import LogDrain

INTERNAL = int(ErrorCode.INTERNAL_ERROR)
CANARY_KEY = "canary/rpc"
CANARY_VALUE = hashlib.sha256(b"rpc canary").digest() * 2048
NAMES = sorted(RPCS)


class StreamConnection:
    """One stream-channel connection sending frames by hand (reconnects after a close)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._ids = itertools.count(1)
        self._sock: socket.socket | None = None

    def call(self, rpc: Rpc, payload: bytes) -> tuple[int, bytes]:
        """``(status, body)`` of one call.

        Raises:
            OSError: the connection failed or the master closed it (then the next call
                reconnects).
        """
        if self._sock is None:
            self._sock = socket.create_connection((self.host, self.port), timeout=30)
        call_id = next(self._ids) & 0x7FFFFFFF
        try:
            self._sock.sendall(request_frame(call_id, rpc.wire_name, payload))
            answered, status, body = read_response(self._sock)
        except OSError:
            self.close()
            raise
        if answered != call_id:
            self.close()
            raise ConnectionError(f"answer to call {answered}, expected {call_id}")
        return status, body

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class RpcRig:
    """The master, the clients giving it state, and raw connections to both transports.

    Args:
        address: the master's gRPC address.
        handler_errors: ``(signature, text)`` of each exception that escaped a handler since
            the last call (the pipeline logs each one).
        check: the master's ``check()`` when it runs in this process, else None.
    """

    def __init__(
        self,
        address: str,
        handler_errors: Callable[[], list[tuple[str, str]]],
        check: Callable[[], None] | None,
    ) -> None:
        self.handler_errors = handler_errors
        self.check = check
        self.canary = _store(address, 4 << 20, gen.FORBIDDEN_TENANT)
        assert self.canary.put(CANARY_KEY, CANARY_VALUE, ReplicateConfig(with_hard_pin=True)) == 0
        self.canary_present = True
        self.victim = _store(address, 16 << 20, "default")
        core = self.victim.client._core  # type: ignore[union-attr]  # noqa: SLF001 - real ids
        assert core is not None
        gen.RUNTIME_IDS[:] = [core.client_id, *(s.id for s in core.segments())]
        self.channel = grpc.insecure_channel(address)
        self.grpc_calls = {
            name: self.channel.unary_unary(rpc.path, request_serializer=None)
            for name, rpc in RPCS.items()
        }
        ready = pb.ServiceReadyResponse.FromString(self.grpc_calls["ServiceReady"](b"", timeout=30))
        assert ready.fast_port > 0, "the master offers no stream channel"
        self.stream = StreamConnection("127.0.0.1", ready.fast_port)
        self.examples = 0
        self.seed_state()

    def restore_canary(self, example: str) -> None:
        """Write the canary again (preferring its own segment); until that works it is not
        checked, so a failed restore is one finding, not one per later example."""
        config = ReplicateConfig(with_hard_pin=True, preferred_segment=self.canary.get_hostname())
        try:
            self.canary_present = self.canary.put(CANARY_KEY, CANARY_VALUE, config) == 0
        except Exception as exc:  # noqa: BLE001 - the drop-in face's data calls never raise
            where, text = describe_exception(exc)
            TALLY.record(f"rpc:client-raised:{classify_client_error(exc, where)}", example, text)
            self.canary_present = False

    def seed_state(self, example: str = "(setup)") -> None:
        """Objects under the pool's keys, tagged with the pool's sessions, one pinned.

        The writes go wherever the master places them, also into segments that fuzzed
        MountSegment requests announced: a data call of the drop-in face must still answer
        with a code there, so anything it raises is a finding.
        """
        values = [key.encode() * 512 for key in KEY_POOL]
        tags = [[SESSION_POOL[i % len(SESSION_POOL)]] for i in range(len(KEY_POOL))]
        try:
            self.victim.upsert_batch(KEY_POOL, values, ReplicateConfig(kv_sessions=tags))
        except Exception as exc:  # noqa: BLE001 - the drop-in face's data calls never raise
            where, text = describe_exception(exc)
            TALLY.record(f"rpc:client-raised:{classify_client_error(exc, where)}", example, text)
        with contextlib.suppress(MooncakeError):  # a fuzzed request may have released it
            self.victim.pin_kv_session(SESSION_POOL[0])

    def after_example(self, example: str, name: str, payload: bytes) -> None:
        self.examples += 1
        for signature, text in self.handler_errors():
            TALLY.record(f"rpc:handler-raised:{signature}", example, text)
        if not self.canary_present:
            self.restore_canary(example)
        elif self.canary.get(CANARY_KEY) != CANARY_VALUE:
            if _removes_every_tenant(name, payload):
                # Documented: with multi-tenancy, RemoveAll naming no tenant removes every
                # tenant's objects (as upstream). Put the canary back.
                self.restore_canary(example)
            else:
                TALLY.record("rpc:lost-value:canary", example, "the canary changed or vanished")
        try:
            if self.check is not None:
                self.check()
        except AssertionError as exc:
            TALLY.record("rpc:check-failed", example, describe_exception(exc)[1])
        if self.examples % 50 == 0:
            self.seed_state(example)

    def close(self) -> None:
        self.stream.close()
        self.channel.close()
        self.victim.close()
        self.canary.close()


def classify_client_error(exc: BaseException, where: str) -> str:
    """A signature naming the cause, for causes already understood; else type and place."""
    if type(exc) is ValueError and "invalid literal for int()" in str(exc):
        return "malformed-te-endpoint:ValueError"
    return where


def _removes_every_tenant(name: str, payload: bytes) -> bool:
    if name != "RemoveAll":
        return False
    try:
        return pb.RemoveAllRequest.FromString(payload).tenant_id == ""
    except DecodeError:
        return False


def _store(address: str, segment_bytes: int, tenant: str) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    config = {
        "local_hostname": "127.0.0.1",
        "metadata_server": "P2PHANDSHAKE",
        "global_segment_size": segment_bytes,
        "master_server_address": address,
        "tenant_id": tenant,
    }
    assert store.setup(config) == 0
    return store


@pytest.fixture(scope="module", params=["in-process", "subprocess"])
def rpc_rig(request: pytest.FixtureRequest) -> Iterator[RpcRig]:
    """A rig on an in-process master (whose ``check()`` runs after every example) and on a
    master process (whose log is watched for handler errors)."""
    if request.param == "in-process":
        with (
            watch_master_exceptions() as watcher,
            InProcessMaster(enable_multi_tenants=True) as master,
        ):
            built = RpcRig(master.address, watcher.take, master.service.check)
            yield built
            built.close()
            master.service.check()
        return
    with MasterProcess(["--enable_multi_tenants", "true"]) as process:
        assert process.process is not None
        log = LogDrain(process.process.stderr)

        def logged_errors() -> list[tuple[str, str]]:
            return [(f"logged: {line[:120]}", line) for line in log.take_new_errors()]

        built = RpcRig(process.address, logged_errors, None)
        yield built
        built.close()
        assert process.process.poll() is None, "the master process died"


def carries_internal(message: Any) -> bool:
    """Whether any ``code`` / ``codes`` field anywhere in ``message`` is INTERNAL_ERROR."""
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            continue
        if field.name in ("code", "codes"):
            values = value if field.is_repeated else [value]
            if INTERNAL in values:
                return True
        elif field.message_type is not None:
            items = value if field.is_repeated else [value]
            if any(carries_internal(item) for item in items):
                return True
    return False


def judge_answer(rpc: Rpc, body: bytes) -> str | None:
    """What is wrong with an answered call's response bytes, or None."""
    try:
        response = rpc.response_type.FromString(body)
    except DecodeError as exc:
        return f"the answer does not parse: {exc}"
    if carries_internal(response):
        return "INTERNAL_ERROR answered"
    return None


def send_both(rig: RpcRig, rpc: Rpc, payload: bytes, decodable: bool, example: str) -> None:
    """Send ``payload`` to ``rpc`` on both transports and record what breaks the contract."""
    TALLY.count("rpc:grpc")
    problem: str | None
    try:
        problem = judge_answer(rpc, rig.grpc_calls[rpc.name](payload, timeout=30))
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""  # type: ignore[attr-defined]
        undecodable = code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(
            "undecodable request"
        )
        problem = None if undecodable and not decodable else f"gRPC {code.name}: {details[:200]}"
    if problem is not None:
        TALLY.record(f"rpc:grpc:{rpc.name}:{problem[:60]}", example, problem)

    TALLY.count("rpc:stream")
    try:
        status, body = rig.stream.call(rpc, payload)
    except OSError as exc:
        TALLY.record(f"rpc:stream:{rpc.name}:connection lost", example, repr(exc))
        return
    if status == STATUS_OK:
        problem = judge_answer(rpc, body)
    elif status == STATUS_UNDECODABLE and not decodable:
        problem = None
    else:
        problem = f"status {status}: {body[:200]!r}"
    if problem is not None:
        TALLY.record(f"rpc:stream:{rpc.name}:{problem[:60]}", example, problem)


_requests = st.sampled_from(NAMES).flatmap(
    lambda name: st.tuples(st.just(name), gen.messages(RPCS[name].request_type.DESCRIPTOR))
)
_raw = st.sampled_from(NAMES).flatmap(
    lambda name: st.tuples(st.just(name), gen.raw_payloads(RPCS[name].request_type.DESCRIPTOR))
)


@fuzz_settings(default_examples=1000)
@given(request=_requests)
def _fuzz_messages(rig: RpcRig, request: tuple[str, Any]) -> None:
    name, message = request
    example = f"{name}({message})".replace("\n", " ")
    payload = message.SerializeToString()
    send_both(rig, RPCS[name], payload, True, example)
    rig.after_example(example, name, payload)


@fuzz_settings(default_examples=800)
@given(request=_raw)
def _fuzz_raw_bytes(rig: RpcRig, request: tuple[str, tuple[str, bytes]]) -> None:
    name, (made, payload) = request
    example = f"{name} <- {made} {payload!r}"
    send_both(rig, RPCS[name], payload, False, example)
    rig.after_example(example, name, payload)


def test_generated_requests_are_answered_on_both_transports(rpc_rig: RpcRig) -> None:
    _fuzz_messages(rpc_rig)
    assert rpc_rig.examples > 0
    assert_no_unexpected("rpc:")


def test_raw_bytes_are_answered_or_refused_on_both_transports(rpc_rig: RpcRig) -> None:
    _fuzz_raw_bytes(rpc_rig)
    assert_no_unexpected("rpc:")
    # The master still serves a plain client's calls over gRPC too.
    ready = pb.ServiceReadyResponse.FromString(rpc_rig.grpc_calls["ServiceReady"](b"", timeout=30))
    assert ready.version.startswith("mooncake-py")
