"""A synthetic multi-turn chat trace, in virtual time, generated from a seed.

Many conversations arrive over a window of virtual time and share one system prompt. Each turn
sends the whole context so far (system prompt, earlier turns, the new user message) and adds
the assistant's reply; a user thinks for a while (log-normal, capped) before the next turn.
Some conversations are abandoned (they stop without saying so), some are compacted once (the
history is replaced by a short summary, so the old pages are dead). Every turn is routed to a
random worker: there is no session affinity, so a conversation's prefix must come from the
shared store.

Pages are identified only by their chained hashes (token ids are drawn from the seed); the
same seed always gives the same trace.
"""

from __future__ import annotations

import dataclasses
import math
import random

from mooncake_py.connector.keys import chain_hash

VOCAB = 50_000


@dataclasses.dataclass(frozen=True)
class TraceConfig:
    """Shape of the workload.

    Attributes:
        seed: random seed; equal seeds give equal traces.
        conversations: conversations in the trace.
        window_s: virtual seconds over which conversations arrive (uniformly).
        min_turns: fewest turns of a conversation (>= 1).
        max_turns: most turns of a conversation.
        think_median_s: median think time between turns (virtual seconds).
        think_max_s: longest think time.
        think_min_s: shortest think time (more than one step, so a conversation never has
            two turns in one step).
        system_pages: pages of the shared system prompt.
        user_pages: most pages of a user message (at least 1).
        reply_pages: most pages of a reply (at least 1).
        summary_pages: pages of the summary that replaces a compacted history.
        abandon_fraction: share of conversations that stop without an end signal.
        compact_fraction: share of conversations (with 3+ turns) compacted once.
        page_tokens: tokens per page (only for the hashes).
        workers: workers turns are routed to.
    """

    seed: int = 7
    conversations: int = 600
    window_s: float = 1500.0
    min_turns: int = 2
    max_turns: int = 8
    think_median_s: float = 25.0
    think_max_s: float = 150.0
    think_min_s: float = 3.0
    system_pages: int = 8
    user_pages: int = 3
    reply_pages: int = 4
    summary_pages: int = 2
    abandon_fraction: float = 0.25
    compact_fraction: float = 0.2
    page_tokens: int = 16
    workers: int = 2

    def __post_init__(self) -> None:
        if self.conversations < 1 or not 1 <= self.min_turns <= self.max_turns:
            raise ValueError("need at least one conversation and 1 <= min_turns <= max_turns")
        if min(self.user_pages, self.reply_pages, self.system_pages, self.summary_pages) < 1:
            raise ValueError("page counts must be at least 1")
        if not 0 < self.think_min_s <= self.think_median_s <= self.think_max_s:
            raise ValueError("need 0 < think_min_s <= think_median_s <= think_max_s")
        if not (0 <= self.abandon_fraction <= 1 and 0 <= self.compact_fraction <= 1):
            raise ValueError("fractions must be within [0, 1]")
        if self.window_s <= 0 or self.workers < 1 or self.page_tokens < 1:
            raise ValueError("window_s, workers and page_tokens must be positive")


@dataclasses.dataclass(frozen=True)
class Turn:
    """One request of a conversation.

    Attributes:
        conv: conversation number.
        index: turn number within the conversation (0 first).
        time: virtual time of the request (seconds).
        worker: worker the request is routed to.
        prompt: page hashes of the context sent (system prompt first).
        reply: page hashes of the reply generated.
        compact: the history was just replaced by a summary (the turn's prompt has it).
        keep: with ``compact``: the pages of the old context still used (its session keeps
            these); empty otherwise.
        end: the conversation ends with this turn and says so (not abandoned).
    """

    conv: int
    index: int
    time: float
    worker: int
    prompt: tuple[str, ...]
    reply: tuple[str, ...]
    compact: bool = False
    keep: tuple[str, ...] = ()
    end: bool = False


@dataclasses.dataclass(frozen=True)
class Trace:
    """A generated workload: turns in time order and what they add up to.

    Attributes:
        config: the shape it was generated from.
        system: page hashes of the shared system prompt.
        turns: every turn, ordered by time (then conversation).
        abandoned: conversations that stop without an end signal.
        unique_pages: distinct pages the trace computes (its working set).
        max_pages: largest prompt plus reply of any turn.
    """

    config: TraceConfig
    system: tuple[str, ...]
    turns: tuple[Turn, ...]
    abandoned: frozenset[int]
    unique_pages: int
    max_pages: int

    @property
    def end_time(self) -> float:
        """Virtual time of the last turn."""
        return self.turns[-1].time if self.turns else 0.0


class _Pages:
    """Draws fresh pages: random tokens, chained onto a parent hash."""

    def __init__(self, rng: random.Random, page_tokens: int) -> None:
        self._rng = rng
        self._page_tokens = page_tokens

    def extend(self, parent: str, count: int) -> list[str]:
        hashes: list[str] = []
        for _ in range(count):
            tokens = [self._rng.randrange(VOCAB) for _ in range(self._page_tokens)]
            parent = chain_hash(parent, tokens)
            hashes.append(parent)
        return hashes


def _think(rng: random.Random, config: TraceConfig) -> float:
    value = rng.lognormvariate(math.log(config.think_median_s), 0.8)
    return min(max(value, config.think_min_s), config.think_max_s)


def _conversation(
    conv: int, rng: random.Random, pages: _Pages, system: list[str], config: TraceConfig
) -> tuple[list[Turn], bool]:
    turns_total = rng.randint(config.min_turns, config.max_turns)
    abandoned = rng.random() < config.abandon_fraction
    compact_at = -1
    if turns_total >= 3 and rng.random() < config.compact_fraction:
        compact_at = rng.randint(2, turns_total - 1)
    time = rng.uniform(0.0, config.window_s)
    history: list[str] = []
    turns: list[Turn] = []
    for index in range(turns_total):
        compact = index == compact_at
        if compact:
            history = pages.extend(system[-1], config.summary_pages)
        tail = history[-1] if history else system[-1]
        user = pages.extend(tail, rng.randint(1, config.user_pages))
        reply = pages.extend(user[-1], rng.randint(1, config.reply_pages))
        last = index == turns_total - 1
        turns.append(
            Turn(
                conv=conv,
                index=index,
                time=time,
                worker=rng.randrange(config.workers),
                prompt=tuple(system + history + user),
                reply=tuple(reply),
                compact=compact,
                keep=tuple(system) if compact else (),
                end=last and not abandoned,
            )
        )
        history = history + user + reply
        time += _think(rng, config)
    return turns, abandoned


def generate(config: TraceConfig) -> Trace:
    """The trace of ``config`` (deterministic in ``config.seed``)."""
    rng = random.Random(config.seed)
    pages = _Pages(rng, config.page_tokens)
    system = pages.extend("", config.system_pages)
    turns: list[Turn] = []
    abandoned: set[int] = set()
    for conv in range(config.conversations):
        conv_turns, gave_up = _conversation(conv, rng, pages, system, config)
        turns.extend(conv_turns)
        if gave_up:
            abandoned.add(conv)
    turns.sort(key=lambda t: (t.time, t.conv))
    unique = {h for t in turns for h in (*t.prompt, *t.reply)}
    return Trace(
        config=config,
        system=tuple(system),
        turns=tuple(turns),
        abandoned=frozenset(abandoned),
        unique_pages=len(unique),
        max_pages=max(len(t.prompt) + len(t.reply) for t in turns),
    )


def reusable_prefix(trace: Trace, step_s: float) -> list[int]:
    """Per turn (in ``trace.turns`` order): leading prompt pages computed in an earlier step.

    This is what an unbounded store would serve: the denominator of the hit rates. Pages
    computed in the same step (by a turn that may run concurrently) do not count.
    """
    first_step: dict[str, int] = {}
    reusable: list[int] = []
    for turn in trace.turns:
        step = int(turn.time // step_s)
        count = 0
        for page in turn.prompt:
            if first_step.get(page, step) >= step:
                break
            count += 1
        reusable.append(count)
        for page in (*turn.prompt, *turn.reply):
            first_step.setdefault(page, step)
    return reusable


def in_progress_pages(trace: Trace, step_s: float) -> list[int]:
    """Per step: distinct pages of the conversations between their first and last turn.

    The context those conversations would reuse if they came back: what a store must hold to
    serve every live conversation (system prompt counted once).
    """
    by_conv: dict[int, list[Turn]] = {}
    for turn in trace.turns:
        by_conv.setdefault(turn.conv, []).append(turn)
    totals = [0] * (int(trace.end_time // step_s) + 1)
    for turns in by_conv.values():
        for turn, after in zip(turns, [*turns[1:], None], strict=True):
            start = int(turn.time // step_s)
            stop = int(after.time // step_s) if after is not None else start + 1
            context = len(turn.prompt) + len(turn.reply) - len(trace.system)
            for step in range(start, stop):
                totals[step] += context
    return [total + len(trace.system) for total in totals]
