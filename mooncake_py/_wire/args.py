"""How a request's fields become a master target's positional arguments, and back.

:class:`Fields` and :class:`Tagged` are the argument specs of the RPC table
(:mod:`mooncake_py._wire.rpcs`); each compiles, against its request type, into an
:class:`ArgsCodec` that both ends use: the master decodes, the client encodes.

Thread-safety: specs and codecs are immutable after construction.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mooncake_py._proto import master_pb2 as pb

# -- argument specs --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    """A request field carrying messages: ``decode`` turns its value into the argument,
    ``encode`` the argument into its value (for a repeated field, the whole list)."""

    name: str
    decode: Callable[[Any], Any]
    encode: Callable[[Any], Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Const:
    """An argument the RPC itself implies (PinKvSession: ``pinned=True``); nothing travels,
    and the client's value for it is ignored."""

    value: Any


@dataclasses.dataclass(frozen=True, slots=True)
class ArgsCodec:
    """Compiled request <-> positional-arguments conversion for one request type.

    Attributes:
        decode: request message -> the target's positional arguments.
        encode: the client's positional arguments -> request message; raises TypeError or
            ValueError for a wrong number of arguments.
    """

    decode: Callable[[Any], Sequence[Any]]
    encode: Callable[..., Any]


class Fields:
    """Arguments taken from request fields, in the target's parameter order.

    Each spec is a field name, a :class:`Field` (message fields, which need a codec) or a
    :class:`Const`. How a named field converts follows the proto: a repeated field becomes a
    list, a field with presence (``optional``) becomes None when unset and is left unset for
    None, any other field passes as it is.

    ``defaults`` are the values of the last arguments when the client leaves them out (fields
    added to a request later, so older callers keep encoding it).
    """

    def __init__(self, *specs: str | Field | Const, defaults: Sequence[Any] = ()) -> None:
        if len(defaults) > len(specs):
            raise TypeError("more defaults than fields")
        self.specs = specs
        self.defaults = tuple(defaults)

    def compile(self, request_type: Any) -> ArgsCodec:
        """The codec for ``request_type``.

        Raises:
            KeyError: a named field does not exist.
            TypeError: a message field is named without a :class:`Field` codec.
        """
        fields = request_type.DESCRIPTOR.fields_by_name
        specs = self.specs
        names = [s for s in specs if isinstance(s, str)]
        for name in names:
            if fields[name].message_type is not None:
                raise TypeError(f"{request_type.__name__}.{name} needs a Field codec")
        defaults = self.defaults
        if len(names) == len(specs) and not any(fields[n].has_presence for n in names):
            builder = _plain_builder(request_type, names, defaults)
            return ArgsCodec(_plain_getter(fields, names), builder)
        decoders = [_decoder(fields, spec) for spec in specs]
        encoders = [_encoder(spec) for spec in specs]

        def encode(*args: Any) -> Any:
            missing = len(specs) - len(args)
            if 0 < missing <= len(defaults):
                args = (*args, *defaults[len(defaults) - missing :])
            values = {}
            for (name, convert), value in zip(encoders, args, strict=True):
                if name is not None and value is not None:
                    values[name] = convert(value)
            return request_type(**values)

        return ArgsCodec(lambda request: [decode(request) for decode in decoders], encode)


def _plain_getter(
    fields: Mapping[str, Any], names: Sequence[str]
) -> Callable[[Any], Sequence[Any]]:
    if any(fields[n].is_repeated for n in names):
        getters = [_decoder(fields, n) for n in names]
        return lambda request: [get(request) for get in getters]
    if len(names) >= 2:
        # Fetches every field in C, in one call: the hot path of single-key calls.
        return operator.attrgetter(*names)
    if len(names) == 1:
        name = names[0]
        return lambda request: (getattr(request, name),)
    return lambda request: ()


def _plain_builder(
    request_type: Any, names: Sequence[str], defaults: Sequence[Any] = ()
) -> Callable[..., Any]:
    """Builds ``request_type`` from one positional argument per field of ``names`` (the last
    ``len(defaults)`` of them optional).

    Generated as ``def encode(_0, _1): return KeyRequest(tenant_id=_0, key=_1)``, so it costs
    what a hand-written call costs (building keyword arguments from ``zip`` at run time doubles
    the client's share of a single-key call), and a wrong argument count fails as any call
    does. ``names`` are proto field names, hence identifiers.
    """
    first_default = len(names) - len(defaults)
    params = ", ".join(
        f"_{i}" if i < first_default else f"_{i}=_defaults[{i - first_default}]"
        for i in range(len(names))
    )
    fields = ", ".join(f"{name}=_{i}" for i, name in enumerate(names))
    namespace: dict[str, Any] = {"request_type": request_type, "_defaults": tuple(defaults)}
    exec(f"def encode({params}):\n    return request_type({fields})\n", namespace)
    encode: Callable[..., Any] = namespace["encode"]
    return encode


def _decoder(fields: Mapping[str, Any], spec: str | Field | Const) -> Callable[[Any], Any]:
    if isinstance(spec, Const):
        value = spec.value
        return lambda request: value
    if isinstance(spec, Field):
        get = operator.attrgetter(spec.name)
        decode = spec.decode
        return lambda request: decode(get(request))
    field = fields[spec]
    get = operator.attrgetter(spec)
    if field.is_repeated:
        return lambda request: list(get(request))
    if field.has_presence:
        return lambda request: get(request) if request.HasField(spec) else None
    return get


def _identity(value: Any) -> Any:
    return value


def _encoder(spec: str | Field | Const) -> tuple[str | None, Callable[[Any], Any]]:
    """``(field name, or None to send nothing; conversion)``."""
    if isinstance(spec, Const):
        return None, _identity
    if isinstance(spec, Field):
        return spec.name, spec.encode
    return spec, _identity


class Tagged:
    """A tagged write: the untagged request under ``put`` plus KV session tags.

    The tags travel in ``kv_sessions`` (one ``KvSessionTags`` for a single write, one per key
    for a batch) and reach the target as the ``kv_sessions`` of its config argument (the
    ``Field`` named ``config``). Encoding requires ``config.kv_sessions`` set (exactly one
    entry for a single write).
    """

    def __init__(self, put: Fields, batch: bool) -> None:
        self.put = put
        self.batch = batch
        names = [s.name if isinstance(s, Field) else s for s in put.specs]
        self.config_at = names.index("config")

    def compile(self, request_type: Any) -> ArgsCodec:
        """The codec for ``request_type`` (a ``*WithKvSessionsRequest``)."""
        put_type = getattr(pb, request_type.DESCRIPTOR.fields_by_name["put"].message_type.name)
        put = self.put.compile(put_type)
        batch = self.batch
        at = self.config_at

        def decode(request: Any) -> Sequence[Any]:
            args = put.decode(request.put)
            tags = request.kv_sessions
            args[at].kv_sessions = (
                [list(t.session_ids) for t in tags] if batch else [list(tags.session_ids)]
            )
            return args

        def encode(*args: Any) -> Any:
            sessions = args[at].kv_sessions
            tags: Any = (
                [pb.KvSessionTags(session_ids=ids) for ids in sessions]
                if batch
                else pb.KvSessionTags(session_ids=sessions[0])
            )
            return request_type(put=put.encode(*args), kv_sessions=tags)

        return ArgsCodec(decode, encode)
