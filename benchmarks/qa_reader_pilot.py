"""Centralised pilot of the cloze QA reader: which trainable part clears the first-entity baseline?

    python -m benchmarks.qa_reader_pilot --reader adapters --lr 1e-2 --epochs 12
    python -m benchmarks.qa_reader_pilot --reader top2 --lr 1e-4 --epochs 12
    python -m benchmarks.qa_reader_pilot --reader full --lr 5e-5 --epochs 10 --threads 2

One AdamW run (batch 16) over every cloze question that fits 128 tokens, split 70/15/15 at random (seed
0); after each epoch, validation and test F1 (SQuAD's, `fl_algorithms.tasks.qa.qa_metrics`). The reader
runs the whole backbone on every step (no prefix cache: simpler, and the same function): 'adapters' is
the grid's QA reader (Houlsby adapters, bottleneck 16, in the top 2 layers), 'top2' trains the top two
layers whole, 'full' all of them (every weight but the embeddings), each with a bias-free span head.
The last line is `qa_pilot reader=.. lr=.. first_entity_test=.. best_val=.. test_at_best=.. epoch=..`:
the test F1 of the epoch with the best validation F1, against the first entity on the same questions.
"""
from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from fl_algorithms.tasks.fednlp import load_named_backbone
from fl_algorithms.tasks.qa import QABatch, cloze_budget, encode, first_entity, qa_loss, qa_metrics
from nlp_models._offline import ensure_offline
from nlp_models.adapters import attach_adapters
from nlp_models.cpu import set_torch_threads
from nlp_models.data.cloze_qa import ClozeExample, build_cloze_qa
from nlp_models.squad_metrics import f1_score

READERS = {"adapters": 0, "top2": 2, "full": None}
"""Whole layers each reader trains (None: all of them); 'adapters' trains adapters in the top two."""


class Reader(nn.Module):
    """A private copy of the backbone with its top `train_layers` layers trainable, and a span head."""

    def __init__(self, backbone: nn.Module, *, train_layers: int, adapters: bool) -> None:
        super().__init__()
        self.bert = copy.deepcopy(backbone).requires_grad_(False)
        layers = self.bert.encoder.layer
        for layer in layers[len(layers) - train_layers:] if train_layers else []:
            layer.requires_grad_(True)
        if adapters:
            attach_adapters(self.bert, {"adapter": 16}, seed=0, layers=[len(layers) - 2, len(layers) - 1])
            for name, p in self.bert.named_parameters():
                if "adapters.adapter." in name:
                    p.requires_grad_(True)
        self.head = nn.Linear(self.bert.config.hidden_size, 2, bias=False)
        with torch.no_grad():
            self.head.weight.normal_(0, 0.02, generator=torch.Generator().manual_seed(0))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state)


def batches(examples: Sequence[ClozeExample], encoded, size: int, *, shuffle: int | None = None) -> Iterator[QABatch]:
    """QABatch rows whose `hidden` field carries the token ids (the Reader takes ids, not cached states)."""
    order = (torch.arange(len(examples)) if shuffle is None
             else torch.randperm(len(examples), generator=torch.Generator().manual_seed(shuffle)))
    for start in range(0, len(examples), size):
        rows = order[start:start + size]
        length = int(encoded.attention_mask[rows].sum(1).max())
        yield QABatch(encoded.input_ids[rows, :length], encoded.attention_mask[rows, :length],
                      encoded.context_mask[rows, :length], encoded.starts[rows], encoded.ends[rows],
                      encoded.offsets[rows, :length], encoded.truncated[rows],
                      tuple(examples[r].passage for r in rows.tolist()),
                      tuple((examples[r].answer_text,) for r in rows.tolist()))


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    ensure_offline()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reader", choices=sorted(READERS), required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--max-examples", type=int, default=None, help="first N questions only (smoke runs)")
    p.add_argument("--backbone", choices=("minilm", "tiny"), default="minilm")
    args = p.parse_args(argv)
    if args.epochs < 1 or not args.lr > 0 or args.threads < 1:
        p.error("need --epochs >= 1, --lr > 0 and --threads >= 1")
    set_torch_threads(args.threads)
    torch.manual_seed(0)
    backbone, tokenizer = load_named_backbone(args.backbone)
    question_words, passage_words = cloze_budget(args.max_length)
    cloze = build_cloze_qa(seed=0, max_passage_words=passage_words, max_question_words=question_words)
    lengths = [len(ids) for ids in tokenizer([e.question for e in cloze.examples])["input_ids"]]
    examples = [e for e, k in zip(cloze.examples, lengths) if k <= args.max_length // 2][:args.max_examples]
    order = np.random.default_rng(0).permutation(len(examples))
    a, b = int(0.7 * len(examples)), int(0.85 * len(examples))
    parts = {name: [examples[i] for i in rows] for name, rows in
             (("train", order[:a]), ("validation", order[a:b]), ("test", order[b:]))}
    encoded = {name: encode(tokenizer, rows, max_length=args.max_length) for name, rows in parts.items()}
    first = {name: float(np.mean([0.0 if cut else f1_score(first_entity(e.passage), e.answer_text)
                                  for e, cut in zip(parts[name], encoded[name].truncated.tolist())]))
             for name in ("validation", "test")}
    whole = READERS[args.reader]
    model = Reader(backbone, train_layers=len(backbone.encoder.layer) if whole is None else whole,
                   adapters=args.reader == "adapters")
    params = [q for q in model.parameters() if q.requires_grad]
    print(f"{args.reader}: {sum(q.numel() for q in params):,} trainable; first entity F1 validation "
          f"{first['validation']:.4f}, test {first['test']:.4f} ({len(parts['test'])} questions)", flush=True)
    optimizer = torch.optim.AdamW(params, lr=args.lr)
    best = (-1.0, 0.0, 0)
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        model.train()
        for batch in batches(parts["train"], encoded["train"], 16, shuffle=epoch - 1):
            optimizer.zero_grad()
            qa_loss(model, batch).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            scores = {name: qa_metrics(model, batches(parts[name], encoded[name], 64)) for name in ("validation", "test")}
        print(f"epoch {epoch} {time.perf_counter() - start:.0f} s: validation F1 {scores['validation']['f1']:.4f}, "
              f"test F1 {scores['test']['f1']:.4f}", flush=True)
        if scores["validation"]["f1"] > best[0]:
            best = (scores["validation"]["f1"], scores["test"]["f1"], epoch)
    result = {"first_entity_test": first["test"], "best_val": best[0], "test_at_best": best[1], "epoch": best[2]}
    print(f"qa_pilot reader={args.reader} lr={args.lr:g} first_entity_test={first['test']:.4f} "
          f"best_val={best[0]:.4f} test_at_best={best[1]:.4f} epoch={best[2]}", flush=True)
    return result


if __name__ == "__main__":
    main()
