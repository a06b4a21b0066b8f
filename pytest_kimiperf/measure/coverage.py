"""What a run measured of what it sent, figure by figure (pure: no I/O, no pytest).

A request sent in a measured window gives each per-request figure it was sent for, or a reason
why not (:class:`Withheld`); this module reads the reasons from the request's own timeline, so
that no figure is ever dropped in silence and none is kept whose stamps do not hold.

**Shared reads.** The client stamps every read with the kernel's receive time of its bytes
(``connection.py``: ``SO_TIMESTAMPNS``); for TCP that is the arrival of the *last* segment the
read returned (``tcp_recvmsg`` keeps the last skb's stamp). Every chunk of one read gets that
stamp, so equal neighbouring stamps in a request's ``chunk_ns`` mark chunks that came in one
read. Two things cause it: the client was held off the CPU while chunks queued in its socket (the
loop probe saw it late), or the server wrote them in one send (a starved API server, a buffering
proxy). Either way:

* the last chunk of a read carries its own arrival: its stamp is true;
* every earlier chunk of that read arrived before its stamp: its stamp is late.

So, figure by figure:

* a gap between two chunks is the server's gap only where the later chunk ends its read and the
  two stamps differ (:func:`measured_gaps_ms`); the others stay out of the ITL tail and are
  counted (``gaps_in_shared_reads``);
* TTFT rests on the first stamp: withheld when the first chunk shared its read (its stamp is the
  read's, up to a whole stall late);
* decode and TPOT rest on the first and last stamps: withheld when the first chunk shared its
  read, and when fewer than half of the stream's gaps were measured (it came in bursts: the
  figure would measure the burst, not the decode);
* a request's ``itl_ms`` sample is the median of its measured gaps, under the same burst rule;
* E2EL rests on the last stamp, which is true: kept.

**Who held the stream** (:func:`shared_reads_holder`). A client held off for a while reads, when it runs
again, the chunks that arrived meanwhile: one read joins at most the chunks of that long. The loop
probe's worst latency bounds how long the client was held (its callback was due within one probe
interval of the hold's start). So the client is the likely holder only when its loop ran late by
a gap of the server's pace *and* no read joined more of that pace than the lateness can hold; a
read that joined a stream written over 37.5 ms while the loop was never 8 ms late was written
together by the server, whatever else the host did (on a busy 2-core host the loop's worst
lateness over a window reached the 2.5 ms gap of make test's stub in 8 of 10 runs, and a window
max alone then named the client for a server's bursts). A window with both says server: that is
the proven part; a late loop is judged as such (``results.RunResult.invalid``).

**Over-the-wire timing.** Over HTTPS a read is stamped in the event loop (``timing`` is
``event-loop``), where a lone read is as late as the loop: the loop-latency bound judges those
runs (``results.RunResult.invalid``) and this module's rules apply to them unchanged.
"""

from __future__ import annotations

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

# The per-request figures a request is sent for (metric_specs' REQUEST samples), in table order.
FIGURES: tuple[str, ...] = ("decode_tok_s", "itl_ms", "tpot_ms", "ttft_ms", "e2el_ms")


class Withheld(StrEnum):
    """Why one request gave no value of one figure."""

    FAILED = "failed"  # the request failed: it gives no figure at all
    NO_TOKEN = "no-token"  # no chunk carried a token
    ONE_TOKEN = "one-token"  # fewer than two output tokens: no decode, TPOT or gap
    FIRST_READ_SHARED = "first-read-shared"  # the first chunk came in one read with the next
    BURST = "burst"  # most of the stream came in shared reads: the figure would measure a burst
    GAP_IN_SHARED_READ = "gap-in-shared-read"  # a gap (of the ITL tail) whose later chunk shared its read

    @property
    def by_reads(self) -> bool:
        """A loss to the way chunks arrived, not to the request or the workload."""
        return self in (Withheld.FIRST_READ_SHARED, Withheld.BURST, Withheld.GAP_IN_SHARED_READ)


def read_ends(chunk_ns: Sequence[int]) -> list[bool]:
    """For each chunk, whether it ended its read (its stamp is its own arrival)."""
    return [i == len(chunk_ns) - 1 or chunk_ns[i + 1] != chunk_ns[i] for i in range(len(chunk_ns))]


def measured_gaps_ms(chunk_ns: Sequence[int]) -> list[float]:
    """The gaps whose two stamps hold: the stamps differ and the later chunk ended its read."""
    ends = read_ends(chunk_ns)
    return [(b - a) / _NS_PER_MS for i, (a, b) in enumerate(itertools.pairwise(chunk_ns))
            if b != a and ends[i + 1]]


def first_read_shared(chunk_ns: Sequence[int]) -> bool:
    """Whether the first chunk came in one read with the next (its stamp is late)."""
    return len(chunk_ns) >= 2 and chunk_ns[0] == chunk_ns[1]


def shared_chunks(chunk_ns: Sequence[int]) -> int:
    """How many chunks came in a read with another."""
    return sum(1 for i, t in enumerate(chunk_ns)
               if (i > 0 and chunk_ns[i - 1] == t) or (i + 1 < len(chunk_ns) and chunk_ns[i + 1] == t))


def withheld(figure: str, *, ok: bool, output_tokens: int, chunk_ns: Sequence[int]) -> Withheld | None:
    """Why a request with this timeline gives no value of ``figure`` (None: it gives one)."""
    if figure not in FIGURES:
        raise ValueError(f"{figure!r} is not a per-request figure; per-request figures: {', '.join(FIGURES)}")
    if not ok:
        return Withheld.FAILED
    if not chunk_ns:
        return Withheld.NO_TOKEN
    if figure == "e2el_ms":
        return None
    if figure == "ttft_ms":
        return Withheld.FIRST_READ_SHARED if first_read_shared(chunk_ns) else None
    if output_tokens < 2:
        return Withheld.ONE_TOKEN
    gaps = len(chunk_ns) - 1
    if gaps == 0 or chunk_ns[-1] == chunk_ns[0]:
        return Withheld.BURST  # every token in one chunk or one read
    if figure != "itl_ms" and first_read_shared(chunk_ns):
        return Withheld.FIRST_READ_SHARED
    if 2 * len(measured_gaps_ms(chunk_ns)) < gaps:
        return Withheld.BURST
    return None


@dataclass(frozen=True)
class FigureCount:
    """One figure over a window: how many requests were sent, how many gave it, and why the rest
    did not (reason -> count)."""

    sent: int
    measured: int
    withheld: Mapping[str, int] = field(default_factory=dict)

    @property
    def lost_to_reads(self) -> int:
        """Requests that lost this figure to the way their chunks arrived."""
        return sum(n for reason, n in self.withheld.items() if Withheld(reason).by_reads)

    def to_json(self) -> dict[str, Any]:
        """``{"sent": .., "measured": .., "withheld": {reason: count}}``."""
        return {"sent": self.sent, "measured": self.measured, "withheld": dict(self.withheld)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FigureCount:
        """Inverse of :meth:`to_json`."""
        return cls(int(data["sent"]), int(data["measured"]),
                   {str(k): int(v) for k, v in (data.get("withheld") or {}).items()})


class HeldBy(StrEnum):
    """Who held the stream, where chunks came in shared reads."""

    CLIENT = "client"  # the client's loop ran late by at least a token gap: chunks queued in its socket
    SERVER = "server"  # the client's loop was on time: the server wrote the chunks together


@dataclass(frozen=True)
class Coverage:
    """A window's account of its requests, figure by figure, and of its inter-token gaps:
    ``gaps_measured`` joined the tail, ``gaps_in_shared_reads`` did not. ``held_by`` says who
    held the stream where reads were shared (None: no read was shared), on the evidence of the
    loop probe's worst latency (``loop_max_ms``) against the window's median measured gap and
    its widest shared read (:func:`shared_reads_holder`)."""

    figures: Mapping[str, FigureCount]
    gaps_measured: int = 0
    gaps_in_shared_reads: int = 0
    shared_read_requests: int = 0
    held_by: HeldBy | None = None
    loop_max_ms: float | None = None

    def of(self, figure: str) -> FigureCount:
        """The count of one figure."""
        return self.figures[figure]

    def to_json(self) -> dict[str, Any]:
        """The JSON report's ``measured`` entry of a run."""
        return {
            "figures": {name: count.to_json() for name, count in self.figures.items()},
            "gaps_measured": self.gaps_measured, "gaps_in_shared_reads": self.gaps_in_shared_reads,
            "shared_read_requests": self.shared_read_requests,
            "held_by": None if self.held_by is None else self.held_by.value, "loop_max_ms": self.loop_max_ms,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Coverage:
        """Inverse of :meth:`to_json`."""
        held = data.get("held_by")
        return cls(
            figures={str(k): FigureCount.from_json(v) for k, v in (data.get("figures") or {}).items()},
            gaps_measured=int(data.get("gaps_measured") or 0),
            gaps_in_shared_reads=int(data.get("gaps_in_shared_reads") or 0),
            shared_read_requests=int(data.get("shared_read_requests") or 0),
            held_by=None if held is None else HeldBy(held), loop_max_ms=data.get("loop_max_ms"),
        )


class Timeline(Protocol):
    """What this module reads of one request (results.RequestRecord is one)."""

    @property
    def ok(self) -> bool: ...

    @property
    def output_tokens(self) -> int: ...

    @property
    def chunk_ns(self) -> Sequence[int]: ...


def widest_read(chunk_ns: Sequence[int]) -> int:
    """The most gaps one read joined (0: every chunk came in a read of its own)."""
    return max((len(list(run)) - 1 for _, run in itertools.groupby(chunk_ns)), default=0)


def shared_reads_holder(*, widest_read_gaps: int, typical_gap_ms: float, loop_max_ms: float | None) -> HeldBy:
    """Who held a window's shared reads: the client only if its loop ran late by a typical gap and
    that lateness (with a probe interval and a gap to spare) spans the widest read's joined gaps."""
    if loop_max_ms is None or loop_max_ms < typical_gap_ms:
        return HeldBy.SERVER
    reach_ms = loop_max_ms + LOOP_PROBE_INTERVAL_MS + typical_gap_ms
    return HeldBy.CLIENT if widest_read_gaps * typical_gap_ms <= reach_ms else HeldBy.SERVER


def coverage(requests: Iterable[Timeline], loop_latency_ms: Sequence[float]) -> Coverage:
    """The account of a window's requests; ``loop_latency_ms`` is every reading of the client's
    loop probe over the window (empty: not read)."""
    records = list(requests)
    counts = {}
    for figure in FIGURES:
        reasons = Counter(w for r in records
                          if (w := withheld(figure, ok=r.ok, output_tokens=r.output_tokens, chunk_ns=r.chunk_ns)))
        counts[figure] = FigureCount(len(records), len(records) - sum(reasons.values()),
                                     {w.value: n for w, n in reasons.most_common()})
    valid = [r for r in records if r.ok]
    gaps = [g for r in valid for g in measured_gaps_ms(r.chunk_ns)]
    in_shared = sum(max(0, len(r.chunk_ns) - 1) for r in valid) - len(gaps)
    shared = sum(1 for r in valid if shared_chunks(r.chunk_ns))
    loop_max = max(loop_latency_ms) if loop_latency_ms else None
    held = None
    if shared:
        typical_gap = sorted(gaps)[len(gaps) // 2] if gaps else 0.0
        widest = max(widest_read(r.chunk_ns) for r in valid)
        held = shared_reads_holder(widest_read_gaps=widest, typical_gap_ms=typical_gap, loop_max_ms=loop_max)
    return Coverage(counts, len(gaps), in_shared, shared, held, loop_max)
