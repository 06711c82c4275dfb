"""Caller memory: registered zero-copy buffers and byte views of Python values.

Zero-copy calls (``put_from``, ``get_into`` and their batch forms) take raw addresses. A
:class:`RegisteredBuffers` registry admits an address range only when it lies inside memory the
caller registered, so a wrong pointer is rejected instead of becoming a wild write.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from sortedcontainers import SortedDict

from mooncake_py.errors import ErrorCode, InvalidParamsError

from .data_plane import view_of_address


class RegisteredBuffers:
    """Address ranges the caller allowed zero-copy calls on. Thread-safe.

    Complexity: registration O(log n); a lookup O(log n) in the number of buffers.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_start: SortedDict = SortedDict()
        # A byte view of each registered buffer, made once: a batch's views are slices of it
        # (slicing costs a tenth of making a view of a raw address).
        self._whole: dict[int, memoryview] = {}

    def register(self, buffer_ptr: int, size: int) -> bool:
        """Allow ``[buffer_ptr, buffer_ptr + size)``; False for a non-positive address or size.

        Registering the same start again replaces its size.
        """
        if buffer_ptr <= 0 or size <= 0:
            return False
        with self._lock:
            self._by_start[buffer_ptr] = size
            self._whole.pop(buffer_ptr, None)  # made again, of the new size, when needed
        return True

    def unregister(self, buffer_ptr: int) -> bool:
        """Forget the buffer starting at ``buffer_ptr``; False when there was none."""
        with self._lock:
            self._whole.pop(buffer_ptr, None)
            return self._by_start.pop(buffer_ptr, None) is not None

    def view(self, buffer_ptr: int, size: int) -> memoryview | None:
        """A writable view of ``size`` bytes at ``buffer_ptr``, or None unless the whole range
        lies inside one registered buffer."""
        if buffer_ptr <= 0 or size <= 0:
            return None
        with self._lock:
            index = self._by_start.bisect_right(buffer_ptr) - 1
            if index < 0:
                return None
            start, length = self._by_start.peekitem(index)
        if buffer_ptr + size > start + length:
            return None
        return view_of_address(buffer_ptr, size)

    def view_each(
        self, buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[memoryview | None]:
        """:meth:`view` of each ``(buffer_ptrs[i], sizes[i])``, under one acquisition of the
        lock (a batch's ranges mostly lie in one buffer, checked first).

        Raises:
            ValueError: the two lists differ in length.

        Complexity: O(n log b) for n ranges over b registered buffers; O(n) when they lie in
        the buffer of the previous range.
        """
        views: list[memoryview | None] = []
        append = views.append
        start = end = 0
        whole: memoryview | None = None
        with self._lock:
            for buffer_ptr, size in zip(buffer_ptrs, sizes, strict=True):
                if buffer_ptr <= 0 or size <= 0:
                    append(None)
                    continue
                if whole is None or not start <= buffer_ptr < end:
                    index = self._by_start.bisect_right(buffer_ptr) - 1
                    if index < 0:
                        append(None)
                        continue
                    start, length = self._by_start.peekitem(index)
                    end = start + length
                    whole = self._whole.get(start)
                    if whole is None:
                        whole = self._whole[start] = view_of_address(start, length)
                if buffer_ptr + size > end:
                    append(None)
                    continue
                offset = buffer_ptr - start
                append(whole[offset : offset + size])
        return views

    def views(self, buffer_ptrs: Sequence[int], sizes: Sequence[int]) -> list[memoryview] | None:
        """Views of the parts ``(buffer_ptrs[j], sizes[j])`` of one multi-buffer value, in order;
        parts of size 0 are skipped.

        Returns None when the two lists differ in length, a size is negative, a part does not
        lie inside one registered buffer, or no part has a byte.
        """
        if len(buffer_ptrs) != len(sizes):
            return None
        views: list[memoryview] = []
        for buffer_ptr, size in zip(buffer_ptrs, sizes, strict=True):
            if size == 0:
                continue
            view = self.view(buffer_ptr, size)
            if view is None:
                return None
            views.append(view)
        return views or None


def bytes_view(value: Any) -> memoryview:
    """A flat byte view of any C-contiguous buffer (bytes, bytearray, numpy array, ...).

    Raises:
        TypeError: ``value`` is not a buffer, or not C-contiguous.
    """
    if type(value) is bytes:  # the common case, and always a flat byte buffer
        return memoryview(value)
    try:
        view = memoryview(value)
    except TypeError as exc:
        raise TypeError(
            f"expected a buffer (bytes, bytearray, memoryview, array), got {type(value).__name__}"
        ) from exc
    if not view.c_contiguous:
        raise TypeError("buffer must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def parts_views(parts: Sequence[Any]) -> list[memoryview]:
    """Byte views of the parts of a ``put_parts`` value.

    Raises:
        InvalidParamsError: a part is not a one-dimensional buffer (as upstream raises).
        TypeError: a part is not a buffer.
    """
    views = []
    for part in parts:
        view = memoryview(part)
        if view.ndim != 1:
            raise InvalidParamsError(
                ErrorCode.INVALID_PARAMS, "parts must be one-dimensional buffers"
            )
        views.append(bytes_view(view))
    return views


def keys_ok(keys: Sequence[str]) -> bool:
    """Every key a non-empty string that encodes as UTF-8 (checked in bulk: batches of
    thousands of keys are common, and this runs before every call)."""
    try:
        joined = "\n".join(keys)
    except TypeError:
        return False
    if not all(keys):
        return False
    if joined.isascii():
        return True
    try:
        joined.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
