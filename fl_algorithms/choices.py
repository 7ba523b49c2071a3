"""The names the experiments' options choose from: methods, settings, protocols and presets, by experiment.

A leaf module that imports nothing: the examples build their parsers from these tuples, so that `--help`
and a mistyped option answer before torch loads (`fedsecure run X --help`). The modules that implement
the names import their tuples from here (`atc_grid.METHODS is ATC_METHODS`), so each list has one
definition; `tests/fl_algorithms/test_choices.py` checks the few that cannot (nlp_models sits below
fl_algorithms and keeps its own BACKBONES).
"""
from __future__ import annotations

BACKBONES = ("minilm", "tiny")
"""Encoders by name (`nlp_models.backbone.BACKBONES`): the offline MiniLM-L6, or a tiny random BERT for tests."""
RUNTIMES = ("sim", "deploy")
"""Where clients run: in this process (simulation), or as processes over tcp (deployment)."""
BACKENDS = ("memory", "ray")
"""The simulation's client backends (`RunConfig.backend`)."""
SECURE_PROTOCOLS = ("secagg", "secagg+", "lightsecagg")
"""The secure-sum protocols a grid may choose (the registry also has 'plain', the insecure baseline)."""

# ---- FedMCP (examples/fedmcp_secure.py; fl_algorithms.tasks.fedmcp) -------------------------------------
FEDMCP_ABLATIONS = ("fedmcp_no_cl", "fedmcp_no_bl")
FEDMCP_METHODS = ("fedmcp", "fedavg_peft", "local", "fedrep", "fedavg_full", "fedlr", "moon", "ditto", *FEDMCP_ABLATIONS)
FEDMCP_DEFAULT_METHODS = ("fedmcp", "fedavg_peft", "local", "fedrep")
FEDMCP_TRAINING_PROTOCOLS = ("fedmcp", "fedmcp-fresh")
"""`fl_algorithms.training.adapter_trainer.FEDMCP_PROTOCOLS`' names: Adam kept across rounds, or fresh."""

# ---- FedNLP classification (examples/fednlp_classification.py; fl_algorithms.tasks.fednlp) ------------
FEDNLP_METHODS = ("fedavg", "fedprox", "fedopt", "fedadam")
FEDNLP_DEFAULT_METHODS = ("fedavg", "fedprox", "fedopt")
FEDOPT_SERVERS = ("sgdm", "adam")

# ---- AdaFedSelectKD (examples/adafedselectkd.py; fl_algorithms.experiments.summarization_grid) ---------
SUMMARY_METHODS = ("adafedselectkd", "adafedkd", "adafedavg", "adacentralized", "local")
SUMMARY_SETTINGS = ("non_iid", "iid_balanced", "non_iid_balanced", "extreme")
SUMMARY_TRAINING_PROTOCOLS = ("adafedselectkd", "kept-adamw")
SUMMARY_LR = 3e-3
"""The clients' AdamW lr (`SummarySettings.lr`; why not the paper's 2e-4 is said there)."""

# ---- ATC (examples/atc_secure.py; fl_algorithms.experiments.atc_grid) ----------------------------------
ATC_METHODS = ("atc_secure", "atc_reference", "assign_only", "fedavg", "fedavg_ft", "isolated", "ditto", "fedprox",
               "fedbn")
ATC_DITTO_WORK = ("split-epoch", "two-epochs")
"""Ditto's local work per round: 'split-epoch', its global and personal problems on alternate batches of
one epoch (every method's budget); 'two-epochs', one epoch each (the grid before issue 55)."""
ATC_TRAINING_PROTOCOLS = ("atc-paper", "kept-adamw")

# ---- FedSeIT (examples/fedseit_continual.py; fl_algorithms.experiments.continual_grid) -----------------
CONTINUAL_METHODS = ("fedseit_k3", "fedseit_k5", "fedseit_random", "fedseit_all", "fedweit", "fedavg_b", "local")

# ---- the privacy frontier (examples/privacy_frontier.py; fl_algorithms.experiments.frontier) -----------
FRONTIER_MECHANISMS = ("ddp", "central", "dpsgd")
FRONTIER_SAMPLERS = ("poisson", "fixed_size", "seeded")
COHORT_TAIL = 1e-3
"""Poisson cohorts: DDP noise is calibrated, by default, to this lower quantile of the cohort size."""
