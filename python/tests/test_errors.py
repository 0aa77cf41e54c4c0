"""Every error path of the Python package raises a kompress exception (or, for arguments that
are not arrays at all, a TypeError) and never crashes or writes a partial result."""
import os
import tempfile

import numpy as np
import pytest
import torch

import kompress


@pytest.fixture
def stream():
    return kompress.compress(np.linspace(0, 1, 5000, dtype=np.float32), rel=1e-3)


def test_the_exception_hierarchy_mirrors_cpp():
    assert issubclass(kompress.Error, RuntimeError)
    assert issubclass(kompress.InvalidArgument, kompress.Error) and issubclass(kompress.InvalidArgument, ValueError)
    assert issubclass(kompress.FormatError, kompress.Error)
    assert issubclass(kompress.BudgetExceeded, kompress.Error)
    assert issubclass(kompress.InvalidHandle, kompress.InvalidArgument)
    assert issubclass(kompress.MPIError, kompress.Error) and issubclass(kompress.PeerError, kompress.Error)
    assert issubclass(kompress.ResourceError, kompress.Error)


def test_decompress_refuses_an_output_over_max_output_bytes_before_allocating():
    x = np.zeros(1 << 20, np.float64)  # 8 MiB of values in a stream of a few KB
    stream = kompress.compress(x, abs=1e-3, codec="ratio")
    assert stream.nbytes < 64 << 10
    with pytest.raises(kompress.ResourceError, match="more than max_output_bytes") as raised:
        kompress.decompress(stream, max_output_bytes=(8 << 20) - 1)
    assert raised.value.requested_bytes == 8 << 20
    assert np.array_equal(kompress.decompress(stream, max_output_bytes=8 << 20), x)


@pytest.mark.parametrize("x", [np.arange(10), np.zeros(10, np.float16), np.zeros(10, np.complex64),
                               torch.zeros(10, dtype=torch.int32), torch.zeros(10, dtype=torch.bfloat16)])
def test_compress_rejects_other_dtypes(x):
    with pytest.raises(kompress.InvalidArgument,
                       match=r"kompress.compress: the input must be float32 or float64 \(got (int|float|complex|bfloat)\d+\)"):
        kompress.compress(x, abs=1e-3)


def test_compress_rejects_strided_arrays_and_tensors():
    a = np.zeros((10, 10), np.float32)
    with pytest.raises(kompress.InvalidArgument, match="C-contiguous"):
        kompress.compress(a[:, ::2], abs=1e-3)
    with pytest.raises(kompress.InvalidArgument, match="C-contiguous"):
        kompress.compress(np.asfortranarray(a + np.arange(10)), abs=1e-3)
    with pytest.raises(kompress.InvalidArgument, match="C-contiguous"):
        kompress.compress(torch.zeros(4, 6).t(), abs=1e-3)
    # What the message advises works.
    kompress.compress(torch.zeros(4, 6).t().contiguous(), abs=1e-3)


@pytest.mark.parametrize("kwargs,match", [({"abs": -1.0}, "finite and >= 0"), ({"rel": float("nan")}, "finite"),
                                          ({"abs": 1.0, "rel": 1.0}, "not both"),
                                          ({"abs": 1.0, "block_size": 48}, "block size must be 32, 64 or 128")])
def test_compress_rejects_bad_options(kwargs, match):
    with pytest.raises(kompress.InvalidArgument, match=match):
        kompress.compress(np.zeros(10, np.float32), **kwargs)


def test_compress_options_convert_as_float_int_and_str_do():
    # The extension converts the keywords itself, with Python's float(), int(), str() and
    # operator.index for the seed: numpy scalars, 0-d tensors and str subclasses are taken, and
    # what those conversions refuse is refused with their errors.
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    out = np.empty(kompress.max_compressed_size(x.size, x.dtype, block_size=64), np.uint8)
    expected = kompress.compress(x, abs=1e-3, block_size=64, rounding="stochastic", rounding_seed=7)

    class Name(str):
        pass

    given = dict(abs=np.float64(1e-3), block_size=np.int64(64), codec=Name("fast"), rounding=np.str_("stochastic"),
                 rounding_seed=np.uint64(7))
    assert np.array_equal(kompress.compress(x, **given), expected)
    assert np.array_equal(out[:kompress.compress_into(x, out, **given)], expected)
    assert np.array_equal(kompress.compress(torch.from_numpy(x), abs=torch.tensor(1e-3, dtype=torch.float64),
                                            block_size="64", rounding="stochastic", rounding_seed=7), expected)
    with pytest.raises(ValueError, match="could not convert string to float"):
        kompress.compress(x, abs="a lot")
    with pytest.raises(TypeError):
        kompress.compress_into(x, out, rel=[1e-3])
    with pytest.raises(TypeError):
        kompress.compress(x, abs=1e-3, block_size=None)
    with pytest.raises(kompress.InvalidArgument, match=r"block_size is out of range \(got 1099511627776\)"):
        kompress.compress(x, abs=1e-3, block_size=1 << 40)
    with pytest.raises(TypeError, match=r"kompress.compress_into: rounding_seed must be an int \(got float\)"):
        kompress.compress_into(x, out, abs=1e-3, rounding_seed=7.0)
    with pytest.raises(kompress.InvalidArgument, match=r"rounding_seed must be in \[0, 2\^64\) \(got -1\)"):
        kompress.compress_into(x, out, abs=1e-3, rounding_seed=np.int8(-1))


def test_non_arrays_are_a_type_error():
    with pytest.raises(TypeError):
        kompress.compress([1.0, 2.0], abs=1e-3)
    with pytest.raises(TypeError):
        kompress.decompress("not a stream")


def test_max_compressed_size_rejects_bad_arguments():
    with pytest.raises(kompress.InvalidArgument, match="block size"):
        kompress.max_compressed_size(10, np.float32, block_size=7)
    with pytest.raises(kompress.InvalidArgument, match="element size"):
        kompress.max_compressed_size(10, np.int16)


def test_truncated_streams_are_format_errors(stream):
    for length in [0, 10, 87, 88, 100, stream.size // 2, stream.size - 1]:
        with pytest.raises(kompress.FormatError):
            kompress.decompress(stream[:length])
        with pytest.raises(kompress.FormatError):
            kompress.inspect(stream[:length])


def test_corrupted_streams_are_format_errors_and_leave_out_untouched(stream):
    out = np.full(5000, 7.0, np.float32)
    rng = np.random.default_rng(3)
    for position in list(range(0, 88, 5)) + list(rng.integers(88, stream.size, 40)):
        bad = stream.copy()
        bad[position] ^= 0x5A
        try:
            kompress.decompress(bad, out=out)
        except kompress.FormatError as e:
            assert "kompress::" in str(e)
            assert np.all(out == 7.0), f"out written before the error at byte {position}"
        else:
            pytest.fail(f"a flipped byte at {position} was not detected")
    with pytest.raises(kompress.FormatError, match="magic|KMPZ"):
        kompress.inspect(np.frombuffer(b"NOPE" + bytes(200), np.uint8))


def test_decompress_rejects_a_wrong_output(stream):
    with pytest.raises(kompress.InvalidArgument, match="holds float values but the output View is of double"):
        kompress.decompress(stream, out=np.empty(5000, np.float64))
    with pytest.raises(kompress.InvalidArgument, match="5000 values but the output View has 4999"):
        kompress.decompress(stream, out=np.empty(4999, np.float32))
    with pytest.raises(kompress.InvalidArgument, match="C-contiguous"):
        kompress.decompress(stream, out=np.empty((5000, 2), np.float32)[:, 0])
    with pytest.raises(kompress.InvalidArgument, match=r"must be a uint8 array \(got int8\)"):
        kompress.decompress(stream.view(np.int8))
    with pytest.raises(kompress.InvalidArgument, match="one-dimensional"):
        kompress.decompress(stream[: stream.size // 8 * 8].reshape(8, -1))


def test_stash_errors():
    stash = kompress.Stash(256 << 10, segment_bytes=16 << 10)
    noise = np.random.default_rng(1).standard_normal(1 << 18).astype(np.float32)  # 1 MiB, incompressible
    with pytest.raises(kompress.BudgetExceeded) as caught:
        stash.save(noise, abs=1e-7)
    assert caught.value.budget_bytes == 256 << 10 and caught.value.needed_bytes > 0
    assert stash.stats().entries == 0
    h = stash.save(noise[:1000], abs=1e-3)
    stash.drop(h)
    with pytest.raises(kompress.InvalidHandle):
        stash.restore(h, np.empty(1000, np.float32))
    h = stash.save(noise[:1000], abs=1e-3)
    with pytest.raises(kompress.InvalidArgument):
        stash.restore(h, np.empty(999, np.float32))
    stash.close()
    with pytest.raises(kompress.InvalidArgument, match="closed"):
        stash.save(noise[:10], abs=1e-3)
    with pytest.raises(kompress.InvalidArgument, match="policy must be"):
        kompress.Stash(1 << 20, policy="drop")
    with pytest.raises(kompress.InvalidArgument, match="directory"):
        kompress.Stash(1 << 20, policy="spill_file")
    with pytest.raises(kompress.InvalidArgument, match="ceiling"):
        kompress.Stash(1 << 20, policy="loosen_bound")


def test_collective_argument_errors_on_one_rank():
    from mpi4py import MPI
    comm = MPI.COMM_SELF
    a = np.zeros(8, np.float32)
    with pytest.raises(kompress.InvalidArgument, match="mpi4py communicator"):
        kompress.allreduce(a, a.copy(), comm="world")
    with pytest.raises(kompress.InvalidArgument, match="same dtype"):
        kompress.allreduce(a, np.zeros(8, np.float64), comm)
    with pytest.raises(kompress.InvalidArgument, match="mode must be"):
        kompress.alltoall(a, a.copy(), comm, mode="fast")
    with pytest.raises(kompress.InvalidArgument, match="reduction_bound"):
        kompress.allreduce(a, a.copy(), comm, reduction_bound="each")
    with pytest.raises(kompress.InvalidArgument, match="8 elements, the result View 7"):
        kompress.allreduce(a, np.zeros(7, np.float32), comm)
    with pytest.raises(kompress.InvalidArgument):
        kompress.alltoallv(a, [9], [0], a.copy(), [8], [0], comm)
    with pytest.raises(kompress.InvalidArgument, match="owned by rank"):
        kompress.EmbeddingExchange([(1, 4)], 2, comm)   # rank 1 of a one-rank communicator


def test_a_failed_mpi_call_is_an_mpi_error_with_its_code():
    from mpi4py import MPI
    a = np.zeros(8, np.float32)
    # mpi4py makes MPI return errors; a null communicator is one every MPI reports.
    for call in (lambda: kompress.allreduce(a, a.copy(), MPI.COMM_NULL),
                 lambda: kompress.allgather_init(a, a.copy(), MPI.COMM_NULL)):
        with pytest.raises(kompress.MPIError, match="MPI_Comm") as caught:
            call()
        assert MPI.Get_error_class(caught.value.code) == MPI.ERR_COMM
