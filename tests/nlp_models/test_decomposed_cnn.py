"""Decomposed Kim CNN (FedWeIT / FedSeIT): theta = B ⊙ sigmoid(m) + A, foreign adaptives, base vector, loss."""
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from nlp_models.decomposed_cnn import DecomposedConfig, DecomposedTextCNN

VOCAB, DIM, FILTERS, CLASSES, SIZES = 50, 8, 4, 3, (2, 3)


def config(mode="fedseit", **overrides):
    settings = dict(kernel_sizes=SIZES, filters=FILTERS, num_classes=CLASSES, dropout=0.0, mode=mode)
    settings.update(overrides)
    return DecomposedConfig(**settings)


def embeddings(seed=0):
    return torch.randn(VOCAB, DIM, generator=torch.Generator().manual_seed(seed))


def make(mode="fedseit", *, seed=1, **overrides):
    model = DecomposedTextCNN(embeddings(), config(mode, seed=seed, **overrides))
    model.add_task(0)
    return model


def ids(batch=5, length=9, seed=0):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def random_adaptive(model, seed):
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.randn(base.shape, generator=generator) for name, base in model.base.items()}


# ------------------------------------------------------------------ shapes and the decomposition

@pytest.mark.parametrize("mode,projection,width", [
    ("fedweit", False, len(SIZES) * FILTERS),
    ("fedseit", False, 4 * len(SIZES) * FILTERS),  # (K + 1) slots with K = 3
    ("fedseit", True, 2 * len(SIZES) * FILTERS),
])
def test_shapes(mode, projection, width):
    model = make(mode, projection=projection)
    assert model.feature_dim == width
    assert model.features(ids()).shape == (5, width)
    assert model(ids()).shape == (5, CLASSES)
    model.add_task(1, num_classes=7)  # per-task heads can differ in size
    assert model(ids()).shape == (5, 7)
    assert model(ids(), task_id=0).shape == (5, CLASSES)
    assert model.task_ids == (0, 1) and model.current_task == 1


def test_theta_is_base_times_sigmoid_mask_plus_adaptive():
    model = make("fedweit")
    task = model.tasks["0"]
    with torch.no_grad():
        for name in model.kernel_names:
            task.adaptive[name].normal_()
    theta = model.theta(0)
    for name, base in model.base.items():
        expected = base * torch.sigmoid(task.mask[name])[:, None, None] + task.adaptive[name]
        torch.testing.assert_close(theta[name], expected)
    # A starts as B / 5 on a new task (reference default).
    model.add_task(1)
    for name, base in model.base.items():
        torch.testing.assert_close(model.tasks["1"].adaptive[name], base / 5)


def manual_fedweit_logits(model, x, task_id, foreign=None, alphas=None):
    """Conv -> ReLU -> max-pool -> concat -> head with hand-built kernels (dropout is 0)."""
    task = model.tasks[str(task_id)]
    emb = F.embedding(x, model.embeddings).transpose(1, 2)
    pooled = []
    for name, base in model.base.items():
        kernel = base * torch.sigmoid(task.mask[name])[:, None, None] + task.adaptive[name]
        for index, adaptive in enumerate(foreign or []):
            kernel = kernel + alphas[name][index] * adaptive[name]
        pooled.append(F.relu(F.conv1d(emb, kernel, task.bias[name])).amax(-1))
    return task.head(torch.cat(pooled, -1))


def test_fedweit_forward_sums_foreign_adaptives_inside_the_kernel():
    model = make("fedweit")
    foreign = [random_adaptive(model, 10), random_adaptive(model, 11)]
    model.set_foreign(0, foreign, alphas=[0.7, -0.3])
    alphas = {name: value.detach() for name, value in model.tasks["0"].alpha.items()}
    assert all(torch.allclose(value[:2], torch.tensor([0.7, -0.3])) for value in alphas.values())
    with torch.no_grad():
        got = model(ids())
        torch.testing.assert_close(got, manual_fedweit_logits(model, ids(), 0, foreign, alphas))
        assert not torch.allclose(got, manual_fedweit_logits(model, ids(), 0))


def test_hard_threshold_applies_at_evaluation_only():
    threshold = 0.05
    model = make("fedweit", threshold=threshold, foreign_slots=0)
    task = model.tasks["0"]
    with torch.no_grad():
        for name in model.kernel_names:
            values = torch.randn(task.adaptive[name].shape, generator=torch.Generator().manual_seed(3))
            values.view(-1)[::2] *= 1e-3  # every other entry far below the threshold
            values.view(-1)[1] = threshold  # the boundary is pruned too (reference: keep |a| > threshold)
            task.adaptive[name].copy_(values)
    exported = model.adaptive(0)
    for name, value in exported.items():
        original = task.adaptive[name].detach()
        assert torch.equal(value, torch.where(original.abs() > threshold, original, torch.zeros_like(original)))
        assert (value == 0).sum() >= original.numel() // 2
        assert value.view(-1)[1] == 0
    x = ids()
    with torch.no_grad():
        model.eval()
        eval_before = model(x)
        model.train()
        train_before = model(x)
        for name in model.kernel_names:
            task.adaptive[name].copy_(exported[name])  # prune by hand
        model.eval()
        eval_after = model(x)
        model.train()
        train_after = model(x)
    torch.testing.assert_close(eval_before, eval_after)  # evaluation already pruned
    assert not torch.allclose(train_before, train_after)  # training did not


def test_attention_mask_hides_padded_tokens():
    model = make("fedseit")
    x = ids(length=10)
    mask = torch.ones_like(x)
    mask[:, 7:] = 0
    other = x.clone()
    other[:, 7:] = (other[:, 7:] + 1) % VOCAB
    with torch.no_grad():
        torch.testing.assert_close(model(x, mask), model(other, mask))
        assert not torch.allclose(model(x), model(other))


# ------------------------------------------------------------------ the shared base B

def test_base_vector_round_trip_and_only_base():
    model = make("fedseit", projection=True)
    vector = model.base_vector()
    assert vector.dtype == np.float32 and vector.ndim == 1
    assert vector.size == model.base_size == sum(FILTERS * DIM * k for k in SIZES)
    assert {id(p) for p in model.base_parameters()} == {id(p) for p in model.base.values()}
    task_ids = {id(p) for p in model.tasks.parameters()}
    assert not task_ids & {id(p) for p in model.base_parameters()}
    # Kernel order and layout: conv2 then conv3, each NF x D x F C-flattened.
    np.testing.assert_array_equal(vector[: FILTERS * DIM * 2], model.base["conv2"].detach().numpy().ravel())
    # Task-local parameters are not in the vector.
    with torch.no_grad():
        for parameter in model.tasks.parameters():
            parameter.add_(1.0)
    np.testing.assert_array_equal(model.base_vector(), vector)

    x = ids()
    with torch.no_grad():
        before = model(x)
    new = np.random.default_rng(0).normal(size=vector.size).astype(np.float32)
    model.load_base_vector(new)
    np.testing.assert_array_equal(model.base_vector(), new)
    with torch.no_grad():
        assert not torch.allclose(model(x), before)
    model.load_base_vector(vector)
    with torch.no_grad():
        torch.testing.assert_close(model(x), before)


def test_load_base_vector_validates_and_nonzero_only_keeps_local_values():
    model = make("fedweit")
    vector = model.base_vector()
    with pytest.raises(ValueError, match="length"):
        model.load_base_vector(vector[:-1])
    bad = vector.copy()
    bad[0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        model.load_base_vector(bad)
    update = np.full_like(vector, 0.5)
    update[::3] = 0.0
    model.load_base_vector(update, nonzero_only=True)
    expected = np.where(update != 0, update, vector)
    np.testing.assert_array_equal(model.base_vector(), expected)
    model.load_base_vector(update)
    np.testing.assert_array_equal(model.base_vector(), update)


def test_equal_seeds_give_equal_base_and_task_state():
    a, b, c = make("fedseit", seed=4), make("fedseit", seed=4), make("fedseit", seed=5)
    np.testing.assert_array_equal(a.base_vector(), b.base_vector())
    assert not np.array_equal(a.base_vector(), c.base_vector())
    torch.testing.assert_close(a.tasks["0"].mask["conv2"], b.tasks["0"].mask["conv2"])


# ------------------------------------------------------------------ foreign adaptives

def test_fedweit_alpha_trains_and_foreign_buffers_do_not():
    model = make("fedweit")
    model.set_foreign(0, [random_adaptive(model, 20), random_adaptive(model, 21)])
    task = model.tasks["0"]
    frozen = {name: task.foreign(name).clone() for name in model.kernel_names}
    assert all(not task.foreign(name).requires_grad for name in model.kernel_names)
    assert not {id(task.foreign(name)) for name in model.kernel_names} & {id(p) for p in model.parameters()}
    alphas = {name: value.detach().clone() for name, value in task.alpha.items()}
    optimizer = torch.optim.Adam(model.trainable_parameters(0), lr=1e-2)
    y = torch.tensor([0, 1, 2, 0, 1])
    for _ in range(3):
        optimizer.zero_grad()
        model.task_loss(model(ids()), y, task_id=0).loss.backward()
        for name in model.kernel_names:
            grad = task.alpha[name].grad
            assert grad is not None and torch.all(grad[:2] != 0)
            assert grad[2] == 0  # the empty third slot holds zeros
        optimizer.step()
    for name in model.kernel_names:
        assert torch.equal(task.foreign(name), frozen[name])
        assert not torch.allclose(task.alpha[name], alphas[name])


@pytest.mark.parametrize("projection", [False, True])
def test_fedseit_width_grows_with_slots_and_foreign_adaptives_matter(projection):
    widths = []
    for slots in (1, 2, 3):
        model = make("fedseit", foreign_slots=slots, projection=projection)
        widths.append(model.features(ids()).shape[1])
    unit = len(SIZES) * FILTERS
    assert widths == ([2 * unit] * 3 if projection else [2 * unit, 3 * unit, 4 * unit])

    model = make("fedseit", foreign_slots=2, projection=projection)
    first, second = random_adaptive(model, 30), random_adaptive(model, 31)
    model.set_foreign(0, [first, second])
    x = ids()
    with torch.no_grad():
        before = model(x)
        model.set_foreign(0, [first, random_adaptive(model, 32)])
        assert not torch.allclose(model(x), before)
        model.set_foreign(0, [first, second])
        torch.testing.assert_close(model(x), before)
    model.task_loss(model(x), torch.zeros(5, dtype=torch.long), task_id=0).loss.backward()
    assert all(torch.all(alpha.grad != 0) for alpha in model.tasks["0"].alpha.values())


def test_set_foreign_validates():
    model = make("fedseit", foreign_slots=2)
    good = random_adaptive(model, 40)
    with pytest.raises(ValueError, match="foreign_slots is 2"):
        model.set_foreign(0, [good, good, good])
    with pytest.raises(ValueError, match="keys"):
        model.set_foreign(0, [{"conv2": good["conv2"]}])
    wrong = dict(good, conv3=torch.zeros(FILTERS, DIM, 4))
    with pytest.raises(ValueError, match="shape"):
        model.set_foreign(0, [wrong])
    with pytest.raises(ValueError, match="alphas"):
        model.set_foreign(0, [good], alphas=[0.1, 0.2])
    with pytest.raises(KeyError, match="unknown task 9"):
        model.set_foreign(9, [good])


# ------------------------------------------------------------------ loss

def test_sparsity_and_weight_decay_terms_by_hand():
    cfg = dict(l1=0.01, weight_decay=0.001, mask_l1=0.0)
    model = make("fedweit", foreign_slots=0, **cfg)
    task = model.tasks["0"]
    y = torch.tensor([0, 1, 2, 0, 1])
    logits = model(ids())
    terms = model.task_loss(logits, y, task_id=0)
    with torch.no_grad():
        l1 = 0.01 * sum(a.abs().sum() for a in task.adaptive.values())
        decay = 0.001 * sum(
            (task.mask[n].pow(2).sum() + task.adaptive[n].pow(2).sum() + model.base[n].pow(2).sum()) / 2
            for n in model.kernel_names)
        ce = F.cross_entropy(logits, y)
    assert terms.sparsity == pytest.approx(float(l1), rel=1e-5)
    assert terms.weight_decay == pytest.approx(float(decay), rel=1e-5)
    assert terms.ce == pytest.approx(float(ce), rel=1e-6)
    assert terms.drift == 0.0
    assert terms.total == pytest.approx(terms.ce + terms.weight_decay + terms.sparsity, rel=1e-6)
    assert float(terms.loss.detach()) == pytest.approx(terms.total)

    # FedSeIT: the local dense kernels (W_f, W_c) get weight decay and L1 too.
    seit = make("fedseit", projection=True, **cfg)
    seit_task = seit.tasks["0"]
    dense = [layer.weight for layer in seit_task.projection.values()] + [seit_task.fusion.weight]
    terms = seit.task_loss(seit(ids()), y, task_id=0)
    with torch.no_grad():
        l1 = 0.01 * (sum(a.abs().sum() for a in seit_task.adaptive.values()) + sum(w.abs().sum() for w in dense))
    assert terms.sparsity == pytest.approx(float(l1), rel=1e-5)


def test_drift_is_zero_after_snapshot_and_grows_when_base_changes():
    model = make("fedseit", drift=2.0, l1=0.0)
    model.add_task(1)
    previous = model.theta_snapshot()
    assert set(previous) == {0}
    y = torch.tensor([0, 1, 2, 0, 1])
    terms = model.task_loss(model(ids()), y, task_id=1, previous=previous)
    assert terms.drift == 0.0
    # With an earlier task, B gets no weight decay (the drift term replaces it).
    task = model.tasks["1"]
    dense = task.local_dense()
    with torch.no_grad():
        decay = model.config.weight_decay * (
            sum((task.mask[n].pow(2).sum() + task.adaptive[n].pow(2).sum()) / 2 for n in model.kernel_names)
            + sum(w.pow(2).sum() / 2 for w in dense))
    assert terms.weight_decay == pytest.approx(float(decay), rel=1e-5)

    shift = np.random.default_rng(1).normal(scale=0.1, size=model.base_size).astype(np.float32)
    model.load_base_vector(model.base_vector() + shift)
    terms = model.task_loss(model(ids()), y, task_id=1, previous=previous)
    with torch.no_grad():
        expected = 2.0 * sum(((model.theta(0)[n] - previous[0][n]).pow(2).sum() / 2) for n in model.kernel_names)
    assert terms.drift > 0
    assert terms.drift == pytest.approx(float(expected), rel=1e-5)
    # The earlier task's mask and adaptive receive gradient from the drift term.
    terms.loss.backward()
    assert model.tasks["0"].adaptive["conv2"].grad.abs().sum() > 0
    assert model.tasks["0"].head.weight.grad is None


def test_task_loss_validates_previous():
    model = make("fedweit")
    model.add_task(1)
    logits, y = model(ids()), torch.zeros(5, dtype=torch.long)
    with pytest.raises(ValueError, match="current task"):
        model.task_loss(logits, y, task_id=1, previous=model.theta_snapshot([1]))
    with pytest.raises(KeyError, match="unknown task 5"):
        model.task_loss(logits, y, task_id=1, previous={5: model.theta(0)})
    with pytest.raises(ValueError, match="keys"):
        model.task_loss(logits, y, task_id=1, previous={0: {"conv2": model.theta(0)["conv2"]}})
    with pytest.raises(ValueError, match="classes"):
        model.task_loss(logits[:, :2], y, task_id=1)


def test_a_few_steps_reduce_cross_entropy_on_a_separable_task():
    torch.manual_seed(0)
    model = make("fedseit", projection=True, num_classes=2)
    generator = torch.Generator().manual_seed(7)
    y = torch.arange(32) % 2
    # Class 0 uses tokens 0..24, class 1 tokens 25..49.
    x = torch.randint(0, 25, (32, 8), generator=generator) + 25 * y[:, None]
    optimizer = torch.optim.Adam(model.trainable_parameters(), lr=1e-2)
    losses = []
    for _ in range(25):
        optimizer.zero_grad()
        terms = model.task_loss(model(x), y, task_id=0)
        terms.loss.backward()
        optimizer.step()
        losses.append(terms.ce)
    assert losses[-1] < 0.5 * losses[0]
    model.eval()
    with torch.no_grad():
        assert (model(x).argmax(-1) == y).float().mean() > 0.9


def test_trainable_parameters_follow_the_reference():
    model = make("fedseit")
    model.add_task(1)
    model.add_task(2)
    params = {id(p) for p in model.trainable_parameters(1)}
    for tid, expected in ((0, True), (1, True), (2, False)):
        task = model.tasks[str(tid)]
        assert (id(task.mask["conv2"]) in params) is expected
        assert (id(task.adaptive["conv3"]) in params) is expected
    assert id(model.tasks["0"].head.weight) not in params and id(model.tasks["0"].bias["conv2"]) not in params
    assert id(model.tasks["1"].head.weight) in params and id(model.tasks["1"].alpha["conv2"]) in params
    assert all(id(p) in params for p in model.base_parameters())


# ------------------------------------------------------------------ errors

@pytest.mark.parametrize("overrides,message", [
    (dict(mode="apd"), "mode must be one of"),
    (dict(kernel_sizes=()), "kernel_sizes"),
    (dict(kernel_sizes=(3, 3)), "distinct"),
    (dict(kernel_sizes=(0, 2)), "kernel_sizes"),
    (dict(filters=0), "filters"),
    (dict(num_classes=1), "num_classes"),
    (dict(dropout=1.0), "dropout"),
    (dict(l1=-1e-3), "l1 must be"),
    (dict(drift=float("nan")), "drift must be"),
    (dict(threshold=-0.1), "threshold must be"),
    (dict(weight_decay=float("inf")), "weight_decay must be"),
    (dict(mode="fedweit", projection=True), "projection"),
    (dict(mode="fedseit", foreign_slots=0), "foreign_slots >= 1"),
    (dict(foreign_slots=-1), "foreign_slots"),
    (dict(init_scale=0.0), "init_scale"),
])
def test_bad_configs_raise(overrides, message):
    settings = dict(kernel_sizes=SIZES, filters=FILTERS, num_classes=CLASSES)
    settings.update(overrides)
    with pytest.raises(ValueError, match=message):
        DecomposedConfig(**settings)


def test_reference_defaults():
    cfg = DecomposedConfig()
    assert cfg.kernel_sizes == (3, 4, 5) and cfg.filters == 128 and cfg.dropout == 0.3
    assert (cfg.l1, cfg.threshold, cfg.weight_decay, cfg.mask_l1) == (1e-3, 1e-3, 1e-4, 0.0)
    assert cfg.foreign_slots == 3 and cfg.adaptive_init == 0.2
    assert DecomposedConfig(kernel_sizes=[2, 3]).kernel_sizes == (2, 3)


def test_unknown_tasks_and_bad_inputs_raise():
    model = DecomposedTextCNN(embeddings(), config())
    with pytest.raises(KeyError, match="add_task"):
        model(ids())
    model.add_task(0)
    with pytest.raises(ValueError, match="already exists"):
        model.add_task(0)
    with pytest.raises(ValueError, match=">= 0"):
        model.add_task(-1)
    with pytest.raises(TypeError, match="task ids are ints"):
        model.add_task("1")
    with pytest.raises(KeyError, match="unknown task 3"):
        model.set_task(3)
    with pytest.raises(KeyError, match="unknown task 3"):
        model(ids(), task_id=3)
    with pytest.raises(KeyError, match="unknown task 3"):
        model.adaptive(3)
    with pytest.raises(ValueError, match="tokens"):
        model(ids(length=2))
    with pytest.raises(ValueError, match="2-D"):
        DecomposedTextCNN(torch.zeros(5), config())
    model.add_task(4)
    model.set_task(0)
    assert model.current_task == 0
