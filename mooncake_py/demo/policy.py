"""The two retention policies the demo compares, as decisions in virtual time.

- ``plain``: the store's LRU alone. Turns write untagged pages; nothing else is said. The
  runner also replays it as ``plain+disk`` on workers that mount a disk tier: the same
  decisions, with evicted pages kept on disk.
- ``sessions``: one KV session per conversation. A turn attaches its prefix hits and tags its
  writes, and pins the session (the conversation is live); a session idle for ``pin_idle_s``
  is unpinned (its pages become ordinary cache, still reusable); a conversation that says it
  is done is closed right after its last turn (its pages stay cached: the shared system prompt
  may serve others); one silent for ``abandon_after_s`` is released (its pages that no other
  session holds are removed at once). A compaction shrinks the session to the pages the new
  context still uses.

A policy only decides: it turns trace turns into worker jobs and, as virtual time passes,
emits session jobs addressed to the worker that served the conversation last.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from mooncake_py.demo.trace import Turn
from mooncake_py.demo.worker import SessionJob, TurnJob

PLAIN = "plain"
SESSIONS = "sessions"
PLAIN_DISK = "plain+disk"
"""Plain LRU on workers that also mount a disk tier: the same decisions, another store."""


class Policy(Protocol):
    """What the runner asks a policy."""

    name: str

    def job_for(self, turn: Turn) -> TurnJob:
        """The job serving ``turn``; called in time order."""
        ...

    def due(self, now: float) -> list[tuple[int, SessionJob]]:
        """Session jobs due at virtual time ``now``, each with the worker to run it."""
        ...

    def counts(self) -> dict[str, int]:
        """How many session jobs of each action were emitted so far."""
        ...


class PlainPolicy:
    """LRU only: no sessions.

    Args:
        name: the name results carry (:data:`PLAIN`, or :data:`PLAIN_DISK` for the replay on
            workers with a disk tier).
    """

    def __init__(self, name: str = PLAIN) -> None:
        self.name = name

    def job_for(self, turn: Turn) -> TurnJob:
        """An untagged turn."""
        return TurnJob(prompt=turn.prompt, reply=turn.reply)

    def due(self, now: float) -> list[tuple[int, SessionJob]]:
        """Never anything."""
        return []

    def counts(self) -> dict[str, int]:
        """No session jobs."""
        return {}


@dataclasses.dataclass
class _Conversation:
    session: str
    last_time: float
    worker: int
    pinned: bool = True


class SessionPolicy:
    """One session per conversation; see the module docstring.

    Args:
        session_prefix: prefix of session ids (unique per run).
        pin_idle_s: virtual seconds without a turn after which a session is unpinned.
        abandon_after_s: virtual seconds without a turn after which a conversation that never
            said it ended is released.
    """

    name = SESSIONS

    def __init__(self, session_prefix: str, pin_idle_s: float, abandon_after_s: float) -> None:
        self._prefix = session_prefix
        self.pin_idle_s = pin_idle_s
        self.abandon_after_s = abandon_after_s
        self._live: dict[int, _Conversation] = {}
        self._counts = {"pin": 0, "unpin": 0, "close": 0, "release": 0, "compact": 0}

    def session_id(self, conv: int) -> str:
        """The session of conversation ``conv``."""
        return f"{self._prefix}-conv-{conv}"

    def job_for(self, turn: Turn) -> TurnJob:
        """A tagged turn that pins its session; closes it when the conversation ends."""
        session = self.session_id(turn.conv)
        self._counts["pin"] += 1
        self._counts["compact"] += int(turn.compact)
        if turn.end:
            self._live.pop(turn.conv, None)
            self._counts["close"] += 1
        else:
            self._live[turn.conv] = _Conversation(session, turn.time, turn.worker)
        return TurnJob(
            prompt=turn.prompt,
            reply=turn.reply,
            session=session,
            keep=turn.keep if turn.compact else None,
            end=turn.end,
        )

    def due(self, now: float) -> list[tuple[int, SessionJob]]:
        """Unpin sessions idle for ``pin_idle_s``; release those silent for
        ``abandon_after_s``."""
        jobs: list[tuple[int, SessionJob]] = []
        for conv, state in list(self._live.items()):
            idle = now - state.last_time
            if idle >= self.abandon_after_s:
                jobs.append((state.worker, SessionJob(state.session, "release")))
                self._counts["release"] += 1
                del self._live[conv]
            elif state.pinned and idle >= self.pin_idle_s:
                jobs.append((state.worker, SessionJob(state.session, "unpin")))
                self._counts["unpin"] += 1
                state.pinned = False
        return jobs

    def counts(self) -> dict[str, int]:
        """Session calls asked for, per action (``pin`` counts turns)."""
        return dict(self._counts)
