"""kompress.Stash from Python: round trips within the bound, the entry's info, each budget
policy as in C++, and the per-save options: the kept sign, the codec, the layer, the rounding
(docs/stash.md)."""
import numpy as np
import pytest
import torch

import kompress
from conftest import assert_within, load, load_array


def test_save_restore_within_the_bound():
    stash = kompress.Stash(16 << 20)
    x = load("act_mlp_relu2_out_1024x1024.f32")
    h = stash.save(x, rel=1e-2)
    info = stash.info(h)
    assert info.count == x.size and info.dtype == "float32" and info.ratio > 2 and h in stash
    out = torch.empty(1024, 1024)
    stash.restore(h, out)
    assert_within(x, out.numpy(), info.absolute_bound)
    y = stash.restore(h, drop=True)
    assert_within(x, y, info.absolute_bound)
    assert h not in stash and stash.stats().entries == 0 and stash.stats().saves == 1


def test_budget_policies():
    x = load("act_cnn_s3_relu_out_128x64x8x8.f32")           # 2 MiB
    small = 1 << 20
    host = kompress.Stash(small, policy="spill_host")
    h = host.save(x, abs=1e-7)
    assert host.info(h).spilled_segments > 0
    assert_within(x, host.restore(h), host.info(h).absolute_bound)

    import tempfile
    with tempfile.TemporaryDirectory() as directory:
        spill = kompress.Stash(small, policy="spill_file", directory=directory)
        h = spill.save(x, abs=1e-7)
        assert spill.stats().file_spilled_bytes > 0
        assert_within(x, spill.restore(h), spill.info(h).absolute_bound)
        spill.close()

    loosen = kompress.Stash(small, policy="loosen_bound", ceiling_rel=1e-1)
    h = loosen.save(x, rel=1e-6)
    info = loosen.info(h)
    assert info.loosened and info.used_bound > 1e-6 and loosen.stats().loosened_saves == 1
    assert_within(x, loosen.restore(h), info.absolute_bound)


def straddling_zero(dtype, e, n=100_003):
    """Values around 0 at the bound's scale (most within a few e of it, a fraction within e),
    with zeros, -0.0, +-e, e/2 and the smallest denormal: a bound alone flips many signs."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-4 * e, 4 * e, n).astype(dtype)
    x[:6] = [0.0, -0.0, e, -e, e / 2, np.finfo(dtype).smallest_subnormal]
    x[6::97] = 0.0
    return x


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_keep_sign_of_a_relu_output_stores_its_zeros_as_sign_bits_alone(rounding):
    x = load("act_mlp_relu2_out_1024x1024.f32").ravel()     # a ReLU's output: about half +0
    stash = kompress.Stash(16 << 20)
    kept = stash.save(x, rel=5e-2, keep_sign=True, rounding=rounding)
    info = stash.info(kept)
    assert info.zeros_in_signs == np.count_nonzero(x == 0) > x.size // 4
    restored = stash.restore(kept)
    assert np.array_equal(restored > 0, x > 0)
    assert not np.signbit(restored[x == 0]).any() and (restored[x == 0] == 0).all(), "the zeros come back exact"
    assert_within(x, restored, info.absolute_bound)
    y = x.copy()
    y[0] = -1.0                                              # not a ReLU's output: stored whole
    whole = stash.save(y, rel=5e-2, keep_sign=True, rounding=rounding)
    assert stash.info(whole).zeros_in_signs == 0 and stash.info(whole).stored_bytes > 1.2 * info.stored_bytes
    assert_within(y, stash.restore(whole), stash.info(whole).absolute_bound)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("codec", ["fast", "ratio"])
@pytest.mark.parametrize("bound", [{"abs": 1e-3}, {"rel": 0.1}])   # rel: about 8e-4 of the range 8e-3
def test_keep_sign_restores_every_value_on_its_side_of_zero_within_the_bound(dtype, codec, bound):
    x = straddling_zero(dtype, 1e-3)
    stash = kompress.Stash(16 << 20)
    plain = stash.save(x, codec=codec, **bound)
    flipped = (stash.restore(plain) > 0) != (x > 0)
    assert flipped.sum() > 100, "the data must make the bound alone flip signs, or this test proves nothing"
    kept = stash.save(x, codec=codec, keep_sign=True, **bound)
    info, plain_info = stash.info(kept), stash.info(plain)
    assert info.keeps_sign and not plain_info.keeps_sign and plain_info.sign_bytes == 0
    assert info.codec == codec and info.absolute_bound == plain_info.absolute_bound > 0
    # A bit a value in an even number of 32-bit words, and the stream's mean of (0, e] (16 bytes), per stream.
    assert x.size / 8 + 16 * info.segments <= info.sign_bytes <= x.size / 8 + 24 * info.segments
    assert info.stored_bytes == plain_info.stored_bytes + info.sign_bytes, "the same streams, and the bits"
    restored = stash.restore(kept)
    assert np.array_equal(restored > 0, x > 0), "positive exactly where the saved value was"
    assert_within(x, restored, info.absolute_bound)
    assert_within(x, stash.restore(plain), plain_info.absolute_bound)
    stats = stash.stats()
    assert stats.sign_bytes == info.sign_bytes and stats.stored_bytes == info.stored_bytes + plain_info.stored_bytes
    stash.drop(kept)
    assert stash.stats().sign_bytes == 0


def test_keep_sign_keeps_nan_infinities_and_lossless_values():
    x = straddling_zero(np.float32, 1e-3, n=5000)
    x[10:14] = [np.nan, np.inf, -np.inf, -np.nan]
    stash = kompress.Stash(4 << 20)
    h = stash.save(x, abs=1e-3, keep_sign=True)
    restored = stash.restore(h)
    assert_within(x, restored, stash.info(h).absolute_bound)
    assert np.array_equal(restored > 0, x > 0)
    exact = stash.save(x, keep_sign=True)   # lossless: bit-exact, the bits change nothing
    assert stash.restore(exact).tobytes() == x.tobytes()


def smooth_field():
    """A smooth 2-D field: the ratio codec's predictors make its stream far shorter."""
    i, j = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    return (np.sin(i / 17.0) * np.cos(j / 23.0) + 0.001 * i).astype(np.float32)


def test_codec_per_save_is_recorded_and_counted():
    x = smooth_field()
    stash = kompress.Stash(8 << 20)
    fast, ratio = stash.save(x, rel=1e-3), stash.save(x, rel=1e-3, codec="ratio")
    assert stash.info(fast).codec == "fast" and stash.info(ratio).codec == "ratio"
    assert stash.info(ratio).stored_bytes < stash.info(fast).stored_bytes
    assert stash.stats().ratio_codec_saves == 1 and stash.stats().codec_measurements == 0
    for h in (fast, ratio):
        assert_within(x, stash.restore(h), stash.info(h).absolute_bound)


@pytest.mark.parametrize("min_saving,chosen", [(0.0, "ratio"), (0.99, "fast")])
def test_auto_codec_takes_the_ratio_codec_where_it_saves_enough(min_saving, chosen):
    x = smooth_field()
    stash = kompress.Stash(8 << 20, ratio_codec_min_saving=min_saving)
    h = stash.save(x, rel=1e-3, codec="auto")
    assert stash.info(h).codec == chosen and stash.stats().codec_measurements == 1
    assert stash.stats().ratio_codec_saves == (chosen == "ratio")
    assert_within(x, stash.restore(h), stash.info(h).absolute_bound)


def test_auto_codec_remembers_its_choice_per_layer():
    x = smooth_field()
    stash = kompress.Stash(8 << 20, ratio_codec_min_saving=0.0, codec_remeasure_saves=2)
    codecs = [stash.info(stash.save(x, rel=1e-3, codec="auto", layer=7)).codec for _ in range(3)]
    assert codecs == ["ratio"] * 3
    assert stash.stats().codec_measurements == 2, "measured, remembered for one more save, measured again"
    stash.save(x, rel=1e-3, codec="auto", layer=8)
    stash.save(x, rel=1e-3, codec="auto")
    stash.save(x, rel=1e-3, codec="auto")
    assert stash.stats().codec_measurements == 5, "a new layer measures, and so does every save without one"


def test_stats_report_the_pools_parts():
    x = smooth_field()
    stash = kompress.Stash(8 << 20, async_window=4)
    handles = [stash.save(x, rel=1e-3, keep_sign=True), stash.save(x[:100], abs=1e-3)]
    stats = stash.stats()
    assert stats.reserved_bytes == 0 and stats.moved_streams == 0   # only C++'s save_async reserves and moves
    assert 0 < stats.sign_bytes < stats.stored_bytes
    assert stats.pool_bytes == stats.workspace_bytes + stats.stored_bytes + stats.padding_bytes
    ranges = sum(2 * stash.info(h).segments for h in handles)     # a stream and its sign bits per segment
    assert 0 < stats.padding_bytes < 16 * ranges                    # each rounded up to 16 bytes


def test_per_save_options_reject_bad_values():
    stash = kompress.Stash(4 << 20)
    x = np.zeros(1000, np.float32)
    with pytest.raises(kompress.InvalidArgument, match="codec must be None, 'fast', 'ratio' or 'auto'"):
        stash.save(x, abs=1e-3, codec="zstd")
    with pytest.raises(TypeError, match="codec must be None or a str"):
        stash.save(x, abs=1e-3, codec=1)
    for layer in (-1, 1 << 32):
        with pytest.raises(kompress.InvalidArgument, match=r"layer must be in \[0, 2\^32\)"):
            stash.save(x, abs=1e-3, layer=layer)
    for layer in (1.5, "conv1"):
        with pytest.raises(TypeError, match="layer must be an int"):
            stash.save(x, abs=1e-3, layer=layer)
    for rounding in ("up", "Nearest", ""):
        with pytest.raises(ValueError, match="rounding must be None, 'nearest' or 'stochastic'"):
            stash.save(x, abs=1e-3, rounding=rounding)
    with pytest.raises(TypeError, match="rounding must be None or a str"):
        stash.save(x, abs=1e-3, rounding=1)
    assert stash.stats().entries == 0 and stash.stats().saves == 0
    assert stash.info(stash.save(x, abs=1e-3, layer=np.int64(3), codec="auto")).count == 1000
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(kompress.InvalidArgument, match="ratio_codec_min_saving must be in"):
            kompress.Stash(4 << 20, ratio_codec_min_saving=bad)
    with pytest.raises(kompress.InvalidArgument, match="codec_remeasure_saves must be in"):
        kompress.Stash(4 << 20, codec_remeasure_saves=0)
    with pytest.raises(kompress.InvalidArgument, match="async_window must be at least 1"):
        kompress.Stash(4 << 20, async_window=0)
    with pytest.raises(TypeError, match="async_window must be an int"):
        kompress.Stash(4 << 20, async_window=2.5)
    with pytest.raises(TypeError, match="ratio_codec_min_saving must be a number"):
        kompress.Stash(4 << 20, ratio_codec_min_saving="a lot")
    with pytest.raises(ValueError, match='rounding must be "nearest" or "stochastic"'):
        kompress.Stash(4 << 20, rounding="dithered")
    for seed in (-1, 1 << 64):
        with pytest.raises(kompress.InvalidArgument, match=r"rounding_seed must be in \[0, 2\^64\)"):
            kompress.Stash(4 << 20, rounding_seed=seed)
    with pytest.raises(TypeError, match="rounding_seed must be an int"):
        kompress.Stash(4 << 20, rounding_seed="7")


def small_positives(n=200_003, e=1e-2):
    """Values in [0.1e, 0.4e]: rounding to nearest takes every one to 0, stochastic rounding
    to 0 or the step with the probability that keeps its expectation."""
    return np.random.default_rng(9).uniform(0.1 * e, 0.4 * e, n).astype(np.float32)


@pytest.mark.parametrize("codec", ["fast", "ratio"])
@pytest.mark.parametrize("keep_sign", [False, True])
def test_stochastic_rounding_restores_within_the_bound_and_unbiased(codec, keep_sign):
    e = 1e-2
    x = small_positives(e=e)
    mean = float(x.astype(np.float64).mean())
    stash = kompress.Stash(16 << 20, segment_bytes=64 << 10)   # several streams, each seeded on its own
    h = stash.save(x, abs=e, codec=codec, keep_sign=keep_sign, rounding="stochastic")
    info = stash.info(h)
    assert info.rounding == "stochastic" and info.codec == codec and info.keeps_sign == keep_sign
    assert info.segments > 1
    restored = stash.restore(h)
    assert_within(x, restored, info.absolute_bound)
    assert abs(restored.astype(np.float64).mean() - mean) < 0.01 * e
    if keep_sign:
        assert np.array_equal(restored > 0, x > 0)
    plain = stash.save(x, abs=e, codec=codec)
    assert stash.info(plain).rounding == "nearest"
    if not keep_sign:   # every value came back 0 (keep_sign would restore them at their mean of (0, e])
        assert abs(stash.restore(plain).astype(np.float64).mean() - mean) > 0.2 * e


def test_stochastic_rounding_of_real_activations():
    x = load_array("act_mlp_relu2_out")
    stash = kompress.Stash(16 << 20)
    for bound in ({"rel": 1e-2}, {"rel": 1e-1}, {"abs": 1e-3}):
        h = stash.save(x, rounding="stochastic", keep_sign=True, **bound)
        info = stash.info(h)
        assert info.rounding == "stochastic" and info.absolute_bound > 0
        restored = stash.restore(h, drop=True)
        assert_within(x, restored, info.absolute_bound)
        assert np.array_equal(restored > 0, x.reshape(-1) > 0)


def test_the_stashs_rounding_and_seed():
    x = small_positives(n=50_000)
    default = kompress.Stash(8 << 20, rounding="stochastic", rounding_seed=7)
    h = default.save(x, abs=1e-2)
    assert default.info(h).rounding == "stochastic"
    assert default.info(default.save(x, abs=1e-2, rounding="nearest")).rounding == "nearest"
    # The same seed repeats every save's roundings; each save draws afresh; another seed differs.
    again = kompress.Stash(8 << 20, rounding="stochastic", rounding_seed=7)
    first = default.restore(h)
    assert np.array_equal(first, again.restore(again.save(x, abs=1e-2)))
    assert not np.array_equal(first, default.restore(default.save(x, abs=1e-2)))
    other = kompress.Stash(8 << 20, rounding="stochastic", rounding_seed=8)
    assert not np.array_equal(first, other.restore(other.save(x, abs=1e-2)))
    top = kompress.Stash(8 << 20, rounding="stochastic", rounding_seed=(1 << 64) - 1)
    assert_within(x, top.restore(top.save(x, abs=1e-2)), 1e-2)


def _group_bounds(x, rel):
    """rel * 2^floor(log2(range)) of each group of 256 finite values (docs/stash.md)."""
    groups = np.pad(x.astype(np.float64), (0, -x.size % 256), mode="edge").reshape(-1, 256)
    spans = groups.max(1) - groups.min(1)
    spans = np.where(spans > 0, spans, np.abs(groups).max(1))
    k = np.clip(np.floor(np.log2(np.where(spans > 0, spans, 1.0))), -100, 127)
    return np.repeat(rel * np.exp2(np.where(spans > 0, k, -100)), 256)[:x.size]


@pytest.mark.parametrize("codec", ["fast", "ratio"])
@pytest.mark.parametrize("keep_sign", [False, True])
def test_group_relative_bounds_keep_each_group_within_its_own_range(codec, keep_sign):
    x = load("act_mlp_relu2_out_1024x1024.f32").ravel()
    x[:512 * 256] *= 1e-3                                    # half the groups a thousand times smaller
    stash = kompress.Stash(16 << 20)
    h = stash.save(x, rel=0.1, codec=codec, keep_sign=keep_sign, group_relative=True, rounding="stochastic")
    info = stash.info(h)
    bounds = _group_bounds(x, 0.1)
    assert info.group_relative and info.absolute_bound == pytest.approx(bounds.max(), rel=1e-12)
    restored = stash.restore(h)
    error = np.abs(restored.astype(np.float64) - x)
    assert (error <= bounds).all()
    assert (error[:512 * 256].max() < 1e-3 * 0.1 * x[512 * 256:].max())  # the small groups keep their digits
    if keep_sign:
        assert np.array_equal(restored > 0, x > 0)
    whole = stash.save(x, rel=0.1, codec=codec, keep_sign=keep_sign, rounding="stochastic")
    assert not stash.info(whole).group_relative


def test_group_relative_needs_a_relative_bound_of_at_least_2_to_the_minus_28():
    stash = kompress.Stash(1 << 20)
    x = np.linspace(0, 1, 5000, dtype=np.float32)
    with pytest.raises(kompress.InvalidArgument, match="needs a relative bound"):
        stash.save(x, abs=1e-3, group_relative=True)
    with pytest.raises(kompress.InvalidArgument, match="2\\^-28"):
        stash.save(x, rel=1e-9, group_relative=True)
    assert stash.stats().entries == 0
