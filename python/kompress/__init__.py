"""kompress: error-bounded lossy compression of float32/float64 arrays, and compressed MPI
collectives, for numpy arrays and torch tensors (CUDA tensors where the extension was built
against a CUDA-enabled Kokkos: ``kompress.cuda_enabled``).

Every decompressed value x' of an input x satisfies |x - x'| <= the stream's absolute bound:
``abs=e`` asks for e, ``rel=f`` for f * (max - min) of the array's finite values; neither is
lossless. docs/python.md is the guide; kompress.torch holds the PyTorch integrations.

Arrays are taken without a copy (DLPack / the buffer protocol) and must be C-contiguous:
a strided array or tensor is rejected with InvalidArgument, never copied behind your back.
A CUDA tensor's work runs on the tensor's device, on torch's current stream there. Every call
that compresses or communicates releases the GIL (a CPU compression of under 16 KiB keeps it:
microseconds of work).
"""

from __future__ import annotations

import atexit as _atexit
import operator as _operator
import os as _os
import sys as _sys
import weakref as _weakref

import numpy as _np

from . import _kompress as _ext
from ._kompress import (  # noqa: F401  (re-exported)
    BudgetExceeded,
    CostModel,
    Error,
    FormatError,
    InvalidArgument,
    InvalidHandle,
    MPIError,
    PeerError,
    Report,
    ResourceError,
    Request,
    StashEntryInfo,
    StashHandle,
    StashStats,
    StreamInfo,
)

__all__ = [
    "compress", "compress_into", "decompress", "inspect", "max_compressed_size",
    "alltoall", "ialltoall", "alltoallv", "ialltoallv", "allreduce", "iallreduce",
    "allgather", "iallgather", "reduce_scatter", "ireduce_scatter",
    "alltoall_init", "alltoallv_init", "allreduce_init", "allgather_init", "reduce_scatter_init", "PersistentRequest",
    "NodeGroups", "measure_cost_model", "Stash", "EmbeddingExchange",
    "Error", "InvalidArgument", "FormatError", "BudgetExceeded", "InvalidHandle", "ResourceError", "MPIError",
    "PeerError",
    "Report", "Request", "StreamInfo", "CostModel", "StashStats", "StashEntryInfo", "StashHandle",
    "cuda_enabled", "cuda_device",
]

#: Whether this extension was built against a CUDA-enabled Kokkos (and takes CUDA tensors).
cuda_enabled: bool = bool(_ext.cuda_enabled)

# --- Kokkos: initialised here unless the host program did, finalised at exit ----------------
# Objects that hold Kokkos memory (stashes, exchanges, persistent requests) are closed first,
# whatever Python still references at exit: a View must never outlive Kokkos.
_closables: "_weakref.WeakSet" = _weakref.WeakSet()


def _kokkos_threads() -> int:
    """KOMPRESS_NUM_THREADS, else 0: Kokkos's OpenMP default (OMP_NUM_THREADS when set)."""
    value = _os.environ.get("KOMPRESS_NUM_THREADS", "")
    return int(value) if value.strip() else 0


def _finalize() -> None:
    # Whatever still holds Kokkos memory: stashes, exchanges and persistent requests are
    # closed; a nonblocking request Python still references keeps Kokkos from being finalised
    # (the process is ending: leaving Kokkos up is harmless, freeing a View after finalize would
    # abort).
    import gc
    gc.collect()
    for obj in list(_closables):
        obj.close()
    _ext._finalize_kokkos()


def _cuda_device_id() -> int:
    """The GPU a CUDA build runs on: KOMPRESS_CUDA_DEVICE; else torch's current device, when
    torch has initialised CUDA already (torch.cuda.set_device before importing kompress); else
    LOCAL_RANK (torchrun's one GPU per local rank); else -1, Kokkos's choice (by the MPI
    launcher's local rank, else the first GPU)."""
    value = _os.environ.get("KOMPRESS_CUDA_DEVICE", "").strip()
    if value:
        return int(value)
    torch = _sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    value = _os.environ.get("LOCAL_RANK", "").strip()
    return int(value) if value else -1


if _ext._initialize_kokkos(_kokkos_threads(), _cuda_device_id() if cuda_enabled else -1):
    _atexit.register(_finalize)

#: The CUDA device index kompress runs on (a CUDA build), else None. CUDA tensors must be there.
cuda_device = _ext._cuda_device()


# --- arrays -----------------------------------------------------------------------------------

def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _is_cuda(x) -> bool:
    """A CUDA torch tensor (numpy arrays have no is_cuda: the check costs little for them)."""
    return getattr(x, "is_cuda", False) is True


def _stream_of(*arrays) -> int:
    """The handle of torch's current CUDA stream on the first CUDA tensor's device, else 0:
    the extension runs a CUDA array's work on it."""
    for x in arrays:
        if _is_cuda(x):
            import torch
            return torch.cuda.current_stream(x.device).cuda_stream
    return 0


def _host(x, who: str):
    """x as something the extension takes: torch tensors detached (DLPack refuses tensors that
    require grad; the memory is the same), bytes as a read-only uint8 array. CUDA tensors go
    through DLPack as they are where the extension takes them (cuda_enabled)."""
    if type(x) is _np.ndarray:  # the common case first: small calls feel every check
        return x
    if isinstance(x, (bytes, bytearray, memoryview)):
        return _np.frombuffer(x, dtype=_np.uint8)
    if _is_torch(x):
        if x.device.type != "cpu":
            if x.device.type == "cuda" and cuda_enabled:
                return x.detach()
            raise InvalidArgument(
                f"{who}: got a tensor on {x.device}, but this kompress extension takes CPU tensors only "
                + ("(it was built without CUDA; build it against a CUDA-enabled Kokkos: docs/python.md, "
                   "\"Building for GPUs\")" if x.device.type == "cuda" else "and CUDA tensors"))
        x = x.detach()
        try:
            return x.numpy()  # the same memory; 1-2 us where __dlpack__ takes 8 (4 KiB calls)
        except (TypeError, RuntimeError):  # dtypes numpy lacks (bfloat16): DLPack, then the checks
            return x
    return x


class _NoTorch:
    """Stands for torch.Tensor until the program has imported torch: nothing is an instance."""


#: torch.Tensor and torch's C-level to_dlpack once the program has imported torch (kompress
#: itself never does), looked up once: _arg is on every small call's path.
_Tensor, _to_dlpack = _NoTorch, None


def _arg(x, who):
    """x as one argument of one extension call: as _host, but a CPU tensor as a DLPack capsule,
    which that call consumes (never pass the result twice). torch's C-level to_dlpack is a fifth
    of ``x.detach().numpy()``'s cost, and passes dtypes numpy lacks on to the extension's checks.
    Only CUDA tensors, and CPU tensors DLPack refuses, come back as tensors."""
    global _Tensor, _to_dlpack
    if type(x) is _np.ndarray:
        return x
    if _to_dlpack is None and "torch" in _sys.modules:
        import torch
        _Tensor, _to_dlpack = torch.Tensor, torch.utils.dlpack.to_dlpack
    if isinstance(x, _Tensor) and x.is_cpu:
        try:
            return _to_dlpack(x)
        except (RuntimeError, TypeError, BufferError):  # sparse or conjugated tensors: as _host says
            pass
    return _host(x, who)


def _bound_args(abs, rel):
    return (None if abs is None else float(abs)), (None if rel is None else float(rel))


def _dtype_of(x):
    if _is_torch(x):
        import torch
        return {torch.float32: _np.float32, torch.float64: _np.float64}.get(x.dtype)
    return getattr(x, "dtype", None)


# --- codec ------------------------------------------------------------------------------------

def max_compressed_size(count: int, dtype=_np.float32, block_size: int = 32, codec: str = "fast") -> int:
    """The largest stream ``compress`` can write for ``count`` values of ``dtype``."""
    return _ext.max_compressed_size(int(count), _np.dtype(dtype).itemsize, int(block_size), str(codec))


_seed_end = 1 << 64


def _seed(value, who):
    """A rounding seed: an int in [0, 2^64) (TypeError for a non-int, InvalidArgument out of range)."""
    if type(value) is int and 0 <= value < _seed_end:  # the common case, without the checks' calls
        return value
    value = _integer(value, who, "rounding_seed")
    if not 0 <= value < _seed_end:
        raise InvalidArgument(f"{who}: rounding_seed must be in [0, 2^64) (got {value})")
    return value


def compress(x, *, abs: float | None = None, rel: float | None = None, fill_value: float | None = None,
             block_size: int = 32, codec: str = "fast", rounding: str = "nearest",
             rounding_seed: int = 0) -> _np.ndarray:
    """Compresses a float32/float64 array or CPU tensor of any shape (values in C order).

    Returns the stream as a new uint8 numpy array (a CUDA tensor's: a uint8 tensor on its device,
    written on torch's current stream, which this call waits for). Bound: ``abs=e`` (|x - x'| <= e), ``rel=f``
    (e = f * (max - min)) or neither (lossless). Values bit-identical to ``fill_value`` come back
    exactly and stay out of the relative bound's range. ``codec="fast"`` (the default) is the
    fastest; ``codec="ratio"`` writes format 1.2 streams, about twice smaller on smooth fields
    and several times slower, and predicts across the array's last two axes (2-D / 3-D Lorenzo),
    so pass fields in their natural shape (``block_size`` does not apply to it).
    ``rounding="stochastic"`` rounds each value up or down with the probability that makes the
    decoded value's expectation the input (E[x'] = x), within the same bound, for about a bit
    more per value; ``"nearest"`` (the default) is deterministic. The dither is a hash of each
    value's index and ``rounding_seed`` (an int in [0, 2^64)): the same seed writes the same
    bytes. Releases the GIL (CPU inputs of 16 KiB and more); blocks until done.
    """
    # The keywords go to the extension as given, which converts them with float(), int() and
    # str(), and a CPU tensor becomes a DLPack capsule here rather than in _arg: a small
    # compression feels every call of the Python layer (docs/performance.md, "Call overhead").
    if type(x) is not _np.ndarray:
        if type(x) is _Tensor and x.is_cpu:
            try:
                x = _to_dlpack(x)
            except (RuntimeError, TypeError, BufferError):
                x = _host(x, "kompress.compress")
        else:
            x = _arg(x, "kompress.compress")
            if isinstance(x, _Tensor) and x.is_cuda:
                return _compress_cuda(x, abs, rel, fill_value, block_size, codec, rounding, rounding_seed)
    return _ext.compress(x, abs, rel, fill_value, block_size, codec, rounding, rounding_seed)


def _compress_cuda(x, abs, rel, fill_value, block_size, codec, rounding, rounding_seed):
    """compress for a CUDA tensor (as _arg returns it): the stream as a uint8 tensor on its
    device, of its length."""
    import torch
    out = torch.empty(max_compressed_size(x.numel(), _dtype_of(x) or _np.float32, block_size, codec),
                      dtype=torch.uint8, device=x.device)
    length = _ext.compress_into(x, out, abs, rel, fill_value, block_size, codec, rounding, rounding_seed,
                                _stream_of(x))
    return out[:length].clone()


def compress_into(x, out, *, abs: float | None = None, rel: float | None = None,
                  fill_value: float | None = None, block_size: int = 32, codec: str = "fast",
                  rounding: str = "nearest", rounding_seed: int = 0) -> int:
    """Compresses into ``out`` (a uint8 array of at least max_compressed_size bytes, for the same
    codec, on the same device as ``x``); returns the stream's length (the stream is
    ``out[:length]``). No allocation. Options as ``compress``."""
    who = "kompress.compress_into"
    stream = 0
    if type(x) is not _np.ndarray:
        if type(x) is _Tensor and x.is_cpu:  # as in compress: the common tensor without _arg's call
            try:
                x = _to_dlpack(x)
            except (RuntimeError, TypeError, BufferError):
                x = _host(x, who)
        else:
            x = _arg(x, who)
            if isinstance(x, _Tensor):
                stream = _stream_of(x)
    if type(out) is not _np.ndarray:
        out = _arg(out, who)
    return _ext.compress_into(x, out, abs, rel, fill_value, block_size, codec, rounding, rounding_seed, stream)


def inspect(stream) -> StreamInfo:
    """The stream's header, checked (checksums included); raises FormatError if malformed."""
    return _ext.inspect(_host(stream, "kompress.inspect"))


def decompress(stream, out=None, *, max_output_bytes: int | None = None):
    """Decompresses a stream. Without ``out``: a new one-dimensional numpy array of the
    stream's dtype and count, on the stream's device (a stream records its element count, not a
    shape: reshape it, or pass ``out``); ``max_output_bytes`` caps that array (a well-formed stream can decode to some
    1560 times its size: set it for streams from outside), a larger one is a ResourceError
    before anything is allocated. With ``out`` (a C-contiguous array or CPU tensor of the
    stream's dtype and count, any shape, on any device: a stream from another device is copied
    there first): decodes into it and returns it. Raises FormatError for
    a corrupted or truncated stream (``out`` is then left untouched) and InvalidArgument for a
    wrong ``out``."""
    who = "kompress.decompress"
    stream = _host(stream, who)
    if out is None:
        info = _ext.inspect(stream)
        needed = info.count * _np.dtype(info.dtype).itemsize
        if max_output_bytes is not None and needed > max_output_bytes:
            error = ResourceError(f"{who}: the stream decodes to {needed} bytes, more than max_output_bytes "
                                  f"({max_output_bytes}); nothing was allocated")
            error.requested_bytes = needed
            raise error
        try:
            if _is_cuda(stream):
                import torch
                out = torch.empty(info.count, dtype=getattr(torch, info.dtype), device=stream.device)
            else:
                out = _np.empty(info.count, dtype=info.dtype)
        except (MemoryError, RuntimeError):
            error = ResourceError(f"{who}: could not allocate {needed} bytes for the decoded values")
            error.requested_bytes = needed
            raise error from None
        _ext.decompress_into(stream, out, _stream_of(out))
        return out
    target = _arg(out, who)
    _ext.decompress_into(_on_device_of(stream, target), target, _stream_of(target))
    return out


def _on_device_of(stream, target):
    """The stream's bytes where ``target`` lives: a stream is a few bytes per value, so a CUDA
    stream decoding into host memory (or the reverse) is copied over, not the values."""
    if _is_cuda(stream) == _is_cuda(target):
        return stream
    import torch
    if _is_cuda(target):
        return torch.as_tensor(stream).to(target.device)
    return stream.cpu().numpy()


# --- collectives --------------------------------------------------------------------------
# Every kompress collective starts with an agreement in which each rank says whether its checks
# of the arguments passed, so that a bad argument on one rank is an error on every rank and the
# next call matches on every rank. The checks made here and in the extension before the C++ call
# take part in it too: when one fails on this rank, the rank joins the agreement the other
# ranks' call runs as a failed one (_ext._announce_failure), then raises its own error.

def _world_handle():
    from mpi4py import MPI
    return MPI.COMM_WORLD.handle


def _comm_handle(comm, who):
    if isinstance(comm, NodeGroups):
        raise InvalidArgument(f"{who}: NodeGroups are taken by the blocking allreduce, reduce_scatter and "
                              "allgather only; pass an mpi4py communicator (for example the groups' .comm)")
    if comm is None:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    handle = getattr(comm, "handle", None)
    if not isinstance(handle, int):
        raise InvalidArgument(f"{who}: comm must be an mpi4py communicator (got {type(comm).__name__})")
    return handle


def _handle_on_every_rank(comm, who):
    """comm's handle. When comm is not a communicator at all, the failure is announced on
    COMM_WORLD (the default communicator, where the other ranks are unless they named another)
    before it is raised."""
    try:
        return _comm_handle(comm, who)
    except InvalidArgument:
        _ext._announce_failure(_world_handle(), who)
        raise


def _raise_on_every_rank(error, comm, who):
    """Raises ``error``, a check of a collective's arguments that failed on this rank, after
    announcing it to the agreement the other ranks' call runs on comm (they raise too)."""
    _ext._announce_failure(_handle_on_every_rank(comm, who), who)
    raise error


def _agreed(who, comm, prepare):
    """comm's handle and ``prepare()``, which converts and checks this rank's arguments; a
    failure of either is announced to the other ranks' agreement before it is raised."""
    handle = _handle_on_every_rank(comm, who)
    try:
        return handle, prepare()
    except BaseException:
        _ext._announce_failure(handle, who)
        raise


def _settings(abs, rel, mode, reduction_bound, block_size, measure_error, cost, reduction="recompress",
              schedule="auto", window=0):
    return _ext._CollectiveSettings(*_bound_args(abs, rel), str(mode), str(reduction_bound), str(reduction),
                                    str(schedule), int(block_size), bool(measure_error), cost, _window(window))


def _exchange_settings(abs, rel, mode, block_size, measure_error, cost, window):
    """alltoall(v)'s settings for _settings: no reduction, so no reduction bound or schedule."""
    return (abs, rel, mode, "per_hop", block_size, measure_error, cost, "recompress", "auto", window)


def _window(window):
    """alltoall's ``window`` as the extension takes it; InvalidArgument unless an int >= 0."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise InvalidArgument(f"kompress: window must be an int >= 0 (peers whose messages a rank expects at "
                              f"once; 0: all), got {window!r}")
    return window


def _buffer_collective(call, who, send, recv, comm, settings, *flags):
    """``call(send, recv, comm handle, settings, *flags)`` on the converted arrays, with every
    argument check made on every rank (_agreed, inline: small calls feel every microsecond; the
    extension does the same for its own checks)."""
    handle = _handle_on_every_rank(comm, who)
    try:
        send, recv, options = _arg(send, who), _arg(recv, who), _settings(*settings)
    except BaseException:
        _ext._announce_failure(handle, who)
        raise
    return call(send, recv, handle, options, *flags, _stream_of(send, recv))


def _vector_collective(call, who, send, counts, recv, comm, settings, *flags):
    """alltoallv's form of _buffer_collective: counts and displacements as lists of ints."""
    handle = _handle_on_every_rank(comm, who)
    try:
        send, recv, options = _arg(send, who), _arg(recv, who), _settings(*settings)
        send_counts, send_displs, recv_counts, recv_displs = (_counts(c) for c in counts)
    except BaseException:
        _ext._announce_failure(handle, who)
        raise
    return call(send, send_counts, send_displs, recv, recv_counts, recv_displs, handle, options, *flags,
                _stream_of(send, recv))


_collective_doc = """
    Bound options as in C++ (kompress::collective_options): ``abs=`` or ``rel=`` (default
    rel=1e-3), ``mode`` 'compressed' | 'raw' | 'auto' (auto: compress only where ``cost``, a
    CostModel, says it pays), ``block_size``, ``measure_error`` (report the largest error of what
    this rank sent). Arrays: C-contiguous float32/float64 numpy arrays or tensors of one dtype,
    on one device (CUDA tensors go to MPI directly under a CUDA-aware MPI, else through pinned
    host staging: docs/collectives.md). ``comm``: an mpi4py communicator (default COMM_WORLD).
    Collective: every rank of ``comm`` must call it, with the same options; an argument this rank
    rejects is an error on every rank (the others raise InvalidArgument naming this rank), and the
    next call works. The GIL is released while it runs.
"""


def alltoall(send, recv, comm=None, *, abs=None, rel=None, mode="compressed", block_size=32,
             measure_error=False, cost=None, window=0) -> Report:
    """MPI_Alltoall, compressed: block i of ``send`` (send.size / p values) goes to rank i;
    block j of ``recv`` comes from rank j. Blocks until ``recv`` holds the result. ``window``:
    how many peers' messages this rank expects at once (0: all; docs/collectives.md, "alltoall
    and alltoallv"); ranks may pass different windows."""
    return _buffer_collective(_ext._alltoall, "kompress.alltoall", send, recv, comm,
                              _exchange_settings(abs, rel, mode, block_size, measure_error, cost, window), False)


def ialltoall(send, recv, comm=None, *, abs=None, rel=None, mode="compressed", block_size=32,
              measure_error=False, cost=None, window=0) -> Request:
    """Nonblocking alltoall: returns a Request; ``recv`` holds the result once ``wait()``
    returned (or ``test()`` returned True). The request keeps both arrays alive."""
    return _buffer_collective(_ext._alltoall, "kompress.ialltoall", send, recv, comm,
                              _exchange_settings(abs, rel, mode, block_size, measure_error, cost, window), True)


def _counts(values):
    return [int(v) for v in values]


def _index(value, who):
    """An int the extension's 64-bit parameters take; InvalidArgument otherwise."""
    value = int(value)
    if not -(1 << 63) <= value < (1 << 63):
        raise InvalidArgument(f"{who}: {value} is out of range")
    return value


def _integer(value, who, name):
    """``value`` as an int where it is one (operator.index: no float or str); TypeError otherwise."""
    try:
        return _operator.index(value)
    except TypeError:
        raise TypeError(f"{who}: {name} must be an int (got {type(value).__name__})") from None


def _real(value, who, name):
    """``value`` as a float where it is a number (not a str); TypeError otherwise."""
    try:
        if not isinstance(value, (str, bytes)):
            return float(value)
    except (TypeError, ValueError):
        pass
    raise TypeError(f"{who}: {name} must be a number (got {type(value).__name__})")


def alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, comm=None, *, abs=None, rel=None,
              mode="compressed", block_size=32, measure_error=False, cost=None, window=0) -> Report:
    """MPI_Alltoallv, compressed: counts and displacements in elements, one per rank; ``window``
    as in ``alltoall``."""
    return _vector_collective(_ext._alltoallv, "kompress.alltoallv", send,
                              (send_counts, send_displs, recv_counts, recv_displs), recv, comm,
                              _exchange_settings(abs, rel, mode, block_size, measure_error, cost, window), False)


def ialltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs, comm=None, *, abs=None, rel=None,
               mode="compressed", block_size=32, measure_error=False, cost=None, window=0) -> Request:
    """Nonblocking alltoallv; see ialltoall."""
    return _vector_collective(_ext._alltoallv, "kompress.ialltoallv", send,
                              (send_counts, send_displs, recv_counts, recv_displs), recv, comm,
                              _exchange_settings(abs, rel, mode, block_size, measure_error, cost, window), True)


class NodeGroups:
    """The ranks of ``comm`` (default COMM_WORLD) grouped by node (kompress::node_groups): those
    that share memory (MPI_COMM_TYPE_SHARED), or runs of ``ranks_per_node`` consecutive ranks.
    Collective: every rank of ``comm`` builds it, with the same arguments. Passed to ``allreduce``,
    ``reduce_scatter`` or ``allgather`` as its communicator, values move raw within each node and
    compressed only across nodes: a sum within ``nodes`` times the bound instead of p times
    (docs/collectives.md, "Hierarchical collectives"); groups whose nodes differ in size make
    them the flat collectives. The groups keep the collectives' scratch between calls
    (``workspace_bytes``)."""

    def __init__(self, comm=None, ranks_per_node=None):
        who = "kompress.NodeGroups"
        if comm is None:
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
        handle = _handle_on_every_rank(comm, who)
        if ranks_per_node is not None and (isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int)):
            _ext._announce_failure(handle, who)
            raise InvalidArgument(f"{who}: ranks_per_node must be an int or None (got {type(ranks_per_node).__name__})")
        #: The mpi4py communicator the groups were split from (kept alive with them).
        self.comm = comm
        self._groups = _ext._NodeGroups(handle, ranks_per_node is None,
                                        0 if ranks_per_node is None else ranks_per_node)
        # The hierarchical collectives' scratch, kept between calls (kompress::hierarchical_workspace).
        self._workspace = _ext._HierarchicalWorkspace(self._groups)

    @property
    def nodes(self) -> int:
        """Number of nodes."""
        return self._groups.nodes

    @property
    def ranks_per_node(self) -> int:
        """Ranks on every node (on the largest where they differ)."""
        return self._groups.ranks_per_node

    @property
    def uniform(self) -> bool:
        """Whether every node holds the same number of ranks."""
        return self._groups.uniform

    @property
    def workspace_bytes(self) -> int:
        """Bytes of scratch the hierarchical collectives keep between calls over these groups."""
        return self._workspace.bytes

    def __repr__(self) -> str:
        return f"NodeGroups(nodes={self.nodes}, ranks_per_node={self.ranks_per_node}, uniform={self.uniform})"


def allreduce(send, recv, comm=None, *, abs=None, rel=None, mode="compressed", reduction_bound="per_hop",
              reduction="recompress", schedule="auto", block_size=32, measure_error=False, cost=None) -> Report:
    """Sum of ``send`` over the ranks into ``recv`` (pass one array twice for in place).
    ``comm`` may be a NodeGroups: the hierarchical allreduce (raw within nodes, compressed
    across them).
    ``reduction_bound``: 'per_hop' (each compression within the bound, the sum within p times
    it) or 'total' (the sum within the bound). ``reduction``: 'recompress' (decode, add,
    compress again at every hop) or 'homomorphic' (every rank quantizes once on one grid, the
    hops add integer codes; the sum within p times the bound). ``schedule``: 'auto' (the cost
    model's pick), 'ring' or 'halving_doubling' (recursive halving, then doubling: 2 log2 p
    steps; same bound, same result on every rank; the homomorphic reduction keeps the ring).
    Report.absolute_bound is the guarantee."""
    settings = (abs, rel, mode, reduction_bound, block_size, measure_error, cost, reduction, schedule)
    if isinstance(comm, NodeGroups):
        return _hierarchical(_ext._hierarchical_allreduce, "kompress.allreduce", send, recv, comm, settings)
    return _buffer_collective(_ext._allreduce, "kompress.allreduce", send, recv, comm, settings, False)


def _hierarchical(call, who, send, recv, groups, settings):
    """A blocking collective over NodeGroups, on the groups' communicator."""
    return _buffer_collective(
        lambda s, r, handle, options, _nonblocking, stream:
            call(s, r, handle, groups._groups, groups._workspace, options, stream),
        who, send, recv, groups.comm, settings, False)


def iallreduce(send, recv, comm=None, *, abs=None, rel=None, mode="compressed", reduction_bound="per_hop",
               reduction="recompress", schedule="auto", block_size=32, measure_error=False, cost=None) -> Request:
    """Nonblocking allreduce; see ialltoall."""
    return _buffer_collective(_ext._allreduce, "kompress.iallreduce", send, recv, comm,
                              (abs, rel, mode, reduction_bound, block_size, measure_error, cost, reduction, schedule),
                              True)


def allgather(send, recv, comm=None, *, abs=None, rel=None, mode="compressed", schedule="auto", block_size=32,
              measure_error=False, cost=None) -> Report:
    """MPI_Allgather, compressed: every rank's ``send`` into block ``rank`` of ``recv``
    (p * send.size values), bit-identical on every rank (the owner's block too holds the decoded
    values). Every value within the bound of what its owner sent. ``schedule``: 'auto', 'ring'
    or 'halving_doubling' (recursive doubling), as for allreduce. ``comm`` may be a NodeGroups:
    compressed across nodes only, raw within them."""
    settings = (abs, rel, mode, "per_hop", block_size, measure_error, cost, "recompress", schedule)
    if isinstance(comm, NodeGroups):
        return _hierarchical(_ext._hierarchical_allgather, "kompress.allgather", send, recv, comm, settings)
    return _buffer_collective(_ext._allgather, "kompress.allgather", send, recv, comm, settings, False)


def iallgather(send, recv, comm=None, *, abs=None, rel=None, mode="compressed", schedule="auto", block_size=32,
               measure_error=False, cost=None) -> Request:
    """Nonblocking allgather; see ialltoall."""
    return _buffer_collective(_ext._allgather, "kompress.iallgather", send, recv, comm,
                              (abs, rel, mode, "per_hop", block_size, measure_error, cost, "recompress", schedule),
                              True)


def reduce_scatter(send, recv, comm=None, *, abs=None, rel=None, mode="compressed", reduction_bound="per_hop",
                   reduction="recompress", schedule="auto", block_size=32, measure_error=False, cost=None) -> Report:
    """MPI_Reduce_scatter_block with MPI_SUM: ``send`` holds p blocks of recv.size values;
    ``recv`` gets the sum over ranks of block ``rank``. Within (p - 1) times the bound
    ('recompress'; p times with 'halving_doubling' where p is no power of two) or p times it
    ('homomorphic'); 'total' makes it the bound. ``schedule``: 'auto', 'ring' or
    'halving_doubling' (recursive halving), as for allreduce. ``comm`` may be a NodeGroups:
    summed raw within each node, compressed across the q nodes only (within q - 1 times the
    bound, the q-rank reduce_scatter's)."""
    settings = (abs, rel, mode, reduction_bound, block_size, measure_error, cost, reduction, schedule)
    if isinstance(comm, NodeGroups):
        return _hierarchical(_ext._hierarchical_reduce_scatter, "kompress.reduce_scatter", send, recv, comm, settings)
    return _buffer_collective(_ext._reduce_scatter, "kompress.reduce_scatter", send, recv, comm, settings, False)


def ireduce_scatter(send, recv, comm=None, *, abs=None, rel=None, mode="compressed", reduction_bound="per_hop",
                    reduction="recompress", schedule="auto", block_size=32, measure_error=False,
                    cost=None) -> Request:
    """Nonblocking reduce_scatter; see ialltoall."""
    return _buffer_collective(_ext._reduce_scatter, "kompress.ireduce_scatter", send, recv, comm,
                              (abs, rel, mode, reduction_bound, block_size, measure_error, cost, reduction, schedule),
                              True)


for _f in (alltoall, ialltoall, alltoallv, ialltoallv, allreduce, iallreduce, allgather, iallgather, reduce_scatter,
           ireduce_scatter):
    _f.__doc__ = (_f.__doc__ or "") + _collective_doc


# --- persistent collectives ------------------------------------------------------------------

class PersistentRequest:
    """A collective set up once and run many times: C++'s kompress::persistent_request, MPI-4's
    ``MPI_Allreduce_init`` + ``MPI_Start`` + ``MPI_Wait`` for kompress. Made by the ``*_init``
    functions, which check the arguments and agree on them across the ranks once; each round
    then runs only the data collective, on the values ``send`` holds when it starts. That is
    what takes the per-call agreement off small calls (docs/collectives.md, "Persistent
    collectives"). Keeps both arrays alive until closed; a context manager closes it.
    """

    def __init__(self, impl):
        self._impl = impl
        _closables.add(self)

    def start(self) -> None:
        """Begins a round (collective: every rank starts its request). InvalidArgument if the
        previous round was not completed by wait() or test()."""
        self._impl.start()

    def wait(self) -> Report:
        """Completes the round (blocks, GIL released): ``recv`` holds the result."""
        return self._impl.wait()

    def test(self) -> bool:
        """Advances the round without blocking; True once ``recv`` holds the result."""
        return self._impl.test()

    def run(self) -> Report:
        """A whole round in one blocking call: start() and wait(), but a raw transfer takes the
        faster of MPI's blocking collective and, on two ranks, one exchange with the peer (timed
        at init; both exact)."""
        return self._impl.run()

    @property
    def report(self) -> Report:
        """The last round's Report."""
        return self._impl.report()

    @property
    def active(self) -> bool:
        """Started and not yet completed."""
        return self._impl.active

    @property
    def closed(self) -> bool:
        return self._impl.closed

    def close(self) -> None:
        """Frees the request (an active round is completed first; collective then, as wait())."""
        self._impl.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def alltoall_init(send, recv, comm=None, *, abs=None, rel=None, mode="compressed", block_size=32,
                  measure_error=False, cost=None, window=0) -> PersistentRequest:
    """Persistent alltoall: checks and agrees once (collective); each round as ``alltoall``."""
    return PersistentRequest(_buffer_collective(_ext._alltoall_init, "kompress.alltoall_init", send, recv, comm,
                                                _exchange_settings(abs, rel, mode, block_size, measure_error, cost,
                                                                   window)))


def alltoallv_init(send, send_counts, send_displs, recv, recv_counts, recv_displs, comm=None, *, abs=None, rel=None,
                   mode="compressed", block_size=32, measure_error=False, cost=None,
                   window=0) -> PersistentRequest:
    """Persistent alltoallv: counts and displacements fixed at init; each round as ``alltoallv``."""
    return PersistentRequest(_vector_collective(_ext._alltoallv_init, "kompress.alltoallv_init", send,
                                                (send_counts, send_displs, recv_counts, recv_displs), recv, comm,
                                                _exchange_settings(abs, rel, mode, block_size, measure_error, cost,
                                                                   window)))


def allreduce_init(send, recv, comm=None, *, abs=None, rel=None, mode="compressed", reduction_bound="per_hop",
                   reduction="recompress", schedule="auto", block_size=32, measure_error=False,
                   cost=None) -> PersistentRequest:
    """Persistent allreduce (one array twice for in place); each round as ``allreduce``."""
    return PersistentRequest(_buffer_collective(
        _ext._allreduce_init, "kompress.allreduce_init", send, recv, comm,
        (abs, rel, mode, reduction_bound, block_size, measure_error, cost, reduction, schedule)))


def allgather_init(send, recv, comm=None, *, abs=None, rel=None, mode="compressed", schedule="auto", block_size=32,
                   measure_error=False, cost=None) -> PersistentRequest:
    """Persistent allgather; each round as ``allgather``."""
    return PersistentRequest(_buffer_collective(
        _ext._allgather_init, "kompress.allgather_init", send, recv, comm,
        (abs, rel, mode, "per_hop", block_size, measure_error, cost, "recompress", schedule)))


def reduce_scatter_init(send, recv, comm=None, *, abs=None, rel=None, mode="compressed", reduction_bound="per_hop",
                        reduction="recompress", schedule="auto", block_size=32, measure_error=False,
                        cost=None) -> PersistentRequest:
    """Persistent reduce_scatter; each round as ``reduce_scatter``."""
    return PersistentRequest(_buffer_collective(
        _ext._reduce_scatter_init, "kompress.reduce_scatter_init", send, recv, comm,
        (abs, rel, mode, reduction_bound, block_size, measure_error, cost, reduction, schedule)))


for _f in (alltoall_init, alltoallv_init, allreduce_init, allgather_init, reduce_scatter_init):
    _f.__doc__ = (_f.__doc__ or "") + _collective_doc


def measure_cost_model(comm=None, probe_bytes: int = 4 << 20) -> CostModel:
    """Measures the link (ranks 0 and 1) and the codec; every rank gets the same CostModel.
    Collective."""
    who = "kompress.measure_cost_model"

    def prepare():
        size = _index(probe_bytes, who)
        if size < 0:
            raise InvalidArgument(f"{who}: probe_bytes must be >= 0 (got {size})")
        return size

    return _ext._measure_cost_model(*_agreed(who, comm, prepare))


# --- the activation stash -----------------------------------------------------------------

class Stash:
    """kompress::stash: a fixed budget of memory holding compressed arrays.

    ``policy`` decides what a save that does not fit does: 'throw' (BudgetExceeded, the stash
    unchanged), 'spill_host', 'spill_file' (``directory=``), 'loosen_bound' (retry with the bound
    times ``growth`` up to ``ceiling_abs=``/``ceiling_rel=``). docs/stash.md has the details.
    ``device``: 'cpu', or 'cuda' (a CUDA build) for a pool in GPU memory that keeps CUDA tensors;
    its host spill goes to pinned memory. A save with ``codec='auto'`` takes the ratio codec where
    its stream is at least ``ratio_codec_min_saving`` shorter than the fast codec's, and measures
    a layer's choice again after ``codec_remeasure_saves`` saves of it. ``async_window``: C++'s
    save_async window (Python's saves are synchronous). ``rounding``: 'nearest' (default) or
    'stochastic', for saves that do not name one; ``rounding_seed`` (an int in [0, 2^64)) seeds
    every stochastic save's streams, each save drawing afresh (docs/stash.md, "Per-save options").
    """

    def __init__(self, budget_bytes: int, *, policy: str = "throw", directory: str | None = None,
                 ceiling_abs: float | None = None, ceiling_rel: float | None = None, growth: float = 2.0,
                 segment_bytes: int = 64 << 10, block_size: int = 32, device: str = "cpu",
                 ratio_codec_min_saving: float = 0.2, codec_remeasure_saves: int = 64, async_window: int = 2,
                 rounding: str = "nearest", rounding_seed: int = 0):
        who = "kompress.Stash"
        options = _ext._stash_options(int(budget_bytes), str(policy), str(directory or ""),
                                      *_bound_args(ceiling_abs, ceiling_rel), float(growth), int(segment_bytes),
                                      int(block_size), _real(ratio_codec_min_saving, who, "ratio_codec_min_saving"),
                                      _index(_integer(codec_remeasure_saves, who, "codec_remeasure_saves"), who),
                                      _index(_integer(async_window, who, "async_window"), who),
                                      str(rounding), _seed(rounding_seed, who))
        device = str(device)
        stream = 0
        if device.startswith("cuda"):
            device, stream = self._cuda_device(device)
        self._stash = _ext._Stash(options, device, stream)
        _closables.add(self)

    @staticmethod
    def _cuda_device(device):
        """'cuda' or 'cuda:N' (N: kompress's device): the extension's name and the stream the
        pool is allocated on (torch's current one, when torch is loaded)."""
        if cuda_enabled and device not in ("cuda", f"cuda:{cuda_device}"):
            raise InvalidArgument(f"kompress.Stash: device {device!r} is not the GPU kompress runs on "
                                  f"(cuda:{cuda_device})")
        torch = _sys.modules.get("torch")
        stream = torch.cuda.current_stream(cuda_device).cuda_stream if torch is not None and cuda_enabled else 0
        return "cuda", stream

    @property
    def device(self) -> str:
        """'cpu', or 'cuda' for a pool in GPU memory."""
        return self._stash.device

    def save(self, x, *, abs: float | None = None, rel: float | None = None, codec: str | None = None,
             layer: int | None = None, keep_sign: bool = False, rounding: str | None = None,
             group_relative: bool = False) -> StashHandle:
        """Compresses ``x`` (C-contiguous float32/float64, on the stash's device; a CUDA tensor on
        torch's current stream) into the stash; returns its handle.

        ``codec``: None (the stash's), 'fast', 'ratio' or 'auto' (measured on the save's first
        segment; remembered per ``layer``, an int in [0, 2^32) naming the tensor's role).
        ``keep_sign=True`` stores x > 0 as one bit per value: restored values are then > 0
        exactly where x was, still within the bound; where x holds no negative value (a ReLU's
        output), its zeros are stored as those bits alone (``info(h).zeros_in_signs``) and come
        back exact, the bits coded in fewer where zeros or positive values are rare.
        ``rounding``: None (the stash's), 'nearest'
        or 'stochastic' (restored values unbiased, E[x''] = x, within the same bound).
        ``group_relative=True`` takes ``rel`` relative to each group of 256 values (in memory
        order): group g within rel * 2^k_g, 2^k_g the largest power of two at most its range
        (``info(h).absolute_bound`` is the largest group's); rel must be 0 or at least 2^-28
        (docs/stash.md, "Per-save options" and "Bounds relative to each group")."""
        who = "kompress.Stash.save"
        if codec is not None and not isinstance(codec, str):
            raise TypeError(f"{who}: codec must be None or a str (got {type(codec).__name__})")
        if rounding is not None and not isinstance(rounding, str):
            raise TypeError(f"{who}: rounding must be None or a str (got {type(rounding).__name__})")
        if layer is not None:
            layer = _index(_integer(layer, who, "layer"), who)
        return self._stash.save(_arg(x, who), *_bound_args(abs, rel), codec, layer, bool(keep_sign), rounding,
                                bool(group_relative), _stream_of(x))

    def restore(self, handle: StashHandle, out=None, *, drop: bool = False):
        """Decompresses the entry into ``out`` (or a new 1-D array on the stash's device: numpy, or
        a CUDA tensor) and returns it; every value within the entry's absolute_bound. ``drop=True``
        releases the entry too."""
        if out is None:
            info = self._stash.info(handle)
            if self.device == "cuda":
                import torch
                out = torch.empty(info.count, dtype=getattr(torch, info.dtype), device=f"cuda:{cuda_device}")
            else:
                out = _np.empty(info.count, dtype=info.dtype)
        self._stash.restore(handle, _arg(out, "kompress.Stash.restore"), bool(drop), _stream_of(out))
        return out

    def drop(self, handle: StashHandle) -> None:
        self._stash.drop(handle)

    def __contains__(self, handle) -> bool:
        return self._stash.contains(handle)

    def info(self, handle: StashHandle) -> StashEntryInfo:
        return self._stash.info(handle)

    def stats(self) -> StashStats:
        return self._stash.stats()

    def reset_peaks(self) -> None:
        self._stash.reset_peaks()

    def close(self) -> None:
        """Releases the pool (and the spill file); every handle becomes invalid."""
        self._stash.close()

    @property
    def closed(self) -> bool:
        return self._stash.closed


# --- the DLRM embedding exchange ----------------------------------------------------------

class EmbeddingExchange:
    """kompress::dlrm::embedding_exchange (docs/dlrm.md) on an mpi4py communicator.

    ``tables``: one (owner rank, dim) per table, in table order, the same on every rank.
    forward: [global batch x local width] -> [local batch x total width];
    backward: [local batch x total width] -> [global batch x local width].
    ``table_weights``: per-table multipliers of the bound; ``bound_schedule``: a callable
    (iteration, table, "forward" | "backward") -> multiplier; ``window``: how many peers'
    messages a rank expects at once (0: all; as ``alltoall``'s). kompress.torch.EmbeddingAllToAll
    wraps it as an autograd function.
    """

    def __init__(self, tables, local_batch: int, comm=None, *, forward_abs=None, forward_rel=None,
                 backward_abs=None, backward_rel=None, compress_forward: bool = True,
                 compress_backward: bool = True, table_weights=None, bound_schedule=None, block_size: int = 32,
                 window: int = 0):
        who = "kompress.EmbeddingExchange"

        def prepare():
            options = _ext._ExchangeOptions()
            options.set_bounds(*_bound_args(forward_abs, forward_rel), *_bound_args(backward_abs, backward_rel))
            options.compress_forward = bool(compress_forward)
            options.compress_backward = bool(compress_backward)
            if table_weights is not None:
                options.table_weights = [float(w) for w in table_weights]
            if bound_schedule is not None:
                if not callable(bound_schedule):
                    raise InvalidArgument(f"{who}: bound_schedule must be callable (iteration, table, direction)")
                options.set_schedule(bound_schedule)
            options.block_size = int(block_size)
            options.window = _window(window)
            model = [(_index(owner, who), _index(dim, who)) for owner, dim in tables]
            return options, model, _index(local_batch, who)

        handle, (options, self.tables, batch) = _agreed(who, comm, prepare)
        if comm is None:
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
        self.comm, self._comm = comm, handle
        self._exchange = _ext._EmbeddingExchange(handle, self.tables, batch, options)
        _closables.add(self)

    local_batch = property(lambda self: self._exchange.local_batch)
    global_batch = property(lambda self: self._exchange.global_batch)
    local_width = property(lambda self: self._exchange.local_width)
    total_width = property(lambda self: self._exchange.total_width)
    iteration = property(lambda self: self._exchange.iteration)

    def _run(self, forward, nonblocking, x, out, who):
        try:
            x, out = _arg(x, who), _arg(out, who)
        except BaseException:
            _ext._announce_failure(self._comm, who)  # the other ranks raise too (see _agreed)
            raise
        return self._exchange.run(forward, x, out, nonblocking, _stream_of(x, out))

    def forward(self, pooled_local, pooled_out) -> Report:
        """Blocking forward exchange; counts one iteration."""
        return self._run(True, False, pooled_local, pooled_out, "kompress.EmbeddingExchange.forward")

    def iforward(self, pooled_local, pooled_out) -> Request:
        return self._run(True, True, pooled_local, pooled_out, "kompress.EmbeddingExchange.iforward")

    def backward(self, grad_in, grad_out) -> Report:
        return self._run(False, False, grad_in, grad_out, "kompress.EmbeddingExchange.backward")

    def ibackward(self, grad_in, grad_out) -> Request:
        return self._run(False, True, grad_in, grad_out, "kompress.EmbeddingExchange.ibackward")

    def close(self) -> None:
        self._exchange.close()
