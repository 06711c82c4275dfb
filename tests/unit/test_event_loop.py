"""The master's event loop: uvloop unless ``MOONCAKE_PY_EVENT_LOOP`` says otherwise."""

from __future__ import annotations

import asyncio

import pytest

from mooncake_py.master import event_loop


async def _loop_type_name() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_uvloop_by_default_and_asyncio_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(event_loop.LOOP_ENV, raising=False)
    assert event_loop.loop_kind() == "uvloop"  # a dependency of the package
    assert event_loop.run(_loop_type_name()).startswith("uvloop")
    monkeypatch.setenv(event_loop.LOOP_ENV, "asyncio")
    assert event_loop.loop_kind() == "asyncio"
    assert event_loop.run(_loop_type_name()).startswith("asyncio")
    loop = event_loop.new_event_loop()
    try:
        assert isinstance(loop, asyncio.BaseEventLoop)
    finally:
        loop.close()


def test_an_unknown_loop_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(event_loop.LOOP_ENV, "trio")
    with pytest.raises(ValueError, match="expected 'uvloop' or 'asyncio'"):
        event_loop.new_event_loop()
