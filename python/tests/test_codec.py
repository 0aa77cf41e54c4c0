"""The codec from Python: round trips within the bound on real data and adversarial arrays,
numpy and torch alike, and streams passed between Python and C++ byte for byte."""
import os
import subprocess

import numpy as np
import pytest
import torch

import kompress
from conftest import assert_within, load, load_array

REAL = ["sz_testfloat_8x8x128.f32", "sz_testdouble_8x8x8x128.f64", "nyx_temperature_32x32x32.f32",
        "hacc_x_32768.f32", "mitgcm_ocean_theta_15x40x90.f64", "pop_temp_384x320.f32",
        "act_mlp_fc1_out_1024x1024.f32", "era5_t2m_uk_744x33x49.f32", "nemo_orca2_sst_5x149x182.f32"]


@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("bound", [{"rel": 1e-2}, {"rel": 1e-4}, {"abs": 1e-3}, {}])
def test_real_data_round_trip_within_bound(name, bound):
    x = load(name)
    stream = kompress.compress(x, **bound)
    info = kompress.inspect(stream)
    assert info.count == x.size and info.dtype == x.dtype.name and info.compressed_bytes == stream.size
    assert stream.size <= kompress.max_compressed_size(x.size, x.dtype)
    y = kompress.decompress(stream)
    assert y.dtype == x.dtype and y.shape == (x.size,)
    # The stream's bound is the one asked for, or 0 where the codec stored the values exactly
    # (a bound below the values' float spacing).
    if "abs" in bound:
        assert info.absolute_bound in (0.0, bound["abs"])
    if "rel" in bound:
        asked = bound["rel"] * (float(x.max()) - float(x.min()))
        assert info.absolute_bound == 0.0 or info.absolute_bound == pytest.approx(asked, rel=1e-12)
    if not bound:
        assert info.absolute_bound == 0 and np.array_equal(x.reshape(-1), y)
    assert_within(x, y, info.absolute_bound)


def test_compressed_real_data_is_smaller():
    x = load("cesm_trefht_4x110x64x128.f32")
    assert kompress.inspect(kompress.compress(x, rel=1e-3)).ratio > 3


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 31, 32, 33, 127, 128, 129, 5000])
@pytest.mark.parametrize("block_size", [32, 64, 128])
def test_sizes_and_block_sizes(dtype, n, block_size):
    x = np.sin(np.arange(n, dtype=np.float64) * 0.01).astype(dtype) * 100
    stream = kompress.compress(x, abs=1e-2, block_size=block_size)
    assert kompress.inspect(stream).block_size == block_size
    assert_within(x, kompress.decompress(stream), 1e-2)


def adversarial(dtype):
    rng = np.random.default_rng(7)
    info = np.finfo(dtype)
    yield "constant", np.full(1000, 3.25, dtype)
    yield "zeros and negative zeros", np.array([0.0, -0.0] * 300, dtype)
    yield "subnormals", (np.arange(1, 400, dtype=dtype) * info.smallest_subnormal).astype(dtype)
    yield "nan and inf", np.array([1.0, np.nan, 2.0, np.inf, -np.inf, np.nan, 3.0] * 50, dtype)
    yield "all nan", np.full(100, np.nan, dtype)
    yield "huge range", np.array([info.max, -info.max, 1.0, info.tiny] * 40, dtype)
    yield "noise", rng.standard_normal(10000).astype(dtype)
    yield "spikes", np.where(rng.random(4096) < 0.01, 1e30, rng.random(4096)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bound", [{"rel": 1e-3}, {"abs": 1e-6}, {"abs": 0.5}, {}])
def test_adversarial_arrays(dtype, bound):
    for label, x in adversarial(dtype):
        info = kompress.inspect(kompress.compress(x, **bound))
        y = kompress.decompress(kompress.compress(x, **bound))
        try:
            assert_within(x, y, info.absolute_bound)
        except AssertionError as e:
            raise AssertionError(f"{label}: {e}") from None


def test_fill_value_comes_back_exactly_and_stays_out_of_the_range():
    x = load("nyx_temperature_32x32x32.f32").copy()
    x.reshape(-1)[::7] = 9.96921e36
    stream = kompress.compress(x, rel=1e-3, fill_value=9.96921e36)
    info = kompress.inspect(stream)
    assert info.fill_value == pytest.approx(9.96921e36)
    valid = x != np.float32(9.96921e36)
    assert info.absolute_bound == pytest.approx(1e-3 * (float(x[valid].max()) - float(x[valid].min())), rel=1e-12)
    y = kompress.decompress(stream, out=np.empty_like(x))
    assert np.array_equal(y[~valid], x[~valid])
    assert_within(x, y, info.absolute_bound)


def test_torch_tensors_any_shape_round_trip_into_out():
    x = torch.from_numpy(load("act_tfm_b1_ln1_in_32x128x128.f32").copy()).requires_grad_()
    stream = kompress.compress(x, rel=1e-2)
    out = torch.empty_like(x, requires_grad=False)
    assert kompress.decompress(stream, out=out) is out
    assert_within(x.detach().numpy(), out.numpy(), kompress.inspect(stream).absolute_bound)
    # A float64 tensor, and bytes as the stream.
    d = torch.linspace(-5, 5, 777, dtype=torch.float64)
    y = kompress.decompress(bytes(kompress.compress(d, abs=1e-9)))
    assert y.dtype == np.float64
    assert_within(d.numpy(), y, 1e-9)


def test_tensor_views_parameters_and_tensor_buffers_write_and_read_the_numpy_bytes():
    # CPU tensors reach the extension through torch's DLPack export: a view at an offset into
    # its storage, a Parameter and a uint8 tensor as the stream's buffer must behave as numpy.
    x = load("sz_testfloat_8x8x128.f32")
    stream = kompress.compress(x, rel=1e-3)
    storage = torch.from_numpy(np.concatenate([np.full(7, np.nan, np.float32), x.reshape(-1)]))
    view = storage[7:].view(x.shape)
    assert np.array_equal(kompress.compress(view, rel=1e-3), stream)
    assert np.array_equal(kompress.compress(torch.nn.Parameter(torch.from_numpy(x.copy())), rel=1e-3), stream)
    buffer = torch.zeros(kompress.max_compressed_size(x.size, x.dtype) + 5, dtype=torch.uint8)
    n = kompress.compress_into(view, buffer[5:], rel=1e-3)
    assert np.array_equal(buffer[5:5 + n].numpy(), stream) and not buffer[:5].any()
    # Decoding into a view writes only its own values.
    target = torch.zeros(x.size + 3)
    tail = target[3:]
    assert kompress.decompress(stream, out=tail) is tail
    assert not target[:3].any()
    assert np.array_equal(tail.numpy(), kompress.decompress(stream))


def test_compress_into_writes_the_same_stream():
    x = load("sz_testfloat_8x8x128.f32")
    buffer = np.zeros(kompress.max_compressed_size(x.size, x.dtype), np.uint8)
    n = kompress.compress_into(x, buffer, rel=1e-3)
    assert np.array_equal(buffer[:n], kompress.compress(x, rel=1e-3))


def test_the_gil_is_released_while_compressing():
    import threading
    x = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)

    thread = threading.Thread(target=tick)
    thread.start()
    try:
        before = len(ticks)
        kompress.compress(x, rel=1e-3)  # ~0.1 s: the other thread runs meanwhile
        during = len(ticks) - before
    finally:
        stop.set()
        thread.join()
    assert during > 100


# --- Python <-> C++ -------------------------------------------------------------------------

def tool():
    path = os.environ.get("KOMPRESS_STREAM_TOOL")
    if not path:
        pytest.fail("KOMPRESS_STREAM_TOOL is not set (ctest sets it: the C++ side of these tests)")
    return path


@pytest.mark.parametrize("name,bound,codec", [("sz_testdouble_8x8x8x128.f64", ("rel", 1e-4), "fast"),
                                              ("pop_temp_384x320.f32", ("abs", 1e-2), "fast"),
                                              ("act_mlp_relu2_out_1024x1024.f32", ("rel", 1e-2), "fast"),
                                              ("era5_t2m_uk_744x33x49.f32", ("rel", 1e-3), "ratio"),
                                              ("mitgcm_ocean_theta_15x40x90.f64", ("abs", 1e-2), "ratio")])
def test_streams_are_identical_across_languages(tmp_path, name, bound, codec):
    x = load(name)
    mode, value = bound
    raw = tmp_path / "in.raw"
    x.tofile(raw)
    # C++ compresses; Python's stream must be the same bytes, and Python decodes C++'s. The ratio
    # codec's C++ side gets the array's shape, as Python passes it.
    shape = ["ratio", "x".join(map(str, x.shape))] if codec == "ratio" else []
    subprocess.run([tool(), "compress", "f32" if x.dtype == np.float32 else "f64", str(raw), mode, repr(value),
                    "64", str(tmp_path / "cpp.kmpz"), *shape], check=True)
    cpp_stream = np.fromfile(tmp_path / "cpp.kmpz", dtype=np.uint8)
    py_stream = kompress.compress(x, block_size=64, codec=codec, **{mode: value})
    assert np.array_equal(cpp_stream, py_stream)
    # Python compresses; C++ decodes to exactly what Python decodes.
    py_stream.tofile(tmp_path / "py.kmpz")
    subprocess.run([tool(), "decompress", str(tmp_path / "py.kmpz"), str(tmp_path / "out.raw")], check=True)
    cpp_values = np.fromfile(tmp_path / "out.raw", dtype=x.dtype)
    py_values = kompress.decompress(cpp_stream)
    assert np.array_equal(cpp_values.view(np.uint8), py_values.view(np.uint8))
    assert_within(x, py_values, kompress.inspect(py_stream).absolute_bound)


# --- the ratio codec (format 1.1) -------------------------------------------------------------

@pytest.mark.parametrize("name", REAL)
@pytest.mark.parametrize("bound", [{"rel": 1e-2}, {"rel": 1e-4}, {"abs": 1e-3}, {}])
def test_ratio_codec_round_trip_within_bound(name, bound):
    x = load(name)
    stream = kompress.compress(x, codec="ratio", **bound)
    info = kompress.inspect(stream)
    assert info.codec == "ratio" and info.count == x.size and info.compressed_bytes == stream.size
    assert stream.size <= kompress.max_compressed_size(x.size, x.dtype, codec="ratio")
    y = kompress.decompress(stream)
    if not bound:
        assert info.absolute_bound == 0 and np.array_equal(x.reshape(-1), y)
    assert_within(x, y, info.absolute_bound)
    assert kompress.inspect(kompress.compress(x, **bound)).codec == "fast"


@pytest.mark.parametrize("name", ["pop_temp_384x320.f32", "era5_t2m_uk_744x33x49.f32",
                                  "cesm_trefht_4x110x64x128.f32"])
def test_ratio_codec_predicts_across_the_arrays_shape(name):
    # The same values flattened lose the 2-D / 3-D predictors: the shaped stream must be smaller.
    x = load(name)
    shaped = kompress.compress(x, rel=1e-3, codec="ratio")
    flat = kompress.compress(x.reshape(-1), rel=1e-3, codec="ratio")
    assert shaped.size < flat.size
    assert_within(x, kompress.decompress(shaped), kompress.inspect(shaped).absolute_bound)
    # The fast codec ignores the shape: the same bytes either way.
    assert np.array_equal(kompress.compress(x, rel=1e-3), kompress.compress(x.reshape(-1), rel=1e-3))


@pytest.mark.parametrize("shape", [(0,), (1,), (5,), (3, 1), (1, 7), (2, 3, 4), (2, 1, 3, 5), (1, 1, 1, 1, 9)])
def test_ratio_codec_any_rank_and_extent(shape):
    x = (np.arange(int(np.prod(shape)), dtype=np.float32) * 0.37).reshape(shape)
    stream = kompress.compress(x, abs=1e-2, codec="ratio")
    assert_within(x, kompress.decompress(stream), 1e-2)
    out = np.empty(kompress.max_compressed_size(x.size, x.dtype, codec="ratio"), np.uint8)
    n = kompress.compress_into(x, out, abs=1e-2, codec="ratio")
    assert np.array_equal(out[:n], stream)


def test_unknown_codec_is_rejected():
    with pytest.raises(kompress.InvalidArgument, match="codec"):
        kompress.compress(np.ones(10, np.float32), rel=1e-2, codec="zfp")
    with pytest.raises(kompress.InvalidArgument, match="codec"):
        kompress.max_compressed_size(10, np.float32, codec="")


# --- stochastic rounding (docs/error-bound.md, "Stochastic rounding") -----------------------------

@pytest.mark.parametrize("name", ["sz_testfloat_8x8x128.f32", "pop_temp_384x320.f32", "hacc_x_32768.f32",
                                  "mitgcm_ocean_theta_15x40x90.f64"])
@pytest.mark.parametrize("bound", [{"rel": 1e-2}, {"rel": 1e-4}, {"abs": 1e-3}])
@pytest.mark.parametrize("codec", ["fast", "ratio"])
def test_stochastic_rounding_round_trip_within_bound(name, bound, codec):
    x = load(name)
    stream = kompress.compress(x, codec=codec, rounding="stochastic", rounding_seed=11, **bound)
    info = kompress.inspect(stream)
    assert info.codec == codec and info.count == x.size
    assert stream.size <= kompress.max_compressed_size(x.size, x.dtype, codec=codec)
    assert_within(x, kompress.decompress(stream), info.absolute_bound)
    # The step is about e, not the 2e of rounding to nearest: the option reached the codec.
    nearest = kompress.inspect(kompress.compress(x, codec=codec, **bound))
    if info.quantization_step:
        assert info.quantization_step <= info.absolute_bound < nearest.quantization_step


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bound", [{"rel": 1e-3}, {"abs": 1e-6}, {"abs": 0.5}])
@pytest.mark.parametrize("codec", ["fast", "ratio"])
def test_stochastic_rounding_of_adversarial_arrays(dtype, bound, codec):
    for label, x in adversarial(dtype):
        stream = kompress.compress(x, codec=codec, rounding="stochastic", **bound)
        try:
            assert_within(x, kompress.decompress(stream), kompress.inspect(stream).absolute_bound)
        except AssertionError as e:
            raise AssertionError(f"{label}: {e}") from None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("codec", ["fast", "ratio"])
def test_stochastic_rounding_keeps_the_mean_of_values_below_the_step(dtype, codec):
    # Values in [0.1e, 0.4e]: rounding to nearest (step 2e) takes every one to 0, a bias of
    # -0.25e in the mean; stochastic rounding (step ~e) takes each to 0 or the step with the
    # probability that keeps its expectation (the mean's standard error here is ~0.0015e).
    e = 1e-2
    x = np.random.default_rng(5).uniform(0.1 * e, 0.4 * e, 100_000).astype(dtype)
    mean = float(x.astype(np.float64).mean())
    biased = kompress.decompress(kompress.compress(x, abs=e, codec=codec)).astype(np.float64)
    unbiased = kompress.decompress(kompress.compress(x, abs=e, codec=codec, rounding="stochastic"))
    assert_within(x, unbiased, e)
    assert abs(biased.mean() - mean) > 0.2 * e
    assert abs(unbiased.astype(np.float64).mean() - mean) < 0.01 * e
    assert len(np.unique(unbiased)) == 2, "each value rounded to 0 or the step"


@pytest.mark.parametrize("codec", ["fast", "ratio"])
def test_stochastic_rounding_seed_decides_the_bytes(codec):
    x = load_array("act_mlp_relu2_out").reshape(-1, 1024)[:64]
    same = [kompress.compress(x, rel=1e-2, codec=codec, rounding="stochastic", rounding_seed=42) for _ in range(2)]
    assert np.array_equal(same[0], same[1])
    other = kompress.compress(x, rel=1e-2, codec=codec, rounding="stochastic", rounding_seed=43)
    assert not np.array_equal(same[0], other)
    top = kompress.compress(x, rel=1e-2, codec=codec, rounding="stochastic", rounding_seed=(1 << 64) - 1)
    assert not np.array_equal(same[0], top)
    assert_within(x, kompress.decompress(other), kompress.inspect(other).absolute_bound)
    # compress_into and torch tensors write the same bytes; rounding to nearest ignores the seed.
    out = np.empty(kompress.max_compressed_size(x.size, x.dtype, codec=codec), np.uint8)
    n = kompress.compress_into(x, out, rel=1e-2, codec=codec, rounding="stochastic", rounding_seed=42)
    assert np.array_equal(out[:n], same[0])
    assert np.array_equal(kompress.compress(torch.from_numpy(x.copy()), rel=1e-2, codec=codec,
                                            rounding="stochastic", rounding_seed=42), same[0])
    assert np.array_equal(kompress.compress(x, rel=1e-2, codec=codec, rounding_seed=1),
                          kompress.compress(x, rel=1e-2, codec=codec, rounding="nearest", rounding_seed=2))


def test_unknown_rounding_is_rejected():
    x = np.ones(10, np.float32)
    out = np.empty(kompress.max_compressed_size(x.size, x.dtype), np.uint8)
    for bad in ("up", "Stochastic", ""):
        with pytest.raises(ValueError, match='rounding must be "nearest" or "stochastic"'):
            kompress.compress(x, rel=1e-2, rounding=bad)
        with pytest.raises(kompress.InvalidArgument, match='rounding must be "nearest" or "stochastic"'):
            kompress.compress_into(x, out, rel=1e-2, rounding=bad)
    for bad in (-1, 1 << 64):
        with pytest.raises(kompress.InvalidArgument, match=r"rounding_seed must be in \[0, 2\^64\)"):
            kompress.compress(x, rel=1e-2, rounding="stochastic", rounding_seed=bad)
    with pytest.raises(TypeError, match="rounding_seed must be an int"):
        kompress.compress(x, rel=1e-2, rounding="stochastic", rounding_seed=1.5)
