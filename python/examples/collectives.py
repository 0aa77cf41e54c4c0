"""alltoall and allreduce on an mpi4py communicator, compressed within a bound, and a
persistent allreduce for a loop (mpirun -n 2 python3 collectives.py)."""
import numpy as np
from mpi4py import MPI

import kompress

comm = MPI.COMM_WORLD
p, me = comm.Get_size(), comm.Get_rank()
send = np.sin(np.linspace(0, 20, 4096 * p) + me).astype(np.float32)

recv = np.empty_like(send)
report = kompress.alltoall(send, recv, comm, rel=1e-3)   # like comm.Alltoall(send, recv)
exact = np.empty_like(send)
comm.Alltoall(send, exact)
assert np.all(np.abs(recv.astype(np.float64) - exact) <= report.absolute_bound)

total = np.empty_like(send)
request = kompress.iallreduce(send, total, comm, abs=1e-4)   # nonblocking: a Request
report = request.wait()                                       # total holds the sum now
exact = np.empty_like(send)
comm.Allreduce(send, exact)
assert np.all(np.abs(total.astype(np.float64) - exact) <= report.absolute_bound)
if me == 0:
    print(f"allreduce: {report.ratio:.1f}x fewer bytes, within {report.absolute_bound:.3g}")

# In a loop, set the collective up once: each round sums what `grad` holds when it starts.
grad, grad_sum = np.zeros(1024, np.float32), np.empty(1024, np.float32)
with kompress.allreduce_init(grad, grad_sum, comm, mode="auto") as step:   # collective, checked once
    for i in range(3):
        grad[:] = np.cos(np.arange(1024) * 0.01 + i + me)
        report = step.run()                      # or step.start() ... step.wait()
        assert np.allclose(grad_sum, sum(np.cos(np.arange(1024) * 0.01 + i + r) for r in range(p)), atol=1e-5)
