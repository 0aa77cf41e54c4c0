"""Trains the nycflights13 DLRM end to end, once per embedding-exchange variant, and compares
held-out AUC, log loss, bytes on the wire, time per iteration and the exchanged values' error
(docs/dlrm.md, "Training through the exchange").

    mpirun -n 4 python3 dlrm_training.py [--iterations N] [--variants plain,fp16,...] [--json out.json]

The model (the one that produced ../shared/data/dlrm_flights_tables_*): ten embedding tables of
dim 128, bottom MLP 13-128-128, pairwise dot interaction, top MLP 183-256-128-1, Adagrad lr
0.02, global batch 1024, one pass over the training rows. The tables are model parallel (table
t lives on one rank, ranks own unequal numbers of tables), the MLPs data parallel (their
gradients summed with an allreduce). Every variant trains from the same initial weights with
the same batch order; only the embedding all-to-all (forward: pooled embeddings; backward:
their gradients) differs, through one seam: an object with ``forward`` and ``backward`` that
map a tensor to what the receivers get and count the bytes put on the wire.

- plain: fp32 MPI_Alltoallv (mpi4py);
- fp16, bf16: the values cast, a 16-bit MPI_Alltoallv, cast back (TorchRec's FP16/BF16 qcomms);
- int8: row-wise int8, per embedding row of 128 values a float scale and offset and 8-bit codes
  (FBGEMM's FloatToFused8BitRowwiseQuantized, TorchRec's INT8 qcomms);
- kompress: kompress.EmbeddingExchange (the object kompress.torch.EmbeddingAllToAll wraps) at a
  fixed REL bound per direction;
- kompress-adaptive: the same with per-table weights and an iteration schedule (loose early,
  tight late: the SC'24 dual-level idea);
- kompress-allreduce: kompress at the fixed bound, and the dense gradients summed with
  kompress.allreduce instead of MPI_Allreduce.

The variants train in lockstep: iteration i of every variant, in an order that rotates every
iteration, then iteration i + 1 (each with its own model, optimizer and exchange, so the
results are those of separate runs), so that load from anything else on the machine falls
on every variant alike. Time per iteration: the slowest rank's, median over the iterations.
A rank's own block is never encoded (every variant copies it exactly) and its bytes are not
counted. The held-out evaluation uses the trained weights directly (every rank gathers the
tables and scores its share of the held-out rows), so it measures the model, not the exchange.
"""
import argparse
import json
import math
import os
import pathlib
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

import kompress

DIM = 128
TABLE_NAMES = ["flight", "tailnum", "doy", "route", "dest", "hour", "carrier", "month", "dow", "origin"]
ALL_VARIANTS = ["plain", "fp16", "bf16", "int8", "kompress", "kompress-adaptive", "kompress-allreduce"]


# --- data ---------------------------------------------------------------------------------

def default_data_dir() -> pathlib.Path:
    """$KOMPRESS_DATA_DIR, else ../shared/data beside the repository, else the repository's sample."""
    if os.environ.get("KOMPRESS_DATA_DIR"):
        return pathlib.Path(os.environ["KOMPRESS_DATA_DIR"])
    repo = pathlib.Path(__file__).resolve().parents[2]
    full = repo.parent / "shared" / "data"
    return full if full.is_dir() else repo / "data"


class Flights:
    """The training set of ../shared/data/dlrm_flights_training, read in place."""

    def __init__(self, data_dir: pathlib.Path):
        folder = data_dir / "dlrm_flights_training"
        meta = json.loads((folder / "dlrm_flights_dataset.json").read_text())
        rows = meta["rows"]
        files = meta["files"]
        self.table_rows = [meta["table_rows"][name] for name in meta["sparse_features"]]
        assert meta["sparse_features"] == TABLE_NAMES
        self.dense = np.fromfile(folder / files["dense"], np.float32).reshape(rows, -1)
        self.sparse = np.fromfile(folder / files["sparse"], np.int32).reshape(rows, len(self.table_rows))
        self.labels = np.fromfile(folder / files["labels"], np.uint8).astype(np.float32)
        self.test = np.arange(*meta["test_rows"])
        self.train = np.arange(*meta["train_rows"])


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties as half)."""
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]
    positives = labels > 0.5
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def log_loss(labels: np.ndarray, logits: np.ndarray) -> float:
    z = logits.astype(np.float64)
    return float(np.mean(np.maximum(z, 0) - z * labels + np.log1p(np.exp(-np.abs(z)))))


# --- the layout of the exchange -----------------------------------------------------------

class Layout:
    """Which rank owns which table (contiguous runs in table order, unequal counts), and the
    shapes of docs/dlrm.md: forward [global batch x local width] -> [local batch x total width]."""

    def __init__(self, comm, n_tables: int, local_batch: int):
        self.comm = comm
        self.p, self.me = comm.Get_size(), comm.Get_rank()
        if self.p == 4 and n_tables == 10:   # bench/dlrm_exchange.cpp's assignment
            groups = [[0, 1], [2, 3], [4, 5, 6], [7, 8, 9]]
        else:
            groups = [list(g) for g in np.array_split(np.arange(n_tables), self.p)]
        self.owner = [r for r, g in enumerate(groups) for _ in g]
        self.groups = groups
        self.mine = groups[self.me]
        self.n_tables = n_tables
        self.local_batch = local_batch
        self.global_batch = local_batch * self.p
        self.width = [len(g) * DIM for g in groups]                  # local width of each rank
        self.col = np.cumsum([0] + self.width)                        # owner r: columns col[r]:col[r+1]
        self.local_width, self.total_width = self.width[self.me], int(self.col[-1])
        self.tables = [(o, DIM) for o in self.owner]


# --- the seam: codecs and exchanges -------------------------------------------------------

class Cast:
    """Values cast to a 16-bit float type on the wire."""

    def __init__(self, dtype):
        self.dtype = dtype

    def wire_bytes(self, rows, width):
        return rows * width * 2

    def encode(self, x):
        return x.to(self.dtype).view(torch.int16).numpy().view(np.uint8).reshape(-1)

    def decode(self, buf, rows, width):
        return torch.from_numpy(buf.view(np.int16).copy()).view(self.dtype).to(torch.float32).view(rows, width)


class Fp32:
    def wire_bytes(self, rows, width):
        return rows * width * 4

    def encode(self, x):
        return x.numpy().view(np.uint8).reshape(-1)

    def decode(self, buf, rows, width):
        return torch.from_numpy(buf.view(np.float32).copy()).view(rows, width)


class RowwiseInt8:
    """FBGEMM's fused 8-bit row-wise format: per row of DIM values, DIM uint8 codes then a
    float32 scale and a float32 offset (bias); x' = code * scale + bias."""

    ROW = DIM + 8

    def wire_bytes(self, rows, width):
        return rows * (width // DIM) * self.ROW

    def encode(self, x):
        rows = x.reshape(-1, DIM)
        lo = rows.min(dim=1).values
        hi = rows.max(dim=1).values
        scale = (hi - lo) / 255.0
        inverse = 255.0 / (hi - lo + 1e-8)
        codes = torch.round((rows - lo[:, None]) * inverse[:, None]).clamp_(0, 255).to(torch.uint8)
        out = np.empty((rows.shape[0], self.ROW), np.uint8)
        out[:, :DIM] = codes.numpy()
        out[:, DIM:] = torch.stack([scale, lo], dim=1).numpy().view(np.uint8)
        return out.reshape(-1)

    def decode(self, buf, rows, width):
        fused = buf.reshape(-1, self.ROW)
        codes = torch.from_numpy(fused[:, :DIM].astype(np.float32))
        scale_bias = torch.from_numpy(np.ascontiguousarray(fused[:, DIM:]).view(np.float32))
        return (codes * scale_bias[:, :1] + scale_bias[:, 1:]).view(rows, width)


class MPIExchange:
    """The exchange as one MPI_Alltoallv of encoded bytes: every block sent to another rank is
    encoded with ``codec``, the receiver decodes it; the own block is copied exactly."""

    def __init__(self, layout: Layout, codec):
        self.l, self.codec = layout, codec

    def _alltoallv(self, send_blocks, recv_sizes):
        """send_blocks[q]: uint8 array for rank q (None for the own rank)."""
        l = self.l
        send_counts = [0 if b is None else b.size for b in send_blocks]
        send = np.concatenate([b for b in send_blocks if b is not None]) if l.p > 1 else np.empty(0, np.uint8)
        recv_counts = [0 if q == l.me else recv_sizes[q] for q in range(l.p)]
        recv = np.empty(sum(recv_counts), np.uint8)
        sdispl = np.concatenate([[0], np.cumsum(send_counts)[:-1]]).tolist()
        rdispl = np.concatenate([[0], np.cumsum(recv_counts)[:-1]]).tolist()
        l.comm.Alltoallv([send, send_counts, sdispl, MPI.BYTE], [recv, recv_counts, rdispl, MPI.BYTE])
        return recv, rdispl, sum(send_counts)

    def forward(self, x):
        """x [global batch x local width] -> [local batch x total width], wire bytes sent."""
        l, lb = self.l, self.l.local_batch
        blocks = [None if q == l.me else self.codec.encode(x[q * lb:(q + 1) * lb]) for q in range(l.p)]
        sizes = [self.codec.wire_bytes(lb, l.width[r]) for r in range(l.p)]
        recv, displ, sent = self._alltoallv(blocks, sizes)
        out = torch.empty(lb, l.total_width)
        for r in range(l.p):
            c0, c1 = l.col[r], l.col[r + 1]
            if r == l.me:
                out[:, c0:c1] = x[l.me * lb:(l.me + 1) * lb]
            elif c1 > c0:
                out[:, c0:c1] = self.codec.decode(recv[displ[r]:displ[r] + sizes[r]], lb, l.width[r])
        return out, sent

    def backward(self, g):
        """g [local batch x total width] -> [global batch x local width], wire bytes sent."""
        l, lb = self.l, self.l.local_batch
        blocks = [None if r == l.me else self.codec.encode(g[:, l.col[r]:l.col[r + 1]].contiguous())
                  for r in range(l.p)]
        size = self.codec.wire_bytes(lb, l.local_width)
        recv, displ, sent = self._alltoallv(blocks, [size] * l.p)
        out = torch.empty(l.global_batch, l.local_width)
        for q in range(l.p):
            if q == l.me:
                out[q * lb:(q + 1) * lb] = g[:, l.col[l.me]:l.col[l.me + 1]]
            elif l.local_width:
                out[q * lb:(q + 1) * lb] = self.codec.decode(recv[displ[q]:displ[q] + size], lb, l.local_width)
        return out, sent


class KompressExchange:
    """kompress.EmbeddingExchange: each table's segment compressed within its own bound."""

    def __init__(self, layout: Layout, forward_rel, backward_rel, table_weights=None, schedule=None):
        self.l = layout
        self.forward_rel, self.backward_rel = forward_rel, backward_rel
        self.table_weights = table_weights or [1.0] * layout.n_tables
        self.schedule = schedule or (lambda iteration, table, direction: 1.0)
        self.exchange = kompress.EmbeddingExchange(layout.tables, layout.local_batch, layout.comm,
                                                   forward_rel=forward_rel, backward_rel=backward_rel,
                                                   table_weights=self.table_weights,
                                                   bound_schedule=schedule)
        self.bounds_seen = []

    def rel(self, iteration, table, direction):
        base = self.forward_rel if direction == "forward" else self.backward_rel
        return base * self.table_weights[table] * self.schedule(iteration, table, direction)

    def forward(self, x):
        out = torch.empty(self.l.local_batch, self.l.total_width)
        report = self.exchange.forward(x, out)
        return out, report.wire_bytes

    def backward(self, g):
        out = torch.empty(self.l.global_batch, self.l.local_width)
        report = self.exchange.backward(g, out)
        return out, report.wire_bytes

    def close(self):
        self.exchange.close()


class ErrorCheck:
    """Every value received against the exact exchange (an extra fp32 exchange, untimed), per
    table, and against a per-table bound: the variant's own (kompress) or, for variants without
    one, the fixed REL bound of the kompress variant (what the casts would have to meet)."""

    def __init__(self, layout: Layout, rel_of):
        self.l, self.rel_of = layout, rel_of
        self.exact = MPIExchange(layout, Fp32())
        self.err = {d: np.zeros(layout.n_tables) for d in ("forward", "backward")}
        self.ratio = {d: np.zeros(layout.n_tables) for d in ("forward", "backward")}

    def _ranges(self, x, tables):
        """(max - min) in double of each table's columns of x: [n_tables] on this rank."""
        ranges = np.zeros(self.l.n_tables)
        for i, t in enumerate(tables):
            block = x[:, i * DIM:(i + 1) * DIM].double()
            ranges[t] = float(block.max() - block.min()) if block.numel() else 0.0
        return ranges

    def forward(self, iteration, x, out):
        l = self.l
        exact, _ = self.exact.forward(x)
        ranges = np.zeros(l.n_tables)
        l.comm.Allreduce(self._ranges(x, l.mine), ranges, MPI.SUM)   # each table's owner gives its range
        for t in range(l.n_tables):
            c = slice(t * DIM, (t + 1) * DIM)
            e = float((out[:, c].double() - exact[:, c].double()).abs().max())
            bound = self.rel_of(iteration, t, "forward") * ranges[t]
            self._note("forward", t, e, bound)

    def backward(self, iteration, g, out):
        l, lb = self.l, self.l.local_batch
        exact, _ = self.exact.backward(g)
        ranges = np.zeros((l.p, l.n_tables))
        l.comm.Allgather(self._ranges(g, range(l.n_tables)), ranges)   # each sender's slice's range
        for i, t in enumerate(l.mine):
            c = slice(i * DIM, (i + 1) * DIM)
            for q in range(l.p):
                rows = slice(q * lb, (q + 1) * lb)
                e = float((out[rows, c].double() - exact[rows, c].double()).abs().max())
                self._note("backward", t, e, self.rel_of(iteration, t, "backward") * ranges[q, t])

    def _note(self, direction, table, err, bound):
        self.err[direction][table] = max(self.err[direction][table], err)
        ratio = err / bound if bound > 0 else (0.0 if err == 0 else math.inf)
        self.ratio[direction][table] = max(self.ratio[direction][table], ratio)

    def summary(self):
        out = {}
        for d in ("forward", "backward"):
            err, ratio = np.zeros_like(self.err[d]), np.zeros_like(self.ratio[d])
            self.l.comm.Allreduce(self.err[d], err, MPI.MAX)
            self.l.comm.Allreduce(self.ratio[d], ratio, MPI.MAX)
            out[d] = {"max_error": err.tolist(), "error_over_bound": ratio.tolist()}
        return out


class _Exchange(torch.autograd.Function):
    """The seam inside autograd: forward exchanges pooled embeddings, backward their gradients."""

    @staticmethod
    def forward(ctx, pooled_local, seam, step):
        x = pooled_local.detach().contiguous()
        t0 = time.perf_counter()
        out, sent = seam.forward(x)
        step["forward_s"] = time.perf_counter() - t0
        step["forward_bytes"] = sent
        if step["check"] is not None:
            step["check"].forward(step["iteration"], x, out)
        ctx.seam, ctx.step = seam, step
        return out

    @staticmethod
    def backward(ctx, grad):
        seam, step = ctx.seam, ctx.step
        g = grad.detach().contiguous()
        t0 = time.perf_counter()
        out, sent = seam.backward(g)
        step["backward_s"] = time.perf_counter() - t0
        step["backward_bytes"] = sent
        if step["check"] is not None:
            step["check"].backward(step["iteration"], g, out)
        return out, None, None


# --- the model ----------------------------------------------------------------------------

def mlp(sizes, generator, last_relu):
    """facebookresearch/dlrm's initialisation: W ~ N(0, sqrt(2 / (m + n))), b ~ N(0, sqrt(1 / m))."""
    layers = []
    for i, (n, m) in enumerate(zip(sizes[:-1], sizes[1:])):
        linear = torch.nn.Linear(n, m)
        with torch.no_grad():
            linear.weight.normal_(0.0, math.sqrt(2.0 / (m + n)), generator=generator)
            linear.bias.normal_(0.0, math.sqrt(1.0 / m), generator=generator)
        layers.append(linear)
        if i < len(sizes) - 2 or last_relu:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class DLRM(torch.nn.Module):
    """Tables of this rank only (model parallel); the MLPs on every rank (data parallel). Every
    rank draws every table from the same generator, so the weights do not depend on the ranks."""

    def __init__(self, table_rows, layout: Layout, seed: int):
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        tables = []
        for rows in table_rows:
            bound = math.sqrt(1.0 / rows)
            tables.append(torch.empty(rows, DIM).uniform_(-bound, bound, generator=generator))
        self.tables = torch.nn.ParameterList([torch.nn.Parameter(tables[t]) for t in layout.mine])
        self.bottom = mlp([13, 128, DIM], generator, last_relu=True)
        n = len(table_rows) + 1
        self.top = mlp([DIM + n * (n - 1) // 2, 256, 128, 1], generator, last_relu=False)
        self.pairs = torch.tril_indices(n, n, offset=-1)
        self.layout = layout

    def lookup(self, sparse):
        """[rows x local width]: this rank's tables, one row per sample and table."""
        if not self.layout.mine:
            return torch.empty(sparse.shape[0], 0)
        return torch.cat([torch.nn.functional.embedding(sparse[:, t], w, sparse=True)
                          for t, w in zip(self.layout.mine, self.tables)], dim=1)

    def dense_part(self, dense, pooled):
        """Bottom MLP, interaction with every table's pooled embedding ([rows x total width]),
        top MLP: the logits."""
        x = self.bottom(dense)
        z = torch.cat([x[:, None, :], pooled.view(pooled.shape[0], -1, DIM)], dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)

    def mlp_parameters(self):
        return list(self.bottom.parameters()) + list(self.top.parameters())


# --- training and evaluation --------------------------------------------------------------

def evaluate(model: DLRM, data: Flights, layout: Layout, rows=None):
    """Held-out AUC and log loss of the model as it stands: every rank gathers every table and
    scores its share of the held-out rows; rank 0 gets the result (None elsewhere)."""
    comm = layout.comm
    with torch.no_grad():
        owned = [w.detach().numpy() for w in model.tables]
        gathered = comm.allgather(owned)
        tables = [None] * layout.n_tables
        for r, group in enumerate(layout.groups):
            for t, w in zip(group, gathered[r]):
                tables[t] = torch.from_numpy(w)
        test = data.test if rows is None else data.test[:rows]
        mine = np.array_split(test, layout.p)[layout.me]
        sparse = torch.from_numpy(data.sparse[mine].astype(np.int64))
        pooled = torch.cat([tables[t][sparse[:, t]] for t in range(layout.n_tables)], dim=1)
        logits = model.dense_part(torch.from_numpy(data.dense[mine]), pooled).numpy()
    everything = comm.gather(logits, root=0)
    if layout.me != 0:
        return None
    logits = np.concatenate(everything)
    labels = data.labels[test]
    return {"auc": auc(labels, logits), "log_loss": log_loss(labels, logits)}


def parse_variant(name, args):
    """``kompress@F/B`` (any kompress variant) sets the forward and backward REL bounds instead
    of --forward-rel and --backward-rel. Returns (variant, forward_rel, backward_rel)."""
    variant, forward_rel, backward_rel = name, args.forward_rel, args.backward_rel
    if "@" in name:
        variant, bounds = name.split("@", 1)
        try:
            forward_rel, backward_rel = (float(b) for b in bounds.split("/"))
        except ValueError:
            raise SystemExit(f"dlrm_training: {name!r}: write the bounds as variant@FORWARD/BACKWARD") from None
    if variant not in ALL_VARIANTS or ("@" in name and not variant.startswith("kompress")):
        raise SystemExit(f"dlrm_training: unknown variant {name!r} (known: {', '.join(ALL_VARIANTS)}; "
                         f"kompress ones take @FORWARD/BACKWARD)")
    return variant, forward_rel, backward_rel


def make_seam(name, layout, args, iterations):
    """The exchange of a variant (parse_variant)."""
    variant, forward_rel, backward_rel = parse_variant(name, args)
    if variant == "plain":
        return MPIExchange(layout, Fp32())
    if variant == "fp16":
        return MPIExchange(layout, Cast(torch.float16))
    if variant == "bf16":
        return MPIExchange(layout, Cast(torch.bfloat16))
    if variant == "int8":
        return MPIExchange(layout, RowwiseInt8())
    if variant in ("kompress", "kompress-allreduce"):
        return KompressExchange(layout, forward_rel, backward_rel)
    if variant == "kompress-adaptive":
        weights = [args.large_table_weight if rows > 1000 else
                   (args.small_table_weight if rows <= 24 else 1.0) for rows in layout.table_rows]

        def schedule(iteration, table, direction):
            # loose for the first third of the pass, tight for the last third
            phase = 3 * iteration // max(iterations, 1)
            return args.schedule[min(phase, 2)]
        return KompressExchange(layout, forward_rel, backward_rel, weights, schedule)
    raise AssertionError(variant)


class Run:
    """One variant's training: its own model, optimizer and exchange, stepped one iteration at a
    time, so that main() can step every variant in turn (lockstep: load from anything else on
    the machine falls on every variant alike, and no variant's weights depend on another's)."""

    def __init__(self, name, seed, data: Flights, layout: Layout, args, iterations, log):
        self.name, self.seed, self.data, self.layout, self.args, self.log = name, seed, data, layout, args, log
        self.variant = parse_variant(name, args)[0]
        self.iterations = iterations
        self.order = data.train[np.random.default_rng(seed).permutation(data.train.size)]
        self.model = DLRM(data.table_rows, layout, seed)
        self.optimizer = torch.optim.Adagrad(list(self.model.parameters()), lr=args.lr)
        self.seam = make_seam(name, layout, args, iterations)
        rel_of = self.seam.rel if isinstance(self.seam, KompressExchange) else (
            lambda it, t, d: args.forward_rel if d == "forward" else args.backward_rel)
        self.check = ErrorCheck(layout, rel_of)
        self.mlp_params = self.model.mlp_parameters()
        self.flat = torch.zeros(sum(p.numel() for p in self.mlp_params))
        self.times = np.zeros((iterations, 5))   # total, forward exchange, backward exchange, allreduce, checked
        self.sent = np.zeros(2)
        self.allreduce_wire = 0
        self.curve = []

    def evaluate(self, iteration):
        result = evaluate(self.model, self.data, self.layout, self.args.eval_rows or None)
        if result is not None:
            result["iteration"] = iteration
            self.curve.append(result)
            self.log(f"  {self.name:>18} seed {self.seed} it {iteration:4d}: AUC {result['auc']:.4f} "
                     f"loss {result['log_loss']:.4f}")

    def step(self, it):
        layout, data, args, model = self.layout, self.data, self.args, self.model
        comm, lb, gb = layout.comm, layout.local_batch, layout.global_batch
        checked = args.check_every > 0 and it % args.check_every == 0
        step = {"iteration": it, "check": self.check if checked else None}
        batch = self.order[it * gb:(it + 1) * gb]
        mine = batch[layout.me * lb:(layout.me + 1) * lb]
        comm.Barrier()      # every variant's iteration starts together on every rank
        t0 = time.perf_counter()
        sparse = torch.from_numpy(data.sparse[batch].astype(np.int64))
        pooled_local = model.lookup(sparse)
        pooled = _Exchange.apply(pooled_local, self.seam, step)
        logits = model.dense_part(torch.from_numpy(data.dense[mine]), pooled)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.from_numpy(data.labels[mine]))
        self.optimizer.zero_grad(set_to_none=False)
        (loss / layout.p).backward()     # summed over ranks below: the global batch's mean
        t1 = time.perf_counter()
        flat = self.flat
        torch.cat([p.grad.view(-1) for p in self.mlp_params], out=flat)
        if self.variant == "kompress-allreduce":
            self.allreduce_wire += kompress.allreduce(flat, flat, comm, rel=args.allreduce_rel).wire_bytes
        else:
            comm.Allreduce(MPI.IN_PLACE, flat.numpy(), MPI.SUM)
        offset = 0
        for p in self.mlp_params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        t2 = time.perf_counter()
        self.optimizer.step()
        self.times[it] = (time.perf_counter() - t0, step["forward_s"], step["backward_s"], t2 - t1, checked)
        self.sent += (step["forward_bytes"], step["backward_bytes"])

    def finish(self):
        """Collective: the run's summary on rank 0 (None elsewhere)."""
        comm, times, iterations = self.layout.comm, self.times, self.iterations
        if isinstance(self.seam, KompressExchange):
            self.seam.close()
        # time: max over ranks per iteration, median over the iterations without an error check
        worst = np.zeros_like(times)
        comm.Allreduce(times, worst, MPI.MAX)
        compute = times[:, 0] - times[:, 1] - times[:, 2] - times[:, 3]
        worst_compute = np.zeros_like(compute)
        comm.Allreduce(compute, worst_compute, MPI.MAX)
        timed = worst[:, 4] == 0
        timed[:self.args.skip_first] = False
        total_sent = np.zeros(2)
        comm.Allreduce(self.sent, total_sent, MPI.SUM)
        errors = self.check.summary()
        allreduce_bytes = comm.allreduce(self.allreduce_wire, MPI.SUM)
        if self.layout.me != 0:
            return None
        ms = lambda col: float(np.median(col[timed]) * 1e3)
        return {
            "variant": self.variant, "name": self.name, "seed": self.seed, "iterations": iterations,
            "ranks": self.layout.p, "global_batch": self.layout.global_batch, "curve": self.curve,
            "final": self.curve[-1],
            "bytes_per_iteration": {"forward": total_sent[0] / iterations, "backward": total_sent[1] / iterations,
                                    "allreduce_kompress": allreduce_bytes / iterations},
            "ms": {"iteration": ms(worst[:, 0]), "forward_exchange": ms(worst[:, 1]),
                   "backward_exchange": ms(worst[:, 2]), "allreduce": ms(worst[:, 3]),
                   "compute": ms(worst_compute), "timed_iterations": int(timed.sum()),
                   "iteration_p90": float(np.percentile(worst[timed, 0], 90) * 1e3)},
            "errors": errors,
            "bounds": {"forward_rel": getattr(self.seam, "forward_rel", self.args.forward_rel),
                       "backward_rel": getattr(self.seam, "backward_rel", self.args.backward_rel)},
        }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=pathlib.Path, default=default_data_dir())
    parser.add_argument("--variants", default=",".join(ALL_VARIANTS))
    parser.add_argument("--seeds", default="1", help="seeds of the plain run (the others use the first)")
    parser.add_argument("--iterations", type=int, default=0, help="0: one pass over the training rows")
    parser.add_argument("--batch", type=int, default=1024, help="global batch")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--forward-rel", type=float, default=1e-2)
    parser.add_argument("--backward-rel", type=float, default=1e-2)
    parser.add_argument("--allreduce-rel", type=float, default=1e-3)
    parser.add_argument("--large-table-weight", type=float, default=2.0, help="adaptive: tables > 1000 rows")
    parser.add_argument("--small-table-weight", type=float, default=0.5, help="adaptive: tables <= 24 rows")
    parser.add_argument("--schedule", type=lambda s: [float(v) for v in s.split(",")], default=[2.0, 1.0, 0.5],
                        help="adaptive: multipliers of the bound in the pass's three thirds")
    parser.add_argument("--eval-every", type=int, default=32, help="iterations between held-out evaluations")
    parser.add_argument("--eval-rows", type=int, default=0, help="held-out rows scored (0: all)")
    parser.add_argument("--check-every", type=int, default=8, help="iterations between error checks")
    parser.add_argument("--skip-first", type=int, default=2, help="iterations left out of the timing")
    parser.add_argument("--link", default="shm", help="what the ranks talk over, for the record")
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--max-auc-drop", type=float, default=None,
                        help="exit 1 if a kompress variant's held-out AUC is more than this below plain's")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    if args.batch % comm.Get_size():
        raise SystemExit(f"dlrm_training: --batch {args.batch} does not divide into {comm.Get_size()} ranks")
    if not (args.data / "dlrm_flights_training").is_dir() and (args.data / "sample.json").is_file():
        print(f"skipped: needs dlrm_flights_training, which only the full data set has; {args.data} is the "
              "repository's sample (set KOMPRESS_DATA_DIR or --data to the full set, ../shared/data)")
        sys.exit(77)   # ctest: skipped
    data = Flights(args.data)
    layout = Layout(comm, len(data.table_rows), args.batch // comm.Get_size())
    layout.table_rows = data.table_rows
    me = comm.Get_rank()

    def log(message):
        if me == 0:
            print(message, flush=True)

    variants = args.variants.split(",")
    for name in variants:
        parse_variant(name, args)
    seeds = [int(s) for s in args.seeds.split(",")]
    log(f"dlrm_training: {layout.p} ranks (tables {layout.groups}), global batch {args.batch}, "
        f"link {args.link}, variants {variants}, plain seeds {seeds}")
    specs = [(v, s) for v in variants for s in (seeds if v == "plain" else seeds[:1])]
    full = data.train.size // args.batch
    iterations = full if args.iterations <= 0 else min(args.iterations, full)
    runs = [Run(v, s, data, layout, args, iterations, log) for v, s in specs]
    start = time.perf_counter()
    for it in range(iterations):
        if args.eval_every and it % args.eval_every == 0 and it > 0:
            for run in runs:
                run.evaluate(it)
        shift = it % len(runs)           # the order rotates every iteration
        for run in runs[shift:] + runs[:shift]:
            run.step(it)
    results = []
    for run in runs:
        run.evaluate(iterations)
        result = run.finish()
        if me == 0:
            result["link"] = args.link
            results.append(result)
            r = result
            log(f"{r['name']:>18} seed {r['seed']}: AUC {r['final']['auc']:.4f} loss {r['final']['log_loss']:.4f} "
                f"fwd {r['bytes_per_iteration']['forward'] / 1e6:.3f} MB bwd {r['bytes_per_iteration']['backward'] / 1e6:.3f} MB "
                f"it {r['ms']['iteration']:.1f} ms (fwd {r['ms']['forward_exchange']:.1f} bwd "
                f"{r['ms']['backward_exchange']:.1f} allreduce {r['ms']['allreduce']:.1f} compute {r['ms']['compute']:.1f}) "
                f"err/bound fwd {max(r['errors']['forward']['error_over_bound']):.3g} "
                f"bwd {max(r['errors']['backward']['error_over_bound']):.3g}")
    log(f"dlrm_training: {len(runs)} runs of {iterations} iterations in lockstep, "
        f"{time.perf_counter() - start:.0f} s; load average {pathlib.Path('/proc/loadavg').read_text().split()[:3]}")
    status = 0
    if me == 0:
        if args.json:
            args.json.write_text(json.dumps({"argv": sys.argv[1:], "iterations": iterations,
                                             "wall_s": time.perf_counter() - start, "results": results}, indent=1))
        plain = [r["final"]["auc"] for r in results if r["variant"] == "plain" and r["seed"] == seeds[0]]
        if args.max_auc_drop is not None:
            if not plain:
                raise SystemExit("dlrm_training: --max-auc-drop needs the plain variant")
            for r in results:
                if r["variant"].startswith("kompress"):
                    drop = plain[0] - r["final"]["auc"]
                    verdict = "ok" if drop <= args.max_auc_drop else "FAILED"
                    log(f"{r['variant']}: held-out AUC {r['final']['auc']:.4f}, plain {plain[0]:.4f} "
                        f"(same seed): drop {drop:+.4f}, allowed {args.max_auc_drop}: {verdict}")
                    if drop > args.max_auc_drop:
                        status = 1
    return comm.bcast(status, root=0)


if __name__ == "__main__":
    sys.exit(main())
