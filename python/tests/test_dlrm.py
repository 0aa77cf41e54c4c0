"""The DLRM embedding exchange from Python (mpirun -n 2, 4): the plain exchange against the
layout docs/dlrm.md describes, on the real pooled embeddings and gradients of
../shared/data/dlrm_flights_*, and the autograd module's forward and backward."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

import kompress
import kompress.torch
from conftest import assert_within, load_array, repeat_rows

comm = MPI.COMM_WORLD
p, me = comm.Get_size(), comm.Get_rank()
local_batch = 48
fwd = repeat_rows(load_array("dlrm_flights_lookup_fwd"), p * local_batch)[: p * local_batch]  # [batch, table, dim]
grad = repeat_rows(load_array("dlrm_flights_lookup_grad"), p * local_batch)[: p * local_batch]
dims = [128, 64, 128, 32, 128, 128, 16, 128, 96, 128]   # the real tables' first columns
tables = [(t % p, d) for t, d in enumerate(dims)]
mine = [t for t in range(len(dims)) if t % p == me]


def all_tables(x, rows):
    """[rows x total width]: every table's columns side by side."""
    return np.concatenate([x[rows, t, :d] for t, d in enumerate(dims)], axis=1)


def my_tables(x):
    """[global batch x local width]: this rank's tables' columns, whole batch."""
    return np.ascontiguousarray(np.concatenate([x[:, t, :dims[t]] for t in mine], axis=1))


my_rows = slice(me * local_batch, (me + 1) * local_batch)


@pytest.mark.parametrize("window", [0, 1])
def test_forward_and_backward_within_the_bound(window):
    ex = kompress.EmbeddingExchange(tables, local_batch, comm, forward_rel=1e-2, backward_abs=1e-5, window=window)
    assert (ex.global_batch, ex.total_width) == (p * local_batch, sum(dims))
    out = np.full((local_batch, ex.total_width), np.nan, np.float32)
    report = ex.forward(my_tables(fwd), out)
    if p > 1:   # one rank sends nothing: its own block is a local copy
        assert report.compressed_messages > 0 and report.wire_bytes < report.payload_bytes
    assert_within(all_tables(fwd, my_rows), out, report.absolute_bound)
    back = np.full((ex.global_batch, ex.local_width), np.nan, np.float32)
    report = ex.backward(np.ascontiguousarray(all_tables(grad, my_rows)), back)
    assert report.absolute_bound <= 1e-5
    assert_within(my_tables(grad), back, report.absolute_bound)
    # Nonblocking, float64.
    out64 = np.empty((local_batch, ex.total_width))
    r = ex.iforward(my_tables(fwd).astype(np.float64), out64)
    assert_within(all_tables(fwd, my_rows), out64, r.wait().absolute_bound)
    assert ex.iteration == 2


def test_per_table_weights_and_iteration_schedule():
    calls = []

    def schedule(iteration, table, direction):
        calls.append((iteration, table, direction))
        return 0.0 if table == 0 else 2.0   # table 0 lossless

    ex = kompress.EmbeddingExchange(tables, local_batch, comm, forward_rel=1e-2, table_weights=[1.0] * 9 + [0.0],
                                    bound_schedule=schedule)
    out = np.empty((local_batch, ex.total_width), np.float32)
    ex.forward(my_tables(fwd), out)
    expected = all_tables(fwd, my_rows)
    assert np.array_equal(out[:, :dims[0]], expected[:, :dims[0]])            # schedule 0
    assert np.array_equal(out[:, -dims[9]:], expected[:, -dims[9]:])          # weight 0
    assert calls and all(d == "forward" for _, _, d in calls)


def test_autograd_module_forward_and_compressed_backward():
    module = kompress.torch.EmbeddingAllToAll(tables, local_batch, comm, forward_rel=1e-2, backward_rel=1e-3)
    pooled = torch.from_numpy(my_tables(fwd)).requires_grad_()
    out = module(pooled)
    assert out.shape == (local_batch, sum(dims)) and out.requires_grad
    assert_within(all_tables(fwd, my_rows), out.detach().numpy(), module.last_reports["forward"].absolute_bound)
    upstream = torch.from_numpy(np.ascontiguousarray(all_tables(grad, my_rows)))
    (out * upstream).sum().backward()
    assert_within(my_tables(grad), pooled.grad.numpy(), module.last_reports["backward"].absolute_bound)
    assert module.last_reports["backward"].compressed_messages > 0 or p == 1


def test_bad_shapes_fail_on_every_rank():
    ex = kompress.EmbeddingExchange(tables, local_batch, comm)
    rows = ex.global_batch - (1 if me == 0 else 0)   # wrong on rank 0 only
    with pytest.raises(kompress.InvalidArgument):
        ex.forward(np.zeros((rows, ex.local_width), np.float32), np.zeros((local_batch, ex.total_width), np.float32))
    with pytest.raises(kompress.InvalidArgument, match="owned by rank"):
        kompress.EmbeddingExchange([(p, 4)], local_batch, comm)
