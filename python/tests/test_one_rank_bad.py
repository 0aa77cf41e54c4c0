"""One rank passes a bad argument, the others good ones (run under mpirun -n 2, 3, 4): every rank
raises (the bad one its own error, the others InvalidArgument naming it), and the next call
works on every rank. Covers every argument the bindings check before the C++ call's agreement,
for every collective, the persistent inits, measure_cost_model and the DLRM exchange."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

import kompress
from conftest import assert_within

comm = MPI.COMM_WORLD
p, me = comm.Get_size(), comm.Get_rank()
pytestmark = pytest.mark.skipif(p < 2, reason="needs at least two ranks")
BAD = p - 1  # the rank whose arguments are bad
n = 64  # values per rank and block


def pair(dtype=np.float32):
    """A send array of p blocks of n values and a receive array of the same size."""
    send = np.linspace(0, 1, n * p, dtype=dtype) + me
    return send, np.zeros(n * p, dtype)


def bad_or(good, bad):
    return bad if me == BAD else good


# Each scenario makes one call; `bad_or(good, bad)` picks this rank's argument.
def strided(dtype=np.float32):
    return bad_or(pair(dtype)[0], np.zeros(2 * n * p, dtype)[::2])


def recv_of(dtype=np.float32):
    return np.zeros(n * p, dtype)


SCENARIOS = {
    # The arrays.
    "mixed dtypes": lambda: kompress.allreduce(pair()[0], bad_or(recv_of(), recv_of(np.float64)), comm),
    "not contiguous": lambda: kompress.allreduce(strided(), recv_of(), comm, abs=1e-3),
    "int array": lambda: kompress.alltoall(bad_or(pair()[0], np.arange(n * p)), recv_of(), comm),
    "float16 array": lambda: kompress.allgather(bad_or(np.zeros(n, np.float32), np.zeros(n, np.float16)),
                                                np.zeros(n * p, np.float32), comm),
    "bfloat16 tensor": lambda: kompress.reduce_scatter(
        bad_or(torch.zeros(n * p), torch.zeros(n * p, dtype=torch.bfloat16)), np.zeros(n, np.float32), comm),
    "tensor not on the CPU": lambda: kompress.allreduce(bad_or(torch.zeros(n), torch.zeros(n, device="meta")),
                                                        np.zeros(n, np.float32), comm),
    "list for an array": lambda: kompress.allreduce(bad_or(np.zeros(n, np.float32), [0.0] * n),
                                                    np.zeros(n, np.float32), comm),
    "read-only receive array": lambda: kompress.allreduce(np.zeros(n, np.float32), bad_or(
        np.zeros(n, np.float32), np.frombuffer(bytes(4 * n), np.float32)), comm),
    # The options.
    "abs and rel together": lambda: kompress.alltoall(*pair(), comm, **bad_or({"rel": 1e-3}, {"abs": 1e-3, "rel": 1e-3})),
    "a bound that is not a number": lambda: kompress.allreduce(*pair(), comm, abs=bad_or(1e-3, "small")),
    "bad mode": lambda: kompress.alltoall(*pair(), comm, mode=bad_or("raw", "fast")),
    "negative window": lambda: kompress.alltoall(*pair(), comm, window=bad_or(1, -1)),
    "bad reduction": lambda: kompress.allreduce(*pair(), comm, reduction=bad_or("recompress", "sum")),
    "bad reduction_bound": lambda: kompress.reduce_scatter(pair()[0], np.zeros(n, np.float32), comm,
                                                           reduction_bound=bad_or("total", "each")),
    "block_size not an int": lambda: kompress.allgather(np.zeros(n, np.float32), np.zeros(n * p, np.float32), comm,
                                                        block_size=bad_or(32, "big")),
    "bad communicator": lambda: kompress.allreduce(*pair(), bad_or(comm, "world")),
    # The other forms.
    "nonblocking, mixed dtypes": lambda: kompress.ialltoall(pair()[0], bad_or(recv_of(), recv_of(np.float64)),
                                                            comm).wait(),
    "nonblocking, bad mode": lambda: kompress.iallreduce(*pair(), comm, mode=bad_or("auto", "lossy")).wait(),
    "alltoallv, counts not numbers": lambda: kompress.alltoallv(
        pair()[0], bad_or([n] * p, ["n"] * p), [n * i for i in range(p)], recv_of(), [n] * p,
        [n * i for i in range(p)], comm),
    "ialltoallv, list for an array": lambda: kompress.ialltoallv(
        bad_or(pair()[0], [0.0] * n * p), [n] * p, [n * i for i in range(p)], recv_of(), [n] * p,
        [n * i for i in range(p)], comm).wait(),
    "persistent allreduce, not contiguous": lambda: kompress.allreduce_init(strided(), recv_of(), comm).close(),
    "persistent alltoall, bad mode": lambda: kompress.alltoall_init(*pair(), comm, mode=bad_or("raw", "x")).close(),
    "persistent alltoallv, int array": lambda: kompress.alltoallv_init(
        bad_or(pair()[0], np.arange(n * p)), [n] * p, [n * i for i in range(p)], recv_of(), [n] * p,
        [n * i for i in range(p)], comm).close(),
    "persistent allgather, bad communicator": lambda: kompress.allgather_init(
        np.zeros(n, np.float32), np.zeros(n * p, np.float32), bad_or(comm, 7)).close(),
    "persistent reduce_scatter, abs and rel": lambda: kompress.reduce_scatter_init(
        pair()[0], np.zeros(n, np.float32), comm, **bad_or({}, {"abs": 1.0, "rel": 1.0})).close(),
    "measure_cost_model, probe size not a number": lambda: kompress.measure_cost_model(
        comm, probe_bytes=bad_or(1 << 16, "large")),
    "measure_cost_model, negative probe size": lambda: kompress.measure_cost_model(
        comm, probe_bytes=bad_or(1 << 16, -1)),
    # The DLRM exchange's constructor.
    "exchange, abs and rel together": lambda: kompress.EmbeddingExchange(
        [(r, 4) for r in range(p)], 8, comm, **bad_or({}, {"forward_abs": 1.0, "forward_rel": 1.0})).close(),
    "exchange, table weights not numbers": lambda: kompress.EmbeddingExchange(
        [(r, 4) for r in range(p)], 8, comm, table_weights=bad_or([1.0] * p, ["heavy"] * p)).close(),
    "exchange, schedule not callable": lambda: kompress.EmbeddingExchange(
        [(r, 4) for r in range(p)], 8, comm, bound_schedule=bad_or(None, 0.5)).close(),
    "exchange, negative dimension": lambda: kompress.EmbeddingExchange(
        [(r, bad_or(4, -4)) for r in range(p)], 8, comm).close(),
    "exchange, tables not pairs": lambda: kompress.EmbeddingExchange(
        bad_or([(r, 4) for r in range(p)], [r for r in range(p)]), 8, comm).close(),
}


def exchange_call(run):
    """A call of an exchange made on every rank, which is closed afterwards."""
    def call():
        exchange = kompress.EmbeddingExchange([(r, 4) for r in range(p)], 8, comm)
        try:
            run(exchange)
        finally:
            exchange.close()
    return call


def exchange_arrays(dtype=np.float32):
    return np.ones((8 * p, 4), dtype), np.zeros((8, 4 * p), np.float32)


def closed_on_bad_rank(exchange):
    if me == BAD:
        exchange.close()
    exchange.forward(*exchange_arrays())


SCENARIOS.update({
    "exchange forward, wrong dtype": exchange_call(
        lambda e: e.forward(*exchange_arrays(bad_or(np.float32, np.float64)))),
    "exchange forward, one-dimensional": exchange_call(
        lambda e: e.forward(bad_or(exchange_arrays()[0], np.ones(8 * p * 4, np.float32)), exchange_arrays()[1])),
    "exchange ibackward, list for an array": exchange_call(
        lambda e: e.ibackward(bad_or(np.ones((8, 4 * p), np.float32), [[1.0] * 4 * p] * 8),
                              np.zeros((8 * p, 4), np.float32)).wait()),
    "exchange backward, tensor not on the CPU": exchange_call(
        lambda e: e.backward(bad_or(torch.ones(8, 4 * p), torch.ones(8, 4 * p, device="meta")),
                             np.zeros((8 * p, 4), np.float32))),
    "exchange closed on one rank": exchange_call(closed_on_bad_rank),
})


def schedule_that_raises_on_the_bad_rank(iteration, table, direction):
    if me == BAD:
        raise RuntimeError("this rank's schedule failed")
    return 1.0


def schedule_call(value):
    def call():
        exchange = kompress.EmbeddingExchange([(r, 4) for r in range(p)], 8, comm, bound_schedule=value)
        try:
            exchange.forward(*exchange_arrays())
        finally:
            exchange.close()
    return call


def module_call():
    import kompress.torch
    module = kompress.torch.EmbeddingAllToAll([(r, 4) for r in range(p)], 8, comm)
    try:
        module(bad_or(torch.ones(8 * p, 4), torch.ones(8 * p, 4, device="meta")))
    finally:
        module.exchange.close()


class _Bucket:
    def __init__(self, tensor):
        self._tensor = tensor

    def buffer(self):
        return self._tensor


def hook_call():
    import kompress.torch
    state = kompress.torch.AllreduceHookState(comm, rel=1e-3)
    kompress.torch.allreduce_hook(state, _Bucket(bad_or(torch.ones(n), torch.ones(n, dtype=torch.float16))))


SCENARIOS.update({
    "exchange, bound_schedule raises": schedule_call(schedule_that_raises_on_the_bad_rank),
    "exchange, bound_schedule gives NaN": schedule_call(lambda it, table, d: bad_or(1.0, float("nan"))),
    "exchange, table weight negative": lambda: kompress.EmbeddingExchange(
        [(r, 4) for r in range(p)], 8, comm, table_weights=[bad_or(1.0, -1.0)] * p).close(),
    "EmbeddingAllToAll, tensor not on the CPU": module_call,
    "DDP hook, float16 bucket": hook_call,
})


def a_good_call_works():
    """Calls on every rank after the failed one match: an allreduce (compressed) and a raw
    alltoall (on two to four ranks its data rides the agreement), checked against MPI's."""
    send = np.linspace(-1, 1, 1000, dtype=np.float32) * (me + 1)
    expected = np.empty_like(send)
    comm.Allreduce(send, expected)
    recv = np.empty_like(send)
    report = kompress.allreduce(send, recv, comm, abs=1e-3)
    assert_within(expected, recv, report.absolute_bound + 1e-5)
    a, b = pair()
    kompress.alltoall(a, b, comm, mode="raw")
    expected = np.empty_like(a)
    comm.Alltoall(a, expected)
    assert np.array_equal(b, expected)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_one_bad_rank_is_an_error_on_every_rank_and_the_next_call_works(scenario):
    with pytest.raises((kompress.Error, TypeError, ValueError, RuntimeError)) as raised:
        SCENARIOS[scenario]()
    if me != BAD:
        assert isinstance(raised.value, kompress.InvalidArgument)
        assert f"rank {BAD} rejected its arguments" in str(raised.value)
    a_good_call_works()
