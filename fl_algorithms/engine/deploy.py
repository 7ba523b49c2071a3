"""Deployment runtime: one server process and client processes over ZeroMQ (tcp:// or inproc://).

Each FL round t uses two transport round ids, 2t (broadcast + ready) and 2t + 1 (the secure sum):

    server -> cohort   fl_broadcast {public arrays}                     (round id 2t)
    client             evaluates the received model, runs client_update, encodes its Masked parts
    client -> server   fl_ready {layout, metrics}                        (round id 2t)
    server <-> ready   the secure-sum protocol over the encoded parts     (round id 2t + 1)
    server             decodes the sum, builds the AggregateView, server_update, checkpoints

The server never receives an Upload: only layouts (part names and lengths), client-reported
evaluation metrics (scalars, sent in the clear; `report_metrics=False` turns them off) and the
protocol messages. Each client holds only its own shard and checkpoints its own state.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_algorithms.api import ClientContext
from fl_algorithms.engine.sim import RoundRecord, RunConfig, sample_cohort
from fl_algorithms.engine.secure_sum import Layout, SecureAggregator, build_view
from fl_algorithms.experiments.task import Task
from secagg.messages import Bytes, Message, ProtocolError, Schema
from secagg.protocols import registry

log = logging.getLogger(__name__)

BROADCAST, READY = "fl_broadcast", "fl_ready"
EVALUATE, EVALUATED = "fl_evaluate", "fl_evaluated"
READY_SCHEMA = Schema(READY, {"layout": Bytes(1 << 16), "metrics": Bytes(1 << 16)})
EVALUATED_SCHEMA = Schema(EVALUATED, {"metrics": Bytes(1 << 16)})
MAX_PARTS = 64


def _layout_bytes(layout: Layout) -> bytes:
    return json.dumps([[n, k] for n, k in layout.parts]).encode()


def _parse_layout(raw: bytes) -> Layout:
    try:
        parts = json.loads(raw.decode())
        if not isinstance(parts, list) or len(parts) > MAX_PARTS:
            raise ValueError
        out = tuple((str(n), int(k)) for n, k in parts)
        if any(k < 0 or k > 1 << 28 for _, k in out):
            raise ValueError
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise ProtocolError("malformed layout") from exc
    return Layout(out)


def _parse_metrics(raw: bytes) -> dict[str, float]:
    try:
        m = json.loads(raw.decode())
        return {str(k): float(v) for k, v in m.items()} if isinstance(m, dict) else {}
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError):
        return {}


@dataclass(frozen=True)
class DeploymentConfig:
    broadcast_timeout: float = 600.0
    """How long the server waits for clients to train and report ready."""
    stage_timeout: float = 60.0
    report_metrics: bool = True


class DeployedServer:
    """Runs FL rounds over a connected ServerDriver; checkpoints after each round; resumable."""

    def __init__(self, *, task: Task, config: RunConfig, driver, deployment: DeploymentConfig = DeploymentConfig()) -> None:
        self.task, self.config, self.driver, self.deployment = task, config, driver, deployment
        self.algorithm = task.algorithm
        self.aggregator = SecureAggregator(config.secure)
        self.state = self.algorithm.init_state(initial=task.initial())
        self.history: list[RoundRecord] = []
        self.rng = np.random.default_rng(config.seed)

    def _ckpt(self) -> Path | None:
        return Path(self.config.checkpoint_dir) / "server" if self.config.checkpoint_dir else None

    def save(self) -> None:
        root = self._ckpt()
        if root is None:
            return
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / "state.tmp.npz"
        np.savez(tmp, **self.state)
        meta = {"history": [asdict(r) for r in self.history], "rng": self.rng.bit_generator.state}
        (root / "meta.tmp.json").write_text(json.dumps(meta))
        tmp.replace(root / "state.npz")
        (root / "meta.tmp.json").replace(root / "meta.json")

    def load(self) -> bool:
        root = self._ckpt()
        if root is None or not (root / "meta.json").exists():
            return False
        with np.load(root / "state.npz") as z:
            self.state = {k: z[k] for k in z.files}
        meta = json.loads((root / "meta.json").read_text())
        self.history = [RoundRecord.from_json(r) for r in meta["history"]]
        self.rng.bit_generator.state = meta["rng"]
        return True

    def sample(self) -> list[int]:
        return sample_cohort(self.rng, self.driver.clients, self.config.clients_per_round)

    def run_round(self, t: int) -> RoundRecord:
        t0 = time.perf_counter()
        cohort = self.sample()
        broadcast = {k: np.ascontiguousarray(v, dtype=np.float32).copy()
                     for k, v in self.algorithm.configure_round(round=t, state=self.state).items()}
        self.driver.broadcast(BROADCAST, broadcast, round_id=2 * t, to=cohort)
        got = self.driver.collect(READY, round_id=2 * t, timeout=self.deployment.broadcast_timeout,
                                  expect=cohort, schema=READY_SCHEMA)
        layouts: dict[int, Layout] = {}
        metrics: dict[int, dict[str, float]] = {}
        for cid, msg in got.replies.items():
            try:
                layouts[cid] = _parse_layout(msg["layout"])
            except ProtocolError:
                log.warning("client %d sent a malformed layout; left out of round %d", cid, t)
                continue
            metrics[cid] = _parse_metrics(msg["metrics"])
        secure_s, sent, contributors = 0.0, {}, []
        if layouts:
            layout = max(set(layouts.values()), key=list(layouts.values()).count)
            ready = sorted(c for c, lay in layouts.items() if lay == layout)
            if layout.parts:
                server = registry.server_class(self.config.secure.protocol)(
                    round_id=2 * t + 1, clients=ready, length=layout.length, ring=self.config.secure.ring,
                    **dict(self.config.secure.protocol_params))
                report = self.driver.run_round(server, stage_timeout=self.deployment.stage_timeout)
                result = report.result
                groups = self.aggregator.decode(result.ring_sum, layout, len(result.contributors))
                view = build_view(round=t, groups=groups, released={}, contributors=result.contributors)
                self.state = self.algorithm.server_update(state=self.state, view=view)
                secure_s, sent = report.seconds, dict(report.bytes_received)
                contributors = sorted(result.contributors)
            else:
                contributors = ready
        return RoundRecord(round=t, cohort=cohort, contributors=contributors, metrics=metrics,
                           seconds=time.perf_counter() - t0, secure_seconds=secure_s, bytes_uploaded=sent, clipped=0)

    def evaluate(self) -> dict[int, dict[str, float]]:
        """Ask every client to evaluate the current global parameters (after the last round)."""
        t = len(self.history) + 1
        params = {k: np.ascontiguousarray(v, dtype=np.float32).copy()
                  for k, v in self.algorithm.shared_parameters(self.state).items()}
        self.driver.broadcast(EVALUATE, params, round_id=2 * t)
        got = self.driver.collect(EVALUATED, round_id=2 * t, timeout=self.deployment.broadcast_timeout,
                                  schema=EVALUATED_SCHEMA)
        return {cid: _parse_metrics(m["metrics"]) for cid, m in got.replies.items()}

    def run(self, *, resume: bool = False) -> list[RoundRecord]:
        if resume:
            self.load()
        for t in range(len(self.history) + 1, self.config.rounds + 1):
            rec = self.run_round(t)
            self.history.append(rec)
            self.save()
            log.info("round %d: %d/%d contributors, mean accuracy %.4f, %.2f s (secure %.2f s)", t,
                     len(rec.contributors), len(rec.cohort), rec.mean("accuracy"), rec.seconds, rec.secure_seconds)
        return self.history


class DeployedClient:
    """Client side: answers broadcasts with local training, then joins the round's secure sum."""

    def __init__(self, *, client_id: int, task: Task, config: RunConfig, deployment: DeploymentConfig = DeploymentConfig(),
                 checkpoint_dir: str | None = None) -> None:
        self.client_id, self.config, self.deployment = client_id, config, deployment
        self.algorithm = task.algorithm
        self.trainer = task.make_trainer(client_id)
        self.aggregator = SecureAggregator(config.secure)
        self.state: Mapping[str, Any] = {}
        self.expected = {k: v.shape for k, v in self.trainer.get_shared().items()}
        self._pending: dict[int, np.ndarray] = {}
        self.ckpt = Path(checkpoint_dir) if checkpoint_dir else None
        if self.ckpt is not None and (self.ckpt / "client.pt").exists():
            blob = torch.load(self.ckpt / "client.pt", weights_only=False)
            self.trainer.load_state_dict(blob["trainer"])
            self.state = blob["state"]

    def handlers(self):
        return {BROADCAST: self.on_broadcast, EVALUATE: self.on_evaluate}

    def on_evaluate(self, msg: Message) -> Message:
        from transport.session import reply_to

        params = self._parse_params(msg)
        if params:
            self.trainer.set_shared(params)
        metrics = self.trainer.evaluate(split=self.config.eval_split) if self.deployment.report_metrics else {}
        return reply_to(msg, EVALUATED, metrics=json.dumps(metrics).encode())

    def _parse_params(self, msg: Message) -> dict[str, np.ndarray]:
        fields = dict(msg.fields)
        broadcast = {}
        for name, arr in fields.items():
            if not isinstance(arr, np.ndarray) or arr.dtype != np.float32 or name not in self.expected \
                    or arr.shape != (int(np.prod(self.expected[name])),):
                raise ProtocolError(f"unexpected broadcast part '{name}'")
            if not np.all(np.isfinite(arr)):
                raise ProtocolError(f"broadcast part '{name}' is not finite")
            broadcast[name] = np.array(arr)  # own copy: received arrays are read-only views
        return broadcast

    def on_broadcast(self, msg: Message) -> Message:
        broadcast = self._parse_params(msg)
        t = msg.round // 2
        metrics: dict[str, float] = {}
        if broadcast:
            self.trainer.set_shared(broadcast)
        if self.deployment.report_metrics:
            metrics.update(self.trainer.evaluate(split=self.config.eval_split))
        ctx = ClientContext(client_id=self.client_id, state=self.state, trainer=self.trainer, round=t)
        upload, self.state = self.algorithm.client_update(broadcast=broadcast, client=ctx)
        layout = Layout.of(upload)
        if layout.parts:
            self._pending = {msg.round + 1: self.aggregator.encode_upload(upload, layout)[0]}
        if self.ckpt is not None:
            self.ckpt.mkdir(parents=True, exist_ok=True)
            torch.save({"trainer": self.trainer.state_dict(), "state": dict(self.state)}, self.ckpt / "client.tmp")
            (self.ckpt / "client.tmp").replace(self.ckpt / "client.pt")
        from transport.session import reply_to

        return reply_to(msg, READY, layout=_layout_bytes(layout),
                        metrics=json.dumps(metrics if self.deployment.report_metrics else {}).encode())

    def protocol_for(self, round_id: int):
        vec = self._pending.pop(round_id, None)
        if vec is None:
            return None
        return registry.client_class(self.config.secure.protocol)(client_id=self.client_id, round_id=round_id,
                                                                 input_fn=lambda: vec)
