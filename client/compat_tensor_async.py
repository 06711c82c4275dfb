"""The tensor calls of :class:`~mooncake_py.client.compat_tensor.TensorCalls` as coroutines, for
:class:`~mooncake_py.AsyncMooncakeStore` (run on the async store's worker threads).

:class:`AsyncTensorCalls` is meant as a base class of ``AsyncMooncakeStore``, whose ``store``
must have :class:`~mooncake_py.client.compat_tensor.TensorCalls` among its bases. Same names,
arguments and returns as the synchronous calls. A tensor returned by an ``*_into`` coroutine
views the caller's registered buffer, as the synchronous call's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from mooncake_py.types import ReplicateConfig

from .compat_tensor import TensorCalls
from .mixin_bases import AsyncStoreBase


class AsyncTensorCalls(AsyncStoreBase):
    """Coroutines of every tensor call of
    :class:`~mooncake_py.client.compat_tensor.TensorCalls` (see there for each contract)."""

    def _tensor_store(self) -> TensorCalls:
        return cast(TensorCalls, self.store)

    async def batch_get_tensor(self, keys: Sequence[str]) -> list[Any]:
        """Coroutine of :meth:`TensorCalls.batch_get_tensor`."""
        return await self._run(self._tensor_store().batch_get_tensor, keys)

    async def batch_get_tensor_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[Any]:
        """Coroutine of :meth:`TensorCalls.batch_get_tensor_into`."""
        return await self._run(self._tensor_store().batch_get_tensor_into, keys, buffer_ptrs, sizes)

    async def batch_get_tensor_into_cuda(
        self, keys: Sequence[str], tensors_list: Sequence[Any]
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_get_tensor_into_cuda`."""
        return await self._run(self._tensor_store().batch_get_tensor_into_cuda, keys, tensors_list)

    async def batch_get_tensor_with_parallelism(
        self, keys: Sequence[str], targets: Any = None
    ) -> list[Any]:
        """Coroutine of :meth:`TensorCalls.batch_get_tensor_with_parallelism`."""
        return await self._run(
            self._tensor_store().batch_get_tensor_with_parallelism, keys, targets
        )

    async def batch_get_tensor_with_parallelism_into(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        targets: Any = None,
    ) -> list[Any]:
        """Coroutine of :meth:`TensorCalls.batch_get_tensor_with_parallelism_into`."""
        return await self._run(
            self._tensor_store().batch_get_tensor_with_parallelism_into,
            keys,
            buffer_ptrs,
            sizes,
            targets,
        )

    async def batch_get_tensor_with_tp(
        self, base_keys: Sequence[str], tp_rank: int = 0, tp_size: int = 1
    ) -> list[Any]:
        """Coroutine of :meth:`TensorCalls.batch_get_tensor_with_tp`."""
        return await self._run(
            self._tensor_store().batch_get_tensor_with_tp, base_keys, tp_rank, tp_size
        )

    async def batch_get_tensor_with_tp_into(
        self,
        base_keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> list[Any]:
        """Coroutine of :meth:`TensorCalls.batch_get_tensor_with_tp_into`."""
        return await self._run(
            self._tensor_store().batch_get_tensor_with_tp_into,
            base_keys,
            buffer_ptrs,
            sizes,
            tp_rank,
            tp_size,
        )

    async def batch_pub_tensor(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Any],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_pub_tensor`."""
        return await self._run(self._tensor_store().batch_pub_tensor, keys, tensors_list, config)

    async def batch_pub_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Any],
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_pub_tensor_with_tp`."""
        return await self._run(
            self._tensor_store().batch_pub_tensor_with_tp,
            base_keys,
            tensors_list,
            config,
            tp_rank,
            tp_size,
            split_dim,
        )

    async def upsert_tensor_with_tp(
        self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int:
        """Coroutine of :meth:`TensorCalls.upsert_tensor_with_tp`."""
        store = self._tensor_store()
        return await self._run(
            store.upsert_tensor_with_tp, key, tensor, tp_rank, tp_size, split_dim
        )

    async def batch_upsert_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Any],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_upsert_tensor_with_tp`."""
        store = self._tensor_store()
        return await self._run(
            store.batch_upsert_tensor_with_tp, base_keys, tensors_list, tp_rank, tp_size, split_dim
        )

    async def upsert_pub_tensor_with_tp(
        self,
        key: str,
        tensor: Any,
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        """Coroutine of :meth:`TensorCalls.upsert_pub_tensor_with_tp`."""
        store = self._tensor_store()
        return await self._run(
            store.upsert_pub_tensor_with_tp, key, tensor, config, tp_rank, tp_size, split_dim
        )

    async def batch_upsert_pub_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Any],
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_upsert_pub_tensor_with_tp`."""
        store = self._tensor_store()
        return await self._run(
            store.batch_upsert_pub_tensor_with_tp,
            base_keys,
            tensors_list,
            config,
            tp_rank,
            tp_size,
            split_dim,
        )

    async def batch_put_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_put_tensor`."""
        return await self._run(self._tensor_store().batch_put_tensor, keys, tensors_list)

    async def batch_put_tensor_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_put_tensor_from`."""
        return await self._run(self._tensor_store().batch_put_tensor_from, keys, buffer_ptrs, sizes)

    async def batch_put_tensor_with_parallelism(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Any],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_put_tensor_with_parallelism`."""
        return await self._run(
            self._tensor_store().batch_put_tensor_with_parallelism,
            keys,
            tensors_list,
            parallelisms,
            config,
            writer_partitions,
        )

    async def batch_put_tensor_with_parallelism_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_put_tensor_with_parallelism_from`."""
        return await self._run(
            self._tensor_store().batch_put_tensor_with_parallelism_from,
            keys,
            buffer_ptrs,
            sizes,
            parallelisms,
            config,
            writer_partitions,
        )

    async def batch_put_tensor_with_tp(
        self,
        base_keys: Sequence[str],
        tensors_list: Sequence[Any],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_put_tensor_with_tp`."""
        return await self._run(
            self._tensor_store().batch_put_tensor_with_tp,
            base_keys,
            tensors_list,
            tp_rank,
            tp_size,
            split_dim,
        )

    async def batch_put_tensor_with_tp_from(
        self,
        base_keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_put_tensor_with_tp_from`."""
        return await self._run(
            self._tensor_store().batch_put_tensor_with_tp_from,
            base_keys,
            buffer_ptrs,
            sizes,
            tp_rank,
            tp_size,
            split_dim,
        )

    async def batch_upsert_pub_tensor(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Any],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_upsert_pub_tensor`."""
        return await self._run(
            self._tensor_store().batch_upsert_pub_tensor, keys, tensors_list, config
        )

    async def batch_upsert_tensor(
        self, keys: Sequence[str], tensors_list: Sequence[Any]
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_upsert_tensor`."""
        return await self._run(self._tensor_store().batch_upsert_tensor, keys, tensors_list)

    async def batch_upsert_tensor_from(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_upsert_tensor_from`."""
        return await self._run(
            self._tensor_store().batch_upsert_tensor_from, keys, buffer_ptrs, sizes
        )

    async def batch_upsert_tensor_with_parallelism(
        self,
        keys: Sequence[str],
        tensors_list: Sequence[Any],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_upsert_tensor_with_parallelism`."""
        return await self._run(
            self._tensor_store().batch_upsert_tensor_with_parallelism,
            keys,
            tensors_list,
            parallelisms,
            config,
            writer_partitions,
        )

    async def batch_upsert_tensor_with_parallelism_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        parallelisms: Any = None,
        config: ReplicateConfig | None = None,
        writer_partitions: Any = None,
    ) -> list[int]:
        """Coroutine of :meth:`TensorCalls.batch_upsert_tensor_with_parallelism_from`."""
        return await self._run(
            self._tensor_store().batch_upsert_tensor_with_parallelism_from,
            keys,
            buffer_ptrs,
            sizes,
            parallelisms,
            config,
            writer_partitions,
        )

    async def get_tensor(self, key: str) -> Any:
        """Coroutine of :meth:`TensorCalls.get_tensor`."""
        return await self._run(self._tensor_store().get_tensor, key)

    async def get_tensor_into(self, key: str, buffer_ptr: int, size: int) -> Any:
        """Coroutine of :meth:`TensorCalls.get_tensor_into`."""
        return await self._run(self._tensor_store().get_tensor_into, key, buffer_ptr, size)

    async def get_tensor_into_cuda(self, key: str, tensor: Any) -> int:
        """Coroutine of :meth:`TensorCalls.get_tensor_into_cuda`."""
        return await self._run(self._tensor_store().get_tensor_into_cuda, key, tensor)

    async def get_tensor_with_parallelism(self, key: str, target: Any = None) -> Any:
        """Coroutine of :meth:`TensorCalls.get_tensor_with_parallelism`."""
        return await self._run(self._tensor_store().get_tensor_with_parallelism, key, target)

    async def get_tensor_with_parallelism_into(
        self, key: str, buffer_ptr: int, size: int, target: Any = None
    ) -> Any:
        """Coroutine of :meth:`TensorCalls.get_tensor_with_parallelism_into`."""
        return await self._run(
            self._tensor_store().get_tensor_with_parallelism_into, key, buffer_ptr, size, target
        )

    async def get_tensor_with_tp(
        self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> Any:
        """Coroutine of :meth:`TensorCalls.get_tensor_with_tp`."""
        return await self._run(
            self._tensor_store().get_tensor_with_tp, key, tp_rank, tp_size, split_dim
        )

    async def get_tensor_with_tp_into(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> Any:
        """Coroutine of :meth:`TensorCalls.get_tensor_with_tp_into`."""
        return await self._run(
            self._tensor_store().get_tensor_with_tp_into,
            key,
            buffer_ptr,
            size,
            tp_rank,
            tp_size,
            split_dim,
        )

    async def pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        """Coroutine of :meth:`TensorCalls.pub_tensor`."""
        return await self._run(self._tensor_store().pub_tensor, key, tensor, config)

    async def pub_tensor_with_tp(
        self,
        key: str,
        tensor: Any,
        config: ReplicateConfig | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        """Coroutine of :meth:`TensorCalls.pub_tensor_with_tp`."""
        return await self._run(
            self._tensor_store().pub_tensor_with_tp,
            key,
            tensor,
            config,
            tp_rank,
            tp_size,
            split_dim,
        )

    async def put_tensor(self, key: str, tensor: Any) -> int:
        """Coroutine of :meth:`TensorCalls.put_tensor`."""
        return await self._run(self._tensor_store().put_tensor, key, tensor)

    async def put_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Coroutine of :meth:`TensorCalls.put_tensor_from`."""
        return await self._run(self._tensor_store().put_tensor_from, key, buffer_ptr, size)

    async def put_tensor_with_parallelism(
        self,
        key: str,
        tensor: Any,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        """Coroutine of :meth:`TensorCalls.put_tensor_with_parallelism`."""
        return await self._run(
            self._tensor_store().put_tensor_with_parallelism,
            key,
            tensor,
            parallelism,
            config,
            writer_partition,
        )

    async def put_tensor_with_parallelism_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        """Coroutine of :meth:`TensorCalls.put_tensor_with_parallelism_from`."""
        return await self._run(
            self._tensor_store().put_tensor_with_parallelism_from,
            key,
            buffer_ptr,
            size,
            parallelism,
            config,
            writer_partition,
        )

    async def put_tensor_with_tp(
        self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0
    ) -> int:
        """Coroutine of :meth:`TensorCalls.put_tensor_with_tp`."""
        return await self._run(
            self._tensor_store().put_tensor_with_tp, key, tensor, tp_rank, tp_size, split_dim
        )

    async def put_tensor_with_tp_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        tp_rank: int = 0,
        tp_size: int = 1,
        split_dim: int = 0,
    ) -> int:
        """Coroutine of :meth:`TensorCalls.put_tensor_with_tp_from`."""
        return await self._run(
            self._tensor_store().put_tensor_with_tp_from,
            key,
            buffer_ptr,
            size,
            tp_rank,
            tp_size,
            split_dim,
        )

    async def upsert_pub_tensor(
        self, key: str, tensor: Any, config: ReplicateConfig | None = None
    ) -> int:
        """Coroutine of :meth:`TensorCalls.upsert_pub_tensor`."""
        return await self._run(self._tensor_store().upsert_pub_tensor, key, tensor, config)

    async def upsert_tensor(self, key: str, tensor: Any) -> int:
        """Coroutine of :meth:`TensorCalls.upsert_tensor`."""
        return await self._run(self._tensor_store().upsert_tensor, key, tensor)

    async def upsert_tensor_from(self, key: str, buffer_ptr: int, size: int) -> int:
        """Coroutine of :meth:`TensorCalls.upsert_tensor_from`."""
        return await self._run(self._tensor_store().upsert_tensor_from, key, buffer_ptr, size)

    async def upsert_tensor_with_parallelism(
        self,
        key: str,
        tensor: Any,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        """Coroutine of :meth:`TensorCalls.upsert_tensor_with_parallelism`."""
        return await self._run(
            self._tensor_store().upsert_tensor_with_parallelism,
            key,
            tensor,
            parallelism,
            config,
            writer_partition,
        )

    async def upsert_tensor_with_parallelism_from(
        self,
        key: str,
        buffer_ptr: int,
        size: int,
        parallelism: Any = None,
        config: ReplicateConfig | None = None,
        writer_partition: Any = None,
    ) -> int:
        """Coroutine of :meth:`TensorCalls.upsert_tensor_with_parallelism_from`."""
        return await self._run(
            self._tensor_store().upsert_tensor_with_parallelism_from,
            key,
            buffer_ptr,
            size,
            parallelism,
            config,
            writer_partition,
        )
