"""FedNLP's text-classification formulation behind the `Formulation` contract: BBC News topics.

The clients are those of `examples/fednlp_classification.py` (adapters in the top layers of the
frozen MiniLM plus a linear head over mean-pooled tokens, `fl_algorithms.training.classification`),
on a corpus partitioned by a `PartitionSpec` so that the benchmark grid can vary the partition.
The trivial baseline predicts the majority topic of the client's own training split.

SIMPLIFICATION against FedNLP (20News, AGNews, SST-2, SemEval; DistilBERT fine-tuned whole): BBC
News (5 topics) with a frozen MiniLM and adapters, as in the classification example.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch
from torch import nn

from fl_algorithms.tasks.fednlp import load_named_backbone
from fl_algorithms.tasks.formulation import FormulationSettings, mean_over_clients
from fl_algorithms.training.classification import TextTaskConfig, client_model, shared_parts, text_trainer
from fl_algorithms.training.trainer import SeededTorchTrainer, flatten
from nlp_models.data.dataset import TextDataset
from nlp_models.data.partition import ClientSplit, Partition, PartitionError, client_splits
from nlp_models.device import resolve_device
from nlp_models.frozen_prefix import CachedSplit, build_prefix_cache, prefix_split

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class TopicShards:
    dataset: TextDataset
    partition: Partition
    splits: tuple[ClientSplit, ...]


class ClassificationClients:
    """BBC topic classification: client k's trainer over its own articles; the `Formulation` contract."""

    task = "classification"
    metric = "accuracy"

    def __init__(self, settings: FormulationSettings, *, backbone: str = "minilm", device: str = "cpu") -> None:
        self.settings, self.backbone_name = settings, backbone
        self.device = resolve_device(device)
        self.config = TextTaskConfig(adapter_layers=settings.adapter_layers, bottleneck=settings.bottleneck,
                                     batch_size=settings.batch_size, lr=settings.lr, seed=settings.seed)
        self._data: dict[int, dict[str, CachedSplit]] = {}

    @cached_property
    def backbone(self) -> tuple[nn.Module, Any]:
        model, tokenizer = load_named_backbone(self.backbone_name)
        try:
            prefix_split(model, self.settings.adapter_layers)
        except ValueError as error:
            raise ValueError(f"adapter_layers: {error}") from None
        return model.requires_grad_(False).to(self.device), tokenizer

    @cached_property
    def shards(self) -> TopicShards:
        """Distinct BBC articles (capped, stratified), partitioned by the spec, split 60/20/20 (stratified)."""
        from nlp_models.data.loaders import load_bbc_news

        s = self.settings
        dataset = load_bbc_news(max_examples=s.max_examples, seed=s.seed, dedupe=True, max_chars=12 * s.max_length)
        labels = dataset.label_array()
        partition = s.partition_spec.build(n=len(dataset), num_clients=s.clients, seed=s.seed,
                                           min_size=s.min_client_examples, labels=labels,
                                           embeddings=lambda: self._embeddings(dataset.texts))
        try:
            splits = client_splits(partition, seed=s.seed, labels=labels)
        except PartitionError as error:
            raise ValueError(f"cannot split the clients of partition {s.partition}: {error}") from None
        return TopicShards(dataset, partition, tuple(splits))

    def _embeddings(self, texts: Sequence[str]) -> np.ndarray:
        from nlp_models.data.embed import embed_texts

        model, tokenizer = self.backbone
        return embed_texts(texts, model=model, tokenizer=tokenizer, max_length=self.settings.max_length,
                           progress=False)

    @property
    def num_clients(self) -> int:
        return len(self.shards.splits)

    @property
    def partition(self) -> Partition:
        return self.shards.partition

    def _rows(self, client_id: int) -> dict[str, np.ndarray]:
        if not 1 <= client_id <= self.num_clients:
            raise ValueError(f"client id {client_id} is not in 1..{self.num_clients}")
        split = self.shards.splits[client_id - 1]
        return {name: np.asarray(getattr(split, name), dtype=np.int64) for name in SPLITS}

    def client_data(self, client_id: int) -> dict[str, CachedSplit]:
        """Client `client_id`'s splits as frozen-prefix states of its own articles only (computed once)."""
        parts = self._rows(client_id)
        if client_id not in self._data:
            dataset, (model, tokenizer) = self.shards.dataset, self.backbone
            rows = np.concatenate(list(parts.values()))
            encoded = tokenizer([dataset.texts[i] for i in rows], truncation=True, max_length=self.settings.max_length,
                                padding="longest", return_tensors="pt")
            cache = build_prefix_cache(model, encoded["input_ids"].to(self.device),
                                       encoded["attention_mask"].to(self.device),
                                       split=prefix_split(model, self.settings.adapter_layers), progress=False)
            labels = torch.as_tensor(dataset.label_array()[rows], device=self.device)
            data, start = {}, 0
            for name, idx in parts.items():
                stop = start + len(idx)
                data[name] = CachedSplit(cache.hidden[start:stop].clone(), cache.attention_mask[start:stop].clone(),
                                         labels[start:stop].clone())
                start = stop
            self._data[client_id] = data
        return self._data[client_id]

    def _model(self) -> nn.Module:
        return client_model(self.backbone[0], num_labels=self.shards.dataset.num_labels,
                            config=self.config).to(self.device)

    def make_trainer(self, client_id: int) -> SeededTorchTrainer:
        return text_trainer(model=self._model(), data=self.client_data(client_id), client_id=client_id,
                            config=self.config)

    def initial(self) -> dict[str, np.ndarray]:
        model = self._model()
        named = dict(model.named_parameters())
        return {part: flatten([named[n] for n in names]) for part, names in shared_parts(model).items()}

    def trivial_scores(self, client_id: int) -> dict[str, float]:
        """Majority class of the client's training split, scored on its test split."""
        parts, labels = self._rows(client_id), self.shards.dataset.label_array()
        majority = int(np.bincount(labels[parts["train"]]).argmax())
        return {"accuracy": float(np.mean(labels[parts["test"]] == majority))}

    def trivial(self) -> float:
        return mean_over_clients([self.trivial_scores(k)[self.metric] for k in range(1, self.num_clients + 1)])


__all__ = ["TopicShards", "ClassificationClients"]
