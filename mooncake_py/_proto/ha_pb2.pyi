from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicaRow(_message.Message):
    __slots__ = ("id", "segment_id", "offset", "size", "status")
    ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    id: int
    segment_id: str
    offset: int
    size: int
    status: int
    def __init__(self, id: _Optional[int] = ..., segment_id: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., status: _Optional[int] = ...) -> None: ...

class ObjectRow(_message.Message):
    __slots__ = ("tenant", "key", "size", "client_id", "put_start_ms", "replicas", "data_type", "write_id", "hard_pinned", "soft_pin_deadline_ms", "has_pending_pin", "pending_pin_action", "pending_pin_ttl_ms", "group_id", "attempt_id")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    PUT_START_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    HARD_PINNED_FIELD_NUMBER: _ClassVar[int]
    SOFT_PIN_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    HAS_PENDING_PIN_FIELD_NUMBER: _ClassVar[int]
    PENDING_PIN_ACTION_FIELD_NUMBER: _ClassVar[int]
    PENDING_PIN_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    size: int
    client_id: str
    put_start_ms: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaRow]
    data_type: int
    write_id: int
    hard_pinned: bool
    soft_pin_deadline_ms: int
    has_pending_pin: bool
    pending_pin_action: int
    pending_pin_ttl_ms: int
    group_id: str
    attempt_id: int
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., size: _Optional[int] = ..., client_id: _Optional[str] = ..., put_start_ms: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaRow, _Mapping]]] = ..., data_type: _Optional[int] = ..., write_id: _Optional[int] = ..., hard_pinned: _Optional[bool] = ..., soft_pin_deadline_ms: _Optional[int] = ..., has_pending_pin: _Optional[bool] = ..., pending_pin_action: _Optional[int] = ..., pending_pin_ttl_ms: _Optional[int] = ..., group_id: _Optional[str] = ..., attempt_id: _Optional[int] = ...) -> None: ...

class MembershipRow(_message.Message):
    __slots__ = ("tenant", "key", "session_id", "present")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PRESENT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    session_id: str
    present: bool
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ..., session_id: _Optional[str] = ..., present: _Optional[bool] = ...) -> None: ...

class SessionRow(_message.Message):
    __slots__ = ("tenant", "session_id", "pinned", "created_ms", "last_active_ms")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_MS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    session_id: str
    pinned: bool
    created_ms: int
    last_active_ms: int
    def __init__(self, tenant: _Optional[str] = ..., session_id: _Optional[str] = ..., pinned: _Optional[bool] = ..., created_ms: _Optional[int] = ..., last_active_ms: _Optional[int] = ...) -> None: ...

class SegmentRow(_message.Message):
    __slots__ = ("id", "name", "base", "size", "te_endpoint", "protocol", "host_id", "shared", "capability_key", "client_id", "tenant", "disk", "next_offset")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TE_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_KEY_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    base: int
    size: int
    te_endpoint: str
    protocol: str
    host_id: str
    shared: bool
    capability_key: bytes
    client_id: str
    tenant: str
    disk: bool
    next_offset: int
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., base: _Optional[int] = ..., size: _Optional[int] = ..., te_endpoint: _Optional[str] = ..., protocol: _Optional[str] = ..., host_id: _Optional[str] = ..., shared: _Optional[bool] = ..., capability_key: _Optional[bytes] = ..., client_id: _Optional[str] = ..., tenant: _Optional[str] = ..., disk: _Optional[bool] = ..., next_offset: _Optional[int] = ...) -> None: ...

class ClientRow(_message.Message):
    __slots__ = ("client_id", "bound", "tenant", "ok")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    bound: bool
    tenant: str
    ok: bool
    def __init__(self, client_id: _Optional[str] = ..., bound: _Optional[bool] = ..., tenant: _Optional[str] = ..., ok: _Optional[bool] = ...) -> None: ...

class RangeRow(_message.Message):
    __slots__ = ("segment_id", "offset", "size")
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    segment_id: str
    offset: int
    size: int
    def __init__(self, segment_id: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class RowKey(_message.Message):
    __slots__ = ("tenant", "key")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    key: str
    def __init__(self, tenant: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class LogRecord(_message.Message):
    __slots__ = ("seq", "wall_ms", "objects", "removed_objects", "sessions", "removed_sessions", "segments", "removed_segments", "clients", "removed_clients", "ranges", "next_write_id", "next_replica_id", "kv_cache_released_tenants", "memberships", "unmounted_segments")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    WALL_MS_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    NEXT_REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_RELEASED_TENANTS_FIELD_NUMBER: _ClassVar[int]
    MEMBERSHIPS_FIELD_NUMBER: _ClassVar[int]
    UNMOUNTED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    wall_ms: int
    objects: _containers.RepeatedCompositeFieldContainer[ObjectRow]
    removed_objects: _containers.RepeatedCompositeFieldContainer[RowKey]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionRow]
    removed_sessions: _containers.RepeatedCompositeFieldContainer[RowKey]
    segments: _containers.RepeatedCompositeFieldContainer[SegmentRow]
    removed_segments: _containers.RepeatedScalarFieldContainer[str]
    clients: _containers.RepeatedCompositeFieldContainer[ClientRow]
    removed_clients: _containers.RepeatedScalarFieldContainer[str]
    ranges: _containers.RepeatedCompositeFieldContainer[RangeRow]
    next_write_id: int
    next_replica_id: int
    kv_cache_released_tenants: _containers.RepeatedScalarFieldContainer[str]
    memberships: _containers.RepeatedCompositeFieldContainer[MembershipRow]
    unmounted_segments: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, seq: _Optional[int] = ..., wall_ms: _Optional[int] = ..., objects: _Optional[_Iterable[_Union[ObjectRow, _Mapping]]] = ..., removed_objects: _Optional[_Iterable[_Union[RowKey, _Mapping]]] = ..., sessions: _Optional[_Iterable[_Union[SessionRow, _Mapping]]] = ..., removed_sessions: _Optional[_Iterable[_Union[RowKey, _Mapping]]] = ..., segments: _Optional[_Iterable[_Union[SegmentRow, _Mapping]]] = ..., removed_segments: _Optional[_Iterable[str]] = ..., clients: _Optional[_Iterable[_Union[ClientRow, _Mapping]]] = ..., removed_clients: _Optional[_Iterable[str]] = ..., ranges: _Optional[_Iterable[_Union[RangeRow, _Mapping]]] = ..., next_write_id: _Optional[int] = ..., next_replica_id: _Optional[int] = ..., kv_cache_released_tenants: _Optional[_Iterable[str]] = ..., memberships: _Optional[_Iterable[_Union[MembershipRow, _Mapping]]] = ..., unmounted_segments: _Optional[_Iterable[str]] = ...) -> None: ...
