"""The privacy ledger: every DP charge, per client, with its unit and observer, composed on demand.

An entry names the mechanism with its parameters, the privacy unit ('example': one training
example / document of the client; 'client': everything the client holds) and the observer the
guarantee is stated against ('server': sees every aggregate the protocol reveals, knows who took
part, so no amplification by sampling; 'outsider': sees only released models, so client sampling
amplifies). Entries with the same (unit, observer) label are composed together; each label gets its
own epsilon. A mechanism seen by both observers is debited once per observer (the encoders in
`dp` do that), possibly with different parameters (amplified for outsiders).

Composition: Gaussian-family entries go to `dp_accounting` as DpEvents (RDP by default, PLD on
request); Skellam and distributed discrete Gaussian entries use the RDP curves of
`dp.accounting` (no dp_accounting event exists) on the same order grid. In PLD mode a label that
mixes both reports min(RDP of everything, PLD(Gaussians, delta/2) + RDP(rest, delta/2)), both valid
bounds (the second by basic composition).

Rounds that release nothing (a Poisson cohort below the release floor): recorded as a zero-cost
`NoReleaseMechanism` entry with its sampling record, because every amplified round that sampled,
released or not, adds `SamplingRecord.boundary_delta` to delta (`dp.sampling`). A label's epsilon
is reported at delta minus the sum of those terms over its entries (count x term); when they use
up delta, the epsilon is infinite.

Neighbouring relation. A label is accounted add/remove-one unless it holds a Gaussian sampled
WITHOUT replacement (a fixed-size cohort: dp_accounting's `SampledWithoutReplacementDpEvent`, whose
bound, Wang-Balle-Kasiviswanathan 2019 Thm 27, is for replace-one neighbours only); such a label is
accounted replace-one, and the report says so (`neighbouring` per label). In an add/remove label, an
un-sampled Gaussian calibrated to a replace-one sensitivity has a noise multiplier at most its
add/remove one, so it is composed as is (conservative). In a replace-one label every other entry is
converted soundly (a replace is a remove and an add, so sensitivities at most double): an un-sampled
add/remove Gaussian at z counts as z/2, Skellam and discrete Gaussian entries with doubled
sensitivities; a Poisson-sampled entry has no replace-one bound, so a label cannot mix Poisson and
fixed-size sampling (refused at debit, nothing recorded). Replace-one labels are composed by RDP
(dp_accounting's PLD accountant has no without-replacement event).
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from dp.accounting import ORDERS, discrete_gaussian_curve, epsilon_from_rdp, skellam_curve
from dp.sampling import SamplingRecord, check_amplification, check_without_replacement

if TYPE_CHECKING:
    import dp_accounting


def _accounting() -> Any:
    """dp_accounting, imported on first use: with scipy it costs about 1 s, which every deployed client paid
    at start-up (engine.round imports this module) though only the server composes epsilons."""
    import dp_accounting
    from dp_accounting import pld, rdp  # noqa: F401  (loads the submodules read as attributes)

    return dp_accounting

LEDGER_FORMAT = "fedsecure-nlp/privacy-ledger/v1"


class PrivacyUnit(str, Enum):
    EXAMPLE = "example"
    CLIENT = "client"


class Observer(str, Enum):
    SERVER = "server"
    OUTSIDER = "outsider"


class BudgetExceeded(RuntimeError):
    """A debit would push a client's epsilon past its budget; nothing was recorded."""


# ---- mechanisms -------------------------------------------------------------------------------

class Mechanism(Protocol):
    name: ClassVar[str]

    def to_dict(self) -> dict[str, Any]: ...


def _check_rate(q: float) -> None:
    if not 0 < q <= 1:
        raise ValueError(f"sampling rate must be in (0, 1], got {q}")


@dataclass(frozen=True)
class GaussianMechanism:
    """Gaussian noise of std noise_multiplier * sensitivity, optionally Poisson-subsampled."""

    noise_multiplier: float
    sampling_rate: float = 1.0
    sensitivity: float | None = None
    """L2 sensitivity the noise was calibrated to (informational; accounting uses the multiplier)."""
    neighbouring: str = "add_remove"
    population: int | None = None
    """With `sample_size`: the mechanism runs on a fixed-size sample drawn without replacement from
    this many records (replace-one neighbouring; the multiplier is relative to the replace-one
    sensitivity)."""
    sample_size: int | None = None
    name: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        if not self.noise_multiplier > 0:
            raise ValueError("noise multiplier must be positive")
        _check_rate(self.sampling_rate)
        if self.neighbouring not in ("add_remove", "replace_one"):
            raise ValueError("neighbouring is 'add_remove' or 'replace_one'")
        if self.neighbouring == "replace_one" and self.sampling_rate < 1:
            raise ValueError("Poisson-sampled events are accounted add/remove-one only")
        if (self.population is None) != (self.sample_size is None):
            raise ValueError("sampling without replacement needs both population and sample_size")
        if self.sample_size is not None:
            if type(self.population) is not int or type(self.sample_size) is not int \
                    or not 1 <= self.sample_size <= self.population:
                raise ValueError("need ints 1 <= sample_size <= population")
            if self.neighbouring != "replace_one" or self.sampling_rate < 1:
                raise ValueError("sampling without replacement is accounted replace-one, without Poisson sampling")

    @property
    def without_replacement(self) -> bool:
        return self.sample_size is not None and self.sample_size < self.population

    def dp_event(self) -> dp_accounting.DpEvent:
        event = _accounting().GaussianDpEvent(self.noise_multiplier)
        if self.sampling_rate < 1:
            event = _accounting().PoissonSampledDpEvent(self.sampling_rate, event)
        elif self.without_replacement:
            event = _accounting().SampledWithoutReplacementDpEvent(self.population, self.sample_size, event)
        return event

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.sample_size is None:  # the format of ledgers without fixed-size sampling is unchanged
            del d["population"], d["sample_size"]
        return {"name": self.name, **d}


@dataclass(frozen=True)
class NonPrivateMechanism:
    """A release with no noise against this observer (e.g. the trusted server of central DP)."""

    reason: str
    name: ClassVar[str] = "non_private"

    def dp_event(self) -> dp_accounting.DpEvent:
        return _accounting().NonPrivateDpEvent()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}


@dataclass(frozen=True)
class SkellamMechanism:
    """Summed Skellam noise of `variance`, integer-domain sensitivities (arXiv 2110.04995)."""

    l1_sensitivity: float
    l2_sensitivity: float
    variance: float
    sampling_rate: float = 1.0
    scale: float = 1.0
    """Integer units per float unit (informational)."""
    name: ClassVar[str] = "skellam"

    def __post_init__(self) -> None:
        if not (self.l1_sensitivity > 0 and self.l2_sensitivity > 0 and self.variance > 0):
            raise ValueError("Skellam sensitivities and variance must be positive")
        _check_rate(self.sampling_rate)

    def rdp(self, orders: Sequence[float] = ORDERS) -> np.ndarray:
        return skellam_curve(l1=self.l1_sensitivity, l2=self.l2_sensitivity, variance=self.variance,
                             sampling_rate=self.sampling_rate, orders=orders)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}


@dataclass(frozen=True)
class DiscreteGaussianMechanism:
    """Sum of n_clients discrete Gaussians of parameter local_stddev (arXiv 2102.06387)."""

    l1_sensitivity: float
    l2_sensitivity: float
    local_stddev: float
    n_clients: int
    dim: int
    sampling_rate: float = 1.0
    scale: float = 1.0
    name: ClassVar[str] = "discrete_gaussian"

    def __post_init__(self) -> None:
        if not (self.l1_sensitivity > 0 and self.l2_sensitivity > 0 and self.local_stddev > 0):
            raise ValueError("discrete Gaussian sensitivities and stddev must be positive")
        if self.n_clients < 1 or self.dim < 1:
            raise ValueError("n_clients and dim must be positive")
        _check_rate(self.sampling_rate)

    def rdp(self, orders: Sequence[float] = ORDERS) -> np.ndarray:
        return discrete_gaussian_curve(l1=self.l1_sensitivity, l2=self.l2_sensitivity,
                                       local_stddev=self.local_stddev, n_clients=self.n_clients,
                                       dim=self.dim, sampling_rate=self.sampling_rate, orders=orders)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}


@dataclass(frozen=True)
class NoReleaseMechanism:
    """A sampled round that released nothing (its cohort was below the floor): no privacy loss on its
    own, but it counts towards the boundary delta of amplified accounting (`dp.sampling`)."""

    reason: str
    sampling_rate: float = 1.0
    name: ClassVar[str] = "no_release"

    def __post_init__(self) -> None:
        _check_rate(self.sampling_rate)

    def dp_event(self) -> dp_accounting.DpEvent:
        return _accounting().NoOpDpEvent()

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}


_MECHANISMS: dict[str, type] = {m.name: m for m in (GaussianMechanism, NonPrivateMechanism, SkellamMechanism,
                                                    DiscreteGaussianMechanism, NoReleaseMechanism)}


def mechanism_from_dict(d: Mapping[str, Any]) -> Mechanism:
    d = dict(d)
    cls = _MECHANISMS.get(d.pop("name", None))
    if cls is None:
        raise ValueError(f"unknown mechanism in ledger state: {d}")
    allowed = {f.name for f in fields(cls)}
    if set(d) - allowed:
        raise ValueError(f"unexpected fields for {cls.name}: {sorted(set(d) - allowed)}")
    return cls(**d)


def _is_event_mechanism(m: Mechanism) -> bool:
    return isinstance(m, (GaussianMechanism, NonPrivateMechanism, NoReleaseMechanism))


def boundary_delta_of(entries: Iterable["LedgerEntry"]) -> float:
    """The delta that amplified rounds with a release floor add (sum of count x per-round term)."""
    return float(sum(e.count * e.sampling.boundary_delta for e in entries
                     if e.sampling is not None and getattr(e.mechanism, "sampling_rate", 1.0) < 1))


# ---- composition ------------------------------------------------------------------------------

ADD_REMOVE, REPLACE_ONE = "add_remove", "replace_one"


def _without_replacement(m: Mechanism) -> bool:
    return bool(getattr(m, "without_replacement", False))


def neighbouring_of(mechanisms: Iterable[Mechanism]) -> str:
    """The relation a label is accounted under: replace-one if any entry is sampled without
    replacement (ValueError if another is Poisson-sampled: no bound covers the mix), else add/remove."""
    ms = [m for m in mechanisms if not isinstance(m, NoReleaseMechanism)]
    if not any(_without_replacement(m) for m in ms):
        return ADD_REMOVE
    poisson = [m for m in ms if getattr(m, "sampling_rate", 1.0) < 1]
    if poisson:
        raise ValueError(f"a label cannot compose fixed-size (replace-one) and Poisson-sampled entries: {poisson[0]!r}")
    return REPLACE_ONE


def as_replace_one(m: Mechanism) -> Mechanism:
    """The same release accounted replace-one: a replace is a remove and an add, so an add/remove
    sensitivity at most doubles (module doc)."""
    if isinstance(m, GaussianMechanism):
        if m.neighbouring == REPLACE_ONE:
            return m
        return replace(m, noise_multiplier=m.noise_multiplier / 2, neighbouring=REPLACE_ONE,
                       sensitivity=None if m.sensitivity is None else 2 * m.sensitivity)
    if isinstance(m, (SkellamMechanism, DiscreteGaussianMechanism)):
        return replace(m, l1_sensitivity=2 * m.l1_sensitivity, l2_sensitivity=2 * m.l2_sensitivity)
    return m


@lru_cache(maxsize=4096)
def _rdp_curve(mechanism: Mechanism, orders: tuple[float, ...], relation: str = ADD_REMOVE) -> np.ndarray:
    if _is_event_mechanism(mechanism):
        dpa = _accounting()
        rel = (dpa.NeighboringRelation.REPLACE_ONE if relation == REPLACE_ONE
               else dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
        acc = dpa.rdp.RdpAccountant(list(orders), neighboring_relation=rel)
        acc.compose(mechanism.dp_event())
        return acc.rdp
    return mechanism.rdp(orders)


def _event(parts: Sequence[tuple[Mechanism, int]]) -> dp_accounting.DpEvent:
    dpa = _accounting()
    return dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(m.dp_event(), c) for m, c in parts])


def _rdp_epsilon(parts: Sequence[tuple[Mechanism, int]], *, delta: float, orders: tuple[float, ...],
                 relation: str = ADD_REMOVE) -> float:
    """Sum of count x curve over the parts, converted by dp_accounting. For Gaussian events this is
    exactly what RdpAccountant does for SelfComposed/Composed events (RDP adds up), with each
    single-event curve computed once by dp_accounting and cached."""
    total = np.zeros(len(orders))
    for m, c in parts:
        total = total + c * _rdp_curve(m, orders, relation)
    return epsilon_from_rdp(total, delta=delta, orders=orders)


def _pld_epsilon(parts: Sequence[tuple[Mechanism, int]], *, delta: float, discretization: float) -> float:
    acc = _accounting().pld.PLDAccountant(value_discretization_interval=discretization)
    acc.compose(_event(parts))
    return float(acc.get_epsilon(delta))


def compose_epsilon(parts: Sequence[tuple[Mechanism, int]], *, delta: float, accountant: str = "rdp",
                    orders: Sequence[float] = ORDERS, pld_discretization: float = 1e-4) -> float:
    """Epsilon at `delta` of the composition of (mechanism, times) pairs."""
    parts = [(m, int(c)) for m, c in parts if c > 0 and not isinstance(m, NoReleaseMechanism)]
    if not parts:
        return 0.0
    if any(isinstance(m, NonPrivateMechanism) for m, _ in parts):
        return math.inf
    orders = tuple(orders)
    if accountant not in ("rdp", "pld"):
        raise ValueError("accountant is 'rdp' or 'pld'")
    if neighbouring_of(m for m, _ in parts) == REPLACE_ONE:
        return _rdp_epsilon([(as_replace_one(m), c) for m, c in parts], delta=delta, orders=orders,
                            relation=REPLACE_ONE)
    if accountant == "rdp":
        return _rdp_epsilon(parts, delta=delta, orders=orders)
    events = [(m, c) for m, c in parts if _is_event_mechanism(m)]
    others = [(m, c) for m, c in parts if not _is_event_mechanism(m)]
    if not others:
        return _pld_epsilon(events, delta=delta, discretization=pld_discretization)
    all_rdp = _rdp_epsilon(parts, delta=delta, orders=orders)
    if not events:
        return all_rdp
    split = (_pld_epsilon(events, delta=delta / 2, discretization=pld_discretization)
             + _rdp_epsilon(others, delta=delta / 2, orders=orders))
    return min(all_rdp, split)


# ---- the ledger -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Budget:
    unit: PrivacyUnit
    observer: Observer
    epsilon: float


@dataclass(frozen=True)
class LedgerConfig:
    delta: float = 1e-5
    """The delta every epsilon is reported at."""
    accountant: str = "rdp"
    """'rdp' (default) or 'pld' (tighter for Gaussians; Skellam/DDG stay RDP)."""
    budgets: tuple[Budget, ...] = ()
    """Per-client caps; a debit that would exceed one raises BudgetExceeded."""
    pld_discretization: float = 1e-4

    def __post_init__(self) -> None:
        if not 0 < self.delta < 1:
            raise ValueError("delta must be in (0, 1)")
        if self.accountant not in ("rdp", "pld"):
            raise ValueError("accountant is 'rdp' or 'pld'")


@dataclass(frozen=True)
class LedgerEntry:
    mechanism: Mechanism
    unit: PrivacyUnit
    observer: Observer
    summary_key: str
    count: int
    rounds: tuple[int, ...]
    sampling: SamplingRecord | None = None
    """How the cohort (or the batch) was drawn: the only basis for a mechanism's sampling_rate < 1."""


@dataclass(frozen=True)
class Charge:
    """Receipt of one debit: proof for the disclosure guard that a release was accounted."""

    client_id: int
    entry_index: int
    mechanism: Mechanism
    unit: PrivacyUnit
    observer: Observer
    summary_key: str
    round_id: int | None


@dataclass
class _Account:
    entries: list[LedgerEntry] = field(default_factory=list)
    models: dict[int, str] = field(default_factory=dict)


class Ledger:
    """Per-client privacy accounts. Not thread-safe; one per run (or per client process)."""

    def __init__(self, config: LedgerConfig = LedgerConfig()) -> None:
        self.config = config
        self._accounts: dict[int, _Account] = {}
        self._memo: dict[tuple, float] = {}
        self._noise: list[dict[str, Any]] = []
        """One record per distributed-DP release: planned and realised noise (`dp.xnoise.NoiseRecord`)."""

    # ---- debits ---------------------------------------------------------------------------
    def debit(self, client_id: int, mechanism: Mechanism, *, unit: PrivacyUnit | str,
              observer: Observer | str, round_id: int | None = None, summary_key: str = "",
              count: int = 1, enforce_budget: bool = True, sampling: SamplingRecord | None = None) -> Charge:
        """Record `count` uses of `mechanism` for one client; raise BudgetExceeded (nothing recorded)
        if a budget for this (unit, observer) would be exceeded. `enforce_budget=False` records a
        release that has already happened (a client's own noisy value the server received): the
        ledger must show it whatever the budget, which is enforced where the noise is drawn.
        `sampling` records the sampler; a mechanism accounted with sampling_rate < 1 is refused
        (AmplificationNotJustified, nothing recorded) unless it is Poisson sampling at that rate, and one
        sampled without replacement unless the cohort was drawn by the fixed-size sampler of that size."""
        unit, observer = PrivacyUnit(unit), Observer(observer)
        _check_sampling(mechanism, sampling, what=f"{mechanism.name} ({summary_key or 'unnamed'}, {observer.value})")
        if not isinstance(client_id, (int, np.integer)) or isinstance(client_id, bool):
            raise TypeError("client ids are ints")
        if count < 1:
            raise ValueError("count must be positive")
        client_id = int(client_id)
        account = self._accounts.setdefault(client_id, _Account())
        index = next((i for i, e in enumerate(account.entries)
                      if (e.mechanism, e.unit, e.observer, e.summary_key, e.sampling)
                      == (mechanism, unit, observer, summary_key, sampling)),
                     None)
        rounds = () if round_id is None else (int(round_id),)
        if index is None:
            new = LedgerEntry(mechanism, unit, observer, summary_key, count, rounds, sampling)
            candidate = [*account.entries, new]
        else:
            old = account.entries[index]
            new = LedgerEntry(mechanism, unit, observer, summary_key, old.count + count, old.rounds + rounds, sampling)
            candidate = [*account.entries[:index], new, *account.entries[index + 1:]]
        neighbouring_of(e.mechanism for e in candidate if (e.unit, e.observer) == (unit, observer))
        if enforce_budget:
            self._check_budget(client_id, candidate, unit, observer)
        if index is None:
            account.entries.append(new)
            index = len(account.entries) - 1
        else:
            account.entries[index] = new
        return Charge(client_id, index, mechanism, unit, observer, summary_key, rounds[0] if rounds else None)

    def debit_many(self, clients: Iterable[int], mechanism: Mechanism, **kwargs) -> list[Charge]:
        return [self.debit(c, mechanism, **kwargs) for c in clients]

    def _check_budget(self, client_id: int, entries: list[LedgerEntry], unit: PrivacyUnit,
                      observer: Observer) -> None:
        for b in self.config.budgets:
            if (b.unit, b.observer) == (unit, observer):
                eps = self._epsilon_of(entries, unit, observer, self.config.delta)
                if eps > b.epsilon:
                    raise BudgetExceeded(
                        f"client {client_id}: {unit.value}-level epsilon against the {observer.value} "
                        f"would reach {eps:.4g} > budget {b.epsilon:.4g} (delta={self.config.delta:g})")

    def record_model(self, client_id: int, *, round_id: int, model_digest: str) -> None:
        """Which model version a client received (to detect model-inconsistency attacks)."""
        self._accounts.setdefault(int(client_id), _Account()).models[int(round_id)] = str(model_digest)

    # ---- queries --------------------------------------------------------------------------
    def clients(self) -> list[int]:
        return sorted(self._accounts)

    def entries(self, client_id: int) -> tuple[LedgerEntry, ...]:
        acc = self._accounts.get(int(client_id))
        return tuple(acc.entries) if acc else ()

    def holds(self, charge: Charge) -> bool:
        """True if `charge` was recorded by this ledger (its entry exists and covers its round)."""
        entries = self.entries(charge.client_id)
        if not 0 <= charge.entry_index < len(entries):
            return False
        e = entries[charge.entry_index]
        same = (e.mechanism, e.unit, e.observer, e.summary_key) == (
            charge.mechanism, charge.unit, charge.observer, charge.summary_key)
        return same and (charge.round_id is None or charge.round_id in e.rounds)

    def epsilon(self, client_id: int, *, unit: PrivacyUnit | str, observer: Observer | str,
                delta: float | None = None) -> float:
        """The client's composed epsilon for one (unit, observer) label (0 if never charged)."""
        unit, observer = PrivacyUnit(unit), Observer(observer)
        return self._epsilon_of(list(self.entries(client_id)), unit, observer, delta or self.config.delta)

    def _epsilon_of(self, entries: Sequence[LedgerEntry], unit: PrivacyUnit, observer: Observer,
                    delta: float) -> float:
        """Composed epsilon of the label's entries at `delta` less their boundary delta (`dp.sampling`)."""
        mine = [e for e in entries if (e.unit, e.observer) == (unit, observer)]
        parts = sorted(((e.mechanism, e.count) for e in mine), key=repr)
        remaining = delta - boundary_delta_of(mine)
        key = (tuple(parts), remaining, self.config.accountant)
        if key not in self._memo:
            if remaining <= 0:
                self._memo[key] = math.inf if any(not isinstance(m, NoReleaseMechanism) for m, _ in parts) else 0.0
            else:
                self._memo[key] = compose_epsilon(parts, delta=remaining, accountant=self.config.accountant,
                                                  pld_discretization=self.config.pld_discretization)
        return self._memo[key]

    def record_noise(self, record: Mapping[str, Any]) -> None:
        """Keep one release's planned and realised noise (distributed DP), for the report and recompute."""
        self._noise.append({k: record[k] for k in sorted(record)})

    def noise_records(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._noise]

    def labels(self, client_id: int) -> list[tuple[PrivacyUnit, Observer]]:
        return sorted({(e.unit, e.observer) for e in self.entries(client_id)}, key=lambda t: (t[0].value, t[1].value))

    # ---- reports and persistence ----------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """Per client: each entry (mechanism, parameters, epsilon of that entry alone) and the
        composed epsilon per 'unit/observer' label."""
        delta = self.config.delta
        clients = {}
        for cid in self.clients():
            entries = []
            for e in self.entries(cid):
                d = _entry_dict(e)
                d["epsilon"] = _json_float(self._epsilon_of([e], e.unit, e.observer, delta))
                d["delta"] = delta
                d["boundary_delta"] = boundary_delta_of([e])
                entries.append(d)
            totals = {f"{u.value}/{o.value}": _json_float(self.epsilon(cid, unit=u, observer=o))
                      for u, o in self.labels(cid)}
            relations = {f"{u.value}/{o.value}": neighbouring_of(e.mechanism for e in self.entries(cid)
                                                                 if (e.unit, e.observer) == (u, o))
                         for u, o in self.labels(cid)}
            clients[str(cid)] = {"entries": entries, "epsilon": totals, "neighbouring": relations,
                                 "models": {str(r): h for r, h in sorted(self._accounts[cid].models.items())}}
        report = {"format": LEDGER_FORMAT, "delta": delta, "accountant": self.config.accountant, "clients": clients}
        if self._noise:
            report["noise"] = self.noise_records()
        return report

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.report(), indent=indent)

    def write(self, path: str | Path) -> Path:
        """Write the report as JSON (conventionally `ledger.json`)."""
        path = Path(path)
        path.write_text(self.to_json())
        return path

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": LEDGER_FORMAT,
            "config": {"delta": self.config.delta, "accountant": self.config.accountant,
                       "pld_discretization": self.config.pld_discretization,
                       "budgets": [{"unit": b.unit.value, "observer": b.observer.value, "epsilon": b.epsilon}
                                   for b in self.config.budgets]},
            "clients": {str(cid): {"entries": [_entry_dict(e) for e in acc.entries],
                                   "models": {str(r): h for r, h in acc.models.items()}}
                        for cid, acc in sorted(self._accounts.items())},
            "noise": self.noise_records(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("format") != LEDGER_FORMAT:
            raise ValueError(f"not a ledger state of format {LEDGER_FORMAT}")
        cfg = state["config"]
        self.config = LedgerConfig(
            delta=float(cfg["delta"]), accountant=cfg["accountant"],
            pld_discretization=float(cfg.get("pld_discretization", 1e-4)),
            budgets=tuple(Budget(PrivacyUnit(b["unit"]), Observer(b["observer"]), float(b["epsilon"]))
                          for b in cfg.get("budgets", ())))
        accounts: dict[int, _Account] = {}
        for cid, acc in state["clients"].items():
            entries = [_entry_from_dict(e) for e in acc["entries"]]
            accounts[int(cid)] = _Account(entries, {int(r): str(h) for r, h in acc.get("models", {}).items()})
        self._accounts = accounts
        self._memo = {}
        self._noise = [dict(r) for r in state.get("noise", ())]

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> "Ledger":
        ledger = cls()
        ledger.load_state_dict(state)
        return ledger


def _check_sampling(mechanism: Mechanism, sampling: SamplingRecord | None, *, what: str) -> None:
    """AmplificationNotJustified unless the recorded sampler gives the amplification `mechanism` claims."""
    check_amplification(getattr(mechanism, "sampling_rate", 1.0), sampling, what=what)
    if _without_replacement(mechanism):
        check_without_replacement(population=mechanism.population, sample_size=mechanism.sample_size,
                                  record=sampling, what=what)


def _entry_dict(e: LedgerEntry) -> dict[str, Any]:
    return {"mechanism": e.mechanism.to_dict(), "unit": e.unit.value, "observer": e.observer.value,
            "summary_key": e.summary_key, "count": e.count, "rounds": list(e.rounds),
            "sampling": e.sampling.to_dict() if e.sampling is not None else None}


def _entry_from_dict(e: Mapping[str, Any]) -> LedgerEntry:
    """An entry from its saved form; the sampler must still justify any amplification it claims."""
    sampling = SamplingRecord.from_dict(e["sampling"]) if e.get("sampling") is not None else None
    mechanism = mechanism_from_dict(e["mechanism"])
    _check_sampling(mechanism, sampling, what=f"a saved {mechanism.name} entry")
    return LedgerEntry(mechanism, PrivacyUnit(e["unit"]), Observer(e["observer"]), str(e["summary_key"]),
                       int(e["count"]), tuple(int(r) for r in e["rounds"]), sampling)


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"
