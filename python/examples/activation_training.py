"""Saved activations kept compressed while training, against the alternatives: the MNIST MLP
(784-1024-1024-10), the small CNN and the transformer block of bench/stash_training.cpp, trained
in PyTorch from the same weights in the same batch order once per way of keeping what autograd
saves for backward: plainly, through kompress.torch.compressed_activations (every value within
its bound), as float16 casts, and as ActNN-style 2-bit codes (groups of 256 values with their
minimum and scale, stochastic rounding, and a ReLU output's mask as bits beside them, as ActNN
keeps it; actnn@STEPS: at STEPS steps of each group's range instead of 3, in 4 bits). The
group@ variants take kompress's bound relative to each group of 256 values instead of each
tensor, as ActNN's codes do, each value still within it. budget@REL/RATIO keeps kompress's
stash in a pool of plain's saved-activation bytes over RATIO (the same seed's plain run, which
comes first), with the stash's loosen_bound policy: a save that does not fit is stored within
a looser bound, up to --budget-ceiling, and each is reported.

Per model and seed it prints each variant's final training loss (its final weights over the
training set) and gap to the plain run's, held-out accuracy, and saved-activation memory: the
bytes every variant holds at the end of each step's forward (the largest over the run), what
it passes through included (parameters aside): every variant but plain keeps integer tensors
(max pooling's indices) exactly as kompress's hooks do (kompress.torch.pack_integers), so that
they differ only in how they keep floats; with per-layer bounds (layers@), the exact rows
their checks hold too, where those are more. Then the means over the seeds. The recipe is
bench/stash_training.cpp's: Adam, the learning rate rising linearly over the first fifth of the
steps, then a cosine decay to 0; batch 128; the first 8000 MNIST test-set images train, the
last 2000 evaluate.
docs/performance.md, "Saved activations in PyTorch training", has the measured tables.
"""
import argparse
import json
import math
import os
import pathlib
import statistics
import sys
import time
import weakref

import numpy as np
import torch
import torch.nn.functional as F

import kompress
import kompress.torch


# --- the models -------------------------------------------------------------------------------

def mlp():
    return torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                               torch.nn.ReLU(), torch.nn.Linear(1024, 10))


class Cnn(torch.nn.Module):
    """conv 3x3 1->8, ReLU, max pool 2x2; conv 3x3 8->16, ReLU, max pool 2x2; Linear 784->10."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.head = torch.nn.Linear(784, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.conv1(x.view(-1, 1, 28, 28))), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        return self.head(h.flatten(1))


class Transformer(torch.nn.Module):
    """49 patches of 4x4 embedded to 128 plus a learned position embedding; one pre-norm block
    (4-head self-attention, then 128->512->128 with GELU); a final LayerNorm, the mean over the
    tokens, Linear 128->10."""

    def __init__(self, width=128, heads=4, hidden=512):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Linear(16, width)
        self.position = torch.nn.Parameter(torch.randn(49, width) * 0.02)
        self.ln1, self.ln2, self.final = (torch.nn.LayerNorm(width) for _ in range(3))
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.projection = torch.nn.Linear(width, width)
        self.fc1 = torch.nn.Linear(width, hidden)
        self.fc2 = torch.nn.Linear(hidden, width)
        self.head = torch.nn.Linear(width, 10)

    def forward(self, x):
        b = x.shape[0]
        patches = x.view(b, 7, 4, 7, 4).permute(0, 1, 3, 2, 4).reshape(b, 49, 16)
        h = self.embed(patches) + self.position
        q, k, v = self.qkv(self.ln1(h)).view(b, 49, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        attention = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        h = h + self.projection((attention @ v).transpose(1, 2).reshape(b, 49, -1))
        h = h + self.fc2(F.gelu(self.fc1(self.ln2(h)), approximate="tanh"))
        return self.head(self.final(h).mean(1))


MODELS = {"mlp": mlp, "cnn": Cnn, "transformer": Transformer}


# --- the ways of keeping saved activations ------------------------------------------------------

def is_parameter(t):
    return kompress.torch.compressed_activations._is_parameter(t)


def storage_key(t):
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype, t._version)


class Kept(torch.autograd.graph.saved_tensors_hooks):
    """The plain run's saved activations: held as they are, each storage counted once at its
    size (what autograd keeps alive), parameters aside. Subclasses keep float32 activations of at
    least min_numel values as encode() makes them and count those sizes; a tensor saved twice (a
    ReLU's output that the next layer saves too), or a view of one already kept (softmax's output
    reshaped for the next product), is kept once, as kompress's hooks do. With narrow_integers,
    integer tensors (max pooling's indices) are kept exactly as kompress's hooks keep them
    (kompress.torch.pack_integers): the variants then differ only in how they keep floats.
    Everything else passes through, counted at its size."""

    def __init__(self, min_numel, narrow_integers=True):
        self.min_numel = min_numel
        self.narrow_integers = narrow_integers
        self.held = self.peak_bytes = 0
        self.live = {}  # storage -> (the first tensor saved from it, weakly; what was kept; its key)
        super().__init__(self.pack, self.unpack)

    def reset_peaks(self):
        self.held = self.peak_bytes = 0
        self.live.clear()

    def count(self, size):
        self.held += size
        self.peak_bytes = max(self.peak_bytes, self.held)

    def pack(self, t):
        if is_parameter(t):
            return t
        storage = t.untyped_storage()
        entry = self.live.get(storage.data_ptr())
        if entry is not None and entry[0]() is not None:
            first, packed, key = entry[0](), entry[1], entry[2]
            if type(self) is Kept:
                return t  # its storage is counted already
            if key == storage_key(t):
                return packed
            view = view_within(first, key, t)
            if view is not None and isinstance(packed, tuple) and packed[1] == "kept":
                return (self, "view", packed) + view
        if type(self) is Kept:
            packed, size = t, storage.nbytes()
        elif t.dtype == torch.float32 and t.numel() >= self.min_numel:
            kept, size = self.encode(t.detach(), computed=t.grad_fn is not None)
            packed = (self, "kept", t.shape, kept)
        elif self.narrow_integers and t.dtype == torch.int64 and t.numel() >= self.min_numel and \
                (integers := kompress.torch.pack_integers(t)) is not None:
            packed, size = (self, "integers", integers), integers.nbytes
        else:
            packed, size = t, t.numel() * t.element_size()
        if entry is None or entry[0]() is None:
            self.live[storage.data_ptr()] = (weakref.ref(t), packed, storage_key(t))
        self.count(size)
        return packed

    @staticmethod
    def unpack(packed):
        if not isinstance(packed, tuple):
            return packed
        if packed[1] == "kept":
            owner, _, shape, kept = packed
            return owner.decode(kept).view(shape)
        if packed[1] == "integers":
            return packed[2].unpack()
        _, _, base, shape, stride, offset = packed
        return Kept.unpack(base).view(-1).as_strided(shape, stride, offset)

    def decode(self, kept):
        return kept


def view_within(first, key, t):
    """(shape, stride, offset) of t within `first`'s memory where first was contiguous, is
    unchanged since it was saved and holds all of t; else None."""
    _, first_offset, _, _, dtype, version = key
    offset = t.storage_offset() - first_offset
    last = offset + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    if (not first.is_contiguous() or t.dtype != dtype or t._version != version or offset < 0
            or last >= first.numel() or any(st < 0 for st in t.stride()) or t.numel() == 0):
        return None
    return tuple(t.shape), tuple(t.stride()), offset


class Float16(Kept):
    def encode(self, t, computed):
        return t.half(), 2 * t.numel()

    def decode(self, kept):
        return kept.float()


class ActNN(Kept):
    """ActNN's compression of a saved activation: groups of 256 values, each with its minimum and
    scale (two floats) and codes of `steps` steps of the group's range, drawn by stochastic
    rounding (ActNN's 2 bits: 3 steps; 4 to 15 steps take 4 bits a code). Every value is within
    one step, range / steps, of the saved one: a bound relative to each group's range. Where the
    tensor has zeros and no negative value (a ReLU's output; not the network's input, which no
    ReLU made) its mask of positive values is kept as bits too, and restored values are positive
    exactly there, as ActNN's ReLU keeps its own mask."""

    group = 256

    def __init__(self, min_numel, seed, steps=3):
        super().__init__(min_numel)
        self.generator = torch.Generator().manual_seed(seed)
        self.steps = steps
        self.bits = 2 if steps <= 3 else 4

    def encode(self, t, computed):
        flat = t.reshape(-1)
        n = flat.numel()
        groups = -(-n // self.group)
        padded = torch.cat([flat, flat[-1:].expand(groups * self.group - n)]).view(groups, self.group)
        low = padded.amin(1, keepdim=True)
        scale = (padded.amax(1, keepdim=True) - low) / self.steps
        inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
        noise = torch.rand(padded.shape, generator=self.generator)
        per_byte = 8 // self.bits
        codes = ((padded - low) * inverse + noise).floor().clamp_(0, self.steps).to(torch.uint8)
        codes = codes.view(groups, -1, per_byte)
        codes = sum(codes[..., k] << (self.bits * k) for k in range(per_byte)).to(torch.uint8)
        relu_like = computed and bool((flat >= 0).all()) and bool((flat == 0).any())
        mask = pack_bits(flat > 0) if relu_like else None
        size = codes.numel() + 8 * groups + (0 if mask is None else mask.numel())
        return (codes, low, scale, n, mask), size

    def decode(self, kept):
        codes, low, scale, n, mask = kept
        field = (1 << self.bits) - 1
        q = torch.stack([(codes >> (self.bits * k)) & field for k in range(8 // self.bits)], dim=-1)
        q = q.view(codes.shape[0], -1)
        values = (low + q.float() * scale).view(-1)[:n]
        if mask is not None:
            positive = unpack_bits(mask, n)
            values = torch.where(positive, values.clamp(min=torch.finfo(torch.float32).tiny), torch.zeros_like(values))
        return values


def pack_bits(b):
    return torch.from_numpy(np.packbits(b.numpy(), bitorder="little"))


def unpack_bits(packed, n):
    return torch.from_numpy(np.unpackbits(packed.numpy(), count=n, bitorder="little").astype(bool))


class Compressed:
    """kompress.torch.compressed_activations, reset each step; with softmax_rel, softmax's outputs
    (attention probabilities) at that bound and everything else at rel."""

    def __init__(self, args, seed, segment_bytes, rel, softmax_rel=None, ceiling=None, group_relative=False,
                 budget_bytes=None):
        # With a budget, a save that does not fit is stored within a looser bound, up to the
        # ceiling: the pool never grows past it.
        stash = (kompress.Stash(64 << 20, segment_bytes=segment_bytes, rounding_seed=seed) if budget_bytes is None else
                 kompress.Stash(budget_bytes, policy="loosen_bound", ceiling_rel=args.budget_ceiling,
                                growth=args.budget_growth, segment_bytes=segment_bytes, rounding_seed=seed))
        if softmax_rel is not None:
            rel = per_tensor(rel, softmax_rel)
        # --no-input-sign: the network's input (a leaf: no grad_fn) without sign bits; the models
        # here feed it to a Linear or a convolution, which read its values, never a mask.
        exact_sign = (lambda t: t.grad_fn is not None) if args.exact_sign and not args.input_sign else args.exact_sign
        self.hooks = kompress.torch.compressed_activations(rel=rel, rounding=args.rounding, min_numel=args.min_numel,
                                                           exact_sign=exact_sign, codec=args.codec, stash=stash,
                                                           group_relative=group_relative)
        self.bounds = None if ceiling is None else kompress.torch.LayerBounds(
            self.hooks, ceiling=ceiling, growth=args.growth, tolerance=args.tolerance,
            check_every=args.check_every,
            check_batch=args.check_batch, check_rows=args.check_rows)

    def reset_peaks(self):
        self.hooks.reset_peaks()

    @property
    def peak_bytes(self):
        return self.hooks.peak_bytes

    @property
    def loosened(self):
        return self.hooks.loosened

    @property
    def saves(self):
        return self.hooks.stats().saves

    def __enter__(self):
        return self.hooks.__enter__()

    def __exit__(self, *exc):
        return self.hooks.__exit__(*exc)


def per_tensor(rel, softmax_rel):
    def bound(t):
        return softmax_rel if t.grad_fn is not None and t.grad_fn.name() == "SoftmaxBackward0" else rel
    return bound


# The stash's segment per model: the workspace the pool keeps is one segment's worst case, and
# every segment's stream carries its own header and chunk tables. The MLP's saves are small
# enough that the workspace weighs more (16 KiB holds the least, docs/stash.md); the
# transformer's 60 MB a step are 3,700 segments of 16 KiB, whose headers weigh more.
SEGMENT_BYTES = dict(mlp=16 << 10, cnn=16 << 10, transformer=64 << 10)


def variant(name, args, seed, segment_bytes, plain_bytes):
    if name == "plain":
        return Kept(args.min_numel, narrow_integers=False)
    if name == "fp16":
        return Float16(args.min_numel)
    if name == "actnn2":
        return ActNN(args.min_numel, seed + 2)
    if name.startswith("actnn@"):
        steps = int(name.partition("@")[2])
        if not 1 <= steps <= 15:
            raise SystemExit(f"activation_training: {name!r}: actnn@STEPS takes 1 to 15 steps")
        return ActNN(args.min_numel, seed + 2, steps)
    if name == "kompress" or name.startswith("kompress@"):
        rel, _, softmax_rel = name.partition("@")[2].partition("/")
        return Compressed(args, seed, segment_bytes, float(rel or args.rel),
                          float(softmax_rel) if softmax_rel else None)
    if name.startswith("group@"):
        return Compressed(args, seed, segment_bytes, float(name.partition("@")[2]), group_relative=True)
    if name.startswith("budget@"):
        rel, _, ratio = name.partition("@")[2].partition("/")
        if not ratio or not float(ratio) > 1:
            raise SystemExit(f"activation_training: {name!r}: budget@REL/RATIO, RATIO > 1")
        return Compressed(args, seed, segment_bytes, float(rel),
                          budget_bytes=int(plain_bytes / float(ratio)) // 16 * 16)
    if name.startswith(("layers@", "group-layers@")):
        rel, _, ceiling = name.partition("@")[2].partition("/")
        if not ceiling:
            raise SystemExit(f"activation_training: {name!r}: {name.partition('@')[0]}@INITIAL/CEILING")
        return Compressed(args, seed, segment_bytes, float(rel), ceiling=float(ceiling),
                          group_relative=name.startswith("group"))
    raise SystemExit(f"activation_training: unknown variant {name!r} (plain, kompress, kompress@REL, "
                     "kompress@REL/SOFTMAX_REL, layers@INITIAL/CEILING, group@REL, group-layers@INITIAL/CEILING, "
                     "budget@REL/RATIO, fp16, actnn2, actnn@STEPS)")


# --- training -----------------------------------------------------------------------------------

def data(folder, train, held_out):
    images = np.fromfile(folder / "mnist_t10k_images_10000x28x28.u8", np.uint8).reshape(-1, 784)
    labels = np.fromfile(folder / "mnist_t10k_labels_10000.u8", np.uint8).astype(np.int64)
    x = torch.from_numpy(images.astype(np.float32) / 255)
    y = torch.from_numpy(labels)
    return (x[:train], y[:train]), (x[-held_out:], y[-held_out:])


def train(model_name, variant_name, seed, args, training, held_out, plain_bytes=None):
    torch.manual_seed(seed)
    model = MODELS[model_name]()
    x, y = training
    steps = args.epochs * math.ceil(len(x) / args.batch)
    warmup = max(1, round(0.2 * steps))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup else
        0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup))))
    order = torch.Generator().manual_seed(seed + 1)
    hooks = variant(variant_name, args, seed, args.segment_bytes or SEGMENT_BYTES[model_name], plain_bytes)
    bounds = getattr(hooks, "bounds", None)
    peak = step = 0
    start = time.perf_counter()
    for _ in range(args.epochs):
        permutation = torch.randperm(len(x), generator=order)
        for first in range(0, len(x), args.batch):
            rows = permutation[first:first + args.batch]
            optimizer.zero_grad()
            hooks.reset_peaks()
            if bounds is not None:  # per-layer bounds: checks, then the step (the model under the hooks)
                bounds.train_step(step, model, F.cross_entropy, x[rows], y[rows])
                peak = max(peak, hooks.peak_bytes)
            else:
                with hooks:  # the model only: the loss's saved log-probabilities stay exact (docs/python.md)
                    logits = model(x[rows])
                peak = max(peak, hooks.peak_bytes)
                F.cross_entropy(logits, y[rows]).backward()
            optimizer.step()
            schedule.step()
            step += 1
    seconds = time.perf_counter() - start
    extra = {}
    if bounds is not None:  # the checks' exact rows count too: the run needs their memory as well
        peak = max(peak, bounds.check_peak_bytes)
        extra = dict(check_peak_bytes=bounds.check_peak_bytes,
                     final_bounds={f"{n}: {name}": bounds.bound(n) for n, name in bounds.layers().items()},
                     bound_changes=len(bounds.log()), bound_log=bounds.log())
    if getattr(hooks, "loosened", None) is not None:
        extra.update(saves=hooks.saves, loosened={name: tuple(r) for name, r in hooks.loosened.items()})
    with torch.no_grad():
        loss = sum(F.cross_entropy(model(x[i:i + 1000]), y[i:i + 1000], reduction="sum").item()
                   for i in range(0, len(x), 1000)) / len(x)
        accuracy = (model(held_out[0]).argmax(1) == held_out[1]).double().mean().item()
    return dict(model=model_name, variant=variant_name, seed=seed, loss=loss, accuracy=accuracy,
                peak_bytes=peak, seconds=seconds, **extra)


def report(model_name, variants, rows):
    seeds = sorted({r["seed"] for r in rows})
    by = {(r["variant"], r["seed"]): r for r in rows}
    print(f"\n{model_name}: final training loss (gap to plain), held-out accuracy, peak saved-activation KB "
          "(memory ratio against plain)")
    print("  seed" + "".join(f"  {v:>42}" for v in variants))
    summary = {}
    for seed in seeds:
        plain = by[("plain", seed)]
        cells = []
        for v in variants:
            r = by[(v, seed)]
            r["gap"] = (r["loss"] - plain["loss"]) / plain["loss"]
            r["memory_ratio"] = plain["peak_bytes"] / r["peak_bytes"]
            cells.append(f"{r['loss']:.5f} ({100 * r['gap']:+.2f}%) {100 * r['accuracy']:.2f}% "
                         f"{r['peak_bytes'] / 1e3:.1f} ({r['memory_ratio']:.2f}x)")
        print(f"  {seed:>4}" + "".join(f"  {c:>42}" for c in cells))
        for v in variants:
            if "final_bounds" in by[(v, seed)]:
                r = by[(v, seed)]
                print(f"        {v}: {r['bound_changes']} changes; final bounds "
                      + ", ".join(f"{name} {bound:g}" for name, bound in r["final_bounds"].items())
                      + f"; a check held {r['check_peak_bytes'] / 1e3:.1f} KB")
            if by[(v, seed)].get("loosened") is not None and v.startswith("budget@"):
                r = by[(v, seed)]
                print(f"        {v}: {sum(n for n, _ in r['loosened'].values())} of {r['saves']} saves loosened"
                      + "".join(f"; {name} {n}, up to REL {bound:.3g}" for name, (n, bound) in r["loosened"].items()))
    print("  mean", end="")
    for v in variants:
        gaps = [by[(v, s)]["gap"] for s in seeds]
        ratios = [by[(v, s)]["memory_ratio"] for s in seeds]
        sd = statistics.stdev(gaps) if len(gaps) > 1 else 0.0
        summary[v] = dict(gap=statistics.mean(gaps), gap_sd=sd,
                          accuracy=statistics.mean(by[(v, s)]["accuracy"] for s in seeds),
                          memory_ratio_min=min(ratios), memory_ratio_max=max(ratios))
        cell = (f"{100 * summary[v]['gap']:+.2f}% (sd {100 * sd:.2f}) {100 * summary[v]['accuracy']:.2f}% "
                f"{min(ratios):.2f}-{max(ratios):.2f}x")
        print(f"  {cell:>42}", end="")
    print()
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,cnn,transformer")
    parser.add_argument("--variants", default="plain,kompress,fp16,actnn2",
                        help="plain first; kompress@REL: kompress at that relative bound instead of --rel; "
                             "kompress@REL/SOFTMAX_REL: softmax's outputs at the second; layers@INITIAL/CEILING: "
                             "kompress.torch.LayerBounds from INITIAL up to CEILING; group@REL, "
                             "group-layers@INITIAL/CEILING: the same relative to each group of 256 values; "
                             "budget@REL/RATIO: kompress at REL in a pool of plain's bytes / RATIO, loosening "
                             "what does not fit; actnn@STEPS: ActNN's codes "
                             "at STEPS steps of each group's range (actnn2: 3)")
    parser.add_argument("--seeds", default="1,2,3,4,5")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--train", type=int, default=8000)
    parser.add_argument("--eval", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--rel", type=float, default=5e-2, help="kompress's bound, relative to each tensor's range")
    parser.add_argument("--rounding", default="stochastic", choices=("nearest", "stochastic"))
    parser.add_argument("--codec", default="fast", choices=("fast", "ratio", "auto"),
                        help="kompress's codec (with stochastic rounding both restore the same values)")
    parser.add_argument("--segment-bytes", type=int, default=None,
                        help="the stash's segment (default: 16384 for the MLP and the CNN, 65536 for the transformer)")
    parser.add_argument("--no-exact-sign", dest="exact_sign", action="store_false",
                        help="kompress without sign bits (safe where no backward takes a mask from a saved tensor)")
    parser.add_argument("--no-input-sign", dest="input_sign", action="store_false",
                        help="kompress without sign bits on the network's input (sign bits elsewhere as set)")
    parser.add_argument("--min-numel", type=int, default=4096, help="smaller tensors are kept as they are")
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="layers@: the parameter gradients' deviation a layer's bound may cause")
    parser.add_argument("--growth", type=float, default=2.0,
                        help="layers@: the factor a tolerant layer's bound grows by")
    parser.add_argument("--budget-ceiling", type=float, default=4e-1,
                        help="budget@: the loosest relative bound a save that does not fit is stored within")
    parser.add_argument("--budget-growth", type=float, default=1.25,
                        help="budget@: the factor each retry of such a save loosens its bound by")
    parser.add_argument("--check-every", type=int, default=50, help="layers@: steps between checks")
    parser.add_argument("--check-batch", type=int, default=16, help="layers@: the rows a check runs")
    parser.add_argument("--check-rows", type=int, default=4,
                        help="layers@: the rows a check holds at once (its peak counts in the variant's)")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1")))
    parser.add_argument("--quick", action="store_true", help="1 epoch on the first 1024 images, 512 held out, seed 1")
    parser.add_argument("--max-loss-gap", type=float, default=None,
                        help="exit 1 where kompress's mean final-loss gap to plain exceeds this fraction")
    parser.add_argument("--json")
    parser.add_argument("--data", default=os.environ.get("KOMPRESS_DATA_DIR") or
                        str(pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "data"))
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.train, args.eval, args.seeds = 1, 1024, 512, "1"
    folder = pathlib.Path(args.data)
    if not (folder / "mnist_t10k_images_10000x28x28.u8").exists():
        print(f"activation_training: skipped: no MNIST in {folder} (only the full data set has it)")
        sys.exit(77)
    variants = args.variants.split(",")
    if variants[0] != "plain":
        raise SystemExit("activation_training: --variants must start with plain (the gaps are to it)")
    torch.set_num_threads(args.threads)
    training, held_out = data(folder, args.train, args.eval)
    results, summaries = [], {}
    for model_name in args.models.split(","):
        if model_name not in MODELS:
            raise SystemExit(f"activation_training: unknown model {model_name!r} (mlp, cnn, transformer)")
        rows = []
        for seed in args.seeds.split(","):
            plain = train(model_name, "plain", int(seed), args, training, held_out)
            rows += [plain] + [train(model_name, v, int(seed), args, training, held_out, plain["peak_bytes"])
                               for v in variants[1:]]
        summaries[model_name] = report(model_name, variants, rows)
        results += rows
    signs = ("without sign bits" if not args.exact_sign else
             "with sign bits" + ("" if args.input_sign else " but on the input"))
    segments = (f"{args.segment_bytes}-byte segments" if args.segment_bytes else
                "segments of " + ", ".join(f"{SEGMENT_BYTES[m]} bytes ({m})" for m in args.models.split(",")))
    print(f"\nkompress: REL {args.rel:g} unless named, the {args.codec} codec, {args.rounding} rounding, "
          f"{signs}, {segments}; "
          f"{args.epochs} epochs x {args.train} images, batch {args.batch}, {args.threads} thread(s); "
          f"{sum(r['seconds'] for r in results):.0f} s of training")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(args=vars(args), runs=results, means=summaries), indent=1))
    failed = [f"{m} ({v})" for m, s in summaries.items() for v in s
              if v.startswith(("kompress", "layers", "group", "budget"))
              and args.max_loss_gap is not None and s[v]["gap"] > args.max_loss_gap]
    if failed:
        print(f"activation_training: kompress's final loss more than {args.max_loss_gap:.1%} above plain's on "
              + ", ".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
