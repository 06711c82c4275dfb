from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicateConfig(_message.Message):
    __slots__ = ("replica_num", "with_hard_pin", "preferred_segments", "preferred_segment", "prefer_alloc_in_same_node", "data_type", "host_id", "group_ids", "soft_pin_action", "soft_pin_ttl_ms")
    REPLICA_NUM_FIELD_NUMBER: _ClassVar[int]
    WITH_HARD_PIN_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_SEGMENT_FIELD_NUMBER: _ClassVar[int]
    PREFER_ALLOC_IN_SAME_NODE_FIELD_NUMBER: _ClassVar[int]
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    SOFT_PIN_ACTION_FIELD_NUMBER: _ClassVar[int]
    SOFT_PIN_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    replica_num: int
    with_hard_pin: bool
    preferred_segments: _containers.RepeatedScalarFieldContainer[str]
    preferred_segment: str
    prefer_alloc_in_same_node: bool
    data_type: int
    host_id: str
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    soft_pin_action: int
    soft_pin_ttl_ms: int
    def __init__(self, replica_num: _Optional[int] = ..., with_hard_pin: _Optional[bool] = ..., preferred_segments: _Optional[_Iterable[str]] = ..., preferred_segment: _Optional[str] = ..., prefer_alloc_in_same_node: _Optional[bool] = ..., data_type: _Optional[int] = ..., host_id: _Optional[str] = ..., group_ids: _Optional[_Iterable[str]] = ..., soft_pin_action: _Optional[int] = ..., soft_pin_ttl_ms: _Optional[int] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("id", "name", "base", "size", "te_endpoint", "protocol", "host_id", "shared", "capability_key", "disk")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TE_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_KEY_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    base: int
    size: int
    te_endpoint: str
    protocol: str
    host_id: str
    shared: bool
    capability_key: bytes
    disk: bool
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., base: _Optional[int] = ..., size: _Optional[int] = ..., te_endpoint: _Optional[str] = ..., protocol: _Optional[str] = ..., host_id: _Optional[str] = ..., shared: _Optional[bool] = ..., capability_key: _Optional[bytes] = ..., disk: _Optional[bool] = ...) -> None: ...

class ReplicaDescriptor(_message.Message):
    __slots__ = ("id", "status", "segment_id", "segment_name", "offset", "size", "te_endpoint", "host_id", "capability", "disk")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TE_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    id: int
    status: int
    segment_id: str
    segment_name: str
    offset: int
    size: int
    te_endpoint: str
    host_id: str
    capability: bytes
    disk: bool
    def __init__(self, id: _Optional[int] = ..., status: _Optional[int] = ..., segment_id: _Optional[str] = ..., segment_name: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., te_endpoint: _Optional[str] = ..., host_id: _Optional[str] = ..., capability: _Optional[bytes] = ..., disk: _Optional[bool] = ...) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("code",)
    CODE_FIELD_NUMBER: _ClassVar[int]
    code: int
    def __init__(self, code: _Optional[int] = ...) -> None: ...

class BatchStatusResponse(_message.Message):
    __slots__ = ("codes",)
    CODES_FIELD_NUMBER: _ClassVar[int]
    codes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, codes: _Optional[_Iterable[int]] = ...) -> None: ...

class CountResponse(_message.Message):
    __slots__ = ("code", "count")
    CODE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    code: int
    count: int
    def __init__(self, code: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class KeyRequest(_message.Message):
    __slots__ = ("client_id", "key", "tenant_id", "write_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    key: str
    tenant_id: str
    write_id: int
    def __init__(self, client_id: _Optional[str] = ..., key: _Optional[str] = ..., tenant_id: _Optional[str] = ..., write_id: _Optional[int] = ...) -> None: ...

class BatchKeysRequest(_message.Message):
    __slots__ = ("client_id", "keys", "tenant_id", "write_ids", "compact")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    WRITE_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPACT_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    tenant_id: str
    write_ids: _containers.RepeatedScalarFieldContainer[int]
    compact: bool
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., tenant_id: _Optional[str] = ..., write_ids: _Optional[_Iterable[int]] = ..., compact: _Optional[bool] = ...) -> None: ...

class MountSegmentRequest(_message.Message):
    __slots__ = ("client_id", "segment", "tenant_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    segment: Segment
    tenant_id: str
    def __init__(self, client_id: _Optional[str] = ..., segment: _Optional[_Union[Segment, _Mapping]] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class ReMountSegmentRequest(_message.Message):
    __slots__ = ("client_id", "segments", "tenant_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    tenant_id: str
    def __init__(self, client_id: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class UnmountSegmentRequest(_message.Message):
    __slots__ = ("client_id", "segment_id", "tenant_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    segment_id: str
    tenant_id: str
    def __init__(self, client_id: _Optional[str] = ..., segment_id: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ("client_id", "tenant_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    tenant_id: str
    def __init__(self, client_id: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("code", "view_version", "client_status")
    CODE_FIELD_NUMBER: _ClassVar[int]
    VIEW_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_STATUS_FIELD_NUMBER: _ClassVar[int]
    code: int
    view_version: int
    client_status: int
    def __init__(self, code: _Optional[int] = ..., view_version: _Optional[int] = ..., client_status: _Optional[int] = ...) -> None: ...

class ServiceReadyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServiceReadyResponse(_message.Message):
    __slots__ = ("code", "version", "fast_port")
    CODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FAST_PORT_FIELD_NUMBER: _ClassVar[int]
    code: int
    version: str
    fast_port: int
    def __init__(self, code: _Optional[int] = ..., version: _Optional[str] = ..., fast_port: _Optional[int] = ...) -> None: ...

class PutStartRequest(_message.Message):
    __slots__ = ("client_id", "key", "value_length", "config", "tenant_id", "attempt_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    key: str
    value_length: int
    config: ReplicateConfig
    tenant_id: str
    attempt_id: int
    def __init__(self, client_id: _Optional[str] = ..., key: _Optional[str] = ..., value_length: _Optional[int] = ..., config: _Optional[_Union[ReplicateConfig, _Mapping]] = ..., tenant_id: _Optional[str] = ..., attempt_id: _Optional[int] = ...) -> None: ...

class PutStartResponse(_message.Message):
    __slots__ = ("code", "replicas", "write_id", "retry_after_ms")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WRITE_ID_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    code: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaDescriptor]
    write_id: int
    retry_after_ms: int
    def __init__(self, code: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaDescriptor, _Mapping]]] = ..., write_id: _Optional[int] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class BatchPutStartRequest(_message.Message):
    __slots__ = ("client_id", "keys", "value_lengths", "config", "tenant_id", "attempt_id", "compact")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUE_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    COMPACT_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    value_lengths: _containers.RepeatedScalarFieldContainer[int]
    config: ReplicateConfig
    tenant_id: str
    attempt_id: int
    compact: bool
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., value_lengths: _Optional[_Iterable[int]] = ..., config: _Optional[_Union[ReplicateConfig, _Mapping]] = ..., tenant_id: _Optional[str] = ..., attempt_id: _Optional[int] = ..., compact: _Optional[bool] = ...) -> None: ...

class ReplicaColumns(_message.Message):
    __slots__ = ("counts", "ids", "statuses", "segment_ids", "offsets", "sizes", "capabilities", "segments")
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    IDS_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    CAPABILITIES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    statuses: _containers.RepeatedScalarFieldContainer[int]
    segment_ids: _containers.RepeatedScalarFieldContainer[str]
    offsets: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    capabilities: _containers.RepeatedScalarFieldContainer[bytes]
    segments: _containers.RepeatedCompositeFieldContainer[SegmentPlace]
    def __init__(self, counts: _Optional[_Iterable[int]] = ..., ids: _Optional[_Iterable[int]] = ..., statuses: _Optional[_Iterable[int]] = ..., segment_ids: _Optional[_Iterable[str]] = ..., offsets: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ..., capabilities: _Optional[_Iterable[bytes]] = ..., segments: _Optional[_Iterable[_Union[SegmentPlace, _Mapping]]] = ...) -> None: ...

class SegmentPlace(_message.Message):
    __slots__ = ("id", "name", "te_endpoint", "host_id", "disk")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TE_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    HOST_ID_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    te_endpoint: str
    host_id: str
    disk: bool
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., te_endpoint: _Optional[str] = ..., host_id: _Optional[str] = ..., disk: _Optional[bool] = ...) -> None: ...

class PutStartColumns(_message.Message):
    __slots__ = ("codes", "write_ids", "retry_after_ms", "replicas")
    CODES_FIELD_NUMBER: _ClassVar[int]
    WRITE_IDS_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    codes: _containers.RepeatedScalarFieldContainer[int]
    write_ids: _containers.RepeatedScalarFieldContainer[int]
    retry_after_ms: _containers.RepeatedScalarFieldContainer[int]
    replicas: ReplicaColumns
    def __init__(self, codes: _Optional[_Iterable[int]] = ..., write_ids: _Optional[_Iterable[int]] = ..., retry_after_ms: _Optional[_Iterable[int]] = ..., replicas: _Optional[_Union[ReplicaColumns, _Mapping]] = ...) -> None: ...

class BatchPutStartResponse(_message.Message):
    __slots__ = ("results", "columns")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PutStartResponse]
    columns: PutStartColumns
    def __init__(self, results: _Optional[_Iterable[_Union[PutStartResponse, _Mapping]]] = ..., columns: _Optional[_Union[PutStartColumns, _Mapping]] = ...) -> None: ...

class GetReplicaListResponse(_message.Message):
    __slots__ = ("code", "replicas", "lease_ttl_ms", "size", "read_id")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    READ_ID_FIELD_NUMBER: _ClassVar[int]
    code: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaDescriptor]
    lease_ttl_ms: int
    size: int
    read_id: int
    def __init__(self, code: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaDescriptor, _Mapping]]] = ..., lease_ttl_ms: _Optional[int] = ..., size: _Optional[int] = ..., read_id: _Optional[int] = ...) -> None: ...

class EndReadsRequest(_message.Message):
    __slots__ = ("client_id", "read_ids")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    READ_IDS_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    read_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[str] = ..., read_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class BatchProbeKeyRequest(_message.Message):
    __slots__ = ("client_id", "keys", "tenant_id", "lease_mode", "candidate_size")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_MODE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_SIZE_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    tenant_id: str
    lease_mode: int
    candidate_size: int
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., tenant_id: _Optional[str] = ..., lease_mode: _Optional[int] = ..., candidate_size: _Optional[int] = ...) -> None: ...

class ReplicaListColumns(_message.Message):
    __slots__ = ("codes", "lease_ttl_ms", "sizes", "read_ids", "replicas")
    CODES_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    READ_IDS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    codes: _containers.RepeatedScalarFieldContainer[int]
    lease_ttl_ms: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    read_ids: _containers.RepeatedScalarFieldContainer[int]
    replicas: ReplicaColumns
    def __init__(self, codes: _Optional[_Iterable[int]] = ..., lease_ttl_ms: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ..., read_ids: _Optional[_Iterable[int]] = ..., replicas: _Optional[_Union[ReplicaColumns, _Mapping]] = ...) -> None: ...

class BatchGetReplicaListResponse(_message.Message):
    __slots__ = ("results", "columns")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[GetReplicaListResponse]
    columns: ReplicaListColumns
    def __init__(self, results: _Optional[_Iterable[_Union[GetReplicaListResponse, _Mapping]]] = ..., columns: _Optional[_Union[ReplicaListColumns, _Mapping]] = ...) -> None: ...

class ExistKeyResponse(_message.Message):
    __slots__ = ("code", "exists")
    CODE_FIELD_NUMBER: _ClassVar[int]
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    code: int
    exists: bool
    def __init__(self, code: _Optional[int] = ..., exists: _Optional[bool] = ...) -> None: ...

class BatchExistKeyResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, results: _Optional[_Iterable[int]] = ...) -> None: ...

class RemoveRequest(_message.Message):
    __slots__ = ("client_id", "key", "force", "tenant_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    key: str
    force: bool
    tenant_id: str
    def __init__(self, client_id: _Optional[str] = ..., key: _Optional[str] = ..., force: _Optional[bool] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class BatchRemoveRequest(_message.Message):
    __slots__ = ("client_id", "keys", "force", "tenant_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    force: bool
    tenant_id: str
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., force: _Optional[bool] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class RemoveByRegexRequest(_message.Message):
    __slots__ = ("client_id", "pattern", "force", "tenant_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    pattern: str
    force: bool
    tenant_id: str
    def __init__(self, client_id: _Optional[str] = ..., pattern: _Optional[str] = ..., force: _Optional[bool] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class RemoveAllRequest(_message.Message):
    __slots__ = ("client_id", "force", "tenant_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    force: bool
    tenant_id: str
    def __init__(self, client_id: _Optional[str] = ..., force: _Optional[bool] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class KvSessionTags(_message.Message):
    __slots__ = ("session_ids",)
    SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, session_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PutStartWithKvSessionsRequest(_message.Message):
    __slots__ = ("put", "kv_sessions")
    PUT_FIELD_NUMBER: _ClassVar[int]
    KV_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    put: PutStartRequest
    kv_sessions: KvSessionTags
    def __init__(self, put: _Optional[_Union[PutStartRequest, _Mapping]] = ..., kv_sessions: _Optional[_Union[KvSessionTags, _Mapping]] = ...) -> None: ...

class BatchPutStartWithKvSessionsRequest(_message.Message):
    __slots__ = ("put", "kv_sessions")
    PUT_FIELD_NUMBER: _ClassVar[int]
    KV_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    put: BatchPutStartRequest
    kv_sessions: _containers.RepeatedCompositeFieldContainer[KvSessionTags]
    def __init__(self, put: _Optional[_Union[BatchPutStartRequest, _Mapping]] = ..., kv_sessions: _Optional[_Iterable[_Union[KvSessionTags, _Mapping]]] = ...) -> None: ...

class KvSessionRequest(_message.Message):
    __slots__ = ("session_id", "tenant_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tenant_id: str
    def __init__(self, session_id: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class ReleaseKvSessionRequest(_message.Message):
    __slots__ = ("session_id", "tenant_id", "all_pages")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ALL_PAGES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tenant_id: str
    all_pages: bool
    def __init__(self, session_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., all_pages: _Optional[bool] = ...) -> None: ...

class AttachKvSessionRequest(_message.Message):
    __slots__ = ("session_id", "keys", "tenant_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    tenant_id: str
    def __init__(self, session_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class UpdateKvSessionRequest(_message.Message):
    __slots__ = ("session_id", "keep_keys", "tenant_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_KEYS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    keep_keys: _containers.RepeatedScalarFieldContainer[str]
    tenant_id: str
    def __init__(self, session_id: _Optional[str] = ..., keep_keys: _Optional[_Iterable[str]] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class ListKvSessionKeysRequest(_message.Message):
    __slots__ = ("session_id", "cursor", "limit", "tenant_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    cursor: str
    limit: int
    tenant_id: str
    def __init__(self, session_id: _Optional[str] = ..., cursor: _Optional[str] = ..., limit: _Optional[int] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class KvSessionInfo(_message.Message):
    __slots__ = ("session_id", "pinned", "member_count", "created_at", "last_active_at", "bytes", "exclusive_bytes", "idle_ms")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    MEMBER_COUNT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_ACTIVE_AT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_BYTES_FIELD_NUMBER: _ClassVar[int]
    IDLE_MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    pinned: bool
    member_count: int
    created_at: float
    last_active_at: float
    bytes: int
    exclusive_bytes: int
    idle_ms: int
    def __init__(self, session_id: _Optional[str] = ..., pinned: _Optional[bool] = ..., member_count: _Optional[int] = ..., created_at: _Optional[float] = ..., last_active_at: _Optional[float] = ..., bytes: _Optional[int] = ..., exclusive_bytes: _Optional[int] = ..., idle_ms: _Optional[int] = ...) -> None: ...

class KvSessionInfoResponse(_message.Message):
    __slots__ = ("code", "info")
    CODE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    code: int
    info: KvSessionInfo
    def __init__(self, code: _Optional[int] = ..., info: _Optional[_Union[KvSessionInfo, _Mapping]] = ...) -> None: ...

class KvSessionPageResponse(_message.Message):
    __slots__ = ("code", "keys", "next_cursor")
    CODE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    code: int
    keys: _containers.RepeatedScalarFieldContainer[str]
    next_cursor: str
    def __init__(self, code: _Optional[int] = ..., keys: _Optional[_Iterable[str]] = ..., next_cursor: _Optional[str] = ...) -> None: ...

class ListKvSessionsRequest(_message.Message):
    __slots__ = ("cursor", "limit", "pinned", "min_idle_ms", "tenant_id")
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    MIN_IDLE_MS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    cursor: str
    limit: int
    pinned: bool
    min_idle_ms: int
    tenant_id: str
    def __init__(self, cursor: _Optional[str] = ..., limit: _Optional[int] = ..., pinned: _Optional[bool] = ..., min_idle_ms: _Optional[int] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class ListKvSessionsResponse(_message.Message):
    __slots__ = ("code", "sessions", "next_cursor")
    CODE_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    code: int
    sessions: _containers.RepeatedCompositeFieldContainer[KvSessionInfo]
    next_cursor: str
    def __init__(self, code: _Optional[int] = ..., sessions: _Optional[_Iterable[_Union[KvSessionInfo, _Mapping]]] = ..., next_cursor: _Optional[str] = ...) -> None: ...

class ReleaseStaleKvSessionsRequest(_message.Message):
    __slots__ = ("max_idle_ms", "include_pinned", "tenant_id")
    MAX_IDLE_MS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PINNED_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    max_idle_ms: int
    include_pinned: bool
    tenant_id: str
    def __init__(self, max_idle_ms: _Optional[int] = ..., include_pinned: _Optional[bool] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class ReleaseAllKvSessionsRequest(_message.Message):
    __slots__ = ("confirm", "tenant_id")
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    confirm: bool
    tenant_id: str
    def __init__(self, confirm: _Optional[bool] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class ReleaseKvCacheRequest(_message.Message):
    __slots__ = ("keep_pinned", "tenant_id")
    KEEP_PINNED_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    keep_pinned: bool
    tenant_id: str
    def __init__(self, keep_pinned: _Optional[bool] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("code", "sessions", "released_objects", "freed_bytes", "pending_bytes", "kept_shared", "kept_hard_pinned", "kept_leased", "kept_writing", "kept_pinned", "message", "freed_disk_bytes")
    CODE_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_OBJECTS_FIELD_NUMBER: _ClassVar[int]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PENDING_BYTES_FIELD_NUMBER: _ClassVar[int]
    KEPT_SHARED_FIELD_NUMBER: _ClassVar[int]
    KEPT_HARD_PINNED_FIELD_NUMBER: _ClassVar[int]
    KEPT_LEASED_FIELD_NUMBER: _ClassVar[int]
    KEPT_WRITING_FIELD_NUMBER: _ClassVar[int]
    KEPT_PINNED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FREED_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    code: int
    sessions: int
    released_objects: int
    freed_bytes: int
    pending_bytes: int
    kept_shared: int
    kept_hard_pinned: int
    kept_leased: int
    kept_writing: int
    kept_pinned: int
    message: str
    freed_disk_bytes: int
    def __init__(self, code: _Optional[int] = ..., sessions: _Optional[int] = ..., released_objects: _Optional[int] = ..., freed_bytes: _Optional[int] = ..., pending_bytes: _Optional[int] = ..., kept_shared: _Optional[int] = ..., kept_hard_pinned: _Optional[int] = ..., kept_leased: _Optional[int] = ..., kept_writing: _Optional[int] = ..., kept_pinned: _Optional[int] = ..., message: _Optional[str] = ..., freed_disk_bytes: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("tenant_id", "all_tenants")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ALL_TENANTS_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    all_tenants: bool
    def __init__(self, tenant_id: _Optional[str] = ..., all_tenants: _Optional[bool] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("code", "values")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    code: int
    values: _containers.ScalarMap[str, int]
    def __init__(self, code: _Optional[int] = ..., values: _Optional[_Mapping[str, int]] = ...) -> None: ...

class ListSegmentsRequest(_message.Message):
    __slots__ = ("tenant_id", "all_tenants")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ALL_TENANTS_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    all_tenants: bool
    def __init__(self, tenant_id: _Optional[str] = ..., all_tenants: _Optional[bool] = ...) -> None: ...

class SegmentStatus(_message.Message):
    __slots__ = ("segment", "client_id", "used_bytes", "allocations")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    segment: Segment
    client_id: str
    used_bytes: int
    allocations: int
    def __init__(self, segment: _Optional[_Union[Segment, _Mapping]] = ..., client_id: _Optional[str] = ..., used_bytes: _Optional[int] = ..., allocations: _Optional[int] = ...) -> None: ...

class ListSegmentsResponse(_message.Message):
    __slots__ = ("code", "segments")
    CODE_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    code: int
    segments: _containers.RepeatedCompositeFieldContainer[SegmentStatus]
    def __init__(self, code: _Optional[int] = ..., segments: _Optional[_Iterable[_Union[SegmentStatus, _Mapping]]] = ...) -> None: ...

class BatchReplicaClearRequest(_message.Message):
    __slots__ = ("client_id", "keys", "segment_name", "tenant_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_NAME_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    segment_name: str
    tenant_id: str
    def __init__(self, client_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., segment_name: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class KeyListResponse(_message.Message):
    __slots__ = ("code", "keys")
    CODE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    code: int
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, code: _Optional[int] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateCopyTaskRequest(_message.Message):
    __slots__ = ("tenant_id", "key", "targets")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    key: str
    targets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant_id: _Optional[str] = ..., key: _Optional[str] = ..., targets: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateMoveTaskRequest(_message.Message):
    __slots__ = ("tenant_id", "key", "source", "target")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    key: str
    source: str
    target: str
    def __init__(self, tenant_id: _Optional[str] = ..., key: _Optional[str] = ..., source: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...

class TaskIdResponse(_message.Message):
    __slots__ = ("code", "task_id")
    CODE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    code: int
    task_id: str
    def __init__(self, code: _Optional[int] = ..., task_id: _Optional[str] = ...) -> None: ...

class TaskRequest(_message.Message):
    __slots__ = ("client_id", "task_id", "tenant_id")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_id: str
    tenant_id: str
    def __init__(self, client_id: _Optional[str] = ..., task_id: _Optional[str] = ..., tenant_id: _Optional[str] = ...) -> None: ...

class QueryTaskResponse(_message.Message):
    __slots__ = ("code", "task_id", "type", "status", "created_at_ms_epoch", "last_updated_at_ms_epoch", "assigned_client", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_MS_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATED_AT_MS_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_CLIENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    task_id: str
    type: int
    status: int
    created_at_ms_epoch: int
    last_updated_at_ms_epoch: int
    assigned_client: str
    message: str
    def __init__(self, code: _Optional[int] = ..., task_id: _Optional[str] = ..., type: _Optional[int] = ..., status: _Optional[int] = ..., created_at_ms_epoch: _Optional[int] = ..., last_updated_at_ms_epoch: _Optional[int] = ..., assigned_client: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class FetchTasksRequest(_message.Message):
    __slots__ = ("client_id", "batch_size")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    batch_size: int
    def __init__(self, client_id: _Optional[str] = ..., batch_size: _Optional[int] = ...) -> None: ...

class FetchTasksResponse(_message.Message):
    __slots__ = ("code", "task_ids")
    CODE_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    code: int
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, code: _Optional[int] = ..., task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class StartTaskResponse(_message.Message):
    __slots__ = ("code", "source", "targets")
    CODE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    code: int
    source: ReplicaDescriptor
    targets: _containers.RepeatedCompositeFieldContainer[ReplicaDescriptor]
    def __init__(self, code: _Optional[int] = ..., source: _Optional[_Union[ReplicaDescriptor, _Mapping]] = ..., targets: _Optional[_Iterable[_Union[ReplicaDescriptor, _Mapping]]] = ...) -> None: ...

class FinishTaskRequest(_message.Message):
    __slots__ = ("client_id", "task_id", "succeeded", "message")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_id: str
    succeeded: bool
    message: str
    def __init__(self, client_id: _Optional[str] = ..., task_id: _Optional[str] = ..., succeeded: _Optional[bool] = ..., message: _Optional[str] = ...) -> None: ...

class FetchDiskTasksRequest(_message.Message):
    __slots__ = ("client_id", "batch_size")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    batch_size: int
    def __init__(self, client_id: _Optional[str] = ..., batch_size: _Optional[int] = ...) -> None: ...

class DiskTask(_message.Message):
    __slots__ = ("task_id", "kind", "tenant_id", "key", "size", "memory_segment_id", "memory_offset", "disk_segment_id", "disk_offset")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DISK_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    DISK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    kind: int
    tenant_id: str
    key: str
    size: int
    memory_segment_id: str
    memory_offset: int
    disk_segment_id: str
    disk_offset: int
    def __init__(self, task_id: _Optional[int] = ..., kind: _Optional[int] = ..., tenant_id: _Optional[str] = ..., key: _Optional[str] = ..., size: _Optional[int] = ..., memory_segment_id: _Optional[str] = ..., memory_offset: _Optional[int] = ..., disk_segment_id: _Optional[str] = ..., disk_offset: _Optional[int] = ...) -> None: ...

class DiskDeletes(_message.Message):
    __slots__ = ("disk_segment_id", "offsets")
    DISK_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    disk_segment_id: str
    offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, disk_segment_id: _Optional[str] = ..., offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class FetchDiskTasksResponse(_message.Message):
    __slots__ = ("code", "tasks", "deletes")
    CODE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    DELETES_FIELD_NUMBER: _ClassVar[int]
    code: int
    tasks: _containers.RepeatedCompositeFieldContainer[DiskTask]
    deletes: _containers.RepeatedCompositeFieldContainer[DiskDeletes]
    def __init__(self, code: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[DiskTask, _Mapping]]] = ..., deletes: _Optional[_Iterable[_Union[DiskDeletes, _Mapping]]] = ...) -> None: ...

class FinishDiskTasksRequest(_message.Message):
    __slots__ = ("client_id", "task_ids", "codes")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    CODES_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    task_ids: _containers.RepeatedScalarFieldContainer[int]
    codes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, client_id: _Optional[str] = ..., task_ids: _Optional[_Iterable[int]] = ..., codes: _Optional[_Iterable[int]] = ...) -> None: ...

class DiskReplicaEntry(_message.Message):
    __slots__ = ("tenant_id", "key", "offset", "size")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    key: str
    offset: int
    size: int
    def __init__(self, tenant_id: _Optional[str] = ..., key: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class DemoteObjectsRequest(_message.Message):
    __slots__ = ("tenant_id", "keys")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant_id: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterDiskReplicasRequest(_message.Message):
    __slots__ = ("client_id", "disk_segment_id", "entries")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    DISK_SEGMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    disk_segment_id: str
    entries: _containers.RepeatedCompositeFieldContainer[DiskReplicaEntry]
    def __init__(self, client_id: _Optional[str] = ..., disk_segment_id: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[DiskReplicaEntry, _Mapping]]] = ...) -> None: ...
