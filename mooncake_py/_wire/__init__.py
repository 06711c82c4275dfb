"""The master RPCs' wire format, shared by the master and the client (private).

- :mod:`~mooncake_py._wire.codec`: protobuf <-> the typed forms of :mod:`mooncake_py.types`;
- :mod:`~mooncake_py._wire.rpcs`: one declarative entry per RPC (request fields -> call
  arguments, the master's target, result encoding, the INTERNAL_ERROR answer), read by the
  master's call pipeline and by the client;
- :mod:`~mooncake_py._wire.frames`: the stream channel's framing.

This package is the only importer of the generated code in :mod:`mooncake_py._proto`.
"""
