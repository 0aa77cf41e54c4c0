"""DistributedDataParallel with its gradient buckets averaged by kompress's compressed
allreduce instead of an exact one, over DDP's own process group (mpirun -n 2 python3
ddp_hook.py; under torchrun, init_process_group("gloo") alone)."""
import tempfile

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

import kompress.torch

comm = MPI.COMM_WORLD
store = comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None)
dist.init_process_group("gloo", init_method=f"file://{store}/store", rank=comm.rank, world_size=comm.size)

torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
state = kompress.torch.AllreduceHookState(rel=1e-3)   # DDP's process group; or (comm, ...): MPI
model.register_comm_hook(state, kompress.torch.allreduce_hook)

optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(256, 32), torch.randn(256, 1)
for step in range(5):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()                      # buckets go through kompress.torch.allreduce_hook
    optimizer.step()
if comm.rank == 0:
    print(f"loss {loss.item():.4f}; last bucket within {state.last_report.absolute_bound:.3g}")
dist.destroy_process_group()
