"""Compress a real field within a relative bound, inspect the stream, decompress it."""
import os

import numpy as np

import kompress

data = os.environ.get("KOMPRESS_DATA_DIR", "../shared/data")
x = np.fromfile(f"{data}/nyx_temperature_32x32x32.f32", np.float32).reshape(32, 32, 32)

stream = kompress.compress(x, rel=1e-3)           # a uint8 array: the self-describing stream
info = kompress.inspect(stream)                   # count, dtype, absolute_bound, ratio, ...
y = kompress.decompress(stream, out=np.empty_like(x))

assert np.all(np.abs(x.astype(np.float64) - y) <= info.absolute_bound)
print(f"ratio {info.ratio:.1f}, every value within {info.absolute_bound:.3g}")
