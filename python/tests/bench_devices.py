"""The device targets of docs/performance.md ("Python": the GPU rows, and "The device benchmark
on the CPU"), measured in one run. Not a test:
    PYTHONPATH=<package> KOMPRESS_STREAM_TOOL=<kompress_stream_tool> \
        python3 python/tests/bench_devices.py [--device cuda]

1. Call overhead: kompress.compress_into of a 4 KiB and a 64 MiB float32 tensor (REL 1e-3, the
   stream waited for) against the C++ call, `kompress_stream_tool time-device` (kompress::compress
   on Kokkos's default execution space instance, the same build), interleaved, best of rounds.
2. Saved activations: the MNIST MLP (784-1024-1024-10) and a transformer block on the tokens of
   the activation set (128 wide, 4 heads, feed-forward 512) trained from the same weights and
   batches (Adam, warm-up and cosine decay) with the saved-tensor hooks off and on around the
   model (REL 1e-2). Memory: the bytes the saved activations hold at the end of the model's
   forward: off, the distinct tensors autograd saved; on, the stash's pool in use (its sign bits
   included) and what passed through (hooks.peak_bytes). On a GPU also torch's peak over the step above the
   memory before it (torch.cuda.max_memory_allocated), off against on plus the stash's pool
   peak, since the pool is Kokkos's memory, which torch's allocator does not count. Final loss
   of both.
--device cpu runs the same on the CPU build (no torch.cuda numbers).
"""
import argparse
import math
import os
import subprocess
import tempfile
import time

import numpy as np
import torch

import kompress
import kompress.torch as kt
from conftest import load_array

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda" if kompress.cuda_enabled and torch.cuda.is_available() else "cpu")
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--rounds", type=int, default=5)
args = parser.parse_args()
device = torch.device(args.device)
gpu = device.type == "cuda"


def sync():
    if gpu:
        torch.cuda.synchronize()


# --- 1. call overhead ----------------------------------------------------------------------------
def per_call(f, calls):
    f()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        f()
    sync()
    return (time.perf_counter() - start) / calls


field = load_array("nyx_temperature").reshape(-1)
print(f"device {device}, load average {os.getloadavg()[0]:.2f}, torch {torch.__version__}")
for label, count, calls in (("4 KiB", 1024, 2000), ("64 MiB", 16 << 20, 20)):
    values = np.resize(field, count).astype(np.float32)
    x = torch.from_numpy(values).to(device)
    out = torch.empty(kompress.max_compressed_size(count), dtype=torch.uint8, device=device)
    best_py = best_cpp = float("inf")
    with tempfile.NamedTemporaryFile(suffix=".raw") as f:
        values.tofile(f.name)
        for _ in range(args.rounds):
            best_py = min(best_py, per_call(lambda: kompress.compress_into(x, out, rel=1e-3), calls))
            tool = os.environ.get("KOMPRESS_STREAM_TOOL")
            if tool:
                mode = "time-device" if gpu else "time"
                best_cpp = min(best_cpp, float(subprocess.run([tool, mode, f.name, str(calls)], check=True,
                                                              capture_output=True, text=True).stdout.split()[0]))
    ratio = f"{best_py / best_cpp:5.2f}x" if best_cpp < float("inf") else "(no KOMPRESS_STREAM_TOOL)"
    print(f"call {label:6s}: Python compress_into {best_py * 1e6:10.2f} us, C++ {best_cpp * 1e6:10.2f} us, {ratio}")


# --- 2. saved activations ------------------------------------------------------------------------
class Counting(torch.autograd.graph.saved_tensors_hooks):
    """The plain run's saved activations: the bytes of the distinct non-parameter tensors."""

    def __init__(self):
        self.storages = {}
        super().__init__(self.pack, lambda t: t)

    def pack(self, t):
        if not kt.compressed_activations._is_parameter(t):
            self.storages[(t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))] = \
                t.numel() * t.element_size()
        return t


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 10))


class Block(torch.nn.Module):
    """A transformer encoder block on 128-wide tokens and a linear read-out per token."""

    def __init__(self):
        super().__init__()
        self.block = torch.nn.TransformerEncoderLayer(128, 4, 512, dropout=0.0, batch_first=True)
        self.out = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.out(self.block(x)).reshape(-1, 10)


def mnist_batches():
    from conftest import data_dir, needs
    needs("mnist_t10k_images_10000x28x28.u8")
    images = np.fromfile(data_dir() / "mnist_t10k_images_10000x28x28.u8", np.uint8).reshape(-1, 784)
    labels = np.fromfile(data_dir() / "mnist_t10k_labels_10000.u8", np.uint8)
    x = torch.from_numpy(images[:8192].astype(np.float32) / 255.0)
    y = torch.from_numpy(labels[:8192].astype(np.int64))
    return [(x[i:i + 1024], y[i:i + 1024]) for i in range(0, 8192, 1024)]


def token_batches():
    x = torch.from_numpy(load_array("act_tfm_b1_ln1_in").copy())
    projection = torch.randn(128, 10, generator=torch.Generator().manual_seed(3))
    y = (x @ projection).argmax(-1).reshape(-1)   # a per-token class the block can learn
    return [(x, y)]


def train(make_model, batches, hooks):
    torch.manual_seed(0)
    model = make_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    # Warm-up, then cosine decay, as test_saved_tensors.py trains.
    warmup = max(1, args.steps // 5)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / warmup if s < warmup else
                                                 0.5 * (1 + math.cos(math.pi * (s - warmup) / (args.steps - warmup))))
    batches = [(x.to(device), y.to(device)) for x, y in batches]
    held = torch_peak = 0
    for step in range(args.steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad(set_to_none=False)
        if isinstance(hooks, Counting):
            hooks.storages.clear()
        else:
            hooks.reset_peaks()
            hooks.stash.reset_peaks()
        if gpu:
            sync()
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        with hooks:  # the model only: the loss's saved log-probabilities stay exact (docs/python.md)
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        held = max(held, sum(hooks.storages.values()) if isinstance(hooks, Counting) else hooks.peak_bytes)
        loss.backward()
        optimizer.step()
        schedule.step()
        if gpu:
            sync()
            pool = 0 if isinstance(hooks, Counting) else hooks.stash.stats().peak_pool_bytes
            torch_peak = max(torch_peak, torch.cuda.max_memory_allocated(device) - before + pool)
    with torch.no_grad():  # the final loss over every batch, the hooks off
        final = sum(float(torch.nn.functional.cross_entropy(model(x), y)) for x, y in batches) / len(batches)
    return final, held, torch_peak


for name, make_model, batches, budget in (("MNIST MLP", mlp, mnist_batches(), 32 << 20),
                                          ("transformer block", Block, token_batches(), 32 << 20)):
    plain_loss, plain_held, plain_peak = train(make_model, batches, Counting())
    hooks = kt.compressed_activations(rel=1e-2, budget_bytes=budget, min_numel=4096, device=device.type)
    loss, held, peak = train(make_model, batches, hooks)
    gap = (loss - plain_loss) / plain_loss
    line = (f"{name:18s}: saved activations plain {plain_held / 1e6:8.3f} MB, hooks {held / 1e6:8.3f} MB "
            f"({plain_held / held:5.2f}x); final loss plain {plain_loss:.5f}, hooks {loss:.5f} ({100 * gap:+.2f}%); "
            f"{hooks.stats().saves} saves, ratio {hooks.stats().ratio:.2f}")
    if gpu:
        line += (f"; torch peak over the step: plain {plain_peak / 1e6:.3f} MB, hooks + pool {peak / 1e6:.3f} MB "
                 f"({plain_peak / peak:.2f}x)")
    print(line)
    hooks.stash.close()
