"""Typed results of the :class:`~mooncake_py.Client`'s batch calls.

A batch call does not raise for the keys that failed: it returns a :class:`BatchResult`, one
outcome per key in the order of the keys, and raises only when the call as a whole failed (the
master unreachable, a malformed request). Each outcome is a :class:`KeyResult` that carries the
key, the code and, on success, the value; :meth:`BatchResult.unwrap` turns the first failure
into its typed exception.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from mooncake_py.errors import MooncakeError, error_for
from mooncake_py.types import KvSessionInfo, SegmentInfo

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class KeyResult(Generic[T]):
    """The outcome of one key of a batch call.

    Attributes:
        key: the key.
        code: 0 on success, else a negative :class:`~mooncake_py.ErrorCode`.
        value: the key's value on success (None for calls that return nothing per key).
    """

    key: str
    code: int
    value: T | None = None

    @property
    def ok(self) -> bool:
        """True when the key succeeded."""
        return self.code == 0

    @property
    def error(self) -> MooncakeError | None:
        """The typed exception for a failed key, or None."""
        return None if self.code == 0 else error_for(self.code, key=self.key)

    def unwrap(self) -> T:
        """The value, or raise the key's typed exception.

        Raises:
            MooncakeError: the family class of ``code`` (e.g. ``NotFoundError``).
        """
        if self.code != 0:
            raise error_for(self.code, key=self.key)
        return self.value  # type: ignore[return-value]


class BatchResult(Generic[T]):
    """Per-key outcomes of a batch call, in the order of the keys.

    Indexing and iteration give :class:`KeyResult` objects; :attr:`codes` and :attr:`values`
    are the plain per-key lists (``values[i]`` is meaningful only where ``codes[i] == 0``).

    Args:
        keys: the keys of the call.
        codes: one code per key.
        values: one value per key (None where nothing is returned).

    Raises:
        ValueError: the three lists differ in length.
    """

    __slots__ = ("codes", "keys", "values")

    def __init__(self, keys: Sequence[str], codes: list[int], values: list[T | None]) -> None:
        if not len(keys) == len(codes) == len(values):
            raise ValueError(f"{len(keys)} keys, {len(codes)} codes, {len(values)} values")
        self.keys = keys
        self.codes = codes
        self.values = values

    @classmethod
    def of_codes(cls, keys: Sequence[str], codes: list[int]) -> BatchResult[None]:
        """A result for calls that return only a code per key."""
        return BatchResult(keys, codes, [None] * len(codes))

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, index: int) -> KeyResult[T]:
        return KeyResult(self.keys[index], self.codes[index], self.values[index])

    def __iter__(self) -> Iterator[KeyResult[T]]:
        for key, code, value in zip(self.keys, self.codes, self.values, strict=True):
            yield KeyResult(key, code, value)

    def __repr__(self) -> str:
        failed = len(self.codes) - self.codes.count(0)
        return f"BatchResult({len(self.codes)} keys, {failed} failed)"

    @property
    def ok(self) -> bool:
        """True when every key succeeded."""
        return all(code == 0 for code in self.codes)

    def failed(self) -> list[KeyResult[T]]:
        """The outcomes of the keys that failed, in order."""
        return [result for result in self if not result.ok]

    def errors(self) -> dict[str, MooncakeError]:
        """Typed exception per failed key."""
        return {
            key: error_for(code, key=key)
            for key, code in zip(self.keys, self.codes, strict=True)
            if code != 0
        }

    def unwrap(self) -> list[T]:
        """Every value, or raise the first failed key's typed exception.

        Raises:
            MooncakeError: the family class of the first non-zero code, naming its key.
        """
        for key, code in zip(self.keys, self.codes, strict=True):
            if code != 0:
                raise error_for(code, key=key)
        return self.values  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True, slots=True)
class KvSessionListing:
    """One page of sessions; an empty ``next_cursor`` means the listing is done."""

    sessions: list[KvSessionInfo]
    next_cursor: str


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentStatus:
    """A mounted segment and how much of it is used.

    Attributes:
        segment: the segment as its owner mounted it.
        client_id: the owning client.
        used_bytes: bytes allocated to replicas.
        allocations: replicas allocated in it.
    """

    segment: SegmentInfo
    client_id: str
    used_bytes: int
    allocations: int
