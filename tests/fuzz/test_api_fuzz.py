"""Fuzz of the public API: the drop-in ``MooncakeDistributedStore``, the typed ``Client`` and
their asyncio twins, with generated bad and odd arguments (:mod:`tests.fuzz.api_strategies`).

Properties, for every generated call on a real store of a real in-process master:

- the drop-in face answers a data call with its documented code or empty value (an int, a
  list with one entry per key, ``b""``, None); it raises only TypeError for an argument of a
  type its signature does not take, :class:`MooncakeError` where upstream raises (session calls,
  ``put_parts`` with a part that is not one-dimensional) and ValueError / TypeError where
  ``batch_probe_key`` documents them;
- the typed face raises only :class:`MooncakeError` subclasses (TypeError for an odd type,
  ValueError where ``batch_probe_key`` documents it) and returns one result per key;
- nobody answers INTERNAL_ERROR and no exception escapes a master handler.

After every example: a value written before the fuzz (in another tenant, hard-pinned) still
reads byte-exact, the fuzzed store still writes and reads a fresh value byte-exact, and the
master's ``check()`` passes.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mooncake_py import (
    AsyncClient,
    AsyncMooncakeStore,
    BatchResult,
    ErrorCode,
    MooncakeDistributedStore,
    MooncakeError,
    ReplicateConfig,
)
from mooncake_py.testing import InProcessMaster
from tests.fuzz import api_strategies as gen
from tests.fuzz.common import (
    TALLY,
    HandlerExceptions,
    assert_no_unexpected,
    describe_exception,
    fuzz_settings,
    watch_master_exceptions,
)

INTERNAL = int(ErrorCode.INTERNAL_ERROR)
CANARY_KEY = "canary/known"
CANARY_VALUE = hashlib.sha256(b"canary").digest() * 4096  # 128 KiB
FACES = ("compat", "typed", "compat_async", "typed_async")
# Calls of the drop-in face that raise MooncakeError as upstream does.
RAISING_COMPAT = set(gen.SESSION_CALLS) | {"put_parts", "upsert_parts"}
INT_ANSWERS = {
    "put",
    "upsert",
    "put_batch",
    "upsert_batch",
    "put_parts",
    "upsert_parts",
    "put_from",
    "upsert_from",
    "get_into",
    "get_size",
    "is_exist",
    "probe_key",
    "remove",
    "remove_by_regex",
    "remove_all",
    "register_buffer",
}
PER_KEY_ANSWERS = {
    "batch_put_from",
    "batch_upsert_from",
    "batch_put_from_multi_buffers",
    "batch_get_into",
    "batch_get_into_multi_buffers",
    "batch_is_exist",
    "batch_probe_key",
    "batch_remove",
    "batch_get_buffer",
    "get_batch",
    "attach_kv_session",
}


class Rig:
    """The stores under fuzz, their buffers, and the canary that must never change."""

    def __init__(self, master: InProcessMaster, watcher: HandlerExceptions) -> None:
        self.master = master
        self.watcher = watcher
        self.canary = _store(master.address, 8 << 20, "canary")
        assert self.canary.put(CANARY_KEY, CANARY_VALUE, ReplicateConfig(with_hard_pin=True)) == 0
        self.store = _store(master.address, 64 << 20, "default")
        self.buffer = np.zeros(gen.BUFFER_BYTES, np.uint8)
        self.unregistered = np.zeros(1 << 16, np.uint8)  # real memory nobody registered
        self.loop = asyncio.new_event_loop()
        self.compat_async = AsyncMooncakeStore(self.store)
        assert self.store.client is not None
        self.typed_async = AsyncClient(self.store.client)
        self.examples = 0
        self.probes = 0

    def face(self, name: str) -> Any:
        return {
            "compat": self.store,
            "typed": self.store.client,
            "compat_async": self.compat_async,
            "typed_async": self.typed_async,
        }[name]

    def invoke(self, face: str, call: gen.Call) -> Any:
        """Run ``call`` on ``face``; returns its answer (raises what it raises)."""
        base, other = self.buffer.ctypes.data, self.unregistered.ctypes.data
        args = [gen.resolve(a.value, base, other) for a in call.args]
        kwargs = {k: gen.resolve(a.value, base, other) for k, a in call.kwargs}
        method = getattr(self.face(face), call.method)
        if inspect.iscoroutinefunction(method):
            return self.loop.run_until_complete(method(*args, **kwargs))
        return method(*args, **kwargs)

    def before_example(self) -> None:
        self.examples += 1
        # Registering a start again replaces its size: the full buffer is usable again.
        assert self.store.register_buffer(self.buffer.ctypes.data, self.buffer.nbytes) == 0
        if self.examples % 25 == 0:  # keep the state (and check()) small
            self.store.remove_all(force=True)

    def after_example(self, example: str) -> None:
        for signature, text in self.watcher.take():
            TALLY.record(f"api:master:{signature}", example, text)
        if self.canary.get(CANARY_KEY) != CANARY_VALUE:
            try:
                detail = f"typed get: {len(self.canary.client.get(CANARY_KEY))} bytes"  # type: ignore[union-attr]
            except MooncakeError as exc:
                detail = f"typed get raised {exc!r}"
            TALLY.record("api:lost-value:canary", example, detail)
        self.probes += 1
        key, value = f"probe/{self.probes}", hashlib.sha256(example.encode()).digest() * 31
        code = self.store.put(key, value)
        if code == ErrorCode.NO_AVAILABLE_HANDLE:  # the example filled the store: make room
            self.store.remove_all(force=True)
            code = self.store.put(key, value)
        if code != 0 or self.store.get(key) != value:
            TALLY.record("api:stops-serving", example, f"fresh put answered {code}")
        self.store.remove(key, force=True)
        try:
            self.master.service.check()
        except AssertionError as exc:
            TALLY.record("api:check-failed", example, describe_exception(exc)[1])

    def close(self) -> None:
        # Leaving their ``async with`` closes the stores and stops their thread pools.
        for twin in (self.typed_async, self.compat_async):
            self.loop.run_until_complete(twin.__aexit__(None, None, None))
        self.loop.close()
        self.store.close()
        self.canary.close()


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


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    # Tenants need their own key spaces: the fuzzed tenant must not reach the canary's.
    with watch_master_exceptions() as watcher, InProcessMaster(enable_multi_tenants=True) as master:
        built = Rig(master, watcher)
        yield built
        built.close()
        master.service.check()


def _keys_of(call: gen.Call) -> list[Any] | None:
    """The call's key list, when its first argument is a well-typed list of keys."""
    first = call.args[0].value if call.args else None
    return list(first) if isinstance(first, list | tuple) and not call.args[0].odd else None


def _internal_in(answer: Any) -> bool:
    if isinstance(answer, BatchResult):
        return INTERNAL in answer.codes
    if isinstance(answer, list):
        return any(isinstance(a, int) and not isinstance(a, bool) and a == INTERNAL for a in answer)
    return isinstance(answer, int) and not isinstance(answer, bool) and answer == INTERNAL


def judge_compat(call: gen.Call, answer: Any) -> str | None:
    """What is wrong with the drop-in face's ``answer`` to ``call``, or None."""
    method = call.method
    if _internal_in(answer):
        return "INTERNAL_ERROR answered"
    if method == "get" and not isinstance(answer, bytes):
        return f"get answered {type(answer).__name__}"
    if method == "get_buffer" and answer is not None:
        try:
            memoryview(answer)
        except TypeError:
            return f"get_buffer answered {type(answer).__name__}, no buffer"
    if method in INT_ANSWERS and (not isinstance(answer, int) or isinstance(answer, bool)):
        return f"answered {type(answer).__name__}, not an int"
    if method in {"put", "upsert", "put_from", "upsert_from", "put_batch", "remove"} and answer > 0:
        return "a positive status code"
    if method in PER_KEY_ANSWERS:
        if not isinstance(answer, list):
            return f"answered {type(answer).__name__}, not a list"
        keys = _keys_of(call)
        expected = len(keys) if keys is not None else None
        if method == "get_batch" and keys == []:
            expected = 1  # [b""] for no keys, as upstream
        if expected is not None and len(answer) != expected:
            return f"{len(answer)} answers for {expected} keys"
    return None


def judge_typed(call: gen.Call, answer: Any) -> str | None:
    """What is wrong with the typed face's ``answer`` to ``call``, or None."""
    if _internal_in(answer):
        return "INTERNAL_ERROR answered"
    if isinstance(answer, BatchResult):
        keys = _keys_of(call)
        if keys is not None and len(answer.codes) != len(keys):
            return f"{len(answer.codes)} results for {len(keys)} keys"
    return None


def allowed_exception(face: str, call: gen.Call, exc: BaseException) -> bool:
    """Whether ``exc`` is a documented answer of ``face`` to ``call``."""
    if isinstance(exc, MooncakeError):
        if exc.code == INTERNAL:
            return False
        return face.startswith("typed") or call.method in RAISING_COMPAT
    if call.method == "batch_probe_key" and isinstance(exc, TypeError | ValueError):
        return True
    return isinstance(exc, TypeError) and not call.well_typed


def classify(call: gen.Call, exc: BaseException, where: str) -> str:
    """A signature naming the cause, for the causes already understood (so a finding keeps its
    name when the code raising it moves); otherwise the exception and where it was raised."""
    if isinstance(exc, AttributeError) and call.odd_config:
        return "config-not-a-ReplicateConfig:AttributeError"
    if isinstance(exc, UnicodeEncodeError):
        return "lone-surrogate-reaches-protobuf:UnicodeEncodeError"
    if type(exc) is ValueError and "out of range" in str(exc):
        return "int-out-of-field-range-reaches-protobuf:ValueError"
    return where


def run_call(rig: Rig, face: str, call: gen.Call) -> None:
    """Run one call and record what breaks its face's contract."""
    TALLY.count(f"api:{face}")
    example = f"{face}: {call!r}"
    try:
        answer = rig.invoke(face, call)
    except Exception as exc:  # everything is judged: the property is what may escape
        if not allowed_exception(face, call, exc):
            where, text = describe_exception(exc)
            TALLY.record(f"api:escaped:{classify(call, exc, where)}", example, text)
        return
    problem = (judge_typed if face.startswith("typed") else judge_compat)(call, answer)
    if problem is not None:
        TALLY.record(f"api:{call.method}:{problem}", example, repr(answer)[:500])


@fuzz_settings(default_examples=600)
@given(
    face=st.sampled_from(FACES),
    sequence=st.lists(gen.calls(), min_size=1, max_size=5),
)
def _fuzz_api(rig: Rig, face: str, sequence: list[gen.Call]) -> None:
    rig.before_example()
    for call in sequence:
        run_call(rig, face, call)
    rig.after_example(f"{face}: {sequence!r}")


def test_api_calls_keep_their_contract(rig: Rig) -> None:
    _fuzz_api(rig)
    assert rig.examples > 0
    assert_no_unexpected("api:")
