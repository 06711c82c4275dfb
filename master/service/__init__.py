"""The master's service layer: the :class:`MasterService` facade and the services it
composes (writes, eviction, KV sessions, release). No transport code."""
