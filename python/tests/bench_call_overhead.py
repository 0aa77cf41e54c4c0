"""Call overhead of kompress.compress on a 4 KiB tensor against the C++ call, measured in the
same run, interleaved, best of several rounds (docs/performance.md, "Python"). Not a test:
    PYTHONPATH=build/python/python/package KOMPRESS_STREAM_TOOL=build/python/python/kompress_stream_tool \\
        OMP_NUM_THREADS=1 python3 python/tests/bench_call_overhead.py
"""
import os
import subprocess
import tempfile
import timeit

import numpy as np
import torch

import kompress
from conftest import load

CALLS = 20000
ROUNDS = 5
x = np.ascontiguousarray(load("nyx_temperature_32x32x32.f32").reshape(-1)[:1024])  # 4 KiB of a real field
t = torch.from_numpy(x.copy())
buffer = np.empty(kompress.max_compressed_size(x.size), np.uint8)


def per_call(f):
    return min(timeit.repeat(f, number=CALLS, repeat=3)) / CALLS


best = {}
with tempfile.NamedTemporaryFile(suffix=".raw") as f:
    x.tofile(f.name)
    for _ in range(ROUNDS):
        times = {
            "C++ kompress::compress": float(subprocess.run(
                [os.environ["KOMPRESS_STREAM_TOOL"], "time", f.name, str(CALLS)], check=True, capture_output=True,
                text=True).stdout.split()[0]),
            "compress_into(tensor)": per_call(lambda: kompress.compress_into(t, buffer, rel=1e-3)),
            "compress(tensor)": per_call(lambda: kompress.compress(t, rel=1e-3)),
            "compress(numpy)": per_call(lambda: kompress.compress(x, rel=1e-3)),
        }
        for name, seconds in times.items():
            best[name] = min(best.get(name, seconds), seconds)
base = best["C++ kompress::compress"]
print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'default')}, load average {os.getloadavg()[0]:.2f}, "
      f"best of {ROUNDS} interleaved rounds of {CALLS} calls")
for name, seconds in best.items():
    print(f"{name:28s} {seconds * 1e6:8.2f} us  {seconds / base:5.2f}x")
