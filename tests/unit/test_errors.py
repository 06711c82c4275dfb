"""Every error code maps to exactly one exception family, and errors keep their fields."""

from __future__ import annotations

import pickle

import pytest

from mooncake_py import errors
from mooncake_py.errors import ErrorCode, InternalError, MooncakeError, error_class_of, error_for


def test_each_code_has_one_family_and_unlisted_codes_are_internal() -> None:
    listed = [code for codes in errors._FAMILIES.values() for code in codes]
    assert len(listed) == len(set(listed)), "a code is in two families"
    for code in ErrorCode:
        if code == ErrorCode.OK:
            continue
        cls = error_class_of(code)
        assert issubclass(cls, MooncakeError)
        assert (code in listed) != (cls is InternalError) or code == ErrorCode.INTERNAL_ERROR
    assert error_class_of(-123456) is InternalError
    with pytest.raises(ValueError):
        error_class_of(0)


@pytest.mark.parametrize(
    ("code", "family"),
    [
        (ErrorCode.OBJECT_NOT_FOUND, errors.NotFoundError),
        (ErrorCode.SESSION_NOT_FOUND, errors.NotFoundError),
        (ErrorCode.OBJECT_ALREADY_EXISTS, errors.AlreadyExistsError),
        (ErrorCode.NO_AVAILABLE_HANDLE, errors.NoSpaceError),
        (ErrorCode.SESSION_LIMIT_EXCEEDED, errors.LimitExceededError),
        (ErrorCode.LEASE_EXPIRED, errors.LeaseExpiredError),
        (ErrorCode.OBJECT_HAS_LEASE, errors.BusyError),
        (ErrorCode.OBJECT_REPLICA_BUSY, errors.BusyError),
        (ErrorCode.INVALID_PARAMS, errors.InvalidParamsError),
        (ErrorCode.ILLEGAL_CLIENT, errors.InvalidParamsError),
        (ErrorCode.RPC_FAIL, errors.UnavailableError),
        (ErrorCode.RPC_TIMEOUT, errors.UnavailableError),
        (ErrorCode.TRANSFER_FAIL, errors.TransferError),
        (ErrorCode.NOT_SUPPORTED, errors.NotSupportedError),
        (ErrorCode.INTERNAL_ERROR, errors.InternalError),
    ],
)
def test_families(code: ErrorCode, family: type[MooncakeError]) -> None:
    error = error_for(code, "detail", key="k")
    assert type(error) is family
    assert (error.code, error.key) == (code, "k")
    assert str(error) == f"{code.name}: detail (key='k')"
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is family and (copy.code, copy.key, str(copy)) == (code, "k", str(error))


def test_invalid_params_is_also_a_value_error_and_raise_for_passes_success() -> None:
    assert isinstance(error_for(ErrorCode.INVALID_PARAMS), ValueError)
    errors.raise_for(0)
    errors.raise_for(5)  # counts and sizes are not errors
    with pytest.raises(errors.NoSpaceError):
        errors.raise_for(ErrorCode.NO_AVAILABLE_HANDLE)
