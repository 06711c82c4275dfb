"""Upstream's tensor file calls of ``MooncakeDistributedStore``: a stored tensor to a file and a
file's tensor into the store, in the safetensors format or as a ``torch.save`` file, on the
local disk or any fsspec location, with upstream's names, argument order, defaults and
returns. Formats, locations and codes: :mod:`mooncake_py.store_file_io`.

:class:`TensorFileCalls` is a base class of :class:`~mooncake_py.MooncakeDistributedStore`,
built on its tensor calls (``get_tensor``, ``put_tensor``). Conventions, as upstream:

- saves return 0, or ``FILE_NOT_FOUND`` (-1100) when the key holds no tensor or the file's
  place does not exist, ``INVALID_PARAMS`` (-600) for a bad argument (unknown format or
  artifact kind, empty name, safetensors or torch missing), ``PERSISTENT_FAIL`` (-1503) for
  any other failure to write, or a store write's own code (``save_tensor``);
- loads put the file's tensor under the key (``put_tensor``: an existing key keeps its bytes)
  and return that tensor, or None for any failure (logged, never raised): a missing file, a
  file that is not one tensor, a refused remote ``torch`` load, a failed store write;
- ``file_name`` defaults to the key (a file in the working directory), a safetensors entry's
  name (``tensor_name``) to the key too; a ``load`` without ``key`` stores under the file name.

``save_kv_cache_to_file`` / ``load_kv_cache_from_file`` are the same calls as
``save_tensor_to_file`` / ``load_tensor_from_file`` (KV-cache files are tensor files).
``save_tensor`` / ``load_tensor`` combine a store write or read with an optional export or
import, by ``artifact_kind``: ``tensor`` (format from ``format``, by default from the file
name), ``safetensor`` (the safetensors format) or ``kv_cache``.

Cost: one store read (saves) or write (loads) of the tensor, plus the file's bytes in memory
once. Thread-safety: every method may be called from several threads at once.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from mooncake_py import store_file_io as fio

from .compat_tensor import TensorCalls

log = logging.getLogger(__name__)

PathLike = os.PathLike[str] | str


class TensorFileCalls(TensorCalls):
    """Upstream's tensor file and safetensors calls; see the module docstring."""

    # ------------------------------------------------------------------------------------------
    # Store -> file

    def save_tensor_to_file(
        self,
        key: str,
        file_name: PathLike | None = None,
        format: str = "auto",
        filesystem: str = "auto",
        storage_options: Mapping[str, Any] | None = None,
        tensor_name: str | None = None,
    ) -> int:
        """Write the tensor under ``key`` to ``file_name`` (default: the key) in ``format``
        (``auto``: safetensors for a ``.safetensors`` name, else ``torch.save``); a
        safetensors file's single entry is ``tensor_name`` (default: the key). 0 or a
        negative code (see the module docstring); the parent directories of a local file
        are made."""
        target = key if file_name is None else file_name
        entry = key if tensor_name is None else tensor_name
        try:
            tensor = self.get_tensor(key)
            if tensor is None:
                log.error("no tensor under key %r to save", key)
                return fio.FILE_NOT_FOUND
            format_name = fio.normalize_format(format, os.fspath(target))
            fio.write_tensor(tensor, target, format_name, entry, filesystem, storage_options)
            return 0
        except FileNotFoundError:
            log.exception("no place for %r to save key %r", target, key)
            return fio.FILE_NOT_FOUND
        except (TypeError, ValueError):
            log.exception("invalid parameters to save key %r", key)
            return fio.INVALID_PARAMS
        except Exception:  # any fsspec backend's or serialiser's failure is a write failure
            log.exception("failed to save key %r to %r", key, target)
            return fio.PERSISTENT_FAIL

    def save_tensor_to_safetensor(
        self,
        key: str,
        file_name: PathLike | None = None,
        filesystem: str = "auto",
        storage_options: Mapping[str, Any] | None = None,
        tensor_name: str | None = None,
    ) -> int:
        """:meth:`save_tensor_to_file` in the safetensors format, whatever the file name."""
        return self.save_tensor_to_file(
            key, file_name, "safetensors", filesystem, storage_options, tensor_name
        )

    # A KV-cache file is a tensor file: the same call, as upstream.
    save_kv_cache_to_file = save_tensor_to_file

    # ------------------------------------------------------------------------------------------
    # File -> store

    def load_tensor_from_file(
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
        """Read the tensor in ``file_name``, store it under ``key`` (default: the file name)
        and return it; None on any failure. A safetensors file gives its entry
        ``tensor_name``, else the one named ``key``, else its only entry (several entries
        and neither name: None). A ``torch`` file must hold a single tensor and loads with
        ``weights_only`` (default True); from anywhere but the local disk only with
        ``allow_unsafe_remote_torch_load``. ``map_location`` moves the tensor (``torch.load``'s
        argument for torch files)."""
        if file_name is None:
            log.error("load_tensor_from_file needs a file_name")
            return None
        store_key = os.fspath(file_name) if key is None else key
        try:
            format_name = fio.normalize_format(format, os.fspath(file_name))
            remote = fio.is_remote(file_name, filesystem)
            if format_name == fio.FORMAT_TORCH and remote and not allow_unsafe_remote_torch_load:
                # Unpickling a file from elsewhere can run its code.
                raise ValueError(
                    f"refusing to torch.load from {fio.url_scheme(file_name, filesystem)!r};"
                    " use safetensors or allow_unsafe_remote_torch_load=True for a trusted one"
                )
            tensor = fio.read_tensor(
                file_name,
                format_name,
                tensor_name,
                store_key,
                filesystem,
                storage_options,
                map_location,
                weights_only,
            )
            code = self.put_tensor(store_key, tensor)
            if code != 0:
                log.error(
                    "failed to store the tensor of %r under %r: %d", file_name, store_key, code
                )
                return None
            return tensor
        except FileNotFoundError:
            log.exception("tensor file %r not found", file_name)
        except ValueError:
            log.exception("invalid tensor file request for %r", file_name)
        except Exception:  # a corrupt file, a backend's failure: None, as upstream
            log.exception("failed to load a tensor from %r", file_name)
        return None

    def load_tensor_from_safetensor(
        self,
        key: str | None = None,
        file_name: PathLike | None = None,
        filesystem: str = "auto",
        storage_options: Mapping[str, Any] | None = None,
        tensor_name: str | None = None,
    ) -> Any:
        """:meth:`load_tensor_from_file` of a safetensors file, whatever its name."""
        return self.load_tensor_from_file(
            key, file_name, "safetensors", filesystem, storage_options, tensor_name
        )

    # A KV-cache file is a tensor file: the same call, as upstream.
    load_kv_cache_from_file = load_tensor_from_file

    # ------------------------------------------------------------------------------------------
    # Store and file in one call

    def save_tensor(
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
        """Store ``tensor`` under ``key`` (:meth:`put_tensor`) and, with a ``file_name``,
        export what the key then holds as an ``artifact_kind`` file (``tensor``,
        ``safetensor`` or ``kv_cache``; see :meth:`save_tensor_to_file`). 0 or a negative
        code: INVALID_PARAMS (-600), before anything is written, for an unknown kind or a
        ``format`` the kind contradicts; the store write's code; the export's code."""
        try:
            kind, format_name = fio.artifact_format(artifact_kind, format)
        except ValueError:
            log.exception("invalid artifact kind to save key %r", key)
            return fio.INVALID_PARAMS
        code = self.put_tensor(key, tensor)
        if code != 0 or file_name is None:
            return code
        save = (
            self.save_kv_cache_to_file
            if kind == fio.ARTIFACT_KV_CACHE
            else self.save_tensor_to_file
        )
        return save(key, file_name, format_name or "auto", filesystem, storage_options, tensor_name)

    def load_tensor(
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
        """Without ``file_name``, the tensor under ``key`` (:meth:`get_tensor`); with one, the
        ``artifact_kind`` file's tensor, stored under ``key`` and returned (see
        :meth:`load_tensor_from_file`). None on a miss or any failure, an unknown kind
        included."""
        try:
            kind, format_name = fio.artifact_format(artifact_kind, format)
        except ValueError:
            log.exception("invalid artifact kind to load key %r", key)
            return None
        if file_name is None:
            return self.get_tensor(key)
        load = (
            self.load_kv_cache_from_file
            if kind == fio.ARTIFACT_KV_CACHE
            else self.load_tensor_from_file
        )
        return load(
            key,
            file_name,
            format_name or "auto",
            filesystem,
            storage_options,
            tensor_name,
            map_location,
            weights_only,
            allow_unsafe_remote_torch_load,
        )


__all__ = ["TensorFileCalls"]
