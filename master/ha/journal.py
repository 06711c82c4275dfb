"""What changed since the last replicated record: the dirty sets the state's mutations mark.

With replication on (``--enable_ha`` or ``--enable_snapshot``) every part of the master's
state that the log carries is told of a :class:`Journal` and marks, at its few mutation
points, *which* rows changed: objects (by id), KV sessions (by tenant and id), session
memberships (by object and session), segments (mounts and withdrawals), client bindings, and
allocator ranges. It never records *how* they changed: when the
replicator writes the next record it reads the current image of every dirty row (or notes
that it is gone), so a row changed a hundred times between two records costs one image, and
a row's image is always one the leader really had.

Marking costs a set insertion and a counter increment; with replication off the parts hold
no journal and test one attribute against None.

Thread-safety: none of its own; marked and taken under the service lock.
"""

from __future__ import annotations

import dataclasses

ObjectKey = tuple[str, str]
SessionKey = tuple[str, str]
MembershipKey = tuple[str, str, str]


@dataclasses.dataclass(slots=True)
class DirtyRows:
    """The rows one flush must carry, taken from the journal at once.

    Attributes:
        objects: object ids whose image changed (or that are gone).
        sessions: (tenant, session id) of sessions whose own fields changed or that are gone.
        memberships: (tenant, key, session id) -> whether the object is now a member.
        segments: segment ids mounted, changed or withdrawn.
        unmounted: segment ids withdrawn (possibly mounted again since, under the same id).
        clients: client ids whose binding changed or that were forgotten.
        ranges: per segment, offset -> rounded size held, 0 if freed (marks of a mount that
            was withdrawn since are dropped with it).
    """

    objects: set[ObjectKey]
    sessions: set[SessionKey]
    memberships: dict[MembershipKey, bool]
    segments: set[str]
    unmounted: set[str]
    clients: set[str]
    ranges: dict[str, dict[int, int]]

    def __len__(self) -> int:
        return (
            len(self.objects)
            + len(self.sessions)
            + len(self.memberships)
            + len(self.segments)
            + len(self.unmounted)
            + len(self.clients)
            + sum(len(held) for held in self.ranges.values())
        )


class Journal:
    """The dirty sets, and a count of marks so a caller can tell whether a call changed
    anything (:attr:`marks` before and after).

    Attributes:
        marks: how many marks were made, ever (only grows).
    """

    __slots__ = (
        "_objects",
        "_sessions",
        "_memberships",
        "_segments",
        "_unmounted",
        "_clients",
        "_ranges",
        "marks",
    )

    def __init__(self) -> None:
        self.marks = 0
        self._reset()

    def _reset(self) -> None:
        self._objects: set[ObjectKey] = set()
        self._sessions: set[SessionKey] = set()
        self._memberships: dict[MembershipKey, bool] = {}
        self._segments: set[str] = set()
        self._unmounted: set[str] = set()
        self._clients: set[str] = set()
        self._ranges: dict[str, dict[int, int]] = {}

    def object(self, object_id: ObjectKey) -> None:
        """The object's image changed (or it is gone). O(1)."""
        self._objects.add(object_id)
        self.marks += 1

    def session(self, tenant: str, session_id: str) -> None:
        """The session's own fields changed (or it is gone). O(1)."""
        self._sessions.add((tenant, session_id))
        self.marks += 1

    def membership(self, tenant: str, key: str, session_id: str, present: bool) -> None:
        """The object ``key`` joined (``present``) or left the session. O(1)."""
        self._memberships[(tenant, key, session_id)] = present
        self.marks += 1

    def segment(self, segment_id: str) -> None:
        """The segment was mounted. O(1)."""
        self._segments.add(segment_id)
        self.marks += 1

    def unmounted(self, segment_id: str) -> None:
        """The segment was withdrawn: its ranges are gone, and so are the range marks made
        for it. O(1)."""
        self._segments.add(segment_id)
        self._unmounted.add(segment_id)
        self._ranges.pop(segment_id, None)
        self.marks += 1

    def client(self, client_id: str) -> None:
        """The client's binding changed or it was forgotten. O(1)."""
        self._clients.add(client_id)
        self.marks += 1

    def allocated(self, segment_id: str, offset: int, size: int) -> None:
        """``size`` bytes (rounded) are now held at ``offset`` of the segment. O(1)."""
        held = self._ranges.get(segment_id)
        if held is None:
            held = self._ranges[segment_id] = {}
        held[offset] = size
        self.marks += 1

    def freed(self, segment_id: str, offset: int) -> None:
        """The range at ``offset`` of the segment went back to its allocator. O(1)."""
        held = self._ranges.get(segment_id)
        if held is None:
            held = self._ranges[segment_id] = {}
        held[offset] = 0
        self.marks += 1

    @property
    def dirty(self) -> bool:
        """Whether anything was marked since the last :meth:`take`."""
        return bool(
            self._objects
            or self._sessions
            or self._memberships
            or self._segments
            or self._clients
            or self._ranges
        )

    def take(self) -> DirtyRows:
        """Everything marked since the last take; the journal starts empty again. O(1)."""
        taken = DirtyRows(
            self._objects,
            self._sessions,
            self._memberships,
            self._segments,
            self._unmounted,
            self._clients,
            self._ranges,
        )
        self._reset()
        return taken
