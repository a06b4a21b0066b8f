"""Baselines as values: the machine a measurement was taken on (its fingerprint), the boot
histories a run is judged against, and how a run's boots join them.

A :class:`Fingerprint` composes the probes of measure/host_facts.py. *Hard* facts change the speed
a benchmark can reach (GPU model, count, memory, driver major, CUDA, PCIe, NVLink-or-not; on a CPU
host the CPU model, usable cores and vector ISA; the vLLM, torch and NCCL versions; the
deployment): a baseline only compares with a run whose hard facts are equal, and the ``key`` is a
hash of them. *Soft* facts (host name, full driver build, kernel, Python) only warn.

A baseline file (``baselines/<deployment>/<fingerprint key>.json``, read and written by
storage/baselines.py) holds, for each ``<test id>|<profile>|<metric>``, a history of the last
:data:`HISTORY_BOOTS` boots (:class:`BaselineEntry` of :class:`BaselineBoot`: the boot is the unit
the gate judges on), plus the latest boot's per-request samples for plots. The judge receives
these types, never the file's text (:class:`LoadedBaselines`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
import hashlib
import json
import math
from pathlib import Path
import re
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np

from pytest_kimiperf.config.metric_specs import Direction, METRICS
from pytest_kimiperf.config.names import UNKNOWN
from pytest_kimiperf.config.nodes import Node, NodeFacts
from pytest_kimiperf.errors import BaselineError, ConfigError
from pytest_kimiperf.judge.engine_clock import engine_boot_of
from pytest_kimiperf.judge.noise import BootOrigin
from pytest_kimiperf.judge.stats import (
    BootSummary, EngineBoot, VerdictKind, min_samples, summarize_boot, summarize_metric,
)
from pytest_kimiperf.judge.verdicts import MetricResult, TestResult

if TYPE_CHECKING:
    from pytest_kimiperf.config.deployments import Deployment


_KEY_HASH_HEX = 12
_KEY_CLASS_MAX = 64 - _KEY_HASH_HEX - 1  # keeps keys within names.check_safe_name's 64 characters


def _frozen(mapping: Mapping[str, str], *, what: str) -> Mapping[str, str]:
    for name, value in mapping.items():
        if not isinstance(name, str) or not name or not isinstance(value, str):
            raise ConfigError(
                f"fingerprint {what} entries must map non-empty str to str, got {name!r}: {value!r}"
            )
    return MappingProxyType(dict(sorted(mapping.items())))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-.") or UNKNOWN


@dataclass(frozen=True)
class Fingerprint:
    """Hard facts decide comparability (and the key); soft facts only warn when they differ."""

    hard: Mapping[str, str]
    soft: Mapping[str, str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "hard", _frozen(self.hard, what="hard"))
        object.__setattr__(self, "soft", _frozen(self.soft, what="soft"))

    @property
    def hardware_class(self) -> str:
        """A readable name for the hardware, e.g. ``8xRTX-PRO-6000-Blackwell-Server-Edition``."""
        count = self.hard.get("gpu.count", "0")
        nodes = f"{self.hard['nodes.count']}n-" if "nodes.count" in self.hard else ""
        if ATTACHED_HARDWARE in self.hard:
            text = f"attached-{_slug(self.hard[ATTACHED_HARDWARE])}"
        elif count != "0":
            name = self.hard.get("gpu.name", UNKNOWN).removeprefix("NVIDIA ")
            text = f"{count}x{_slug(name)}"
        else:
            cores = self.hard.get("cpu.cores", "?")
            text = f"cpu-{_slug(self.hard.get('cpu.model', UNKNOWN))}-{cores}c"
        return (nodes + text)[:_KEY_CLASS_MAX].rstrip("-.")

    @property
    def key(self) -> str:
        """A short stable id of the hard facts, safe in file names: ``<class>-<12 hex>``."""
        digest = hashlib.sha256(json.dumps(dict(self.hard), sort_keys=True).encode()).hexdigest()
        return f"{self.hardware_class}-{digest[:_KEY_HASH_HEX]}"

    def diff(self, other: Fingerprint) -> tuple[list[str], list[str]]:
        """List what changed from ``self`` to ``other`` as ``name: old -> new`` (hard, soft)."""

        def changes(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
            return [
                f"{name}: {old.get(name, '<absent>')} -> {new.get(name, '<absent>')}"
                for name in sorted(set(old) | set(new))
                if old.get(name) != new.get(name)
            ]

        return changes(self.hard, other.hard), changes(self.soft, other.soft)

    def to_json(self) -> dict[str, object]:
        """The fingerprint as stored in a baseline file: ``{"key", "hard", "soft"}``."""
        return {"key": self.key, "hard": dict(self.hard), "soft": dict(self.soft)}

    @classmethod
    def from_json(cls, data: object, *, source: str = "fingerprint") -> Fingerprint:
        """Rebuild a fingerprint from ``to_json`` data; BaselineError naming ``source`` if malformed.

        A stored key that does not match the stored hard facts means the facts were edited by
        hand: comparing against them would be comparing against a machine that never existed.
        """
        if not isinstance(data, Mapping):
            raise BaselineError(f"{source}: fingerprint must be a JSON object, got {type(data).__name__}")
        hard, soft = data.get("hard"), data.get("soft")
        for name, part in (("hard", hard), ("soft", soft)):
            if not isinstance(part, Mapping) or not all(
                isinstance(k, str) and k and isinstance(v, str) for k, v in part.items()
            ):
                raise BaselineError(
                    f"{source}: fingerprint '{name}' must be an object mapping names to strings, got {part!r}"
                )
        assert isinstance(hard, Mapping) and isinstance(soft, Mapping)
        fingerprint = cls(hard=hard, soft=soft)
        if "key" in data and data["key"] != fingerprint.key:
            raise BaselineError(
                f"{source}: fingerprint key {data['key']!r} does not match its hard facts, which hash to "
                f"{fingerprint.key!r}: the hard facts were edited by hand"
            )
        return fingerprint


def _section(hard: Mapping[str, str], prefix: str) -> str:
    items = [(name.removeprefix(prefix), value) for name, value in hard.items() if name.startswith(prefix)]
    return ", ".join(f"{name}={value}" for name, value in items) or "none"


ATTACHED_HARDWARE = "server.hardware"

# The hard facts that name software versions. A baseline recorded on the same hardware under
# other versions is still judged by default (an upgrade is what a gate is for), with the
# differing versions named beside the verdict; every other hard fact must match.
VERSION_KEYS: tuple[str, ...] = ("software.vllm", "software.torch", "software.nccl", "server.vllm")


def version_changes(old: Fingerprint, new: Fingerprint) -> list[str] | None:
    """The version facts that differ from ``old`` to ``new`` (``name: old -> new``), or None
    when anything else that is hard differs too (then the two are not comparable at all)."""
    hard = old.diff(new)[0]
    if any(change.split(":", 1)[0] not in VERSION_KEYS for change in hard):
        return None
    return hard


NOT_STATED = "not stated (--kimiperf-server-hardware)"


def stated_apart(old: Fingerprint, new: Fingerprint) -> str | None:
    """The attached server's hardware as stated when ``old`` was recorded, where that is all that
    keeps ``old`` from ``new`` besides software versions (which are judged across): the same
    server, stated otherwise or not at all. None where anything else hard differs."""
    hard = old.diff(new)[0]
    keys = {change.split(":", 1)[0] for change in hard}
    recorded = old.hard.get(ATTACHED_HARDWARE)
    if ATTACHED_HARDWARE not in keys or not keys <= {ATTACHED_HARDWARE, *VERSION_KEYS} or recorded in (None, NOT_STATED):
        return None
    return recorded


def attached_fingerprint(local: Fingerprint, server: Mapping[str, str], *, stated_hardware: str | None) -> Fingerprint:
    """The fingerprint of a measurement of an attached server (``--kimiperf-server-url``): this
    host's probes describe the client and move to soft facts (``client.*``); the hard facts are
    what the server tells and the hardware the user states (nothing here can see the server's
    GPUs), so an unstated one never compares with a baseline of known hardware."""
    hard = {name: value for name, value in local.hard.items() if name.startswith("deployment.")}
    hard.update(server)
    hard[ATTACHED_HARDWARE] = stated_hardware or NOT_STATED
    soft = {f"client.{name}": value for name, value in {**local.hard, **local.soft}.items()
            if not name.startswith("deployment.")}
    return Fingerprint(hard=hard, soft=soft)


def describe(fp: Fingerprint) -> list[str]:
    """Lines for the pytest report header: key, hardware, software, deployment."""
    hard = fp.hard
    if ATTACHED_HARDWARE in hard:
        return [
            f"kimiperf fingerprint: {fp.key}",
            f"  hardware: attached server: {hard[ATTACHED_HARDWARE]}"
            + ("" if hard[ATTACHED_HARDWARE] == NOT_STATED else " (as stated)"),
            f"  server: vLLM {hard.get('server.vllm', UNKNOWN)}, models {hard.get('server.models', UNKNOWN)}, "
            f"max_model_len {hard.get('server.max_model_len', UNKNOWN)}",
            f"  deployment: {_section(hard, 'deployment.')}",
            f"  client host (not compared): {fp.soft.get('client.host.name', UNKNOWN)}",
        ]
    if hard.get("gpu.count", "0") != "0":
        hardware = (
            f"{hard['gpu.count']}x {hard.get('gpu.name', UNKNOWN)} ({hard.get('gpu.memory_mib', '?')} MiB), "
            f"driver {fp.soft.get('gpu.driver', hard.get('gpu.driver_major', '?'))}, "
            f"CUDA {hard.get('gpu.cuda', '?')}, PCIe {hard.get('gpu.pcie', '?')}, "
            f"interconnect {hard.get('gpu.interconnect', '?')} ({hard.get('gpu.links', '?')})"
        )
    else:
        hardware = (
            f"CPU {hard.get('cpu.model', UNKNOWN)}, {hard.get('cpu.cores', '?')} cores, "
            f"ISA {hard.get('cpu.isa', 'none')}"
        )

    return [
        f"kimiperf fingerprint: {fp.key}",
        f"  hardware: {hardware}",
        f"  software: {_section(hard, 'software.')}",
        f"  deployment: {_section(hard, 'deployment.')}",
        f"  host: {fp.soft.get('host.name', UNKNOWN)}, kernel {fp.soft.get('os.kernel', UNKNOWN)}, "
        f"python {fp.soft.get('python', UNKNOWN)}",
    ]


def host_fingerprint(facts: NodeFacts, deployment_facts: Mapping[str, str]) -> Fingerprint:
    """One machine's facts (measure/host_facts.py) and the deployment's, as a Fingerprint."""
    hard, soft = facts
    return Fingerprint(hard={**hard, **_deployment_hard(deployment_facts)}, soft=soft)


def _deployment_hard(deployment_facts: Mapping[str, str]) -> dict[str, str]:
    for name, value in deployment_facts.items():
        if not isinstance(name, str) or not name or not isinstance(value, str) or not value:
            raise ConfigError(
                f"deployment fact {name!r} = {value!r} (from the deployment definition): "
                "names and values must be non-empty strings"
            )
    return {f"deployment.{name}": value for name, value in deployment_facts.items()}


def deployment_facts(deployment: Deployment, *, built_revision: str | None = None) -> dict[str, str]:
    """The deployment's hard facts: model, revision, quantization, TP. A model the plugin builds
    (``kimiperf:``) has no revision of its own: ``built_revision`` names its build."""
    revision = deployment.revision or (built_revision if deployment.model.startswith("kimiperf:") else None)
    return {
        "name": deployment.name,
        # An attach-only deployment names no model: the server's /v1/models (server.models) does.
        "model": deployment.model or "from-/v1/models",
        "revision": revision or "unpinned",
        "quantization": deployment.quantization or "none",
        "tensor_parallel_size": str(deployment.tensor_parallel_size),
    }


def nodes_fingerprint(per_node: Mapping[str, NodeFacts], deployment_facts: Mapping[str, str]) -> Fingerprint:
    """One fingerprint from each node's (hard, soft) facts, keyed by node name. Every node's hard
    facts count, in the order of their sorted facts (which host is the head does not matter): a
    baseline of eight H100 nodes never judges a run with one A100 among them. The one-machine keys
    the header and the key's class read are the first node's, but ``gpu.count`` is all nodes'."""
    ordered = sorted(per_node.items(), key=lambda item: json.dumps(dict(item[1][0]), sort_keys=True))
    hard: dict[str, str] = {"nodes.count": str(len(ordered))}
    soft: dict[str, str] = {}
    for k, (name, (node_hard, node_soft)) in enumerate(ordered):
        hard.update({f"node{k}.{fact}": value for fact, value in node_hard.items()})
        soft.update({f"node{k}.{fact}": value for fact, value in node_soft.items()})
        soft[f"node{k}.name"] = name
    first_hard, first_soft = ordered[0][1]
    hard.update(first_hard)
    hard["gpu.count"] = str(sum(int(h.get("gpu.count", "0")) for _, (h, _) in ordered))
    soft.update(first_soft)
    soft["host.name"] = ",".join(dict.fromkeys(s.get("host.name", "?") for _, (_, s) in ordered))
    hard.update(_deployment_hard(deployment_facts))
    return Fingerprint(hard=hard, soft=soft)


def collect_nodes_fingerprint(nodes: Sequence[Node], deployment_facts: Mapping[str, str], *, local: NodeFacts,
                              remote_facts: Callable[[Node], NodeFacts]) -> Fingerprint:
    """Facts of every node: ``local`` (this machine's, probed once) for a node that runs here,
    else ``remote_facts`` (the node agent's, measure/host_facts.agent_facts)."""
    per_node = {node.name: local if node.local else remote_facts(node) for node in nodes}
    return nodes_fingerprint(per_node, deployment_facts)


_SIGNIFICANT_DIGITS = 6
_KEY_SEPARATOR = "|"


@dataclass(frozen=True)
class BaselineBoot:
    """One recorded server boot of one metric: the unit the gate compares."""

    median: float
    n: int
    se_log: float | None
    recorded_at: str
    git_commit: str | None
    versions: Mapping[str, str]
    # Session, host and host canary (judge/noise.py); None for boots recorded before they were
    # stored (those count as one unknown session on one unknown host).
    origin: BootOrigin | None = None
    # The boot's two clocks (judge/engine_clock.py); None for a server that exported no engine
    # figure, and for boots recorded before they were stored (judged on the client's clock alone).
    engine: EngineBoot | None = None

    def summary(self) -> BootSummary:
        """As stats sees a boot."""
        return BootSummary(median=self.median, n=self.n,
                           se_log=math.nan if self.se_log is None else self.se_log, label=self.recorded_at,
                           session=self.origin.session if self.origin else "",
                           host=self.origin.host if self.origin else "", commit=self.git_commit or "")


@dataclass(frozen=True)
class AppendedNight:
    """One passing run appended by ``--kimiperf-append-on-pass`` since the anchor, as the drift
    test needs it (judge/history.py): the geometric mean of its boots' medians and how many boots."""

    median: float
    boots: int
    recorded_at: str
    git_commit: str | None


@dataclass(frozen=True)
class BaselineEntry:
    """The boot history of one metric of one test under one NCCL profile."""

    test: str
    profile: str
    metric: str
    unit: str
    direction: Direction
    samples: tuple[float, ...]  # the latest boot's per-request samples (plots, tails)
    median: float  # of the latest boot's samples, for readers of the diff
    iqr: tuple[float, float]
    n: int
    recorded_at: str
    git_commit: str | None
    profile_env: Mapping[str, str]
    boots: tuple[BaselineBoot, ...] = ()
    # The profile's server arguments (written only when it has some: older files have none).
    profile_args: tuple[str, ...] = ()
    # The last deliberate recording's boots, kept whole whatever the window keeps, and each
    # passing run appended since: what a slow drift is judged against. Empty before schema 3.
    anchor: tuple[BaselineBoot, ...] = ()
    nights: tuple[AppendedNight, ...] = ()
    # Not stored: a deliberate recording its own run judged a REGRESSION or an improvement. A new
    # level starts the history anew: appended, the next run would be judged against a mix of both.
    new_level: bool = False

    def summaries(self) -> list[BootSummary]:
        """The history as BootSummary, oldest first (a tail metric's boots need as many
        samples as tail_min_samples says; a boot metric's, one)."""
        return self._as_summaries(self.boots)

    def anchor_summaries(self) -> list[BootSummary]:
        """The anchor's boots as BootSummary (see :meth:`summaries`)."""
        return self._as_summaries(self.anchor)

    def _as_summaries(self, boots: Sequence[BaselineBoot]) -> list[BootSummary]:
        min_n = min_samples(self.metric) if self.metric in METRICS else 0
        return [replace(b.summary(), min_n=min_n) for b in boots]

    @property
    def key(self) -> str:
        """The entry's key in the file: ``<test id>|<profile>|<metric>``."""
        return entry_key(self.test, self.profile, self.metric)


@dataclass(frozen=True)
class HistorySpan:
    """The boots of a history, and the sessions and hosts they came from (a boot recorded
    before origins were stored counts as one unknown session on one unknown host)."""

    boots: int
    sessions: int
    hosts: int

    @classmethod
    def of(cls, boots: Sequence[BaselineBoot]) -> HistorySpan:
        origins = [(b.origin.host, b.origin.session) if b.origin else ("", "") for b in boots]
        return cls(len(boots), len(set(origins)), len({host for host, _ in origins}))


@dataclass(frozen=True)
class BaselineFile:
    """A loaded (or just written) baseline file."""

    path: Path
    deployment: str
    fingerprint: Fingerprint
    entries: Mapping[str, BaselineEntry]

    def entry(self, test: str, profile: str, metric: str) -> BaselineEntry | None:
        """The stored entry for this test, profile and metric, or None if never recorded."""
        return self.entries.get(entry_key(test, profile, metric))

    def hosts(self) -> tuple[str, ...]:
        """The host ids the file's boots were measured on, the most recent first."""
        boots = sorted((b for entry in self.entries.values() for b in entry.boots if b.origin and b.origin.host),
                       key=lambda b: b.recorded_at, reverse=True)
        return tuple(dict.fromkeys(b.origin.host for b in boots if b.origin))

    def span(self) -> HistorySpan:
        """How many boots, sessions and hosts the file's history spans (its fullest entry's)."""
        spans = [HistorySpan.of(entry.boots) for entry in self.entries.values()]
        return max(spans, key=lambda s: (s.sessions, s.hosts, s.boots), default=HistorySpan(0, 0, 0))


def entry_key(test: str, profile: str, metric: str) -> str:
    """Join test id, profile and metric into the entry key; none of them may contain ``|``."""
    for kind, value in (("test id", test), ("profile", profile), ("metric", metric)):
        if not isinstance(value, str) or not value or _KEY_SEPARATOR in value:
            raise BaselineError(
                f"{kind} {value!r} cannot be part of a baseline key: it must be a non-empty string "
                f"without {_KEY_SEPARATOR!r} (the key separator)"
            )
    return _KEY_SEPARATOR.join((test, profile, metric))


def round_figure(value: float) -> float:
    """A figure as the file keeps it: :data:`_SIGNIFICANT_DIGITS` significant digits."""
    return float(f"{value:.{_SIGNIFICANT_DIGITS}g}")


HISTORY_BOOTS = 20


def make_entry(
    *,
    test: str,
    profile: str,
    metric: str,
    unit: str,
    direction: Direction,
    samples: Sequence[float],
    git_commit: str | None,
    profile_env: Mapping[str, str],
    recorded_at: datetime | None = None,
    profile_args: Sequence[str] = (),
    boot_samples: Sequence[Sequence[float]] | None = None,
    versions: Mapping[str, str] | None = None,
    boot_origins: Sequence[BootOrigin | None] | None = None,
    boot_engines: Sequence[EngineBoot | None] | None = None,
) -> BaselineEntry:
    """Build an entry from raw samples, rounded, with median, IQR and n from the rounded ones;
    non-finite samples (failed requests) are not stored. ``recorded_at`` (default now) must be
    timezone-aware."""
    entry_key(test, profile, metric)
    values = [float(s) for s in samples]
    finite = [round_figure(v) for v in values if math.isfinite(v)]
    if not finite:
        raise BaselineError(
            f"no finite samples to record for {entry_key(test, profile, metric)} "
            f"(got {len(values)} samples)"
        )
    when = recorded_at or datetime.now(UTC)
    if when.tzinfo is None:
        raise BaselineError(f"recorded_at {when.isoformat()} has no time zone; pass an aware UTC time")
    arr = np.asarray(finite)
    q1, q3 = np.percentile(arr, [25.0, 75.0])
    stamp = when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    boots = []
    spec = METRICS.get(metric)
    per_boot = list(boot_samples if boot_samples is not None else [values])
    origins = list(boot_origins) if boot_origins is not None else [None] * len(per_boot)
    engines = list(boot_engines) if boot_engines is not None else [None] * len(per_boot)
    if len(origins) != len(per_boot) or len(engines) != len(per_boot):
        raise BaselineError(f"{len(origins)} boot origins and {len(engines)} engine figures for {len(per_boot)} "
                            f"boots of {entry_key(test, profile, metric)}")
    for boot, origin, engine in zip(per_boot, origins, engines):
        finite_boot = [v for v in boot if math.isfinite(v)]
        summary = summarize_metric(metric, finite_boot) if spec is not None else summarize_boot(finite_boot)
        if summary.n == 0:
            continue
        boots.append(BaselineBoot(
            median=round_figure(summary.median), n=summary.n,
            se_log=None if not math.isfinite(summary.se_log) else round_figure(summary.se_log),
            recorded_at=stamp, git_commit=git_commit,
            versions={str(k): str(v) for k, v in (versions or {}).items()}, origin=origin,
            engine=_rounded(engine)))
    return BaselineEntry(
        test=test,
        profile=profile,
        metric=metric,
        unit=unit,
        direction=Direction(direction),
        samples=tuple(finite),
        median=round_figure(float(np.median(arr))),
        iqr=(round_figure(float(q1)), round_figure(float(q3))),
        n=len(finite),
        recorded_at=stamp,
        git_commit=git_commit,
        profile_env={str(k): str(v) for k, v in profile_env.items()},
        boots=tuple(boots),
        profile_args=tuple(str(a) for a in profile_args),
    )


def _rounded(engine: EngineBoot | None) -> EngineBoot | None:
    """The engine's figures as the file keeps them (:func:`round_figure`)."""
    if engine is None:
        return None

    def kept(value: float | None) -> float | None:
        return round_figure(value) if value is not None and math.isfinite(value) else value

    return replace(engine, engine_tpot_ms=kept(engine.engine_tpot_ms), engine_ttft_ms=kept(engine.engine_ttft_ms),
                   client_tpot_ms=kept(engine.client_tpot_ms), client_ttft_ms=kept(engine.client_ttft_ms),
                   requests=kept(engine.requests), tokens=kept(engine.tokens))


def append_history(old: BaselineEntry | None, new: BaselineEntry, keep: int = HISTORY_BOOTS, *,
                   on_pass: bool = False) -> BaselineEntry:
    """``new``'s boots appended to ``old``'s history (last ``keep`` boots kept).

    A deliberate recording also sets the drift test's anchor: its boots, joined to the anchor
    before it when no passing run came in between (several sessions of one recording are one
    anchor). A passing run (``on_pass``) keeps the anchor and adds one night. A history of another
    profile environment, arguments, unit or direction, or a ``new.new_level``, is replaced, not
    extended: that is how a change is accepted.
    """
    if old is None or dict(old.profile_env) != dict(new.profile_env) or (
            old.unit, old.direction, old.profile_args) != (new.unit, new.direction, new.profile_args) or (
            new.new_level and not on_pass):
        return replace(new, boots=new.boots[-keep:], anchor=new.boots[-keep:], nights=())
    boots = (old.boots + new.boots)[-keep:]
    if on_pass:
        return replace(new, boots=boots, anchor=old.anchor or old.boots, nights=(*old.nights, night_of(new)))
    joined = old.anchor if old.anchor and not old.nights else ()
    return replace(new, boots=boots, anchor=(joined + new.boots)[-keep:], nights=())


def night_of(entry: BaselineEntry) -> AppendedNight:
    """A passing run's boots of one entry as one night: the geometric mean of their medians."""
    logs = [math.log(b.median) for b in entry.boots]
    return AppendedNight(median=round_figure(math.exp(sum(logs) / len(logs))), boots=len(logs),
                 recorded_at=entry.recorded_at, git_commit=entry.git_commit)


@dataclass(frozen=True)
class LoadedBaselines:
    """The baseline files the gate judges one fingerprint against, loaded once
    (storage/baselines.py reads them): this fingerprint's file and the deployment's others."""

    fingerprint: Fingerprint
    path: Path
    loaded: BaselineFile | None
    # Why this fingerprint's file cannot be trusted (corrupt, newer schema): raised when asked for.
    error: str | None = None
    # The readable files of other hardware, and the keys of all of them (readable or not).
    others: tuple[BaselineFile, ...] = ()
    other_keys: tuple[str, ...] = ()

    def file(self) -> BaselineFile | None:
        """The baseline file (None when missing); BaselineError when it cannot be trusted."""
        if self.error is not None:
            raise BaselineError(self.error)
        return self.loaded

    def span(self) -> HistorySpan | None:
        """How many boots, sessions and hosts the file's history spans; None without a file, or
        when it cannot be trusted (the perf tests say why)."""
        return self.loaded.span() if self.loaded is not None else None

    def soft_changes(self) -> list[str]:
        """Soft facts (host name, full driver build, kernel) that differ from the baseline
        file's, as ``name: old -> new``: they only warn, the hard facts decide comparability."""
        baseline = self.file()
        return [] if baseline is None else baseline.fingerprint.diff(self.fingerprint)[1]

    def across_versions(
        self, test: str, profile: str, metric: str
    ) -> tuple[BaselineFile, BaselineEntry, list[str]] | None:
        """The entry recorded on this same hardware under other vLLM / torch / NCCL versions
        (fingerprint.VERSION_KEYS), with the versions that differ; the fewest differences win,
        then the newest recording. None when no such baseline exists."""
        found = []
        for other in self.others:
            versions = version_changes(other.fingerprint, self.fingerprint)
            entry = other.entry(test, profile, metric)
            if versions is not None and entry is not None:
                found.append((len(versions), _newest_boot(entry), other, entry, versions))
        if not found:
            return None
        found.sort(key=lambda f: (f[0], _reverse(f[1])))
        _, _, other, entry, versions = found[0]
        return other, entry, versions


def _newest_boot(entry: BaselineEntry) -> str:
    return max((boot.recorded_at for boot in entry.boots), default="")


def _reverse(text: str) -> tuple[int, ...]:
    # Sort key putting the newest ISO timestamp first.
    return tuple(-ord(ch) for ch in text)


def baseline_entries(
    results: Sequence[TestResult], *, git_commit: str | None, vllm: str = "",
) -> tuple[list[BaselineEntry], list[TestResult]]:
    """Baseline entries for every metric of the tests that ran, every boot of this session in
    order with its two clocks; and the boots not recorded (their ``invalid`` and ``unrecordable``
    say why). An entry whose last boot was judged a REGRESSION or an improvement is a ``new_level``."""
    grouped: dict[tuple[str, str, str], list[tuple[TestResult, MetricResult]]] = {}
    skipped: list[TestResult] = []
    for res in sorted(results, key=lambda r: r.boot):
        if res.invalid or res.unrecordable:
            skipped.append(res)
            continue
        for mres in res.metrics.values():
            if mres.finite:
                grouped.setdefault((res.test, res.profile, mres.metric), []).append((res, mres))
    entries = []
    for (test, profile, metric), boots in grouped.items():
        last_res, last = boots[-1]
        entry = make_entry(
            test=test, profile=profile, metric=metric, unit=last.unit,
            direction=Direction(last.direction), samples=last.samples, git_commit=git_commit,
            profile_env=last_res.profile_env, profile_args=last_res.profile_args, boot_samples=[m.samples for _, m in boots],
            versions=last_res.versions, boot_origins=[r.origin for r, _ in boots],
            boot_engines=[engine_boot_of(r.run, vllm) for r, _ in boots],
        )
        decided = last.baseline is not None and last.baseline.verdict in (VerdictKind.REGRESSION, VerdictKind.IMPROVEMENT)
        entries.append(replace(entry, new_level=True) if decided else entry)
    return entries, skipped
