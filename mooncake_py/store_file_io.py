"""Upstream's ``mooncake.store_file_io``: where the store's tensor file calls
(``save_tensor_to_file``, ``load_tensor_from_safetensor``, ...) read and write, in which
formats, and the codes they return.

The calls themselves are methods of :class:`~mooncake_py.MooncakeDistributedStore` (see
:mod:`mooncake_py.client.compat_tensor_files`); this module holds what they share, under
upstream's names where upstream's module has them (``INVALID_PARAMS``, ``FILE_NOT_FOUND``,
``PERSISTENT_FAIL``).

Formats (the same bytes upstream writes for the same tensor, so either side loads the
other's files):

- ``safetensors``: the safetensors format, one entry named ``tensor_name`` (the store key by
  default), no metadata, as ``safetensors.torch.save`` writes it;
- ``torch`` (also spelled ``pt``, ``pth``, ``standard``, ``standard_file``): ``torch.save``
  of the tensor to an open file (a zip archive whose records sit under ``archive/``);
- ``auto``: ``safetensors`` for a name ending in ``.safetensors``, else ``torch``.

KV-cache files are tensor files: ``save_kv_cache_to_file`` writes exactly what
``save_tensor_to_file`` writes.

Locations are paths or URLs opened with fsspec: a plain path or a ``file://`` URL is the local
disk (missing parent directories are made); ``filesystem`` (``auto``, ``file``/``local``/
``posix``/``localfs``, or a scheme such as ``s3``) prefixes a scheme to a path that has none.
Loading a ``torch`` file from anywhere but the local disk is refused unless asked for
explicitly (unpickling can run code); ``torch`` files load with ``weights_only=True`` by
default and must hold a single tensor.

torch, safetensors and fsspec (the ``torch`` extra) are imported only by the functions that
need them. Every function is safe to call from several threads at once; two writers of one
file at once leave either's bytes or a mix of both, as with any file.
"""

from __future__ import annotations

import inspect
import os
import posixpath
from collections.abc import Mapping
from typing import Any

from mooncake_py.errors import ErrorCode

INVALID_PARAMS = int(ErrorCode.INVALID_PARAMS)  # -600
FILE_NOT_FOUND = int(ErrorCode.FILE_NOT_FOUND)  # -1100
PERSISTENT_FAIL = int(ErrorCode.PERSISTENT_FAIL)  # -1503

FORMAT_SAFETENSORS = "safetensors"
FORMAT_TORCH = "torch"

_FORMAT_NAMES = {
    "safetensors": FORMAT_SAFETENSORS,
    "safe_tensors": FORMAT_SAFETENSORS,
    "torch": FORMAT_TORCH,
    "pt": FORMAT_TORCH,
    "pth": FORMAT_TORCH,
    "standard": FORMAT_TORCH,
    "standard_file": FORMAT_TORCH,
}
_LOCAL_FILESYSTEMS = {"local", "localfs", "posix", "file"}
# URL schemes that name the local disk ("" is a plain path).
_LOCAL_SCHEMES = {"", "file", "local"}

# What ``save_tensor`` / ``load_tensor`` accept as ``artifact_kind``, by the file format each
# one implies (None: the ``format`` argument decides).
ARTIFACT_TENSOR = "tensor"
ARTIFACT_SAFETENSOR = "safetensor"
ARTIFACT_KV_CACHE = "kv_cache"
_ARTIFACT_KINDS: dict[str, tuple[str, str | None]] = {
    "tensor": (ARTIFACT_TENSOR, None),
    "standard": (ARTIFACT_TENSOR, None),
    "safetensor": (ARTIFACT_SAFETENSOR, FORMAT_SAFETENSORS),
    "safetensors": (ARTIFACT_SAFETENSOR, FORMAT_SAFETENSORS),
    "kv_cache": (ARTIFACT_KV_CACHE, None),
    "kvcache": (ARTIFACT_KV_CACHE, None),
}


def _spelling(value: str) -> str:
    return value.lower().replace("-", "_")


def normalize_format(format_name: str | None, file_name: str) -> str:
    """:data:`FORMAT_SAFETENSORS` or :data:`FORMAT_TORCH` for a ``format`` argument (any case,
    ``-`` or ``_``; None is ``auto``) and the file it applies to.

    Raises:
        ValueError: an unknown format name.
    """
    spelled = _spelling(format_name or "auto")
    if spelled == "auto":
        return FORMAT_SAFETENSORS if file_name.lower().endswith(".safetensors") else FORMAT_TORCH
    try:
        return _FORMAT_NAMES[spelled]
    except KeyError:
        raise ValueError(f"Unsupported file format: {format_name}") from None


def artifact_format(artifact_kind: str, format_name: str | None) -> tuple[str, str | None]:
    """The canonical kind (:data:`ARTIFACT_TENSOR`, :data:`ARTIFACT_SAFETENSOR` or
    :data:`ARTIFACT_KV_CACHE`) of an ``artifact_kind`` argument, and the ``format`` to use
    for it (``format_name`` itself unless the kind fixes one).

    Raises:
        ValueError: an unknown kind, or a ``format_name`` the kind contradicts (a
            ``safetensor`` artifact in the ``torch`` format).
    """
    if not isinstance(artifact_kind, str) or _spelling(artifact_kind) not in _ARTIFACT_KINDS:
        raise ValueError(f"Unsupported artifact kind: {artifact_kind!r}")
    kind, fixed = _ARTIFACT_KINDS[_spelling(artifact_kind)]
    if fixed is None:
        return kind, format_name
    spelled = _spelling(format_name or "auto")
    if spelled != "auto" and _FORMAT_NAMES.get(spelled) != fixed:
        raise ValueError(f"artifact kind {artifact_kind!r} is not in format {format_name!r}")
    return kind, fixed


def normalize_filesystem(filesystem: str | None) -> str:
    """``file`` for the local disk's names, ``auto`` for None, else the name (lower case,
    ``_`` for ``-``)."""
    if filesystem is None:
        return "auto"
    spelled = _spelling(filesystem)
    return "file" if spelled in _LOCAL_FILESYSTEMS else spelled


def target_url(file_name: os.PathLike[str] | str, filesystem: str | None) -> str:
    """The path or URL to open: ``file_name`` itself when it has a scheme or ``filesystem``
    is ``auto`` or local, else ``<filesystem>://<file_name>``.

    Raises:
        ValueError: an empty ``file_name``.
    """
    target = os.fspath(file_name)
    if not target:
        raise ValueError("file_name must not be empty")
    named = normalize_filesystem(filesystem)
    if named in {"auto", "file"} or "://" in target:
        return target
    return f"{named}://{target}"


def url_scheme(file_name: os.PathLike[str] | str, filesystem: str | None) -> str:
    """The scheme the target is opened with, lower case (``file`` for a plain path)."""
    url = target_url(file_name, filesystem)
    return url.split("://", 1)[0].lower() if "://" in url else "file"


def is_remote(file_name: os.PathLike[str] | str, filesystem: str | None) -> bool:
    """Whether the target is anywhere but the local disk."""
    return url_scheme(file_name, filesystem) not in _LOCAL_SCHEMES


def open_target(
    file_name: os.PathLike[str] | str,
    filesystem: str | None,
    storage_options: Mapping[str, Any] | None,
) -> tuple[Any, str]:
    """The fsspec filesystem and the path on it for a target (``storage_options`` go to the
    filesystem, e.g. credentials).

    Raises:
        ValueError: an empty name. ImportError: no fsspec, or no fsspec backend for the
            scheme (``s3fs`` for ``s3://``, ...).
    """
    import fsspec  # optional dependency: only the file calls need it

    return fsspec.core.url_to_fs(target_url(file_name, filesystem), **dict(storage_options or {}))


def make_parent_dir(fs: Any, path: str, scheme: str) -> None:
    """Make the missing parent directories of ``path`` on the local disk (object stores have
    no directories to make). A parent that cannot be made shows as the open's error."""
    protocol = getattr(fs, "protocol", scheme)
    if isinstance(protocol, tuple | list):
        protocol = protocol[0] if protocol else scheme
    local = scheme in _LOCAL_SCHEMES or str(protocol).lower() in _LOCAL_SCHEMES
    parent = posixpath.dirname(path)
    if local and parent:
        fs.makedirs(parent, exist_ok=True)


def write_tensor(
    tensor: Any,
    file_name: os.PathLike[str] | str,
    format_name: str,
    tensor_name: str,
    filesystem: str | None,
    storage_options: Mapping[str, Any] | None,
) -> None:
    """Write ``tensor`` to the target in ``format_name`` (an output of
    :func:`normalize_format`), as entry ``tensor_name`` of a safetensors file. Memory: one
    serialised copy of the tensor for safetensors; ``torch`` files stream to the target.

    Raises:
        ValueError: safetensors or torch missing, or a tensor the format cannot hold.
        FileNotFoundError, OSError: the target cannot be written.
    """
    fs, path = open_target(file_name, filesystem, storage_options)
    make_parent_dir(fs, path, url_scheme(file_name, filesystem))
    if format_name == FORMAT_TORCH:
        torch = _import_torch()
        # To an open file, as upstream: the archive's records are named archive/..., whatever
        # the file's name (a path given to torch.save would name them after the file).
        with fs.open(path, "wb") as handle:
            torch.save(tensor, handle)
        return
    save = _import_safetensors().save
    payload = save({tensor_name: tensor})  # serialised before the file is opened
    with fs.open(path, "wb") as handle:
        handle.write(payload)


def read_tensor(
    file_name: os.PathLike[str] | str,
    format_name: str,
    tensor_name: str | None,
    fallback_name: str | None,
    filesystem: str | None,
    storage_options: Mapping[str, Any] | None,
    map_location: Any = None,
    weights_only: bool = True,
) -> Any:
    """The tensor in the target file: a ``torch`` file's single tensor, or a safetensors
    file's entry (see :func:`pick_entry`), moved to ``map_location`` when given. Memory: the
    file's bytes plus the tensor.

    Raises:
        ValueError: a file that does not hold one tensor (a dict checkpoint, a missing entry
            among several), torch or safetensors missing, ``weights_only`` unsupported.
        FileNotFoundError, OSError: the target cannot be read. Anything torch.load or
            safetensors raise for a corrupt file.
    """
    fs, path = open_target(file_name, filesystem, storage_options)
    if format_name == FORMAT_TORCH:
        with fs.open(path, "rb") as handle:
            return torch_load_tensor(handle, map_location, weights_only)
    load = _import_safetensors().load
    with fs.open(path, "rb") as handle:
        payload = handle.read()
    tensor = pick_entry(load(payload), tensor_name, fallback_name)
    return tensor if map_location is None else tensor.to(map_location)


def pick_entry(entries: Mapping[str, Any], preferred: str | None, fallback: str | None) -> Any:
    """The entry named ``preferred``, else the one named ``fallback``, else the only entry.

    Raises:
        ValueError: no entries, or several and none of the two names among them (a wrong
            tensor is never picked silently).
    """
    if not entries:
        raise ValueError("No tensors found in the file")
    for name in (preferred, fallback):
        if name and name in entries:
            return entries[name]
    if len(entries) == 1:
        return next(iter(entries.values()))
    requested = preferred or fallback or "<unspecified>"
    raise ValueError(
        f"Tensor entry {requested!r} was not found in safetensors file; "
        f"available entries: {', '.join(sorted(entries))}"
    )


def torch_load_tensor(handle: Any, map_location: Any, weights_only: bool) -> Any:
    """``torch.load`` of an open file that must hold a single tensor.

    Raises:
        ValueError: it holds anything else, or torch cannot load with ``weights_only``.
    """
    torch = _import_torch()
    if weights_only and "weights_only" not in inspect.signature(torch.load).parameters:
        raise ValueError("this torch cannot load with weights_only=True; use safetensors")
    loaded = torch.load(handle, map_location=map_location, weights_only=weights_only)
    if not isinstance(loaded, torch.Tensor):
        raise ValueError(
            f"torch checkpoint must contain a single tensor; got {type(loaded).__name__}"
        )
    return loaded


def _import_torch() -> Any:
    try:
        import torch  # optional dependency
    except ImportError as exc:
        raise ValueError("the 'torch' format needs torch: pip install torch") from exc
    return torch


def _import_safetensors() -> Any:
    try:
        import safetensors.torch  # optional dependency
    except ImportError as exc:
        raise ValueError(
            "the 'safetensors' format needs safetensors: pip install safetensors"
        ) from exc
    return safetensors.torch


__all__ = [
    "ARTIFACT_KV_CACHE",
    "ARTIFACT_SAFETENSOR",
    "ARTIFACT_TENSOR",
    "FILE_NOT_FOUND",
    "FORMAT_SAFETENSORS",
    "FORMAT_TORCH",
    "INVALID_PARAMS",
    "PERSISTENT_FAIL",
    "artifact_format",
    "is_remote",
    "normalize_filesystem",
    "normalize_format",
    "open_target",
    "pick_entry",
    "read_tensor",
    "target_url",
    "torch_load_tensor",
    "url_scheme",
    "write_tensor",
]
