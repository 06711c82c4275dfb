"""The store's tensor file calls (``save_tensor_to_safetensor``, ``load_tensor_from_file``,
``save_kv_cache_to_file``, ``save_tensor`` / ``load_tensor``, ...) against a real in-process
master and real stores, writing real files (the local disk, ``file://`` URLs and fsspec's
in-memory filesystem).

The files are checked against what the libraries themselves write for the same tensor
(``safetensors.torch.save``, ``torch.save`` to an open file), which is what upstream writes,
so files move between the two implementations either way.
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mooncake_py import ClientConfig, ErrorCode, MooncakeDistributedStore
from mooncake_py import store_file_io as fio
from mooncake_py.client.compat_tensor_files import TensorFileCalls
from mooncake_py.testing import InProcessMaster

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
fsspec = pytest.importorskip("fsspec")

MIB = 1 << 20
INVALID = int(ErrorCode.INVALID_PARAMS)
FILE_NOT_FOUND = int(ErrorCode.FILE_NOT_FOUND)


def _store(master: InProcessMaster, segment_bytes: int = 64 * MIB) -> Any:
    store = MooncakeDistributedStore()
    config = ClientConfig.from_mapping(
        {"master_server_addr": master.address, "global_segment_size": segment_bytes}
    )
    assert store.setup_with_config(config) == 0
    return store


@pytest.fixture
def store(master: InProcessMaster) -> Iterator[Any]:
    running = _store(master)
    yield running
    running.close()


@pytest.fixture
def memory_fs() -> Iterator[Any]:
    """fsspec's in-memory filesystem (a non-local backend), emptied afterwards."""
    fs = fsspec.filesystem("memory")
    root = f"/mooncake-py-{uuid.uuid4().hex}"
    yield fs, root
    if fs.exists(root):
        fs.rm(root, recursive=True)


def _key(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _torch_bytes(tensor: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return buffer.getvalue()


def _same(a: Any, b: Any) -> bool:
    return bool(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))


SAMPLES = {
    "float32": torch.tensor([1.0, 2.0, 3.0, 4.0]),
    "int32_2d": torch.arange(12, dtype=torch.int32).reshape(3, 4),
    "bool": torch.tensor([True, False, True]),
    "bfloat16_3d": (torch.arange(24, dtype=torch.float32) / 7).to(torch.bfloat16).reshape(2, 3, 4),
    "float16": torch.tensor([0.5, -1.25, 3.0], dtype=torch.float16),
    "int64_scalar": torch.tensor(7, dtype=torch.int64),
    "uint8_empty": torch.empty((0, 4), dtype=torch.uint8),
    "float8_e4m3fn": torch.tensor([0.5, 1.0, -2.0]).to(torch.float8_e4m3fn),
}


def test_the_store_class_has_the_file_calls() -> None:
    assert issubclass(MooncakeDistributedStore, TensorFileCalls)


# ----------------------------------------------------------------------------------------------
# safetensors


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_safetensors_file_is_the_standard_format_and_loads_back(
    store: Any, tmp_path: Path, name: str
) -> None:
    tensor = SAMPLES[name]
    key = _key(name)
    path = tmp_path / "out.safetensors"
    assert store.put_tensor(key, tensor) == 0

    assert store.save_tensor_to_safetensor(key, str(path)) == 0
    # Byte for byte what the safetensors library writes: one entry, named after the key.
    assert path.read_bytes() == safetensors_torch.save({key: tensor})
    assert _same(safetensors_torch.load_file(str(path))[key], tensor)

    assert store.remove(key) == 0
    assert store.get_tensor(key) is None
    loaded = store.load_tensor_from_safetensor(key, str(path))
    assert loaded is not None and _same(loaded, tensor)
    assert _same(store.get_tensor(key), tensor)


def test_safetensors_file_written_elsewhere_loads(store: Any, tmp_path: Path) -> None:
    path = tmp_path / "external.safetensors"
    tensor = torch.linspace(0, 1, 10, dtype=torch.float64).reshape(2, 5)
    safetensors_torch.save_file({"weights": tensor}, str(path))
    key = _key("external")
    # The sole entry is taken whatever its name.
    loaded = store.load_tensor_from_safetensor(key, str(path))
    assert loaded is not None and _same(loaded, tensor)
    assert _same(store.get_tensor(key), tensor)


def test_entry_choice_in_multi_entry_files(store: Any, tmp_path: Path) -> None:
    path = tmp_path / "multi.safetensors"
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0, 5.0])
    key_b = _key("entry")
    safetensors_torch.save_file({"a": a, key_b: b}, str(path))

    by_name = _key("by-name")
    assert _same(store.load_tensor_from_safetensor(by_name, str(path), tensor_name="a"), a)
    assert _same(store.get_tensor(by_name), a)
    # Without tensor_name the entry named like the key is taken.
    assert _same(store.load_tensor_from_safetensor(key_b, str(path)), b)
    # A name that is not there among several entries: nothing picked, nothing stored.
    missing = _key("missing")
    assert store.load_tensor_from_safetensor(missing, str(path), tensor_name="nope") is None
    assert store.get_tensor(missing) is None


def test_tensor_name_and_file_uri_with_missing_directories(store: Any, tmp_path: Path) -> None:
    tensor = torch.tensor([[11.0, 12.0], [13.0, 14.0]])
    key, restored = _key("uri"), _key("uri-restored")
    target = tmp_path / "a" / "b" / "kv_cache.safetensors"
    assert store.put_tensor(key, tensor) == 0

    uri = target.as_uri()
    assert store.save_tensor_to_safetensor(key, uri, filesystem="file", tensor_name="kv") == 0
    assert list(safetensors_torch.load_file(str(target))) == ["kv"]
    loaded = store.load_tensor_from_safetensor(restored, uri, filesystem="file", tensor_name="kv")
    assert loaded is not None and _same(store.get_tensor(restored), tensor)


def test_default_file_name_is_the_key(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    tensor = torch.tensor([5.0, 6.0, 7.0])
    key = _key("default")
    assert store.put_tensor(key, tensor) == 0
    assert store.save_tensor_to_safetensor(key) == 0
    assert (tmp_path / key).read_bytes() == safetensors_torch.save({key: tensor})
    # No extension: save_tensor_to_file's auto format is a torch file.
    other = _key("default-torch")
    assert store.put_tensor(other, tensor) == 0
    assert store.save_tensor_to_file(other) == 0
    assert (tmp_path / other).read_bytes() == _torch_bytes(tensor)
    # A load without a key stores under the file name.
    assert store.remove(other) == 0
    assert _same(store.load_tensor_from_file(file_name=other), tensor)
    assert _same(store.get_tensor(other), tensor)


# ----------------------------------------------------------------------------------------------
# torch files and the KV-cache aliases


def test_torch_file_is_torch_save_of_the_tensor(store: Any, tmp_path: Path) -> None:
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    key, restored = _key("pt"), _key("pt-restored")
    path = tmp_path / "t.pt"
    assert store.put_tensor(key, tensor) == 0
    assert store.save_tensor_to_file(key, str(path)) == 0
    assert path.read_bytes() == _torch_bytes(tensor)
    assert _same(torch.load(str(path), weights_only=True), tensor)

    loaded = store.load_tensor_from_file(restored, str(path), filesystem="file")
    assert loaded is not None and _same(store.get_tensor(restored), tensor)


def test_format_argument_beats_the_extension(store: Any, tmp_path: Path) -> None:
    tensor = torch.tensor([1, 2, 3], dtype=torch.int16)
    key = _key("fmt")
    assert store.put_tensor(key, tensor) == 0
    as_torch = tmp_path / "named.safetensors"
    assert store.save_tensor_to_file(key, str(as_torch), format="pt") == 0
    assert as_torch.read_bytes() == _torch_bytes(tensor)
    as_safetensors = tmp_path / "named.bin"
    assert store.save_tensor_to_file(key, str(as_safetensors), format="Safe-Tensors") == 0
    header_length = struct.unpack("<Q", as_safetensors.read_bytes()[:8])[0]
    header = json.loads(as_safetensors.read_bytes()[8 : 8 + header_length])
    assert header[key]["dtype"] == "I16" and header[key]["shape"] == [3]
    assert store.save_tensor_to_file(key, str(tmp_path / "x"), format="npz") == INVALID


@pytest.mark.parametrize("suffix", [".safetensors", ".pt"])
def test_kv_cache_files_are_tensor_files(store: Any, tmp_path: Path, suffix: str) -> None:
    tensor = torch.tensor([21.0, 22.0, 23.0])
    key, restored = _key("kv"), _key("kv-restored")
    assert store.put_tensor(key, tensor) == 0
    kv_path, tensor_path = tmp_path / f"kv{suffix}", tmp_path / f"t{suffix}"
    assert store.save_kv_cache_to_file(key, str(kv_path), format="auto", filesystem="file") == 0
    assert store.save_tensor_to_file(key, str(tensor_path)) == 0
    assert kv_path.read_bytes() == tensor_path.read_bytes()
    assert _same(store.load_kv_cache_from_file(restored, str(kv_path)), tensor)
    assert _same(store.get_tensor(restored), tensor)


def test_torch_file_must_hold_one_tensor(store: Any, tmp_path: Path) -> None:
    path = tmp_path / "dict.pt"
    torch.save({"weight": torch.tensor([1.0, 2.0])}, str(path))
    key = _key("dict")
    assert store.load_tensor_from_file(key, str(path), format="torch") is None
    assert store.get_tensor(key) is None


# ----------------------------------------------------------------------------------------------
# Other filesystems


def test_memory_filesystem_round_trip(store: Any, memory_fs: Any) -> None:
    fs, root = memory_fs
    tensor = torch.tensor([[1, 2], [3, 4]], dtype=torch.int64)
    key, restored = _key("mem"), _key("mem-restored")
    assert store.put_tensor(key, tensor) == 0
    url = f"memory://{root}/dir/t.safetensors"
    assert store.save_tensor_to_safetensor(key, url) == 0
    assert fs.cat_file(f"{root}/dir/t.safetensors") == safetensors_torch.save({key: tensor})
    # The same place named by a path plus filesystem="memory".
    assert _same(
        store.load_tensor_from_safetensor(restored, f"{root}/dir/t.safetensors", "memory"), tensor
    )
    assert _same(store.get_tensor(restored), tensor)


def test_torch_load_from_elsewhere_needs_the_opt_in(store: Any, memory_fs: Any) -> None:
    fs, root = memory_fs
    tensor = torch.tensor([9.0, 8.0])
    key = _key("remote-pt")
    assert store.put_tensor(key, tensor) == 0
    url = f"memory://{root}/t.pt"
    assert store.save_tensor_to_file(key, url) == 0
    assert fs.cat_file(f"{root}/t.pt") == _torch_bytes(tensor)

    refused = _key("refused")
    assert store.load_tensor_from_file(refused, url) is None
    assert store.get_tensor(refused) is None
    # Refused before anything is fetched: an unknown bucket needs no network to fail.
    assert store.load_tensor_from_file(refused, "s3://no-such-bucket/model.pt") is None

    allowed = _key("allowed")
    loaded = store.load_tensor_from_file(allowed, url, allow_unsafe_remote_torch_load=True)
    assert loaded is not None and _same(store.get_tensor(allowed), tensor)


# ----------------------------------------------------------------------------------------------
# Failures


def test_saving_a_missing_key_writes_nothing(store: Any, tmp_path: Path) -> None:
    path = tmp_path / "never.safetensors"
    assert store.save_tensor_to_safetensor(_key("absent"), str(path)) == FILE_NOT_FOUND
    assert not path.exists()
    assert store.save_tensor_to_file("k", "") == FILE_NOT_FOUND  # the key is looked up first


def test_loading_a_missing_or_corrupt_file_gives_none(store: Any, tmp_path: Path) -> None:
    key = _key("nofile")
    assert store.load_tensor_from_safetensor(key, str(tmp_path / "none.safetensors")) is None
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    assert store.load_tensor_from_safetensor(key, str(corrupt)) is None
    assert store.load_tensor_from_file(key) is None  # no file_name
    assert store.get_tensor(key) is None


def test_a_bytes_value_is_not_a_tensor_to_save(store: Any, tmp_path: Path) -> None:
    key = _key("raw")
    assert store.put(key, b"not a tensor object") == 0
    assert store.save_tensor_to_safetensor(key, str(tmp_path / "raw.safetensors")) == (
        FILE_NOT_FOUND
    )


def test_calls_before_setup(tmp_path: Path) -> None:
    idle = MooncakeDistributedStore()
    path = tmp_path / "t.safetensors"
    safetensors_torch.save_file({"t": torch.tensor([1.0])}, str(path))
    assert idle.save_tensor_to_safetensor("k", str(tmp_path / "x.safetensors")) == FILE_NOT_FOUND
    assert idle.load_tensor_from_safetensor("k", str(path)) is None
    assert idle.save_tensor("k", torch.tensor([1.0])) == INVALID


# ----------------------------------------------------------------------------------------------
# save_tensor / load_tensor


def test_save_and_load_tensor_through_the_store_only(store: Any) -> None:
    tensor = torch.tensor([1.0, 2.0, 3.0])
    key = _key("plain")
    assert store.save_tensor(key, tensor) == 0
    assert _same(store.load_tensor(key), tensor)
    assert store.load_tensor(_key("absent")) is None


@pytest.mark.parametrize(
    ("kind", "suffix", "torch_file"),
    [
        ("safetensor", ".bin", False),
        ("tensor", ".safetensors", False),
        ("tensor", ".pt", True),
        ("kv_cache", ".safetensors", False),
        ("KV-Cache", ".pt", True),
    ],
)
def test_save_tensor_exports_and_load_tensor_imports(
    store: Any, tmp_path: Path, kind: str, suffix: str, torch_file: bool
) -> None:
    tensor = torch.tensor([4.0, 5.0, 6.0])
    key, restored = _key("export"), _key("import")
    path = tmp_path / f"artifact{suffix}"
    assert store.save_tensor(key, tensor, file_name=str(path), artifact_kind=kind) == 0
    assert _same(store.get_tensor(key), tensor)
    expected = _torch_bytes(tensor) if torch_file else safetensors_torch.save({key: tensor})
    assert path.read_bytes() == expected
    loaded = store.load_tensor(restored, file_name=str(path), artifact_kind=kind)
    assert loaded is not None and _same(store.get_tensor(restored), tensor)


def test_save_tensor_with_tensor_name(store: Any, tmp_path: Path) -> None:
    tensor = torch.tensor([7.0, 8.0])
    key = _key("named")
    path = tmp_path / "named.safetensors"
    assert store.save_tensor(key, tensor, str(path), "safetensor", tensor_name="payload") == 0
    assert list(safetensors_torch.load_file(str(path))) == ["payload"]
    restored = _key("named-restored")
    loaded = store.load_tensor(restored, str(path), "safetensor", tensor_name="payload")
    assert loaded is not None and _same(loaded, tensor)


def test_bad_artifact_kinds_write_and_read_nothing(store: Any, tmp_path: Path) -> None:
    tensor = torch.tensor([1.0])
    key = _key("bad-kind")
    path = tmp_path / "bad.safetensors"
    assert store.save_tensor(key, tensor, str(path), "not-a-kind") == INVALID
    assert store.save_tensor(key, tensor, str(path), "safetensor", format="torch") == INVALID
    assert store.get_tensor(key) is None and not path.exists()
    assert fio.INVALID_PARAMS == INVALID

    safetensors_torch.save_file({"t": tensor}, str(path))
    assert store.load_tensor(key, str(path), "not-a-kind") is None
    assert store.get_tensor(key) is None


# ----------------------------------------------------------------------------------------------
# Two stores, threads, imports


def test_a_file_saved_by_one_store_loads_in_another(
    master: InProcessMaster, tmp_path: Path
) -> None:
    writer, reader = _store(master), _store(master)
    try:
        tensor = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
        key, restored = _key("writer"), _key("reader")
        path = tmp_path / "shared.safetensors"
        assert writer.put_tensor(key, tensor) == 0
        assert writer.save_tensor_to_safetensor(key, str(path)) == 0
        assert _same(reader.load_tensor_from_safetensor(restored, str(path)), tensor)
        assert _same(writer.get_tensor(restored), tensor)
    finally:
        writer.close()
        reader.close()


def test_concurrent_saves_and_loads(store: Any, tmp_path: Path) -> None:
    tensors = {_key(f"thread{i}"): torch.full((64,), float(i)) for i in range(8)}
    for key, tensor in tensors.items():
        assert store.put_tensor(key, tensor) == 0
    results: dict[str, Any] = {}

    def round_trip(key: str) -> None:
        path = tmp_path / f"{key}.safetensors"
        code = store.save_tensor_to_safetensor(key, str(path))
        results[key] = (code, store.load_tensor_from_safetensor(f"{key}-copy", str(path)))

    threads = [threading.Thread(target=round_trip, args=(key,)) for key in tensors]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for key, tensor in tensors.items():
        code, loaded = results[key]
        assert code == 0 and _same(loaded, tensor)
        assert _same(store.get_tensor(f"{key}-copy"), tensor)


def test_importing_imports_no_optional_dependency() -> None:
    script = (
        "import sys, mooncake_py, mooncake_py.store_file_io;"
        " from mooncake_py.client import compat_tensor_files;"
        " print(sorted(m for m in ('torch', 'safetensors', 'fsspec') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_async_store_saves_and_loads_files(store: Any, tmp_path: Path) -> None:
    import asyncio

    from mooncake_py import AsyncMooncakeStore

    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    target = tmp_path / "async.safetensors"

    async def run() -> None:
        async with AsyncMooncakeStore(store) as wrapped:
            assert await wrapped.save_tensor("async-src", tensor, str(target), "safetensor") == 0
            loaded = await wrapped.load_tensor_from_safetensor("async-dst", str(target))
            assert loaded is not None and torch.equal(loaded, tensor)
            assert torch.equal(await wrapped.load_tensor("async-dst"), tensor)

    asyncio.run(run())
