"""Call overhead of kompress.compress on a 4 KiB tensor against the C++ call, measured in the
same run (docs/performance.md, "Python"). Not a test: run it by hand on a quiet machine,
    PYTHONPATH=build/python/python/package KOMPRESS_STREAM_TOOL=build/python/python/kompress_stream_tool \\
        python3 python/tests/bench_call_overhead.py
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
x = np.ascontiguousarray(load("nyx_temperature_32x32x32.f32").reshape(-1)[:1024])  # 4 KiB of a real field
t = torch.from_numpy(x.copy())
buffer = np.empty(kompress.max_compressed_size(x.size), np.uint8)

with tempfile.NamedTemporaryFile(suffix=".raw") as f:
    x.tofile(f.name)
    rows = []
    for repeat in range(3):
        cpp = float(subprocess.run([os.environ["KOMPRESS_STREAM_TOOL"], "time", f.name, str(CALLS)], check=True,
                                   capture_output=True, text=True).stdout.split()[0])
        py_into = min(timeit.repeat(lambda: kompress.compress_into(t, buffer, rel=1e-3), number=CALLS, repeat=3)) / CALLS
        py_new = min(timeit.repeat(lambda: kompress.compress(t, rel=1e-3), number=CALLS, repeat=3)) / CALLS
        rows.append((cpp, py_into, py_new))
print(f"threads (OMP_NUM_THREADS): {os.environ.get('OMP_NUM_THREADS', 'default')}, load: {os.getloadavg()}")
print("C++ compress (us) | Python compress_into (us) | ratio | Python compress (us) | ratio")
for cpp, py_into, py_new in rows:
    print(f"{cpp * 1e6:.2f} | {py_into * 1e6:.2f} | {py_into / cpp:.2f} | {py_new * 1e6:.2f} | {py_new / cpp:.2f}")
