"""Hypothesis strategies for calls of the public store API with bad and odd arguments.

A generated call is a method name and :class:`Arg` values. Each argument knows whether it is
*odd*: of a type (or an integer range) the method's signature does not take, where raising
TypeError is the documented answer (upstream's pybind11 binding raises TypeError for those;
so do ``ReplicateConfig`` and ``bytes_view``). A call with no odd argument is *well typed*:
the compat face must then answer with its code or empty value, and the typed face raise only
:class:`~mooncake_py.MooncakeError`.

Addresses are symbolic (:class:`Ptr`) until the test resolves them against its real buffers,
so strategies can be built at import time.
"""

from __future__ import annotations

import array
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from mooncake_py import ReplicateConfig

BUFFER_BYTES = 1 << 20
"""The registered scratch buffer every zero-copy call may use."""

KEY_POOL = [f"k{i}" for i in range(8)]
SESSION_POOL = ["s0", "s1", "s2"]


@dataclasses.dataclass(frozen=True)
class Arg:
    """One generated argument: its value and whether its type is outside the signature."""

    value: Any
    odd: bool = False
    role: str = ""  # "config" for a ReplicateConfig argument

    def __repr__(self) -> str:
        text = repr(self.value)
        return (text[:120] + f"...<{len(text)} chars>") if len(text) > 160 else text


@dataclasses.dataclass(frozen=True)
class Ptr:
    """A symbolic address: ``offset`` bytes into the registered buffer (``"reg"``), into memory
    that was never registered (``"unreg"``), or the absolute value ``offset`` (``"abs"``)."""

    kind: str
    offset: int


@dataclasses.dataclass(frozen=True)
class Call:
    """One generated call: ``method(*args, **kwargs)`` on one of the faces."""

    method: str
    args: tuple[Arg, ...]
    kwargs: tuple[tuple[str, Arg], ...] = ()

    @property
    def well_typed(self) -> bool:
        return not any(a.odd for a in self.args) and not any(a.odd for _, a in self.kwargs)

    @property
    def odd_config(self) -> bool:
        """A config argument that is no :class:`ReplicateConfig` at all."""
        every = list(self.args) + [a for _, a in self.kwargs]
        return any(a.role == "config" and a.odd for a in every)

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={a!r}" for k, a in self.kwargs]
        return f"{self.method}({', '.join(parts)})"


def resolve(value: Any, registered: int, unregistered: int) -> Any:
    """``value`` with every :class:`Ptr` (also inside lists) turned into a real address."""
    if isinstance(value, Ptr):
        if value.kind == "reg":
            return registered + value.offset
        if value.kind == "unreg":
            return unregistered + value.offset
        return value.offset
    if isinstance(value, list):
        return [resolve(v, registered, unregistered) for v in value]
    return value


# -- scalars ---------------------------------------------------------------------------------

ODD_SCALARS = st.sampled_from([None, 1.5, b"k", ["k"], {"k": 1}, object()])

good_key = st.sampled_from(KEY_POOL)
edge_key = st.sampled_from(
    ["", "\x00", "a\x00b", "\udcff", "ok\ud800", "x" * 4096, "x" * 5000, "y" * 70_000, "é😀", "\n"]
)
any_text = st.text(max_size=24)

keys = st.one_of(
    good_key.map(Arg),
    edge_key.map(Arg),
    any_text.map(Arg),
    st.one_of(st.integers(), ODD_SCALARS).map(lambda v: Arg(v, odd=True)),
)


def key_lists(max_size: int = 6) -> st.SearchStrategy[Arg]:
    """Lists of keys (duplicates likely: most come from a pool of eight), or no list at all."""
    inner = st.lists(st.one_of(good_key, good_key, edge_key, any_text), max_size=max_size)
    return st.one_of(
        inner.map(Arg),
        inner.map(tuple).map(Arg),
        st.lists(st.one_of(good_key, st.integers(), st.none()), min_size=1, max_size=3).map(
            lambda v: Arg(v, odd=True)
        ),
        st.sampled_from([None, 5, "k0"]).map(lambda v: Arg(v, odd=True)),
    )


def _uint(bound: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(0, 16), st.sampled_from([bound - 1, bound // 2, 2**31 - 1]))


# Values: every kind of buffer, odd sizes, and things that are no buffer (odd).
_sizes = st.sampled_from([0, 1, 7, 64, 4096, 65_537, 1 << 20, (1 << 20) + 3])
values = st.one_of(
    _sizes.map(lambda n: Arg(bytes(range(256)) * (n // 256) + bytes(n % 256))),
    st.binary(max_size=64).map(Arg),
    st.binary(min_size=1, max_size=64).map(bytearray).map(Arg),
    st.binary(min_size=1, max_size=64).map(lambda b: Arg(memoryview(b))),
    st.integers(1, 300).map(lambda n: Arg(np.arange(n, dtype=np.float32).reshape(-1, 1))),
    st.integers(1, 300).map(lambda n: Arg(np.arange(n, dtype=np.int64))),
    st.just(Arg(np.zeros((0,), np.uint8))),
    st.just(Arg(array.array("d", [1.0, 2.0]))),
    # Not C-contiguous: bytes_view's documented TypeError.
    st.just(Arg(np.arange(64, dtype=np.uint8)[::2], odd=True)),
    st.one_of(any_text, st.integers(), ODD_SCALARS).map(lambda v: Arg(v, odd=True)),
)

_registered_offsets = st.one_of(
    st.sampled_from([0, 1, 3, 4095, BUFFER_BYTES - 1, BUFFER_BYTES, BUFFER_BYTES + 1]),
    st.integers(0, BUFFER_BYTES),
)
pointers = st.one_of(
    _registered_offsets.map(lambda o: Arg(Ptr("reg", o))),
    st.sampled_from([0, 8, 4096]).map(lambda o: Arg(Ptr("unreg", o))),
    st.sampled_from([0, 1, 2**63 - 1, 2**64 - 1]).map(lambda o: Arg(Ptr("abs", o))),
    st.sampled_from([-1, -(2**63), 2**64, 2**70]).map(lambda o: Arg(Ptr("abs", o), odd=True)),
    st.sampled_from(["0x10", 1.0, None]).map(lambda v: Arg(v, odd=True)),
)
sizes = st.one_of(
    st.sampled_from([0, 1, 8, 4096, BUFFER_BYTES, BUFFER_BYTES + 1, 2**63 - 1, 2**64 - 1]).map(Arg),
    st.integers(0, BUFFER_BYTES).map(Arg),
    st.sampled_from([-1, -4096, 2**64, 2**80]).map(lambda v: Arg(v, odd=True)),
    st.sampled_from([1.0, "8", None]).map(lambda v: Arg(v, odd=True)),
)

# Registration trusts its caller (README, Limitations): only ranges inside the scratch buffer,
# or ones that must be refused, so that no later copy can write outside real memory.
register_pointers = st.one_of(
    st.sampled_from([0, 64]).map(lambda o: Arg(Ptr("reg", o))),
    st.just(Arg(Ptr("abs", 0))),
    st.sampled_from([-1, "0x10", None]).map(lambda v: Arg(v, odd=True)),
)
register_sizes = st.one_of(
    st.sampled_from([0, 1, 4096, BUFFER_BYTES - 64]).map(Arg),
    st.sampled_from([-5, 1.0, None]).map(lambda v: Arg(v, odd=True)),
)


def _config(fields: dict[str, Any]) -> Arg:
    """A :class:`ReplicateConfig` from ``fields``; its constructor raising TypeError for a field
    out of its C++ range is documented, and then no config is passed."""
    try:
        return Arg(ReplicateConfig(**fields))
    except TypeError:
        return Arg(None)


_session_tags = st.lists(
    st.lists(st.sampled_from(SESSION_POOL + ["", "z" * 5000]), max_size=3), max_size=4
)
configs = st.one_of(
    st.none().map(Arg),
    st.fixed_dictionaries(
        {},
        optional={
            "replica_num": st.one_of(st.integers(-2, 4), st.sampled_from([2**32, 2**64 - 1])),
            "with_hard_pin": st.booleans(),
            "preferred_segments": st.lists(any_text, max_size=2),
            "preferred_segment": any_text,
            "data_type": st.one_of(st.integers(-3, 8), st.sampled_from([2**31, -(2**40)])),
            "group_ids": st.one_of(st.none(), st.lists(any_text, max_size=3)),
            "soft_pin_action": st.one_of(st.integers(-2, 5), st.just(2**40)),
            "soft_pin_ttl_ms": st.one_of(st.none(), st.integers(-1, 10), st.just(2**64 - 1)),
            "kv_sessions": st.one_of(st.none(), _session_tags),
            "host_id": any_text,
        },
    ).map(_config),
    st.sampled_from([{"replica_num": 1}, "cfg", 3]).map(lambda v: Arg(v, odd=True, role="config")),
)

session_ids = st.one_of(
    st.sampled_from(SESSION_POOL).map(Arg),
    st.sampled_from(["", "\x00", "\udcff", "q" * 5000]).map(Arg),
    any_text.map(Arg),
    ODD_SCALARS.map(lambda v: Arg(v, odd=True)),
)
regexes = st.one_of(
    st.sampled_from(
        ["^k", "k[0-3]", "", ".*", "(", "(a)\\1", "(?=x)", "a{1001}", "x" * 5000, "\udcff"]
    ).map(Arg),
    any_text.map(Arg),
    ODD_SCALARS.map(lambda v: Arg(v, odd=True)),
)
flags = st.one_of(st.booleans().map(Arg), st.sampled_from([0, 1]).map(Arg))
ints = st.one_of(
    st.sampled_from([0, 1, 2, 1024, 2**32 - 1, 2**32, 2**63 - 1]).map(Arg),
    st.integers(-3, 3).map(Arg),
    st.sampled_from([2**64, "1", None]).map(lambda v: Arg(v, odd=True)),
)
policies = st.one_of(
    st.sampled_from(["none", "None", "LastHitOnly"]).map(Arg),
    st.sampled_from(["bogus", ""]).map(Arg),
    st.sampled_from([None, 1]).map(lambda v: Arg(v, odd=True)),
)


def _same_length_lists(
    n: st.SearchStrategy[int], item: st.SearchStrategy[Arg]
) -> st.SearchStrategy[Arg]:
    """A list of ``item`` values (odd if any item is), usually of the batch's length."""

    def build(items: list[Arg]) -> Arg:
        return Arg([a.value for a in items], odd=any(a.odd for a in items))

    return n.flatmap(lambda k: st.lists(item, min_size=k, max_size=k)).map(build)


_batch_len = st.integers(0, 4)
ptr_lists = _same_length_lists(_batch_len, pointers)
size_lists = _same_length_lists(_batch_len, sizes)
value_lists = _same_length_lists(_batch_len, values)
multi_ptrs = _same_length_lists(_batch_len, ptr_lists)
multi_sizes = _same_length_lists(_batch_len, size_lists)

# method -> strategies of its positional arguments, then of its keyword arguments.
Spec = tuple[tuple[st.SearchStrategy[Arg], ...], dict[str, st.SearchStrategy[Arg]]]
DATA_CALLS: dict[str, Spec] = {
    "put": ((keys, values, configs), {}),
    "upsert": ((keys, values, configs), {}),
    "put_batch": ((key_lists(), value_lists, configs), {}),
    "upsert_batch": ((key_lists(), value_lists, configs), {}),
    "put_parts": ((keys, values, values), {"config": configs}),
    "upsert_parts": ((keys, values), {"config": configs}),
    "put_from": ((keys, pointers, sizes, configs), {}),
    "upsert_from": ((keys, pointers, sizes, configs), {}),
    "batch_put_from": ((key_lists(), ptr_lists, size_lists, configs), {}),
    "batch_upsert_from": ((key_lists(), ptr_lists, size_lists, configs), {}),
    "batch_put_from_multi_buffers": ((key_lists(), multi_ptrs, multi_sizes, configs), {}),
    "get": ((keys,), {}),
    "get_batch": ((key_lists(),), {}),
    "get_into": ((keys, pointers, sizes), {}),
    "batch_get_into": ((key_lists(), ptr_lists, size_lists), {}),
    "batch_get_into_multi_buffers": ((key_lists(), multi_ptrs, multi_sizes), {}),
    "get_buffer": ((keys,), {}),
    "batch_get_buffer": ((key_lists(),), {}),
    "get_size": ((keys,), {}),
    "is_exist": ((keys,), {}),
    "batch_is_exist": ((key_lists(),), {}),
    "probe_key": ((keys,), {}),
    "batch_probe_key": ((key_lists(), policies, ints), {}),
    "remove": ((keys, flags), {}),
    "batch_remove": ((key_lists(), flags), {}),
    "remove_by_regex": ((regexes, flags), {}),
    "remove_all": ((flags,), {}),
    "register_buffer": ((register_pointers, register_sizes), {}),
}
SESSION_CALLS: dict[str, Spec] = {
    "attach_kv_session": ((session_ids, key_lists()), {}),
    "pin_kv_session": ((session_ids,), {}),
    "unpin_kv_session": ((session_ids,), {}),
    "update_kv_session": ((session_ids, key_lists()), {}),
    "close_kv_session": ((session_ids,), {}),
    "get_kv_session": ((session_ids,), {}),
    "list_kv_session_keys": ((session_ids, regexes, ints), {}),
    "list_kv_sessions": ((regexes, ints), {}),
    "release_kv_session": ((session_ids,), {}),
    "release_stale_kv_sessions": ((ints, flags), {}),
    "release_all_kv_sessions": ((flags,), {}),
    "release_kv_cache": ((flags,), {}),
}
ALL_CALLS = {**DATA_CALLS, **SESSION_CALLS}


def _call_of(method: str, spec: Spec) -> st.SearchStrategy[Call]:
    positional, keyword = spec
    names = sorted(keyword)
    return st.tuples(st.tuples(*positional), st.tuples(*(keyword[n] for n in names))).map(
        lambda parts: Call(method, parts[0], tuple(zip(names, parts[1], strict=True)))
    )


def calls(table: dict[str, Spec] = ALL_CALLS) -> st.SearchStrategy[Call]:
    """One call of any method of ``table``."""
    return st.one_of(*(_call_of(m, spec) for m, spec in table.items()))


Invoke = Callable[[Call], Any]
