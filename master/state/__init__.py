"""The master's state layer: objects, segments, allocators, clients, the LRU and the KV
session registry. No locks, no I/O: the service layer serialises every call."""
