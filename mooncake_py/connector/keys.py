"""Page hashes and store keys, in the style serving engines use.

A page is a fixed number of tokens. Its hash is chained: it covers the page's tokens and the
hash of the page before it, so equal hashes mean equal prefixes (SGLang HiCache and vLLM both
derive their keys this way). Only full pages get a hash; a partial tail page is recomputed,
never stored.

Keys follow SGLang HiCache's model-aware format ``{prefix}_{model}_{hash}_{rank}_kv`` (with
``/`` in the model name replaced by ``-``, and the ``{prefix}_`` part left out when there is no
prefix): the page's K and V live in one object, as for MLA models. The rank is the
tensor-parallel rank whose shard of the KV the object holds; data-parallel replicas of the same
model use the same rank and so share pages through the store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Iterable, Sequence

_TOKEN_BYTES = 4


def chain_hash(parent: str, tokens: Sequence[int]) -> str:
    """The hash of one page given the hash of the page before it.

    Args:
        parent: hex hash of the previous page, or ``""`` for the first page (or a salt that
            isolates a namespace, as vLLM's ``cache_salt`` does).
        tokens: the page's token ids (each in ``[0, 2**32)``).

    Returns:
        A 64-character lowercase hex SHA-256 digest.

    Raises:
        struct.error: a token id does not fit in 32 bits.
    """
    digest = hashlib.sha256(parent.encode("ascii"))
    digest.update(struct.pack(f"<{len(tokens)}I", *tokens))
    return digest.hexdigest()


def page_hashes(tokens: Sequence[int], page_tokens: int, parent: str = "") -> list[str]:
    """Chained hashes of every full page of ``tokens``.

    Args:
        tokens: token ids of the sequence, first token first.
        page_tokens: tokens per page (> 0).
        parent: hash the chain continues from (``""`` to start a new chain).

    Returns:
        One hash per full page, in order; a partial last page has none.

    Raises:
        ValueError: ``page_tokens`` is not positive.
    """
    if page_tokens <= 0:
        raise ValueError(f"page_tokens must be positive: {page_tokens}")
    hashes: list[str] = []
    for start in range(0, len(tokens) - page_tokens + 1, page_tokens):
        parent = chain_hash(parent, tokens[start : start + page_tokens])
        hashes.append(parent)
    return hashes


@dataclasses.dataclass(frozen=True)
class PageKeys:
    """Maps page hashes to store keys: ``{prefix}_{model}_{hash}_{rank}_kv``.

    Attributes:
        model: served model name; ``/`` becomes ``-`` in keys.
        rank: tensor-parallel rank of the KV shard (0 without tensor parallelism).
        prefix: namespace tag put first (SGLang's ``extra_backend_tag``); ``""`` for none.

    Raises:
        ValueError: the model is empty, the rank negative, or a part contains whitespace.
    """

    model: str
    rank: int = 0
    prefix: str = ""

    def __post_init__(self) -> None:
        if not self.model or self.rank < 0:
            raise ValueError(f"need a model name and a rank >= 0: {self.model!r}, {self.rank}")
        if any(c.isspace() for c in self.model + self.prefix):
            raise ValueError("model and prefix must not contain whitespace")

    @property
    def model_tag(self) -> str:
        """The model name as it appears in keys."""
        return self.model.replace("/", "-")

    def key(self, page_hash: str) -> str:
        """The store key of one page."""
        head = f"{self.prefix}_" if self.prefix else ""
        return f"{head}{self.model_tag}_{page_hash}_{self.rank}_kv"

    def keys(self, hashes: Iterable[str]) -> list[str]:
        """The store keys of ``hashes``, in order."""
        return [self.key(h) for h in hashes]
