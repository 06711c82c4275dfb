"""``BufferHandle``: a value read into memory of its own, as upstream's ``get_buffer`` returns.

Upstream's ``BufferHandle`` has ``ptr()`` (the address of the bytes), ``size()``, ``len()`` and
the buffer protocol (one-dimensional, unsigned bytes). This one is a fixed-size ``bytearray``:
the buffer protocol comes from ``bytearray`` itself, so ``memoryview(h)``,
``numpy.frombuffer(h, ...)`` and ``torch.frombuffer(h, dtype=...)`` all accept it and get a
*writable* view (engines that wrap the bytes in a tensor need one), and equality with
``bytes`` compares content.

It is the caller's copy: the read lease on the store's memory ended when the read returned,
so the handle stays valid, and unchanged by later writes of the key, for as long as it lives.
Its memory is freed when the last reference (the handle or a view of it) goes.
"""

from __future__ import annotations

import ctypes
from typing import Any, NoReturn, SupportsIndex


class BufferHandle(bytearray):
    """A value's bytes in memory owned by this object; its size never changes.

    Args:
        size: bytes to allocate (zero-filled); the read fills them in.

    Raises:
        BufferError: from any call that would change the size (``append``, ``extend``,
            ``del h[i]``, ``h += ...``, slice assignment of another length, ...): ``ptr()``
            must stay the address of the bytes for the handle's lifetime.

    Thread-safety: like a ``bytearray``; the store never touches a handle once it returned it.
    """

    def __init__(self, size: int = 0) -> None:
        super().__init__(size)

    def ptr(self) -> int:
        """The address of the first byte (0 for an empty handle). Valid while the handle
        lives. O(1)."""
        if not len(self):
            return 0
        # A ctypes view borrows the buffer for a moment; it does not copy.
        return ctypes.addressof(ctypes.c_char.from_buffer(self))

    def size(self) -> int:
        """The number of bytes (as ``len(h)``)."""
        return len(self)

    def __repr__(self) -> str:
        return f"<BufferHandle size={len(self)} ptr={self.ptr():#x}>"

    __str__ = __repr__  # never dump a large value into a log line

    # -- the size is fixed ------------------------------------------------------------------

    def _fixed(self, *_: Any) -> NoReturn:
        raise BufferError("a BufferHandle has a fixed size")

    append = extend = insert = pop = remove = clear = _fixed  # type: ignore[assignment]
    __delitem__ = _fixed  # type: ignore[assignment]

    def __iadd__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        self._fixed()

    def __imul__(self, count: SupportsIndex) -> NoReturn:  # type: ignore[misc]
        self._fixed()

    def __setitem__(self, index: Any, value: Any) -> None:
        # A memoryview takes same-length slice assignments and single bytes and refuses the
        # rest, which is exactly "change bytes, never the size".
        try:
            memoryview(self)[index] = value
        except ValueError as exc:
            raise BufferError(f"a BufferHandle has a fixed size: {exc}") from exc

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return _rebuilt, (bytes(self),)


def _rebuilt(data: bytes) -> BufferHandle:
    """A handle holding a copy of ``data`` (pickling and ``copy.copy``)."""
    handle = BufferHandle(len(data))
    memoryview(handle)[:] = data
    return handle
