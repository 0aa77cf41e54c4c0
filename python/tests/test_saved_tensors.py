"""compressed_activations (saved-tensor hooks over a kompress Stash): the MNIST MLP of
examples/stash_training.cpp (784-1024-1024-10, ReLU, Adam with warmup and cosine decay)
trained in PyTorch from the same initial weights and data order with and without the hooks.
The final training loss (of the final weights, over the training set) must be within 1%, and
the saved-activation memory at least 4x smaller at REL 1e-2. docs/performance.md's table is
this short run (ctest); KOMPRESS_MNIST_EPOCHS=5 KOMPRESS_MNIST_TRAIN=8000 make the longer one."""
import math
import os

import numpy as np
import pytest
import torch

import kompress
import kompress.torch
from conftest import assert_within, data_dir, load_array, needs

EPOCHS = int(os.environ.get("KOMPRESS_MNIST_EPOCHS", "2"))
TRAIN = int(os.environ.get("KOMPRESS_MNIST_TRAIN", "1024"))
BATCH = 128
REL = float(os.environ.get("KOMPRESS_MNIST_REL", "1e-2"))
SEED = int(os.environ.get("KOMPRESS_MNIST_SEED", "1"))


def mnist():
    needs("mnist_t10k_images_10000x28x28.u8")
    images = np.fromfile(data_dir() / "mnist_t10k_images_10000x28x28.u8", np.uint8).reshape(-1, 784)
    labels = np.fromfile(data_dir() / "mnist_t10k_labels_10000.u8", np.uint8)
    return (torch.from_numpy(images[:TRAIN].astype(np.float32) / 255),
            torch.from_numpy(labels[:TRAIN].astype(np.int64)))


class Counting(torch.autograd.graph.saved_tensors_hooks):
    """The plain run's saved activations: the bytes of the distinct non-parameter tensors."""

    def __init__(self):
        self.storages = {}
        super().__init__(self.pack, lambda t: t)

    def pack(self, t):
        if not kompress.torch.compressed_activations._is_parameter(t):
            self.storages[(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))] = \
                t.numel() * t.element_size()
        return t


def train(hooks_factory):
    torch.manual_seed(SEED)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    x, y = mnist()
    steps = EPOCHS * math.ceil(TRAIN / BATCH)
    warmup = max(1, round(0.2 * steps))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (s + 1) / warmup if s < warmup else 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup))))
    generator = torch.Generator().manual_seed(SEED + 1)
    peak = 0
    hooks = hooks_factory()
    for _ in range(EPOCHS):
        order = torch.randperm(TRAIN, generator=generator)
        for first in range(0, TRAIN, BATCH):
            rows = order[first:first + BATCH]
            opt.zero_grad()
            if isinstance(hooks, Counting):
                hooks.storages.clear()
            else:
                hooks.reset_peaks()
            with hooks:  # the model only, as docs/python.md says: the loss's saved output stays exact
                logits = model(x[rows])
            loss = torch.nn.functional.cross_entropy(logits, y[rows])
            held = sum(hooks.storages.values()) if isinstance(hooks, Counting) else hooks.peak_bytes
            peak = max(peak, held)
            loss.backward()
            opt.step()
            schedule.step()
    with torch.no_grad():
        final = torch.nn.functional.cross_entropy(model(x), y).item()
    return final, peak, hooks


def test_mnist_mlp_with_and_without_compressed_activations():
    plain_loss, plain_bytes, _ = train(Counting)
    loss, held, hooks = train(lambda: kompress.torch.compressed_activations(rel=REL, budget_bytes=8 << 20,
                                                                            min_numel=4096))
    stats = hooks.stats()
    gap = (loss - plain_loss) / plain_loss
    print(f"\nMNIST MLP, seed {SEED}, REL {REL:g}, {EPOCHS} epochs x {TRAIN} images: final loss plain "
          f"{plain_loss:.5f}, compressed {loss:.5f} ({100 * gap:+.2f}%); saved activations plain "
          f"{plain_bytes / 1e3:.1f} KB, compressed {held / 1e3:.1f} KB ({plain_bytes / held:.2f}x); "
          f"compression ratio of the saves {stats.ratio:.2f}x over {stats.saves} saves")
    assert stats.saves > 0 and stats.entries == 0, "every entry is dropped once backward has used it"
    assert abs(gap) <= 0.01
    assert plain_bytes >= 4 * held


def test_restored_activations_are_within_the_bound_and_pass_through_rules():
    needs("act_mlp_fc1_out_1024x1024.f32")
    x = torch.from_numpy(np.fromfile(data_dir() / "act_mlp_fc1_out_1024x1024.f32", np.float32)
                         .reshape(1024, 1024)[:256].copy()).requires_grad_()
    w = torch.nn.Parameter(torch.randn(1024, 64) * 0.03)
    hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=1000)
    h = torch.relu(x)
    saved = hooks._pack(h)
    assert isinstance(saved, kompress.torch._Saved) and hooks.stats().entries == 1
    assert hooks._pack(h) is saved, "a tensor saved twice is compressed once"
    restored = hooks._unpack(saved)
    assert restored.shape == h.shape and restored.dtype == h.dtype
    assert_within(h.detach().numpy(), restored.numpy(), saved.bound)
    assert saved.bound == hooks.stash.info(saved.handle).absolute_bound > 0
    assert torch.equal(restored > 0, h > 0), "exact_sign: positive exactly where the original is"
    info = hooks.stash.info(saved.handle)
    assert info.keeps_sign and hooks.stats().sign_bytes == info.sign_bytes > 0, "the stash keeps the bits"
    # Passed through untouched: small tensors, parameters and their views, other types.
    for t in (torch.arange(500), h[:2, :10], w, w.t(), h.detach().to(torch.float16), h > 0):
        assert hooks._pack(t) is t
    # Integers, exactly, in fewer bytes: here the narrowest type that holds them (int16).
    indices = torch.arange(5000)
    narrow = hooks._pack(indices)
    assert narrow.nbytes == 2 * 5000 and torch.equal(hooks._unpack(narrow), indices)
    del saved
    assert hooks.stats().entries == 0, "the entry is dropped with the last reference"
    # In a graph: backward works and leaves nothing in the stash.
    with hooks:
        loss = (torch.relu(x) @ w).square().sum()
    assert hooks.stats().entries >= 1
    loss.backward()
    assert x.grad is not None and w.grad is not None
    del loss
    assert hooks.stats().entries == 0


def _saves_in_one_step(model, x):
    """How many activations the hooks compressed in a forward and backward of ``model``."""
    with kompress.torch.compressed_activations(rel=1e-2, min_numel=1024) as hooks:
        model(x).square().mean().backward()
        return hooks.stats().saves


def test_where_the_hooks_apply():
    """docs/python.md, "Where the hooks apply": eager code and torch.compile (aot_eager) give the
    hooks every saved activation; checkpointed regions give them only their inputs. A torch
    whose compiled graphs bypassed the hooks would fail here instead of silently saving
    uncompressed."""
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    x = torch.from_numpy(load_array("act_mlp_relu2_out").reshape(-1, 256)[:128].copy())
    eager = _saves_in_one_step(model, x)
    assert eager >= 3, eager  # the input and the two ReLU outputs (the Linear outputs only feed ReLU)
    assert _saves_in_one_step(torch.compile(model, backend="aot_eager"), x) == eager
    region = _saves_in_one_step(lambda v: checkpoint(model, v, use_reentrant=False), x)
    assert region < eager, (region, eager)


def test_saved_bytes_count_integer_tensors_kept_exactly_in_fewer_bytes():
    """Max pooling saves its argmax as int64, as many as its outputs: memory an honest count of
    the saved activations includes although no stash holds it. The hooks keep each index as its
    place in its 2 x 2 window (2 bits) and restore them exactly."""
    x = torch.from_numpy(load_array("act_cnn_s3_relu_out").reshape(-1, 64, 8, 8)[:4].copy()).requires_grad_()
    plain = {}

    def count(t):
        if not kompress.torch.compressed_activations._is_parameter(t):
            plain[(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))] = (t.dtype, t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        torch.nn.functional.max_pool2d(x * 2, 2).sum().backward()
    exact = x.grad.clone()
    indices = [n for d, n in plain.values() if d == torch.int64]
    assert len(indices) == 1, "the indices were saved (else this proves nothing)"
    values = indices[0]
    for packed, size in ((False, 8), (True, 0.25)):
        hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=16, narrow_integers=packed)
        hooks.reset_peaks()
        with hooks:
            y = torch.nn.functional.max_pool2d(x * 2, 2)
        assert hooks.saved_bytes() == hooks.peak_bytes == values * size + hooks.stats().pool_bytes
        x.grad = None
        y.sum().backward()
        assert torch.equal(x.grad, exact), "the indices come back exactly"


def _pooling_indices(shape, *args, **kwargs):
    generator = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=generator)
    return torch.nn.functional.max_pool2d(x, *args, return_indices=True, **kwargs)[1]


@pytest.mark.parametrize("shape, args, kwargs, bits", [
    ((16, 8, 28, 28), (2,), {}, 2),                           # the CNN's
    ((2, 3, 15, 17), (2,), {"ceil_mode": True}, 2),           # odd planes, windows cut at the edge
    ((4, 3, 15, 17), (3, 2, 1), {}, 4),                       # ResNet's stem pooling
    ((2, 5, 9, 9), (3, 1, 1), {}, 4),
    ((2, 3, 16, 16), (4,), {}, 4),
    ((2, 3, 31, 29), (3,), {}, 4),
    ((2, 3, 12, 12), (2,), {"dilation": 2}, 4),               # offsets 0 and 2: extent 3
    ((2, 3, 8, 8), (5, 2, 2), {}, 8),
    ((3, 40, 40), ((2, 3), 2), {}, 4),                        # no batch dimension, a 2 x 3 window
    ((3, 40, 40), ((2, 3), (2, 3)), {}, 16),                  # strides that differ: int16
])
def test_pack_integers_keeps_pooling_indices_as_places_in_their_windows(shape, args, kwargs, bits):
    indices = _pooling_indices(shape, *args, **kwargs)
    packed = kompress.torch.pack_integers(indices)
    assert packed.nbytes == -(-indices.numel() * bits // 8)
    restored = packed.unpack()
    assert restored.dtype == indices.dtype and restored.shape == indices.shape and torch.equal(restored, indices)
    # The same through a non-contiguous view and as int32.
    view = indices[..., ::2, :]
    assert torch.equal(kompress.torch.pack_integers(view).unpack(), view)
    as_int32 = indices.to(torch.int32)
    again = kompress.torch.pack_integers(as_int32)
    assert again.nbytes == packed.nbytes and torch.equal(again.unpack(), as_int32)


def test_pack_integers_checks_every_plane_and_falls_back_to_the_narrowest_type():
    """The window is chosen on the first plane and checked on all: a later plane whose indices
    leave it makes another window, or the narrowest type, hold them, never a wrong value."""
    indices = _pooling_indices((4, 6, 16, 16), 2)
    broken = indices.clone()
    broken[3, 5, 7, 7] = 0          # no 2 x 2 window at output (7, 7) holds index 0
    packed = kompress.torch.pack_integers(broken)
    assert torch.equal(packed.unpack(), broken)
    assert packed.nbytes == 2 * broken.numel(), "int16 where no window holds every index"
    for t, nbytes in ((torch.arange(5000), 10000),                       # 1-D: narrowest type
                      (torch.randint(-5, 1000, (64, 33)), 2 * 64 * 33),  # no window: int16
                      (torch.full((8, 8), 1 << 40), None),               # nothing narrower
                      (torch.randint(0, 7, (8, 8), dtype=torch.int16), 64)):
        packed = kompress.torch.pack_integers(t)
        if nbytes is None:
            assert packed is None
        else:
            assert packed.nbytes == nbytes and torch.equal(packed.unpack(), t)
    # Values beyond 32 bits (searched in 64-bit arithmetic) that no window holds: left as they are.
    assert kompress.torch.pack_integers(_pooling_indices((1, 2, 8, 8), 2) + (1 << 40)) is None
    for t in (torch.zeros(0, dtype=torch.int64), torch.ones(4, 4), torch.ones(4, 4, dtype=torch.bool),
              torch.ones(4, 4, dtype=torch.uint8)):
        assert kompress.torch.pack_integers(t) is None
    assert kompress.torch._narrowest(torch.tensor([0, 1 << 40, -5])) is None
    assert kompress.torch._narrowest(torch.tensor([0, 1 << 20], dtype=torch.int32)) is None
    assert kompress.torch._narrowest(torch.tensor([0, 1 << 20])) == torch.int32
    assert kompress.torch._narrowest(torch.tensor([-129, 127])) == torch.int16
    assert kompress.torch._narrowest(torch.tensor([-128, 127], dtype=torch.int32)) == torch.int8
    assert kompress.torch._narrowest(torch.tensor([True])) is None


def test_a_view_of_a_saved_activation_is_restored_from_it_not_saved_again():
    """Attention saves softmax's output, and the same memory reshaped as the next product's
    operand: one stream, both restored from it."""
    scores = torch.from_numpy(load_array("act_tfm_b1_ln1_in").reshape(-1, 4, 32, 128)[:4].copy())
    hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=1000)
    a = torch.softmax(scores, dim=-1)
    saved = hooks._pack(a)
    held = hooks.saved_bytes()
    whole = hooks._unpack(saved)
    for view, expected in ((a.view(16, 32, 128), whole.view(16, 32, 128)), (a[:, 1], whole[:, 1]),
                           (a.transpose(-1, -2), whole.transpose(-1, -2)), (a[1:3, :, 7:], whole[1:3, :, 7:])):
        kept = hooks._pack(view)
        assert isinstance(kept, kompress.torch._ViewOf), view.shape
        restored = hooks._unpack(kept)
        assert restored.shape == view.shape and restored.stride() == view.stride()
        assert torch.equal(restored, expected)
    assert hooks.stats().saves == 1 and hooks.saved_bytes() == held
    # Not views of it: another tensor, the same memory after an in-place change, another type.
    other = hooks._pack(a + 1)
    assert isinstance(other, kompress.torch._Saved) and hooks.stats().saves == 2
    a.mul_(2)
    assert isinstance(hooks._pack(a.view(16, 32, 128)), kompress.torch._Saved) and hooks.stats().saves == 3
    del saved, whole, other
    # A non-contiguous first save is copied before compression: views of its memory are saved anew.
    hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=1000)
    t = scores.transpose(-1, -2)
    first = hooks._pack(t)
    assert isinstance(hooks._pack(scores), kompress.torch._Saved) and hooks.stats().saves == 2
    # In a graph: softmax's output and its reshaped view are one stream; backward runs.
    hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=1000)
    q = scores.clone().requires_grad_()
    w = torch.nn.Parameter(torch.ones(16, 128, 4))  # a parameter: passed through, not a save
    with hooks:
        a = torch.softmax(q, dim=-1)
        out = torch.bmm(a.view(16, 32, 128), w)
    saves_before_backward = hooks.stats().saves
    out.square().sum().backward()
    assert saves_before_backward == 1 and q.grad is not None and torch.isfinite(q.grad).all()
    assert hooks.stats().entries == 0
    del first


def test_a_callable_bound_gives_each_activation_its_own():
    scores = torch.from_numpy(load_array("act_tfm_b1_ln1_in").reshape(-1, 4, 32, 128)[:4].copy())
    seen = []

    def rel(t):
        seen.append(t.grad_fn.name() if t.grad_fn is not None else None)
        return 1e-3 if t.grad_fn is not None and t.grad_fn.name() == "SoftmaxBackward0" else 5e-2

    hooks = kompress.torch.compressed_activations(rel=rel, min_numel=1000)
    q = scores.clone().requires_grad_()
    with hooks:
        a = torch.softmax(q, dim=-1)
        h = q * 2
        g = torch.nn.functional.gelu(h)
    bounds = {}
    for name, t in (("softmax", a), ("gelu input", h)):
        saved = hooks._pack(t)
        bounds[name] = saved.bound
        assert_within(t.detach().numpy(), hooks._unpack(saved).numpy(), saved.bound)
    span = lambda t: float(t.detach().max() - t.detach().min())
    assert bounds["softmax"] == pytest.approx(1e-3 * span(a), rel=1e-6)
    assert bounds["gelu input"] == pytest.approx(5e-2 * span(h), rel=1e-6)
    assert "SoftmaxBackward0" in seen
    (a.sum() + g.sum()).backward()
    for bad in (lambda t: -1.0, lambda t: float("nan"), lambda t: "1e-2", lambda t: None):
        with pytest.raises(kompress.InvalidArgument, match=r"rel\(tensor\) must return a finite number >= 0"):
            kompress.torch.compressed_activations(rel=bad, min_numel=1000)._pack(a)
    saved = kompress.torch.compressed_activations(rel=lambda t: np.float32(1e-2), min_numel=1000)._pack(a)
    assert saved.bound == pytest.approx(1e-2 * span(a), rel=1e-6)
    hooks = kompress.torch.compressed_activations(abs=lambda t: 0.0, min_numel=1000)
    saved = hooks._pack(a)
    assert torch.equal(hooks._unpack(saved), a) and not hooks.stash.info(saved.handle).keeps_sign


def test_budget_policies_apply():
    x = torch.randn(256, 1024, requires_grad=True)  # incompressible at this bound
    with pytest.raises(kompress.BudgetExceeded):
        with kompress.torch.compressed_activations(abs=1e-6, budget_bytes=256 << 10, min_numel=1000):
            torch.relu(x).sum()
    with kompress.torch.compressed_activations(abs=1e-6, budget_bytes=256 << 10, min_numel=1000,
                                               policy="spill_host") as hooks:
        y = torch.sigmoid(x)
    assert hooks.stats().spilled_segments > 0
    y.sum().backward()
    assert x.grad is not None


def test_saves_the_budget_loosens_are_recorded_and_restored_within_their_bound():
    x = torch.randn(256, 1024, requires_grad=True)  # 1 MiB: at REL 1e-6 it does not fit 256 KiB
    with kompress.torch.compressed_activations(rel=1e-6, budget_bytes=256 << 10, min_numel=1000,
                                               policy="loosen_bound", ceiling_rel=1e-1, growth=4.0) as hooks:
        y = torch.sigmoid(x)
    assert hooks.stats().loosened_saves == 1
    assert list(hooks.loosened) == ["SigmoidBackward0 (256, 1024)"]
    count, bound = hooks.loosened["SigmoidBackward0 (256, 1024)"]
    assert count == 1 and 1e-6 < bound <= 1e-1
    y.sum().backward()
    # sigmoid's backward reads its output: s(1 - s) moves by at most (1 + e) e when s moves by e
    exact = torch.sigmoid(x.detach())
    e = bound * float(exact.max() - exact.min())
    assert float((x.grad - exact * (1 - exact)).abs().max()) <= (1 + e) * e * (1 + 1e-6) + 1e-7


def test_a_new_tensor_in_a_freed_tensors_memory_is_not_taken_for_it():
    # What the allocator does when it gives a freed activation's memory to a new one of the
    # same shape, made deterministic: the same storage, offset, shape and version counter,
    # new values (written through numpy, which leaves the version alone), the first tensor gone.
    hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=1000)
    memory = torch.full((4096,), 1.0)
    first = memory.view(64, 64)
    saved = hooks._pack(first)
    del first
    memory.numpy()[:] = 5.0
    second = memory.view(64, 64)
    other = hooks._pack(second)
    assert other is not saved
    assert torch.all(hooks._unpack(other) == 5.0) and torch.all(hooks._unpack(saved) == 1.0)


def straddling_zero(shape, e):
    """Activations around 0 at the bound's scale, zeros among them: a bound alone flips signs."""
    x = torch.empty(shape, dtype=torch.float32).uniform_(-4 * e, 4 * e, generator=torch.Generator().manual_seed(3))
    x.view(-1)[::89] = 0.0
    return x


def test_exact_sign_restores_every_value_on_its_saved_side_of_zero_within_the_bound():
    x = straddling_zero((300, 333), 1e-3)
    restored, bounds = {}, {}
    for exact_sign in (False, True):
        hooks = kompress.torch.compressed_activations(abs=1e-3, min_numel=1000, exact_sign=exact_sign)
        saved = hooks._pack(x)
        restored[exact_sign], bounds[exact_sign] = hooks._unpack(saved), saved.bound
        info = hooks.stash.info(saved.handle)
        assert info.keeps_sign == exact_sign and (info.sign_bytes > 0) == exact_sign
        # The bits are in the stash's bytes, counted once: the pool in use is all the hooks hold.
        assert hooks.saved_bytes() == hooks.stats().pool_bytes
        assert hooks.stats().sign_bytes == info.sign_bytes
    assert ((restored[False] > 0) != (x > 0)).sum() > 100, "without the bits some signs flip (else this proves nothing)"
    assert torch.equal(restored[True] > 0, x > 0)
    for exact_sign in (False, True):
        assert_within(x.numpy(), restored[exact_sign].numpy(), bounds[exact_sign])


def test_exact_sign_may_be_decided_per_tensor():
    x, y = straddling_zero((300, 333), 1e-3), straddling_zero((333, 300), 1e-3)
    hooks = kompress.torch.compressed_activations(abs=1e-3, min_numel=1000, exact_sign=lambda t: t.shape[0] == 300)
    saved_x, saved_y = hooks._pack(x), hooks._pack(y)
    assert hooks.stash.info(saved_x.handle).keeps_sign and not hooks.stash.info(saved_y.handle).keeps_sign
    restored_x, restored_y = hooks._unpack(saved_x), hooks._unpack(saved_y)
    assert torch.equal(restored_x > 0, x > 0)
    assert ((restored_y > 0) != (y > 0)).sum() > 100, "without the bits some signs flip"
    assert_within(x.numpy(), restored_x.numpy(), saved_x.bound)
    assert_within(y.numpy(), restored_y.numpy(), saved_y.bound)
    hooks = kompress.torch.compressed_activations(abs=1e-3, min_numel=1000, exact_sign=lambda t: 1)
    with pytest.raises(kompress.InvalidArgument, match=r"exact_sign\(tensor\) must return a bool \(got 1"):
        hooks._pack(x)
    assert hooks.stats().entries == 0, "a refused save stores nothing"


def test_a_lossless_bound_keeps_no_sign_bits():
    hooks = kompress.torch.compressed_activations(abs=0, min_numel=1000)
    x = straddling_zero((64, 64), 1e-3)
    saved = hooks._pack(x)
    assert not hooks.stash.info(saved.handle).keeps_sign and hooks.stats().sign_bytes == 0
    assert torch.equal(hooks._unpack(saved), x)


def test_the_codec_reaches_the_stash():
    x = torch.from_numpy(load_array("act_mlp_relu2_out").reshape(-1, 1024)[:64].copy())
    for codec, expected in ((None, "fast"), ("fast", "fast"), ("ratio", "ratio")):
        hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=1000, codec=codec)
        saved = hooks._pack(x)
        assert hooks.stash.info(saved.handle).codec == expected
        assert_within(x.numpy(), hooks._unpack(saved).numpy(), saved.bound)
    hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=1000, codec="auto")
    hooks._pack(x)
    assert hooks.stats().codec_measurements == 1
    with pytest.raises(kompress.InvalidArgument, match="codec must be None, 'fast', 'ratio' or 'auto'"):
        kompress.torch.compressed_activations(codec="zstd")


def test_the_rounding_reaches_the_stash():
    x = torch.from_numpy(load_array("act_mlp_relu2_out").reshape(-1, 1024)[:64].copy())
    for rounding, expected in ((None, "nearest"), ("nearest", "nearest"), ("stochastic", "stochastic")):
        hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=1000, rounding=rounding)
        saved = hooks._pack(x)
        assert hooks.stash.info(saved.handle).rounding == expected
        restored = hooks._unpack(saved)
        assert_within(x.numpy(), restored.numpy(), saved.bound)
        assert torch.equal(restored > 0, x > 0)
    # None: the given stash's.
    hooks = kompress.torch.compressed_activations(rel=1e-2, min_numel=1000,
                                                  stash=kompress.Stash(4 << 20, rounding="stochastic"))
    assert hooks.stash.info(hooks._pack(x).handle).rounding == "stochastic"
    with pytest.raises(kompress.InvalidArgument, match="rounding must be None, 'nearest' or 'stochastic'"):
        kompress.torch.compressed_activations(rounding="up")


def test_group_relative_bounds_reach_the_stash():
    a = torch.rand(64, 1024) * torch.logspace(-3, 0, 64)[:, None]   # rows at scales from 1e-3 to 1
    hooks = kompress.torch.compressed_activations(rel=0.1, min_numel=1000, group_relative=True)
    saved = hooks._pack(a)
    info = hooks.stash.info(saved.handle)
    assert info.group_relative and info.absolute_bound <= 0.1 * float(a.max() - a.min())
    error = (hooks._unpack(saved) - a).abs()
    assert float(error[0].max()) <= 0.1 * float(a[0].max() - a[0].min())   # the smallest row, its own range
    with pytest.raises(kompress.InvalidArgument, match="group_relative takes a rel bound"):
        kompress.torch.compressed_activations(abs=1e-3, group_relative=True)
