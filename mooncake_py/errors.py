"""Error codes and the exception hierarchy.

``ErrorCode`` mirrors upstream Mooncake's ``ErrorCode`` (names and numbers). RPC results carry
these codes per item; the drop-in ``MooncakeDistributedStore`` returns them as negative ints, and
the calls that upstream raises for raise :class:`MooncakeError`, whose message names the code.
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
        key: the key concerned, when there is one.
    """

    def __init__(self, code: int, message: str = "", key: str | None = None) -> None:
        self.code = int(code)
        self.key = key
        text = ErrorCode.name_of(self.code)
        if message:
            text = f"{text}: {message}"
        if key is not None:
            text = f"{text} (key={key!r})"
        super().__init__(text)


class MasterUnavailableError(MooncakeError):
    """The master could not be reached (RPC_FAIL) or did not answer in time (RPC_TIMEOUT)."""


class TransferError(MooncakeError):
    """Moving bytes to or from a replica failed (TRANSFER_FAIL)."""


class AuthenticationError(MooncakeError):
    """The master requires a valid token and the call had none (gRPC UNAUTHENTICATED)."""


class PermissionDeniedError(MooncakeError):
    """The call named a tenant other than its token's (gRPC PERMISSION_DENIED)."""
