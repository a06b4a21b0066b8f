"""What the gate noticed and the floors it checked, as typed values: facts, never sentences.

Absolute checks: a median against a hard floor (the test fails) and a target (it warns).

The deployment's single-stream decode floor and target are checked here; relative verdicts
against a baseline are ``stats``.

What the gate noticed, as typed values: each note holds the facts, never a sentence.

The gate (``gate.judge``) fills a test's failures, warnings and notes with these values, and a
comparison (``stats.Comparison``) carries its own notes the same way; ``reports/sentences.py``
is the one place that turns them into the lines a user reads. Every note crosses xdist as JSON
(``to_json`` / :func:`note_from_json`), its kind first; a line a saved report kept as text is a
:class:`SavedLine`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
from dataclasses import dataclass
import enum
from enum import Enum
import math
from typing import Any, ClassVar, TypeVar

from pytest_kimiperf.numbers import is_real


class FloorStatus(str, Enum):
    """Where an absolute figure sits against its hard floor and its target."""

    BELOW_FLOOR = "below floor"
    BELOW_TARGET = "below target"
    OK = "ok"


@dataclass(frozen=True)
class FloorResult:
    """An absolute check of a higher-is-better median (e.g. decode tok/s) against floor/target."""

    label: str
    unit: str
    median: float
    floor: float | None
    target: float | None
    status: FloorStatus

    @property
    def failed(self) -> bool:
        """True below the floor: the test fails."""
        return self.status is FloorStatus.BELOW_FLOOR

    @property
    def warned(self) -> bool:
        """True above the floor but below the target: the test passes with a warning."""
        return self.status is FloorStatus.BELOW_TARGET


def floor_check(
    median: float, floor: float | None, target: float | None, unit: str, label: str
) -> FloorResult:
    """Check a higher-is-better median against an absolute floor (fail) and target (warn)."""
    if not is_real(median) or not math.isfinite(median):
        raise ValueError(f"{label} median {median!r} is not a finite number; nothing to check")
    for name, value in (("floor", floor), ("target", target)):
        if value is not None and (not is_real(value) or not math.isfinite(value) or value < 0):
            raise ValueError(f"{label} {name} {value!r}: use a finite number >= 0, or no {name}")
    if floor is not None and target is not None and floor > target:
        raise ValueError(
            f"{label} floor {floor!r} {unit} is above its target {target!r} {unit}: the floor is "
            "the hard minimum, the target what we aim for, so floor <= target"
        )
    if floor is not None and median < floor:
        status = FloorStatus.BELOW_FLOOR
    elif target is not None and median < target:
        status = FloorStatus.BELOW_TARGET
    else:
        status = FloorStatus.OK
    return FloorResult(
        label=label,
        unit=unit,
        median=float(median),
        floor=None if floor is None else float(floor),
        target=None if target is None else float(target),
        status=status,
    )


N = TypeVar("N", bound="Note")

_KINDS: dict[str, type[Note]] = {}


def note_kind(kind: str) -> Callable[[type[N]], type[N]]:
    """Register a note class under ``kind`` (its JSON tag)."""
    def register(cls: type[N]) -> type[N]:
        cls.kind = kind
        _KINDS[kind] = cls
        return cls
    return register


@dataclass(frozen=True)
class Note:
    """One thing the gate noticed. Subclasses are frozen dataclasses of plain facts."""

    kind: ClassVar[str] = ""
    # Fields that hold another value type: the function that decodes each from JSON.
    decoders: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}

    def to_json(self) -> dict[str, Any]:
        """JSON-able form, tagged with the kind."""
        return {"kind": self.kind, **{f.name: _encode(getattr(self, f.name)) for f in dataclasses.fields(self)}}

    @classmethod
    def from_fields(cls: type[N], data: Mapping[str, Any]) -> N:
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                raw = data[f.name]
                decode = cls.decoders.get(f.name)
                values[f.name] = decode(raw) if decode is not None and raw is not None else _decode(raw)
                if raw is None and isinstance(f.default, float) and math.isnan(f.default):
                    values[f.name] = math.nan  # JSON holds a number that is no number as null
        return cls(**values)


def _encode(value: Any) -> Any:
    if isinstance(value, Note):
        return value.to_json()
    if isinstance(value, enum.Enum):
        return value.value
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, FloorResult):
        return {"label": value.label, "unit": value.unit, "median": value.median, "floor": value.floor,
                "target": value.target, "status": value.status.value}
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, Mapping) and "kind" in value and value["kind"] in _KINDS:
        return note_from_json(value)
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    return value


def note_from_json(data: Mapping[str, Any] | str) -> Note:
    """Inverse of :meth:`Note.to_json`; a bare string (a line of a saved report) is a SavedLine."""
    if isinstance(data, str):
        return SavedLine(data)
    cls = _KINDS.get(str(data.get("kind")))
    if cls is None:
        raise ValueError(f"unknown note kind {data.get('kind')!r}; known: {', '.join(sorted(_KINDS))}")
    return cls.from_fields(data)


def notes_from_json(data: Any) -> list[Note]:
    """A list of notes from JSON (None: none)."""
    return [note_from_json(d) for d in data or []]


def _floor_from_json(data: Mapping[str, Any]) -> FloorResult:
    return FloorResult(label=str(data["label"]), unit=str(data["unit"]), median=float(data["median"]),
                       floor=data.get("floor"), target=data.get("target"), status=FloorStatus(data["status"]))


# --- lines from elsewhere -------------------------------------------------------------------

@note_kind("said")
@dataclass(frozen=True)
class SavedLine(Note):
    """A line as a saved report kept it (an older report's, before its note had a kind): shown as
    is, never read."""

    text: str


# --- what the measurement saw beside its figures --------------------------------------------

@note_kind("host-watched")
@dataclass(frozen=True)
class HostWatched(Note):
    """What the host watch read during the measured window of the last attempt.

    ``foreign_cpu_share`` and ``steal_share`` are fractions of the host's CPU; ``blind`` says
    why the CPU figures mean nothing there (then the shares are not shown); ``psi`` is each
    pressure-stall figure; ``nodes`` each watched node's foreign CPU share; ``nodes_here`` the
    nodes behind a launch template that are this machine; ``remarks`` what the watch's own
    readers said of the load itself (clock events the load caused, a PCIe link short of its
    best), which are part of the measurement and never a disturbance."""

    attempts: int
    foreign_cpu_share: float
    steal_share: float
    blind: tuple[str, ...] = ()
    psi: tuple[tuple[str, float], ...] = ()
    nodes: tuple[tuple[str, float], ...] = ()
    nodes_here: tuple[str, ...] = ()
    remarks: tuple[str, ...] = ()


@note_kind("measured-again")
@dataclass(frozen=True)
class MeasuredAgain(Note):
    """Attempts thrown out before the one measured: why each was (the host's disturbance, or the
    figure its reads would have spoiled and the evidence), in order."""

    reasons: tuple[str, ...]


@note_kind("prefix-cache-reused")
@dataclass(frozen=True)
class PrefixCacheReused(Note):
    """vLLM's prefix cache served whole blocks of a run whose prompts are unique: another
    request's prefill was reused, so TTFT and throughput do not measure a cold prefill.
    ``queried_tokens`` is 0 where the server did not count its queries."""

    hit_tokens: float
    queried_tokens: float


@note_kind("boots-booked")
@dataclass(frozen=True)
class BootsBooked(Note):
    """The profiles' comparison of ``metric`` (its label) is undecided at ``boots`` boots a
    profile, so the next boot of each profile in ``booked`` is booked, up to ``cap``."""

    metric: str
    boots: int
    booked: tuple[str, ...]
    cap: int


# --- where a spread came from --------------------------------------------------------------

@note_kind("spread-source")
@dataclass(frozen=True)
class SpreadSource(Note):
    """Where a spread came from, said beside it: ``how`` is one of the constants below, ``unit``
    the level ("boot", "session", "host"). ``declared`` and ``measured`` are spreads (fractions);
    ``count`` the units measured, ``within`` the sessions a corpus's boot level was measured in,
    ``sides`` the boots of the two sides a comparison measured it over; ``whole`` says a profile
    comparison's spread in whole percent."""

    how: str
    unit: str = "boot"
    declared: float | None = None
    measured: float | None = None
    df: float = 0.0
    count: int = 0
    within: int = 0
    sides: tuple[int, int] | None = None
    whole: bool = False

    MEASURED: ClassVar[str] = "measured"  # measured over ``count`` units (or the ``sides``)
    DECLARED: ClassVar[str] = "declared"  # the deployment's declared spread, taken as known
    FLOOR: ClassVar[str] = "floor"  # declared, above the ``measured`` spread of ``count`` units (or the ``sides``)
    SIDES: ClassVar[str] = "sides"  # a profile comparison's spread measured inside its sides
    NONE: ClassVar[str] = "none"  # not measurable: one unit per unit above


@dataclass(frozen=True)
class LevelSpread:
    """A level's spread as a comparison used it: the level, the spread (fraction), its source."""

    name: str
    spread: float
    source: SpreadSource

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "spread": self.spread, "source": self.source.to_json()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LevelSpread:
        return cls(str(data["name"]), float(data["spread"]), SpreadSource.from_fields(data["source"]))


@dataclass(frozen=True)
class SpreadSeen:
    """What a comparison's own boots measured of one ``level`` ("boot", "session", "host")
    against the deployment's declaration: the sum of squares of log-figures around their units'
    means on ``df`` degrees of freedom, over ``units`` boots (or sessions, hosts); the variance
    the declared spread allows each of them (``allowed_var``: the declared spread's, plus
    ``lower_var`` that the levels below add); and the ``declared`` spread (a fraction). The
    judge pools it with the declaration already; judge/noise.py asks whether it says the
    declaration is too small."""

    level: str
    sum_sq: float
    df: float
    allowed_var: float
    declared: float
    units: int
    lower_var: float = 0.0

    @property
    def measured(self) -> float:
        """The level's own spread as these units show it (a fraction): their mean square less
        what the levels below add."""
        return math.expm1(math.sqrt(max(self.sum_sq / self.df - self.lower_var, 0.0))) if self.df > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpreadSeen:
        return cls(str(data["level"]), float(data["sum_sq"]), float(data["df"]), float(data["allowed_var"]),
                   float(data["declared"]), int(data["units"]), float(data.get("lower_var") or 0.0))


def _levels_from_json(data: Any) -> tuple[LevelSpread, ...]:
    return tuple(LevelSpread.from_dict(d) for d in data)


# --- what a comparison says of itself -------------------------------------------------------

@note_kind("needs-boots")
@dataclass(frozen=True)
class NeedsBoots(Note):
    """The change is beyond the tolerance on fewer boots than a verdict needs."""

    boots: int


@note_kind("too-few-samples")
@dataclass(frozen=True)
class TooFewSamples(Note):
    """A boot has fewer valid samples than it needs: a tail needs more (``tail``), or failed
    requests left too few."""

    need: int
    have: int
    tail: bool


@note_kind("history-modes")
@dataclass(frozen=True)
class HistoryModes(Note):
    """The history holds two spawn modes (judge/noise.py); each boot was judged against its
    nearest. Centres are the modes' geometric means. Of this run's boots, ``unclear`` lay
    between the modes (judged both ways; ``disagree`` when the two readings gave different
    verdicts), ``worse`` of ``placed`` landed in the worse mode, which holds ``worse_share`` of
    the history: ``p`` is the chance of that many (modes.mode_frequency)."""

    low_boots: int
    low_center: float
    high_boots: int
    high_center: float
    unclear: int = 0
    disagree: bool = False
    worse: int = 0
    placed: int = 0
    worse_share: float = 0.0
    p: float = 1.0
    decided: str = ""  # "between" or "frequency": the note, not the figures, gave the verdict
    # Each current boot's mode ("worse", "better", "" between): this metric's own placing, or
    # (``joint``) the one the test's metrics whose histories split alike (``split``) agree on.
    boot_modes: tuple[str, ...] = ()
    split: str = ""
    joint: bool = False


@note_kind("history-step")
@dataclass(frozen=True)
class HistoryStep(Note):
    """The history's level moved and stayed (judge/history.py): ``change`` is the fraction
    between the means of the boots either side; ``before``/``after`` the recording times (and
    commits) of the last boot before the step and the first after it."""

    change: float
    z: float
    boots_before: int
    boots_after: int
    before: str
    before_commit: str
    after: str
    after_commit: str

    def plain(self) -> dict[str, Any]:
        """The step's fields without its kind: as the JSON report and ``history_steps --json`` hold it."""
        return {k: v for k, v in self.to_json().items() if k != "kind"}


@note_kind("history-steps")
@dataclass(frozen=True)
class HistorySteps(Note):
    """The history stepped; the run was judged against the ``judged_boots`` boots since the last step."""

    steps: tuple[HistoryStep, ...]
    judged_boots: int


@note_kind("declared-modes")
@dataclass(frozen=True)
class DeclaredModes(Note):
    """The deployment declares spawn modes, weighed by a profile comparison."""

    drop: float
    slow_share: float


@note_kind("boots-to-decide")
@dataclass(frozen=True)
class BootsToDecide(Note):
    """Boots a side that would decide a profile change this size (None: none up to
    ``max_boots``); ``have_them``: this run already had them, so the spread holds it back."""

    needed: int | None
    max_boots: int
    have_them: bool


@note_kind("boots-for-within")
@dataclass(frozen=True)
class BootsForWithin(Note):
    """Boots a side, booked up front, that would show a profile "within" the tolerance at the
    5% TOST with 90% power, were the change what these boots show (None: none up to
    ``max_boots``); ``have``: the boots a side this comparison had."""

    needed: int | None
    have: int
    max_boots: int


@note_kind("left-out")
@dataclass(frozen=True)
class LeftOut(Note):
    """A boot that failed for another reason than a verdict is no sample of this build."""

    boot: int
    reasons: tuple[Note, ...]


# --- what the gate says of a boot -----------------------------------------------------------

@note_kind("invalid")
@dataclass(frozen=True)
class InvalidRun(Note):
    """The measurement cannot be judged (a busy host, no valid request): its reason, and its
    cause (a measure.invalid_causes.InvalidCause value, '' where a report did not say), which
    decides the advice."""

    reason: str
    cause: str = ""


@note_kind("failed-requests")
@dataclass(frozen=True)
class FailedRequests(Note):
    """Requests that failed, by reason; ``limit`` is the share they exceeded (the test fails),
    None when they were few enough to only warn."""

    failed: int
    total: int
    reasons: tuple[tuple[str, int], ...]
    limit: float | None = None


@note_kind("goodput-slos")
@dataclass(frozen=True)
class GoodputSlos(Note):
    """The SLOs request goodput counts against."""

    limits: tuple[tuple[str, float], ...]


@note_kind("slo")
@dataclass(frozen=True)
class SloCheck(Note):
    """An absolute limit on this boot's figure: met, missed, or unchecked for too few samples."""

    metric: str
    label: str  # the metric's label
    limit: float
    unit: str
    lower_is_better: bool
    status: str  # "met", "missed" or "unchecked"
    median: float
    n: int
    needed: int

    MET: ClassVar[str] = "met"
    MISSED: ClassVar[str] = "missed"
    UNCHECKED: ClassVar[str] = "unchecked"


@note_kind("floor")
@dataclass(frozen=True)
class FloorNote(Note):
    """The single-stream decode median against the deployment's floor and target."""

    floor: FloorResult

    decoders: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"floor": _floor_from_json}


@note_kind("no-decode")
@dataclass(frozen=True)
class NoDecode(Note):
    """No request measured single-stream decode, so the floor could not be checked: of ``sent``
    requests, why each gave none (measure.coverage.Withheld value -> count; empty in a report
    written before the plugin counted them)."""

    sent: int = 0
    withheld: tuple[tuple[str, int], ...] = ()


@note_kind("boot-planned")
@dataclass(frozen=True)
class BootPlanned(Note):
    """A planned boot that is not the last: the verdict waits for the last one."""

    boot: int
    boots: int


@dataclass(frozen=True)
class ChangeSoFar:
    """What one metric looks like on the boots so far, short of a verdict."""

    metric: str
    change: float
    boots: int
    tolerance: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _changes_so_far_from_json(data: Any) -> tuple[ChangeSoFar, ...]:
    return tuple(ChangeSoFar(str(d["metric"]), float(d["change"]), int(d["boots"]), float(d["tolerance"])) for d in data)


@note_kind("boot-asked")
@dataclass(frozen=True)
class BootAsked(Note):
    """A boot that looks worse than the tolerance asks for another of its profile."""

    profile: str
    boot: int
    looks: tuple[ChangeSoFar, ...]

    decoders: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"looks": _changes_so_far_from_json}


@note_kind("unresolved")
@dataclass(frozen=True)
class Unresolved(Note):
    """A change beyond the tolerance on the one boot of an attached server this run cannot
    restart: it can never be convicted here (the test fails as UNRESOLVED)."""

    looks: tuple[ChangeSoFar, ...]
    deployment: str
    boots_needed: int

    decoders: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"looks": _changes_so_far_from_json}


@note_kind("drifted")
@dataclass(frozen=True)
class Drifted(Note):
    """A history grown by passing runs (``--kimiperf-append-on-pass``) has drifted beyond the
    tolerance since its anchor, the last deliberate recording (judge/history.py): ``change`` the
    cumulative change the line through the nights gives (negative is worse), ``bound`` its bound
    in the build's favour, over ``nights`` runs since the anchor recorded ``anchor_at``."""

    metric: str
    label: str
    change: float
    bound: float
    nights: int
    tolerance: float
    anchor_at: str


@note_kind("soft-fingerprint")
@dataclass(frozen=True)
class SoftFingerprint(Note):
    """Soft facts that differ from the baseline's, each ``name: old -> new``: they only warn."""

    changes: tuple[str, ...]


@note_kind("plan")
@dataclass(frozen=True)
class ResolvePlan(Note):
    """What would resolve a change of ``goal`` (judge/noise.py): ``boots`` of this profile
    against the baseline's; or (``boots`` None) ``sessions`` of it where the session and host
    ``levels`` stand in the way; or, with neither, a wider tolerance (``levels`` set) or more
    baseline boots."""

    goal: float
    spread: float
    boots_reference: int
    boots: int | None = None
    sessions: int | None = None
    levels: tuple[LevelSpread, ...] = ()
    boots_per_session: int = 2
    max_sessions: int = 100

    decoders: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"levels": _levels_from_json}
