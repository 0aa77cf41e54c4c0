"""Small collectives from Python: mpi4py's plain call (the baseline) against kompress's one-shot
call and its persistent request in auto mode, interleaved in the same run, best of several
rounds; speedup = mpi4py's time / the call's (docs/performance.md, "Small collectives from
Python"). Not a test; run on 2 or more ranks:
    PYTHONPATH=build/python/python/package OMP_NUM_THREADS=1 \\
        mpirun.openmpi -n 2 python3 python/tests/bench_persistent.py
"""
import os
import time

import numpy as np
from mpi4py import MPI

import kompress
from conftest import load

comm = MPI.COMM_WORLD
p, me = comm.Get_size(), comm.Get_rank()
ROUNDS = 7
field = load("era5_t2m_uk_744x33x49.f32").reshape(-1)


def per_call(f, calls):
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        f()
    return comm.allreduce(time.perf_counter() - start, op=MPI.MAX) / calls


def cases(n):
    """(name, mpi4py call, kompress one-shot call, kompress persistent request) for n values per rank."""
    send = np.ascontiguousarray(field[me * 1000:me * 1000 + n * p])
    recv = np.empty(n * p, np.float32)
    part, whole = send[:n].copy(), np.empty(n, np.float32)
    yield ("allreduce", lambda: comm.Allreduce(part, whole),
           lambda: kompress.allreduce(part, whole, comm, mode="auto"),
           kompress.allreduce_init(part, whole, comm, mode="auto"))
    yield ("alltoall", lambda: comm.Alltoall(send, recv),
           lambda: kompress.alltoall(send, recv, comm, mode="auto"),
           kompress.alltoall_init(send, recv, comm, mode="auto"))
    yield ("allgather", lambda: comm.Allgather(part, recv),
           lambda: kompress.allgather(part, recv, comm, mode="auto"),
           kompress.allgather_init(part, recv, comm, mode="auto"))
    yield ("reduce_scatter", lambda: comm.Reduce_scatter_block(send, whole),
           lambda: kompress.reduce_scatter(send, whole, comm, mode="auto"),
           kompress.reduce_scatter_init(send, whole, comm, mode="auto"))


if me == 0:
    print(f"{p} ranks, {MPI.Get_library_version().splitlines()[0]}, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'default')}, load average {os.getloadavg()[0]:.2f}")
    print(f"{'op':15s} {'per rank':>9s} {'mpi4py us':>10s} {'one-shot us':>12s} {'speedup':>8s} "
          f"{'run() us':>9s} {'speedup':>8s} {'start+wait us':>14s} {'speedup':>8s}")
for n in (1024, 16384):
    for name, plain, one_shot, request in cases(n):
        calls = 2000 if n <= 1024 else 500
        best = {}
        for _ in range(ROUNDS):
            times = {
                "plain": per_call(plain, calls),
                "one-shot": per_call(one_shot, calls),
                "run": per_call(request.run, calls),
                "start+wait": per_call(lambda: (request.start(), request.wait()), calls),
            }
            for k, v in times.items():
                best[k] = min(best.get(k, v), v)
        request.close()
        if me == 0:
            b = best["plain"]
            print(f"{name:15s} {n * 4 // 1024:6d} KiB {b * 1e6:10.2f} {best['one-shot'] * 1e6:12.2f} "
                  f"{b / best['one-shot']:8.2f} {best['run'] * 1e6:9.2f} {b / best['run']:8.2f} "
                  f"{best['start+wait'] * 1e6:14.2f} {b / best['start+wait']:8.2f}")
