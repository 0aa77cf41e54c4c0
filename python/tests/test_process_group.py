"""The DDP communication hook and the DLRM module on a torch.distributed process group (gloo),
no MPI: world sizes 1, 2 and 4, each a set of processes started by torch.multiprocessing. Each
averaged bucket within the hook's reported bound of the exact average and the same bytes on
every rank; DDP trained with the hook ends within 1% of the exact allreduce's loss; the hook
returns before the bucket is summed; a rank with other settings or a bad bucket is an error on
every rank, and the next bucket is summed. The DLRM module: each value within its table's
bound in both directions, and bad arguments an error on every rank."""
import os
import pickle
import tempfile
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import data_dir, load_array, needs

WORLD_SIZES = [1, 2, 4]


class Bucket:
    """What DDP hands a hook: buffer() is the flattened gradients."""

    def __init__(self, tensor):
        self.tensor = tensor

    def buffer(self):
        return self.tensor


def exact_average(g):
    """The exact average over the group (float64 sums of float64 values) and the sum of |g|/p."""
    exact = g.double() / dist.get_world_size()
    magnitude = exact.abs()
    dist.all_reduce(exact)
    dist.all_reduce(magnitude)
    return exact, magnitude


def same_on_every_rank(t):
    copies = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, t)
    return all(torch.equal(c.view(torch.uint8), t.view(torch.uint8)) for c in copies)


def check_bucket(values, p, me, **options):
    import kompress.torch as kt
    g = values.clone()
    exact, magnitude = exact_average(g)
    state = kt.AllreduceHookState(**options)
    out = kt.allreduce_hook(state, Bucket(g)).wait()
    assert out.data_ptr() == g.data_ptr()
    report = state.last_report
    bound = report.absolute_bound
    finite = torch.isfinite(exact)
    assert torch.equal(torch.isnan(out), torch.isnan(exact)), "NaN not kept in place"
    assert torch.equal(out[~finite & ~torch.isnan(exact)].double(), exact[~finite & ~torch.isnan(exact)])
    eps = torch.finfo(values.dtype).eps
    err = (out.double() - exact)[finite].abs()
    # Floating-point summation error on top of the bound, as plain allreduce has it.
    slack = (2 * p * eps * magnitude[finite]) + bound * 4 * eps
    assert bool((err <= bound + slack).all()), f"bound {bound} violated: {float(err.max())}"
    assert same_on_every_rank(out)
    if p > 1 and options.get("mode", "compressed") == "compressed":
        assert report.messages == 2 * (p - 1)
        if values.numel() >= 4096 and options.get("abs") != 0.0:  # not lossless, not tiny
            assert report.compressed_messages == 2 * (p - 1)
            assert 0 < report.wire_bytes < report.payload_bytes
            assert bound > 0
        if values.numel() < 8 * p:  # every segment smaller than its stream: sent raw, exact
            assert report.compressed_messages == 0
    return state


def mnist():
    needs("mnist_t10k_images_10000x28x28.u8")
    images = np.fromfile(data_dir() / "mnist_t10k_images_10000x28x28.u8", np.uint8)
    labels = np.fromfile(data_dir() / "mnist_t10k_labels_10000.u8", np.uint8)
    x = torch.from_numpy(images.reshape(-1, 784)[:2048].astype(np.float32) / 255)
    return x, torch.from_numpy(labels[:2048].astype(np.int64))


def train(hook_state, p, me, hook=None):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    ddp = DDP(model, bucket_cap_mb=0.25)
    if hook_state is not None:
        ddp.register_comm_hook(hook_state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = mnist()
    for step in range(20):
        start = (step * p + me) * 64 % 2048
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x[start:start + 64]), y[start:start + 64]).backward()
        opt.step()
    with torch.no_grad():
        return model, torch.nn.functional.cross_entropy(model(x), y).item()


# --- the checks each rank runs ------------------------------------------------------------------

def buckets_within_bound(p, me):
    import kompress
    grad = torch.from_numpy(load_array("grad_mlp_fc1_out").reshape(-1).copy())
    share = grad.numel() // 4
    g = grad[me * share:(me + 1) * share]
    for options in (dict(rel=1e-3), dict(rel=1e-2, reduction_bound="total"), dict(abs=1e-7), dict(mode="raw"),
                    dict(mode="auto", rel=1e-3, cost=_cheap_link()), dict(abs=0.0)):
        check_bucket(g, p, me, **options)
    # Doubles, values of either sign, exact zeros and -0.0: the ocean field.
    uvel = torch.from_numpy(load_array("mitgcm_ocean_uvel").reshape(-1).copy())
    check_bucket(uvel.roll(me * 101), p, me, rel=1e-4)
    # Non-finite values come back in place; the bound is resolved over the finite ones.
    odd = g.clone()
    odd[me::97] = float("nan")
    odd[5] = float("inf")
    check_bucket(odd, p, me, rel=1e-3)
    # An odd count (segments of unequal length) and a count smaller than the world size.
    check_bucket(g[:12345], p, me, rel=1e-3)
    check_bucket(g[:3], p, me, rel=1e-3)
    assert kompress.torch.AllreduceHookState().comm is dist.group.WORLD


def _cheap_link():
    import kompress
    cost = kompress.CostModel()
    cost.link_bytes_per_second = 1e8  # 0.8 Gb/s: compressing pays
    return cost


def hook_returns_before_the_sum(p, me):
    import kompress.torch as kt
    if p == 1:
        return
    g = torch.ones(1 << 16)
    state = kt.AllreduceHookState(rel=1e-3)
    if me == p - 1:
        time.sleep(2.0)  # the others' buckets cannot be summed before this rank joins
    started = time.perf_counter()
    future = kt.allreduce_hook(state, Bucket(g))
    returned = time.perf_counter() - started
    if me != p - 1:
        assert returned < 1.0 and not future.done(), (returned, future.done())
    assert torch.equal(future.wait(), torch.ones(1 << 16))


def bad_settings_fail_on_every_rank(p, me):
    import kompress
    import kompress.torch as kt
    g = torch.linspace(-1, 1, 4096)
    cases = [dict(rel=1e-3 if me == 0 else 1e-2), dict(abs=1e-3, mode="raw" if me == 0 else "compressed")]
    for options in cases if p > 1 else []:
        with pytest.raises(kompress.InvalidArgument, match="different"):
            kt.allreduce_hook(kt.AllreduceHookState(**options), Bucket(g.clone())).wait()
    bad = torch.ones(4096, dtype=torch.float16) if me == 0 else torch.ones(4096)
    with pytest.raises(kompress.InvalidArgument, match="float32 or float64"):
        kt.allreduce_hook(kt.AllreduceHookState(rel=1e-3), Bucket(bad)).wait()
    if p > 1:
        with pytest.raises(kompress.InvalidArgument, match="different count"):
            kt.allreduce_hook(kt.AllreduceHookState(rel=1e-3), Bucket(g[:4096 - me].clone())).wait()
    # The group is still in step: the next bucket is summed.
    check_bucket(g, p, me, rel=1e-3)
    with pytest.raises(kompress.InvalidArgument, match="mode must be"):
        kt.AllreduceHookState(mode="fast")


def state_pickles(p, me):
    import kompress.torch as kt
    state = pickle.loads(pickle.dumps(kt.AllreduceHookState(rel=1e-2)))
    assert state.comm is dist.group.WORLD and state.rel == 1e-2
    check_bucket(torch.linspace(0, 1, 1000), p, me, rel=1e-2)


def ddp_trains_like_the_exact_allreduce(p, me):
    import kompress.torch as kt
    _, exact = train(None, p, me)
    state = kt.AllreduceHookState(rel=1e-3)
    model, compressed = train(state, p, me, kt.allreduce_hook)
    assert abs(compressed - exact) <= 0.01 * exact, (compressed, exact)
    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    assert same_on_every_rank(flat), "the replicas differ"
    if p > 1:
        assert state.wire_bytes < state.payload_bytes
    if me == 0:
        print(f"\nDDP on {p} rank(s), gloo: final loss {compressed:.5f} vs exact {exact:.5f}; "
              f"wire/payload {state.wire_bytes}/{state.payload_bytes}", flush=True)


DIMS = [128, 64, 128, 32, 128, 128, 16, 128, 96, 128]   # the real tables' first columns


def exchange_checks(p, me):
    """The DLRM module on the process group: docs/dlrm.md's layout, each value within its
    table's bound (REL forward: against the table's values over the global batch; backward:
    against each sender's slice), own tables exact, gradients through autograd."""
    import kompress
    import kompress.torch as kt
    from conftest import repeat_rows
    local_batch = 32
    rows = p * local_batch
    fwd = torch.from_numpy(repeat_rows(load_array("dlrm_flights_lookup_fwd"), rows)[:rows].copy())
    grad = torch.from_numpy(repeat_rows(load_array("dlrm_flights_lookup_grad"), rows)[:rows].copy())
    tables = [(t % p, d) for t, d in enumerate(DIMS)]
    mine = [t for t in range(len(DIMS)) if t % p == me]
    my_rows = slice(me * local_batch, (me + 1) * local_batch)
    pooled = torch.cat([fwd[:, t, :DIMS[t]] for t in mine], 1) if mine else torch.empty(rows, 0)
    module = kt.EmbeddingAllToAll(tables, local_batch, forward_rel=1e-2, backward_rel=1e-2)
    assert isinstance(module.exchange, kompress.torch._GroupEmbeddingExchange)
    x = pooled.clone().requires_grad_(True)
    out = module(x)
    assert out.shape == (local_batch, sum(DIMS))
    start = 0
    for t, d in enumerate(DIMS):
        exact = fwd[my_rows, t, :d]
        got = out[:, start:start + d].detach()
        values = fwd[:, t, :d]
        bound = 1e-2 * float(values.max() - values.min())
        if tables[t][0] == me:
            assert torch.equal(got, exact), f"own table {t} not exact"
        else:
            assert float((got.double() - exact.double()).abs().max()) <= bound, f"table {t} forward"
        start += d
    report = module.last_reports["forward"]
    if p > 1:
        assert 0 < report.wire_bytes < report.payload_bytes and report.absolute_bound > 0
    # Backward: the gradient of each table's columns comes back to its owner.
    g = torch.cat([grad[my_rows, t, :d] for t, d in enumerate(DIMS)], 1)
    out.backward(g)
    local = 0
    for t in mine:
        d = DIMS[t]
        for q in range(p):
            q_rows = slice(q * local_batch, (q + 1) * local_batch)
            exact = grad[q_rows, t, :d]
            got = x.grad[q_rows, local:local + d]
            if q == me:
                assert torch.equal(got, exact)
            else:
                bound = 1e-2 * float(exact.max() - exact.min())
                assert float((got.double() - exact.double()).abs().max()) <= bound, f"table {t} backward from {q}"
        local += d
    # A wrong shape on one rank: an error on every rank, nothing written; the next call works.
    bad = pooled[:-1] if me == 0 else pooled
    with pytest.raises(kompress.InvalidArgument if me == 0 or p == 1 else kompress.PeerError):
        module(bad)
    module(pooled)
    # Settings that differ between ranks: an error on every rank when the module is made; a
    # rank whose own arguments are rejected raises its own message, the others the mismatch.
    if p > 1:
        with pytest.raises(kompress.InvalidArgument, match="different"):
            kt.EmbeddingAllToAll(tables, local_batch, forward_rel=1e-2 if me else 1e-3)
        with pytest.raises(kompress.InvalidArgument, match="local_batch must be > 0" if me == 0 else "different"):
            kt.EmbeddingAllToAll(tables, 0 if me == 0 else local_batch)
    # A schedule multiplier that is not valid: an InvalidArgument where it is computed, and
    # PeerError elsewhere (only owners compute forward bounds).
    if p > 1:
        schedule = kt.EmbeddingAllToAll(tables, local_batch, bound_schedule=lambda i, t, d: -1.0 if me == 0 else 1.0)
        with pytest.raises(kompress.InvalidArgument if me == 0 else kompress.PeerError):
            schedule(pooled)


# --- the process groups ---------------------------------------------------------------------------

def _rank(me, p, store, check):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=me, world_size=p)
    try:
        check(p, me)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_on(p, check):
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(_rank, args=(p, os.path.join(folder, "store"), check), nprocs=p, join=True,
                           start_method="spawn")


def hook_on_a_group(p, me):
    buckets_within_bound(p, me)
    hook_returns_before_the_sum(p, me)
    bad_settings_fail_on_every_rank(p, me)
    state_pickles(p, me)
    exchange_checks(p, me)


@pytest.mark.parametrize("p", WORLD_SIZES)
def test_hook_on_a_gloo_group(p):
    """Buckets within the bound and identical on every rank, the Future completed later, bad
    settings an error on every rank, the state pickled; the DLRM module's exchange (one set of
    processes for all of them: starting torch in each costs seconds)."""
    run_on(p, hook_on_a_group)


@pytest.mark.parametrize("p", [2, 4])
def test_ddp_trains_like_the_exact_allreduce(p):
    needs("mnist_t10k_images_10000x28x28.u8")
    run_on(p, ddp_trains_like_the_exact_allreduce)
