"""The DLRM embedding exchange over a torch.distributed process group (gloo, NCCL, MPI), for
kompress.torch.EmbeddingAllToAll: the message layout and bounds of kompress::dlrm's exchange
(docs/dlrm.md), moved by torch.distributed's all_to_all_single instead of MPI.

One exchange is two all_to_all_single calls: a header per pair of ranks (float64: the sender's
element type, its status, then per segment the length and the bound), and the messages, each
its segments' streams back to back (a segment whose stream would not be smaller than its values
travels raw: exactly the raw size means raw). A rank's own segments are copied exactly. A rank
whose arguments or compression fail sends status -1, so that every rank raises before any
value is written. CUDA tensors (a CUDA build of kompress) are compressed and decoded on their
GPU, on torch's current stream; the messages travel in GPU memory under NCCL, else in host
memory (only the streams are copied over).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

import kompress as _k
from kompress._group_allreduce import (_LARGEST, GroupReport, _comm_device, _compress_or_copy, _decompress_or_copy,
                                       _finite_range, _np_dtype, _relative_to_absolute, _usable)

_DTYPES = {torch.float32: 1.0, torch.float64: 2.0}


def _bound(abs, rel, who, direction):
    if abs is not None and rel is not None:
        raise _k.InvalidArgument(f"{who}: give one of {direction}_abs= and {direction}_rel=, not both")
    kind, value = (1.0, abs) if abs is not None else (2.0, 1e-2 if rel is None else rel)
    value = float(value)
    if not (value >= 0 and math.isfinite(value)):
        raise _k.InvalidArgument(f"{who}: the {direction} bound must be finite and >= 0 (got {value})")
    return kind, value


def _agree(values, group, who, what):
    """Every rank learns whether all ranks passed the same values (MAX of x and of -x)."""
    both = torch.tensor([v for x in values for v in (x, -x)], dtype=torch.float64)
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    pairs = both.view(-1, 2).tolist()
    differing = [w for w, (high, neg_low) in zip(what, pairs) if high != -neg_low]
    if differing:
        raise _k.InvalidArgument(f"{who}: the ranks passed different {', '.join(sorted(set(differing)))}")


class GroupEmbeddingExchange:
    """kompress.EmbeddingExchange's forward and backward on a process group (same arguments)."""

    def __init__(self, tables, local_batch, group, *, forward_abs=None, forward_rel=None, backward_abs=None,
                 backward_rel=None, compress_forward=True, compress_backward=True, table_weights=None,
                 bound_schedule=None, block_size=32):
        who = "kompress.torch.EmbeddingAllToAll"
        self.group = group
        p, me = dist.get_world_size(group), dist.get_rank(group)
        failure = None
        try:
            self.tables = [(int(owner), int(dim)) for owner, dim in tables]
            if any(not 0 <= owner < p or dim <= 0 for owner, dim in self.tables):
                raise _k.InvalidArgument(f"{who}: every table needs an owner rank in [0, {p}) and a dim > 0")
            self.local_batch = int(local_batch)
            if self.local_batch <= 0:
                raise _k.InvalidArgument(f"{who}: local_batch must be > 0 (got {local_batch})")
            self.bounds = {"forward": _bound(forward_abs, forward_rel, who, "forward"),
                           "backward": _bound(backward_abs, backward_rel, who, "backward")}
            self.compress = {"forward": bool(compress_forward), "backward": bool(compress_backward)}
            weights = [1.0] * len(self.tables) if table_weights is None else [float(w) for w in table_weights]
            if len(weights) != len(self.tables) or any(not (w >= 0 and math.isfinite(w)) for w in weights):
                raise _k.InvalidArgument(f"{who}: table_weights needs one finite weight >= 0 per table")
            if bound_schedule is not None and not callable(bound_schedule):
                raise _k.InvalidArgument(f"{who}: bound_schedule must be callable (iteration, table, direction)")
            if int(block_size) not in (32, 64, 128):
                raise _k.InvalidArgument(f"{who}: block_size must be 32, 64 or 128 (got {block_size})")
            self.weights, self.schedule, self.block_size = weights, bound_schedule, int(block_size)
            settings = [float(len(self.tables)), float(self.local_batch), *self.bounds["forward"],
                        *self.bounds["backward"], float(self.compress["forward"]), float(self.compress["backward"]),
                        float(self.block_size)]
            what = ["table count", "local_batch", "forward bound", "forward bound", "backward bound",
                    "backward bound", "compress_forward", "compress_backward", "block_size"]
        except (_k.InvalidArgument, TypeError, ValueError) as error:
            failure = error if isinstance(error, _k.InvalidArgument) else _k.InvalidArgument(f"{who}: {error}")
            settings, what = [0.0], ["arguments"]
        # First whether this rank's arguments passed and how many settings it has (a failed rank
        # has one), then the settings. A failed rank raises its own error, the others the mismatch.
        try:
            _agree([float(len(settings)), -1.0 if failure else 0.0], group, who, ["arguments", "arguments"])
        except _k.InvalidArgument:
            if failure is not None:
                raise failure from None
            raise
        if failure is not None:
            raise failure
        _agree(settings, group, who, what)
        _agree([v for (owner, dim), w in zip(self.tables, self.weights) for v in (owner, dim, w)], group, who,
               ["tables", "tables", "table_weights"] * len(self.tables))
        self.p, self.me = p, me
        self.columns, start = [], 0  # table t's columns in the [batch x total width] layout
        self.local_columns, local = {}, 0
        for t, (owner, dim) in enumerate(self.tables):
            self.columns.append((start, start + dim))
            start += dim
            if owner == me:
                self.local_columns[t] = (local, local + dim)
                local += dim
        self.total_width, self.local_width = start, local
        self.global_batch = p * self.local_batch
        self.iteration = 0

    def rows(self, q):
        return slice(q * self.local_batch, (q + 1) * self.local_batch)

    def run(self, forward: bool, x: torch.Tensor, who: str) -> tuple[torch.Tensor, GroupReport]:
        direction = "forward" if forward else "backward"
        p, me, b = self.p, self.me, self.local_batch
        shape = (self.global_batch, self.local_width) if forward else (b, self.total_width)
        problem = None
        if not _usable(x) or x.dtype not in _DTYPES:
            problem = (f"{who}: takes float32 or float64 tensors in CPU memory, or GPU memory in a CUDA build of "
                       f"kompress (got {x.dtype} on {x.device})")
        elif tuple(x.shape) != shape:
            problem = f"{who}: the {direction} input must be {list(shape)} (got {list(x.shape)})"
        dtype_code = _DTYPES.get(x.dtype, 0.0) if problem is None else -1.0
        comm = _comm_device(self.group, x) if problem is None else torch.device("cpu")
        # Segments this rank sends to q: (table, rows, columns of x), in table order.
        if forward:
            segments = {q: [(t, self.rows(q), self.local_columns[t]) for t in self.local_columns] for q in range(p)}
            incoming = {q: [t for t, (owner, _) in enumerate(self.tables) if owner == q] for q in range(p)}
        else:
            segments = {q: [(t, slice(0, b), self.columns[t]) for t, (owner, _) in enumerate(self.tables)
                            if owner == q] for q in range(p)}
            incoming = {q: list(self.local_columns) for q in range(p)}
        headers = [torch.zeros(2 + 2 * len(segments[q]), dtype=torch.float64) for q in range(p)]
        streams, raw_bytes, failure = [], [0] * p, None
        if problem is None:
            try:
                streams, raw_bytes = self._compress(forward, x, segments, headers)
            except Exception as error:  # noqa: BLE001 (a schedule's own error too: raised after the others learn)
                failure = error
        for q in range(p):
            headers[q][0] = dtype_code
            headers[q][1] = -1.0 if (problem or failure) else 0.0
        send_header = torch.cat(headers).to(comm)
        got_header = torch.empty(sum(2 + 2 * len(incoming[q]) for q in range(p)), dtype=torch.float64, device=comm)
        dist.all_to_all_single(got_header, send_header, [2 + 2 * len(incoming[q]) for q in range(p)],
                               [h.numel() for h in headers], group=self.group)
        got_header = got_header.cpu()
        parts, offset = [], 0
        for q in range(p):
            n = 2 + 2 * len(incoming[q])
            parts.append(got_header[offset:offset + n])
            offset += n
        if problem is not None:
            raise _k.InvalidArgument(problem)
        if failure is not None:
            raise failure
        failed = [q for q in range(p) if parts[q][1] < 0]
        if failed:
            raise _k.PeerError(f"{who}: rank(s) {failed} of the process group failed this {direction} exchange "
                               "(bad arguments or a failed compression); nothing was written")
        if any(parts[q][0] != dtype_code for q in range(p)):
            raise _k.InvalidArgument(f"{who}: the ranks passed different element types "
                                     f"(this rank: {x.dtype}); nothing was written")
        send = torch.cat(streams).to(comm) if streams else torch.empty(0, dtype=torch.uint8, device=comm)
        send_splits = [int(sum(h[2::2].tolist())) for h in headers]
        recv_splits = [int(sum(parts[q][2::2].tolist())) for q in range(p)]
        received = torch.empty(sum(recv_splits), dtype=torch.uint8, device=comm)
        dist.all_to_all_single(received, send, recv_splits, send_splits, group=self.group)
        received = received.to(x.device)

        out = torch.empty((b, self.total_width) if forward else (self.global_batch, self.local_width), dtype=x.dtype,
                          device=x.device)
        report = GroupReport(messages=2 * (p - 1))
        offset = 0
        for q in range(p):
            for i, t in enumerate(incoming[q]):
                length, bound = int(parts[q][2 + 2 * i]), float(parts[q][3 + 2 * i])
                rows = slice(0, b) if forward else self.rows(q)
                cols = self.columns[t] if forward else self.local_columns[t]
                target = out[rows, cols[0]:cols[1]]
                if q == me:  # own segment: exact
                    source_rows = self.rows(me) if forward else slice(0, b)
                    source_cols = self.local_columns[t] if forward else self.columns[t]
                    target.copy_(x[source_rows, source_cols[0]:source_cols[1]])
                    continue
                message = received[offset:offset + length]
                offset += length
                values = torch.empty(target.shape, dtype=x.dtype, device=x.device)
                if _decompress_or_copy(message, values):
                    report.absolute_bound = max(report.absolute_bound, bound)
                target.copy_(values)
        report.wire_bytes = sum(send_splits)
        report.payload_bytes = sum(raw_bytes)
        report.compressed_messages = sum(1 for q in range(p) if send_splits[q] < raw_bytes[q])
        if forward:
            self.iteration += 1
        return out, report

    def _compress(self, forward, x, segments, headers):
        direction = "forward" if forward else "backward"
        kind, value = self.bounds[direction]
        streams, raw_bytes = [], [0] * self.p
        bounds = {}
        for q in range(self.p):
            for i, (t, rows, (c0, c1)) in enumerate(segments[q]):
                block = x[rows, c0:c1]
                if q == self.me:  # own segments are copied, not sent
                    continue
                if t not in bounds or not forward:
                    bounds[t] = self._resolve(kind, value, x[:, c0:c1] if forward else block, t, direction)
                values = block.contiguous().view(-1)
                raw = values.numel() * values.element_size()
                if self.compress[direction]:
                    out = torch.empty(_k.max_compressed_size(values.numel(), _np_dtype(values), self.block_size),
                                      dtype=torch.uint8, device=x.device)
                    stream = out[:_compress_or_copy(values, out, dict(abs=bounds[t], block_size=self.block_size))]
                else:
                    stream = values.view(torch.uint8).clone()
                headers[q][2 + 2 * i] = stream.numel()
                headers[q][3 + 2 * i] = bounds[t] if stream.numel() < raw else 0.0
                streams.append(stream)
                raw_bytes[q] += raw
        return streams, raw_bytes

    def _resolve(self, kind, value, values, t, direction):
        """Table t's absolute bound: ABS as given, or REL against the values it sends (forward: the
        table's pooled values over the global batch; backward: this rank's slice), times its
        weight and the schedule's multiplier."""
        e = value if kind == 1.0 else _relative_to_absolute(value, *_finite_range(values.reshape(-1)))
        factor = self.weights[t]
        if self.schedule is not None:
            # backward belongs to the forward before it, as in C++
            iteration = self.iteration if direction == "forward" else max(self.iteration - 1, 0)
            m = float(self.schedule(iteration, t, direction))
            if not (m >= 0 and math.isfinite(m)):
                raise _k.InvalidArgument(f"bound_schedule returned {m} for table {t} ({direction}): "
                                         "a multiplier must be finite and >= 0")
            factor *= m
        e *= factor
        return e if math.isfinite(e) else _LARGEST
