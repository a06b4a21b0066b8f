"""What a run measured of what it sent, figure by figure, judged read by read (pure: no I/O, no pytest).

A request sent in a measured window gives each per-request figure it was sent for, or a reason
why not (:class:`Withheld`), read from the request's own timeline and the client's holds
(:class:`Holds`, from the loop probe): no figure is dropped in silence, none is kept whose stamps
do not hold, and none is dropped whose stamps do. Which evidence spoils which stamp, and what the
streams show of the server (:class:`StreamShape`): docs/explanation/measurement.md, "Which stamps
hold, read by read". A kernel stamp is the arrival of the read's *last* TCP segment
(``tcp_recvmsg`` keeps the last skb's stamp), so only the earlier chunks of a read can be early.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

_NS_PER_MS = 1_000_000
# loop_probe.PROBE_INTERVAL_S in ms, written out: the judge reaches this module and must reach
# nothing that starts a process (test_architecture), as loop_probe does. A test keeps them equal.
LOOP_PROBE_INTERVAL_MS = 2.0
# A hold touches a moment up to this long after the probe's callback ran: the reads the loop
# took up in the same turn as that callback may have joined what arrived meanwhile.
HOLD_SLACK_MS = 0.5
_HOLD_SLACK_NS = int(HOLD_SLACK_MS * _NS_PER_MS)
# A stall: a true gap at least this long and this many times the request's own time per token.
STALL_MIN_MS = 10.0
STALL_FACTOR = 10.0
# A figure whose stamps a hold may have moved is kept where that most they could be off is within
# this share of the figure itself: a 418 ms stall read across a 2 ms hold is the stall, a 2.5 ms
# gap across one is not. 1% is the accuracy the client is held to (benchmarks/shared_reads.py).
TRUE_WITHIN = 0.01
_PROBE_INTERVAL_NS = int(LOOP_PROBE_INTERVAL_MS * _NS_PER_MS)

# The per-request figures a request is sent for (metric_specs' REQUEST samples), in table order.
FIGURES: tuple[str, ...] = ("decode_tok_s", "itl_ms", "tpot_ms", "ttft_ms", "e2el_ms")


class Withheld(StrEnum):
    """Why one request gave no value of one figure."""

    FAILED = "failed"  # the request failed: it gives no figure at all
    NO_TOKEN = "no-token"  # no chunk carried a token
    ONE_TOKEN = "one-token"  # fewer than two output tokens: no decode, TPOT or gap
    CLIENT_HELD = "client-held"  # a stamp the figure rests on was taken while the client was held
    ONE_READ = "one-read"  # the server wrote every token in one read: no decode span


# The reasons that are the client's, as the JSON spells them; a reason a report of another
# version wrote ("first-read-shared", "burst" before reads were judged one by one) is not.
CLIENT_REASONS: frozenset[str] = frozenset({Withheld.CLIENT_HELD.value})


class Holds:
    """The stretches the client's loop may not have run (``perf_counter_ns`` pairs), merged; how
    late a stamp taken under one may be."""

    def __init__(self, stretches: Iterable[tuple[int, int]] = (), ran_ns: Iterable[int] = ()) -> None:
        # A late reading (due, ran) says the loop did not run from ``due``; it may not have run
        # since an interval before (the reading then due was on time, so the loop ran then or
        # later), unless a read shows it running after that: a loop busy parsing the read it just
        # took delays the next reading, and that read's own chunks were not joined by it.
        ran = sorted(ran_ns)
        merged: list[list[int]] = []
        for due, end in sorted(stretches):
            i = bisect.bisect_left(ran, due) - 1
            start = max(due - _PROBE_INTERVAL_NS, ran[i] if i >= 0 else due - _PROBE_INTERVAL_NS)
            end += _HOLD_SLACK_NS
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self._starts = [s for s, _ in merged]
        self._ends = [e for _, e in merged]

    def __bool__(self) -> bool:
        return bool(self._starts)

    def _covering(self, t_ns: int) -> int | None:
        i = bisect.bisect_right(self._starts, t_ns) - 1
        return i if i >= 0 and t_ns <= self._ends[i] else None

    def touch(self, t_ns: int) -> bool:
        """Whether a hold (with its slack) covers ``t_ns``."""
        return self._covering(t_ns) is not None

    def arrived_early_by_ns(self, t_ns: int, since_ns: int) -> int:
        """How much earlier than ``t_ns`` bytes stamped ``t_ns`` may have arrived, where a hold
        covering it may have joined them: back to the hold's start or ``since_ns`` (the stream's
        previous read), whichever is later; 0 where no hold covers ``t_ns``."""
        i = self._covering(t_ns)
        if i is None:
            return 0
        return max(0, t_ns - max(self._starts[i], since_ns))

    def held_after_ns(self, t_ns: int) -> int:
        """How long after ``t_ns`` a hold covering it may have lasted (0: none covers it)."""
        i = self._covering(t_ns)
        return 0 if i is None else self._ends[i] - t_ns


NO_HOLDS = Holds()


class Timeline(Protocol):
    """What this module reads of one request (results.RequestRecord is one)."""

    @property
    def ok(self) -> bool: ...

    @property
    def output_tokens(self) -> int: ...

    @property
    def t_send_ns(self) -> int: ...

    @property
    def send_done_ns(self) -> int: ...

    @property
    def chunk_ns(self) -> Sequence[int]: ...

    @property
    def chunk_read_ns(self) -> Sequence[int]: ...

    @property
    def chunk_tokens(self) -> Sequence[int]: ...

    @property
    def followed(self) -> Sequence[int]: ...


@dataclass(frozen=True)
class Stamps:
    """How far each stamp of one request may be from the truth, and how its chunks were read.

    ``early_ns[i]``: how much earlier than its stamp chunk ``i`` may have arrived (0: its stamp is
    its arrival); ``send_late_ns``: how much later than its stamp the request may have gone out."""

    send_late_ns: int
    early_ns: tuple[int, ...]
    # Reads of several chunks: joined by a hold of the client, or written together by the server.
    client_reads: int = 0
    server_reads: int = 0
    # The first and the last chunk came in one read.
    one_read: bool = False


def stamps(timeline: Timeline, holds: Holds = NO_HOLDS) -> Stamps:
    """How far each of ``timeline``'s stamps may be from the truth, given the client's ``holds``."""
    chunk_ns = timeline.chunk_ns
    n = len(chunk_ns)
    reads = timeline.chunk_read_ns if len(timeline.chunk_read_ns) == n else ()
    # A record without read times (made before they were kept) tells reads apart by their stamps.
    read_of = reads or chunk_ns
    followed = set(timeline.followed)
    early: list[int] = []
    previous_read_ns = timeline.t_send_ns
    for i, stamp in enumerate(chunk_ns):
        if i and read_of[i] != read_of[i - 1]:
            previous_read_ns = read_of[i - 1]
        fallback = bool(reads) and stamp == reads[i]
        # What follows the last token chunk (the usage chunk, [DONE]) the server writes as it
        # finishes that chunk: a read that joined them is late by the server's own gap between
        # them, so only later token chunks make a stamp the read's (counting them spoiled 9 of
        # 30 streams' last stamps on a loaded 2-core host).
        shared_after = i + 1 < n and (i in followed or read_of[i + 1] == read_of[i])
        early.append(holds.arrived_early_by_ns(stamp, previous_read_ns) if fallback or shared_after else 0)
    client_reads = server_reads = 0
    for _, group in itertools.groupby(range(n), key=lambda i: read_of[i]):
        members = list(group)
        if len(members) < 2:
            continue
        if any(early[i] for i in members):
            client_reads += 1
        else:
            server_reads += 1
    # The request went out between its stamp and the return of the call that sent it: a bound
    # that needs no hold (a loop busy sending is not a client held off); without it, the holds.
    done = timeline.send_done_ns
    send_late = max(0, done - timeline.t_send_ns) if done else holds.held_after_ns(timeline.t_send_ns)
    return Stamps(send_late_ns=send_late, early_ns=tuple(early),
                  client_reads=client_reads, server_reads=server_reads,
                  one_read=n >= 1 and read_of[0] == read_of[-1])


def _holds(span_ns: int, error_ns: int) -> bool:
    """Whether a figure over ``span_ns`` whose stamps may be ``error_ns`` off is true within
    ``TRUE_WITHIN`` of itself (an exact span always is, an empty one included)."""
    return error_ns == 0 or error_ns <= TRUE_WITHIN * abs(span_ns)


def true_gaps(timeline: Timeline, judged: Stamps) -> list[int]:
    """Which gaps (gap ``i``: chunk ``i`` to ``i + 1``) their stamps hold within ``TRUE_WITHIN``, in order."""
    chunk_ns, early = timeline.chunk_ns, judged.early_ns
    return [i for i in range(len(chunk_ns) - 1) if _holds(chunk_ns[i + 1] - chunk_ns[i], early[i] + early[i + 1])]


def true_gaps_ms(timeline: Timeline, judged: Stamps) -> list[float]:
    """The gaps between consecutive token chunks that their stamps hold within ``TRUE_WITHIN``, in order."""
    chunk_ns = timeline.chunk_ns
    return [(chunk_ns[i + 1] - chunk_ns[i]) / _NS_PER_MS for i in true_gaps(timeline, judged)]


def _decode_tokens(timeline: Timeline) -> int:
    counts = timeline.chunk_tokens
    return counts[-1] - counts[0] if counts else timeline.output_tokens - 1


def withheld(figure: str, timeline: Timeline, judged: Stamps) -> Withheld | None:
    """Why a request with this timeline and these stamps gives no value of ``figure`` (None: it gives one)."""
    if figure not in FIGURES:
        raise ValueError(f"{figure!r} is not a per-request figure; per-request figures: {', '.join(FIGURES)}")
    if not timeline.ok:
        return Withheld.FAILED
    chunk_ns = timeline.chunk_ns
    if not chunk_ns:
        return Withheld.NO_TOKEN
    early = judged.early_ns
    if figure in ("ttft_ms", "e2el_ms"):
        at = 0 if figure == "ttft_ms" else -1
        span = chunk_ns[at] - timeline.t_send_ns
        return None if _holds(span, judged.send_late_ns + early[at]) else Withheld.CLIENT_HELD
    if timeline.output_tokens < 2:
        return Withheld.ONE_TOKEN
    if figure == "itl_ms":
        if true_gaps_ms(timeline, judged):
            return None
        return Withheld.CLIENT_HELD if any(early) else Withheld.ONE_READ
    if not _holds(chunk_ns[-1] - chunk_ns[0], early[0] + early[-1]):
        return Withheld.CLIENT_HELD
    if judged.one_read or chunk_ns[-1] == chunk_ns[0] or _decode_tokens(timeline) < 1:
        return Withheld.ONE_READ
    return None


def stall_ms(timeline: Timeline, judged: Stamps) -> float | None:
    """The longest stall of the server in this stream: a true gap of at least ``STALL_MIN_MS``
    and ``STALL_FACTOR`` times the stream's own time per token (None: no stall, or no decode)."""
    if withheld("decode_tok_s", timeline, judged) is not None:
        return None
    per_token_ms = (timeline.chunk_ns[-1] - timeline.chunk_ns[0]) / _NS_PER_MS / _decode_tokens(timeline)
    floor_ms = max(STALL_MIN_MS, STALL_FACTOR * per_token_ms)
    stalls = [g for g in true_gaps_ms(timeline, judged) if g >= floor_ms]
    return max(stalls) if stalls else None


@dataclass(frozen=True)
class FigureCount:
    """One figure over a window: how many requests were sent, how many gave it, and why the rest
    did not (reason -> count)."""

    sent: int
    measured: int
    withheld: Mapping[str, int] = field(default_factory=dict)

    @property
    def lost_to_client(self) -> int:
        """Requests that lost this figure to the client's holds."""
        return sum(n for reason, n in self.withheld.items() if reason in CLIENT_REASONS)

    def to_json(self) -> dict[str, Any]:
        """``{"sent": .., "measured": .., "withheld": {reason: count}}``."""
        return {"sent": self.sent, "measured": self.measured, "withheld": dict(self.withheld)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FigureCount:
        """Inverse of :meth:`to_json`."""
        return cls(int(data["sent"]), int(data["measured"]),
                   {str(k): int(v) for k, v in (data.get("withheld") or {}).items()})


@dataclass(frozen=True)
class StreamShape:
    """What the streams showed of the server, as facts: its stalls, its reads of several chunks
    written together, and the tokens its chunks carried."""

    requests: int = 0  # valid requests
    stalled_requests: int = 0
    stall_ms: tuple[float, ...] = ()  # each stalled request's longest stall, in order
    written_together_requests: int = 0  # requests with a read of several chunks no hold touched
    one_read_requests: int = 0  # requests the server wrote whole in one read
    counted_requests: int = 0  # requests whose every chunk carried the running token count
    tokens_per_chunk_max: int | None = None  # over the counted requests (None: none counted)

    def to_json(self) -> dict[str, Any]:
        """The JSON report's ``measured.stream`` entry."""
        return {"requests": self.requests, "stalled_requests": self.stalled_requests, "stall_ms": list(self.stall_ms),
                "written_together_requests": self.written_together_requests,
                "one_read_requests": self.one_read_requests, "counted_requests": self.counted_requests,
                "tokens_per_chunk_max": self.tokens_per_chunk_max}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StreamShape:
        """Inverse of :meth:`to_json`."""
        return cls(int(data.get("requests") or 0), int(data.get("stalled_requests") or 0),
                   tuple(float(x) for x in data.get("stall_ms") or ()),
                   int(data.get("written_together_requests") or 0), int(data.get("one_read_requests") or 0),
                   int(data.get("counted_requests") or 0), data.get("tokens_per_chunk_max"))


@dataclass(frozen=True)
class Coverage:
    """A window's account of its requests, figure by figure, and of its inter-token gaps:
    ``gaps_measured`` joined the tail, ``gaps_client_held`` lost a stamp to the client's holds.
    ``client_held_requests`` had a read the client's hold could have joined; ``loop_max_ms`` is
    the probe's worst reading; ``stream`` what the streams showed of the server."""

    figures: Mapping[str, FigureCount]
    gaps_measured: int = 0
    gaps_client_held: int = 0
    client_held_requests: int = 0
    loop_max_ms: float | None = None
    stream: StreamShape = field(default_factory=StreamShape)

    def of(self, figure: str) -> FigureCount:
        """The count of one figure."""
        return self.figures[figure]

    def to_json(self) -> dict[str, Any]:
        """The JSON report's ``measured`` entry of a run."""
        return {
            "figures": {name: count.to_json() for name, count in self.figures.items()},
            "gaps_measured": self.gaps_measured, "gaps_client_held": self.gaps_client_held,
            "client_held_requests": self.client_held_requests, "loop_max_ms": self.loop_max_ms,
            "stream": self.stream.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Coverage:
        """Inverse of :meth:`to_json` (a report of an earlier version reads with its counts and
        no stream facts)."""
        return cls(
            figures={str(k): FigureCount.from_json(v) for k, v in (data.get("figures") or {}).items()},
            gaps_measured=int(data.get("gaps_measured") or 0),
            gaps_client_held=int(data.get("gaps_client_held") or 0),
            client_held_requests=int(data.get("client_held_requests") or 0),
            loop_max_ms=data.get("loop_max_ms"),
            stream=StreamShape.from_json(data.get("stream") or {}),
        )


def coverage(requests: Iterable[Timeline], holds: Holds = NO_HOLDS, loop_max_ms: float | None = None) -> Coverage:
    """The account of a window's requests, given the client's ``holds`` over the window and the
    probe's worst reading (None: not read)."""
    records = list(requests)
    judged = [stamps(r, holds) for r in records]
    counts = {}
    for figure in FIGURES:
        reasons = Counter(w for r, j in zip(records, judged, strict=True) if (w := withheld(figure, r, j)))
        counts[figure] = FigureCount(len(records), len(records) - sum(reasons.values()),
                                     {w.value: n for w, n in reasons.most_common()})
    valid = [(r, j) for r, j in zip(records, judged, strict=True) if r.ok]
    gaps = sum(len(true_gaps_ms(r, j)) for r, j in valid)
    all_gaps = sum(max(0, len(r.chunk_ns) - 1) for r, _ in valid)
    stalls = [s for r, j in valid if (s := stall_ms(r, j)) is not None]
    counted = [r for r, _ in valid if r.chunk_tokens]
    widest = max((b - a for r in counted for a, b in itertools.pairwise((0, *r.chunk_tokens))), default=None)
    shape = StreamShape(
        requests=len(valid), stalled_requests=len(stalls), stall_ms=tuple(round(s, 3) for s in stalls),
        written_together_requests=sum(1 for _, j in valid if j.server_reads),
        one_read_requests=sum(1 for r, j in valid if withheld("decode_tok_s", r, j) is Withheld.ONE_READ),
        counted_requests=len(counted), tokens_per_chunk_max=widest,
    )
    return Coverage(counts, gaps, all_gaps - gaps,
                    sum(1 for _, j in valid if j.client_reads or j.send_late_ns or any(j.early_ns)), loop_max_ms, shape)
