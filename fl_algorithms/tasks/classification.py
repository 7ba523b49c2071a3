"""FedNLP's text-classification formulation behind the `Formulation` contract: BBC News topics.

The clients are those of `examples/fednlp_classification.py` (adapters in the top layers of the
frozen MiniLM plus a linear head over mean-pooled tokens, `fl_algorithms.training.classification`),
on a corpus partitioned by a `PartitionSpec` so that the benchmark grid can vary the partition.
The trivial baseline predicts the majority topic of the client's own training split.

SIMPLIFICATION against FedNLP (20News, AGNews, SST-2, SemEval; DistilBERT fine-tuned whole): BBC
News (5 topics) with a frozen MiniLM and adapters, as in the classification example.
"""
from __future__ import annotations

from functools import cached_property

import numpy as np
import torch
from torch import nn

from fl_algorithms.tasks.formulation import FormulationClients, FormulationSettings, Shards
from fl_algorithms.training.classification import TUNE, TextTaskConfig, client_model, shared_parts, text_trainer
from fl_algorithms.training.protocol import TrainingProtocol
from fl_algorithms.training.trainer import SeededTorchTrainer
from nlp_models.data.dataset import TextDataset
from nlp_models.frozen_prefix import CachedSplit, cache_splits


class ClassificationClients(FormulationClients):
    """BBC topic classification: client k's trainer over its own articles; the `Formulation` contract."""

    task = "classification"
    metric = "accuracy"

    shared_parts = staticmethod(shared_parts)

    tunes = TUNE

    def __init__(self, settings: FormulationSettings, *, backbone: str = "minilm", device: str = "cpu") -> None:
        """`settings.tune='layers'` trains the top `settings.adapter_layers` layers whole instead of
        adapters in them (FedNLP's layer-freezing study)."""
        super().__init__(settings, backbone=backbone, device=device)
        self.config = TextTaskConfig(adapter_layers=settings.adapter_layers, bottleneck=settings.bottleneck,
                                     batch_size=settings.batch_size, lr=settings.lr, seed=settings.seed,
                                     tune=settings.tune)

    @cached_property
    def corpus(self) -> Shards[TextDataset]:
        """Distinct BBC articles (capped, stratified), partitioned by the spec, split 60/20/20 (stratified)."""
        from nlp_models.data.loaders import load_bbc_news

        s = self.settings
        dataset = load_bbc_news(max_examples=s.max_examples, seed=s.seed, dedupe=True, max_chars=12 * s.max_length)
        labels = dataset.label_array()
        partition, splits = self.shard(n=len(dataset), labels=labels, texts=dataset.texts, stratify=True)
        return Shards(dataset, partition, splits)

    def client_data(self, client_id: int) -> dict[str, CachedSplit]:
        """Client `client_id`'s splits as frozen-prefix states of its own articles only (computed once)."""
        parts = self.rows(client_id)
        if client_id not in self._data:
            dataset, (model, tokenizer) = self.corpus.data, self.backbone
            rows = np.concatenate(list(parts.values()))
            encoded = tokenizer([dataset.texts[i] for i in rows], truncation=True, max_length=self.settings.max_length,
                                padding="longest", return_tensors="pt")
            data = cache_splits(model, encoded["input_ids"], encoded["attention_mask"],
                                torch.as_tensor(dataset.label_array()[rows]),
                                sizes={k: len(v) for k, v in parts.items()}, split=self.split, device=self.device)
            self._data[client_id] = data
        return self._data[client_id]

    def _model(self) -> nn.Module:
        return client_model(self.backbone[0], num_labels=self.corpus.data.num_labels,
                            config=self.config).to(self.device)

    def make_trainer(self, client_id: int, *, protocol: TrainingProtocol | None = None) -> SeededTorchTrainer:
        return text_trainer(model=self._model(), data=self.client_data(client_id), client_id=client_id,
                            config=self.config, protocol=protocol)

    def trivial_scores(self, client_id: int) -> dict[str, float]:
        """Majority class of the client's training split, scored on its test split."""
        parts, labels = self.rows(client_id), self.corpus.data.label_array()
        majority = int(np.bincount(labels[parts["train"]]).argmax())
        return {"accuracy": float(np.mean(labels[parts["test"]] == majority))}


__all__ = ["ClassificationClients"]
