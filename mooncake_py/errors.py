"""Error codes and the exception hierarchy.

``ErrorCode`` mirrors upstream Mooncake's ``ErrorCode`` (names and numbers). RPC results carry
these codes per item. The typed :class:`mooncake_py.Client` raises one exception class per
family of codes, all rooted at :class:`MooncakeError`; :func:`error_for` is the one place that
maps a code to its class. The drop-in ``MooncakeDistributedStore`` returns the codes as
negative ints instead, and raises :class:`MooncakeError` only where upstream raises.

Families (class: codes):

- :class:`NotFoundError`: OBJECT_NOT_FOUND, SESSION_NOT_FOUND, SEGMENT_NOT_FOUND,
  CLIENT_NOT_FOUND, REPLICA_NOT_FOUND, and the other ``*_NOT_FOUND`` / ``*_NOT_EXIST`` codes;
- :class:`AlreadyExistsError`: OBJECT_ALREADY_EXISTS, SEGMENT_ALREADY_EXISTS, ...;
- :class:`NoSpaceError`: NO_AVAILABLE_HANDLE, BUFFER_OVERFLOW, TENANT_QUOTA_EXCEEDED;
- :class:`LimitExceededError`: SESSION_LIMIT_EXCEEDED, KEYS_ULTRA_LIMIT, ...;
- :class:`LeaseExpiredError`: LEASE_EXPIRED;
- :class:`BusyError`: OBJECT_HAS_LEASE, OBJECT_REPLICA_BUSY, REPLICA_IS_NOT_READY, ...;
- :class:`InvalidParamsError`: INVALID_PARAMS, INVALID_KEY, ILLEGAL_CLIENT, INVALID_WRITE, ...;
- :class:`PermissionDeniedError` (and :class:`AuthenticationError`): the master refused the
  caller's token or tenant;
- :class:`UnavailableError`: RPC_FAIL, RPC_TIMEOUT, UNAVAILABLE_IN_CURRENT_*, ETCD_*;
- :class:`TransferError`: TRANSFER_FAIL, CHECKSUM_MISMATCH, WRITE_FAIL;
- :class:`NotSupportedError`: NOT_SUPPORTED, SERIALIZE_UNSUPPORTED, UNABLE_OFFLOAD*;
- :class:`InternalError`: INTERNAL_ERROR and every code not listed above.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Result codes shared by the master, the client and the Python API."""

    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SHARD_INDEX_OUT_OF_RANGE = -100
    SEGMENT_NOT_FOUND = -101
    SEGMENT_ALREADY_EXISTS = -102
    CLIENT_NOT_FOUND = -103
    NO_AVAILABLE_HANDLE = -200
    INVALID_VERSION = -300
    INVALID_KEY = -400
    WRITE_FAIL = -500
    INVALID_PARAMS = -600
    ILLEGAL_CLIENT = -601
    INVALID_WRITE = -700
    INVALID_READ = -701
    INVALID_REPLICA = -702
    REPLICA_IS_NOT_READY = -703
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    LEASE_EXPIRED = -707
    OBJECT_HAS_REPLICATION_TASK = -708
    OBJECT_NO_REPLICATION_TASK = -709
    REPLICA_NOT_FOUND = -710
    REPLICA_ALREADY_EXISTS = -711
    REPLICA_IS_GONE = -712
    REPLICA_NOT_IN_LOCAL_MEMORY = -713
    OBJECT_REPLICA_BUSY = -714
    TRANSFER_FAIL = -800
    CHECKSUM_MISMATCH = -801
    RPC_FAIL = -900
    RPC_TIMEOUT = -901
    ETCD_OPERATION_ERROR = -1000
    ETCD_KEY_NOT_EXIST = -1001
    ETCD_TRANSACTION_FAIL = -1002
    ETCD_CTX_CANCELLED = -1003
    OPLOG_ENTRY_NOT_FOUND = -1004
    K8S_LEASE_OPERATION_ERROR = -1005
    K8S_LEASE_NOT_FOUND = -1006
    INCOMPLETE_OPLOG_CATCH_UP = -1007
    UNAVAILABLE_IN_CURRENT_STATUS = -1010
    UNAVAILABLE_IN_CURRENT_MODE = -1011
    NOT_SUPPORTED = -1012
    FILE_NOT_FOUND = -1100
    FILE_OPEN_FAIL = -1101
    FILE_READ_FAIL = -1102
    FILE_WRITE_FAIL = -1103
    FILE_INVALID_BUFFER = -1104
    FILE_LOCK_FAIL = -1105
    FILE_INVALID_HANDLE = -1106
    BUCKET_NOT_FOUND = -1200
    BUCKET_ALREADY_EXISTS = -1201
    KEYS_EXCEED_BUCKET_LIMIT = -1202
    KEYS_ULTRA_LIMIT = -1203
    UNABLE_OFFLOAD = -1300
    UNABLE_OFFLOADING = -1301
    TASK_NOT_FOUND = -1400
    TASK_PENDING_LIMIT_EXCEEDED = -1401
    JOB_NOT_FOUND = -1402
    SERIALIZE_UNSUPPORTED = -1500
    SERIALIZE_FAIL = -1501
    DESERIALIZE_FAIL = -1502
    PERSISTENT_FAIL = -1503
    DFS_NETWORK_TIMEOUT = -1600
    TENANT_QUOTA_EXCEEDED = -1700
    TENANT_NOT_REGISTERED = -1701
    TENANT_NOT_EMPTY = -1702
    SESSION_NOT_FOUND = -1800
    SESSION_LIMIT_EXCEEDED = -1802

    @classmethod
    def name_of(cls, code: int) -> str:
        """Return the name of ``code``, or ``UNKNOWN_ERROR(<code>)`` for unlisted values."""
        try:
            return cls(code).name
        except ValueError:
            return f"UNKNOWN_ERROR({code})"


class MooncakeError(RuntimeError):
    """A store operation failed with an :class:`ErrorCode`.

    Attributes:
        code: the negative error code.
        key: the key (or session id) concerned, when there is one.
    """

    def __init__(self, code: int, message: str = "", key: str | None = None) -> None:
        self.code = int(code)
        self.key = key
        self.detail = message
        text = ErrorCode.name_of(self.code)
        if message:
            text = f"{text}: {message}"
        if key is not None:
            text = f"{text} (key={key!r})"
        super().__init__(text)

    def __reduce__(self) -> tuple[object, ...]:
        # Survives pickling (worker processes hand errors back) with its class and fields.
        return (type(self), (self.code, self.detail, self.key))


class NotFoundError(MooncakeError):
    """The object, session, segment or client named does not exist."""


class AlreadyExistsError(MooncakeError):
    """The object or segment already exists."""


class NoSpaceError(MooncakeError):
    """No segment can hold the value, even after eviction (NO_AVAILABLE_HANDLE), or a quota or
    buffer is too small."""


class LimitExceededError(MooncakeError):
    """A configured limit (sessions, members per session, keys) would be exceeded."""


class LeaseExpiredError(MooncakeError):
    """A read outlived its lease: the bytes may have changed, so they were discarded."""


class BusyError(MooncakeError):
    """The object is in use: leased by a reader, being written, or not readable yet."""


class InvalidParamsError(MooncakeError, ValueError):
    """The request is malformed (bad key, size, id, config or batch) or not allowed for this
    client."""


class PermissionDeniedError(MooncakeError):
    """The master refused the call: it names a tenant other than its token's
    (gRPC PERMISSION_DENIED)."""


class AuthenticationError(PermissionDeniedError):
    """The master requires a valid token and the call had none (gRPC UNAUTHENTICATED)."""


class UnavailableError(MooncakeError):
    """The master could not be reached (RPC_FAIL), did not answer in time (RPC_TIMEOUT), or
    cannot serve the call in its current state."""


# The name the rest of the project has always used for an unreachable master.
MasterUnavailableError = UnavailableError


class TransferError(MooncakeError):
    """Moving bytes to or from a replica failed (TRANSFER_FAIL, CHECKSUM_MISMATCH)."""


class NotSupportedError(MooncakeError):
    """The store does not support the operation."""


class InternalError(MooncakeError):
    """The store failed unexpectedly (INTERNAL_ERROR, or a code without a family)."""


_E = ErrorCode
_FAMILIES: dict[type[MooncakeError], tuple[ErrorCode, ...]] = {
    NotFoundError: (
        _E.OBJECT_NOT_FOUND,
        _E.SESSION_NOT_FOUND,
        _E.SEGMENT_NOT_FOUND,
        _E.CLIENT_NOT_FOUND,
        _E.REPLICA_NOT_FOUND,
        _E.OBJECT_NO_REPLICATION_TASK,
        _E.ETCD_KEY_NOT_EXIST,
        _E.OPLOG_ENTRY_NOT_FOUND,
        _E.K8S_LEASE_NOT_FOUND,
        _E.FILE_NOT_FOUND,
        _E.BUCKET_NOT_FOUND,
        _E.TASK_NOT_FOUND,
        _E.JOB_NOT_FOUND,
        _E.TENANT_NOT_REGISTERED,
    ),
    AlreadyExistsError: (
        _E.OBJECT_ALREADY_EXISTS,
        _E.SEGMENT_ALREADY_EXISTS,
        _E.REPLICA_ALREADY_EXISTS,
        _E.BUCKET_ALREADY_EXISTS,
    ),
    NoSpaceError: (_E.NO_AVAILABLE_HANDLE, _E.BUFFER_OVERFLOW, _E.TENANT_QUOTA_EXCEEDED),
    LimitExceededError: (
        _E.SESSION_LIMIT_EXCEEDED,
        _E.KEYS_EXCEED_BUCKET_LIMIT,
        _E.KEYS_ULTRA_LIMIT,
        _E.TASK_PENDING_LIMIT_EXCEEDED,
    ),
    LeaseExpiredError: (_E.LEASE_EXPIRED,),
    BusyError: (
        _E.OBJECT_HAS_LEASE,
        _E.OBJECT_REPLICA_BUSY,
        _E.REPLICA_IS_NOT_READY,
        _E.OBJECT_HAS_REPLICATION_TASK,
        _E.REPLICA_IS_GONE,
        _E.TENANT_NOT_EMPTY,
        _E.FILE_LOCK_FAIL,
    ),
    InvalidParamsError: (
        _E.INVALID_PARAMS,
        _E.INVALID_KEY,
        _E.INVALID_VERSION,
        _E.ILLEGAL_CLIENT,
        _E.INVALID_WRITE,
        _E.INVALID_READ,
        _E.INVALID_REPLICA,
        _E.SHARD_INDEX_OUT_OF_RANGE,
        _E.REPLICA_NOT_IN_LOCAL_MEMORY,
        _E.FILE_INVALID_BUFFER,
        _E.FILE_INVALID_HANDLE,
    ),
    UnavailableError: (
        _E.RPC_FAIL,
        _E.RPC_TIMEOUT,
        _E.UNAVAILABLE_IN_CURRENT_STATUS,
        _E.UNAVAILABLE_IN_CURRENT_MODE,
        _E.ETCD_OPERATION_ERROR,
        _E.ETCD_TRANSACTION_FAIL,
        _E.ETCD_CTX_CANCELLED,
        _E.K8S_LEASE_OPERATION_ERROR,
        _E.INCOMPLETE_OPLOG_CATCH_UP,
        _E.DFS_NETWORK_TIMEOUT,
    ),
    TransferError: (_E.TRANSFER_FAIL, _E.CHECKSUM_MISMATCH, _E.WRITE_FAIL),
    NotSupportedError: (
        _E.NOT_SUPPORTED,
        _E.SERIALIZE_UNSUPPORTED,
        _E.UNABLE_OFFLOAD,
        _E.UNABLE_OFFLOADING,
    ),
}
_CLASS_OF_CODE: dict[int, type[MooncakeError]] = {
    int(code): family for family, codes in _FAMILIES.items() for code in codes
}


def error_class_of(code: int) -> type[MooncakeError]:
    """The exception class for ``code`` (:class:`InternalError` for codes without a family).

    Raises:
        ValueError: ``code`` is 0 (success is not an error).
    """
    if code == 0:
        raise ValueError("code 0 is success, not an error")
    return _CLASS_OF_CODE.get(int(code), InternalError)


def error_for(code: int, message: str = "", key: str | None = None) -> MooncakeError:
    """The exception for a non-zero ``code``: an instance of its family's class."""
    return error_class_of(code)(code, message, key)


def raise_for(code: int, message: str = "", key: str | None = None) -> None:
    """Raise :func:`error_for` ``(code, ...)`` unless ``code`` is 0 (or positive)."""
    if code < 0:
        raise error_for(code, message, key)
