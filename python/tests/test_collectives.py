"""The collectives on an mpi4py communicator (run under mpirun -n 1, 2, 4), element by element
against mpi4py's own uncompressed results."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

import kompress
from conftest import assert_same_on_every_rank, assert_within, load_array, repeat_rows

comm = MPI.COMM_WORLD
p, me = comm.Get_size(), comm.Get_rank()
# Every test runs at every rank count, 1 included (a one-rank collective is a local copy).
several = pytest.mark.usefixtures()


@pytest.mark.skipif(p != 1, reason="one rank only")
def test_one_rank_is_a_local_copy():
    a = np.arange(8, dtype=np.float32)
    for call in (lambda out: kompress.alltoall(a, out, comm), lambda out: kompress.ialltoall(a, out, comm).wait(),
                 lambda out: kompress.alltoallv(a, [8], [0], out, [8], [0], comm),
                 lambda out: kompress.allreduce(a, out, comm), lambda out: kompress.iallreduce(a, out, comm).wait(),
                 lambda out: kompress.allgather(a, out, comm), lambda out: kompress.ireduce_scatter(a, out, comm).wait(),
                 lambda out: kompress.reduce_scatter(a, out, comm, reduction="homomorphic")):
        out = np.full_like(a, np.nan)
        call(out)
        assert np.array_equal(out, a)


def field(n, dtype, seed):
    """Rank-dependent slices of a real field (smooth, so compression pays)."""
    x = repeat_rows(load_array("era5_t2m_uk").reshape(-1).astype(dtype), n + 1)
    start = (seed * 7919 + me * 104729) % (x.size - n)
    return np.ascontiguousarray(x[start:start + n])


@several
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("block", [0, 1, 1000, 20000])
@pytest.mark.parametrize("options", [{"rel": 1e-3}, {"abs": 1e-2}, {"mode": "raw"}, {"mode": "auto", "rel": 1e-3}])
def test_alltoall_matches_mpi4py(dtype, block, options):
    send = field(block * p, dtype, 1)
    expected = np.empty_like(send)
    comm.Alltoall(send, expected)
    recv = np.full_like(send, np.nan)
    report = kompress.alltoall(send, recv, comm, **options)
    if options.get("mode") == "raw":
        assert np.array_equal(recv, expected) and report.compressed_messages == 0
    else:
        assert_within(expected, recv, report.absolute_bound)
    assert report.messages == (p - 1 if block else report.messages)


@several

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ialltoall_and_torch_tensors(dtype):
    send = field(5000 * p, dtype, 2)
    expected = np.empty_like(send)
    comm.Alltoall(send, expected)
    recv = torch.zeros(send.size, dtype=torch.float32 if dtype == np.float32 else torch.float64)
    request = kompress.ialltoall(torch.from_numpy(send), recv, comm, rel=1e-4, measure_error=True)
    while not request.test():
        pass
    report = request.wait()
    # max_error is measured on what this rank sent (its own bound); absolute_bound covers what
    # it received.
    assert report.max_error >= 0
    assert_within(expected, recv.numpy(), report.absolute_bound)


@several

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_alltoallv_matches_mpi4py(dtype):
    # Rank r sends (r + 2 * q) % 5 * 700 values to rank q: zero counts included.
    send_counts = [(me + 2 * q) % 5 * 700 for q in range(p)]
    recv_counts = [(q + 2 * me) % 5 * 700 for q in range(p)]
    send_displs = list(np.concatenate([[0], np.cumsum(send_counts)[:-1]]).astype(int))
    recv_displs = list(np.concatenate([[0], np.cumsum(recv_counts)[:-1]]).astype(int))
    send = field(sum(send_counts), dtype, 3)
    expected = np.empty(sum(recv_counts), dtype)
    comm.Alltoallv([send, send_counts, send_displs, MPI.DOUBLE if dtype == np.float64 else MPI.FLOAT],
                   [expected, recv_counts, recv_displs, MPI.DOUBLE if dtype == np.float64 else MPI.FLOAT])
    for request in (False, True):
        recv = np.full_like(expected, np.nan)
        if request:
            report = kompress.ialltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, comm,
                                         rel=1e-3).wait()
        else:
            report = kompress.alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, comm,
                                        rel=1e-3)
        assert_within(expected, recv, report.absolute_bound)


@several
@pytest.mark.parametrize("window", [1, 2])
def test_alltoall_and_alltoallv_in_a_window_of_peers(window):
    send = field(3000 * p, np.float32, 4)
    expected = np.empty_like(send)
    comm.Alltoall(send, expected)
    for call in (kompress.alltoall, lambda *a, **k: kompress.ialltoall(*a, **k).wait()):
        recv = np.full_like(send, np.nan)
        report = call(send, recv, comm, rel=1e-3, window=window)
        assert_within(expected, recv, report.absolute_bound)
    counts, displs = [3000] * p, [3000 * q for q in range(p)]
    recv = np.full_like(send, np.nan)
    report = kompress.alltoallv(send, counts, displs, recv, counts, displs, comm, rel=1e-3, window=window)
    assert_within(expected, recv, report.absolute_bound)


@several
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 1001, 60000])
@pytest.mark.parametrize("options", [{"abs": 1e-3}, {"rel": 1e-3, "reduction_bound": "total"}, {"mode": "raw"}])
def test_allreduce_matches_mpi4py(dtype, n, options):
    send = field(n, dtype, 4)
    expected = np.empty_like(send)
    comm.Allreduce(send, expected)
    magnitude = np.empty_like(send)
    comm.Allreduce(np.abs(send), magnitude)
    for variant in ("blocking", "in place", "nonblocking"):
        if variant == "in place":
            recv = send.copy()
            report = kompress.allreduce(recv, recv, comm, **options)
        elif variant == "nonblocking":
            recv = np.full_like(send, np.nan)
            report = kompress.iallreduce(send, recv, comm, **options).wait()
        else:
            recv = np.full_like(send, np.nan)
            report = kompress.allreduce(send, recv, comm, **options)
        # The report's bound, plus the rounding of two summation orders (tests/comm/allreduce.cpp).
        eps = np.finfo(dtype).eps
        err = np.abs(recv.astype(np.float64) - expected.astype(np.float64))
        assert np.all(err <= report.absolute_bound + 2.0 * p * eps * magnitude.astype(np.float64)), variant
        assert_same_on_every_rank(comm, recv)


@several
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 1001, 60000])
@pytest.mark.parametrize("options", [{"abs": 1e-3}, {"rel": 1e-3}, {"mode": "raw"}])
def test_allgather_matches_mpi4py(dtype, n, options):
    send = field(n, dtype, 7)
    expected = np.empty(n * p, dtype)
    comm.Allgather(send, expected)
    for nonblocking in (False, True):
        recv = np.full_like(expected, np.nan)
        if nonblocking:
            report = kompress.iallgather(send, recv, comm, measure_error=True, **options).wait()
        else:
            report = kompress.allgather(send, recv, comm, measure_error=True, **options)
        if options.get("mode") == "raw":
            assert np.array_equal(recv, expected)
        else:
            assert_within(expected, recv, report.absolute_bound)
        assert 0 <= report.max_error <= report.absolute_bound
        assert_same_on_every_rank(comm, recv)


@several
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 1001, 60000])
@pytest.mark.parametrize("options", [{"abs": 1e-3}, {"rel": 1e-3, "reduction_bound": "total"},
                                     {"abs": 1e-3, "reduction": "homomorphic"},
                                     {"rel": 1e-3, "reduction": "homomorphic", "reduction_bound": "total"},
                                     {"mode": "raw"}])
def test_reduce_scatter_matches_mpi4py(dtype, n, options):
    send = field(n * p, dtype, 8)
    expected = np.empty(n, dtype)
    comm.Reduce_scatter_block(send, expected)
    magnitude = np.empty(n, dtype)
    comm.Reduce_scatter_block(np.abs(send), magnitude)
    for nonblocking in (False, True):
        recv = np.full_like(expected, np.nan)
        if nonblocking:
            report = kompress.ireduce_scatter(send, recv, comm, **options).wait()
        else:
            report = kompress.reduce_scatter(send, recv, comm, **options)
        terms = p if options.get("reduction") == "homomorphic" else p - 1
        if "abs" in options and p > 1 and n > 0:
            assert report.absolute_bound <= terms * options["abs"] * (1 + 1e-12)
        # The bound plus the rounding of two summation orders (tests/comm/homomorphic_checks.hpp).
        eps = np.finfo(dtype).eps
        err = np.abs(recv.astype(np.float64) - expected.astype(np.float64))
        slack = 2.0 * p * eps * (magnitude.astype(np.float64) + report.absolute_bound)
        assert np.all(err <= report.absolute_bound + slack), nonblocking


@several
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_homomorphic_allreduce_matches_mpi4py(dtype):
    send = field(60000, dtype, 9)
    expected = np.empty_like(send)
    comm.Allreduce(send, expected)
    magnitude = np.empty_like(send)
    comm.Allreduce(np.abs(send), magnitude)
    recv = np.full_like(send, np.nan)
    report = kompress.iallreduce(send, recv, comm, abs=1e-3, reduction="homomorphic", measure_error=True).wait()
    if p > 1:
        assert report.absolute_bound <= p * 1e-3 * (1 + 1e-12) and 0 < report.max_error <= 1e-3
    eps = np.finfo(dtype).eps
    err = np.abs(recv.astype(np.float64) - expected.astype(np.float64))
    assert np.all(err <= report.absolute_bound + 2.0 * p * eps * (magnitude.astype(np.float64) + report.absolute_bound))
    assert_same_on_every_rank(comm, recv)
    with pytest.raises(kompress.InvalidArgument, match="reduction must be"):
        kompress.allreduce(send, recv, comm, reduction="exact")


def test_allreduce_schedules_match_mpi4py():
    # Both schedules (the ring; recursive halving and doubling, with ranks folded in where p is
    # no power of two) within the same bound, identical on every rank; persistent rounds too.
    send = field(50001, np.float32, 11)
    expected = np.empty_like(send)
    comm.Allreduce(send, expected)
    magnitude = np.empty_like(send)
    comm.Allreduce(np.abs(send), magnitude)
    eps = np.finfo(np.float32).eps
    for schedule in ("ring", "halving_doubling", "auto"):
        recv = np.full_like(send, np.nan)
        report = kompress.allreduce(send, recv, comm, abs=1e-3, schedule=schedule)
        assert report.absolute_bound <= max(p, 1) * 1e-3 * (1 + 1e-12), schedule
        err = np.abs(recv.astype(np.float64) - expected.astype(np.float64))
        assert np.all(err <= report.absolute_bound + 2.0 * p * eps * magnitude.astype(np.float64)), schedule
        assert_same_on_every_rank(comm, recv)
    persistent = np.full_like(send, np.nan)
    with kompress.allreduce_init(send, persistent, comm, abs=1e-3, schedule="halving_doubling") as request:
        for _ in range(2):
            request.start()
            report = request.wait()
            err = np.abs(persistent.astype(np.float64) - expected.astype(np.float64))
            assert np.all(err <= report.absolute_bound + 2.0 * p * eps * magnitude.astype(np.float64))
            assert_same_on_every_rank(comm, persistent)
    with pytest.raises(kompress.InvalidArgument, match="schedule must be"):
        kompress.allreduce(send, recv, comm, schedule="tree")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 1001, 60000])
@pytest.mark.parametrize("ranks_per_node", [None, 1, 2])
def test_hierarchical_allreduce_matches_mpi4py(dtype, n, ranks_per_node):
    # Over NodeGroups (shared memory, or runs of 1 or 2 ranks): raw within a node, compressed
    # across nodes; within nodes times the bound (p times where the groups make it the flat
    # allreduce), identical on every rank; numpy arrays and a torch tensor in place.
    groups = kompress.NodeGroups(comm, ranks_per_node)
    assert groups.comm is comm and groups.nodes >= 1 and groups.ranks_per_node >= 1
    compressions = groups.nodes if groups.uniform and groups.ranks_per_node > 1 else p
    send = field(n, dtype, 5)
    expected, magnitude = np.empty_like(send), np.empty_like(send)
    comm.Allreduce(send, expected)
    comm.Allreduce(np.abs(send), magnitude)
    eps = np.finfo(dtype).eps
    recv = np.full_like(send, np.nan)
    in_place = torch.from_numpy(send.copy())
    for got, report in ((recv, kompress.allreduce(send, recv, groups, abs=1e-3)),
                        (in_place.numpy(), kompress.allreduce(in_place, in_place, groups, abs=1e-3))):
        assert report.absolute_bound <= compressions * 1e-3 * (1 + 1e-12)
        err = np.abs(got.astype(np.float64) - expected.astype(np.float64))
        assert np.all(err <= report.absolute_bound + 2.0 * p * eps * magnitude.astype(np.float64))
        assert_same_on_every_rank(comm, got)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", [0, 1, 20011])
@pytest.mark.parametrize("ranks_per_node", [None, 1, 2])
def test_hierarchical_reduce_scatter_and_allgather_match_mpi4py(dtype, m, ranks_per_node):
    # Over NodeGroups: raw within a node, compressed across nodes; reduce_scatter within q - 1
    # times the bound on the ring (p - 1 where the groups make it the flat one), allgather within
    # the bound, identical on every rank, every block where its owner is.
    groups = kompress.NodeGroups(comm, ranks_per_node)
    ranks_across = groups.nodes if groups.uniform and groups.ranks_per_node > 1 else p
    eps = np.finfo(dtype).eps
    send = field(m * p, dtype, 3 + comm.Get_rank())
    expected, magnitude = np.empty(m, dtype), np.empty(m, dtype)
    comm.Reduce_scatter_block(send, expected)
    comm.Reduce_scatter_block(np.abs(send), magnitude)
    got = np.full(m, np.nan, dtype)
    report = kompress.reduce_scatter(send, got, groups, abs=1e-3, schedule="ring")
    assert report.absolute_bound <= (ranks_across - 1) * 1e-3 * (1 + 1e-12)
    err = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    assert np.all(err <= report.absolute_bound + 2.0 * p * eps * magnitude.astype(np.float64))

    mine = field(m, dtype, 7 + comm.Get_rank())
    everyone = np.empty(m * p, dtype)
    comm.Allgather(mine, everyone)
    gathered = torch.full((m * p,), float("nan"), dtype=torch.float32 if dtype == np.float32 else torch.float64)
    report = kompress.allgather(mine, gathered, groups, rel=1e-2)
    err = np.abs(gathered.numpy().astype(np.float64) - everyone.astype(np.float64))
    assert np.all(err <= report.absolute_bound)
    if m > 0:
        assert (report.absolute_bound > 0) == (ranks_across > 1)
    assert_same_on_every_rank(comm, gathered.numpy())
    # The scratch stays with the groups where they run phases.
    if groups.uniform and groups.ranks_per_node > 1 and m > 0:
        assert groups.workspace_bytes > 0


def test_node_groups_reject_bad_arguments_on_every_rank():
    with pytest.raises(kompress.InvalidArgument, match="at least 1"):
        kompress.NodeGroups(comm, 0)
    with pytest.raises(kompress.InvalidArgument, match="an int or None"):
        kompress.NodeGroups(comm, 1.5)
    groups = kompress.NodeGroups(comm, 2)
    a = np.ones(10, np.float32)
    with pytest.raises(kompress.InvalidArgument, match="blocking allreduce, reduce_scatter and allgather only"):
        kompress.iallreduce(a, a, groups)
    with pytest.raises(kompress.InvalidArgument, match="blocking allreduce, reduce_scatter and allgather only"):
        kompress.iallgather(a, np.empty(10 * p, np.float32), groups)
    # The next call works.
    kompress.allreduce(a, a, groups, abs=1e-3)
    assert np.all(np.abs(a - p) <= groups.nodes * 1e-3 + 1e-5)


def test_allgather_and_reduce_scatter_schedules_match_mpi4py():
    # Both schedules (the ring; recursive doubling for allgather, halving for reduce_scatter)
    # within their bounds: allgather's identical on every rank; persistent rounds too.
    n = 20001
    send = field(n, np.float32, 12)
    gathered = np.empty(n * p, np.float32)
    comm.Allgather(send, gathered)
    summands = field(n * p, np.float32, 13)
    summed, magnitude = np.empty(n, np.float32), np.empty(n, np.float32)
    comm.Reduce_scatter_block(summands, summed)
    comm.Reduce_scatter_block(np.abs(summands), magnitude)
    eps = np.finfo(np.float32).eps
    power_of_two = p & (p - 1) == 0
    for schedule in ("ring", "halving_doubling", "auto"):
        recv = np.full_like(gathered, np.nan)
        report = kompress.allgather(send, recv, comm, abs=1e-3, schedule=schedule)
        assert report.absolute_bound <= 1e-3 * (1 + 1e-12), schedule
        assert_within(gathered, recv, report.absolute_bound)
        assert_same_on_every_rank(comm, recv)
        recv = np.full_like(summed, np.nan)
        report = kompress.reduce_scatter(summands, recv, comm, abs=1e-3, schedule=schedule)
        terms = p - 1 if power_of_two or schedule == "ring" else p
        assert report.absolute_bound <= max(terms, 0) * 1e-3 * (1 + 1e-12), schedule
        err = np.abs(recv.astype(np.float64) - summed.astype(np.float64))
        assert np.all(err <= report.absolute_bound + 2.0 * p * eps * magnitude.astype(np.float64)), schedule
    persistent = np.full_like(gathered, np.nan)
    with kompress.allgather_init(send, persistent, comm, abs=1e-3, schedule="halving_doubling") as request:
        for _ in range(2):
            request.start()
            assert_within(gathered, persistent, request.wait().absolute_bound)
            assert_same_on_every_rank(comm, persistent)
    persistent = np.full_like(summed, np.nan)
    with kompress.reduce_scatter_init(summands, persistent, comm, abs=1e-3, schedule="halving_doubling") as request:
        for _ in range(2):
            request.start()
            report = request.wait()
            err = np.abs(persistent.astype(np.float64) - summed.astype(np.float64))
            assert np.all(err <= report.absolute_bound + 2.0 * p * eps * magnitude.astype(np.float64))
    with pytest.raises(kompress.InvalidArgument, match="schedule must be"):
        kompress.allgather(send, gathered.copy(), comm, schedule="tree")


@several

def test_report_is_a_small_object():
    send = field(20000 * p, np.float32, 5)
    recv = np.empty_like(send)
    r = kompress.alltoall(send, recv, comm, rel=1e-3)
    assert r.payload_bytes == (p - 1) * 20000 * 4
    if p > 1:
        assert r.compressed_messages == p - 1 and r.wire_bytes < r.payload_bytes and r.ratio > 1
    assert "Report(" in repr(r)


@several

def test_measured_cost_model_drives_auto_mode():
    model = kompress.measure_cost_model(comm, probe_bytes=1 << 16)
    assert model.link_bytes_per_second > 0 and model.compress_bytes_per_second > 0
    assert 0 <= model.compress_call_seconds < 1 and 0 <= model.decompress_call_seconds < 1
    send = field(1000 * p, np.float32, 6)
    recv = np.empty_like(send)
    kompress.alltoall(send, recv, comm, mode="auto", cost=model, rel=1e-3)


def test_cost_model_ratio_decides_auto_mode():
    # 1 MiB over a 2.4 Gb/s link and a codec at 0.6 GB/s: at the default expected ratio of 2
    # compressing does not win by the model's margin; data known to compress 30x does.
    model = kompress.CostModel()
    assert model.expected_ratio == 2.0 and model.latency_seconds > 0
    assert model.compress_call_seconds == 0 and model.decompress_call_seconds == 0
    model.link_bytes_per_second = 3e8
    model.compress_bytes_per_second = 0.6e9
    assert not model.worth_compressing(1 << 20)
    model.expected_ratio = 30.0
    assert model.worth_compressing(1 << 20)
    # A stream compressed once and sent to several ranks (allgather) pays sooner.
    model.expected_ratio = 2.0
    assert not model.worth_compressing_forwarded(1 << 20, 1)
    model.compress_bytes_per_second = 0.3e9
    model.expected_ratio = 10.0
    assert not model.worth_compressing(1 << 20)
    assert model.worth_compressing_forwarded(1 << 20, 63)
    # A codec call's fixed cost (a GPU's launches) weighs on every message: 50 ms each way
    # makes even data that compresses 30x not worth it.
    model.expected_ratio = 30.0
    model.compress_bytes_per_second = 0.6e9
    assert model.worth_compressing(1 << 20)
    model.compress_call_seconds = model.decompress_call_seconds = 50e-3
    assert not model.worth_compressing(1 << 20)
    # Receivers that decode what arrives together in one call each pay a share of it.
    model.compress_call_seconds = 0.0
    assert not model.worth_compressing_forwarded(1 << 20, 63)
    assert model.worth_compressing_forwarded(1 << 20, 63, decode_share=1e-3)
