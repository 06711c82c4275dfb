"""Upstream's tensor file helpers and dimension-selection reads as coroutines, for
:class:`~mooncake_py.AsyncMooncakeStore` (run on the async store's worker threads).

:class:`AsyncTensorFileCalls` is meant as a base class of ``AsyncMooncakeStore``, whose
``store`` has :class:`~mooncake_py.client.compat_tensor_files.TensorFileCalls` and
:class:`~mooncake_py.client.compat_tensor_selection.TensorSelectionCalls` among its bases.
Same names, arguments and returns as the synchronous calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from .compat_tensor_files import PathLike, TensorFileCalls
from .compat_tensor_selection import TensorSelectionCalls
from .mixin_bases import AsyncStoreBase


class AsyncTensorFileCalls(AsyncStoreBase):
    """Coroutines of the file and selection calls (see the synchronous calls for each
    contract)."""

    def _files_store(self) -> TensorFileCalls:
        return cast(TensorFileCalls, self.store)

    def _selection_store(self) -> TensorSelectionCalls:
        return cast(TensorSelectionCalls, self.store)

    async def save_tensor_to_file(
        self,
        key: str,
        file_name: PathLike | None = None,
        format: str = "auto",
        filesystem: str = "auto",
        storage_options: Mapping[str, Any] | None = None,
        tensor_name: str | None = None,
    ) -> int:
        """Coroutine of :meth:`TensorFileCalls.save_tensor_to_file`."""
        return await self._run(
            self._files_store().save_tensor_to_file,
            key,
            file_name,
            format,
            filesystem,
            storage_options,
            tensor_name,
        )

    async def load_tensor_from_file(
        self,
        key: str | None = None,
        file_name: PathLike | None = None,
        format: str = "auto",
        filesystem: str = "auto",
        storage_options: Mapping[str, Any] | None = None,
        tensor_name: str | None = None,
        map_location: Any = None,
        weights_only: bool = True,
        allow_unsafe_remote_torch_load: bool = False,
    ) -> Any:
        """Coroutine of :meth:`TensorFileCalls.load_tensor_from_file`."""
        return await self._run(
            self._files_store().load_tensor_from_file,
            key,
            file_name,
            format,
            filesystem,
            storage_options,
            tensor_name,
            map_location,
            weights_only,
            allow_unsafe_remote_torch_load,
        )

    async def save_tensor_to_safetensor(
        self,
        key: str,
        file_name: PathLike | None = None,
        filesystem: str = "auto",
        storage_options: Mapping[str, Any] | None = None,
        tensor_name: str | None = None,
    ) -> int:
        """Coroutine of :meth:`TensorFileCalls.save_tensor_to_safetensor`."""
        return await self._run(
            self._files_store().save_tensor_to_safetensor,
            key,
            file_name,
            filesystem,
            storage_options,
            tensor_name,
        )

    async def load_tensor_from_safetensor(
        self,
        key: str | None = None,
        file_name: PathLike | None = None,
        filesystem: str = "auto",
        storage_options: Mapping[str, Any] | None = None,
        tensor_name: str | None = None,
    ) -> Any:
        """Coroutine of :meth:`TensorFileCalls.load_tensor_from_safetensor`."""
        return await self._run(
            self._files_store().load_tensor_from_safetensor,
            key,
            file_name,
            filesystem,
            storage_options,
            tensor_name,
        )

    # A KV-cache file is a tensor file: the same call, as upstream.
    save_kv_cache_to_file = save_tensor_to_file

    # A KV-cache file is a tensor file: the same call, as upstream.
    load_kv_cache_from_file = load_tensor_from_file

    async def save_tensor(
        self,
        key: str,
        tensor: Any,
        file_name: PathLike | None = None,
        artifact_kind: str = "tensor",
        format: str = "auto",
        filesystem: str = "auto",
        storage_options: Mapping[str, Any] | None = None,
        tensor_name: str | None = None,
    ) -> int:
        """Coroutine of :meth:`TensorFileCalls.save_tensor`."""
        return await self._run(
            self._files_store().save_tensor,
            key,
            tensor,
            file_name,
            artifact_kind,
            format,
            filesystem,
            storage_options,
            tensor_name,
        )

    async def load_tensor(
        self,
        key: str,
        file_name: PathLike | None = None,
        artifact_kind: str = "tensor",
        format: str = "auto",
        filesystem: str = "auto",
        storage_options: Mapping[str, Any] | None = None,
        tensor_name: str | None = None,
        map_location: Any = None,
        weights_only: bool = True,
        allow_unsafe_remote_torch_load: bool = False,
    ) -> Any:
        """Coroutine of :meth:`TensorFileCalls.load_tensor`."""
        return await self._run(
            self._files_store().load_tensor,
            key,
            file_name,
            artifact_kind,
            format,
            filesystem,
            storage_options,
            tensor_name,
            map_location,
            weights_only,
            allow_unsafe_remote_torch_load,
        )

    async def get_tensor_dim_selection_into(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        shape: Sequence[int],
        dtype: str,
        dim: int,
        selections: Sequence[Any],
        data_offset: int = 0,
    ) -> int:
        """Coroutine of :meth:`TensorSelectionCalls.get_tensor_dim_selection_into`."""
        return await self._run(
            self._selection_store().get_tensor_dim_selection_into,
            key,
            buffer_ptr,
            size,
            shape,
            dtype,
            dim,
            selections,
            data_offset,
        )
