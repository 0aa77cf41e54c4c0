"""kompress.torch.LayerBounds: per-layer bounds for the saved-tensor hooks, chosen from the
training's own gradients (docs/python.md, "Per-layer bounds")."""
import copy

import pytest
import torch

import kompress
import kompress.torch


class Probe(torch.autograd.Function):
    """x @ w, recording how far the x backward gets is from the saved x, relative to x's range."""

    @staticmethod
    def forward(ctx, x, w, errors):
        ctx.save_for_backward(x, w)
        ctx.exact, ctx.errors = x.detach().clone(), errors
        return x @ w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        ctx.errors.append(float((x - ctx.exact).abs().max() / (ctx.exact.max() - ctx.exact.min())))
        return g @ w.t(), x.t() @ g, None


class TwoInputs(torch.nn.Module):
    """Two linear maps of the two halves of the input, summed: layer 0 saves the first half,
    layer 1 the second."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(256, 8) / 16) for _ in range(2)])
        self.errors = ([], [])

    def forward(self, x):
        return sum(Probe.apply(x[:, half], self.w[half], self.errors[half]) for half in range(2))


def two_inputs(rows=128, offset=100.0, seed=0):
    """Layer 0: far from 0 against its spread (its gradient hardly moves at any bound); layer 1:
    spread around 0 (a REL bound e moves its gradient by about e x range / sqrt(3))."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 2, 256, generator=g)
    x[:, 0] = offset + 0.01 * x[:, 0]
    return x, torch.randn(rows, 8, generator=g)


def test_a_tolerant_layer_climbs_to_the_ceiling_a_sensitive_one_settles_below():
    torch.manual_seed(0)
    model = TwoInputs()
    hooks = kompress.torch.compressed_activations(rel=1e-3, min_numel=1000)
    bounds = kompress.torch.LayerBounds(hooks, ceiling=1e-1, tolerance=0.05, check_batch=32)
    x, y = two_inputs()
    loss = bounds.train_step(0, model, torch.nn.functional.mse_loss, x, y)
    assert loss.requires_grad is False and all(w.grad is not None for w in model.w)
    # Calibrated on the first step: both settled, layer 0 at the ceiling, layer 1 where its
    # deviation (about 4.9 e) first passed 5%: 8e-3 (1.6e-2 was beyond, it stepped back).
    assert bounds.layers() == {0: "no grad_fn (128, 256)", 1: "no grad_fn (128, 256)"}
    assert bounds.bound(0) == 1e-1
    assert 4e-3 <= bounds.bound(1) < 1.6e-2
    log = bounds.log()
    assert all(change["step"] == 0 for change in log)
    assert [c["to"] for c in log if c["layer"] == 0] == pytest.approx([2e-3, 4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2, 1e-1])
    back = [c for c in log if c["layer"] == 1 and c["to"] < c["from"]]
    assert len(back) == 1 and back[0]["deviation"] > 0.05 and back[0]["to"] == bounds.bound(1)
    assert all(c["deviation"] <= 0.05 for c in log if c["to"] > c["from"])
    assert 0 < bounds.check_peak_bytes
    # The step itself ran at the chosen bounds: every value backward got within its layer's
    # bound, and layer 0's error is of that bound's size (it was compressed at it).
    main_errors = [errors[-1] for errors in model.errors]
    assert main_errors[0] <= 1e-1 * (1 + 1e-6) and main_errors[0] > 1e-1 / 4
    assert main_errors[1] <= bounds.bound(1) * (1 + 1e-6)

    # No check on the steps after (every layer settled, 1 % 50 != 0); a periodic one (step 50)
    # tightens layer 0 once its input spreads around 1 (its gradient now moves by about 30%).
    changes = len(bounds.log())
    bounds.train_step(1, model, torch.nn.functional.mse_loss, x, y)
    assert len(bounds.log()) == changes
    drifted, _ = two_inputs(offset=1.0, seed=1)
    drifted[:, 0] = 1.0 + drifted[:, 1]
    bounds.train_step(50, model, torch.nn.functional.mse_loss, drifted, y)
    tightened = bounds.log()[changes:]
    assert [(c["step"], c["layer"], c["from"], c["to"]) for c in tightened if c["layer"] == 0] == [(50, 0, 1e-1, 5e-2)]
    assert tightened[0]["deviation"] > 0.05


class One(torch.nn.Module):
    """x @ w through the probe: one saved activation, the input."""

    def __init__(self, width=256):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(width, 8) / 16)
        self.errors = []

    def forward(self, x):
        return Probe.apply(x, self.w, self.errors)


def test_a_check_runs_its_rows_a_few_at_a_time_at_the_bound_all_of_them_give():
    torch.manual_seed(5)
    x, y = torch.rand(8, 256), torch.randn(8, 8)
    x[:4] *= 0.01   # the first group's own range is 1e-4 of the check's
    x[4:] *= 100
    for rows, groups in ((4, 2), (3, 3), (8, 1)):
        model = One()
        hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=1000)
        bounds = kompress.torch.LayerBounds(hooks, ceiling=1e-1, check_batch=8, check_rows=rows)
        bounds._check(0, model, torch.nn.functional.mse_loss, x, y)
        # Each pass (exact, then the layer at each bound it tried) ran once per group; a group
        # was compressed within REL 1e-2 of all 8 rows' range, not of its own rows'.
        assert len(model.errors) % groups == 0 and len(model.errors) > groups
        edges = [8 * g // groups for g in range(groups + 1)]
        whole = float(x.max() - x.min())
        compressed = model.errors[groups:groups + groups]  # the first layer pass, at REL 1e-2
        for (first, last), error in zip(zip(edges, edges[1:]), compressed):
            own = float(x[first:last].max() - x[first:last].min())
            assert error * own <= 1e-2 * whole * (1 + 1e-6)
        if groups > 1:
            assert compressed[0] > 0.5  # the small rows lost most of their own range: the bound is the whole's
        # The step's saves and their bounds are untouched by the check's ranges.
        assert bounds._ranges == {} and hooks._only_site is None


def test_a_check_holds_one_group_of_exact_rows_at_a_time():
    # The peak is the largest group's exact rows and what the stash keeps whatever it holds (its
    # workspace): smooth rows of 16 KiB in segments of 4 KiB, so that a compressed pass holds a
    # few KiB, less than any group of two rows or more.
    x, y = torch.linspace(0, 1, 8 * 4096).reshape(8, 4096), torch.randn(8, 8)
    beside = set()
    for rows, largest_group in ((8, 8), (4, 4), (3, 3), (2, 2)):
        hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=1000,
                                                      stash=kompress.Stash(1 << 20, segment_bytes=4096))
        bounds = kompress.torch.LayerBounds(hooks, ceiling=1e-1, check_batch=8, check_rows=rows)
        bounds._check(0, One(4096), torch.nn.functional.mse_loss, x, y)
        beside.add(bounds.check_peak_bytes - largest_group * 4096 * 4)
    assert len(beside) == 1 and 0 <= beside.pop() < 8192


def test_grouped_checks_see_the_same_gradients_as_one_pass():
    # A mean-reduced loss: the groups' gradients, weighted by their rows, are the whole check's.
    torch.manual_seed(6)
    x, y = two_inputs(rows=32)
    chosen = []
    for rows in (32, 4):
        torch.manual_seed(7)
        model = TwoInputs()
        hooks = kompress.torch.compressed_activations(rel=1e-3, min_numel=1000)
        bounds = kompress.torch.LayerBounds(hooks, ceiling=1e-1, tolerance=0.05, check_batch=32, check_rows=rows)
        bounds._check(0, model, torch.nn.functional.mse_loss, x, y)
        chosen.append(([bounds.bound(n) for n in range(2)], [c["deviation"] for c in bounds.log()]))
    assert chosen[0][0] == chosen[1][0]
    # Layer 0's deviations are float32 rounding (about 1e-7, where the checks' tolerance is 5e-2):
    # they agree to within that, not to a fraction of themselves.
    assert chosen[1][1] == pytest.approx(chosen[0][1], rel=0.25, abs=1e-6)


class Noisy(torch.nn.Module):
    """Batch norm (running statistics) and dropout (random state) around a ReLU MLP."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.BatchNorm1d(128), torch.nn.ReLU(),
                                          torch.nn.Dropout(0.25), torch.nn.Linear(128, 10))

    def forward(self, x):
        return self.layers(x)


def test_a_check_changes_no_gradient_buffer_or_random_state_of_the_step():
    torch.manual_seed(3)
    model = Noisy()
    before = copy.deepcopy(model)
    hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=1000)
    bounds = kompress.torch.LayerBounds(hooks, ceiling=2e-1, check_batch=16)
    x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
    torch.manual_seed(7)
    bounds.train_step(0, model, torch.nn.functional.cross_entropy, x, y)   # calibrates, then the step
    after_checked = torch.random.get_rng_state()
    assert bounds.log() and all(bounds._bounds.settled(n) for n in bounds.layers())
    torch.manual_seed(7)
    bounds.train_step(1, before, torch.nn.functional.cross_entropy, x, y)  # the step alone, same bounds
    assert torch.equal(torch.random.get_rng_state(), after_checked)
    for p, q in zip(model.parameters(), before.parameters()):
        assert torch.equal(p.grad, q.grad)
    for b, c in zip(model.buffers(), before.buffers()):
        assert torch.equal(b, c)


def test_saves_are_numbered_alike_in_the_checks_few_rows_and_the_full_batch():
    # A ReLU's output saved twice (the ReLU, then the next product), softmax's output and a view
    # of it, and small tensors (LayerNorm's statistics): numbered once each, the same way on 4
    # rows as on 128, where the statistics cross min_numel.
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.inner, self.outer = torch.nn.LayerNorm(32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)

        def forward(self, x):
            h = torch.relu(self.inner(self.norm(x)))
            a = torch.softmax(h @ h.transpose(-1, -2), dim=-1)
            g = torch.stack([h, 2 * h])[1]   # contiguous, at an offset in its memory; then a view of it
            h = torch.sin(g) + torch.cos(g.view(-1, 32)).view(g.shape)
            return self.outer(a.reshape(-1, 16, 16).reshape(x.shape[0], 16, 16) @ h).mean(1)

    torch.manual_seed(4)
    model = Attention()
    hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=1024)
    bounds = kompress.torch.LayerBounds(hooks, ceiling=1e-1, check_batch=4)
    x, y = torch.randn(128, 16, 32), torch.randn(128, 4)
    bounds._check(0, model, torch.nn.functional.mse_loss, x, y)
    in_the_check = hooks._site
    bounds.train_step(1, model, torch.nn.functional.mse_loss, x, y)
    assert hooks._site == in_the_check == len(bounds.layers())
    # Every save of the step and of the check was released with its graph (nothing held in a cycle).
    assert hooks.stats().entries == 0 and not hooks._live
    names = list(bounds.layers().values())
    assert sum(n.startswith("ReluBackward0") for n in names) == 1
    assert sum(n.startswith("SoftmaxBackward0") for n in names) == 1
    assert all(c["name"] in names for c in bounds.log())
    # A check's exact pass gets exactly autograd's own values back: the same gradients.
    parameters = list(model.parameters())
    plain = torch.autograd.grad(torch.nn.functional.mse_loss(model(x[:4]), y[:4]), parameters)
    kept = torch.autograd.grad(bounds._run(model, torch.nn.functional.mse_loss, x[:4], y[:4], only=-1), parameters)
    assert all(torch.equal(p, k) for p, k in zip(plain, kept))


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="hooks must be a kompress.torch.compressed_activations"):
        kompress.torch.LayerBounds(object(), ceiling=1e-1)
    with pytest.raises(kompress.InvalidArgument, match="not a callable"):
        kompress.torch.LayerBounds(kompress.torch.compressed_activations(rel=lambda t: 1e-2), ceiling=1e-1)
    with pytest.raises(kompress.InvalidArgument, match="floor <= initial <= ceiling"):
        kompress.torch.LayerBounds(kompress.torch.compressed_activations(rel=1e-2), ceiling=1e-3)
    with pytest.raises(kompress.InvalidArgument, match="tolerance must be > 0"):
        kompress.torch.LayerBounds(kompress.torch.compressed_activations(rel=1e-2), ceiling=1e-1, tolerance=0)
    for bad in (dict(check_batch=0), dict(check_every=0), dict(check_batch=2.5), dict(check_rows=0),
                dict(check_rows=1.5)):
        with pytest.raises(kompress.InvalidArgument, match="must be an int >= 1"):
            kompress.torch.LayerBounds(kompress.torch.compressed_activations(rel=1e-2), ceiling=1e-1, **bad)
    hooks = kompress.torch.compressed_activations(abs=1e-3)
    bounds = kompress.torch.LayerBounds(hooks, ceiling=1e-2)
    assert bounds.bound(0) == 1e-3 and bounds._bound_args(0, torch.ones(4)) == (1e-3, None)  # an absolute schedule
    with pytest.raises(kompress.InvalidArgument, match="already have a LayerBounds"):
        kompress.torch.LayerBounds(hooks, ceiling=1e-2)


def test_group_relative_hooks_give_a_checks_rows_the_relative_bound_itself():
    # A group of 256 values has the same range in a check's few rows as in all of them: the
    # bound stays relative (to each group), not resolved on the check's range.
    hooks = kompress.torch.compressed_activations(rel=5e-2, min_numel=16, group_relative=True)
    bounds = kompress.torch.LayerBounds(hooks, ceiling=2e-1)
    bounds._note_range(0, torch.linspace(0, 10, 100))
    assert bounds._ranges == {}
    bounds._ranges = {0: (0.0, 10.0)}
    hooks._only_site = 0
    try:
        assert bounds._bound_args(0, torch.linspace(0, 1, 100)) == (None, 5e-2)
    finally:
        hooks._only_site = None


def test_a_checks_rows_take_a_relative_bound_so_a_stash_that_loosens_relative_bounds_runs_them():
    # The rows a check compresses get the bound all its rows' range gives, as the relative bound
    # it is on their own range (a loosen_bound ceiling and a save's bound share their mode).
    hooks = kompress.torch.compressed_activations(rel=5e-2, min_numel=16)
    bounds = kompress.torch.LayerBounds(hooks, ceiling=2e-1)
    bounds._ranges = {0: (0.0, 10.0)}
    hooks._only_site = 0
    try:
        abs_bound, rel_bound = bounds._bound_args(0, torch.linspace(2, 4, 100))
        assert abs_bound is None and rel_bound == pytest.approx(5e-2 * 10 / 2)
        assert bounds._bound_args(0, torch.full((100,), 3.0)) == (5e-2 * 10, None)  # no range of their own
    finally:
        hooks._only_site = None
    torch.manual_seed(0)
    model = TwoInputs()
    hooks = kompress.torch.compressed_activations(rel=1e-3, min_numel=1000, budget_bytes=1 << 20,
                                                  policy="loosen_bound", ceiling_rel=1e-1)
    bounds = kompress.torch.LayerBounds(hooks, ceiling=1e-1, tolerance=0.05, check_batch=32)
    x, y = two_inputs()
    bounds.train_step(0, model, torch.nn.functional.mse_loss, x, y)   # a check, then the step
    assert bounds.bound(0) == 1e-1 and len(bounds.log()) > 0
