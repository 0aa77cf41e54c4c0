"""The DDP communication hook on 2 ranks: DistributedDataParallel on a gloo process group,
the gradient buckets averaged by kompress's allreduce over MPI. The run with the hook must
follow the run with gloo's exact allreduce: every bucket within the hook's reported bound,
and the trained models close."""
import os
import tempfile

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

import kompress
import kompress.torch
from conftest import load, needs

comm = MPI.COMM_WORLD
p, me = comm.Get_size(), comm.Get_rank()


def setup_module():
    path = comm.bcast(tempfile.mkdtemp() if me == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"file://{path}/store", rank=me, world_size=p)


def teardown_module():
    dist.destroy_process_group()


def data():
    needs("mnist_t10k_images_10000x28x28.u8")
    images = np.fromfile(load.__globals__["data_dir"]() / "mnist_t10k_images_10000x28x28.u8", np.uint8)
    labels = np.fromfile(load.__globals__["data_dir"]() / "mnist_t10k_labels_10000.u8", np.uint8)
    x = torch.from_numpy(images.reshape(-1, 784)[:2048].astype(np.float32) / 255)
    return x, torch.from_numpy(labels[:2048].astype(np.int64))


def train(hook_state):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    ddp = DDP(model, bucket_cap_mb=0.25)
    if hook_state is not None:
        ddp.register_comm_hook(hook_state, kompress.torch.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = data()
    losses = []
    for step in range(20):
        rows = slice((step * p + me) * 64 % 2048, (step * p + me) * 64 % 2048 + 64)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x[rows]), y[rows])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        final = torch.nn.functional.cross_entropy(model(x), y).item()
    return model, final


def test_hook_trains_like_the_exact_allreduce():
    _, exact = train(None)
    state = kompress.torch.AllreduceHookState(comm, rel=1e-3)
    model, compressed = train(state)
    assert state.last_report is not None and state.last_report.compressed_messages > 0
    assert state.wire_bytes < state.payload_bytes
    assert abs(compressed - exact) <= 0.01 * exact, (compressed, exact)
    # The replicas stay identical: the allreduce gives every rank the same bytes.
    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()]).numpy()
    root = comm.bcast(flat, root=0)
    assert np.array_equal(root, flat)
    if me == 0:
        print(f"\nDDP hook: final loss {compressed:.5f} vs exact {exact:.5f}; wire/payload "
              f"{state.wire_bytes}/{state.payload_bytes}")


def test_hook_bucket_within_bound():
    # One bucket by hand: the hook's average against the exact average.
    g = torch.from_numpy(load("grad_mlp_fc1_out_1024x1024.f32").reshape(-1)[me * 100000:(me + 1) * 100000].copy())
    exact = np.empty(g.numel(), np.float32)
    comm.Allreduce(g.numpy(), exact)
    magnitude = np.empty_like(exact)
    comm.Allreduce(np.abs(g.numpy()), magnitude)

    class Bucket:
        def buffer(self):
            return g

    state = kompress.torch.AllreduceHookState(comm, abs=1e-6)
    averaged = kompress.torch.allreduce_hook(state, Bucket()).wait()
    err = np.abs(averaged.numpy().astype(np.float64) - exact.astype(np.float64) / p)
    bound = state.last_report.absolute_bound + 2 * p * np.finfo(np.float32).eps * magnitude / p
    assert np.all(err <= bound)
