"""Persistent collectives (kompress.*_init) on an mpi4py communicator, run under mpirun -n 1, 2
and 4. Every round is checked element by element against mpi4py's own result on the values
``send`` held when the round started. The rounds use start()+wait(), start()+test() and run()."""
import gc

import numpy as np
import pytest
import torch
from mpi4py import MPI

import kompress
from conftest import assert_same_on_every_rank, assert_within, load_array, repeat_rows

comm = MPI.COMM_WORLD
p, me = comm.Get_size(), comm.Get_rank()
OPTIONS = [{"mode": "raw"}, {"abs": 1e-3}, {"rel": 1e-3}, {"mode": "auto", "rel": 1e-3}]


def field(n, dtype, seed):
    """Rank- and round-dependent slices of a real field."""
    x = repeat_rows(load_array("era5_t2m_uk").reshape(-1).astype(dtype), n + 1)
    start = (seed * 7919 + me * 104729) % (x.size - n)
    return np.ascontiguousarray(x[start:start + n])


def run_round(request, k):
    """Round k the three ways a round can run; returns its Report."""
    if k % 3 == 0:
        request.start()
        assert request.active
        report = request.wait()
    elif k % 3 == 1:
        request.start()
        while not request.test():
            pass
        report = request.report
    else:
        report = request.run()
    assert not request.active
    return report


def check_sum(recv, expected, magnitude, bound, dtype):
    """The bound plus the rounding of two summation orders (tests/comm/allreduce.cpp), and the same
    bytes on every rank."""
    eps = np.finfo(dtype).eps
    err = np.abs(recv.astype(np.float64) - expected.astype(np.float64))
    assert np.all(err <= bound + 2.0 * p * eps * (magnitude.astype(np.float64) + bound))
    assert_same_on_every_rank(comm, recv)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1001, 60000])
@pytest.mark.parametrize("options", OPTIONS)
def test_alltoall_init_matches_mpi4py(dtype, n, options):
    send = np.zeros(n * p, dtype)
    recv = np.empty_like(send)
    with kompress.alltoall_init(send, recv, comm, **options) as request:
        for k in range(4):
            send[:] = field(n * p, dtype, 10 + k)  # the round reads what send holds when it starts
            expected = np.empty_like(send)
            comm.Alltoall(send, expected)
            recv.fill(np.nan)
            report = run_round(request, k)
            if options.get("mode") == "raw" or (options.get("mode") == "auto" and report.compressed_messages == 0):
                assert np.array_equal(recv, expected)
            else:
                assert_within(expected, recv, report.absolute_bound)
    assert request.closed


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_alltoallv_init_matches_mpi4py(dtype):
    # Rank r sends (r + 2 * q) % 5 * 700 values to rank q: zero counts included.
    counts = [(me + 2 * q) % 5 * 700 for q in range(p)]
    recv_counts = [(q + 2 * me) % 5 * 700 for q in range(p)]
    displs = [int(d) for d in np.cumsum([0] + counts[:-1])]
    recv_displs = [int(d) for d in np.cumsum([0] + recv_counts[:-1])]
    send = np.zeros(sum(counts), dtype)
    recv = np.empty(sum(recv_counts), dtype)
    mpi_type = MPI.DOUBLE if dtype == np.float64 else MPI.FLOAT
    for options in OPTIONS[:2]:
        request = kompress.alltoallv_init(send, counts, displs, recv, recv_counts, recv_displs, comm, **options)
        for k in range(3):
            send[:] = field(send.size, dtype, 20 + k)
            expected = np.empty_like(recv)
            comm.Alltoallv([send, counts, displs, mpi_type], [expected, recv_counts, recv_displs, mpi_type])
            recv.fill(np.nan)
            report = run_round(request, k)
            assert_within(expected, recv, report.absolute_bound)
        request.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1001, 60000])
@pytest.mark.parametrize("options", OPTIONS + [{"abs": 1e-3, "reduction": "homomorphic"},
                                               {"rel": 1e-3, "reduction_bound": "total"}])
def test_allreduce_init_matches_mpi4py(dtype, n, options):
    send = np.zeros(n, dtype)
    recv = np.empty_like(send)
    in_place = np.zeros(n, dtype)
    with kompress.allreduce_init(send, recv, comm, **options) as request, \
            kompress.allreduce_init(in_place, in_place, comm, **options) as in_place_request:
        for k in range(3):
            send[:] = field(n, dtype, 30 + k)
            expected, magnitude = np.empty_like(send), np.empty_like(send)
            comm.Allreduce(send, expected)
            comm.Allreduce(np.abs(send), magnitude)
            recv.fill(np.nan)
            check_sum(recv, expected, magnitude, run_round(request, k).absolute_bound, dtype)
            in_place[:] = send
            report = run_round(in_place_request, k + 1)
            check_sum(in_place, expected, magnitude, report.absolute_bound, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1001, 60000])
@pytest.mark.parametrize("options", OPTIONS)
def test_allgather_init_matches_mpi4py(dtype, n, options):
    send = np.zeros(n, dtype)
    recv = np.empty(n * p, dtype)
    with kompress.allgather_init(send, recv, comm, measure_error=True, **options) as request:
        for k in range(3):
            send[:] = field(n, dtype, 40 + k)
            expected = np.empty_like(recv)
            comm.Allgather(send, expected)
            recv.fill(np.nan)
            report = run_round(request, k)
            if options.get("mode") == "raw":
                assert np.array_equal(recv, expected)
            else:
                assert_within(expected, recv, report.absolute_bound)
            assert 0 <= report.max_error <= report.absolute_bound
            assert_same_on_every_rank(comm, recv)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1001, 60000])
@pytest.mark.parametrize("options", OPTIONS + [{"abs": 1e-3, "reduction": "homomorphic"}])
def test_reduce_scatter_init_matches_mpi4py(dtype, n, options):
    send = np.zeros(n * p, dtype)
    recv = np.empty(n, dtype)
    with kompress.reduce_scatter_init(send, recv, comm, **options) as request:
        for k in range(3):
            send[:] = field(n * p, dtype, 50 + k)
            expected, magnitude = np.empty_like(recv), np.empty_like(recv)
            comm.Reduce_scatter_block(send, expected)
            comm.Reduce_scatter_block(np.abs(send), magnitude)
            recv.fill(np.nan)
            report = run_round(request, k)
            eps = np.finfo(dtype).eps
            err = np.abs(recv.astype(np.float64) - expected.astype(np.float64))
            bound = report.absolute_bound
            assert np.all(err <= bound + 2.0 * p * eps * (magnitude.astype(np.float64) + bound))


def test_torch_tensors_updated_in_place_between_rounds():
    grad = torch.zeros(30000, dtype=torch.float32)
    with kompress.allreduce_init(grad, grad, comm, rel=1e-3, reduction_bound="total") as request:
        for k in range(3):
            values = field(grad.numel(), np.float32, 60 + k)
            grad.copy_(torch.from_numpy(values))
            expected, magnitude = np.empty_like(values), np.empty_like(values)
            comm.Allreduce(values, expected)
            comm.Allreduce(np.abs(values), magnitude)
            check_sum(grad.numpy(), expected, magnitude, run_round(request, k).absolute_bound, np.float32)


def test_the_request_keeps_its_arrays_alive():
    out = np.empty(1000, np.float64)
    request = kompress.allreduce_init(np.full(1000, 1.5), out, comm, mode="raw")  # the only reference
    gc.collect()
    for k in range(3):
        out.fill(np.nan)
        run_round(request, k)
        assert np.all(out == 1.5 * p)
    request.close()
    request.close()  # closing twice is harmless


def test_misuse_is_a_clear_error():
    send, recv = np.ones(100, np.float32), np.empty(100 * p, np.float32)
    request = kompress.allgather_init(send, recv, comm, mode="raw")
    with pytest.raises(kompress.InvalidArgument, match="never started"):
        request.wait()
    request.start()
    with pytest.raises(kompress.InvalidArgument, match="active"):
        request.start()
    with pytest.raises(kompress.InvalidArgument, match="active"):
        request.run()
    request.wait()
    assert np.all(recv == 1.0)
    request.close()
    for call in (request.start, request.wait, request.test, request.run, lambda: request.report):
        with pytest.raises(kompress.InvalidArgument, match="closed"):
            call()
    assert not request.active and request.closed


@pytest.mark.skipif(p == 1, reason="needs two ranks to disagree")
def test_mismatched_init_fails_on_every_rank_and_the_communicator_stays_usable():
    n = 1000 + (me == p - 1)  # the last rank passes one more element
    with pytest.raises(kompress.InvalidArgument, match="disagree"):
        kompress.allreduce_init(np.ones(n, np.float32), np.empty(n, np.float32), comm, abs=1e-3)
    bound = -1.0 if me == 0 else 1e-3  # one rank's own check fails: every rank throws
    with pytest.raises(kompress.InvalidArgument, match="rank 0|bound"):
        kompress.reduce_scatter_init(np.ones(10 * p), np.empty(10), comm, abs=bound)
    out = np.empty(10)
    with kompress.allreduce_init(np.ones(10), out, comm, mode="raw") as request:
        request.run()
    assert np.all(out == p)


def test_one_shot_and_persistent_calls_interleave():
    a = field(5000, np.float32, 70)
    out_persistent, out_one_shot = np.empty_like(a), np.empty_like(a)
    with kompress.allreduce_init(a, out_persistent, comm, abs=1e-3) as request:
        request.start()
        kompress.allreduce(a, out_one_shot, comm, abs=1e-3)  # while the round is active
        request.wait()
    expected, magnitude = np.empty_like(a), np.empty_like(a)
    comm.Allreduce(a, expected)
    comm.Allreduce(np.abs(a), magnitude)
    for out in (out_persistent, out_one_shot):
        check_sum(out, expected, magnitude, p * 1e-3, np.float32)
