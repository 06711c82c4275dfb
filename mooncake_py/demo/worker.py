"""An engine worker of the demo: one data-parallel rank, in its own process.

It joins the store (hosting a segment), registers a KV buffer, and serves jobs through a
:class:`~mooncake_py.connector.KVConnector`: for a turn, look up the prompt's stored prefix,
load it (checking every page's bytes), "compute" the rest (bytes derived from the page hash),
save what the store lacks, and run the session calls the policy asks for. Both ranks use
key rank 0: they are replicas of one model, so they share pages through the store.

Protocol over a :class:`multiprocessing.connection.Connection`: the parent sends a list of
jobs, the worker answers ``("ok", outcomes)`` or ``("error", text)``; ``None`` stops it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from mooncake_py.client.api import Client
from mooncake_py.connector import Buffer, KVConnector, Page, PageKeys, SaveResult
from mooncake_py.errors import MooncakeError
from mooncake_py.types import ReleaseResult

_DIGEST_BYTES = 64


class VerificationError(RuntimeError):
    """A page read from the store does not hold the bytes its hash implies."""


def page_content(page_hash: str, size: int) -> bytes:
    """The bytes of a page: a digest of its hash, repeated (``size`` a multiple of 64)."""
    digest = hashlib.blake2b(page_hash.encode("ascii"), digest_size=_DIGEST_BYTES).digest()
    return digest * (size // _DIGEST_BYTES)


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """How a worker joins the store.

    Attributes:
        rank: data-parallel rank (names the worker; keys use tensor rank 0).
        master: ``host:port`` of the master.
        segment_bytes: memory the worker contributes to the store.
        page_bytes: size of one page (a multiple of 64).
        max_pages: pages its KV buffer holds (the longest turn).
        model: served model name (goes into keys).
        key_prefix: namespace of this run's keys.
        disk_dir: mount a disk tier under this directory next to the segment (None: memory
            only): objects evicted from the worker's memory are written there and stay
            readable.
        disk_quota_bytes: the tier's size (0: the client's default share of the free space).
        disk_fsync: sync each tier file before the master may serve it.
    """

    rank: int
    master: str
    segment_bytes: int
    page_bytes: int
    max_pages: int
    model: str
    key_prefix: str
    disk_dir: str | None = None
    disk_quota_bytes: int = 0
    disk_fsync: bool = True


@dataclasses.dataclass(frozen=True)
class TurnJob:
    """Serve one turn.

    Attributes:
        prompt: page hashes of the context.
        reply: page hashes of the reply.
        session: the conversation's session, or None (no sessions).
        keep: pages the session keeps after a compaction (None: no compaction).
        end: close the session after the turn.
    """

    prompt: tuple[str, ...]
    reply: tuple[str, ...]
    session: str | None = None
    keep: tuple[str, ...] | None = None
    end: bool = False


@dataclasses.dataclass(frozen=True)
class SessionJob:
    """Change a session: ``action`` is ``unpin``, ``close`` or ``release``."""

    session: str
    action: str


@dataclasses.dataclass(frozen=True)
class CleanupJob:
    """Remove every key of the run (force) and report how many went."""

    key_prefix: str


@dataclasses.dataclass(frozen=True)
class TurnOutcome:
    """What a turn did: pages loaded from the store (all verified) and what the save did."""

    loaded: int
    save: SaveResult


@dataclasses.dataclass(frozen=True)
class SessionOutcome:
    """What a session job did: False when the session was gone; a release's result."""

    applied: bool
    released: ReleaseResult | None = None


Job = TurnJob | SessionJob | CleanupJob


class EngineWorker:
    """A worker's store, buffer and connector; serves jobs one at a time."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        settings: dict[str, Any] = {
            "local_hostname": "127.0.0.1",
            "global_segment_size": spec.segment_bytes,
            "master_server_addr": spec.master,
        }
        if spec.disk_dir is not None:
            settings |= {
                "enable_ssd_offload": True,
                "ssd_offload_path": spec.disk_dir,
                "ssd_offload_quota": spec.disk_quota_bytes,
                "ssd_offload_fsync": spec.disk_fsync,
            }
        try:
            self.client = Client.connect(**settings)
        except MooncakeError as exc:
            raise RuntimeError(
                f"worker {spec.rank}: joining the store at {spec.master} failed: {exc}"
            ) from exc
        self.buffer = np.zeros(spec.max_pages * spec.page_bytes, dtype=np.uint8)
        self.base = int(self.buffer.ctypes.data)
        self.client.register_buffer(self.base, self.buffer.nbytes)
        keys = PageKeys(model=spec.model, rank=0, prefix=spec.key_prefix)
        self.connector = KVConnector(self.client, keys)

    def close(self) -> None:
        """Leave the store."""
        self.client.close()

    def run(self, job: Job) -> Any:
        """Serve one job; returns its outcome.

        Raises:
            VerificationError: a loaded page's bytes are wrong.
        """
        if isinstance(job, TurnJob):
            return self.turn(job)
        if isinstance(job, SessionJob):
            return self.session(job)
        pattern = f"^{re.escape(job.key_prefix)}_"
        return self.client.remove_by_regex(pattern, force=True)

    def _buffers(self, count: int) -> list[Buffer]:
        size = self.spec.page_bytes
        return [Buffer(self.base + i * size, size) for i in range(count)]

    def _verify(self, hashes: Sequence[str]) -> None:
        size = self.spec.page_bytes
        view = self.buffer.data
        for i, page_hash in enumerate(hashes):
            if view[i * size : (i + 1) * size] != page_content(page_hash, size):
                raise VerificationError(
                    f"worker {self.spec.rank}: page {page_hash[:16]} read from the store holds "
                    "the wrong bytes"
                )

    def _compute(self, hashes: Sequence[str], first: int) -> list[Page]:
        size = self.spec.page_bytes
        pages: list[Page] = []
        for i in range(first, len(hashes)):
            start = i * size
            self.buffer[start : start + size] = np.frombuffer(
                page_content(hashes[i], size), dtype=np.uint8
            )
            pages.append(Page(hashes[i], self.base + start, size))
        return pages

    def turn(self, job: TurnJob) -> TurnOutcome:
        """Look up, load and verify the prefix, compute the rest, save, update the session.

        With a session: a compaction first shrinks the session to ``keep``; loaded pages are
        attached; the session is pinned before the save when it exists (so new pages are
        protected from admission on), else right after the save created it.
        """
        connector, session = self.connector, job.session
        if session is not None and job.keep is not None:
            connector.compact(session, job.keep)
        hit = connector.lookup(job.prompt)
        loaded = connector.load(job.prompt[:hit], self._buffers(hit), session) if hit else 0
        self._verify(job.prompt[:loaded])
        pinned = session is not None and loaded > 0 and connector.pin(session)
        pages = self._compute((*job.prompt, *job.reply), loaded)
        saved = connector.save(pages, session)
        if session is not None and not pinned:
            connector.pin(session)
        if session is not None and job.end:
            connector.end(session)
        return TurnOutcome(loaded=loaded, save=saved)

    def session(self, job: SessionJob) -> SessionOutcome:
        """Unpin, close or release a session."""
        if job.action == "unpin":
            return SessionOutcome(self.connector.unpin(job.session))
        released = self.connector.end(job.session, release=job.action == "release")
        return SessionOutcome(True, released)


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Process entry: join, answer ``("ready", rank)``, then serve job lists until ``None``."""
    try:
        worker = EngineWorker(spec)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ready", spec.rank))
    try:
        while (jobs := conn.recv()) is not None:
            try:
                conn.send(("ok", [worker.run(job) for job in jobs]))
            except Exception:
                conn.send(("error", traceback.format_exc()))
    except (EOFError, KeyboardInterrupt):
        pass
    finally:
        worker.close()
