"""kompress in a PyTorch training loop (CPU tensors; CUDA tensors where kompress.cuda_enabled).

- ``allreduce_hook`` / ``AllreduceHookState``: a DDP communication hook that sums gradient
  buckets with kompress's error-bounded allreduce.
- ``compressed_activations``: saved-tensor hooks keeping activations compressed in a
  kompress Stash between forward and backward; ``LayerBounds`` gives each saved activation
  its own bound, chosen from the training.
- ``EmbeddingAllToAll``: the DLRM embedding exchange as a module (autograd function inside).

docs/python.md is the guide.
"""

import math as _math
import numbers as _numbers
import weakref as _weakref

import torch as _torch
import torch.distributed as _dist

import kompress as _k
from kompress._group_allreduce import GroupAllreduce as _GroupAllreduce, GroupReport, _usable
from kompress._group_exchange import GroupEmbeddingExchange as _GroupEmbeddingExchange

__all__ = ["AllreduceHookState", "allreduce_hook", "GroupReport", "compressed_activations", "LayerBounds",
           "pack_integers", "PackedIntegers", "EmbeddingAllToAll"]


# --- DDP communication hook ---------------------------------------------------------------

class AllreduceHookState:
    """State of :func:`allreduce_hook`: where the buckets are summed, and the bound.

    Args:
        comm: the ranks to sum over, DDP's ranks in the same order. A torch.distributed
            process group (gloo, NCCL, MPI), or None for the default one (DDP's own): the hook
            exchanges compressed bytes with torch.distributed's collectives on a worker thread and
            returns a Future that completes when the bucket is summed, so buckets overlap with the
            rest of the backward pass. Or an mpi4py communicator: the hook runs
            kompress.allreduce (MPI) to completion inside the backward pass.
        abs / rel: the bound of each compression (default rel=1e-3, relative to the range of
            the bucket's values over all ranks). See kompress.allreduce.
        mode: 'compressed', 'raw' (the plain allreduce of ``comm``) or 'auto' (compress where
            ``cost`` says it pays; a default kompress.CostModel() on a process group).
        reduction_bound: 'per_hop' (the averaged gradient within world_size times the bound) or
            'total' (within the bound).

    After each bucket, ``last_report`` holds the report of its allreduce (a kompress.Report, or
    on a process group a kompress.torch.GroupReport with the same fields), and ``wire_bytes`` /
    ``payload_bytes`` accumulate over the whole run.
    """

    def __init__(self, comm=None, *, abs=None, rel=None, mode="compressed", reduction_bound="per_hop",
                 block_size=32, cost=None):
        who = "kompress.torch.AllreduceHookState"
        if mode not in ("compressed", "raw", "auto"):
            raise _k.InvalidArgument(f"{who}: mode must be 'compressed', 'raw' or 'auto' (got {mode!r})")
        if reduction_bound not in ("per_hop", "total"):
            raise _k.InvalidArgument(f"{who}: reduction_bound must be 'per_hop' or 'total' (got {reduction_bound!r})")
        if comm is None:
            if not _dist.is_available() or not _dist.is_initialized():
                raise _k.InvalidArgument(f"{who}: no communicator given and torch.distributed's default process "
                                         "group is not initialised (init_process_group first, or pass a group or "
                                         "an mpi4py communicator)")
            comm = _dist.group.WORLD
        self.comm = comm
        self.abs, self.rel = abs, (1e-3 if abs is None and rel is None else rel)
        self.mode, self.reduction_bound, self.block_size, self.cost = mode, reduction_bound, block_size, cost
        self.last_report = None
        self.payload_bytes = 0
        self.wire_bytes = 0
        self._group = _GroupAllreduce(comm) if _is_process_group(comm) else None

    def __getstate__(self):
        # A process group and a thread do not pickle (as PowerSGDState, the state keeps the rest);
        # unpickled, it sums over the default process group.
        state = dict(self.__dict__)
        if state.pop("_group", None) is not None:
            state["comm"] = None
        return state

    def __setstate__(self, state):  # DDP pickles hook states for some code paths
        self.__dict__.update(state)
        if "_group" not in state:
            if self.comm is None:
                self.comm = _dist.group.WORLD
            self._group = _GroupAllreduce(self.comm) if _is_process_group(self.comm) else None


def _is_process_group(comm) -> bool:
    return _dist.is_available() and isinstance(comm, _dist.ProcessGroup)


def allreduce_hook(state: AllreduceHookState, bucket) -> _torch.futures.Future[_torch.Tensor]:
    """Averages the bucket's gradients over the ranks, compressed within an error bound.

    Where ``fp16_compress_hook`` casts each gradient to half precision (an error relative to
    each value, with no bound on the sum), this compresses the bucket within an error bound:
    every averaged gradient differs from the exact average by at most
    ``state.last_report.absolute_bound`` (per_hop: world_size times the bound, each value
    compressed once on its way to the rank that sums it and once on its way back; total: the
    bound). Every rank ends with the same bytes, so the replicas stay identical. Only
    float32/float64 CPU buckets; anything else is an InvalidArgument on every rank.

    On a process group (the default) the hook returns at once and the Future completes when the
    bucket is summed; on an mpi4py communicator it blocks (GIL released) and returns a completed
    Future. docs/python.md, "The DDP communication hook", describes both.

    Example::

        >>> state = kompress.torch.AllreduceHookState(rel=1e-3)   # DDP's process group
        >>> ddp_model.register_comm_hook(state, kompress.torch.allreduce_hook)
    """
    who = "kompress.torch.allreduce_hook"
    buffer = bucket.buffer()
    if state._group is not None:
        return _group_hook(state, buffer, who)
    if not _usable(buffer) or buffer.dtype not in (_torch.float32, _torch.float64):
        where = "in CPU or (CUDA builds of kompress) GPU memory"
        _k._raise_on_every_rank(_k.InvalidArgument(f"{who}: the bucket must hold float32 or float64 gradients "
                                                   f"{where} (got {buffer.dtype} on {buffer.device})"),
                                state.comm, who)
    size = state.comm.Get_size()
    flat = buffer if buffer.is_contiguous() else buffer.contiguous()
    flat.div_(size)
    report = _k.allreduce(flat, flat, state.comm, abs=state.abs, rel=state.rel, mode=state.mode,
                          reduction_bound=state.reduction_bound, block_size=state.block_size, cost=state.cost)
    if flat.data_ptr() != buffer.data_ptr():
        buffer.copy_(flat)
    _account(state, report)
    future = _torch.futures.Future()
    future.set_result(buffer)
    return future


def _account(state, report):
    state.last_report = report
    state.payload_bytes += report.payload_bytes
    state.wire_bytes += report.wire_bytes


def _group_hook(state, buffer, who):
    flat = buffer if buffer.is_contiguous() else buffer.contiguous()
    if flat.is_floating_point() and _usable(flat):
        flat.div_(_dist.get_world_size(state.comm))
    cost = state.cost if state.cost is not None or state.mode != "auto" else _k.CostModel()

    def run():
        report = state._group.allreduce(flat, abs=state.abs, rel=state.rel, mode=state.mode,
                                        reduction_bound=state.reduction_bound, block_size=state.block_size,
                                        cost=cost, who=who)
        if flat.data_ptr() != buffer.data_ptr():
            buffer.copy_(flat)
        _account(state, report)
        return buffer

    return state._group.submit(run, flat.device)


# --- saved-tensor hooks -----------------------------------------------------------------------

class _Saved:
    """One compressed activation: its stash entry. Dropped from the stash when the last
    reference (the autograd graph's) goes."""

    __slots__ = ("stash", "handle", "shape", "dtype", "device", "bound", "key", "owner", "__weakref__")

    def __init__(self, key):
        self.stash = self.handle = self.owner = None
        self.key = key

    def __del__(self):
        if self.stash is not None and not self.stash.closed and self.handle in self.stash:
            self.stash.drop(self.handle)
        if self.owner is not None:
            self.owner._forget(self)


class _ViewOf:
    """An activation that is a view of one already saved (softmax's output, and the same
    memory reshaped for the next matrix product): restored from the saved one, not stored twice."""

    __slots__ = ("saved", "shape", "stride", "offset")

    def __init__(self, saved, shape, stride, offset):
        self.saved, self.shape, self.stride, self.offset = saved, shape, stride, offset


class _Kept:
    """An activation kept as it is while a LayerBounds schedule numbers the saves (one too small
    to compress, or one a check pass keeps exact), registered so that saving it again, or a view
    of it, finds it as a compressed one would be found."""

    __slots__ = ("tensor", "key", "shape", "owner", "__weakref__")

    def __init__(self, tensor, key, owner):
        # Detached: the tensor's own lifetime (which the deduplication follows) stays what it is
        # with a compressed save, and a saved output does not hold its grad_fn in a cycle.
        self.tensor, self.key, self.shape, self.owner = tensor.detach(), key, tensor.shape, owner

    def __del__(self):
        self.owner._forget(self)


_NARROWER = (_torch.int8, _torch.int16, _torch.int32)


def _narrowest(t, low=None, high=None):
    """The narrowest of int8, int16 and int32 narrower than t's type holding t's values (whose
    range is [low, high] when the caller has read it already), or None."""
    if t.dtype not in (_torch.int16, _torch.int32, _torch.int64) or t.numel() == 0:
        return None
    if low is None:
        low, high = (int(v) for v in _torch.aminmax(t))
    for dtype in _NARROWER:
        if dtype.itemsize >= t.dtype.itemsize:
            return None
        info = _torch.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return dtype
    return None


class PackedIntegers:
    """An integer tensor kept exactly in fewer bytes, by :func:`pack_integers`; ``unpack()``
    gives it back, same values, shape, type and device. ``nbytes``: the bytes it holds.
    Unpacking computes in 32 bits where every value fits: each is below width * (rows * stride +
    extent)."""

    __slots__ = ("_values", "_dtype", "_shape", "_window", "nbytes")

    def __init__(self, values, dtype, shape, window=None):
        self._values, self._dtype, self._shape, self._window = values, dtype, shape, window
        self.nbytes = values.numel() * values.element_size()

    def unpack(self):
        if self._window is None:
            return self._values.to(self._dtype)
        width, stride, padding, extent, bits = self._window
        count = self._shape.numel()
        shifts = _torch.arange(0, 8, bits, dtype=_torch.uint8, device=self._values.device)
        codes = ((self._values.unsqueeze(1) >> shifts) & ((1 << bits) - 1)).reshape(-1)[:count]
        math = _torch.int32 if width * (self._shape[-2] * stride + extent) < 2**30 else _torch.int64
        codes = codes.to(math).reshape(-1, *self._shape[-2:])
        rows, columns = _window_origins(self._shape, stride, padding, math, self._values.device)
        return ((rows + codes // extent) * width + columns + codes % extent).to(self._dtype).reshape(self._shape)


def _window_origins(shape, stride, padding, dtype, device):
    """Each output position's window origin (row, column) in its input plane, as (rows, 1) and
    (1, columns) tensors."""
    rows = _torch.arange(shape[-2], dtype=dtype, device=device).view(-1, 1) * stride - padding
    columns = _torch.arange(shape[-1], dtype=dtype, device=device).view(1, -1) * stride - padding
    return rows, columns


def _window_offsets(planes, width, stride, padding):
    """(row offsets, column offsets) of flat indices into planes of `width` columns, from the
    window origins of a pooling of `stride` and `padding`."""
    rows, columns = _window_origins(planes.shape, stride, padding, planes.dtype, planes.device)
    row = planes // width
    return row - rows, planes - row * width - columns


def _pooling_window(planes):
    """(width, stride, padding, extent, row offsets, column offsets) such that every index lies in
    its output position's window of extent x extent values, with the smallest extent (at most
    16), or None. The candidate plane widths of each stride and padding are screened together on
    the first plane's top-left corner (a large tensor of token ids costs little), then the best
    checked on every plane."""
    ho, wo = planes.shape[-2:]
    found = []
    for stride in (2, 1, 3, 4):
        for padding in range(0, stride + 1):
            low = max(1, stride * (wo - 1) + 1 - 2 * padding)
            widths = _torch.arange(low, stride * wo + 2 * padding + 2 * stride + 1, dtype=planes.dtype,
                                   device=planes.device)
            r, c = _window_offsets(planes[0, :8, :64], widths.view(-1, 1, 1), stride, padding)
            low_offsets = _torch.minimum(r.amin(dim=(1, 2)), c.amin(dim=(1, 2))).tolist()
            extents = (_torch.maximum(r.amax(dim=(1, 2)), c.amax(dim=(1, 2))) + 1).tolist()
            found += [(e, int(w), stride, padding) for w, lo, e in zip(widths.tolist(), low_offsets, extents)
                      if lo >= 0 and e <= 16]
    for extent, width, stride, padding in sorted(found):
        r, c = _window_offsets(planes, width, stride, padding)
        if int(_torch.minimum(r.min(), c.min())) >= 0:
            extent = max(extent, int(_torch.maximum(r.max(), c.max())) + 1)
            if extent <= 16:
                return width, stride, padding, extent, r, c
    return None


def pack_integers(t):
    """``t`` kept exactly in fewer bytes, as a :class:`PackedIntegers`, or None where nothing
    smaller holds it. Max pooling's indices (int64 flat positions in each input plane, one per
    output position of the last two dimensions) are recognised by their values: where every
    index lies in its output position's k x k window for some plane width, stride (1 to 4, the
    same along both dimensions) and padding, each is kept as its place in the window, in 2
    (k <= 2), 4 (k <= 4) or 8 bits (k <= 16), its position giving the rest. Other int16/32/64
    tensors are kept in the narrowest signed type that holds their values. Reads the values (a
    synchronisation on a GPU)."""
    if t.dtype not in (_torch.int16, _torch.int32, _torch.int64) or t.numel() == 0:
        return None
    t = t.detach()
    low, high = (int(v) for v in _torch.aminmax(t))
    if t.dim() >= 2 and t.shape[-1] > 1 and t.shape[-2] > 1:
        planes = t.reshape(-1, *t.shape[-2:])
        if -2**30 < low and high < 2**30:  # 32-bit division is the faster
            planes = planes.to(_torch.int32)
        window = _pooling_window(planes)
        if window is not None:
            width, stride, padding, extent, r, c = window
            bits = 2 if extent <= 2 else 4 if extent <= 4 else 8
            codes = (r * extent + c).to(_torch.uint8).reshape(-1)
            per_byte = 8 // bits
            codes = _torch.nn.functional.pad(codes, (0, -codes.numel() % per_byte)).view(-1, per_byte)
            shifts = _torch.arange(0, 8, bits, dtype=_torch.uint8, device=t.device)
            packed = (codes << shifts).sum(dim=1, dtype=_torch.uint8)
            return PackedIntegers(packed, t.dtype, t.shape, (width, stride, padding, extent, bits))
    narrow = _narrowest(t, low, high)
    return None if narrow is None else PackedIntegers(t.to(narrow), t.dtype, t.shape)


class compressed_activations(_torch.autograd.graph.saved_tensors_hooks):
    """Keeps the activations autograd saves for backward compressed in a kompress Stash.

    Inside ``with kompress.torch.compressed_activations(rel=1e-2):`` every float32/float64
    tensor on the stash's device that autograd saves with at least ``min_numel`` elements is
    compressed into the stash in the forward pass and restored, every value within the bound,
    when backward needs it; its stash entry is dropped when the graph releases it. Integer CPU
    tensors are kept exactly in fewer bytes (``narrow_integers``); boolean tensors,
    smaller tensors, parameters (leaves that require grad, and views of them) and tensors on
    another device pass through untouched. A tensor saved twice (a ReLU's output that the next
    Linear also saves), or a view of one saved (softmax's output reshaped), is stored once.

    Args:
        abs / rel: the bound (rel: relative to each tensor's value range). Either may be a
            callable taking the saved tensor and returning its bound, to give some activations
            their own: ``rel=lambda t: 1e-2 if t.grad_fn.name() == "SoftmaxBackward0" else 5e-2``
            keeps attention probabilities tighter than the rest.
        budget_bytes: the stash's budget (its pool, allocated on entry).
        device: 'cpu' (default) keeps CPU activations in host memory; 'cuda' (a CUDA build of
            kompress) keeps CUDA activations compressed in GPU memory, saved and restored on
            torch's current stream, with policy='spill_host' spilling to pinned host memory.
        min_numel: smaller tensors are kept as they are.
        policy, directory, ceiling_abs, ceiling_rel, growth, segment_bytes: as kompress.Stash.
        exact_sign: save with the stash's ``keep_sign``: one bit per value saying whether it was
            > 0, stored with the streams, and restored values on that side of 0, within the
            bound. Functions whose backward reads only where their output is positive (ReLU)
            then see exactly the mask the plain run sees. Costs 1/32 (float32) of the raw size,
            counted in the stash's stored bytes (``stats().sign_bytes``); on a tensor without
            negative values (a ReLU's output) its zeros are stored as those bits alone, coded in
            less where zeros or positive values are rare. Or a
            callable, ``exact_sign(tensor) -> bool`` for each saved tensor: e.g. ``lambda t:
            t.grad_fn is not None`` keeps no bits for the network's input, which is right where
            the input feeds only layers that read its values (Linear, convolutions) and none
            that reads its sign (PReLU's weight gradient does).
        narrow_integers: keep int16/32/64 CPU tensors of at least ``min_numel`` elements
            exactly in fewer bytes, as :func:`pack_integers` does (max pooling's indices as their
            place in the window, 2 bits each for a 2 x 2 pooling; others in the narrowest signed
            type that holds their values), and restore them in their own type.
        codec: each save's codec: None (the stash's, 'fast' for a stash made here), 'fast',
            'ratio' or 'auto' (measured per save), as kompress.Stash.save.
        rounding: each save's rounding: None (the stash's, 'nearest' for a stash made here),
            'nearest' or 'stochastic' (restored activations unbiased, E[x''] = x, within the
            bound: their errors average out in a weight gradient), as kompress.Stash.save.
        group_relative: take ``rel`` relative to each group of 256 values of a saved tensor
            (in memory order) instead of the whole tensor, as kompress.Stash.save does: group g
            within rel * 2^k_g, 2^k_g the largest power of two at most its range. A row of small
            activations then keeps its digits where the batch's range would round it flat: what
            ActNN's per-group codes do, with a bound. Needs ``rel``.
        stash: an existing kompress.Stash to use instead of making one.

    Non-contiguous activations are copied to a contiguous tensor before compression.
    ``stats()`` gives the stash's statistics; ``saved_bytes()`` the bytes held now (the pool in
    use, sign bits included, and tensors passed through); ``peak_bytes`` their high-water mark.
    With ``policy='loosen_bound'`` a save that does not fit the budget is stored within a looser
    bound, up to the ceiling; ``loosened`` says which: for each kind of saved tensor
    (``"ReluBackward0 (128, 1024)"``), how many of its saves were loosened and the loosest bound
    one was stored within, in the save's mode (REL for ``rel``), since the hooks were made.
    """

    def __init__(self, *, abs=None, rel=None, budget_bytes: int = 256 << 20, min_numel: int = 1 << 14,
                 policy: str = "throw", directory=None, ceiling_abs=None, ceiling_rel=None, growth: float = 2.0,
                 segment_bytes: int = 64 << 10, exact_sign=True, codec: str | None = None,
                 stash: "_k.Stash | None" = None, device: str = "cpu", rounding: str | None = None,
                 narrow_integers: bool = True, group_relative: bool = False):
        who = "kompress.torch.compressed_activations"
        if abs is None and rel is None:
            rel = 1e-2
        if group_relative and abs is not None:
            raise _k.InvalidArgument(f"{who}: group_relative takes a rel bound (relative to each group's range), "
                                     "not abs")
        if codec not in (None, "fast", "ratio", "auto"):
            raise _k.InvalidArgument(f"{who}: codec must be None, 'fast', 'ratio' or 'auto' (got {codec!r})")
        if rounding not in (None, "nearest", "stochastic"):
            raise _k.InvalidArgument(f"{who}: rounding must be None, 'nearest' or 'stochastic' (got {rounding!r})")
        self.abs, self.rel = abs, rel
        self.min_numel = int(min_numel)
        self.exact_sign = exact_sign if callable(exact_sign) else bool(exact_sign)
        self.narrow_integers = bool(narrow_integers)
        self.codec = codec
        self.rounding = rounding
        self.group_relative = bool(group_relative)
        self.stash = stash if stash is not None else _k.Stash(
            budget_bytes, policy=policy, directory=directory, ceiling_abs=ceiling_abs, ceiling_rel=ceiling_rel,
            growth=growth, segment_bytes=segment_bytes, device=device)
        self.device = self.stash.device   # 'cpu' or 'cuda': the tensors this stash keeps
        self._live = {}            # storage key -> weakrefs of the tensor and its _Saved
        self._passed = {}          # storage key -> bytes of activations passed through
        self.peak_bytes = 0
        self._schedule = None      # a LayerBounds numbering the saves and giving their bounds
        self._site = 0             # with a schedule: the number the next distinct float save gets
        self._only_site = None     # with a schedule: None (every save by size), -1 (none), n (only save n)
        self._site_names = {}      # with a schedule: save number -> what it is ("ReluBackward0 (128, 1024)")
        self.loosened = {}         # what a save was -> [its saves loosened by the policy, the loosest bound]
        super().__init__(self._pack, self._unpack)

    def __enter__(self):
        super().__enter__()
        return self

    # accounting
    def saved_bytes(self) -> int:
        """Bytes the saved activations hold now: the stash's pool in use (streams, their sign
        bits and the workspace), and the activations passed through since the last
        reset_peaks() (autograd frees those without telling the hooks)."""
        return self.stash.stats().pool_bytes + sum(self._passed.values())

    def reset_peaks(self) -> None:
        """Starts a new measurement (e.g. each training step): peak_bytes, the stash's peaks and
        the count of activations passed through."""
        self._passed.clear()
        self.stash.reset_peaks()
        self.peak_bytes = self.saved_bytes()

    def _note(self):
        self.peak_bytes = max(self.peak_bytes, self.saved_bytes())

    def stats(self):
        return self.stash.stats()

    def _forget(self, saved):
        for key in (saved.key, ("storage",) + saved.key[:1]):
            entry = self._live.get(key)
            if entry is not None and entry[1]() in (None, saved):
                del self._live[key]

    def _exact_sign_of(self, t):
        """Whether t keeps its sign bits: the hooks' own setting, or what their callable says."""
        if not callable(self.exact_sign):
            return self.exact_sign
        value = self.exact_sign(t)
        if not isinstance(value, bool):
            raise _k.InvalidArgument(f"kompress.torch.compressed_activations: exact_sign(tensor) must return a bool "
                                     f"(got {value!r} for a tensor of shape {tuple(t.shape)})")
        return value

    def _bound_of(self, t):
        """(abs, rel) for t: the hooks' own, or what their callable says for t."""
        bounds = []
        for name, bound in (("abs", self.abs), ("rel", self.rel)):
            if callable(bound):
                value = bound(t)
                if not isinstance(value, _numbers.Real) or isinstance(value, bool) or not _math.isfinite(value) \
                        or value < 0:
                    raise _k.InvalidArgument(f"kompress.torch.compressed_activations: {name}(tensor) must return a "
                                             f"finite number >= 0 (got {value!r} for a tensor of shape "
                                             f"{tuple(t.shape)})")
                bound = float(value)
            bounds.append(bound)
        return tuple(bounds)

    def _view_of_saved(self, t):
        """A _ViewOf t if its memory lies inside a live saved tensor's that was contiguous and is
        unchanged since (views share their base's version counter), else None."""
        entry = self._live.get(("storage", t.untyped_storage().data_ptr()))
        if entry is None or entry[0]() is None or entry[1]() is None:
            return None
        saved = entry[1]()
        _, first_offset, _, _, dtype, version = saved.key
        offset = t.storage_offset() - first_offset
        last = offset + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
        if (t.dtype != dtype or t._version != version or offset < 0 or last >= saved.shape.numel()
                or any(st < 0 for st in t.stride()) or t.numel() == 0):
            return None
        return _ViewOf(saved, tuple(t.shape), tuple(t.stride()), offset)

    @staticmethod
    def _key(t):
        return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype,
                t._version)

    @staticmethod
    def _is_parameter(t):
        if isinstance(t, _torch.nn.Parameter) or (t.is_leaf and t.requires_grad):
            return True
        base = t._base
        return base is not None and base.is_leaf and base.requires_grad

    def _pack(self, t):
        if self._is_parameter(t):
            return t
        key = self._key(t)
        floating = t.dtype in (_torch.float32, _torch.float64) and t.device.type == self.device
        # A schedule numbers every distinct float save, small ones too, so that a check pass on a
        # few rows numbers them as the full batch does.
        if not floating or (t.numel() < self.min_numel and self._schedule is None):
            packed = (pack_integers(t) if self.narrow_integers and t.device.type == "cpu"
                      and t.numel() >= self.min_numel else None)
            self._passed[key] = t.numel() * t.element_size() if packed is None else packed.nbytes
            self._note()
            return t if packed is None else packed
        # Deduplicate only while the first tensor lives: once it is freed, a new tensor may
        # take its memory with the same shape, and the key alone would mistake one for the other.
        entry = self._live.get(key)
        if entry is not None and entry[0]() is not None and entry[1]() is not None:
            return entry[1]()
        view = self._view_of_saved(t)
        if view is not None:
            return view
        site = None
        if self._schedule is not None:
            site, self._site = self._site, self._site + 1
            if self._only_site == -1:  # a check's exact pass
                self._schedule._note_range(site, t)
            if self._only_site is None:
                self._site_names.setdefault(site, f"{t.grad_fn.name() if t.grad_fn is not None else 'no grad_fn'} "
                                                  f"{tuple(t.shape)}")
            compress = t.numel() >= self.min_numel if self._only_site is None else site == self._only_site
            if not compress:
                kept = _Kept(t, key, self)
                self._passed[key] = t.numel() * t.element_size()
                self._remember(t, kept)
                self._note()
                return kept
        values = t.detach()
        contiguous = values.is_contiguous()
        if not contiguous:
            values = values.contiguous()
        saved = _Saved(key)
        abs_bound, rel_bound = self._bound_of(t) if site is None else self._schedule._bound_args(site, t)
        # A lossless bound restores every value exactly: its signs need no bits.
        keep_sign = self._exact_sign_of(t) and (abs_bound if abs_bound is not None else rel_bound) != 0
        saved.handle = self.stash.save(values, abs=abs_bound, rel=rel_bound, codec=self.codec, layer=site,
                                       keep_sign=keep_sign, rounding=self.rounding,
                                       group_relative=self.group_relative and rel_bound is not None)
        saved.stash = self.stash
        saved.shape, saved.dtype, saved.device = values.shape, values.dtype, values.device
        info = self.stash.info(saved.handle)
        saved.bound = info.absolute_bound
        if info.loosened:
            name = f"{t.grad_fn.name() if t.grad_fn is not None else 'no grad_fn'} {tuple(t.shape)}"
            record = self.loosened.setdefault(name, [0, 0.0])
            record[0] += 1
            record[1] = max(record[1], info.used_bound)
        saved.owner = self
        self._remember(t, saved, contiguous)
        self._note()
        return saved

    def _remember(self, t, saved, contiguous=None):
        """Registers t's save, so that saving t again, or a view of it, finds it."""
        self._live[saved.key] = (_weakref.ref(t), _weakref.ref(saved))
        if contiguous if contiguous is not None else t.is_contiguous():
            # its memory maps one to one onto the restored tensor's: views of it are found
            self._live[("storage", saved.key[0])] = self._live[saved.key]

    def _unpack(self, saved):
        if isinstance(saved, PackedIntegers):
            return saved.unpack()
        if isinstance(saved, _Kept):
            return saved.tensor
        if isinstance(saved, _ViewOf):
            base = self._unpack(saved.saved)   # a restored tensor, or a kept one at its own offset
            return base.as_strided(saved.shape, saved.stride, base.storage_offset() + saved.offset)
        if not isinstance(saved, _Saved):
            return saved
        out = _torch.empty(saved.shape, dtype=saved.dtype, device=saved.device)
        self.stash.restore(saved.handle, out)   # keep_sign: on the saved side of 0 already
        return out


class LayerBounds:
    """Per-layer bounds for ``compressed_activations``, chosen from the training itself
    (kompress::layer_bounds; docs/python.md, "Per-layer bounds").

    A layer here is one of the activations a forward pass saves, numbered in the order they are
    saved (the n-th distinct float tensor; the hooks' ``layers()`` names them). Every layer starts
    at the hooks' bound (``abs`` or ``rel``, a number). On a check step, before the step's own
    forward pass, ``check_batch`` of the batch's rows are run once with every activation exact
    and once per layer with only that layer compressed at its bound, and each parameter
    gradient's deviation ``||g' - g|| / ||g||`` is measured; a layer whose largest deviation stays
    within ``tolerance`` has its bound multiplied by ``growth`` (up to ``ceiling``), one beyond it
    steps back and settles. The first check step repeats this until every layer has settled, so
    the training runs at the chosen bounds from its first step; later ones (every
    ``check_every`` steps) check every layer once and tighten those that drift. Every restored
    value is within the bound its layer had when it was saved; ``log()`` lists each change.

    A check runs its rows ``check_rows`` at a time (the passes' gradients weighted by their rows,
    as a mean-reduced loss's over all of them), so it holds the exact activations of at most
    ``check_rows`` rows (``check_peak_bytes``): keep that below what a compressed step holds, or
    the check sets the training's peak. It runs one forward and backward pass per group of rows
    and layer, and changes no gradient, parameter, buffer (batch-norm statistics are put back)
    or random state of the step.

        hooks = kompress.torch.compressed_activations(rel=5e-2, rounding="stochastic")
        bounds = kompress.torch.LayerBounds(hooks, ceiling=2e-1, tolerance=0.05)
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = bounds.train_step(step, model, F.cross_entropy, x, y)
            optimizer.step()
    """

    def __init__(self, hooks: compressed_activations, *, ceiling: float, floor: float | None = None,
                 growth: float = 2.0, tolerance: float = 0.05, check_every: int = 50, check_batch: int = 16,
                 check_rows: int = 4):
        who = "kompress.torch.LayerBounds"
        if not isinstance(hooks, compressed_activations):
            raise TypeError(f"{who}: hooks must be a kompress.torch.compressed_activations")
        if hooks._schedule is not None:
            raise _k.InvalidArgument(f"{who}: the hooks already have a LayerBounds")
        if callable(hooks.abs) or callable(hooks.rel):
            raise _k.InvalidArgument(f"{who}: the hooks' bound must be a number, not a callable (it is every "
                                     "layer's first bound)")
        if not isinstance(check_batch, _numbers.Integral) or check_batch < 1:
            raise _k.InvalidArgument(f"{who}: check_batch must be an int >= 1 (got {check_batch!r})")
        if not isinstance(check_rows, _numbers.Integral) or check_rows < 1:
            raise _k.InvalidArgument(f"{who}: check_rows must be an int >= 1 (got {check_rows!r})")
        if not isinstance(check_every, _numbers.Integral) or check_every < 1:
            raise _k.InvalidArgument(f"{who}: check_every must be an int >= 1 (got {check_every!r})")
        self._mode = "abs" if hooks.abs is not None else "rel"
        self._bounds = _k._kompress._LayerBounds(hooks.abs, hooks.rel if hooks.abs is None else None,
                                                 float(ceiling), None if floor is None else float(floor),
                                                 float(growth), float(tolerance), int(check_every))
        self.hooks = hooks
        self.check_batch = int(check_batch)
        self.check_rows = int(check_rows)
        self.check_peak_bytes = 0
        self._ranges = {}  # site -> (min, max) over a check's rows, while it runs
        hooks._schedule = self

    def bound(self, layer: int) -> float:
        """The bound (in the hooks' mode) layer ``layer``'s next save gets."""
        return self._bounds.bound(layer)

    def layers(self) -> dict:
        """Layer number -> what it is: the autograd function that made the tensor and its shape."""
        return dict(self.hooks._site_names)

    def log(self) -> list:
        """Every change of a layer's bound: dicts of step, layer, name, from, to, deviation."""
        names = self.hooks._site_names
        return [dict(step=step, layer=layer, name=names.get(layer, "?"), **{"from": before}, to=after,
                     deviation=deviation) for step, layer, before, after, deviation in self._bounds.log()]

    def _bound_args(self, site, t):
        value = self._bounds.bound(site)
        if self._mode == "abs":
            return value, None
        # A check's group of rows is compressed at the absolute bound that the relative one gives
        # on all of the check's rows (their range, from the exact pass), as one pass over them
        # would be: a few rows' own range is narrower, and would judge the layer too gently. It
        # goes to the stash as the relative bound that is on these rows, so that a stash whose
        # policy loosens relative bounds takes it (a ceiling and a bound must share their mode).
        # Bounds relative to each group of 256 values need no such help: a group's range is the
        # same in a few rows as in all of them.
        grouped = self.hooks.group_relative
        seen = self._ranges.get(site) if self.hooks._only_site not in (None, -1) and not grouped else None
        if seen is not None and _math.isfinite(seen[1] - seen[0]) and seen[1] > seen[0]:
            low, high = (float(v) for v in _torch.aminmax(t.detach()))
            own = high - low
            if _math.isfinite(own) and own > 0:
                return None, value * (seen[1] - seen[0]) / own
            return value * (seen[1] - seen[0]), None
        return None, value

    def _note_range(self, site, t):
        """Widens site's range over a check's rows by t's values (a relative bound's exact pass)."""
        if self._mode != "rel" or self.hooks.group_relative or t.numel() == 0:
            return
        low, high = (float(v) for v in _torch.aminmax(t.detach()))
        seen = self._ranges.get(site)
        self._ranges[site] = (low, high) if seen is None else (min(seen[0], low), max(seen[1], high))

    def train_step(self, step: int, model, loss_fn, inputs, targets):
        """One training step's forward and backward pass under the hooks (the model inside them,
        ``loss_fn(output, targets)`` outside), after a check when one is due; returns the loss,
        detached. Gradients accumulate into the parameters' ``.grad`` as ``loss.backward()``'s."""
        if self._bounds.check_due(step):
            self._check(step, model, loss_fn, inputs, targets)
        loss = self._run(model, loss_fn, inputs, targets, only=None)
        loss.backward()
        return loss.detach()

    def _run(self, model, loss_fn, inputs, targets, only):
        hooks = self.hooks
        hooks._site, hooks._only_site = 0, only
        try:
            with hooks:
                output = model(inputs)
        finally:
            hooks._only_site = None
        return loss_fn(output, targets)

    def _check(self, step, model, loss_fn, inputs, targets):
        hooks = self.hooks
        x, y = inputs[:self.check_batch], targets[:self.check_batch]
        parameters = [p for p in model.parameters() if p.requires_grad]
        buffers = [b.detach().clone() for b in model.buffers()]
        random = _torch.random.get_rng_state()
        cuda_random = _torch.cuda.get_rng_state_all() if _torch.cuda.is_available() else None
        passed, peak = dict(hooks._passed), hooks.peak_bytes

        def restore_random():
            _torch.random.set_rng_state(random)
            if cuda_random is not None:
                _torch.cuda.set_rng_state_all(cuda_random)

        # The rows in groups of at most check_rows, as even as they go (no group of one row where
        # that can be helped: batch norm refuses it).
        rows = len(x)
        groups = max(1, -(-rows // self.check_rows))
        edges = [rows * g // groups for g in range(groups + 1)]

        def gradients(only):
            restore_random()  # each pass draws the same dropout masks, group by group
            total = [None] * len(parameters)
            for first, last in zip(edges, edges[1:]):
                hooks._passed.clear()
                hooks.peak_bytes = 0
                loss = self._run(model, loss_fn, x[first:last], y[first:last], only)
                self.check_peak_bytes = max(self.check_peak_bytes, hooks.peak_bytes)
                weight = (last - first) / rows
                for i, g in enumerate(_torch.autograd.grad(loss, parameters, allow_unused=True)):
                    if g is not None:
                        total[i] = weight * g if total[i] is None else total[i] + weight * g
            return total

        try:
            self._ranges = {}
            exact = gradients(-1)
            layers = hooks._site
            periodic = all(self._bounds.settled(n) for n in range(layers))
            while True:
                for layer in range(layers):
                    if periodic or not self._bounds.settled(layer):
                        self._bounds.report(step, layer, _deviation(exact, gradients(layer)))
                periodic = False
                if all(self._bounds.settled(n) for n in range(layers)):
                    break
        finally:
            with _torch.no_grad():
                for b, kept in zip(model.buffers(), buffers):
                    b.copy_(kept)
            restore_random()
            hooks._passed, hooks.peak_bytes = passed, peak
            self._ranges = {}


def _deviation(exact, approx):
    """The largest ||g' - g|| / ||g|| over the parameters (0 where both are 0, inf where only g is)."""
    worst = 0.0
    for g, h in zip(exact, approx):
        if g is None or h is None:
            continue
        norm = float(_torch.linalg.vector_norm(g.double()))
        difference = float(_torch.linalg.vector_norm((h - g).double()))
        worst = max(worst, difference / norm if norm > 0 else (0.0 if difference == 0 else _math.inf))
    return worst


# --- the DLRM embedding exchange ----------------------------------------------------------

def _exchange(exchange, forward, x, who):
    """One direction of the exchange: (output, report) from either backend."""
    if isinstance(exchange, _GroupEmbeddingExchange):
        return exchange.run(forward, x, who)
    shape = (exchange.local_batch, exchange.total_width) if forward else (exchange.global_batch, exchange.local_width)
    out = _torch.empty(shape, dtype=x.dtype, device=x.device)
    return out, (exchange.forward(x, out) if forward else exchange.backward(x, out))


class _ExchangeFunction(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, pooled_local, exchange, reports):
        x = pooled_local.detach()
        if not x.is_contiguous():
            x = x.contiguous()
        out, reports["forward"] = _exchange(exchange, True, x, "kompress.torch.EmbeddingAllToAll")
        ctx.exchange, ctx.reports = exchange, reports
        return out

    @staticmethod
    def backward(ctx, grad):
        g = grad.detach()
        if not g.is_contiguous():
            g = g.contiguous()
        out, ctx.reports["backward"] = _exchange(ctx.exchange, False, g, "kompress.torch.EmbeddingAllToAll.backward")
        return out, None, None


class EmbeddingAllToAll(_torch.nn.Module):
    """The DLRM embedding exchange as a module: takes the pooled embeddings of this rank's
    tables for the global batch, ``[global batch x local width]`` (this rank's tables' columns
    side by side, in table order), and returns every table's pooled embeddings for this rank's
    slice of the batch, ``[local batch x total width]``. Its backward sends the gradients back
    through the reverse all-to-all, compressed with the backward bound.

    Args: as kompress.EmbeddingExchange (tables as (owner, dim) pairs, local_batch, comm,
    forward_abs/forward_rel, backward_abs/backward_rel, table_weights, bound_schedule, ...).
    ``comm``: a torch.distributed process group (the exchange runs on its all_to_all_single,
    same layout and bounds: docs/python.md), an mpi4py communicator (kompress.EmbeddingExchange
    over MPI), or None: the default process group where torch.distributed is initialised, else
    MPI.COMM_WORLD. ``last_reports`` holds the report of the last forward and backward exchange.
    Every rank must call it in the same order (it is a collective, blocking in both passes).
    """

    def __init__(self, tables, local_batch, comm=None, **options):
        super().__init__()
        if comm is None and _dist.is_available() and _dist.is_initialized():
            comm = _dist.group.WORLD
        if _is_process_group(comm):
            self.exchange = _GroupEmbeddingExchange(tables, local_batch, comm, **options)
        else:
            self.exchange = _k.EmbeddingExchange(tables, local_batch, comm, **options)
        self.last_reports = {}

    def forward(self, pooled_local):
        if not _usable(pooled_local) and not isinstance(self.exchange, _GroupEmbeddingExchange):
            who = "kompress.torch.EmbeddingAllToAll"
            _k._raise_on_every_rank(_k.InvalidArgument(f"{who}: takes CPU tensors, and CUDA tensors in a CUDA build "
                                                       f"of kompress (got a tensor on {pooled_local.device})"),
                                    self.exchange.comm, who)
        self.last_reports = {}
        return _ExchangeFunction.apply(pooled_local, self.exchange, self.last_reports)
