# ruff: noqa: E501  (the pinned signatures are data, one per line)
"""The upstream-compatible faces keep their names and signatures, and the public API type-checks.

``MooncakeDistributedStore`` and ``AsyncMooncakeStore`` are what engines import in place of
upstream's store: the names, parameters, defaults and return annotations below are pinned, so
a change to them fails here first. A user snippet that calls every public method of
``Client``, ``AsyncClient`` and both faces must pass ``mypy --strict``.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

from mooncake_py import AsyncClient, AsyncMooncakeStore, Client, MooncakeDistributedStore
from tests.typecheck import ROOT, build_layout, run_mypy

PINNED: dict[str, dict[str, str]] = {
    "AsyncMooncakeStore": {
        "get_tensor_dim_selection_into": "async (self, key: 'str', buffer_ptr: 'int', size: 'int', shape: 'Sequence[int]', dtype: 'str', dim: 'int', selections: 'Sequence[Any]', data_offset: 'int' = 0) -> 'int'",
        "load_kv_cache_from_file": "async (self, key: 'str | None' = None, file_name: 'PathLike | None' = None, format: 'str' = 'auto', filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None, map_location: 'Any' = None, weights_only: 'bool' = True, allow_unsafe_remote_torch_load: 'bool' = False) -> 'Any'",
        "load_tensor": "async (self, key: 'str', file_name: 'PathLike | None' = None, artifact_kind: 'str' = 'tensor', format: 'str' = 'auto', filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None, map_location: 'Any' = None, weights_only: 'bool' = True, allow_unsafe_remote_torch_load: 'bool' = False) -> 'Any'",
        "load_tensor_from_file": "async (self, key: 'str | None' = None, file_name: 'PathLike | None' = None, format: 'str' = 'auto', filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None, map_location: 'Any' = None, weights_only: 'bool' = True, allow_unsafe_remote_torch_load: 'bool' = False) -> 'Any'",
        "load_tensor_from_safetensor": "async (self, key: 'str | None' = None, file_name: 'PathLike | None' = None, filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None) -> 'Any'",
        "save_kv_cache_to_file": "async (self, key: 'str', file_name: 'PathLike | None' = None, format: 'str' = 'auto', filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None) -> 'int'",
        "save_tensor": "async (self, key: 'str', tensor: 'Any', file_name: 'PathLike | None' = None, artifact_kind: 'str' = 'tensor', format: 'str' = 'auto', filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None) -> 'int'",
        "save_tensor_to_file": "async (self, key: 'str', file_name: 'PathLike | None' = None, format: 'str' = 'auto', filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None) -> 'int'",
        "save_tensor_to_safetensor": "async (self, key: 'str', file_name: 'PathLike | None' = None, filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None) -> 'int'",
        "attach_kv_session": "async (self, session_id: 'str', keys: 'Sequence[str]') -> 'list[int]'",
        "batch_get_buffer": "async (self, keys: 'Sequence[str]') -> 'list[BufferHandle | None]'",
        "batch_get_into": "async (self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]') -> 'list[int]'",
        "batch_get_into_multi_buffers": "async (self, keys: 'Sequence[str]', all_buffer_ptrs: 'Sequence[Sequence[int]]', all_sizes: 'Sequence[Sequence[int]]', prefer_alloc_in_same_node: 'bool' = False) -> 'list[int]'",
        "batch_get_replica_desc": "async (self, keys: 'Sequence[str]') -> 'dict[str, list[ReplicaDescriptor]]'",
        "batch_is_exist": "async (self, keys: 'Sequence[str]') -> 'list[int]'",
        "batch_probe_key": "async (self, keys: 'Sequence[str]', policy: 'str' = 'none', candidate_size: 'int' = 1) -> 'list[int]'",
        "batch_put_from": "async (self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', config: 'ReplicateConfig | None' = None) -> 'list[int]'",
        "batch_put_from_multi_buffers": "async (self, keys: 'Sequence[str]', all_buffer_ptrs: 'Sequence[Sequence[int]]', all_sizes: 'Sequence[Sequence[int]]', config: 'ReplicateConfig | None' = None) -> 'list[int]'",
        "batch_remove": "async (self, keys: 'Sequence[str]', force: 'bool' = False) -> 'list[int]'",
        "batch_demote": "async (self, keys: 'Sequence[str]') -> 'list[int]'",
        "batch_upsert_from": "async (self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', config: 'ReplicateConfig | None' = None) -> 'list[int]'",
        "close": "async (self) -> 'int'",
        "close_kv_session": "async (self, session_id: 'str') -> 'int'",
        "get": "async (self, key: 'str') -> 'bytes'",
        "get_batch": "async (self, keys: 'Sequence[str]') -> 'list[bytes]'",
        "get_buffer": "async (self, key: 'str') -> 'BufferHandle | None'",
        "get_hostname": "(self) -> 'str'",
        "get_offload_rpc_read_count": "(self) -> 'int'",
        "get_into": "async (self, key: 'str', buffer_ptr: 'int', size: 'int') -> 'int'",
        "get_kv_session": "async (self, session_id: 'str') -> 'KvSessionInfo'",
        "get_replica_desc": "async (self, key: 'str') -> 'list[ReplicaDescriptor]'",
        "get_size": "async (self, key: 'str') -> 'int'",
        "health_check": "(self) -> 'int'",
        "is_exist": "async (self, key: 'str') -> 'int'",
        "list_kv_session_keys": "async (self, session_id: 'str', cursor: 'str' = '', limit: 'int' = 1024) -> 'KvSessionPage'",
        "list_kv_sessions": "async (self, cursor: 'str' = '', limit: 'int' = 1024, pinned: 'bool | None' = None, min_idle_ms: 'int' = 0) -> 'tuple[list[KvSessionInfo], str]'",
        "pin_kv_session": "async (self, session_id: 'str') -> 'int'",
        "probe_key": "async (self, key: 'str') -> 'int'",
        "put": "async (self, key: 'str', value: 'Any', config: 'ReplicateConfig | None' = None) -> 'int'",
        "put_batch": "async (self, keys: 'Sequence[str]', values: 'Sequence[Any]', config: 'ReplicateConfig | None' = None) -> 'int'",
        "put_from": "async (self, key: 'str', buffer_ptr: 'int', size: 'int', config: 'ReplicateConfig | None' = None) -> 'int'",
        "put_parts": "async (self, key: 'str', *parts: 'Any', config: 'ReplicateConfig | None' = None) -> 'int'",
        "register_buffer": "(self, buffer_ptr: 'int', size: 'int') -> 'int'",
        "release_all_kv_sessions": "async (self, confirm: 'bool' = False) -> 'ReleaseResult'",
        "release_kv_cache": "async (self, keep_pinned: 'bool' = True) -> 'ReleaseResult'",
        "release_kv_session": "async (self, session_id: 'str', all_pages: 'bool' = False) -> 'ReleaseResult'",
        "release_stale_kv_sessions": "async (self, max_idle_ms: 'int', include_pinned: 'bool' = False) -> 'ReleaseResult'",
        "remove": "async (self, key: 'str', force: 'bool' = False) -> 'int'",
        "remove_all": "async (self, force: 'bool' = False) -> 'int'",
        "batch_replica_clear": "async (self, keys: 'Sequence[str]', segment_name: 'str' = '') -> 'list[str]'",
        "upsert_tensor_with_tp": "async (self, key: 'str', tensor: 'Any', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'int'",
        "batch_upsert_tensor_with_tp": "async (self, base_keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'list[int]'",
        "upsert_pub_tensor_with_tp": "async (self, key: 'str', tensor: 'Any', config: 'ReplicateConfig | None' = None, tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'int'",
        "batch_upsert_pub_tensor_with_tp": "async (self, base_keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', config: 'ReplicateConfig | None' = None, tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'list[int]'",
        "alloc_from_mem_pool": "async (self, size: 'int') -> 'int'",
        "setup_dummy": "async (self, mem_pool_size: 'int', local_buffer_size: 'int', server_address: 'str') -> 'int'",
        "batch_get_tensor": "async (self, keys: 'Sequence[str]') -> 'list[Any]'",
        "batch_get_tensor_into": "async (self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]') -> 'list[Any]'",
        "batch_get_tensor_into_cuda": "async (self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]') -> 'list[int]'",
        "batch_get_tensor_with_parallelism": "async (self, keys: 'Sequence[str]', targets: 'Any' = None) -> 'list[Any]'",
        "batch_get_tensor_with_parallelism_into": "async (self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', targets: 'Any' = None) -> 'list[Any]'",
        "batch_get_tensor_with_tp": "async (self, base_keys: 'Sequence[str]', tp_rank: 'int' = 0, tp_size: 'int' = 1) -> 'list[Any]'",
        "batch_get_tensor_with_tp_into": "async (self, base_keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', tp_rank: 'int' = 0, tp_size: 'int' = 1) -> 'list[Any]'",
        "batch_pub_tensor": "async (self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', config: 'ReplicateConfig | None' = None) -> 'list[int]'",
        "batch_pub_tensor_with_tp": "async (self, base_keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', config: 'ReplicateConfig | None' = None, tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'list[int]'",
        "batch_put_tensor": "async (self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]') -> 'list[int]'",
        "batch_put_tensor_from": "async (self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]') -> 'list[int]'",
        "batch_put_tensor_with_parallelism": "async (self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', parallelisms: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partitions: 'Any' = None) -> 'list[int]'",
        "batch_put_tensor_with_parallelism_from": "async (self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', parallelisms: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partitions: 'Any' = None) -> 'list[int]'",
        "batch_put_tensor_with_tp": "async (self, base_keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'list[int]'",
        "batch_put_tensor_with_tp_from": "async (self, base_keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'list[int]'",
        "batch_upsert_pub_tensor": "async (self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', config: 'ReplicateConfig | None' = None) -> 'list[int]'",
        "batch_upsert_tensor": "async (self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]') -> 'list[int]'",
        "batch_upsert_tensor_from": "async (self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]') -> 'list[int]'",
        "batch_upsert_tensor_with_parallelism": "async (self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', parallelisms: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partitions: 'Any' = None) -> 'list[int]'",
        "batch_upsert_tensor_with_parallelism_from": "async (self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', parallelisms: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partitions: 'Any' = None) -> 'list[int]'",
        "get_tensor": "async (self, key: 'str') -> 'Any'",
        "get_tensor_into": "async (self, key: 'str', buffer_ptr: 'int', size: 'int') -> 'Any'",
        "get_tensor_into_cuda": "async (self, key: 'str', tensor: 'Any') -> 'int'",
        "get_tensor_with_parallelism": "async (self, key: 'str', target: 'Any' = None) -> 'Any'",
        "get_tensor_with_parallelism_into": "async (self, key: 'str', buffer_ptr: 'int', size: 'int', target: 'Any' = None) -> 'Any'",
        "get_tensor_with_tp": "async (self, key: 'str', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'Any'",
        "get_tensor_with_tp_into": "async (self, key: 'str', buffer_ptr: 'int', size: 'int', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'Any'",
        "pub_tensor": "async (self, key: 'str', tensor: 'Any', config: 'ReplicateConfig | None' = None) -> 'int'",
        "pub_tensor_with_tp": "async (self, key: 'str', tensor: 'Any', config: 'ReplicateConfig | None' = None, tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'int'",
        "put_tensor": "async (self, key: 'str', tensor: 'Any') -> 'int'",
        "put_tensor_from": "async (self, key: 'str', buffer_ptr: 'int', size: 'int') -> 'int'",
        "put_tensor_with_parallelism": "async (self, key: 'str', tensor: 'Any', parallelism: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partition: 'Any' = None) -> 'int'",
        "put_tensor_with_parallelism_from": "async (self, key: 'str', buffer_ptr: 'int', size: 'int', parallelism: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partition: 'Any' = None) -> 'int'",
        "put_tensor_with_tp": "async (self, key: 'str', tensor: 'Any', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'int'",
        "put_tensor_with_tp_from": "async (self, key: 'str', buffer_ptr: 'int', size: 'int', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'int'",
        "upsert_pub_tensor": "async (self, key: 'str', tensor: 'Any', config: 'ReplicateConfig | None' = None) -> 'int'",
        "upsert_tensor": "async (self, key: 'str', tensor: 'Any') -> 'int'",
        "upsert_tensor_from": "async (self, key: 'str', buffer_ptr: 'int', size: 'int') -> 'int'",
        "upsert_tensor_with_parallelism": "async (self, key: 'str', tensor: 'Any', parallelism: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partition: 'Any' = None) -> 'int'",
        "upsert_tensor_with_parallelism_from": "async (self, key: 'str', buffer_ptr: 'int', size: 'int', parallelism: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partition: 'Any' = None) -> 'int'",
        "create_copy_task": "async (self, key: 'str', targets: 'Sequence[str]') -> 'tuple[tuple[int, int], int]'",
        "create_move_task": "async (self, key: 'str', source: 'str', target: 'str') -> 'tuple[tuple[int, int], int]'",
        "query_task": "async (self, task_id: 'tuple[int, int]') -> 'tuple[QueryTaskResponse | None, int]'",
        "batch_get_into_multi_buffer_ranges": "async (self, keys: 'Sequence[str]', all_buffer_ptrs: 'Sequence[Sequence[int]]', all_sizes: 'Sequence[Sequence[int]]', all_src_offsets: 'Sequence[Sequence[int]]') -> 'list[int]'",
        "batch_get_session_end": "async (self, keys: 'Sequence[str]') -> 'int'",
        "batch_get_session_start": "async (self, keys: 'Sequence[str]') -> 'list[int]'",
        "batch_put_from_multi_buffer_ranges": "async (self, keys: 'Sequence[str]', all_buffer_ptrs: 'Sequence[Sequence[int]]', all_sizes: 'Sequence[Sequence[int]]', all_dst_offsets: 'Sequence[Sequence[int]]') -> 'list[int]'",
        "batch_put_session_end": "async (self, keys: 'Sequence[str]') -> 'list[int]'",
        "batch_put_session_revoke": "async (self, keys: 'Sequence[str]') -> 'list[int]'",
        "batch_put_session_start": "async (self, keys: 'Sequence[str]', sizes: 'Sequence[int]', config: 'ReplicateConfig | None' = None) -> 'list[int]'",
        "get_into_ranges": "async (self, buffer_ptrs: 'Sequence[int]', all_keys: 'Sequence[Sequence[str]]', all_dst_offsets: 'Sequence[Sequence[Sequence[int]]]', all_src_offsets: 'Sequence[Sequence[Sequence[int]]]', all_sizes: 'Sequence[Sequence[Sequence[int]]]') -> 'list[list[list[int]]]'",
        "remove_by_regex": "async (self, regex_pattern: 'str', force: 'bool' = False) -> 'int'",
        "setup": "async (self, *args: 'Any', **kwargs: 'Any') -> 'int'",
        "unpin_kv_session": "async (self, session_id: 'str') -> 'int'",
        "unregister_buffer": "(self, buffer_ptr: 'int') -> 'int'",
        "update_kv_session": "async (self, session_id: 'str', keep_keys: 'Sequence[str]') -> 'int'",
        "upsert": "async (self, key: 'str', value: 'Any', config: 'ReplicateConfig | None' = None) -> 'int'",
        "upsert_batch": "async (self, keys: 'Sequence[str]', values: 'Sequence[Any]', config: 'ReplicateConfig | None' = None) -> 'int'",
        "upsert_from": "async (self, key: 'str', buffer_ptr: 'int', size: 'int', config: 'ReplicateConfig | None' = None) -> 'int'",
        "upsert_parts": "async (self, key: 'str', *parts: 'Any', config: 'ReplicateConfig | None' = None) -> 'int'",
    },
    "MooncakeDistributedStore": {
        "get_tensor_dim_selection_into": "(self, key: 'str', buffer_ptr: 'int', size: 'int', shape: 'Sequence[int]', dtype: 'str', dim: 'int', selections: 'Sequence[Any]', data_offset: 'int' = 0) -> 'int'",
        "load_kv_cache_from_file": "(self, key: 'str | None' = None, file_name: 'PathLike | None' = None, format: 'str' = 'auto', filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None, map_location: 'Any' = None, weights_only: 'bool' = True, allow_unsafe_remote_torch_load: 'bool' = False) -> 'Any'",
        "load_tensor": "(self, key: 'str', file_name: 'PathLike | None' = None, artifact_kind: 'str' = 'tensor', format: 'str' = 'auto', filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None, map_location: 'Any' = None, weights_only: 'bool' = True, allow_unsafe_remote_torch_load: 'bool' = False) -> 'Any'",
        "load_tensor_from_file": "(self, key: 'str | None' = None, file_name: 'PathLike | None' = None, format: 'str' = 'auto', filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None, map_location: 'Any' = None, weights_only: 'bool' = True, allow_unsafe_remote_torch_load: 'bool' = False) -> 'Any'",
        "load_tensor_from_safetensor": "(self, key: 'str | None' = None, file_name: 'PathLike | None' = None, filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None) -> 'Any'",
        "save_kv_cache_to_file": "(self, key: 'str', file_name: 'PathLike | None' = None, format: 'str' = 'auto', filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None) -> 'int'",
        "save_tensor": "(self, key: 'str', tensor: 'Any', file_name: 'PathLike | None' = None, artifact_kind: 'str' = 'tensor', format: 'str' = 'auto', filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None) -> 'int'",
        "save_tensor_to_file": "(self, key: 'str', file_name: 'PathLike | None' = None, format: 'str' = 'auto', filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None) -> 'int'",
        "save_tensor_to_safetensor": "(self, key: 'str', file_name: 'PathLike | None' = None, filesystem: 'str' = 'auto', storage_options: 'Mapping[str, Any] | None' = None, tensor_name: 'str | None' = None) -> 'int'",
        "attach_kv_session": "(self, session_id: 'str', keys: 'Sequence[str]') -> 'list[int]'",
        "batch_get_buffer": "(self, keys: 'Sequence[str]') -> 'list[BufferHandle | None]'",
        "batch_get_into": "(self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]') -> 'list[int]'",
        "batch_get_into_multi_buffers": "(self, keys: 'Sequence[str]', all_buffer_ptrs: 'Sequence[Sequence[int]]', all_sizes: 'Sequence[Sequence[int]]', prefer_alloc_in_same_node: 'bool' = False) -> 'list[int]'",
        "batch_get_replica_desc": "(self, keys: 'Sequence[str]') -> 'dict[str, list[ReplicaDescriptor]]'",
        "batch_is_exist": "(self, keys: 'Sequence[str]') -> 'list[int]'",
        "batch_probe_key": "(self, keys: 'Sequence[str]', policy: 'str' = 'none', candidate_size: 'int' = 1) -> 'list[int]'",
        "batch_put_from": "(self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', config: 'ReplicateConfig | None' = None) -> 'list[int]'",
        "batch_put_from_multi_buffers": "(self, keys: 'Sequence[str]', all_buffer_ptrs: 'Sequence[Sequence[int]]', all_sizes: 'Sequence[Sequence[int]]', config: 'ReplicateConfig | None' = None) -> 'list[int]'",
        "batch_remove": "(self, keys: 'Sequence[str]', force: 'bool' = False) -> 'list[int]'",
        "batch_demote": "(self, keys: 'Sequence[str]') -> 'list[int]'",
        "batch_upsert_from": "(self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', config: 'ReplicateConfig | None' = None) -> 'list[int]'",
        "close": "(self) -> 'int'",
        "close_kv_session": "(self, session_id: 'str') -> 'int'",
        "get": "(self, key: 'str') -> 'bytes'",
        "get_batch": "(self, keys: 'Sequence[str]') -> 'list[bytes]'",
        "get_buffer": "(self, key: 'str') -> 'BufferHandle | None'",
        "get_hostname": "(self) -> 'str'",
        "get_into": "(self, key: 'str', buffer_ptr: 'int', size: 'int') -> 'int'",
        "get_offload_rpc_read_count": "(self) -> 'int'",
        "get_kv_session": "(self, session_id: 'str') -> 'KvSessionInfo'",
        "get_replica_desc": "(self, key: 'str') -> 'list[ReplicaDescriptor]'",
        "get_size": "(self, key: 'str') -> 'int'",
        "health_check": "(self) -> 'int'",
        "is_exist": "(self, key: 'str') -> 'int'",
        "list_kv_session_keys": "(self, session_id: 'str', cursor: 'str' = '', limit: 'int' = 1024) -> 'KvSessionPage'",
        "list_kv_sessions": "(self, cursor: 'str' = '', limit: 'int' = 1024, pinned: 'bool | None' = None, min_idle_ms: 'int' = 0) -> 'tuple[list[KvSessionInfo], str]'",
        "pin_kv_session": "(self, session_id: 'str') -> 'int'",
        "probe_key": "(self, key: 'str') -> 'int'",
        "put": "(self, key: 'str', value: 'Any', config: 'ReplicateConfig | None' = None) -> 'int'",
        "put_batch": "(self, keys: 'Sequence[str]', values: 'Sequence[Any]', config: 'ReplicateConfig | None' = None) -> 'int'",
        "put_from": "(self, key: 'str', buffer_ptr: 'int', size: 'int', config: 'ReplicateConfig | None' = None) -> 'int'",
        "put_parts": "(self, key: 'str', *parts: 'Any', config: 'ReplicateConfig | None' = None) -> 'int'",
        "register_buffer": "(self, buffer_ptr: 'int', size: 'int') -> 'int'",
        "release_all_kv_sessions": "(self, confirm: 'bool' = False) -> 'ReleaseResult'",
        "release_kv_cache": "(self, keep_pinned: 'bool' = True) -> 'ReleaseResult'",
        "release_kv_session": "(self, session_id: 'str', all_pages: 'bool' = False) -> 'ReleaseResult'",
        "release_stale_kv_sessions": "(self, max_idle_ms: 'int', include_pinned: 'bool' = False) -> 'ReleaseResult'",
        "remove": "(self, key: 'str', force: 'bool' = False) -> 'int'",
        "remove_all": "(self, force: 'bool' = False) -> 'int'",
        "batch_replica_clear": "(self, keys: 'Sequence[str]', segment_name: 'str' = '') -> 'list[str]'",
        "upsert_tensor_with_tp": "(self, key: 'str', tensor: 'Any', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'int'",
        "batch_upsert_tensor_with_tp": "(self, base_keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'list[int]'",
        "upsert_pub_tensor_with_tp": "(self, key: 'str', tensor: 'Any', config: 'ReplicateConfig | None' = None, tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'int'",
        "batch_upsert_pub_tensor_with_tp": "(self, base_keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', config: 'ReplicateConfig | None' = None, tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'list[int]'",
        "batch_get_tensor": "(self, keys: 'Sequence[str]') -> 'list[Any]'",
        "batch_get_tensor_into": "(self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]') -> 'list[Any]'",
        "batch_get_tensor_into_cuda": "(self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]') -> 'list[int]'",
        "batch_get_tensor_with_parallelism": "(self, keys: 'Sequence[str]', targets: 'Any' = None) -> 'list[Any]'",
        "batch_get_tensor_with_parallelism_into": "(self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', targets: 'Any' = None) -> 'list[Any]'",
        "batch_get_tensor_with_tp": "(self, base_keys: 'Sequence[str]', tp_rank: 'int' = 0, tp_size: 'int' = 1) -> 'list[Any]'",
        "batch_get_tensor_with_tp_into": "(self, base_keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', tp_rank: 'int' = 0, tp_size: 'int' = 1) -> 'list[Any]'",
        "batch_pub_tensor": "(self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', config: 'ReplicateConfig | None' = None) -> 'list[int]'",
        "batch_pub_tensor_with_tp": "(self, base_keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', config: 'ReplicateConfig | None' = None, tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'list[int]'",
        "batch_put_tensor": "(self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]') -> 'list[int]'",
        "batch_put_tensor_from": "(self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]') -> 'list[int]'",
        "batch_put_tensor_with_parallelism": "(self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', parallelisms: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partitions: 'Any' = None) -> 'list[int]'",
        "batch_put_tensor_with_parallelism_from": "(self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', parallelisms: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partitions: 'Any' = None) -> 'list[int]'",
        "batch_put_tensor_with_tp": "(self, base_keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'list[int]'",
        "batch_put_tensor_with_tp_from": "(self, base_keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'list[int]'",
        "batch_upsert_pub_tensor": "(self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', config: 'ReplicateConfig | None' = None) -> 'list[int]'",
        "batch_upsert_tensor": "(self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]') -> 'list[int]'",
        "batch_upsert_tensor_from": "(self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]') -> 'list[int]'",
        "batch_upsert_tensor_with_parallelism": "(self, keys: 'Sequence[str]', tensors_list: 'Sequence[Any]', parallelisms: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partitions: 'Any' = None) -> 'list[int]'",
        "batch_upsert_tensor_with_parallelism_from": "(self, keys: 'Sequence[str]', buffer_ptrs: 'Sequence[int]', sizes: 'Sequence[int]', parallelisms: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partitions: 'Any' = None) -> 'list[int]'",
        "get_tensor": "(self, key: 'str') -> 'Any'",
        "get_tensor_into": "(self, key: 'str', buffer_ptr: 'int', size: 'int') -> 'Any'",
        "get_tensor_into_cuda": "(self, key: 'str', tensor: 'Any') -> 'int'",
        "get_tensor_with_parallelism": "(self, key: 'str', target: 'Any' = None) -> 'Any'",
        "get_tensor_with_parallelism_into": "(self, key: 'str', buffer_ptr: 'int', size: 'int', target: 'Any' = None) -> 'Any'",
        "get_tensor_with_tp": "(self, key: 'str', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'Any'",
        "get_tensor_with_tp_into": "(self, key: 'str', buffer_ptr: 'int', size: 'int', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'Any'",
        "pub_tensor": "(self, key: 'str', tensor: 'Any', config: 'ReplicateConfig | None' = None) -> 'int'",
        "pub_tensor_with_tp": "(self, key: 'str', tensor: 'Any', config: 'ReplicateConfig | None' = None, tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'int'",
        "put_tensor": "(self, key: 'str', tensor: 'Any') -> 'int'",
        "put_tensor_from": "(self, key: 'str', buffer_ptr: 'int', size: 'int') -> 'int'",
        "put_tensor_with_parallelism": "(self, key: 'str', tensor: 'Any', parallelism: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partition: 'Any' = None) -> 'int'",
        "put_tensor_with_parallelism_from": "(self, key: 'str', buffer_ptr: 'int', size: 'int', parallelism: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partition: 'Any' = None) -> 'int'",
        "put_tensor_with_tp": "(self, key: 'str', tensor: 'Any', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'int'",
        "put_tensor_with_tp_from": "(self, key: 'str', buffer_ptr: 'int', size: 'int', tp_rank: 'int' = 0, tp_size: 'int' = 1, split_dim: 'int' = 0) -> 'int'",
        "upsert_pub_tensor": "(self, key: 'str', tensor: 'Any', config: 'ReplicateConfig | None' = None) -> 'int'",
        "upsert_tensor": "(self, key: 'str', tensor: 'Any') -> 'int'",
        "upsert_tensor_from": "(self, key: 'str', buffer_ptr: 'int', size: 'int') -> 'int'",
        "upsert_tensor_with_parallelism": "(self, key: 'str', tensor: 'Any', parallelism: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partition: 'Any' = None) -> 'int'",
        "upsert_tensor_with_parallelism_from": "(self, key: 'str', buffer_ptr: 'int', size: 'int', parallelism: 'Any' = None, config: 'ReplicateConfig | None' = None, writer_partition: 'Any' = None) -> 'int'",
        "alloc_from_mem_pool": "(self, size: 'int') -> 'int'",
        "setup_dummy": "(self, mem_pool_size: 'int', local_buffer_size: 'int', server_address: 'str') -> 'int'",
        "create_copy_task": "(self, key: 'str', targets: 'Sequence[str]') -> 'tuple[tuple[int, int], int]'",
        "create_move_task": "(self, key: 'str', source: 'str', target: 'str') -> 'tuple[tuple[int, int], int]'",
        "query_task": "(self, task_id: 'tuple[int, int]') -> 'tuple[QueryTaskResponse | None, int]'",
        "batch_get_into_multi_buffer_ranges": "(self, keys: 'Sequence[str]', all_buffer_ptrs: 'Sequence[Sequence[int]]', all_sizes: 'Sequence[Sequence[int]]', all_src_offsets: 'Sequence[Sequence[int]]') -> 'list[int]'",
        "batch_get_session_end": "(self, keys: 'Sequence[str]') -> 'int'",
        "batch_get_session_start": "(self, keys: 'Sequence[str]') -> 'list[int]'",
        "batch_put_from_multi_buffer_ranges": "(self, keys: 'Sequence[str]', all_buffer_ptrs: 'Sequence[Sequence[int]]', all_sizes: 'Sequence[Sequence[int]]', all_dst_offsets: 'Sequence[Sequence[int]]') -> 'list[int]'",
        "batch_put_session_end": "(self, keys: 'Sequence[str]') -> 'list[int]'",
        "batch_put_session_revoke": "(self, keys: 'Sequence[str]') -> 'list[int]'",
        "batch_put_session_start": "(self, keys: 'Sequence[str]', sizes: 'Sequence[int]', config: 'ReplicateConfig | None' = None) -> 'list[int]'",
        "get_into_ranges": "(self, buffer_ptrs: 'Sequence[int]', all_keys: 'Sequence[Sequence[str]]', all_dst_offsets: 'Sequence[Sequence[Sequence[int]]]', all_src_offsets: 'Sequence[Sequence[Sequence[int]]]', all_sizes: 'Sequence[Sequence[Sequence[int]]]') -> 'list[list[list[int]]]'",
        "remove_by_regex": "(self, regex_pattern: 'str', force: 'bool' = False) -> 'int'",
        "setup": "(self, *args: 'Any', **kwargs: 'Any') -> 'int'",
        "setup_with_config": "(self, config: 'ClientConfig') -> 'int'",
        "unpin_kv_session": "(self, session_id: 'str') -> 'int'",
        "unregister_buffer": "(self, buffer_ptr: 'int') -> 'int'",
        "update_kv_session": "(self, session_id: 'str', keep_keys: 'Sequence[str]') -> 'int'",
        "upsert": "(self, key: 'str', value: 'Any', config: 'ReplicateConfig | None' = None) -> 'int'",
        "upsert_batch": "(self, keys: 'Sequence[str]', values: 'Sequence[Any]', config: 'ReplicateConfig | None' = None) -> 'int'",
        "upsert_from": "(self, key: 'str', buffer_ptr: 'int', size: 'int', config: 'ReplicateConfig | None' = None) -> 'int'",
        "upsert_parts": "(self, key: 'str', *parts: 'Any', config: 'ReplicateConfig | None' = None) -> 'int'",
    },
}


def _signatures(cls: type) -> dict[str, str]:
    found = {}
    for name in dir(cls):
        member = getattr(cls, name)
        if name.startswith("_") or not callable(member):
            continue
        prefix = "async " if inspect.iscoroutinefunction(member) else ""
        found[name] = prefix + str(inspect.signature(member))
    return found


@pytest.mark.parametrize("cls", [MooncakeDistributedStore, AsyncMooncakeStore])
def test_compatibility_faces_keep_names_and_signatures(cls: type) -> None:
    assert _signatures(cls) == PINNED[cls.__name__]


def test_async_twins_offer_every_call_as_a_coroutine() -> None:
    sync_calls = _signatures(Client)
    async_calls = _signatures(AsyncClient)
    local = {"register_buffer", "unregister_buffer", "connect"}
    for name, signature in sync_calls.items():
        if name in local:
            continue
        assert async_calls.get(name, "").startswith("async "), name
        assert async_calls[name].removeprefix("async ") == signature, name


USER_SNIPPET = """
from __future__ import annotations

import asyncio

import pyarrow as pa

from mooncake_py import (
    AsyncClient,
    AsyncMooncakeStore,
    BatchResult,
    BufferHandle,
    Client,
    ClientConfig,
    KeyResult,
    KvSessionInfo,
    KvSessionListing,
    KvSessionPage,
    MooncakeDistributedStore,
    MooncakeError,
    NotFoundError,
    ReleaseResult,
    ReplicaDescriptor,
    ReplicateConfig,
    SegmentStatus,
)
from mooncake_py.types import ProbeLeaseMode


def typed(client: Client, ptr: int) -> None:
    config = ReplicateConfig(replica_num=1)
    client.register_buffer(ptr, 4096)
    client.put("k", b"v", config)
    client.put_parts("k", b"a", b"b", config=config)
    client.put_from("k", ptr, 16, config)
    puts: BatchResult[None] = client.put_batch(["a"], [b"1"], config)
    client.batch_put_from(["a"], [ptr], [16], config)
    multi: BatchResult[None] = client.batch_put_from_multi_buffers(["a"], [[ptr, ptr + 8]], [[8, 8]], config)
    client.upsert("k", b"v")
    client.upsert_parts("k", b"a")
    client.upsert_from("k", ptr, 16)
    client.upsert_batch(["a"], [b"1"])
    client.batch_upsert_from(["a"], [ptr], [16])
    value: bytes = client.get("k")
    values: list[bytes] = client.get_batch(["k"]).unwrap()
    read: int = client.get_into("k", ptr, 16)
    first: KeyResult[int] = client.batch_get_into(["k"], [ptr], [16])[0]
    scattered: BatchResult[int] = client.batch_get_into_multi_buffers(["k"], [[ptr, ptr + 8]], [[8, 8]], True)
    buffer: pa.Buffer = client.get_buffer("k")
    buffers: BatchResult[pa.Buffer] = client.batch_get_buffer(["k"])
    handle: BufferHandle = client.get_buffer_handle("k")
    handles: BatchResult[BufferHandle] = client.batch_get_buffer_handle(["k"])
    address: int = handle.ptr() + handle.size() + len(memoryview(handle))
    replicas: list[ReplicaDescriptor] = client.get_replica_desc("k")
    located: BatchResult[list[ReplicaDescriptor]] = client.batch_get_replica_desc(["k"])
    in_memory: bool = replicas[0].is_memory_replica() and not replicas[0].is_disk_replica()
    where: int = replicas[0].get_memory_descriptor().buffer_descriptor.buffer_address
    found: bool = client.is_exist("k")
    flags: list[bool] = client.batch_is_exist(["k"]).unwrap()
    found = client.probe_key("k")
    flags = client.batch_probe_key(["k"]).unwrap()
    probes: BatchResult[bool] = client.batch_probe_key(["k", "l"], ProbeLeaseMode.LAST_HIT_ONLY, 2)
    size: int = client.get_size("k")
    client.remove("k", force=True)
    removed: BatchResult[None] = client.batch_remove(["k"])
    count: int = client.remove_by_regex("^k", force=False) + client.remove_all()
    attached: list[int] = client.attach_kv_session("s", ["k"]).codes
    client.pin_kv_session("s")
    client.unpin_kv_session("s")
    client.update_kv_session("s", ["k"])
    client.close_kv_session("s")
    info: KvSessionInfo = client.get_kv_session("s")
    page: KvSessionPage = client.list_kv_session_keys("s", "", 10)
    listing: KvSessionListing = client.list_kv_sessions("", 10, None, 0)
    released: ReleaseResult = client.release_kv_session("s")
    released = client.release_stale_kv_sessions(1000, include_pinned=False)
    released = client.release_all_kv_sessions(confirm=True)
    released = client.release_kv_cache(keep_pinned=True)
    stats: dict[str, int] = client.stats()
    segments: list[SegmentStatus] = client.segments()
    reachable: bool = client.master_reachable and not client.closed
    name: str = client.hostname
    client.unregister_buffer(ptr)
    try:
        client.get("missing")
    except NotFoundError as exc:
        code: int = exc.code
        key: str | None = exc.key
    client.close()
    del multi, scattered, handles, address, located, in_memory, where
    del puts, value, values, read, first, buffer, buffers, found, flags, size, removed, probes
    del count, attached, info, page, listing, released, stats, segments, reachable, name


async def typed_async(ptr: int) -> None:
    async with await AsyncClient.connect(ClientConfig()) as client:
        client.register_buffer(ptr, 4096)
        await client.put("k", b"v")
        await client.put_parts("k", b"a")
        await client.put_from("k", ptr, 16)
        await client.put_batch(["a"], [b"1"])
        await client.batch_put_from(["a"], [ptr], [16])
        await client.batch_put_from_multi_buffers(["a"], [[ptr]], [[16]], None)
        await client.upsert("k", b"v")
        await client.upsert_parts("k", b"a")
        await client.upsert_from("k", ptr, 16)
        await client.upsert_batch(["a"], [b"1"])
        await client.batch_upsert_from(["a"], [ptr], [16])
        value: bytes = await client.get("k")
        batch: BatchResult[bytes] = await client.get_batch(["k"])
        read: int = await client.get_into("k", ptr, 16)
        await client.batch_get_into(["k"], [ptr], [16])
        scattered: BatchResult[int] = await client.batch_get_into_multi_buffers(["k"], [[ptr]], [[16]])
        buffer: pa.Buffer = await client.get_buffer("k")
        await client.batch_get_buffer(["k"])
        handle: BufferHandle = await client.get_buffer_handle("k")
        handles: BatchResult[BufferHandle] = await client.batch_get_buffer_handle(["k"])
        replicas: list[ReplicaDescriptor] = await client.get_replica_desc("k")
        located: BatchResult[list[ReplicaDescriptor]] = await client.batch_get_replica_desc(["k"])
        found: bool = await client.is_exist("k")
        await client.batch_is_exist(["k"])
        found = await client.probe_key("k")
        probed: BatchResult[bool] = await client.batch_probe_key(["k"], ProbeLeaseMode.NONE, 1)
        size: int = await client.get_size("k")
        await client.remove("k")
        await client.batch_remove(["k"])
        count: int = await client.remove_by_regex("^k") + await client.remove_all()
        await client.attach_kv_session("s", ["k"])
        await client.pin_kv_session("s")
        await client.unpin_kv_session("s")
        await client.update_kv_session("s", [])
        await client.close_kv_session("s")
        info: KvSessionInfo = await client.get_kv_session("s")
        page: KvSessionPage = await client.list_kv_session_keys("s")
        listing: KvSessionListing = await client.list_kv_sessions()
        released: ReleaseResult = await client.release_kv_session("s")
        released = await client.release_stale_kv_sessions(1000)
        released = await client.release_all_kv_sessions(True)
        released = await client.release_kv_cache()
        stats: dict[str, int] = await client.stats()
        segments: list[SegmentStatus] = await client.segments()
        name: str = client.hostname
        reachable: bool = client.master_reachable
        sync: Client = client.client
        client.unregister_buffer(ptr)
        del value, batch, read, buffer, found, size, count, info, page, listing, released, probed
        del stats, segments, name, reachable, sync, scattered, handle, handles, replicas, located


def drop_in(store: MooncakeDistributedStore, ptr: int) -> None:
    codes: list[int] = []
    code: int = store.setup("127.0.0.1", "P2PHANDSHAKE", 1 << 24, 1 << 24, "tcp", "", "m:1")
    code = store.setup({"master_server_address": "m:1"})
    code = store.setup_with_config(ClientConfig())
    code = store.register_buffer(ptr, 4096) + store.unregister_buffer(ptr)
    code = store.put("k", b"v") + store.put_batch(["k"], [b"v"]) + store.put_parts("k", b"a")
    code = store.put_from("k", ptr, 1) + store.upsert("k", b"v") + store.upsert_parts("k", b"a")
    code = store.upsert_batch(["k"], [b"v"]) + store.upsert_from("k", ptr, 1)
    codes = store.batch_put_from(["k"], [ptr], [1]) + store.batch_upsert_from(["k"], [ptr], [1])
    value: bytes = store.get("k")
    values: list[bytes] = store.get_batch(["k"])
    code = store.get_into("k", ptr, 1)
    codes = store.batch_get_into(["k"], [ptr], [1])
    codes = store.batch_get_into_multi_buffers(["k"], [[ptr, ptr + 1]], [[1, 1]])
    codes = store.batch_get_into_multi_buffers(["k"], [[ptr]], [[1]], prefer_alloc_in_same_node=True)
    codes = store.batch_put_from_multi_buffers(["k"], [[ptr, ptr + 1]], [[1, 1]], ReplicateConfig())
    buffer: BufferHandle | None = store.get_buffer("k")
    buffers: list[BufferHandle | None] = store.batch_get_buffer(["k"])
    replicas: list[ReplicaDescriptor] = store.get_replica_desc("k")
    by_key: dict[str, list[ReplicaDescriptor]] = store.batch_get_replica_desc(["k"])
    config = ReplicateConfig(session_ids=["s"], nof_replica_num=0, dfs_replica_num=0)
    config.with_soft_pin = True
    code = store.is_exist("k") + store.get_size("k") + store.remove("k", True)
    codes = store.batch_is_exist(["k"]) + store.batch_remove(["k"])
    code = store.probe_key("k")
    codes = store.batch_probe_key(["k"]) + store.batch_probe_key(["k", "l"], "LastHitOnly", 2)
    codes = store.batch_probe_key(["k"], candidate_size=0)
    code = store.remove_by_regex("^k") + store.remove_all(force=True)
    codes = store.attach_kv_session("s", ["k"])
    code = store.pin_kv_session("s") + store.unpin_kv_session("s") + store.close_kv_session("s")
    code = store.update_kv_session("s", ["k"])
    info: KvSessionInfo = store.get_kv_session("s")
    page: KvSessionPage = store.list_kv_session_keys("s")
    infos, cursor = store.list_kv_sessions("", 10, True, 0)
    released: ReleaseResult = store.release_kv_session("s")
    released = store.release_stale_kv_sessions(10) + store.release_all_kv_sessions(True)
    released = store.release_kv_cache(False)
    name: str = store.get_hostname()
    code = store.health_check() + store.close()
    del codes, code, value, values, buffer, buffers, info, page, infos, cursor, released, name
    del replicas, by_key, config


async def drop_in_async(ptr: int) -> None:
    async with AsyncMooncakeStore(MooncakeDistributedStore()) as store:
        code: int = await store.setup({"master_server_address": "m:1"})
        code = store.register_buffer(ptr, 4096) + store.unregister_buffer(ptr)
        code = await store.put("k", b"v") + await store.put_batch(["k"], [b"v"])
        code = await store.put_parts("k", b"a") + await store.put_from("k", ptr, 1)
        code = await store.upsert("k", b"v") + await store.upsert_batch(["k"], [b"v"])
        code = await store.upsert_parts("k", b"a") + await store.upsert_from("k", ptr, 1)
        codes: list[int] = await store.batch_put_from(["k"], [ptr], [1])
        codes = await store.batch_upsert_from(["k"], [ptr], [1])
        value: bytes = await store.get("k")
        values: list[bytes] = await store.get_batch(["k"])
        code = await store.get_into("k", ptr, 1)
        codes = await store.batch_get_into(["k"], [ptr], [1])
        codes = await store.batch_get_into_multi_buffers(["k"], [[ptr]], [[1]], False)
        codes = await store.batch_put_from_multi_buffers(["k"], [[ptr]], [[1]])
        buffer: BufferHandle | None = await store.get_buffer("k")
        buffers: list[BufferHandle | None] = await store.batch_get_buffer(["k"])
        replicas: list[ReplicaDescriptor] = await store.get_replica_desc("k")
        by_key: dict[str, list[ReplicaDescriptor]] = await store.batch_get_replica_desc(["k"])
        code = await store.is_exist("k") + await store.get_size("k")
        codes = await store.batch_is_exist(["k"]) + await store.batch_remove(["k"])
        code = await store.probe_key("k")
        codes = await store.batch_probe_key(["k", "l"], "LastHitOnly", 2)
        code = await store.remove("k") + await store.remove_by_regex("^k")
        code = await store.remove_all()
        codes = await store.attach_kv_session("s", ["k"])
        code = await store.pin_kv_session("s") + await store.unpin_kv_session("s")
        code = await store.update_kv_session("s", []) + await store.close_kv_session("s")
        info: KvSessionInfo = await store.get_kv_session("s")
        page: KvSessionPage = await store.list_kv_session_keys("s")
        infos, cursor = await store.list_kv_sessions()
        released: ReleaseResult = await store.release_kv_session("s")
        released = await store.release_stale_kv_sessions(10)
        released = await store.release_all_kv_sessions(True)
        released = await store.release_kv_cache()
        name: str = store.get_hostname()
        code = store.health_check() + await store.close()
        del code, codes, value, values, buffer, buffers, info, page, infos, cursor
        del released, name, replicas, by_key


def main() -> None:
    typed(Client(), 1)
    drop_in(MooncakeDistributedStore(), 1)
    asyncio.run(typed_async(1))
    asyncio.run(drop_in_async(1))


def code_of_failure(client: Client) -> int:
    try:
        client.get("k")
    except MooncakeError as exc:
        return exc.code
    return 0
"""


@pytest.mark.timeout(300)
def test_a_user_snippet_calling_every_public_method_passes_mypy_strict(tmp_path: Path) -> None:
    layout = build_layout(tmp_path / "layout")
    snippet = layout / "user_snippet.py"
    snippet.write_text(textwrap.dedent(USER_SNIPPET))
    status, output = run_mypy(
        ["--strict", "--follow-imports=silent", "--no-incremental", str(snippet)], layout
    )
    assert status == 0, output


def test_the_cli_loads_neither_the_master_nor_matplotlib() -> None:
    probe = (
        "import sys, mooncake_py.cli; "
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('mooncake_py.')}), "
        "'matplotlib' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "'master'" not in result.stdout and result.stdout.strip().endswith("False")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("matplotlib") for d in project["dependencies"])
    assert project["scripts"]["mooncake-py-segment-host"] == "mooncake_py.client.segment_host:main"
