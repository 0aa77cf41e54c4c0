"""The DLRM embedding all-to-all as an autograd module: pooled embeddings of this rank's
tables in, this rank's batch slice of every table out; the gradients go back compressed
(mpirun -n 2 python3 dlrm_exchange.py)."""
import torch
from mpi4py import MPI

import kompress.torch

comm = MPI.COMM_WORLD
p, me = comm.Get_size(), comm.Get_rank()
tables = [(t % p, 16) for t in range(5)]            # (owner rank, dim), the same on every rank
local_batch = 64
a2a = kompress.torch.EmbeddingAllToAll(tables, local_batch, comm, forward_rel=1e-2, backward_rel=1e-3)

local_width = sum(dim for owner, dim in tables if owner == me)
pooled = torch.randn(local_batch * p, local_width, requires_grad=True)   # [global batch x local width]
out = a2a(pooled)                                                         # [local batch x total width]
out.square().sum().backward()                                             # gradients back, compressed
assert pooled.grad.shape == pooled.shape
if me == 0:
    print(f"forward {a2a.last_reports['forward'].ratio:.1f}x, "
          f"backward within {a2a.last_reports['backward'].absolute_bound:.3g}")
