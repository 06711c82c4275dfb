"""Plain data types shared by the master and the client.

These are the typed forms of the protobuf messages; conversion happens only in
:mod:`mooncake_py._wire.codec`, which both ends use.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import operator
import uuid
from typing import Any


class SoftPinAction(enum.IntEnum):
    """What a write does to the object's TTL soft pin (upstream ``SoftPinAction``)."""

    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class ObjectDataType(enum.IntEnum):
    """What an object holds (upstream ``ObjectDataType``)."""

    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class ProbeLeaseMode(enum.IntEnum):
    """Which keys a batch probe leases (upstream's ``GrantLeasePolicy.lease_mode``)."""

    NONE = 0
    """Lease nothing: a pure existence check."""
    LAST_HIT_ONLY = 1
    """Lease only the last complete candidate (``candidate_size`` consecutive keys)."""


class ReplicaStatus(enum.IntEnum):
    """Life cycle of one replica (upstream ``ReplicaStatus``)."""

    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class TaskType(enum.IntEnum):
    """What a replica task does (upstream ``TaskType``)."""

    REPLICA_COPY = 0
    REPLICA_MOVE = 1


class TaskStatus(enum.IntEnum):
    """Where a replica task is (upstream ``TaskStatus``)."""

    PENDING = 0
    PROCESSING = 1
    FAILED = 2
    SUCCESS = 3


class ClientStatus(enum.IntEnum):
    """A client's standing with the master, reported by Ping."""

    UNDEFINED = 0
    OK = 1
    NEED_REMOUNT = 2


_UNSIGNED_FIELDS = frozenset(
    {"replica_num", "soft_pin_ttl_ms", "nof_replica_num", "dfs_replica_num"}
)
_BOOL_FIELDS = frozenset({"with_hard_pin", "prefer_alloc_in_same_node"})
_STR_FIELDS = frozenset({"preferred_segment", "host_id"})
_STR_LIST_FIELDS = frozenset({"preferred_segments", "preferred_nof_segments"})
_OPTIONAL_STR_LIST_FIELDS = frozenset({"group_ids", "session_ids"})
_NONE_FIELDS = frozenset({"soft_pin_ttl_ms", "group_ids", "session_ids", "kv_sessions"})
# Taken as given (the enums' plain ints pass through; the master judges them).
_UNCHECKED_FIELDS = frozenset({"data_type", "soft_pin_action"})
_UINT64_END = 1 << 64


def _unsigned(name: str, value: Any) -> int:
    try:
        number = operator.index(value)  # ints, bools and numpy integers, as pybind11 takes
    except TypeError:
        number = -1
    if not 0 <= number < 1 << 64:
        raise TypeError(f"ReplicateConfig.{name} takes an integer in [0, 2**64), not {value!r}")
    return number


def _boolean(name: str, value: Any) -> bool:
    # pybind11 converts what has a truth-value slot of its own (numbers, None, numpy bools)
    # and refuses the rest (strings, lists, ...), whose truth would be a mistake to guess.
    if value is None or hasattr(type(value), "__bool__"):
        return bool(value)
    raise TypeError(f"ReplicateConfig.{name} takes a bool, not {value!r}")


def _utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (no lone surrogates), checked in C."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _string(name: str, value: Any, utf8: bool = True) -> str:
    # As pybind11's std::string caster: str that encodes as UTF-8, or bytes that decode.
    if isinstance(value, str) and (not utf8 or _utf8(value)):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            pass
    raise TypeError(f"ReplicateConfig.{name} takes a UTF-8 str, not {value!r}")


def _strings(name: str, value: Any, utf8: bool = True) -> list[str]:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"ReplicateConfig.{name} takes a list of str, not {value!r}")
    items = list(value)
    # Batches carry one entry per key (thousands): check them in C, and convert one by one
    # only when something is not a plain (UTF-8) str.
    if all(map(str.__instancecheck__, items)) and (not utf8 or _utf8("".join(items))):
        return items
    return [_string(name, item, utf8) for item in items]


def _string_lists(name: str, value: Any) -> list[list[str]]:
    # Session ids are the master's to judge (a bad one fails the write with INVALID_PARAMS),
    # so only their types are checked here.
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(f"ReplicateConfig.{name} takes a list of lists of str, not {value!r}")
    lists = list(value)
    if all(map(list.__instancecheck__, lists)) and all(
        map(str.__instancecheck__, itertools.chain.from_iterable(lists))
    ):
        return lists
    return [_strings(name, item, utf8=False) for item in lists]


@dataclasses.dataclass
class ReplicateConfig:
    """Per-write placement and retention options, as upstream's ``ReplicateConfig``.

    Attributes are plain and mutable so that code written for upstream
    (``cfg = ReplicateConfig(); cfg.replica_num = 2``) works unchanged, and probing with
    ``hasattr(ReplicateConfig, name)`` finds every field. As upstream's binding, an
    assignment (or constructor argument) that its C++ field cannot hold raises TypeError at
    once, so a bad value never reaches a data call:

    - ``replica_num``, ``nof_replica_num``, ``dfs_replica_num``: integers in ``[0, 2**64)``;
      ``soft_pin_ttl_ms`` too, or None (the master's default);
    - ``with_hard_pin``, ``prefer_alloc_in_same_node``: anything with a truth value of its
      own (bools, numbers, None), stored as bool;
    - ``preferred_segment``, ``host_id``: str that encodes as UTF-8 (or UTF-8 bytes);
    - ``preferred_segments``, ``preferred_nof_segments``: an iterable of such str, stored as
      a list; ``group_ids`` the same, or None;
    - ``session_ids`` (None, or an iterable of str) and ``kv_sessions`` (None, or an
      iterable of such lists): only their types are checked, since session ids are the
      master's to judge (a bad one fails the write with INVALID_PARAMS).

    ``data_type`` and ``soft_pin_action`` take their enums (plain ints pass through and an
    unknown one fails the write with INVALID_PARAMS).

    Fields beyond placement:

    - ``nof_replica_num`` / ``preferred_nof_segments`` (NVMe-oF replicas) and
      ``dfs_replica_num`` (a distributed-file-system replica): this store has neither tier,
      so a write asking for one fails with INVALID_PARAMS, as upstream's builds without them.
    - ``group_ids``: one group per key (``""`` ungrouped); a single put takes exactly one.
    - ``kv_sessions``: KV sessions to tag each key with, one inner list per key (also for
      single puts).
    - ``session_ids``: the session that wrote each key, one entry per key (``""`` for none);
      SGLang sets it for the writing request's session. Each non-empty entry tags its key
      with that KV session, as if listed in ``kv_sessions``.
    - ``with_soft_pin``: the boolean of older upstream builds, kept as a view of
      ``soft_pin_action`` (True is ``ENABLE``; setting False restores ``PRESERVE``).
    """

    def __setattr__(self, name: str, value: Any) -> None:
        # The common values need no conversion: plain ints in range, bools, ASCII strs,
        # None where allowed (every construction assigns all fields: this keeps it cheap).
        kind = type(value)
        if (
            (kind is int and name in _UNSIGNED_FIELDS and 0 <= value < _UINT64_END)
            or (kind is bool and name in _BOOL_FIELDS)
            or (kind is str and name in _STR_FIELDS and value.isascii())
            or (value is None and name in _NONE_FIELDS)
            or name in _UNCHECKED_FIELDS
        ):
            object.__setattr__(self, name, value)
            return
        if name in _UNSIGNED_FIELDS:
            if not (value is None and name == "soft_pin_ttl_ms"):
                value = _unsigned(name, value)
        elif name in _BOOL_FIELDS:
            value = _boolean(name, value)
        elif name in _STR_FIELDS:
            value = _string(name, value)
        elif name in _STR_LIST_FIELDS:
            value = _strings(name, value)
        elif name in _OPTIONAL_STR_LIST_FIELDS:
            value = None if value is None else _strings(name, value, name != "session_ids")
        elif name == "kv_sessions":
            value = None if value is None else _string_lists(name, value)
        object.__setattr__(self, name, value)

    replica_num: int = 1
    with_hard_pin: bool = False
    preferred_segments: list[str] = dataclasses.field(default_factory=list)
    preferred_segment: str = ""
    prefer_alloc_in_same_node: bool = False
    data_type: ObjectDataType = ObjectDataType.UNKNOWN
    host_id: str = ""
    group_ids: list[str] | None = None
    soft_pin_action: SoftPinAction = SoftPinAction.PRESERVE
    soft_pin_ttl_ms: int | None = None
    # KV sessions to tag each key with: one inner list per key (also for single puts).
    kv_sessions: list[list[str]] | None = None
    nof_replica_num: int = 0
    dfs_replica_num: int = 0
    preferred_nof_segments: list[str] = dataclasses.field(default_factory=list)
    # The writing session per key ("" for none): tags each key with that KV session.
    session_ids: list[str] | None = None

    @classmethod
    def from_checked(cls, **fields: Any) -> ReplicateConfig:
        """A config built from values already of the right types, without the per-field
        checks of the constructor (a tenth of its cost): for decoders whose source (a parsed
        protobuf message) guarantees the types. Unnamed fields take their defaults; a name
        that is not a field raises TypeError. O(fields)."""
        unknown = fields.keys() - _FIELD_DEFAULTS.keys()
        if unknown:
            raise TypeError(f"ReplicateConfig has no field {sorted(unknown)[0]!r}")
        config = cls()
        config.__dict__.update(fields)
        return config

    @property
    def with_soft_pin(self) -> bool:
        """Older upstream builds' flag: whether the write enables the TTL soft pin."""
        return self.soft_pin_action == SoftPinAction.ENABLE

    @with_soft_pin.setter
    def with_soft_pin(self, value: bool) -> None:
        enable = _boolean("with_soft_pin", value)
        self.soft_pin_action = SoftPinAction.ENABLE if enable else SoftPinAction.PRESERVE

    def session_tags(self, count: int) -> list[list[str]] | None:
        """The KV sessions to tag each of ``count`` keys with: ``kv_sessions`` merged with
        ``session_ids`` (each non-empty id added to its key's list), or None for none.

        Raises:
            ValueError: ``kv_sessions`` or ``session_ids`` is given with a length other
                than ``count``.
        """
        tags, writers = self.kv_sessions, self.session_ids
        for name, given in (("kv_sessions", tags), ("session_ids", writers)):
            if given is not None and len(given) != count:
                raise ValueError(f"{count} keys but {len(given)} {name}")
        if not writers or not any(writers):
            return tags
        merged = [list(t) for t in tags] if tags is not None else [[] for _ in range(count)]
        for sessions, writer in zip(merged, writers, strict=True):
            if writer and writer not in sessions:
                sessions.append(writer)
        return merged


# Every field's default; the list fields (default_factory) get fresh lists where used.
_FIELD_DEFAULTS: dict[str, Any] = {
    field.name: None if field.default is dataclasses.MISSING else field.default
    for field in dataclasses.fields(ReplicateConfig)
}
_checked_init = ReplicateConfig.__init__


@functools.wraps(_checked_init)
def _init_config(self: ReplicateConfig, *args: Any, **kwargs: Any) -> None:
    # The defaults are filled in one step and only the fields given are assigned (checked):
    # fifteen checked assignments of values known to be valid would cost ten times as much
    # as a config is worth (engines build one per call). Positional arguments take the
    # dataclass's own path.
    if args:
        _checked_init(self, *args, **kwargs)
        return
    values = self.__dict__
    values.update(_FIELD_DEFAULTS)
    values["preferred_segments"] = []
    values["preferred_nof_segments"] = []
    for name, value in kwargs.items():
        if name not in _FIELD_DEFAULTS:
            raise TypeError(f"ReplicateConfig() got an unexpected keyword argument {name!r}")
        setattr(self, name, value)


setattr(ReplicateConfig, "__init__", _init_config)  # noqa: B010 - mypy keeps the dataclass's


@dataclasses.dataclass(frozen=True)
class KvSessionInfo:
    """A KV session as ``get_kv_session`` and ``list_kv_sessions`` report it.

    Attributes:
        session_id: the application's id.
        pinned: whether the session protects its objects from ordinary eviction.
        member_count: objects in the session.
        created_at: when the session was created (Unix time, seconds).
        last_active_at: the last call that named it (tagged write, attach, pin, unpin, update).
        bytes: its members' sizes times their replicas.
        exclusive_bytes: the part of ``bytes`` held by members in no other session.
        idle_ms: time since ``last_active_at``.
    """

    session_id: str
    pinned: bool
    member_count: int
    created_at: float = 0.0
    last_active_at: float = 0.0
    bytes: int = 0
    exclusive_bytes: int = 0
    idle_ms: int = 0


@dataclasses.dataclass(frozen=True)
class ReleaseResult:
    """What a release call freed and what it kept, and why.

    Attributes:
        sessions: sessions released (closed).
        released_objects: objects removed.
        freed_bytes: memory bytes returned to the allocators by the call.
        freed_disk_bytes: disk tier bytes the call freed (their files are deleted by the
            tiers' owners).
        pending_bytes: bytes of removed objects still under a read lease, returned when it ends.
        kept_shared: objects kept because another session still holds them.
        kept_hard_pinned: objects kept because they are hard pinned.
        kept_leased: always 0 from this master (kept for the wire and for older masters): a
            member readers are copying from is released too, its bytes in ``pending_bytes``.
        kept_writing: objects kept because a write to them is in flight.
        kept_pinned: objects kept because a pinned session holds them (release_kv_cache).
        message: a note for humans, e.g. that the session did not exist.
    """

    sessions: int = 0
    released_objects: int = 0
    freed_bytes: int = 0
    pending_bytes: int = 0
    kept_shared: int = 0
    kept_hard_pinned: int = 0
    kept_leased: int = 0
    kept_writing: int = 0
    kept_pinned: int = 0
    freed_disk_bytes: int = 0
    message: str = ""

    def __add__(self, other: ReleaseResult) -> ReleaseResult:
        fields = dataclasses.fields(self)
        merged = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields[:-1]}
        return ReleaseResult(
            **merged, message="; ".join(m for m in (self.message, other.message) if m)
        )


@dataclasses.dataclass(frozen=True)
class KvSessionPage:
    """One page of a session's keys; an empty ``next_cursor`` means the listing is done."""

    keys: list[str]
    next_cursor: str


@dataclasses.dataclass(frozen=True)
class SegmentInfo:
    """A memory segment that a client contributes to the store.

    Attributes:
        id: unique segment id (a UUID string).
        name: the owning client's hostname; several segments may share it.
        base: address of the segment in the owner's process; never 0.
        size: bytes.
        te_endpoint: ``host:port`` of the owner's TCP transfer service.
        protocol: transport name advertised by the owner (``tcp``).
        host_id: identifies the machine (a hint: the same-host path is used only once the
            owner has proved itself on its local socket).
        shared: an operator marked the segment shared (its mount needs an admin token): any
            tenant's objects may be placed there, otherwise only its owner tenant's.
        capability_key: the secret the owner and the master share for this segment
            (:mod:`mooncake_py.capability`); never shown or sent back by the master.
        disk: a disk tier rather than memory (:mod:`mooncake_py.master.state.disk_tier`):
            ``size`` is its quota, its offsets a virtual address space (each disk replica a
            range of its own, never reused) and ``base`` is meaningless.
    """

    id: str
    name: str
    base: int
    size: int
    te_endpoint: str
    protocol: str = "tcp"
    host_id: str = ""
    shared: bool = False
    capability_key: bytes = dataclasses.field(default=b"", repr=False)
    disk: bool = False


@dataclasses.dataclass(frozen=True)
class ReplicaDescriptor:
    """Where one replica's bytes live: ``size`` bytes at ``offset`` in segment ``segment_id``,
    and the ``capability`` (:mod:`mooncake_py.capability`) the segment's owner asks for before
    it serves them (empty when the master handed none: descriptors for display). ``disk``: the
    replica is in its owner's disk tier, read through the owner's transfer service."""

    id: int
    status: ReplicaStatus
    segment_id: str
    segment_name: str
    offset: int
    size: int
    te_endpoint: str
    host_id: str
    capability: bytes = dataclasses.field(default=b"", repr=False)
    disk: bool = False


@dataclasses.dataclass(frozen=True)
class PutStartResult:
    """Outcome of PutStart for one key: a code and, on success, where to write and the
    write's id (PutEnd / PutRevoke name it, and act on this write only). With
    NO_AVAILABLE_HANDLE, ``retry_after_ms`` > 0 says memory is being made (objects are being
    written to a disk tier) and a retry after that long may find room."""

    code: int
    replicas: tuple[ReplicaDescriptor, ...] = ()
    write_id: int = 0
    retry_after_ms: int = 0


@dataclasses.dataclass(frozen=True)
class ReplicaListResult:
    """Outcome of GetReplicaList for one key.

    Attributes:
        code: 0 or a negative error code.
        replicas: readable replicas (on success).
        lease_ttl_ms: the read lease's TTL: how long the bytes stay put if the reader does
            not end its read first.
        size: the object's size in bytes.
        read_id: the read lease; the reader ends it (EndReads) when its copy is done, and a
            copy that outlived ``lease_ttl_ms`` is trusted only if EndReads answers OK.
    """

    code: int
    replicas: tuple[ReplicaDescriptor, ...] = ()
    lease_ttl_ms: int = 0
    size: int = 0
    read_id: int = 0


def valid_tenant_id(tenant: str) -> bool:
    """True for a usable tenant id: non-empty, not starting with ``_`` (reserved), and free of
    control characters (below 32, and DEL). The one rule for the master's requests, its tokens
    file and the client's configuration."""
    return (
        bool(tenant)
        and not tenant.startswith("_")
        and not any(ord(c) < 32 or ord(c) == 127 for c in tenant)
    )


@dataclasses.dataclass(frozen=True)
class QueryTaskResponse:
    """A replica task's state (upstream's ``QueryTaskResponse`` attributes).

    Attributes:
        id: the task id as upstream's Python binding gives it: the UUID's two 64-bit halves
            ``(high, low)``.
        type: REPLICA_COPY or REPLICA_MOVE.
        status: PENDING, PROCESSING, FAILED or SUCCESS.
        created_at_ms_epoch, last_updated_at_ms_epoch: Unix times in milliseconds.
        assigned_client: the id of the client doing the work.
        message: why it failed ("" otherwise).
    """

    id: tuple[int, int]
    type: TaskType
    status: TaskStatus
    created_at_ms_epoch: int
    last_updated_at_ms_epoch: int
    assigned_client: str
    message: str = ""


@dataclasses.dataclass(frozen=True)
class StartTaskResult:
    """What a worker needs to run a started task.

    Attributes:
        code: 0, or why the task cannot run (it is then finished as FAILED).
        source: the replica to copy from (on the worker's own segment).
        targets: the reserved ranges to copy into.
    """

    code: int
    source: ReplicaDescriptor | None = None
    targets: tuple[ReplicaDescriptor, ...] = ()


def task_id_halves(task_id: str) -> tuple[int, int]:
    """A task id (a UUID's text) as upstream's binding hands it to Python: the UUID's
    ``(high 64 bits, low 64 bits)``.

    Raises:
        ValueError: ``task_id`` is no UUID.
    """
    value = uuid.UUID(task_id).int
    return value >> 64, value & ((1 << 64) - 1)


def task_id_text(halves: tuple[int, int]) -> str:
    """The task id (a UUID's text) of upstream-style ``(high, low)`` halves.

    Raises:
        ValueError, TypeError: not two ints of 64 bits each.
    """
    high, low = halves
    if not (0 <= high < 1 << 64 and 0 <= low < 1 << 64):
        raise ValueError("task id halves must be two 64-bit unsigned ints")
    return str(uuid.UUID(int=(high << 64) | low))


class DiskTaskKind(enum.IntEnum):
    """What a disk task asks of a disk tier's owner."""

    SPILL = 1
    """Copy a memory replica of the owner's segment into a file of its disk tier."""
    PROMOTE = 2
    """Copy a file of the owner's disk tier into a memory range reserved in its segment."""


@dataclasses.dataclass(frozen=True, slots=True)
class DiskTask:
    """One spill or promotion the master assigned to a disk tier's owner.

    Attributes:
        task_id: names the task in FinishDiskTasks.
        kind: :class:`DiskTaskKind`.
        tenant, key: the object (the file's header records them).
        size: the object's bytes.
        memory_segment_id, memory_offset: the memory range (the source of a spill, the reserved
            target of a promotion), in the owner's own segment.
        disk_segment_id, disk_offset: the disk replica's range (its file's name).
    """

    task_id: int
    kind: DiskTaskKind
    tenant: str
    key: str
    size: int
    memory_segment_id: str
    memory_offset: int
    disk_segment_id: str
    disk_offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class DiskTaskBatch:
    """What FetchDiskTasks hands a disk tier's owner: tasks to run, and the offsets of files
    to delete per disk segment (replicas the master let go; best effort, never re-sent)."""

    tasks: tuple[DiskTask, ...] = ()
    deletes: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class DiskReplicaEntry:
    """A complete file found in a disk tier's directory, re-registered at start."""

    tenant: str
    key: str
    offset: int
    size: int
