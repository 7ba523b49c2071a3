"""FedMCP's cross-task clients (Zhao et al. 2024, Sec. V) as a Task that both runtimes run the same way.

Four clients, each its own task and corpus (`nlp_models.data.cross_task.CLIENT_TASKS`), every corpus
split 6:2:2 afresh for each seed, the training splits capped to the smallest client's (or --train-cap)
and the test splits whole; a frozen encoder (MiniLM-L6, or a tiny random BERT
for tests) whose bottom layers are cached once per example, with adapters in its top layers. The
methods of FedMCP's comparison (Table I): FedMCP, FedAvg (PEFT: both adapters shared), FedRep, Local,
FedAvg (Full FT), FedLR (LoRA through peft), MOON and Ditto (`fl_algorithms.training.adapter_trainer`),
and the Table II ablations FedMCP w/o L_c (mu = 0) and w/o L_b (gamma = 0). FedAP (adapters shared by
FedAvg) is FedAvg (PEFT) here; FedMatch (semi-supervised) does not apply to fully labelled clients.
Ditto trains two local epochs per round (the global and the personal problem), every other method one.

`FedMCPClients.make_trainer(client_id, method=..., seed=...)` builds client k from client k's own
examples: it caches the frozen prefix of k's splits only. The simulation builds every client through
the same call, so a simulated run and a deployed one (`python -m fl_algorithms.deploy_cli client
--task fl_algorithms.tasks.fedmcp:build`) train identical clients. The server side needs no client
data: `initial()` and `parameter_counts()` come from a data-free model of the same shape.
SIMPLIFICATION: in a real deployment each client would hold its own corpus; here every process loads
the four packaged corpora (the cap is the smallest one's size) and keeps only its own.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import torch

from fl_algorithms.algorithms.fedavg import FedAvg
from fl_algorithms.algorithms.fedmcp import FedMCP
from fl_algorithms.algorithms.ditto import Ditto
from fl_algorithms.algorithms.fedrep import FedRep
from fl_algorithms.algorithms.local import Local
from fl_algorithms.algorithms.moon import MOON
from fl_algorithms.api import Algorithm
from fl_algorithms.choices import FEDMCP_ABLATIONS, FEDMCP_DEFAULT_METHODS, FEDMCP_METHODS
from fl_algorithms.experiments.task import Task, check_options, int_option, settings_option
from fl_algorithms.training.adapter_trainer import (BASELINE_MODEL, FEDMCP_MODEL, FEDMCP_PROTOCOLS, LOCAL_MODEL,
                                                    LORA_MODEL, MOON_MODEL, AdapterTrainer, FullFineTuneTrainer,
                                                    MethodModel, TrainConfig, fedmcp_protocol)
from fl_algorithms.training.protocol import TrainingProtocol
from nlp_models.backbone import BACKBONES, load_named_backbone  # noqa: F401  (re-exported)
from nlp_models.cpu import fast_bf16, set_torch_threads
from nlp_models.data.cross_task import CLIENT_TASKS, ClientData, build_client_data, split_clients
from nlp_models.data.dataset import DatasetSplits, TextDataset
from nlp_models.device import resolve_device
from nlp_models.frozen_prefix import CachedSplit, prefix_split

ABLATIONS = FEDMCP_ABLATIONS
"""FedMCP's Table II: without the contrastive loss L_c (mu = 0) and without the global-only loss L_b (gamma = 0)."""
METHODS = FEDMCP_METHODS
DEFAULT_METHODS = FEDMCP_DEFAULT_METHODS
"""What the 5-minute CPU demo runs; FedAvg (Full FT) trains and uploads every backbone weight, and
the other baselines and the ablations are named in the demo's output as left out (--algorithms adds them)."""
SPECS: Mapping[str, MethodModel] = {"fedmcp": FEDMCP_MODEL, "fedmcp_no_cl": FEDMCP_MODEL, "fedmcp_no_bl": FEDMCP_MODEL,
                                    "fedavg_peft": BASELINE_MODEL, "fedrep": BASELINE_MODEL, "local": LOCAL_MODEL,
                                    "fedlr": LORA_MODEL, "moon": MOON_MODEL, "ditto": BASELINE_MODEL}
"""Which adapter sets (or LoRA) each adapter method's clients have, train and share."""
TASK_OPTIONS = ("settings", "method", "seed", "device", "threads", "probe")


@dataclass(frozen=True)
class FedMCPSettings:
    """Everything that defines the clients and their training (saved in the run directory)."""

    rounds: int = 5
    train_cap: int | None = 180
    """Training examples per client, after the 6:2:2 split (None: the smallest client's training split,
    as the paper caps training sets). Test splits are not capped."""
    test_cap: int | None = None
    """None (default): every client is tested on its corpus's whole 20% test split. A number caps it,
    for smoke runs and tests only: results are then reported with `min_test_per_client`."""
    max_length: int = 64
    adapter_layers: int = 2
    bottleneck: int = 16
    head_hidden: int | None = 128
    """Hidden width of the MLP classifiers (None: linear classifiers)."""
    batch_size: int = 16
    """The paper uses 64 with ~2,400 training examples per client (~38 steps per round); our clients
    hold 180, where 64 would leave 3 optimizer steps per round and the comparison would measure
    step counts (FedRep's extra head epochs) rather than methods. 16 gives 12 steps per round."""
    lr: float = 5e-4
    gamma: float = 0.5
    mu: float = 0.05
    fedrep_head_epochs: int = 10
    moon_mu: float = 1.0
    """MOON's weight of the model-contrastive term (the authors' code default)."""
    moon_tau: float = 0.5
    ditto_lambda: float = 0.1
    """Ditto's pull of the personal adapters toward the global ones (the paper tunes it in {0.01, 0.1, 1, 2})."""
    dp: bool = False
    """Opacus DP-SGD on the adapters (FedMCP then runs with mu = 0: CKA is a batch-level term)."""
    dp_noise: float = 1.0
    dp_clip: float = 1.0
    dp_delta: float = 1e-5
    backbone_dropout: bool = False
    """Dropout in the frozen adapted layers (default off: it cost a quarter of each CPU step)."""
    precision: str = "auto"
    """'bf16' autocast in the encoder layers, 'fp32', or 'auto' (bf16 where it is faster than fp32: a CPU with
    AMX, a GPU from Ampere on: `nlp_models.cpu.fast_bf16`). The declared protocol records what it
    resolved to, and a resumed run keeps it."""
    training_protocol: str = "fedmcp"
    """FedMCP's declared protocol (`fl_algorithms.training.adapter_trainer.FEDMCP_PROTOCOLS`): 'fedmcp' keeps
    each client's Adam across rounds (as every run before protocols were declared, so a run saved without
    this field resumes as it ran), 'fedmcp-fresh' builds it afresh at every local run."""
    backbone: str = "minilm"
    """'minilm' (all-MiniLM-L6-v2) or 'tiny' (a seeded random 3-layer BERT, hidden 32: tests and smoke runs)."""

    def __post_init__(self) -> None:
        checks = [
            (self.rounds >= 1, "--rounds must be at least 1"),
            (self.train_cap is None or self.train_cap >= 10, "--train-cap must be at least 10"),
            (self.test_cap is None or self.test_cap >= 10, "--test-cap must be at least 10"),
            (8 <= self.max_length <= 512, "--max-length must be in 8..512"),
            (self.adapter_layers >= 1, "--adapter-layers must be at least 1"),
            (self.bottleneck >= 1, "--bottleneck must be at least 1"),
            (self.head_hidden is None or self.head_hidden >= 1, "--head-hidden must be positive (0 for linear)"),
            (self.batch_size >= 1, "--batch-size must be at least 1"),
            (self.lr > 0, "--lr must be positive"),
            (0.0 <= self.gamma <= 1.0, "--gamma must be in [0, 1]"),
            (self.mu >= 0, "--mu must be non-negative"),
            (self.fedrep_head_epochs >= 1, "--fedrep-head-epochs must be at least 1"),
            (self.moon_mu >= 0 and self.moon_tau > 0, "--moon-mu must be non-negative and --moon-tau positive"),
            (self.ditto_lambda >= 0, "--ditto-lambda must be non-negative"),
            (self.dp_noise > 0 and self.dp_clip > 0 and 0 < self.dp_delta < 1, "bad --dp-noise/--dp-clip/--dp-delta"),
            (self.precision in ("auto", "bf16", "fp32"), "--precision must be auto, bf16 or fp32"),
            (self.training_protocol in FEDMCP_PROTOCOLS,
             f"--training-protocol must be one of {', '.join(FEDMCP_PROTOCOLS)}, got {self.training_protocol!r}"),
            (self.backbone in BACKBONES, f"--backbone must be one of {', '.join(BACKBONES)}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def bf16(self) -> bool:
        """Whether the encoder layers run under bfloat16 autocast on this machine's CPU (the frozen-prefix cache)."""
        return self.bf16_on("cpu")

    def bf16_on(self, device: torch.device | str) -> bool:
        """Whether the encoder layers run under bfloat16 autocast on `device`."""
        return self.precision == "bf16" or (self.precision == "auto" and fast_bf16(device))

    def protocol(self, method: str = "fedmcp", *, device: torch.device | str = "cpu") -> TrainingProtocol:
        """The declared training protocol of `method`'s clients on `device` (its precision resolved there)."""
        return fedmcp_protocol(self.training_protocol, method=method, lr=self.lr,
                               precision="bf16" if self.bf16_on(device) else "fp32",
                               fedrep_head_epochs=self.fedrep_head_epochs, dp=self.dp)

    def train_config(self, *, device: torch.device | str = "cpu", method: str = "fedmcp") -> TrainConfig:
        dp = None
        if self.dp:
            from dp.opacus_client import DPSGDConfig

            dp = DPSGDConfig(noise_multiplier=self.dp_noise, max_grad_norm=self.dp_clip, batch_size=self.batch_size,
                             delta=self.dp_delta)
        return TrainConfig(batch_size=self.batch_size, lr=self.lr, dp=dp, dp_delta=self.dp_delta, bf16=self.bf16_on(device),
                           backbone_dropout=self.backbone_dropout, protocol=self.protocol(method, device=device))


FULL_PRESET = {"rounds": 25, "train_cap": None, "max_length": 128, "adapter_layers": 6, "batch_size": 64}
"""The paper's run: 25 rounds, clients capped to the smallest corpus, 128 tokens, batch 64, all 6 layers."""


def make_algorithm(method: str, settings: FedMCPSettings, *, probe: bool = True) -> Algorithm:
    """The server/client algorithm of `method` (one local epoch per round throughout); `probe=False`: FedMCP
    without its per-round gradient-norm probe (the plaintext twin, which trains exactly as FedMCP)."""
    mu = 0.0 if settings.dp else settings.mu
    if method == "fedmcp":
        return FedMCP(gamma=settings.gamma, mu=mu, probe=probe)
    if method == "fedmcp_no_cl":
        return FedMCP(gamma=settings.gamma, mu=0.0)
    if method == "fedmcp_no_bl":
        return FedMCP(gamma=0.0, mu=mu)
    if method in ("fedavg_peft", "fedavg_full", "fedlr"):
        return FedAvg(local_epochs=1)
    if method == "moon":
        return MOON(mu=settings.moon_mu, tau=settings.moon_tau, local_epochs=1)
    if method == "ditto":
        return Ditto(lam=settings.ditto_lambda, local_epochs=1, personal_epochs=1)
    if method == "fedrep":
        return FedRep(head_epochs=settings.fedrep_head_epochs, body_epochs=1)
    if method == "local":
        return Local(local_epochs=1)
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def check_method(method: str, settings: FedMCPSettings) -> None:
    """A clear error for a method these settings cannot run."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    if settings.dp and method == "fedavg_full":
        raise ValueError("--dp applies DP-SGD to adapters only; drop fedavg_full (or --with-full-ft)")
    if settings.dp and method == "ditto":
        raise ValueError("--dp: Ditto's proximal term is not implemented under DP-SGD; drop ditto")


@dataclass(frozen=True)
class ClientInfo:
    """What the server side may know of a client: its task, label count and split sizes (no examples)."""

    client_id: int
    key: str
    title: str
    num_labels: int
    sizes: Mapping[str, int]


@dataclass(frozen=True)
class ParameterCounts:
    trainable: float
    """Mean trainable parameters per client (heads differ with the label count)."""
    shared: int
    """Parameters each client uploads per round (0 for Local)."""


class FedMCPClients:
    """Builds client `k` of any method from client k's examples alone; the server's initial parameters.

    The frozen prefix is cached on the CPU (`nlp_models.frozen_prefix.cache_texts` runs there); the
    cached states and every client model (its copy of the adapted layers, adapters and heads, or
    full fine-tuning's trainable backbone) are moved to `device`.

    The data split depends on the seed (`texts(seed)`); the cached clients of one seed are kept until
    another seed is asked for, so a run that loops seeds outermost caches each client once per seed.
    """

    def __init__(self, settings: FedMCPSettings, *, device: str = "cpu") -> None:
        self.settings = settings
        self.device = resolve_device(device)
        self._seed: int | None = None
        """The seed whose split `_texts` holds and whose clients `_data` caches."""
        self._texts: dict[str, DatasetSplits] = {}
        self._data: dict[int, ClientData] = {}

    @cached_property
    def backbone(self) -> tuple[torch.nn.Module, Any]:
        """The frozen encoder (shared read-only by every client of this process) and its tokenizer."""
        model, tokenizer = load_named_backbone(self.settings.backbone)
        self.check_backbone(model)
        return model, tokenizer

    def check_backbone(self, model: torch.nn.Module) -> None:
        """A clear error when the backbone cannot serve these settings."""
        depth = model.config.num_hidden_layers
        if self.settings.adapter_layers > depth:
            raise ValueError(f"--adapter-layers {self.settings.adapter_layers} exceeds the backbone's {depth} layers")
        if self.settings.max_length > model.config.max_position_embeddings:
            raise ValueError(f"--max-length {self.settings.max_length} exceeds the backbone's "
                             f"{model.config.max_position_embeddings} positions")

    @cached_property
    def corpora(self) -> dict[str, TextDataset]:
        """Every task's whole packaged corpus (clients 1..4 in `CLIENT_TASKS` order)."""
        return {task.key: task.load() for task in CLIENT_TASKS}

    def texts(self, seed: int) -> dict[str, DatasetSplits]:
        """Every task's corpus split 6:2:2 by `seed`, training splits capped (`split_clients`)."""
        if self._seed != seed:
            self._texts = split_clients(self.corpora, cap_to=self.settings.train_cap, seed=seed,
                                        test_cap=self.settings.test_cap)
            self._seed, self._data = seed, {}
        return self._texts

    @cached_property
    def info(self) -> list[ClientInfo]:
        """Split sizes follow from the class counts alone (stratified largest-remainder splits and caps),
        so they are the same for every seed."""
        titles = {task.key: task.title for task in CLIENT_TASKS}
        return [ClientInfo(client_id=cid, key=key, title=titles.get(key, key), num_labels=parts.train.num_labels,
                           sizes={s: len(getattr(parts, s)) for s in ("train", "validation", "test")})
                for cid, (key, parts) in enumerate(self.texts(self._seed or 0).items(), start=1)]

    @property
    def num_clients(self) -> int:
        return len(self.info)

    @property
    def split_layer(self) -> int:
        """Layers below this index are frozen and cached."""
        return prefix_split(self.backbone[0], self.settings.adapter_layers)

    def client_data(self, client_id: int, *, seed: int) -> ClientData:
        """Client `client_id`'s splits of `seed` as frozen-prefix states, built from its own examples only
        (once per seed; another seed's cached clients are dropped)."""
        if not 1 <= client_id <= self.num_clients:
            raise ValueError(f"client id {client_id} is not in 1..{self.num_clients}")
        texts = self.texts(seed)  # drops another seed's cached clients
        if client_id not in self._data:
            key = self.info[client_id - 1].key
            model, tokenizer = self.backbone
            [data] = build_client_data(model, tokenizer, {key: texts[key]},
                                       max_length=self.settings.max_length,
                                       adapter_layers=self.settings.adapter_layers, bf16=self.settings.bf16)
            self._data[client_id] = replace(data, client_id=client_id,
                                            splits={k: v.to(self.device) for k, v in data.splits.items()})
        return self._data[client_id]

    # ---- clients --------------------------------------------------------------------------------
    def _trainer(self, data: ClientData, *, method: str, seed: int, full_backbone: torch.nn.Module | None = None):
        config = self.settings.train_config(device=self.device, method=method)
        if method == "fedavg_full":
            backbone = full_backbone if full_backbone is not None else self.trainable_backbone()
            return FullFineTuneTrainer(data=data, backbone=backbone, head_hidden=self.settings.head_hidden,
                                       config=config, seed=seed)
        check_method(method, self.settings)
        return AdapterTrainer(data=data, backbone=self.backbone[0], spec=SPECS[method],
                              bottleneck=self.settings.bottleneck, head_hidden=self.settings.head_hidden,
                              config=config, seed=seed)

    def trainable_backbone(self) -> torch.nn.Module:
        """A trainable copy of the backbone for FedAvg (Full FT)."""
        return copy.deepcopy(self.backbone[0]).requires_grad_(True)

    def make_trainer(self, client_id: int, *, method: str, seed: int,
                     full_backbone: torch.nn.Module | None = None) -> AdapterTrainer | FullFineTuneTrainer:
        """A fresh client of `method` (seeded adapters, heads, batch order) over its own cached examples.
        `full_backbone`: the trainable backbone FedAvg (Full FT) clients of one process may share."""
        check_method(method, self.settings)
        trainer = self._trainer(self.client_data(client_id, seed=seed), method=method, seed=seed, full_backbone=full_backbone)
        if self.device.type != "cpu":
            trainer.model.to(self.device)
        return trainer

    def trainer_factory(self, method: str, *, seed: int) -> Callable[[int], AdapterTrainer | FullFineTuneTrainer]:
        """`make_trainer` of one run. Under full fine-tuning the clients it builds share one trainable
        backbone (each loads the broadcast into it before training or evaluating, so only the heads and
        Adam states are per client): 4x less memory in a simulation; a deployed client holds its own."""
        shared: list[torch.nn.Module] = []

        def make(client_id: int) -> AdapterTrainer | FullFineTuneTrainer:
            if method == "fedavg_full" and not shared:
                shared.append(self.trainable_backbone())
            return self.make_trainer(client_id, method=method, seed=seed, full_backbone=shared[0] if shared else None)
        return make

    # ---- server side: no client data needed ----------------------------------------------------
    def _probe(self, info: ClientInfo) -> ClientData:
        """A client's shape without its examples: enough to build a model and count its parameters."""
        hidden = self.backbone[0].config.hidden_size
        empty = CachedSplit(torch.zeros(0, 1, hidden), torch.zeros(0, 1, dtype=torch.long),
                            torch.zeros(0, dtype=torch.long))
        return ClientData(client_id=info.client_id, key=info.key, title=info.title, num_labels=info.num_labels,
                          splits={s: empty for s in ("train", "validation", "test")}, split_layer=self.split_layer)

    def initial(self, method: str, *, seed: int) -> dict[str, np.ndarray]:
        """The shared parts of a fresh client (adapters are seeded alike on every client; heads are not shared)."""
        check_method(method, self.settings)
        if method == "fedavg_full":
            return self._trainer(self._probe(self.info[0]), method=method, seed=seed,
                                 full_backbone=self.backbone[0]).get_shared()
        return self._trainer(self._probe(self.info[0]), method=method, seed=seed).get_shared()

    def parameter_counts(self, method: str, *, seed: int = 0) -> ParameterCounts:
        """Trainable parameters per client (mean) and parameters uploaded per round, from data-free models."""
        check_method(method, self.settings)
        full = self.backbone[0] if method == "fedavg_full" else None  # counted, never trained
        probes = [self._trainer(self._probe(i), method=method, seed=seed, full_backbone=full) for i in self.info]
        return ParameterCounts(trainable=float(np.mean([t.trainable_count() for t in probes])),
                               shared=int(probes[0].shared_count()))

    def protocols(self, methods: Sequence[str]) -> dict[str, TrainingProtocol]:
        """The declared training protocol of each method's clients on this device (FedMCP's plaintext twin
        trains as FedMCP)."""
        return {m: self.settings.protocol("fedmcp" if m == "fedmcp_plain" else m, device=self.device) for m in methods}

    def task(self, method: str, *, seed: int, probe: bool = True) -> Task:
        check_method(method, self.settings)
        return Task(algorithm=make_algorithm(method, self.settings, probe=probe),
                    make_trainer=self.trainer_factory(method, seed=seed), initial=lambda: self.initial(method, seed=seed))

    def options(self, method: str, *, seed: int, threads: int = 1, probe: bool = True) -> dict[str, str]:
        """The `--option key=value` pairs that make `build` rebuild this task in another process."""
        return {"settings": json.dumps(asdict(self.settings)), "method": method, "seed": str(seed),
                "device": self.device.type, "threads": str(threads), "probe": str(int(probe))}


def build(options: Mapping[str, Any]) -> Task:
    """deploy_cli entry point. Options (all strings): `settings` (JSON object of FedMCPSettings fields),
    `method` (one of METHODS), `seed`, `device` (auto|cpu|cuda), `threads` (torch threads, default 1), `probe`
    (1, default: FedMCP logs its per-term gradient norms each round; 0: not, as its plaintext twin).
    Anything unknown or malformed is a ValueError naming it, before any data or model is loaded."""
    check_options(options, TASK_OPTIONS, task="fedmcp")
    settings = settings_option(FedMCPSettings, options)
    method = str(options.get("method", "fedmcp"))
    check_method(method, settings)
    seed = int_option(options, "seed", default=0, minimum=0)
    threads = int_option(options, "threads", default=1, minimum=1)
    probe = int_option(options, "probe", default=1, minimum=0)
    if probe > 1:
        raise ValueError(f"fedmcp task option probe must be 0 or 1, got {probe}")
    clients = FedMCPClients(settings, device=str(options.get("device", "cpu")))
    set_torch_threads(threads)
    return clients.task(method, seed=seed, probe=bool(probe))


__all__ = ["ABLATIONS", "METHODS", "DEFAULT_METHODS", "BACKBONES", "SPECS", "TASK_OPTIONS", "FedMCPSettings", "FULL_PRESET",
           "make_algorithm", "check_method", "load_named_backbone", "ClientInfo", "ParameterCounts", "FedMCPClients",
           "build"]
