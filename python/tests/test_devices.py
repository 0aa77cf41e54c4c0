"""Which devices the package takes. Everywhere: what a CPU-only build says about GPU tensors, and
the stash's kept signs on the CPU. Where a CUDA build of kompress meets a GPU
(kompress.cuda_enabled and torch.cuda.is_available()): CUDA tensors through every part of the
package, on torch's current stream: streams byte-identical to the CPU's and decoded across
devices, the stash (its kept signs too) and the saved-tensor hooks in GPU memory,
the collectives on one MPI rank, the process-group hook and the DLRM module with CUDA tensors
on gloo groups of 1 and 2 ranks sharing the GPU, and NCCL on one rank (NCCL needs a GPU per
rank)."""
import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import kompress
import kompress.torch as kt
from conftest import load_array

on_gpu = pytest.mark.skipif(not (kompress.cuda_enabled and torch.cuda.is_available()),
                            reason="needs a CUDA build of kompress (cuda_enabled) and a GPU torch can see")


def within(restored, original, bound):
    """Every finite value within the bound; NaN and infinities in place."""
    r, o = np.asarray(restored, dtype=np.float64), np.asarray(original, dtype=np.float64)
    finite = np.isfinite(o)
    assert np.array_equal(np.isnan(r), np.isnan(o))
    assert np.array_equal(r[~finite & ~np.isnan(o)], o[~finite & ~np.isnan(o)])
    err = np.abs(r[finite] - o[finite])
    assert err.size == 0 or err.max() <= bound, f"bound {bound} violated: {err.max()}"


# --- every build ---------------------------------------------------------------------------------

def test_a_build_says_which_devices_it_takes():
    if kompress.cuda_enabled:
        assert isinstance(kompress.cuda_device, int)
        return
    assert kompress.cuda_device is None
    with pytest.raises(kompress.InvalidArgument, match="built without CUDA"):
        kompress.Stash(1 << 20, device="cuda")
    with pytest.raises(kompress.InvalidArgument, match="device must be 'cpu'"):
        kompress.Stash(1 << 20, device="tpu")
    assert kompress.Stash(1 << 20).device == "cpu"
    # A tensor on a device the build does not take: the message says which devices it does.
    with pytest.raises(kompress.InvalidArgument, match="CPU tensors only"):
        kompress.compress(torch.zeros(16, device="meta"), rel=1e-3)


# --- CUDA tensors --------------------------------------------------------------------------------

CASES = [("nyx_temperature", "rel", 1e-3, "fast"), ("pop_temp", "abs", 1e-2, "fast"),
         ("mitgcm_ocean_uvel", "rel", 1e-4, "fast"), ("era5_t2m_uk", "rel", 1e-3, "ratio"),
         ("act_mlp_relu2_out", "rel", 1e-2, "fast")]


@on_gpu
@pytest.mark.parametrize("name,mode,value,codec", CASES)
def test_cuda_streams_are_the_cpus_bytes_and_decode_on_either_device(name, mode, value, codec):
    x = load_array(name)
    cpu_stream = kompress.compress(x, codec=codec, **{mode: value})
    g = torch.from_numpy(np.ascontiguousarray(x)).cuda()
    gpu_stream = kompress.compress(g, codec=codec, **{mode: value})
    assert gpu_stream.is_cuda and gpu_stream.dtype == torch.uint8
    assert np.array_equal(gpu_stream.cpu().numpy(), cpu_stream)
    bound = kompress.inspect(gpu_stream).absolute_bound
    assert bound == kompress.inspect(cpu_stream).absolute_bound
    on_gpu_new = kompress.decompress(gpu_stream)                         # a new CUDA tensor
    assert on_gpu_new.is_cuda
    on_host = kompress.decompress(gpu_stream, out=np.empty_like(x))       # GPU stream, host output
    on_gpu_out = kompress.decompress(cpu_stream, out=torch.empty_like(g))  # host stream, GPU output
    expected = kompress.decompress(cpu_stream, out=np.empty_like(x))
    for restored in (on_gpu_new.cpu().numpy().reshape(x.shape), on_host, on_gpu_out.cpu().numpy()):
        assert restored.tobytes() == expected.tobytes()
    within(expected, x, bound)


@on_gpu
def test_cuda_calls_run_on_torchs_current_stream():
    """Values written on a side stream are compressed there without a synchronisation between;
    compress_into writes into a CUDA buffer, and a stream decodes on another side stream."""
    x = torch.from_numpy(load_array("nyx_temperature").reshape(-1).copy())
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        g = x.cuda(non_blocking=False) * 2.0 + 1.0          # queued on the side stream
        out = torch.empty(kompress.max_compressed_size(g.numel()), dtype=torch.uint8, device="cuda")
        length = kompress.compress_into(g, out, abs=1e-3)
        back = torch.empty_like(g)
        kompress.decompress(out[:length], out=back)
    side.synchronize()
    within(back.cpu().numpy(), (x * 2.0 + 1.0).numpy(), 1e-3)
    assert np.array_equal(out[:length].cpu().numpy(), kompress.compress((x * 2.0 + 1.0).numpy(), abs=1e-3))


@on_gpu
def test_cuda_arrays_are_checked_like_host_ones():
    g = torch.zeros(64, 64, device="cuda")
    with pytest.raises(kompress.InvalidArgument, match="C-contiguous"):
        kompress.compress(g.t(), rel=1e-3)
    with pytest.raises(kompress.InvalidArgument, match="same device"):
        kompress.compress_into(g, np.empty(1 << 16, np.uint8), rel=1e-3)
    with pytest.raises(kompress.FormatError):
        kompress.decompress(torch.zeros(200, dtype=torch.uint8, device="cuda"))


DEVICES = ["cpu", pytest.param("cuda", marks=on_gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("policy", ["throw", "spill_host"])
def test_a_stash_on_each_device(device, policy):
    x = torch.from_numpy(load_array("act_mlp_relu2_out").copy()).to(device)
    budget = 4 << 20 if policy == "throw" else 96 << 10   # spill_host: most saves go to (pinned) host memory
    stash = kompress.Stash(budget, device=device, policy=policy, segment_bytes=32 << 10)
    assert stash.device == device
    handles = [stash.save(x * (i + 1), rel=1e-2) for i in range(4)]
    if policy == "spill_host":
        assert stash.stats().host_spilled_bytes > 0
    for i, handle in enumerate(handles):
        info = stash.info(handle)
        restored = stash.restore(handle, drop=True)
        if device == "cuda":
            assert restored.is_cuda
        values = restored.cpu().numpy() if device == "cuda" else restored
        within(values, (x * (i + 1)).cpu().numpy().reshape(-1), info.absolute_bound)
    if device == "cuda":
        with pytest.raises(kompress.InvalidArgument, match="a stash keeps arrays of its own device"):
            stash.save(torch.zeros(16), rel=1e-2)
    stash.close()


@pytest.mark.parametrize("device", DEVICES)
def test_kept_signs_on_each_device(device):
    """keep_sign's bits packed and applied where the stash is: restored values positive exactly
    where the saved ones were, within the bound, on data whose signs the bound alone flips."""
    x = torch.empty(70001).uniform_(-4e-3, 4e-3, generator=torch.Generator().manual_seed(5))
    x[::97] = 0.0
    g = x.to(device)
    stash = kompress.Stash(4 << 20, device=device)
    plain, kept = stash.save(g, abs=1e-3), stash.save(g, abs=1e-3, keep_sign=True)
    assert stash.info(kept).keeps_sign and stash.info(kept).sign_bytes > 0
    flipped, restored = (torch.as_tensor(stash.restore(h)).cpu() for h in (plain, kept))
    assert ((flipped > 0) != (x > 0)).sum() > 100
    assert torch.equal(restored > 0, x > 0)
    within(restored.numpy(), x.numpy(), stash.info(kept).absolute_bound)
    stash.close()


def _train(model, x, y, steps, hooks=None):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        if hooks is None:
            loss = torch.nn.functional.cross_entropy(model(x), y)
        else:
            with hooks:
                logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 10))


@pytest.mark.parametrize("device", DEVICES)
def test_saved_activations_compressed_on_each_device(device):
    """The MNIST-sized MLP under the hooks on the device's memory: its activations are saved
    (stats), and the final loss within 1% of plain training from the same weights; tensors of
    the other device pass through."""
    torch.manual_seed(0)
    x = torch.rand(512, 784, device=device)
    y = torch.randint(0, 10, (512,), device=device)
    plain = _mlp().to(device)
    hooked = _mlp().to(device)
    hooked.load_state_dict(plain.state_dict())
    hooks = kt.compressed_activations(rel=1e-2, budget_bytes=64 << 20, device=device)
    assert hooks.device == device
    loss_plain = _train(plain, x, y, 10)
    loss_hooked = _train(hooked, x, y, 10, hooks)
    assert hooks.stats().saves > 0 and hooks.stats().restores > 0 and hooks.stats().entries == 0
    assert abs(loss_hooked - loss_plain) <= 0.01 * abs(loss_plain), (loss_plain, loss_hooked)
    if device == "cuda":  # CPU tensors pass through a GPU stash's hooks untouched
        saves = hooks.stats().saves
        _train(_mlp(), x.cpu(), y.cpu(), 1, hooks)
        assert hooks.stats().saves == saves


@on_gpu
def test_collectives_on_cuda_tensors_on_one_rank():
    pytest.importorskip("mpi4py")
    from mpi4py import MPI
    if MPI.COMM_WORLD.Get_size() != 1:
        pytest.skip("runs as a single process")
    x = torch.from_numpy(load_array("nyx_temperature").reshape(-1).copy()).cuda()
    out = torch.empty_like(x)
    report = kompress.allreduce(x, out, abs=1e-3)
    within(out.cpu().numpy(), x.cpu().numpy(), report.absolute_bound)
    request = kompress.iallgather(x, out, abs=1e-3)
    request.wait()
    within(out.cpu().numpy(), x.cpu().numpy(), 1e-3)
    with pytest.raises(kompress.InvalidArgument, match="same device"):
        kompress.allreduce(x, out.cpu(), abs=1e-3)


# --- process groups with CUDA tensors ------------------------------------------------------------

def _bucket_on_the_gpu(p, me):
    torch.cuda.set_device(0)
    g = torch.from_numpy(load_array("act_mlp_relu2_out").reshape(-1).copy()).cuda() * (me + 1)
    # The exact average, summed in float64 where the group sums (NCCL: on the GPU).
    exact = g.double() / p
    if dist.get_backend() != "nccl":
        exact = exact.cpu()
    dist.all_reduce(exact)
    exact_sum = exact.cpu()
    state = kt.AllreduceHookState(rel=1e-3)

    class Bucket:
        def buffer(self):
            return g

    out = kt.allreduce_hook(state, Bucket()).wait()
    assert out.is_cuda and out.data_ptr() == g.data_ptr()
    bound = state.last_report.absolute_bound
    err = (out.double().cpu() - exact_sum).abs()
    assert float(err.max()) <= bound * (1 + 1e-6) + 1e-6, (float(err.max()), bound)
    mine = out if dist.get_backend() == "nccl" else out.cpu()
    copies = [torch.empty_like(mine) for _ in range(p)]
    dist.all_gather(copies, mine)
    assert all(torch.equal(c, mine) for c in copies)
    # The DLRM module on CUDA tensors.
    tables = [(q % p, 16) for q in range(2 * p)]
    local_batch = 8
    module = kt.EmbeddingAllToAll(tables, local_batch, forward_rel=1e-2)
    width = sum(d for o, d in tables if o == me)
    pooled = torch.randn(p * local_batch, width, device="cuda", requires_grad=True)
    result = module(pooled)
    assert result.is_cuda and tuple(result.shape) == (local_batch, sum(d for _, d in tables))
    result.sum().backward()
    assert pooled.grad is not None and pooled.grad.is_cuda


def _rank(me, p, store, backend, check):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=me, world_size=p)
    try:
        check(p, me)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@on_gpu
@pytest.mark.parametrize("backend,p", [("gloo", 1), ("gloo", 2), ("nccl", 1)])
def test_process_group_paths_with_cuda_tensors(backend, p):
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(_rank, args=(p, os.path.join(folder, "store"), backend, _bucket_on_the_gpu), nprocs=p,
                           join=True, start_method="spawn")
