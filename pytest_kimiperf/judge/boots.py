"""Boots, the unit of replication: each boot's figure per metric, their schedule, what each test measured.

* :class:`BootSummary` (``summarize_metric``, ``summarize_boot``, ``summarize_boot_quantile``):
  one server boot's figure for one metric, the unit the gate compares. A boot is summarized once
  per metric: its median, or its quantile for a tail metric, with the standard error of that
  figure's log from the boot's own samples, and how many samples it rests on (a boot with too
  few does not count). Comparing boots is ``stats``.
* :func:`schedule` and :class:`BootSlot`: each NCCL profile is booted up to ``max_boots`` times
  in one session. The first ``boots`` are planned (``--kimiperf-boots``); the rest happen on
  demand, only for the tests whose comparison asked for another boot
  (``power.wants_another_boot``). Boots of several profiles run interleaved, A B B A ... (each
  round reverses the last, so a linear drift over the session falls equally on every profile;
  Abedi & Brecht, ICPE 2017, randomized multiple interleaved trials), or in a seeded random
  order per round; never A A B B.
* :class:`TestBoots` and :class:`BootLedger`: what each test measured under each profile, boot
  by boot (with each boot's two clocks, :class:`EngineBoot`), and whether it wants another.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, MutableSequence, Sequence
import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from pytest_kimiperf.config.metric_specs import MIN_SAMPLES_PER_BOOT, SampleKind, metric_spec

# One boot's figure per metric: its median or tail quantile, and that figure's standard error.
Samples = Sequence[float] | npt.NDArray[np.floating]

# A tail quantile q needs this many samples beyond it in each boot: n >= 3 / (1 - q), so 30 for
# a p90, 300 for a p99 (ITL pools every gap of a boot, so 20 requests of 128 tokens are 2540).
_TAIL_SAMPLES_BEYOND = 3
_TAIL_BOOTSTRAP = 200
# Asymptotic standard error of a sample median is sqrt(pi/2) ~ 1.2533 times that of the mean
# for normal data; 1.4826 * MAD estimates the standard deviation robustly (outliers do not
# widen it).
_MEDIAN_SE_FACTOR = 1.2533
_MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class EngineBoot:
    """One boot's two clocks over the same requests: the engine's mean time per output token and
    its queue plus prefill (ms, from its histograms), the client's mean TPOT and TTFT over the
    measured requests (ms), the requests and decode tokens the engine's figures rest on, and the
    vLLM version whose metric names they were read under."""

    engine_tpot_ms: float | None = None
    engine_ttft_ms: float | None = None
    client_tpot_ms: float | None = None
    client_ttft_ms: float | None = None
    requests: float | None = None
    tokens: float | None = None
    vllm: str = ""

    def pair(self, figure: str) -> tuple[float, float] | None:
        """(client, engine) milliseconds of ``figure`` ("tpot" or "ttft"), None where either is missing."""
        client, engine = ((self.client_tpot_ms, self.engine_tpot_ms) if figure == "tpot"
                          else (self.client_ttft_ms, self.engine_ttft_ms))
        if client is None or engine is None or not (math.isfinite(client) and math.isfinite(engine)):
            return None
        return float(client), float(engine)

    @property
    def has_engine(self) -> bool:
        """Whether the engine exported either figure for this boot."""
        return self.engine_tpot_ms is not None or self.engine_ttft_ms is not None

    def to_json(self) -> dict[str, Any]:
        """The fields a baseline boot stores (None where not known)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineBoot:
        """Inverse of :meth:`to_json`; TypeError/ValueError on a field of the wrong type."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = data.get(f.name)
            if f.name == "vllm":
                if raw is not None and not isinstance(raw, str):
                    raise TypeError("vllm must be a string")
                values[f.name] = raw or ""
            elif raw is None:
                values[f.name] = None
            elif isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
                raise ValueError(f"{f.name} must be a number or null")
            else:
                values[f.name] = float(raw)
        return cls(**values)

    @classmethod
    def of_run(cls, view: Mapping[str, Any] | None, *, client_tpot_ms: float | None,
               client_ttft_ms: float | None, vllm: str = "") -> EngineBoot | None:
        """A boot's two clocks from its server view's JSON (measure/server_view.py) and the
        client's means; None where the server exported no engine figure."""
        if not view:
            return None
        boot = cls(_number(view.get("engine_tpot_ms")), _number(view.get("engine_ttft_ms")), client_tpot_ms,
                   client_ttft_ms, _number(view.get("engine_requests")), _number(view.get("engine_tokens")), vllm)
        return boot if boot.has_engine else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class BootSummary:
    """One server boot's figure for one metric: the unit of replication.

    ``median`` is the boot's median; ``se_log`` the standard error of log(median) from the
    boot's own requests (NaN below two samples); ``n`` how many valid samples it rests on;
    ``label`` says which boot it was (``ring-ll boot 2``, or a baseline's recording time).
    """

    median: float
    n: int
    se_log: float
    label: str = ""
    # Samples a boot needs to count: MIN_SAMPLES_PER_BOOT for a median (0 here), more for a tail
    # (tail_min_samples; ``median`` then holds the boot's quantile), 1 for a boot metric (the
    # boot's own seconds: one exact figure per boot).
    min_n: int = 0
    # The session and host the boot ran in (judge/levels.py); "" when not known (a boot recorded
    # before they were stored counts as one unknown session and host).
    session: str = ""
    host: str = ""
    # The commit a stored boot was recorded at ("" when not known): where a history stepped.
    commit: str = ""

    @property
    def needed(self) -> int:
        """Samples this boot needs to count: ``min_n`` where the metric sets it (a tail's more,
        a boot metric's one), else MIN_SAMPLES_PER_BOOT."""
        return self.min_n or MIN_SAMPLES_PER_BOOT

    @property
    def usable(self) -> bool:
        """Whether this boot has enough valid samples to stand for its server boot."""
        return self.n >= self.needed and math.isfinite(self.median) and self.median > 0

    def to_json(self) -> dict[str, object]:
        """JSON-ready fields (NaN as None)."""
        return {"median": self.median, "n": self.n,
                "se_log": None if not math.isfinite(self.se_log) else self.se_log, "label": self.label,
                "min_n": self.min_n, "session": self.session, "host": self.host, "commit": self.commit}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BootSummary:
        """Inverse of :meth:`to_json`."""
        se = data.get("se_log")
        return cls(median=float(data["median"]), n=int(data["n"]),
                   se_log=math.nan if se is None else float(se), label=str(data.get("label") or ""),
                   min_n=int(data.get("min_n") or 0),
                   session=str(data.get("session") or ""), host=str(data.get("host") or ""),
                   commit=str(data.get("commit") or ""))


def summarize_boot(samples: Samples, label: str = "") -> BootSummary:
    """Summarize one boot's per-request samples of one metric (non-finite ones dropped)."""
    values = _valid_samples("boot", samples)
    positive = values[values > 0]
    if values.size == 0:
        return BootSummary(median=math.nan, n=0, se_log=math.nan, label=label)
    median = float(np.median(values))
    se = math.nan
    if positive.size >= 2:
        logs = np.log(positive)
        mad = float(np.median(np.abs(logs - np.median(logs))))
        se = _MEDIAN_SE_FACTOR * _MAD_TO_SD * mad / math.sqrt(positive.size)
    return BootSummary(median=median, n=int(values.size), se_log=se, label=label)


def tail_min_samples(quantile: float) -> int:
    """Samples one boot needs before its ``quantile`` means anything: at least
    :data:`_TAIL_SAMPLES_BEYOND` of them beyond it (a p99 of 20 requests is their maximum,
    one slow request's luck; MLPerf LoadGen's early stopping makes the same point)."""
    return math.ceil(_TAIL_SAMPLES_BEYOND / (1.0 - quantile) - 1e-9)


def summarize_boot_quantile(samples: Samples, quantile: float, label: str = "") -> BootSummary:
    """One boot's ``quantile`` (e.g. 0.99) of a metric, with the standard error of its log
    from a seeded bootstrap of the boot's own samples."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile={quantile!r}: use a fraction between 0 and 1 (0.99 for p99)")
    values = _valid_samples("boot", samples)
    min_n = tail_min_samples(quantile)
    if values.size == 0:
        return BootSummary(median=math.nan, n=0, se_log=math.nan, label=label, min_n=min_n)
    value = float(np.quantile(values, quantile))
    se = math.nan
    positive = values[values > 0]
    if positive.size >= 2:
        rng = np.random.default_rng(0)
        draws = rng.choice(np.log(positive), size=(_TAIL_BOOTSTRAP, positive.size), replace=True)
        se = float(np.std(np.quantile(draws, quantile, axis=1), ddof=1))
    return BootSummary(median=value, n=int(values.size), se_log=se, label=label, min_n=min_n)


def summarize_metric(metric: str, samples: Samples, label: str = "") -> BootSummary:
    """One boot's figure of ``metric`` as its spec says: the median, a tail's quantile, or a
    boot metric's one sample."""
    spec = metric_spec(metric)
    if spec.quantile is not None:
        return summarize_boot_quantile(samples, spec.quantile, label)
    summary = summarize_boot(samples, label)
    return replace(summary, min_n=1) if spec.sample is SampleKind.BOOT else summary


def min_samples(metric: str) -> int:
    """The ``min_n`` a stored boot of ``metric`` carries (0: the median's default)."""
    spec = metric_spec(metric)
    if spec.quantile is not None:
        return tail_min_samples(spec.quantile)
    return 1 if spec.sample is SampleKind.BOOT else 0


def _valid_samples(side: str, samples: Samples) -> npt.NDArray[np.float64]:
    """The finite samples of one side as an array; ValueError for non-numbers or negative values."""
    try:
        arr = np.asarray(samples, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{side} samples must be numbers: {exc}") from None
    if arr.ndim != 1:
        raise ValueError(f"{side} samples must be a flat sequence of numbers, got shape {arr.shape}")
    finite: npt.NDArray[np.float64] = arr[np.isfinite(arr)]
    negative = finite[finite < 0]
    if negative.size:
        raise ValueError(
            f"{side} samples include negative value {float(negative[0])!r}: tok/s, req/s and ms "
            "are never negative, so the measurement is broken"
        )
    return finite


# The session's boots: their order, and what each test measured on them.
_BOOT_ID_SEPARATOR = "-boot"
T = TypeVar("T")


@dataclass(frozen=True)
class BootSlot:
    """One boot of one profile: the value the server tests are parametrized with."""

    profile: Any  # NcclProfile
    boot: int

    @property
    def name(self) -> str:
        """The profile's name (what reports and baselines are keyed by)."""
        return str(self.profile.name)

    @property
    def id(self) -> str:
        """The parameter id: ``ring-ll`` for the first boot, ``ring-ll-boot2`` for the second."""
        return self.name if self.boot == 1 else f"{self.name}{_BOOT_ID_SEPARATOR}{self.boot}"

    def __repr__(self) -> str:
        return f"BootSlot({self.id})"


def schedule(profiles: Sequence[Any], max_boots: int, *, order: str = "interleaved", seed: int = 0) -> list[BootSlot]:
    """Every slot of the session in the order the boots happen."""
    rng = random.Random(f"kimiperf-boot-order:{seed}")
    slots: list[BootSlot] = []
    names = list(profiles)
    for boot in range(1, max_boots + 1):
        if order == "random":
            round_order = names[:]
            rng.shuffle(round_order)
        else:
            round_order = names if boot % 2 == 1 else names[::-1]
        slots += [BootSlot(p, boot) for p in round_order]
    return slots


def group_by_slot(items: MutableSequence[T], slot_of: Callable[[T], BootSlot | None],
                  order: Sequence[BootSlot]) -> None:
    """Reorder ``items`` in place so each boot slot's items run together, slots in ``order``
    (the schedule's A B B A ...); within a slot, and for every item without one, the order
    stays as it was (pytest boots a session fixture again whenever its parameter changes back,
    and for Kimi each boot is a 36-minute load)."""
    rank = {slot.id: i for i, slot in enumerate(order)}
    placed = [(i, slot) for i, slot in ((i, slot_of(item)) for i, item in enumerate(items)) if slot is not None]
    grouped = [items[i] for i, slot in sorted(placed, key=lambda p: rank.get(p[1].id, 0))]  # stable
    for (i, _), item in zip(placed, grouped):
        items[i] = item


@dataclass
class TestBoots:
    """What one test measured under one profile, boot by boot, and whether it wants another."""

    summaries: dict[str, list[BootSummary]] = field(default_factory=dict)  # metric -> per boot
    boots: list[int] = field(default_factory=list)
    wants_boot: int | None = None  # the next boot this test asked for
    engine: dict[int, EngineBoot] = field(default_factory=dict)  # boot -> its two clocks, where it had them

    def add(self, boot: int, per_metric: dict[str, BootSummary]) -> None:
        """Record one boot's summaries (a boot measured twice keeps the last)."""
        if boot in self.boots:
            index = self.boots.index(boot)
            for metric, summary in per_metric.items():
                self.summaries.setdefault(metric, [])[index:index + 1] = [summary]
            return
        self.boots.append(boot)
        for metric, summary in per_metric.items():
            self.summaries.setdefault(metric, []).append(summary)


class BootLedger:
    """Per (test, profile): the boots measured so far; lives in the process that runs them."""

    def __init__(self) -> None:
        self._tests: dict[tuple[str, str], TestBoots] = {}

    def of(self, test: str, profile: str) -> TestBoots:
        """The (possibly new) record of ``test`` under ``profile``."""
        return self._tests.setdefault((test, profile), TestBoots())

    def needed(self, test: str, slot: BootSlot, planned: int) -> tuple[bool, str]:
        """Whether ``test`` runs in ``slot``, and why not when it does not."""
        if slot.boot <= planned:
            return True, ""
        record = self._tests.get((test, slot.name))
        if record is not None and record.wants_boot is not None and record.wants_boot >= slot.boot:
            return True, ""
        last = max(record.boots) if record is not None and record.boots else None
        why = ("boot {b} of {p} not needed: boot {last} settled this test" if last is not None else
               "boot {b} of {p} not needed: no earlier boot of this test was measured")
        return False, why.format(b=slot.boot, p=slot.name, last=last)


def strip_slot(nodeid: str, slot_id: str) -> str:
    """The node id without the slot's part of the parameter id, other parameters kept.

    ``test_tp.py::test_out[ring-ll-boot2-8]`` -> ``test_tp.py::test_out[8]``: baselines,
    boot records and profile comparisons are keyed by it, so each concurrency keeps its own.
    """
    base, _, params = nodeid.partition("[")
    params = params.removesuffix("]")
    if params in ("", slot_id):
        return base
    if params.startswith(f"{slot_id}-"):
        rest = params[len(slot_id) + 1:]
    elif params.endswith(f"-{slot_id}"):
        rest = params[: -len(slot_id) - 1]
    else:
        rest = params.replace(f"-{slot_id}-", "-", 1)
    return f"{base}[{rest}]"
