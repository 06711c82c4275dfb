"""What changed since the last replicated record: the dirty sets the state's mutations mark.

With replication on (``--enable_ha`` or ``--enable_snapshot``) every part of the master's
state that the log carries is told of a :class:`Journal` and marks, at its few mutation
points, *which* rows changed: objects (by id), KV sessions (by tenant and id), segments,
client bindings, and allocator ranges. It never records *how* they changed: when the
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
RangeKey = tuple[str, int]


@dataclasses.dataclass(slots=True)
class DirtyRows:
    """The rows one record must carry, taken from the journal at once.

    Attributes:
        objects: object ids whose image changed (or that are gone).
        sessions: (tenant, session id) of sessions whose own fields changed or that are gone
            (memberships travel with the objects).
        segments: segment ids mounted, changed or withdrawn.
        clients: client ids whose binding changed or that were forgotten.
        ranges: allocator ranges: (segment id, offset) -> rounded size now held, 0 if freed.
    """

    objects: set[ObjectKey]
    sessions: set[SessionKey]
    segments: set[str]
    clients: set[str]
    ranges: dict[RangeKey, int]

    def __len__(self) -> int:
        return (
            len(self.objects)
            + len(self.sessions)
            + len(self.segments)
            + len(self.clients)
            + len(self.ranges)
        )


class Journal:
    """The dirty sets, and a count of marks so a caller can tell whether a call changed
    anything (:attr:`marks` before and after).

    Attributes:
        marks: how many marks were made, ever (only grows).
    """

    __slots__ = ("_objects", "_sessions", "_segments", "_clients", "_ranges", "marks")

    def __init__(self) -> None:
        self._objects: set[ObjectKey] = set()
        self._sessions: set[SessionKey] = set()
        self._segments: set[str] = set()
        self._clients: set[str] = set()
        self._ranges: dict[RangeKey, int] = {}
        self.marks = 0

    def object(self, object_id: ObjectKey) -> None:
        """The object's image changed (or it is gone). O(1)."""
        self._objects.add(object_id)
        self.marks += 1

    def session(self, tenant: str, session_id: str) -> None:
        """The session's own fields changed (or it is gone). O(1)."""
        self._sessions.add((tenant, session_id))
        self.marks += 1

    def segment(self, segment_id: str) -> None:
        """The segment was mounted or withdrawn. O(1)."""
        self._segments.add(segment_id)
        self.marks += 1

    def client(self, client_id: str) -> None:
        """The client's binding changed or it was forgotten. O(1)."""
        self._clients.add(client_id)
        self.marks += 1

    def allocated(self, segment_id: str, offset: int, size: int) -> None:
        """``size`` bytes (rounded) are now held at ``offset`` of the segment. O(1)."""
        self._ranges[(segment_id, offset)] = size
        self.marks += 1

    def freed(self, segment_id: str, offset: int) -> None:
        """The range at ``offset`` of the segment went back to its allocator. O(1)."""
        self._ranges[(segment_id, offset)] = 0
        self.marks += 1

    @property
    def dirty(self) -> bool:
        """Whether anything was marked since the last :meth:`take`."""
        return bool(
            self._objects or self._sessions or self._segments or self._clients or self._ranges
        )

    def take(self) -> DirtyRows:
        """Everything marked since the last take; the journal starts empty again. O(1)."""
        taken = DirtyRows(
            self._objects, self._sessions, self._segments, self._clients, self._ranges
        )
        self._objects, self._sessions, self._segments = set(), set(), set()
        self._clients, self._ranges = set(), {}
        return taken
