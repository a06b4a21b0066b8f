"""What a perf test sends: requests of an exact shape, and the load patterns that send them.

**Requests.** Prompts are built with the server's own tokenizer through vLLM's ``/tokenize`` and
``/detokenize`` endpoints (vllm/entrypoints/serve/tokenize/protocol.py), then checked by
tokenizing the final text again, counted the way the endpoint will count it (completions: with
special tokens, as ``CompletionRequest.add_special_tokens`` defaults to true; chat: with the chat
template and generation prompt). Text comes from a seeded random walk over common words, a
different walk per request, so no two prompts share a prefix and vLLM's prefix cache cannot
shorten one request's prefill with another's. :func:`prompt_seed` derives a measurement's seed
from the test id (and, on a server that outlives a boot, the NCCL profile and the boot), so two
tests on one server never send the same prompt, and a test sends the same prompts whether it runs
alone (``-k``) or after others. Prompts are built once a session: a later boot's server counts
one of them again, then reuses them. The output length is exact: ``ignore_eos`` with
``max_tokens`` (client.request_body), checked against ``usage.completion_tokens``.

**Load patterns.** A scenario is a frozen dataclass: the request shape, a budget per round
(requests, seconds, or both: whichever ends first), how many rounds, and warm-up requests that are
never counted. A load of many streams defaults to ``MIN_SAMPLES_PER_BOOT`` rounds: its throughputs
are one sample per round, and a boot needs that many to count (``perf.check`` refuses fewer).
``runner.run_scenario`` plays one against a server (``target.Target``); :func:`load_facts` says
what load a scenario offers in ``vllm bench serve``'s terms.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from pytest_kimiperf.config.deployments import HealthBounds
from pytest_kimiperf.config.metric_specs import MIN_SAMPLES_PER_BOOT
from pytest_kimiperf.config.names import check_safe_name
from pytest_kimiperf.config.server_url import check_endpoint, parse_base_url
from pytest_kimiperf.errors import ConfigError, ServerError
from pytest_kimiperf.measure.client import RequestSpec
from pytest_kimiperf.measure.results import RequestRecord
from pytest_kimiperf.numbers import positive_int, positive_number
from pytest_kimiperf.server.http_json import json_answer

# Requests of an exact shape: prompts through the server's tokenizer, outputs of a fixed length.

# Plain lowercase words: almost every tokenizer maps each to one or two tokens, so the walk
# reaches a target length in few round trips.
_WORDS: tuple[str, ...] = (
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world",
    "school", "state", "family", "student", "group", "country", "problem", "hand", "part",
    "place", "case", "week", "company", "system", "program", "question", "work", "government",
    "number", "night", "point", "home", "water", "room", "mother", "area", "money", "story",
    "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business", "issue",
    "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game",
    "line", "end", "member", "law", "car", "city", "community", "name", "president", "team",
    "minute", "idea", "kid", "body", "information", "back", "parent", "face", "others", "level",
    "office", "door", "health", "person", "art", "war", "history", "party", "result", "change",
    "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force",
    "education", "foot", "boy", "age", "policy", "music", "market", "sense", "nation", "plan",
    "college", "interest", "death", "experience", "effect", "use", "class", "control", "care",
    "field", "development", "role", "effort", "rate", "heart", "drug", "show", "leader", "light",
    "voice", "wife", "police", "mind", "price", "report", "decision", "son", "view",
    "relationship", "town", "road", "arm", "difference", "value", "building", "action", "model",
    "season", "society", "tax", "director", "position", "player", "record", "paper", "space",
    "ground", "form", "event", "official", "matter", "center", "couple", "site", "project",
    "activity", "star", "table", "need", "court", "oil", "situation", "cost", "industry",
    "figure", "street", "image", "phone", "data", "picture", "practice", "piece", "land",
    "product", "doctor", "wall", "patient", "worker", "news", "test", "movie", "north", "love",
    "support", "technology", "step", "baby", "computer", "type", "attention", "film", "tree",
    "source", "organization", "hair", "window", "evidence", "population", "river",
)
_MAX_ATTEMPTS = 8
# Marks the request id of a prompt sent again (cycled budget), so the run can say so.
REUSED_MARK = "~"


class TokenizerUnavailable(ServerError):
    """The server has no /tokenize or /detokenize (an OpenAI-compatible server that is not vLLM)."""


@dataclass(frozen=True)
class Workload:
    """The shape of every request in a scenario."""

    prompt_tokens: int
    output_tokens: int
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "output_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"Workload.{name}={value!r}: must be an integer >= 1")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError(f"Workload.seed={self.seed!r}: must be an integer")


# What vLLM's /tokenize and /detokenize answer (vllm/entrypoints/openai/protocol.py,
# TokenizeResponse and DetokenizeResponse): the keys this module reads, with their types.
_TOKENIZER_KEYS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "/tokenize": {"tokens": list, "count": int},
    "/detokenize": {"prompt": str},
}


class _Tokenizer:
    """The server's tokenizer, reached over HTTP."""

    def __init__(self, http: httpx.Client, base_url: str, model: str, endpoint: str) -> None:
        self._http = http
        self._base_url = base_url
        self._model = model
        self._chat = endpoint == "chat"
        self._overhead: int | None = None

    def overhead(self, text: str, ids: Sequence[int]) -> int:
        """Tokens the endpoint adds around a text (BOS, chat template), counted on the first text
        only: a later prompt's count is checked whole, and a cut that misses moves."""
        if self._overhead is None:
            self._overhead = self.counted(text) - len(ids)
        return self._overhead

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self._base_url + path
        try:
            response = self._http.post(url, json=body)
        except httpx.HTTPError as exc:
            raise ServerError(f"cannot reach {url} to build prompts: {exc}") from exc
        if response.status_code in (404, 405, 501):
            raise TokenizerUnavailable(
                f"{url} answered HTTP {response.status_code}: the server has no {path} endpoint"
            )
        if response.status_code != 200:
            raise ServerError(
                f"{url} answered HTTP {response.status_code} ({response.text[:200]!r}); exact-length "
                "prompts need vLLM's /tokenize and /detokenize endpoints"
            )
        return json_answer(response, url, expect=_TOKENIZER_KEYS[path])

    def content_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` alone (no BOS, no template)."""
        body = {"model": self._model, "prompt": text, "add_special_tokens": False}
        return list(self._post("/tokenize", body)["tokens"])

    def counted(self, text: str) -> int:
        """How many prompt tokens the generation endpoint will count for ``text``."""
        if self._chat:
            body: dict[str, Any] = {
                "model": self._model,
                "messages": [{"role": "user", "content": text}],
                "add_generation_prompt": True,
            }
        else:
            body = {"model": self._model, "prompt": text, "add_special_tokens": True}
        return int(self._post("/tokenize", body)["count"])

    def text(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``."""
        return str(self._post("/detokenize", {"model": self._model, "tokens": list(token_ids)})["prompt"])


def prompt_seed(test: str, profile: str, boot: int, base_seed: int = 0) -> int:
    """The workload seed of one measurement: stable everywhere, distinct per test, profile and boot.

    A test's own position in the session (what ran before it, ``-k``) must not change its
    prompts, and no two measurements that share a server may share a prompt: the result is a
    hash of the test id, the NCCL profile, the server's boot index and the scenario's own seed.
    SHA-256 of a JSON list, not ``hash()``: Python salts str hashes per process
    (PYTHONHASHSEED), and JSON keeps ``("a:b", "c")`` apart from ``("a", "b:c")``. 63 bits, so
    the seed is a non-negative int64 wherever it is stored.
    """
    key = json.dumps(["kimiperf-prompts", test, profile, boot, base_seed], separators=(",", ":"))
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") >> 1


def _walk(seed: int, index: int, words: int) -> str:
    rng = random.Random(f"kimiperf-workload:{seed}:{index}")
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _exact_prompt(tokenizer: _Tokenizer, prompt_tokens: int, seed: int, index: int) -> str:
    words = prompt_tokens + 8
    text = _walk(seed, index, words)
    ids = tokenizer.content_ids(text)
    overhead = tokenizer.overhead(text, ids)
    keep = prompt_tokens - overhead
    if keep < 1:
        raise ConfigError(
            f"prompt_tokens={prompt_tokens} is too small for this model: its endpoint adds "
            f"{overhead} tokens of its own (BOS/chat template); use at least {overhead + 1}"
        )
    last_count = -1
    for _ in range(_MAX_ATTEMPTS):
        while len(ids) < keep:
            words *= 2
            text = _walk(seed, index, words)
            ids = tokenizer.content_ids(text)
        candidate = tokenizer.text(ids[:keep])
        last_count = tokenizer.counted(candidate)
        if last_count == prompt_tokens:
            return candidate
        # Detokenize -> tokenize is not always the identity at the cut (merges, leading
        # spaces); move the cut by the difference and try again.
        keep += prompt_tokens - last_count
        if keep < 1:
            break
    raise ServerError(
        f"could not build a prompt of exactly {prompt_tokens} tokens (seed {seed}, request "
        f"{index}): the server's tokenizer counted {last_count} after {_MAX_ATTEMPTS} attempts"
    )


# Prompts built, by what decides them: the model and endpoint (the server's tokenizer), the
# length, the seed and the request's index; not the server's address, which a later boot of the
# same deployment changes. A server not seen before counts one cached prompt again before the
# cache serves it, and a count that differs (another tokenizer under the same name) empties it.
_CACHE: dict[tuple[str, str, int, int, int], str] = {}
_COUNTED_ON: set[tuple[str, str, str]] = set()


def build_prompts(
    base_url: str,
    model: str,
    *,
    prompt_tokens: int,
    count: int,
    seed: int = 0,
    endpoint: str = "completions",
    api_key: str | None = None,
    first_index: int = 0,
    timeout_s: float = 60.0,
) -> list[str]:
    """``count`` distinct prompts of exactly ``prompt_tokens`` tokens each, same for the same seed."""
    address = parse_base_url(base_url)
    check_endpoint(endpoint)
    if not isinstance(count, int) or count < 0:
        raise ConfigError(f"prompt count {count!r}: must be an integer >= 0")
    Workload(prompt_tokens=prompt_tokens, output_tokens=1, seed=seed)  # validates the numbers
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    prompts: list[str] = []
    with httpx.Client(headers=headers, timeout=timeout_s) as http:
        tokenizer = _Tokenizer(http, address.base_url, model, endpoint)
        for index in range(first_index, first_index + count):
            key = (model, endpoint, prompt_tokens, seed, index)
            prompt = _CACHE.get(key)
            if prompt is not None and (address.base_url, model, endpoint) not in _COUNTED_ON:
                if tokenizer.counted(prompt) != prompt_tokens:
                    _CACHE.clear()
                    _COUNTED_ON.clear()
                    prompt = None
                _COUNTED_ON.add((address.base_url, model, endpoint))
            if prompt is None:
                prompt = _exact_prompt(tokenizer, prompt_tokens, seed, index)
                _CACHE[key] = prompt
            prompts.append(prompt)
    return prompts


def build_requests(
    base_url: str,
    model: str,
    workload: Workload,
    count: int,
    *,
    endpoint: str = "completions",
    api_key: str | None = None,
    first_index: int = 0,
    id_prefix: str = "kimiperf",
    require_exact: bool = False,
) -> list[RequestSpec]:
    """``count`` requests of the workload's shape, with ids ``<id_prefix>-<index>``.

    Without /tokenize and /detokenize on the server (not vLLM) and unless ``require_exact``,
    each prompt is ``prompt_tokens`` words and its token count is not checked
    (``RequestSpec.prompt_tokens`` is None); the output length is still exact.
    """
    expected: int | None = workload.prompt_tokens
    try:
        prompts = build_prompts(
            base_url, model, prompt_tokens=workload.prompt_tokens, count=count,
            seed=workload.seed, endpoint=endpoint, api_key=api_key, first_index=first_index,
        )
    except TokenizerUnavailable:
        if require_exact:
            raise
        prompts = [_walk(workload.seed, i, workload.prompt_tokens)
                   for i in range(first_index, first_index + count)]
        expected = None
    return [
        RequestSpec(
            prompt=prompt,
            output_tokens=workload.output_tokens,
            prompt_tokens=expected,
            request_id=f"{id_prefix}-{first_index + i}",
        )
        for i, prompt in enumerate(prompts)
    ]


def reused_prompt_requests(records: Iterable[RequestRecord]) -> int:
    """How many of ``records`` re-sent a prompt their run had already sent (a cycled budget)."""
    return sum(1 for r in records if REUSED_MARK in r.request_id)


# Load patterns: what a perf test asks the runner to play.
_ARRIVALS = ("poisson", "constant")
# Connection-pool size of a request rate without max_concurrency (connections open on demand).
_UNCAPPED_STREAMS = 4096
# The load kind of one stream, one request at a time (load_facts' "kind"): what single-stream
# decode figures (the floor, the roofline) are measured under.
SINGLE_STREAM = "single-stream"


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """What every load pattern has: request shape, budget per round, rounds, client resources."""

    prompt_tokens: int
    output_tokens: int
    # Budget per round: requests, seconds of sending, or both (whichever ends first).
    requests: int | None = None
    seconds: float | None = None
    rounds: int = 1
    # Sent first with the same load and never counted; None: one per stream (at least 1).
    warmup_requests: int | None = None
    seed: int = 0
    client_processes: int = 1
    name: str | None = None
    bounds: HealthBounds = field(default_factory=HealthBounds)
    request_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        owner = type(self).__name__
        Workload(self.prompt_tokens, self.output_tokens, self.seed)
        positive_int(self.requests, what=f"{owner}.requests", allow_none=True)
        positive_number(self.seconds, what=f"{owner}.seconds", allow_none=True)
        if self.requests is None and self.seconds is None:
            raise ConfigError(f"{owner}: give a budget per round: requests=N, seconds=S, or both")
        positive_int(self.rounds, what=f"{owner}.rounds")
        if self.warmup_requests is not None and (
            not isinstance(self.warmup_requests, int) or isinstance(self.warmup_requests, bool)
            or self.warmup_requests < 0
        ):
            raise ConfigError(f"{owner}.warmup_requests={self.warmup_requests!r}: must be an integer >= 0 or None")
        positive_int(self.client_processes, what=f"{owner}.client_processes")
        positive_number(self.request_timeout_s, what=f"{owner}.request_timeout_s")
        if not isinstance(self.bounds, HealthBounds):
            raise ConfigError(f"{owner}.bounds={self.bounds!r}: must be a HealthBounds")
        if self.name is not None:
            check_safe_name("scenario", self.name, source=f"{owner}.name")

    @property
    def workload(self) -> Workload:
        """The shape of every request."""
        return Workload(self.prompt_tokens, self.output_tokens, self.seed)

    @property
    def streams(self) -> int:
        """How many requests can be in flight at once (the connection pool's size)."""
        raise NotImplementedError

    @property
    def scenario_name(self) -> str:
        """``name``, or one derived from the load and the shape (e.g. ``concurrency-8-128in-128out``)."""
        return self.name or f"{self._load_name()}-{self.prompt_tokens}in-{self.output_tokens}out"

    def _load_name(self) -> str:
        raise NotImplementedError

    @property
    def effective_warmup_requests(self) -> int:
        """Warm-up requests actually sent."""
        return self.warmup_requests if self.warmup_requests is not None else self.streams

    def _check_processes(self) -> None:
        if self.client_processes > self.streams:
            raise ConfigError(
                f"{type(self).__name__}.client_processes={self.client_processes} exceeds the "
                f"{self.streams} stream(s) it can have in flight"
            )


@dataclass(frozen=True, kw_only=True)
class SingleStream(Scenario):
    """One request at a time: decode speed as one user sees it."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_processes()

    @property
    def streams(self) -> int:
        """Always 1."""
        return 1

    def _load_name(self) -> str:
        return SINGLE_STREAM


@dataclass(frozen=True, kw_only=True)
class Concurrency(Scenario):
    """``concurrency`` closed-loop streams: each sends its next request when its last one ends."""

    concurrency: int
    rounds: int = MIN_SAMPLES_PER_BOOT

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_int(self.concurrency, what="Concurrency.concurrency")
        self._check_processes()

    @property
    def streams(self) -> int:
        """The concurrency."""
        return self.concurrency

    def _load_name(self) -> str:
        return f"concurrency-{self.concurrency}"


@dataclass(frozen=True, kw_only=True)
class RequestRate(Scenario):
    """Open loop: requests arrive at ``rate_per_s`` (Poisson from the seed, or evenly spaced)."""

    rate_per_s: float
    rounds: int = MIN_SAMPLES_PER_BOOT
    arrivals: str = "poisson"
    # Cap on requests in flight; a request over the cap waits (bench serve's --max-concurrency).
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        positive_number(self.rate_per_s, what="RequestRate.rate_per_s")
        if self.arrivals not in _ARRIVALS:
            raise ConfigError(
                f"RequestRate.arrivals={self.arrivals!r}: use one of {', '.join(_ARRIVALS)}"
            )
        positive_int(self.max_concurrency, what="RequestRate.max_concurrency", allow_none=True)
        self._check_processes()

    @property
    def streams(self) -> int:
        """The cap; without one, as many as the connection pool allows (an open loop never waits)."""
        return self.max_concurrency if self.max_concurrency is not None else _UNCAPPED_STREAMS

    @property
    def effective_warmup_requests(self) -> int:
        """Warm-up requests actually sent (default 2: connections and server caches, not load)."""
        return self.warmup_requests if self.warmup_requests is not None else 2

    def _load_name(self) -> str:
        return f"rate-{self.arrivals}-{self.rate_per_s:g}rps"

    def arrival_offsets_s(self, round_index: int) -> list[float]:
        """Send times of one round's requests, seconds from its start; the same for the same seed."""
        rng = random.Random(f"kimiperf-arrivals:{self.seed}:{round_index}")
        limit_n = self.requests if self.requests is not None else math.inf
        limit_s = self.seconds if self.seconds is not None else math.inf
        offsets: list[float] = []
        t = 0.0
        while len(offsets) < limit_n and t < limit_s:
            offsets.append(t)
            t += rng.expovariate(self.rate_per_s) if self.arrivals == "poisson" else 1.0 / self.rate_per_s
        return offsets


@dataclass(frozen=True, kw_only=True)
class ConcurrencySweep(Scenario):
    """The same workload at each of ``concurrencies`` (run with ``run_sweep``)."""

    concurrencies: tuple[int, ...]
    rounds: int = MIN_SAMPLES_PER_BOOT

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.concurrencies, tuple) or not self.concurrencies:
            raise ConfigError(
                f"ConcurrencySweep.concurrencies={self.concurrencies!r}: must be a non-empty tuple"
            )
        for value in self.concurrencies:
            positive_int(value, what="ConcurrencySweep.concurrencies[]")

    @property
    def streams(self) -> int:
        """The highest concurrency."""
        return max(self.concurrencies)

    def _load_name(self) -> str:
        return "sweep"

    def scenarios(self) -> tuple[Concurrency, ...]:
        """One Concurrency scenario per point, named ``<sweep name>-c<N>``."""
        return tuple(
            Concurrency(
                prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens,
                requests=self.requests, seconds=self.seconds, rounds=self.rounds,
                warmup_requests=self.warmup_requests, seed=self.seed,
                client_processes=min(self.client_processes, n), bounds=self.bounds,
                request_timeout_s=self.request_timeout_s, name=f"{self.scenario_name}-c{n}",
                concurrency=n,
            )
            for n in self.concurrencies
        )


def load_facts(scenario: Scenario) -> dict[str, Any]:
    """The offered load of ``scenario`` in ``vllm bench serve``'s terms.

    A closed loop of N streams is bench serve's ``--request-rate inf --max-concurrency N``; a
    Poisson request rate is ``--burstiness 1.0``; an unlimited rate is the string "inf", as bench
    serve writes it. Evenly spaced arrivals have no finite gamma
    shape in bench serve, so their burstiness is None.
    """
    facts: dict[str, Any] = {
        "kind": SINGLE_STREAM, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": 1,
        "prompt_tokens": scenario.prompt_tokens, "output_tokens": scenario.output_tokens,
    }
    if isinstance(scenario, Concurrency):
        facts.update(kind="concurrency", max_concurrency=scenario.concurrency)
    elif isinstance(scenario, RequestRate):
        facts.update(kind="request-rate", request_rate=float(scenario.rate_per_s),
                     burstiness=1.0 if scenario.arrivals == "poisson" else None,
                     max_concurrency=scenario.max_concurrency)
    return facts
