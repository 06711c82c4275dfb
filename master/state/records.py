"""The per-object records of the object table: :class:`ObjectMetadata` (one per object), its
:class:`Replica` records, the side record of its rarely set fields (:class:`RareFields`), and a
write's pending soft pin. :mod:`.objects` keeps them consistent with its indexes.

Thread-safety: none. The master service serializes every call under its lock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mooncake_py.types import ReplicaStatus, SoftPinAction

ObjectId = tuple[str, str]
"""(tenant, key): the identity of an object."""

# Module-level names for the states the per-key paths compare by identity (enum members are
# singletons): a global lookup instead of a class attribute lookup each time.
_PROCESSING = ReplicaStatus.PROCESSING
_COMPLETE = ReplicaStatus.COMPLETE


@dataclasses.dataclass(slots=True)
class Replica:
    """One copy of an object's bytes: ``size`` bytes at ``offset`` inside ``segment_id``."""

    id: int
    segment_id: str
    offset: int
    size: int
    status: ReplicaStatus


@dataclasses.dataclass(slots=True)
class PendingSoftPin:
    """A soft-pin request admitted at put start, applied when the write completes."""

    action: SoftPinAction
    ttl_ms: int


class RareFields:
    """The fields of an object record that almost every object leaves at their defaults,
    held apart so that such an object pays one empty slot for them instead of five.

    A record holds one only while some field differs from its default (``hard_pinned``
    False, ``soft_pin_deadline`` 0.0, ``group_id`` "", ``sessions`` None,
    ``session_weight`` 0): :class:`ObjectMetadata`'s setters create it when a field is set
    and drop it when the last one is reset, and :meth:`ObjectTable.check` verifies that no
    record keeps one of defaults. Reads through the record's properties cost an attribute
    lookup more than a slot would; the eviction checks test ``rare_fields`` once instead.
    """

    __slots__ = ("hard_pinned", "soft_pin_deadline", "group_id", "sessions", "session_weight")

    def __init__(
        self, hard_pinned: bool = False, soft_pin_deadline: float = 0.0, group_id: str = ""
    ) -> None:
        self.hard_pinned = hard_pinned
        self.soft_pin_deadline = soft_pin_deadline
        self.group_id = group_id
        self.sessions: set[Any] | None = None
        self.session_weight = 0

    def is_default(self) -> bool:
        """True when every field has its default (the record may then go). O(1)."""
        return not (
            self.hard_pinned
            or self.soft_pin_deadline
            or self.group_id
            or self.sessions is not None
            or self.session_weight
        )


class ObjectMetadata:
    """Everything the master knows about one object.

    Times are seconds on the service clock. ``fresh_until``: reads before it do not renew the
    object's recency again (it was read moments ago); read leases themselves are held by their
    readers (:mod:`.reads`). ``soft_pin_deadline`` is the committed TTL soft pin (0 means
    none); ``hard_pinned`` objects are never evicted. ``write_id`` names the write in flight
    (its PROCESSING replicas), 0 when none.

    Memory: one record per object, so it is a plain slotted class (no per-instance dict, no
    dataclass machinery). It holds its ``tenant`` and ``key`` as two slots and builds
    :attr:`object_id` on demand: no (tenant, key) tuple lives per object (56 bytes), as the
    object table files records by their key (:class:`.objects.ObjectTable`). A single
    replica is held in the record itself, not in a one-element tuple (48 bytes saved per
    object); :attr:`replicas` answers a tuple either way, and every change goes through
    :class:`.objects.ObjectTable`. ``lru_stamp`` is the eviction policy's stamp of the
    object (:mod:`.lru`; -1 while it is no candidate), kept here rather than in a dict of the
    policy's own. Absent optional parts are None, not empty containers. ``hard_pinned``,
    ``soft_pin_deadline``, ``group_id``, ``sessions`` and ``session_weight`` are properties
    over a side record (:class:`RareFields`) that exists only while one of them is set: 32
    bytes less per object; they read and assign as plain attributes.
    """

    __slots__ = (
        "tenant",
        "key",
        "size",
        "client_id",
        "put_start_time",
        "_replicas",
        "data_type",
        "fresh_until",
        "write_id",
        "pending_soft_pin",
        "readable",
        "lru_stamp",
        "_rare",
    )

    def __init__(
        self,
        tenant: str,
        key: str,
        size: int,
        client_id: str,
        put_start_time: float,
        replicas: tuple[Replica, ...],
        data_type: int = 0,
        fresh_until: float = 0.0,
        write_id: int = 0,
        hard_pinned: bool = False,
        soft_pin_deadline: float = 0.0,
        pending_soft_pin: PendingSoftPin | None = None,
        group_id: str = "",
    ) -> None:
        # Never changed: the object table files the record under them.
        self.tenant = tenant
        self.key = key
        self.size = size
        self.client_id = client_id
        self.put_start_time = put_start_time
        # One replica itself, or a tuple of any other number (see ``replicas``).
        self._replicas: Replica | tuple[Replica, ...] = (
            replicas[0] if len(replicas) == 1 else tuple(replicas)
        )
        self.data_type = data_type
        self.fresh_until = fresh_until
        self.write_id = write_id
        self.pending_soft_pin = pending_soft_pin
        # Whether a replica is COMPLETE, kept by ObjectTable on every replica change: the hot
        # lookup paths test it per key.
        self.readable = False
        # The eviction policy's (:class:`.lru.LeaseOrderedLRU`); -1: no candidate.
        self.lru_stamp = -1
        # The fields almost every object leaves at their defaults (see RareFields).
        self._rare: RareFields | None = None
        if hard_pinned or soft_pin_deadline or group_id:
            self._rare = RareFields(hard_pinned, soft_pin_deadline, group_id)

    # -- the rare fields, read from the side record (their defaults when it is absent) --------

    @property
    def hard_pinned(self) -> bool:
        """Never evicted (default False). O(1)."""
        rare = self._rare
        return False if rare is None else rare.hard_pinned

    @hard_pinned.setter
    def hard_pinned(self, value: bool) -> None:
        rare = self._rare
        if rare is None:
            if not value:
                return
            rare = self._rare = RareFields()
        rare.hard_pinned = value
        if not value and rare.is_default():
            self._rare = None

    @property
    def soft_pin_deadline(self) -> float:
        """The committed TTL soft pin's end, on the service clock (default 0.0: none). O(1)."""
        rare = self._rare
        return 0.0 if rare is None else rare.soft_pin_deadline

    @soft_pin_deadline.setter
    def soft_pin_deadline(self, value: float) -> None:
        rare = self._rare
        if rare is None:
            if not value:
                return
            rare = self._rare = RareFields()
        rare.soft_pin_deadline = value
        if not value and rare.is_default():
            self._rare = None

    @property
    def group_id(self) -> str:
        """The group the object was written in (default "": none). O(1)."""
        rare = self._rare
        return "" if rare is None else rare.group_id

    @group_id.setter
    def group_id(self, value: str) -> None:
        rare = self._rare
        if rare is None:
            if not value:
                return
            rare = self._rare = RareFields()
        rare.group_id = value
        if not value and rare.is_default():
            self._rare = None

    @property
    def sessions(self) -> set[Any] | None:
        """The KV sessions holding this object (default None rather than an empty set: most
        objects have none). O(1)."""
        rare = self._rare
        return None if rare is None else rare.sessions

    @sessions.setter
    def sessions(self, value: set[Any] | None) -> None:
        rare = self._rare
        if rare is None:
            if value is None:
                return
            rare = self._rare = RareFields()
        rare.sessions = value
        if value is None and rare.is_default():
            self._rare = None

    @property
    def session_weight(self) -> int:
        """Bytes this object contributes to each of its sessions' accounting (size x replicas
        when last reweighed); meaningful only while ``sessions`` is set (default 0). O(1)."""
        rare = self._rare
        return 0 if rare is None else rare.session_weight

    @session_weight.setter
    def session_weight(self, value: int) -> None:
        rare = self._rare
        if rare is None:
            if not value:
                return
            rare = self._rare = RareFields()
        rare.session_weight = value
        if not value and rare.is_default():
            self._rare = None

    @property
    def rare_fields(self) -> RareFields | None:
        """The side record of the rare fields, or None while all of them have their
        defaults (read-only: the hot paths test it once instead of each field). O(1)."""
        return self._rare

    @property
    def replicas(self) -> tuple[Replica, ...]:
        """The object's replicas, as a tuple (a new one-element tuple for a single replica:
        compare contents, not identity). O(1)."""
        held = self._replicas
        if held.__class__ is Replica:
            return (held,)  # type: ignore[return-value]
        return held  # type: ignore[return-value]

    @replicas.setter
    def replicas(self, replicas: Sequence[Replica]) -> None:
        # Only ObjectTable assigns it (it keeps the indexes in step).
        self._replicas = replicas[0] if len(replicas) == 1 else tuple(replicas)

    @property
    def sole_replica(self) -> Replica | None:
        """The object's replica when it has exactly one, else None (no tuple built). O(1)."""
        held = self._replicas
        return held if held.__class__ is Replica else None  # type: ignore[return-value]

    @property
    def replica_count(self) -> int:
        """How many replicas the object has, without building a tuple. O(1)."""
        held = self._replicas
        return 1 if held.__class__ is Replica else len(held)  # type: ignore[arg-type]

    @property
    def object_id(self) -> ObjectId:
        """(tenant, key): the object's identity, as a new tuple per call (compare it, do not
        count on its identity; a path that needs it many times keeps it). O(1)."""
        return (self.tenant, self.key)

    def __repr__(self) -> str:
        return (
            f"ObjectMetadata({self.tenant!r}, {self.key!r}, size={self.size}, "
            f"replicas={self.replicas!r}, write_id={self.write_id})"
        )

    def complete_replicas(self) -> list[Replica]:
        """Replicas that hold the whole value and may be read."""
        held = self._replicas
        if held.__class__ is Replica:
            return [held] if held.status is _COMPLETE else []  # type: ignore[list-item,union-attr]
        return [r for r in held if r.status is _COMPLETE]  # type: ignore[union-attr]

    def processing_replicas(self) -> list[Replica]:
        """Replicas whose write has started and not yet ended."""
        held = self._replicas
        if held.__class__ is Replica:
            return [held] if held.status is _PROCESSING else []  # type: ignore[list-item,union-attr]
        return [r for r in held if r.status is _PROCESSING]  # type: ignore[union-attr]

    def is_readable(self) -> bool:
        """True when at least one replica is COMPLETE. O(1)."""
        return self.readable

    def is_writing(self) -> bool:
        """True when a write to some replica is in flight. O(replicas), no allocation (a
        plain loop: it runs several times per write)."""
        held = self._replicas
        if held.__class__ is Replica:
            return held.status is _PROCESSING  # type: ignore[union-attr]
        for replica in held:  # type: ignore[union-attr]  # noqa: SIM110 - no generator per call
            if replica.status is _PROCESSING:
                return True
        return False
