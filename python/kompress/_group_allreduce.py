"""The compressed allreduce over a torch.distributed process group (gloo, NCCL, MPI), as the
DDP communication hook runs it. docs/python.md, "The DDP communication hook", is the design.

Schedule for p ranks, the bucket cut into p segments (segment s owned by rank s):
  1. agree: one small MAX all_reduce of the value range and of every rank's settings;
  2. reduce-scatter: each rank compresses the p-1 segments it does not own (all_to_all of the
     stream lengths, then all_to_all_single of the streams); the owner decodes them and adds
     them to its own values, exact, in rank order;
  3. allgather: the owner compresses its sum; every rank (the owner too) decodes every sum.
Each value is compressed once on its way in and once on its way out: within (p-1) e + e = p e
of the exact sum, as kompress.allreduce's ring guarantees. Every rank decodes the same streams,
so the replicas stay bit-identical.

The steps run on one worker thread per hook state, in the order the buckets are handed over
(DDP hands them over in the same order on every rank, so the collectives match), while the
backward pass goes on: the hook returns a Future the worker completes.

A CUDA bucket (a CUDA build of kompress) is compressed and decoded on its GPU, on a stream of the
worker's that first waits for the hook's stream; the Future completes once that stream is done.
The messages travel on the group's device: GPU memory under NCCL, host memory otherwise (gloo,
MPI), where only the streams are copied over, never the values.
"""

from __future__ import annotations

import math
import queue
import threading

import numpy as np
import torch
import torch.distributed as dist

import kompress as _k

_DTYPES = {torch.float32: 1.0, torch.float64: 2.0}
_MODES = {"compressed": 1.0, "raw": 2.0, "auto": 3.0}
_REDUCTION_BOUNDS = {"per_hop": 1.0, "total": 2.0}
_LARGEST = np.finfo(np.float64).max


class GroupReport:
    """What one bucket's allreduce did on this rank (the fields of kompress.Report).

    payload_bytes: the bytes this rank's messages would carry uncompressed; wire_bytes: those
    it sent (streams, with the allgather's padding to the longest stream); absolute_bound:
    the guarantee on each averaged value."""

    __slots__ = ("payload_bytes", "wire_bytes", "messages", "compressed_messages", "absolute_bound")

    def __init__(self, payload_bytes=0, wire_bytes=0, messages=0, compressed_messages=0, absolute_bound=0.0):
        self.payload_bytes, self.wire_bytes = payload_bytes, wire_bytes
        self.messages, self.compressed_messages, self.absolute_bound = messages, compressed_messages, absolute_bound

    @property
    def ratio(self) -> float:
        return self.payload_bytes / self.wire_bytes if self.wire_bytes else 1.0

    @property
    def sent_raw(self) -> bool:
        return self.compressed_messages == 0

    def __repr__(self):
        return (f"GroupReport(payload_bytes={self.payload_bytes}, wire_bytes={self.wire_bytes}, "
                f"messages={self.messages}, compressed_messages={self.compressed_messages}, "
                f"absolute_bound={self.absolute_bound:g})")


def _finite_range(values: torch.Tensor):
    """(min, max) of the finite values, as floats; (inf, -inf) when there are none."""
    if values.numel() == 0:
        return math.inf, -math.inf
    lo, hi = torch.aminmax(values)
    lo, hi = float(lo), float(hi)
    if math.isfinite(lo) and math.isfinite(hi):
        return lo, hi
    finite = values[torch.isfinite(values)]
    if finite.numel() == 0:
        return math.inf, -math.inf
    lo, hi = torch.aminmax(finite)
    return float(lo), float(hi)


def _relative_to_absolute(fraction: float, lo: float, hi: float) -> float:
    """kompress's REL resolution (codec/quantizer.hpp): fraction * (hi - lo), never infinite, 0
    when no finite value was seen; a range beyond a double is taken in halves, rounded down."""
    if not lo <= hi:
        return 0.0
    span = hi - lo
    if math.isfinite(span):
        e = fraction * span
    else:
        e = 2.0 * (fraction * (hi * 0.5 - lo * 0.5) * (1.0 - 2.0 ** -50))
    return e if math.isfinite(e) else _LARGEST


def _usable(t: torch.Tensor) -> bool:
    return t.device.type == "cpu" or (t.device.type == "cuda" and _k.cuda_enabled)


def _comm_device(group, values: torch.Tensor) -> torch.device:
    """Where the group's collectives take tensors: the GPU under NCCL, else the host."""
    if values.device.type == "cuda" and dist.get_backend(group) == "nccl":
        return values.device
    return torch.device("cpu")


def _segments(count: int, p: int):
    return [(s * count // p, (s + 1) * count // p) for s in range(p)]


class GroupAllreduce:
    """Sums float buckets over a process group with the schedule above, on a worker thread."""

    def __init__(self, group):
        self.group = group
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()
        self._streams = {}  # device -> the worker's CUDA stream there (one: the jobs run in turn)

    def submit(self, job, device=None) -> torch.futures.Future:
        """Runs job() on the worker thread after the jobs submitted before it; the Future holds its
        result or its exception. With a CUDA ``device``, job() runs on a worker stream that waits
        for the caller's current stream there, and the Future completes when it has run."""
        if device is not None and device.type == "cuda":
            job = self._on_worker_stream(job, device)
        future = torch.futures.Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="kompress-group-allreduce", daemon=True)
                self._thread.start()
        self._jobs.put((job, future))
        return future

    def _work(self):
        while True:
            job, future = self._jobs.get()
            result = None
            try:
                result = job()
            except BaseException as error:  # noqa: BLE001 (handed to the waiting DDP)
                future.set_exception(error)
            else:
                future.set_result(result)
            del job, future, result  # nothing of a finished bucket stays alive here

    def _on_worker_stream(self, job, device):
        """job, to run on the worker's stream on ``device`` after the work the caller has queued on
        its current stream there (the bucket's gradients); returns once that stream has run it."""
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(device))

        def run():
            stream = self._streams.get(device)
            if stream is None:
                stream = self._streams[device] = torch.cuda.Stream(device)
            stream.wait_event(ready)
            with torch.cuda.stream(stream):
                result = job()
            stream.synchronize()
            return result

        return run

    # --- one bucket -----------------------------------------------------------------------
    def allreduce(self, flat: torch.Tensor, *, abs, rel, mode, reduction_bound, block_size, cost, who):
        """Sums ``flat`` (float32/64, contiguous; CPU, or a GPU in a CUDA build) over the group in
        place; returns a GroupReport.
        Every rank must pass the same settings and count: a mismatch, or a bucket that is not
        float32/float64 on any rank, raises InvalidArgument on every rank."""
        group = self.group
        p, me = dist.get_world_size(group), dist.get_rank(group)
        dtype_code = _DTYPES.get(flat.dtype, 0.0) if _usable(flat) else 0.0
        comm = _comm_device(group, flat) if dtype_code else torch.device("cpu")
        bound_kind, bound_value = (1.0, float(abs)) if abs is not None else (2.0, float(rel)) if rel is not None \
            else (0.0, 0.0)
        lo, hi = _finite_range(flat) if dtype_code and bound_kind == 2.0 else (math.inf, -math.inf)
        count = float(flat.numel())
        item_bytes = flat.element_size()
        compress_here = mode == "compressed" or (mode == "auto" and cost.worth_compressing(flat.numel() * item_bytes))
        # MAX of x and of -x: every rank learns whether all ranks passed the same x.
        settings = [dtype_code, bound_kind, bound_value, _MODES[mode], _REDUCTION_BOUNDS[reduction_bound],
                    float(block_size), count, float(compress_here)]
        agreed = torch.tensor([hi, -lo] + [v for x in settings for v in (x, -x)], dtype=torch.float64, device=comm)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        hi, lo = float(agreed[0]), -float(agreed[1])
        pairs = agreed[2:].view(-1, 2)
        if float(pairs[0, 1]) == 0.0:  # some rank's code is 0
            whose = "this rank's" if not dtype_code else "another rank's"
            raise _k.InvalidArgument(f"{who}: every bucket must hold float32 or float64 values in CPU memory, or GPU "
                                     f"memory in a CUDA build of kompress ({whose} is not; this rank's: "
                                     f"{flat.dtype} on {flat.device})")
        names = ["element type", "bound kind", "bound", "mode", "reduction_bound", "block_size", "count",
                 "automatic mode's decision"]
        differing = [name for name, (high, neg_low) in zip(names, pairs.tolist()) if high != -neg_low]
        if differing:
            raise _k.InvalidArgument(f"{who}: the ranks passed different {', '.join(differing)} "
                                     f"(every rank must pass the same; DDP's buckets must match)")
        if p == 1:
            return GroupReport()
        if not compress_here:
            staged = flat.to(comm)
            dist.all_reduce(staged, group=group)
            if staged.data_ptr() != flat.data_ptr():
                flat.copy_(staged)
            raw = flat.numel() * item_bytes * 2 * (p - 1) // p
            return GroupReport(raw, raw, 2 * (p - 1), 0, 0.0)

        e = bound_value if bound_kind == 1.0 else _relative_to_absolute(bound_value, lo, hi) if bound_kind else 0.0
        hop = e / p if reduction_bound == "total" else e
        segments = _segments(flat.numel(), p)
        report = GroupReport(absolute_bound=p * hop)
        kw = dict(abs=hop, block_size=block_size)

        # Reduce-scatter: the segments this rank does not own, compressed back to back, one
        # stream per owner. A rank whose step fails sends -1 lengths, and every rank raises.
        dtype = _np_dtype(flat)
        own_a, own_b = segments[me]
        send = torch.empty(sum(_k.max_compressed_size(b - a, dtype, block_size)
                               for s, (a, b) in enumerate(segments) if s != me), dtype=torch.uint8, device=flat.device)
        lengths = torch.zeros(p, dtype=torch.int64)
        failure = None
        compressed = 0
        try:
            offset = 0
            for s, (a, b) in enumerate(segments):
                if s != me:
                    lengths[s] = _compress_or_copy(flat[a:b], send[offset:], kw)
                    compressed += int(lengths[s]) < (b - a) * item_bytes
                    offset += int(lengths[s])
        except _k.Error as error:
            failure, offset = error, 0
            lengths.fill_(-1)
            lengths[me] = 0
        incoming = torch.empty(p, dtype=torch.int64, device=comm)
        dist.all_to_all_single(incoming, lengths.to(comm), group=group)
        incoming = incoming.cpu()
        _raise_if_failed(failure, incoming, who, "compressing its segments")
        streams = torch.empty(int(incoming.sum()), dtype=torch.uint8, device=comm)
        dist.all_to_all_single(streams, send[:offset].to(comm), incoming.tolist(), lengths.tolist(), group=group)
        streams = streams.to(flat.device)

        mine = torch.empty(_k.max_compressed_size(own_b - own_a, dtype, block_size), dtype=torch.uint8,
                           device=flat.device)
        try:
            partial, received, offset = None, torch.empty(own_b - own_a, dtype=flat.dtype, device=flat.device), 0
            for q in range(p):  # in rank order, the owner's own values exact
                if q == me:
                    part = flat[own_a:own_b]
                else:
                    n = int(incoming[q])
                    _decompress_or_copy(streams[offset:offset + n], received)
                    part = received
                    offset += n
                partial = part.clone() if partial is None else partial.add_(part)
            # Allgather: the owner's sum, compressed once, decoded by every rank.
            length = _compress_or_copy(partial, mine, kw)
        except _k.Error as error:
            failure, length = error, -1
        all_lengths = torch.empty(p, dtype=torch.int64, device=comm)
        _all_gather(all_lengths, torch.tensor([length], dtype=torch.int64, device=comm), group)
        all_lengths = all_lengths.cpu()
        _raise_if_failed(failure, all_lengths, who, "reducing its segment")
        longest = int(all_lengths.max())
        padded = torch.zeros(longest, dtype=torch.uint8, device=comm)
        padded[:length] = mine[:length]
        gathered = torch.empty(p * longest, dtype=torch.uint8, device=comm)
        _all_gather(gathered, padded, group)
        gathered = gathered.to(flat.device)
        for s, (a, b) in enumerate(segments):
            _decompress_or_copy(gathered[s * longest:s * longest + int(all_lengths[s])], flat[a:b])

        own = own_b - own_a
        report.payload_bytes = (flat.numel() - own + (p - 1) * own) * item_bytes
        report.wire_bytes = int(lengths.sum()) + (p - 1) * longest
        report.messages = 2 * (p - 1)
        report.compressed_messages = compressed + (p - 1) * (length < own * item_bytes)
        return report


def _compress_or_copy(values: torch.Tensor, out: torch.Tensor, options) -> int:
    """The stream of ``values`` in ``out``, or, where it would not be smaller than the values, the
    values' bytes: the receiver tells by the length (exactly the raw size means raw), the wire
    rule of kompress's collectives."""
    raw = values.numel() * values.element_size()
    length = _k.compress_into(values, out, **options)
    if length < raw:
        return length
    out[:raw] = values.view(torch.uint8)
    return raw


def _decompress_or_copy(message: torch.Tensor, out: torch.Tensor) -> bool:
    """Decodes what _compress_or_copy wrote into ``out`` (contiguous, of the values' count);
    returns whether it was a stream."""
    if message.numel() == out.numel() * out.element_size():
        out.view(-1).view(torch.uint8).copy_(message)
        return False
    _k.decompress(message, out=out)
    return True


# torch 2.9 renamed all_gather_into_tensor (the older name warns).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _all_gather(out: torch.Tensor, value: torch.Tensor, group) -> None:
    _all_gather_single(out, value, group=group)


def _raise_if_failed(failure, lengths: torch.Tensor, who: str, step: str):
    if failure is not None:
        raise failure
    failed = [q for q, n in enumerate(lengths.tolist()) if n < 0]
    if failed:
        raise _k.PeerError(f"{who}: rank(s) {failed} of the process group failed {step}; nothing was "
                           f"reduced on this rank (the bucket holds this rank's values, divided by the world size)")


def _np_dtype(t: torch.Tensor):
    return np.float32 if t.dtype == torch.float32 else np.float64
