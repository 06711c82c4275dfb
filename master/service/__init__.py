"""The master's service layer: the :class:`MasterService` facade and the services it
composes (writes, eviction, KV sessions, release) over one shared context (lock, state, clock,
tenant rule). No transport code."""
