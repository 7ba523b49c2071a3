"""ATC's two self-supervised objectives (Assign-Then-Contrast, ASSIGN stage): masked language modelling
and BART-style denoising reconstruction, as corruptions of WordPiece batches.

* MLM (BERT): 15% of the non-special tokens are selected; 80% become [MASK], 10% a random token, 10%
  stay; the loss is on the selected positions only. This is transformers'
  `DataCollatorForLanguageModeling` (the reference's `DataCollatorForMLM` is the same rule), seeded.
* Denoising (BART, Lewis et al. 2020; reference `DataCollatorForDenoisingReconstrcution`): the
  sentences of the text are permuted (ratio 1.0: all of them), then whole-word spans with lengths
  ~ Poisson(3) are masked until 30% of the words are, each span replaced by one [MASK] (text
  infilling); the decoder reconstructs the original, unpermuted sequence.

Differences from the reference, stated: spans here are over whole words (WordPiece '##' pieces belong
to the word before them), as the ATC paper and BART say, where the reference's spans run over tokens;
as in the reference, zero-length spans (BART inserts a [MASK] there) are dropped; sentences end at
'.', '!' or '?' tokens (the reference splits on its own end-of-question/eos tokens).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerBase

from nlp_models.wordpiece import as_transformers

OBJECTIVES = ("mlm", "denoise")
_SENTENCE_ENDS = (".", "!", "?")


@dataclass(frozen=True)
class CorruptionConfig:
    mlm_probability: float = 0.15
    mask_ratio: float = 0.3
    """Share of words a denoising corruption masks."""
    poisson_lambda: float = 3.0
    permute_sentences: bool = True

    def __post_init__(self) -> None:
        if not (0 < self.mlm_probability < 1 and 0 < self.mask_ratio < 1 and self.poisson_lambda > 0):
            raise ValueError("need 0 < mlm_probability, mask_ratio < 1 and poisson_lambda > 0")


@dataclass(frozen=True)
class Corrupted:
    """A corrupted batch: encoder inputs, and what the loss compares against (-100: ignored).

    MLM: `labels` are the original ids at the selected positions (the encoder's LM head predicts them).
    Denoising: `labels` are the original sequences (the decoder's targets, padding -100).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    objective: str


class Corruptor:
    """Both corruptions for one tokenizer; every call takes its own seed (reproducible per client and round)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, config: CorruptionConfig = CorruptionConfig()) -> None:
        self.tokenizer, self.config = as_transformers(tokenizer), config  # its collator needs transformers'
        self.pad, self.mask = tokenizer.pad_token_id, tokenizer.mask_token_id
        if self.pad is None or self.mask is None:
            raise ValueError("the tokenizer needs [PAD] and [MASK] tokens")
        vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        self.continuation = np.array([t.startswith("##") for t in vocab])
        self.sentence_end = np.array([t in _SENTENCE_ENDS for t in vocab])
        self.special = np.zeros(len(tokenizer), dtype=bool)
        self.special[tokenizer.all_special_ids] = True

    def __call__(self, objective: str, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                 seed: int) -> Corrupted:
        if objective == "mlm":
            return self.mlm(input_ids, attention_mask, seed=seed)
        if objective == "denoise":
            return self.denoise(input_ids, attention_mask, seed=seed)
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")

    def mlm(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, seed: int) -> Corrupted:
        collator = DataCollatorForLanguageModeling(self.tokenizer, mlm_probability=self.config.mlm_probability)
        special = torch.as_tensor(self.special[input_ids.numpy()])
        with torch.random.fork_rng(devices=[]):      # the collator draws from torch's global RNG
            torch.manual_seed(seed)
            inputs, labels = collator.torch_mask_tokens(input_ids.clone(), special_tokens_mask=special)
        return Corrupted(inputs, attention_mask.clone(), labels, "mlm")

    def denoise(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, seed: int) -> Corrupted:
        rng = np.random.default_rng(seed)
        ids = input_ids.numpy()
        rows = [self._denoise_row(ids[i][attention_mask[i].numpy().astype(bool)], rng) for i in range(ids.shape[0])]
        length = ids.shape[1]
        out = np.full_like(ids, self.pad)
        mask = np.zeros_like(ids)
        for i, row in enumerate(rows):
            out[i, :len(row)] = row[:length]
            mask[i, :min(len(row), length)] = 1
        labels = input_ids.clone()
        labels[attention_mask == 0] = -100
        return Corrupted(torch.as_tensor(out), torch.as_tensor(mask), labels, "denoise")

    def _denoise_row(self, row: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One sequence (no padding): [CLS] body [SEP] -> [CLS] permuted, span-masked body [SEP]."""
        keep = ~self.special[row]
        body = row[keep]
        if body.size == 0:
            return row
        if self.config.permute_sentences:
            body = np.concatenate([body[s] for s in rng.permutation(self._sentences(body))])
        words = self._words(body)
        masked = self._masked_words(len(words), rng)
        pieces, previous = [], False
        for index, word in enumerate(words):
            if masked[index]:
                if not previous:
                    pieces.append(np.array([self.mask]))
                previous = True
            else:
                pieces.append(body[word])
                previous = False
        head = row[:1] if self.special[row[0]] else row[:0]
        tail = row[-1:] if self.special[row[-1]] and len(row) > 1 else row[:0]
        return np.concatenate([head, *pieces, tail])

    def _sentences(self, body: np.ndarray) -> list[slice]:
        ends = np.flatnonzero(self.sentence_end[body]) + 1
        bounds = [0, *[e for e in ends if e < len(body)], len(body)]
        return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]

    def _words(self, body: np.ndarray) -> list[slice]:
        starts = [i for i in range(len(body)) if i == 0 or not self.continuation[body[i]]]
        return [slice(a, b) for a, b in zip(starts, starts[1:] + [len(body)])]

    def _masked_words(self, count: int, rng: np.random.Generator) -> np.ndarray:
        """Which of `count` words fall in masked spans: Poisson(lambda) spans (zero lengths dropped)
        at random starts until ceil(mask_ratio * count) words are covered."""
        target = int(np.ceil(self.config.mask_ratio * count))
        masked = np.zeros(count, dtype=bool)
        guard = 0
        while masked.sum() < target and guard < 100 * count:
            guard += 1
            length = int(rng.poisson(self.config.poisson_lambda))
            if length == 0:
                continue
            length = min(length, target - int(masked.sum()))
            start = int(rng.integers(0, count))
            masked[start:start + length] = True
        return masked


__all__ = ["OBJECTIVES", "CorruptionConfig", "Corrupted", "Corruptor"]
