"""DDP on a gloo process group, the MNIST MLP (784-1024-1024-10) trained once per gradient hook
from the same weights and batches: PyTorch's plain allreduce hook, an fp16 cast, and
kompress's error-bounded allreduce (kompress.torch.allreduce_hook on the process group).

Prints the time per step (median over the timed steps of the slowest rank), the bytes each rank
sent per step, the final training loss and the held-out accuracy of each hook. Ranks come from
torchrun (RANK, WORLD_SIZE), mpirun (OMPI_COMM_WORLD_*) or --ranks N (started here);
bench/dlrm_training.sh --program python/examples/ddp_training.py runs it over a rate-limited
link (docs/performance.md, "DDP over gloo").
"""
import argparse
import json
import os
import pathlib
import queue
import statistics
import sys
import tempfile
import threading
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import kompress.torch


def data(folder):
    images = np.fromfile(folder / "mnist_t10k_images_10000x28x28.u8", np.uint8).reshape(-1, 784)
    labels = np.fromfile(folder / "mnist_t10k_labels_10000.u8", np.uint8).astype(np.int64)
    x = torch.from_numpy(images.astype(np.float32) / 255)
    y = torch.from_numpy(labels)
    return (x[:8000], y[:8000]), (x[8000:], y[8000:])


class Variant:
    """A gradient hook, counting the values it was handed (for the bytes it put on the wire)."""

    def __init__(self, name, state, hook, bytes_per_value):
        self.name, self.state, self.bytes_per_value = name, state, bytes_per_value
        self.values = 0

        def counted(state, bucket):  # DDP checks a hook's parameter names
            self.values += bucket.buffer().numel()
            return hook(state, bucket)

        self.hook = counted

    def wire_bytes(self, p):
        if isinstance(self.state, kompress.torch.AllreduceHookState):
            return self.state.wire_bytes
        return int(self.values * self.bytes_per_value * 2 * (p - 1) / p)  # a ring's share per rank


all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.9


class Fp16OnTwoSteps:
    """fp16 casts on the schedule of kompress's hook, for gloo builds without a float16 sum (where
    PyTorch's fp16_compress_hook fails with "Invalid scalar type"): each rank casts the divided
    bucket to fp16, an all_to_all_single sends segment s to rank s, which sums the p halves in
    fp32; an all_gather returns the sums as fp16. On a worker thread, as kompress's hook, so
    it overlaps the backward pass the same way; the wire carries half the plain ring's bytes."""

    def __init__(self):
        self.jobs = queue.SimpleQueue()
        threading.Thread(target=self.work, daemon=True).start()

    def hook(self, state, bucket):
        future = torch.futures.Future()
        self.jobs.put((bucket.buffer(), future))
        return future

    def work(self):
        while True:
            buffer, future = self.jobs.get()
            try:
                p, me, n = dist.get_world_size(), dist.get_rank(), buffer.numel()
                bounds = [(s * n // p, (s + 1) * n // p) for s in range(p)]
                own = bounds[me][1] - bounds[me][0]
                half = (buffer / p).to(torch.float16)
                received = torch.empty(p * own, dtype=torch.float16)
                dist.all_to_all_single(received.view(torch.uint8), half.view(torch.uint8), [2 * own] * p,
                                       [2 * (b - a) for a, b in bounds])
                longest = -(-n // p)
                padded = torch.zeros(longest, dtype=torch.float16)
                padded[:own] = received.view(p, own).float().sum(0).half()
                gathered = torch.empty(p * longest, dtype=torch.float16)
                all_gather(gathered.view(torch.uint8), padded.view(torch.uint8))
                for s, (a, b) in enumerate(bounds):
                    buffer[a:b] = gathered[s * longest:s * longest + b - a]
                future.set_result(buffer)
            except BaseException as error:  # noqa: BLE001 (handed to DDP)
                future.set_exception(error)


def make_variant(name, rel):
    if name == "plain":
        return Variant(name, None, default_hooks.allreduce_hook, 4)
    if name == "fp16":
        return Variant(name, None, default_hooks.fp16_compress_hook, 2)
    if name == "fp16-two-step":
        return Variant("fp16 (two-step)", None, Fp16OnTwoSteps().hook, 2)
    if name == "bf16":
        return Variant(name, None, default_hooks.bf16_compress_hook, 2)
    if name == "kompress":
        return Variant(f"kompress REL {rel:g}", kompress.torch.AllreduceHookState(rel=rel),
                       kompress.torch.allreduce_hook, None)
    raise SystemExit(f"ddp_training: unknown variant {name!r} (plain, fp16, fp16-two-step, bf16, kompress)")


def train(variant, args, train_set, held_out, p, me):
    torch.manual_seed(args.seed)
    model = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    ddp = DDP(model)
    ddp.register_comm_hook(variant.state, variant.hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    x, y = train_set
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(args.seed))
    times = []
    for step in range(args.steps):
        rows = order[(step * p + me) * args.batch % x.shape[0]:][:args.batch]
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x[rows]), y[rows]).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times[args.warmup:], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(x), y).item()
        accuracy = (model(held_out[0]).argmax(1) == held_out[1]).double().mean().item()
    wire = torch.tensor([variant.wire_bytes(p)], dtype=torch.float64)
    dist.all_reduce(wire)
    return dict(variant=variant.name, step_ms=statistics.median(slowest.tolist()) * 1e3,
                wire_mb_per_step=float(wire) / p / args.steps / 1e6, loss=loss, accuracy=accuracy)


def run(me, p, args, rendezvous):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("USE_LIBUV", "0")  # Debian's torch has no libuv for the TCP store
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=rendezvous, rank=me, world_size=p)
    train_set, held_out = data(pathlib.Path(args.data))
    results, failed = [], False
    for name in args.variants.split(","):
        results.append(train(make_variant(name, args.rel), args, train_set, held_out, p, me))
    if me == 0:
        plain = results[0]["step_ms"]
        print(f"DDP, MNIST MLP 784-1024-1024-10, {p} ranks x {args.threads} thread(s), gloo over {args.link}; "
              f"batch {args.batch} per rank, {args.steps} steps (median of the last {args.steps - args.warmup}); "
              f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        print(f"{'hook':<22} {'step ms':>8} {'vs first':>8} {'MB/step':>8} {'final loss':>10} {'held-out acc':>12}")
        for r in results:
            print(f"{r['variant']:<22} {r['step_ms']:8.2f} {plain / r['step_ms']:7.2f}x {r['wire_mb_per_step']:8.3f} "
                  f"{r['loss']:10.5f} {r['accuracy']:12.4f}")
        gap = [r for r in results[1:] if r["variant"].startswith("kompress") and args.max_loss_gap is not None
               and r["loss"] > results[0]["loss"] * (1 + args.max_loss_gap)]
        if gap:
            print(f"ddp_training: final loss more than {args.max_loss_gap:.1%} above {results[0]['variant']}'s: "
                  f"{[r['variant'] for r in gap]}")
            failed = True
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(dict(ranks=p, link=args.link, batch=args.batch,
                                                               steps=args.steps, results=results), indent=1))
    dist.destroy_process_group()
    if failed:
        sys.exit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="plain,fp16-two-step,kompress",
                        help="plain, fp16 (PyTorch's hook: needs a float16 sum, which Debian's gloo lacks), "
                             "fp16-two-step, bf16 (NCCL), kompress")
    parser.add_argument("--rel", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ranks", type=int, default=2, help="started here unless a launcher set the ranks")
    parser.add_argument("--port", type=int, default=int(os.environ.get("MASTER_PORT", 29517)))
    parser.add_argument("--link", default="loopback")
    parser.add_argument("--json")
    parser.add_argument("--max-loss-gap", type=float, default=None,
                        help="exit 1 where a kompress hook's final loss is more than this fraction above the first's")
    parser.add_argument("--data", default=os.environ.get("KOMPRESS_DATA_DIR") or
                        str(pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data"))
    args = parser.parse_args()
    if not (pathlib.Path(args.data) / "mnist_t10k_images_10000x28x28.u8").exists():
        print(f"ddp_training: MNIST is not in {args.data}: it is in the full data set only (set KOMPRESS_DATA_DIR)")
        sys.exit(77)
    for rank_var, size_var in (("RANK", "WORLD_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank_var in os.environ:
            address = os.environ.get("MASTER_ADDR", "127.0.0.1")
            return run(int(os.environ[rank_var]), int(os.environ[size_var]), args, f"tcp://{address}:{args.port}")
    with tempfile.TemporaryDirectory() as folder:
        torch.multiprocessing.start_processes(run, args=(args.ranks, args, f"file://{folder}/store"),
                                              nprocs=args.ranks, start_method="spawn")


if __name__ == "__main__":
    main()
