"""The privacy frontier: accuracy against measured leakage, per cohort size, mechanism and epsilon.

Rotten Tomatoes sentiment, clients = groups of movies, a public split of movies held by no client,
with one of two models (`model_kit`): the bag-of-token-embeddings classifier
(`nlp_models.bag_of_tokens`, 488k shared values: its embedding update reveals token sets), or
MiniLM with bottleneck adapters in its top layer and a head (`nlp_models.adapter_sentiment`, 26k
shared values: the adapter-sized regime). FedAvg with plain-SGD clients, Poisson cohorts of
expected size `cohort` from `clients` (OS CSPRNG), and the settings:

| setting      | upload                                  | server sees                               | unit    |
|--------------|-----------------------------------------|-------------------------------------------|---------|
| plain        | the update (protocol 'plain')           | every client's update                     | -       |
| secagg       | the update, SecAgg+ masked              | the cohort's exact weighted mean          | -       |
| ddp_epsX     | clipped to C + Skellam noise, SecAgg+   | a noisy mean (client-level DP at X)       | client  |
| central_epsX | clipped to C, SecAgg+; TRUSTED server   | the exact sum (adds Gaussian noise once)  | client  |
| dpsgd_epsX   | Opacus DP-SGD update (protocol 'plain') | every client's update (example-level DP)  | example |

Accounting (every number from the run's ledger; `dp.sampling` for what sampling may claim):
- DDP: calibrated against the SERVER (it knows the cohort: no amplification) for a client that
  takes part in every round (R participations), so every client's server epsilon is <= X. The noise
  is calibrated to n_min = a lower quantile of the Poisson cohort size (rounds below it release
  nothing), and the ring holds an upper quantile.
- Central DP: the server is trusted, so its epsilon against the server is infinite; calibrated
  against outsiders who see the released models, amplified by Poisson sampling when the boundary
  delta of rounds below the floor allows it (else not amplified); with `sampler='fixed_size'`, by
  the sampling-without-replacement bound, which is replace-one (sensitivity 2C, `dp.sampling`).
  DDP against outsiders is not amplified by fixed-size cohorts (no such bound for Skellam here).
- DP-SGD: example-level, X for a client in every round, against anyone (it noises each update).

Attacks (`dp.leakage`), run on what the server received (its transcript):
- realistic: the token-recovery attacker calibrates its detector, threshold and k on SHADOW views it
  simulates from the public split (same training, same clipping and noise), then attacks the real
  views; on aggregate views also the differencing attack (released sums over known cohorts). The
  headline is its advantage over chance, (F1 - chance) / (1 - chance), max over these attacks;
- oracle: the best detector chosen with the ground truth and the true k (an upper bound);
- membership inference (LOSS) on the final model: members = participants' training snippets,
  non-members = the SAME clients' held-out snippets; AUC, TPR at 1% and 0.1% FPR; and the
  calibrated attacker, whose threshold is the 5% quantile of its losses on the public split (known
  non-members), with TPR - FPR as its advantage (and the best threshold's as the oracle's).
- the adapter model's upload has no token rows: token recovery and differencing do not apply, and
  its realistic attacker is the calibrated membership attack (its headline advantage).
Simplified: shadow views are simulated from the public initial model (round 1); later rounds'
updates have the same row support structure, but their scale drifts.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from scipy import stats

from dp.central import CentralDPConfig
from dp.distributed import DistributedDPConfig
from dp.leakage import Transcript, measure_leakage
from dp.leakage.differencing import random_cohorts, simulate_differencing_shadow
from dp.ledger import Ledger, LedgerConfig, NonPrivateMechanism, Observer, PrivacyUnit
from dp.sampling import boundary_delta
from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.choices import COHORT_TAIL, FRONTIER_MECHANISMS
from fl_algorithms.engine.secure_sum import SecureAggregationConfig
from fl_algorithms.engine.sim import RoundRecord, RunConfig, SimulationRunner
from dp.leakage.membership import calibrated_loss_attack, loss_threshold_attack
from dp.leakage.pipeline import json_epsilon, ledger_epsilons
from fl_algorithms.training import bag_trainer as bag
from fl_algorithms.training.bag_trainer import bag_trainer, shadow_clients
from nlp_models.bag_of_tokens import EMBEDDING_PART, HEAD_PART, BagTask, BagTaskConfig

MECHANISMS = FRONTIER_MECHANISMS
MIA_TARGET_FPR = 0.05
"""The realistic membership attacker's threshold: this quantile of its losses on the public split."""


@dataclass(frozen=True)
class ModelKit:
    """What the frontier needs of a task's model: its clients, DP-SGD clients and losses; whether
    its upload has token rows (the bag's embedding) that the token and differencing attacks read."""

    name: str
    parts: tuple[str, ...]
    build_trainers: Callable[..., dict]
    calibrated_dpsgd_configs: Callable[..., dict]
    build_dp_trainers: Callable[..., dict]
    example_losses: Callable[..., np.ndarray]
    public_losses: Callable[..., np.ndarray]
    token_attacks: bool


def model_kit(task: Any) -> ModelKit:
    """The kit of a loaded task: `BagTask` (nlp_models.bag_of_tokens) or `AdapterTask`
    (nlp_models.adapter_sentiment)."""
    if isinstance(task, BagTask):
        return ModelKit("bag", (EMBEDDING_PART, HEAD_PART), bag.build_trainers, bag.calibrated_dpsgd_configs,
                        bag.build_dp_trainers, bag.example_losses, bag.public_losses, token_attacks=True)
    from fl_algorithms.training import adapter_sentiment_trainer as adapter
    from nlp_models.adapter_sentiment import AdapterTask

    if isinstance(task, AdapterTask):
        return ModelKit("adapter", tuple(sorted(task.initial)), adapter.build_trainers, adapter.calibrated_dpsgd_configs,
                        adapter.build_dp_trainers, adapter.example_losses, adapter.public_losses, token_attacks=False)
    raise TypeError(f"no frontier model for {type(task).__name__}")

RING_TAIL = 1e-9
"""... and its ring sized for the RING_TAIL upper quantile (a larger cohort stops the run)."""


@dataclass(frozen=True)
class Setting:
    name: str
    label: str
    protocol: str
    mechanism: str = "none"
    """'none', 'ddp', 'central' or 'dpsgd'."""
    epsilon: float | None = None


@dataclass(frozen=True)
class FrontierConfig:
    task: Any = field(default_factory=lambda: BagTaskConfig(num_clients=200, public_fraction=0.1))
    """BagTaskConfig (bag-of-embeddings) or AdapterTaskConfig (MiniLM adapters): both have num_clients,
    public_fraction and seed."""
    rounds: int = 20
    cohort: int = 20
    """Expected clients per round (Poisson rate cohort / clients)."""
    sampler: str = "poisson"
    cohort_tail: float = COHORT_TAIL
    """Poisson cohorts: DDP's floor n_min is this lower quantile of the cohort size. A round with fewer
    clients releases nothing, so a larger tail costs skipped rounds, never privacy; a smaller one costs
    noise (each client's share is sized for n_min contributors)."""
    exact_noise: bool = True
    """DDP's noise made exact for the survivors (XNoise, `dp.xnoise`): every released sum carries the
    accounted variance whatever the cohort's size from n_min up. False: each share is sized for n_min and
    left in, so a round of u survivors carries u / n_min times the noise (the runs before 2026-11-29)."""
    max_participations: int | None = None
    """A client takes part in at most this many rounds (`RunConfig.max_participations`, every setting alike,
    so costs stay paired): DDP's noise and DP-SGD's are then calibrated for this many participations
    against the server instead of every round. None: calibrated for `rounds` participations."""
    local_epochs: int = 5
    epsilons: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    mechanisms: tuple[str, ...] = MECHANISMS
    clip: float = 1.0
    """C: client-level L2 clip of DDP and central DP, per-example clip of DP-SGD."""
    ddp_bits: int = 20
    delta: float = 1e-5
    secure_clip: float = 4.0
    """Per-coordinate range of the fixed-point encoding (noise-free sums); clipped values are counted."""
    shadow_clients: int = 40
    """Shadow clients the attacker simulates from the public split (calibration of its attacks)."""
    shadow_views: int = 8
    """Aggregate shadow views (simulated cohort means) it calibrates on."""
    save_transcripts: bool = False
    baselines: bool = True
    """Also run plaintext and SecAgg+ (the epsilon = inf rows). False for a run that adds epsilons to cells
    another run already measured: `--combine` joins them and pairs the costs with that run's plaintext."""
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.baselines and not (self.mechanisms and self.epsilons):
            raise ValueError("without the baselines there must be a mechanism and an epsilon to run")
        if self.rounds < 1 or self.local_epochs < 1:
            raise ValueError("rounds and local_epochs must be positive")
        if self.max_participations is not None and not 1 <= self.max_participations <= self.rounds:
            raise ValueError(f"max_participations must be in 1..rounds ({self.rounds}), or None")
        if not 2 <= self.cohort < self.task.num_clients:
            raise ValueError("need 2 <= cohort < clients (a cohort is a sample of the population)")
        if self.sampler not in ("poisson", "seeded", "fixed_size"):
            raise ValueError("sampler is 'poisson', 'seeded' or 'fixed_size'")
        if not 0.0 < self.cohort_tail < 0.5:
            raise ValueError(f"cohort_tail is a lower quantile in (0, 0.5), got {self.cohort_tail}")
        if set(self.mechanisms) - set(MECHANISMS):
            raise ValueError(f"mechanisms are among {MECHANISMS}")
        if any(not e > 0 for e in self.epsilons):
            raise ValueError("epsilons must be positive (plain and secagg are the epsilon = inf rows)")
        if self.task.public_fraction <= 0:
            raise ValueError("the attacker's shadow clients need a public split (task.public_fraction > 0)")

    @property
    def rate(self) -> float:
        return self.cohort / self.task.num_clients

    @property
    def participations(self) -> int:
        """The most rounds a client can take part in: what noise is calibrated for against the server."""
        return self.max_participations or self.rounds

    def settings(self) -> list[Setting]:
        out = [Setting("plain", "plaintext", "plain"), Setting("secagg", "SecAgg+", "secagg+")] if self.baselines else []
        labels = {"ddp": "SecAgg+ + DDP", "central": "SecAgg+ + central DP", "dpsgd": "DP-SGD"}
        for mech in self.mechanisms:
            for e in self.epsilons:
                out.append(Setting(f"{mech}_eps{e:g}", f"{labels[mech]} eps={e:g}",
                                   "plain" if mech == "dpsgd" else "secagg+", mech, e))
        return out

    def cohort_range(self) -> tuple[int, int]:
        """(floor, ceiling) of the cohort size: the quantiles DDP is calibrated and sized for."""
        n = self.task.num_clients
        if self.sampler != "poisson":
            return self.cohort, self.cohort
        low = int(stats.binom.ppf(self.cohort_tail, n, self.rate))
        high = int(stats.binom.isf(RING_TAIL, n, self.rate)) + 1
        return max(2, low), min(n, high)

    def outsider_rate(self, floor: int) -> float:
        """The Poisson rate an outsider's accounting may claim with this floor: q when the boundary delta
        of all rounds is at most delta / 10 (`dp.sampling`), else 1 (no amplification)."""
        if self.sampler != "poisson":
            return 1.0
        b = boundary_delta(population=self.task.num_clients, rate=self.rate, min_cohort=floor)
        return self.rate if self.rounds * b <= self.delta / 10 else 1.0


# ---- one setting -------------------------------------------------------------------------------------

@dataclass
class RunOutput:
    setting: Setting
    history: list[RoundRecord]
    final: dict[str, np.ndarray]
    ledger: Ledger
    transcript: Transcript | None
    """None once measured (`run_frontier` releases it)."""
    seconds: float
    parameters: dict[str, Any]


def participation_cap(*, population: int, rate: float, rounds: int, expected_capped: float = 1.0) -> int:
    """The smallest cap K such that fewer than `expected_capped` of `population` clients are expected to be
    drawn more than K times in `rounds` Poisson rounds at `rate` (population x P[Binomial(rounds, rate) > K]):
    a cap that rarely binds, chosen from the sampler alone, before any training (`--max-participations auto`)."""
    for k in range(1, rounds + 1):
        if population * stats.binom.sf(k, rounds, rate) <= expected_capped:
            return k
    return rounds


def secure_config(setting: Setting, task: Any, cfg: FrontierConfig) -> tuple[SecureAggregationConfig, dict]:
    """The secure layer of a setting and what it was configured with (for the ledger file)."""
    n, (floor, ceiling) = task.config.num_clients, cfg.cohort_range()
    ddp = central = None
    params: dict[str, Any] = {"mechanism": setting.mechanism, "protocol": setting.protocol}
    if setting.mechanism == "ddp":
        q = cfg.outsider_rate(floor)
        ddp = DistributedDPConfig(l2_clip=cfg.clip, target_epsilon=setting.epsilon, delta=cfg.delta,
                                  expected_clients=ceiling, min_clients=floor, bits=cfg.ddp_bits,
                                  rounds=cfg.participations, sampling_rate=q, population=n if q < 1 else None,
                                  target_observer="server", exact_noise=cfg.exact_noise)
        params.update(unit="client", target_observer="server", target_horizon=cfg.participations,
                      max_participations=cfg.max_participations, n_min=floor,
                      expected_clients=ceiling, outsider_rate=q, exact_noise=cfg.exact_noise)
    elif setting.mechanism == "central":
        fixed = cfg.sampler == "fixed_size"  # the without-replacement bound (replace-one), no boundary delta
        q = cfg.rate if fixed else cfg.outsider_rate(2)
        central = CentralDPConfig(l2_clip=cfg.clip, target_epsilon=setting.epsilon, delta=cfg.delta, rounds=cfg.rounds,
                                  sampling_rate=q, population=n if q < 1 else None, min_cohort=2,
                                  sampler="fixed_size" if fixed else "poisson")
        params.update(unit="client", target_observer="outsider", target_horizon=cfg.rounds, outsider_rate=q,
                      outsider_sampling="without_replacement" if fixed and q < 1 else "poisson" if q < 1 else "none")
    secure = SecureAggregationConfig(protocol=setting.protocol, clip=cfg.secure_clip,
                                     max_weight=float(max(len(d.train) for d in task.clients.values())),
                                     max_clients=n, distributed_dp=ddp, central_dp=central,
                                     min_release_group=2)
    return secure, params


def run_setting(setting: Setting, task: Any, cfg: FrontierConfig, *, progress: bool) -> RunOutput:
    kit = model_kit(task)
    ledger = Ledger(LedgerConfig(delta=cfg.delta))
    transcript = Transcript(protocol=setting.protocol, dtype="float32", parts=list(kit.parts))
    secure, params = secure_config(setting, task, cfg)
    if setting.mechanism == "dpsgd":
        configs = kit.calibrated_dpsgd_configs(task, target_epsilon=setting.epsilon, delta=cfg.delta,
                                               max_grad_norm=cfg.clip, local_epochs=cfg.local_epochs,
                                               planned_rounds=cfg.participations)
        trainers = kit.build_dp_trainers(task, dp_config=configs, ledger=ledger)
        params.update(unit="example", target_observer="anyone", planned_participations=cfg.participations,
                      noise_multiplier=sorted({c.noise_multiplier for c in configs.values()}))
    else:
        trainers = kit.build_trainers(task)
    run = RunConfig(rounds=cfg.rounds, clients_per_round=cfg.cohort, seed=cfg.seed, secure=secure, sampler=cfg.sampler,
                    max_participations=cfg.max_participations)
    runner = SimulationRunner(algorithm=FedAvg(local_epochs=cfg.local_epochs), trainers=trainers, config=run,
                              initial=task.initial, ledger=ledger, transcript=transcript)

    def on_round(rec: RoundRecord) -> None:  # noise-free settings: the ledger says so, per participation
        if setting.mechanism == "none" and rec.contributors:
            seen = ("plaintext upload: the server reads the client's update" if setting.protocol == "plain"
                    else "secure sum without noise: the server reads the cohort's exact sum")
            for observer, reason in ((Observer.SERVER, seen), (Observer.OUTSIDER, "global model released without noise")):
                ledger.debit_many(rec.contributors, NonPrivateMechanism(reason=reason), unit=PrivacyUnit.CLIENT,
                                  observer=observer, round_id=rec.round, summary_key="model-update")

    runner.on_round = on_round
    t0 = time.perf_counter()
    history = runner.run(progress=progress, desc=setting.name)
    seconds = time.perf_counter() - t0
    if cfg.max_participations is not None:  # how often the cap bound: draws it left out, and whose
        params["capped_draws"] = sum(len(r.capped) for r in history)
        params["capped_clients"] = len({c for r in history for c in r.capped})
    final = {k: np.asarray(v) for k, v in runner.algorithm.shared_parameters(runner.state).items()}
    if secure.distributed_dp is not None:
        params["plan"] = runner.aggregator.ddp_encoder(sum(v.size for v in task.initial.values())).plan.summary()
        noise = ledger.noise_records()  # one per released round: planned and realised over the accounted target
        if noise:
            params["noise_planned_over_target"] = float(np.mean([r["planned_variance"] / r["target_variance"] for r in noise]))
            params["noise_realised_over_target"] = float(np.mean([r["realised_variance"] / r["target_variance"] for r in noise]))
    if secure.central_dp is not None:
        params["noise_multiplier"] = runner.aggregator.central.noise_multiplier
    return RunOutput(setting, history, final, ledger, transcript, seconds, params)


# ---- the attacker's shadow views ---------------------------------------------------------------------

def _flat(params: Mapping[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(params[k], dtype=np.float64) for k in sorted(params)])


def _embedding(update: Mapping[str, np.ndarray]) -> np.ndarray:
    return np.asarray(update[EMBEDDING_PART], dtype=np.float64)


def shadow_updates(task: BagTask, cfg: FrontierConfig, setting: Setting) -> list[tuple[dict[str, np.ndarray], frozenset[int], int]]:
    """One round of the real recipe on each shadow client, from the public initial model:
    (update per part, its token set, its example count). DP-SGD shadows run DP-SGD (the attacker
    knows z); nothing is charged to any real client."""
    sizes = [len(d.train) for d in task.clients.values()]
    per = int(np.median(sizes))
    n = min(cfg.shadow_clients, len(task.public) // per)
    clients = shadow_clients(task, n_clients=n, examples_per_client=per, seed=cfg.seed)
    if setting.mechanism == "dpsgd":
        configs = bag.calibrated_dpsgd_configs(task, target_epsilon=setting.epsilon, delta=cfg.delta,
                                               max_grad_norm=cfg.clip, local_epochs=cfg.local_epochs,
                                               planned_rounds=cfg.rounds, clients=clients)
        trainers = bag.build_dp_trainers(task, dp_config=configs, ledger=Ledger(), clients=clients)
    else:
        trainers = {c: bag_trainer(task, client_id=c, data=d) for c, d in clients.items()}
    out = []
    for c, trainer in trainers.items():
        trainer.train(epochs=cfg.local_epochs, round=1)
        new = trainer.get_shared()
        out.append(({k: np.asarray(new[k], dtype=np.float64) - task.initial[k] for k in task.initial},
                    clients[c].train.tokens(), len(clients[c].train)))
    return out


def _clip(update: Mapping[str, np.ndarray], c: float) -> dict[str, np.ndarray]:
    norm = float(np.linalg.norm(_flat(update)))
    scale = min(1.0, c / norm) if norm > 0 else 1.0
    return {k: v * scale for k, v in update.items()}


def mean_noise_std(run: RunOutput, cfg: FrontierConfig) -> float:
    """Per-coordinate noise std of the released mean of a typical (expected-size) cohort."""
    p = run.parameters
    if run.setting.mechanism == "ddp":
        return p["plan"]["local_stddev"] * math.sqrt(cfg.cohort) / cfg.cohort
    if run.setting.mechanism == "central":
        return p["noise_multiplier"] * cfg.clip / cfg.cohort
    return 0.0


def shadow_views(run: RunOutput, task: BagTask, cfg: FrontierConfig, updates, rng: np.random.Generator) -> dict[str, list]:
    """What the attacker calibrates on, of the same kind as the server's view of this setting."""
    s = run.setting
    if s.protocol == "plain":  # individual updates (DP-SGD ones carry their own noise)
        return {"individual": [(_embedding(u), toks) for u, toks, _ in updates]}
    clipped = s.mechanism in ("ddp", "central")
    std = mean_noise_std(run, cfg)
    agg, k = [], min(cfg.cohort, len(updates))
    for _ in range(cfg.shadow_views):
        members = rng.choice(len(updates), size=k, replace=False)
        if clipped:
            mean = np.mean([_embedding(_clip(updates[i][0], cfg.clip)) for i in members], axis=0)
        else:
            w = np.array([updates[i][2] for i in members], dtype=np.float64)
            mean = np.sum([w_i * _embedding(updates[i][0]) for w_i, i in zip(w, members)], axis=0) / w.sum()
        mean = mean + rng.normal(0.0, std, size=mean.shape) if std > 0 else mean
        agg.append((mean, frozenset().union(*(updates[i][1] for i in members))))
    base = [((_embedding(_clip(u, cfg.clip)) if clipped else _embedding(u) * n), toks) for u, toks, n in updates]
    diff = simulate_differencing_shadow(base, cohorts=random_cohorts(range(len(base)), size=k, rounds=cfg.rounds, rng=rng),
                                        shape=task.embedding_shape, noise_std=std * cfg.cohort, rng=rng)
    return {"aggregate": agg, "differencing": diff}


# ---- measuring one run -------------------------------------------------------------------------------

def calibrated_membership(kit: ModelKit, task: Any, final: Mapping[str, np.ndarray], members: np.ndarray,
                          nonmembers: np.ndarray) -> dict[str, Any]:
    """The calibrated LOSS attacker (threshold from the public split, `calibrated_loss_attack`) with its
    oracle bound, and how many public examples it calibrated on."""
    calibrated = calibrated_loss_attack(members, nonmembers, reference_losses=kit.public_losses(task, final),
                                        target_fpr=MIA_TARGET_FPR)
    return {"calibrated": calibrated, "n_reference": int(len(task.public))}


def measure(run: RunOutput, task: Any, cfg: FrontierConfig, *, shadow: Mapping[str, list] | None,
            export: Any = None) -> dict[str, Any]:
    """Every number of one run. Bag model: token recovery and differencing (realistic and oracle) plus
    membership. Adapter model: its upload has no token rows, so the realistic attacker is the
    calibrated membership attack, its oracle the best-threshold one (`membership`)."""
    kit = model_kit(task)
    participants = sorted(set().union(*(r.contributors for r in run.history)))
    unit = "example" if run.setting.mechanism == "dpsgd" else "client"
    # members = participants' training examples, non-members = the SAME clients' held-out ones
    members = kit.example_losses(task, run.final, split="train", clients=participants)
    nonmembers = kit.example_losses(task, run.final, split="test", clients=participants)
    calibrated = calibrated_membership(kit, task, run.final, members, nonmembers)
    if kit.token_attacks:
        leakage = measure_leakage(
            run.transcript, embedding_part=EMBEDDING_PART, vector_part=HEAD_PART, truth=task.token_sets(),
            shape=task.embedding_shape, ledger=run.ledger, unit=unit, member_losses=members,
            nonmember_losses=nonmembers, shadow=shadow, export=export)
        leakage["membership"] = {**leakage["membership"], **calibrated}
    else:
        if export is not None:
            run.transcript.save(export)
        eps = ledger_epsilons(run.ledger)
        mia = {**asdict(loss_threshold_attack(members, nonmembers)), **calibrated}
        leakage = {"membership": mia, "realistic_advantage": mia["calibrated"]["advantage"],
                   "oracle_advantage": mia["calibrated"]["oracle_advantage"],
                   "realistic_attack": "membership_loss_calibrated",
                   "epsilon": {k: json_epsilon(v) for k, v in eps.items()}, "epsilon_unit": unit,
                   "tokens": {"skipped": "the adapter upload has no token rows"}}
    return {"setting": asdict(run.setting), "accuracy": run.history[-1].mean("accuracy"), **leakage,
            "accuracy_curve": [r.mean("accuracy") for r in run.history],
            "cohort_sizes": [len(r.cohort) for r in run.history],
            "skipped_rounds": sum(1 for r in run.history if not r.contributors),
            "seconds": run.seconds, "clipped_values": int(sum(r.clipped for r in run.history)),
            "parameters": run.parameters}


def run_frontier(task: Any, cfg: FrontierConfig, *, progress: bool = True, out_dir=None,
                 on_result=None) -> tuple[dict[str, dict[str, Any]], dict[str, RunOutput]]:
    """Every setting of `cfg` on `task`: (results by setting name, the runs). Each run's transcript is
    released once it is measured (and exported, with `cfg.save_transcripts`): a plaintext run at
    cohort 50 over 20 rounds holds 2 GB of uploads, and a grid has several."""
    rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 0xA77AC]))
    tokens = model_kit(task).token_attacks
    cache: dict[tuple, list] = {}
    results, runs = {}, {}
    for setting in cfg.settings():
        run = run_setting(setting, task, cfg, progress=progress)
        key = ("dpsgd", setting.epsilon) if setting.mechanism == "dpsgd" else ("sgd",)
        if tokens and key not in cache:
            cache[key] = shadow_updates(task, cfg, setting)
        export = None
        if out_dir is not None and cfg.save_transcripts:
            export = out_dir / setting.name / "transcript"
            export.parent.mkdir(parents=True, exist_ok=True)
        shadow = shadow_views(run, task, cfg, cache[key], rng) if tokens else None
        results[setting.name] = measure(run, task, cfg, shadow=shadow, export=export)
        if on_result is not None:
            on_result(setting.name, run, results[setting.name])
        runs[setting.name] = replace(run, transcript=None)
        del run, shadow  # the next setting trains while this one's uploads are already freed
    return results, runs


# ---- auditing the DDP claim from the outside (dp.audit) ----------------------------------------------

AUDIT_DIM = 256
"""Values per synthetic client update in the frontier's audit (the model has 488k / 26k: see `audit_ddp`)."""


@dataclass(frozen=True)
class AuditPlan:
    """How many canaries the frontier's audit spends: `trials` independent runs of `rounds` rounds, each
    with a pool of `canaries_per_trial` canary clients inserted with probability 1/2 and
    `held_out_per_trial` more never inserted."""

    trials: int = 50
    canaries_per_trial: int = 8
    held_out_per_trial: int = 64
    dim: int = AUDIT_DIM


def audit_ddp(task: Any, cfg: FrontierConfig, *, epsilon: float | None = None, plan: AuditPlan = AuditPlan()) -> dict[str, Any]:
    """Audit the frontier's DDP setting at `epsilon` (default: its largest) with canary clients (`dp.audit`).

    At the secure-sum level, not inside the frontier's training run: the mechanism is the very
    `DistributedDPConfig` that `secure_config` builds for the setting (target epsilon against the
    server over `cfg.rounds` participations, noise floor n_min = the cohort's lower quantile, ring
    for its upper quantile, `cfg.ddp_bits` bits, clip `cfg.clip`), run through the project's DDP
    encoder and decoder for `cfg.rounds` rounds of Poisson cohorts at rate cohort / clients over a
    population of `task`'s size, in which canary clients replace background clients. What differs
    from the training run: client updates are synthetic vectors of `plan.dim` values (random
    directions of norm C, as clipped updates of the real model are), because the mechanism's
    privacy depends only on the clipped vectors' norms and the DDP plan for 256 values has the same
    noise multiplier up to its rounding inflation (both recorded). Returns the audit's numbers, JSON-ready,
    with `claimed_eps` the setting's target (the ledger's server epsilon) and its audit line."""
    from dp.audit.federated import CanaryDesign, Cohorts, audit
    from dp.audit.mechanisms import DistributedDP

    ddp = [s for s in cfg.settings() if s.mechanism == "ddp" and (epsilon is None or s.epsilon == epsilon)]
    if not ddp:
        raise ValueError(f"no DDP setting{'' if epsilon is None else f' at eps={epsilon:g}'} in this frontier")
    setting = max(ddp, key=lambda s: s.epsilon)
    secure, params = secure_config(setting, task, cfg)
    mechanism = DistributedDP(config=secure.distributed_dp, dim=plan.dim)
    design = CanaryDesign(trials=plan.trials, canaries_per_trial=plan.canaries_per_trial, inclusion=0.5,
                          held_out_per_trial=plan.held_out_per_trial, seed=cfg.seed)
    cohorts = Cohorts(population=task.config.num_clients, sampling_rate=cfg.rate, rounds=cfg.rounds,
                      max_participations=cfg.max_participations)
    result = audit(mechanism, design=design, cohorts=cohorts, delta=cfg.delta, claimed_epsilon=setting.epsilon)
    enc = mechanism.encoder.plan
    out = result.to_dict()
    out.update(setting=setting.name, claimed_eps=setting.epsilon, empirical_eps=out["empirical_epsilon"],
               eps_lower_bound=out["epsilon_lower_bound"], line=result.line(mechanism="ddp", claimed=setting.epsilon),
               claimed_observer="server", claimed_horizon=cfg.participations,
               outsider_eps=json_epsilon(enc.epsilon(observer="outsider", rounds=cfg.rounds)),
               server_eps=json_epsilon(enc.epsilon(observer="server", rounds=cfg.participations)),
               audit_dim=plan.dim, noise_multiplier_at_audit_dim=enc.noise_multiplier,
               level="secure-sum (synthetic client vectors, the setting's DDP config)",
               sampler="poisson" if cfg.sampler == "poisson" else f"poisson (the run used '{cfg.sampler}')")
    return out


__all__ = ["MECHANISMS", "Setting", "FrontierConfig", "participation_cap", "RunOutput", "secure_config", "run_setting", "shadow_updates",
           "shadow_views", "measure", "run_frontier", "AUDIT_DIM", "AuditPlan", "audit_ddp"]
