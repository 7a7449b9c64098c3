"""PyTorch: tessera records as a torch IterableDataset (split by rank and by DataLoader worker,
set_epoch, exact resume), a DataLoader that counts what it handed out so it can save and
restore the position, a map-style Dataset over the record index, and a sampler with
DistributedSampler's semantics over plans.

Which records a rank reads is DistributedSampler's choice: rank r of W takes positions r, r+W,
... of the epoch's order (shuffled by seed and epoch, or not), padded by repeating the order's
start so every rank reads as many (drop_last=False), or cut to the largest multiple of W
(drop_last=True). Within a rank, DataLoader worker w of n reads batches w, w+n, ... of the
rank's list, so the loader's batches (taken from the workers in turn) are the rank's list in
order: after k batches a rank consumed exactly its first k * batch_size records, whatever n
was. That is what a state_dict records; a loader given it (any worker count, any world size)
reads exactly the rest of the epoch.
"""

import ctypes
import multiprocessing
import time
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader as _TorchLoader
from torch.utils.data import Dataset, IterableDataset, Sampler, get_worker_info

from . import metrics as _metrics
from ._lib import ReaderStats, lib
from .client import Client, ConnectOptions
from .plan import Plan
from .reader import Reader, stats_dict
from .records import payload, record_form

# Units a DataLoader worker reads ahead (within 4 MiB). The window refills by halves, and a
# half of small records leaves as one READV per node (bench/loader, 4 KiB records: 256 was as
# fast as 512 on a cluster and faster on one node, where a larger window costs cache misses).
READ_AHEAD = 256
# Small records (a unit of at most SMALL_UNIT bytes on average, e.g. 4 KiB samples): 256 of
# them are 1 MiB, and the loader waits on each half-window's round trip. A worker then reads
# SMALL_READ_AHEAD units ahead within SMALL_WINDOW_BYTES (docs/benchmarks.md, "Target 1, s4k").
SMALL_UNIT = 16 << 10
SMALL_READ_AHEAD = 4096
SMALL_WINDOW_BYTES = 32 << 20


def _dist_rank_world(rank, world):
    if rank is not None and world is not None:
        return rank, world
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return (rank or 0), (world or 1)


def _check_order(order, shuffle):
    if order not in ("tessera", "torch"):
        raise ValueError(f"order must be 'tessera' or 'torch' (got {order!r})")
    if order == "torch" and shuffle not in ("global", True):
        raise ValueError("order='torch' is the order of a global shuffle (shuffle=True)")
    return order


def _randperm(n, seed, epoch):
    """DistributedSampler's permutation of range(n) for seed and epoch."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()


class _Slot(ctypes.Structure):
    """One DataLoader worker's reader stats in memory shared with the loader's process: the
    sum over the worker's closed readers (done) and its open reader's (live), written under a
    sequence count (odd while written)."""

    _fields_ = [("seq", ctypes.c_uint64), ("done", ReaderStats), ("live", ReaderStats)]


_COUNTERS = ("units", "bytes", "stall_ns", "stalls", "retries", "reconnects", "index_loads")


def _fold(dst, src):
    """Adds the counters of ReaderStats src into dst (per node by name, up to the struct's
    room)."""
    for f in _COUNTERS:
        setattr(dst, f, getattr(dst, f) + getattr(src, f))
    dst.ahead_bytes_max = max(dst.ahead_bytes_max, src.ahead_bytes_max)
    dst.ahead_bytes = 0
    names = [dst.nodes[i].node for i in range(dst.nnodes)]
    for i in range(min(src.nnodes, len(src.nodes))):
        n = src.nodes[i]
        if n.node in names:
            d = dst.nodes[names.index(n.node)]
        elif dst.nnodes < len(dst.nodes):
            d = dst.nodes[dst.nnodes]
            d.node, d.units, d.bytes = n.node, 0, 0
            dst.nnodes += 1
            names.append(n.node)
        else:
            continue
        d.units += n.units
        d.bytes += n.bytes


def _slot_write(slot, fn):
    slot.seq += 1
    try:
        fn()
    finally:
        slot.seq += 1


def _slot_read(slot):
    """A consistent copy of slot's (done, live), both ReaderStats."""
    done, live = ReaderStats(), ReaderStats()
    for _ in range(1000):
        seq = slot.seq
        if seq & 1 == 0:
            ctypes.pointer(done)[0] = slot.done
            ctypes.pointer(live)[0] = slot.live
            if slot.seq == seq:
                break
        time.sleep(0)
    return done, live


def _opts(connect):
    if isinstance(connect, Client):
        return connect.options
    return connect if isinstance(connect, ConnectOptions) else ConnectOptions(connect)


class TesseraIterable(IterableDataset):
    """The records of a tessera dataset for one rank (from torch.distributed when initialised,
    else rank/world), split among the DataLoader's workers in blocks of batch_size.

    shuffle: False (the dataset's order), True or "global" (a permutation of all records per
    epoch), "window" (shards shuffled, records shuffled within windows of `window` shards).
    order: "tessera" (the global shuffle's permutation is tessera's own, computed per record in
    constant memory) or "torch" (it is torch.randperm(n) from a generator seeded with seed +
    epoch, as DistributedSampler's: the same indices as DistributedSampler(shuffle=True,
    seed=seed) for the dataset's records, at 8 bytes per record).
    drop_last as DistributedSampler's. transform(bytes) -> sample, applied in the worker.
    record: "auto" (a record's payload when the dataset says its format, e.g. a TFRecord's
    data), "framed" or "payload" (tessera.records). reader: options for tessera.Reader
    (window_units, connections, ...).
    """

    def __init__(self, connect, dataset, *, batch_size=1, rank=None, world=None, shuffle=True,
                 seed=0, window=16, drop_last=False, transform=None, copy=True, record="auto",
                 order="tessera", reader=None):
        self.connect = _opts(connect)
        self.dataset = dataset
        self.batch_size = batch_size
        self.rank, self.world = _dist_rank_world(rank, world)
        self.shuffle = "global" if shuffle is True else ("none" if not shuffle else shuffle)
        self.seed, self.window, self.drop_last = seed, window, drop_last
        self.order = _check_order(order, self.shuffle)
        self._torch_order = None  # (epoch, its permutation) when order="torch"
        self.transform, self.copy = transform, copy
        record_form(record)  # refused here, not in a worker
        self.reader_options = dict(reader or {}, record=record)
        self.epoch = 0
        self._resume = None       # the position this epoch resumes from (bytes), or None
        self._resume_world = None
        self._units = None
        self._counts = None       # records per shard (units() fetches them)
        self._bytes = None        # the dataset's bytes (units() fetches them)
        self.yielded = 0          # records yielded when iterated in this process
        # Reader stats (reader_stats()): readers of this process (the open one, the sum of the
        # closed ones) and DataLoader workers' slots in shared memory (track_workers()).
        self._mine = (None, None)  # (stats of this process's closed readers, the open one)
        self._slots = None

    # ---- the plan ---------------------------------------------------------------------------

    def _plan_options(self, rank, world):
        o = dict(rank=rank, world=world, seed=self.seed, epoch=self.epoch,
                 shuffle=self.shuffle, window=self.window, assign="strided",
                 remainder="drop" if self.drop_last else "pad")
        if self.order == "torch":
            if self._torch_order is None or self._torch_order[0] != self.epoch:
                self._torch_order = (self.epoch, _randperm(self.units(), self.seed, self.epoch))
            o.update(shuffle="given", order=self._torch_order[1])
        return o

    def units(self):
        """Records in the dataset (its complete shards)."""
        if self._units is None:
            with Client(self.connect) as c:
                self._counts = [n for _, n in c.record_counts(self.dataset)]
                self._bytes = c.dataset(self.dataset)["bytes"]
            self._units = sum(self._counts)
        return self._units

    def _plan(self, rank, world):
        self.units()  # the shards' record counts: the window shuffle's groups
        groups = self._counts if self.shuffle == "window" else None
        return Plan(self._units, resume=self._resume, group_sizes=groups,
                    **self._plan_options(rank, world))

    def __getstate__(self):  # to DataLoader workers: without the permutation (made again)
        state = dict(self.__dict__)
        state["_torch_order"] = None
        state["_mine"] = (None, None)  # this process's readers stay here
        return state

    # ---- reader stats -----------------------------------------------------------------------

    def track_workers(self, n):
        """Makes room for the reader stats of n DataLoader workers in memory shared with them
        (tessera.torch.DataLoader calls it before starting its workers; call it before a plain
        torch DataLoader starts its own). Workers past the room are not counted."""
        n = max(int(n), 1)
        if self._slots is not None and len(self._slots) >= n:
            return
        slots = multiprocessing.RawArray(_Slot, n)
        if self._slots is not None:
            ctypes.memmove(slots, self._slots, ctypes.sizeof(self._slots))
        self._slots = slots

    def reader_stats(self):
        """The stats (as Reader.stats()) of every reader this dataset opened for its rank, in
        this process and in DataLoader workers, summed: counters over all epochs so far
        (workers' as of the last batch each handed over), ahead_bytes held now."""
        total = ReaderStats()
        ahead = 0
        for i in range(len(self._slots) if self._slots is not None else 0):
            done, live = _slot_read(self._slots[i])
            _fold(total, done)
            _fold(total, live)
            ahead += live.ahead_bytes
        out = stats_dict(total)
        out["ahead_bytes"] = ahead
        done, live = self._mine  # one read: iteration replaces the pair as a whole
        if done is not None:
            out = _metrics.add_stats(out, done)
        if live is not None:
            out = _metrics.add_stats(out, live.stats())
        return out

    def rank_len(self, rank=None):
        """Records rank `rank` (default: this one) reads this epoch (what is left of it after a
        resume)."""
        return len(self._plan(self.rank if rank is None else rank, self.world))

    def __len__(self):
        return self.rank_len()

    def set_epoch(self, epoch):
        """A new epoch: a new order (when shuffled), the same on every rank; starts afresh."""
        self.epoch = epoch
        self._resume = None
        self.yielded = 0

    # ---- iterating --------------------------------------------------------------------------

    def __iter__(self):
        info = get_worker_info()
        n, i = (info.num_workers, info.id) if info else (1, 0)
        opts = dict(self.reader_options)
        if info:
            # Each worker is a stream of its own already: one connection (thread) per worker
            # keeps the workers' threads from crowding the loader's cores.
            opts.setdefault("connections", 1)
            self.units()
            if self._units and self._bytes <= self._units * SMALL_UNIT:
                opts.setdefault("window_units", SMALL_READ_AHEAD)
                opts.setdefault("depth", SMALL_READ_AHEAD)
                opts.setdefault("window_bytes", SMALL_WINDOW_BYTES)
            opts.setdefault("window_units", READ_AHEAD)
            opts.setdefault("depth", READ_AHEAD)
            opts.setdefault("window_bytes", 4 << 20)  # large records: fewer, still in cache
        opts.update(split_block=self.batch_size, split_n=n, split_i=i)
        reader = Reader(self.connect, self.dataset, unit="record", resume=self._resume,
                        copy=self.copy, **self._plan_options(self.rank, self.world), **opts)
        slot = None
        if info is None:
            self._mine = (self._mine[0], reader)  # read live by reader_stats()
        elif self._slots is not None and i < len(self._slots):
            slot = self._slots[i]
        try:
            items = reader.stream()  # batched: small records cost one call per batch
            if self.transform:
                items = map(self.transform, items)
            if slot is None:
                for data in items:
                    self.yielded += 1
                    yield data
            else:
                # A worker hands its reader's stats over once per batch (one library call).
                every = left = max(self.batch_size, 1)
                for data in items:
                    self.yielded += 1
                    left -= 1
                    if not left:
                        left = every
                        _slot_write(slot, lambda: lib().tessera_reader_stats(
                            reader._h, ctypes.byref(slot.live)))
                    yield data
        finally:
            if slot is not None:
                last = ReaderStats()
                lib().tessera_reader_stats(reader._h, ctypes.byref(last))

                def fold():
                    _fold(slot.done, last)
                    ctypes.memset(ctypes.byref(slot.live), 0, ctypes.sizeof(ReaderStats))
                _slot_write(slot, fold)
            reader.close()
            if info is None:
                done, st = self._mine[0], reader.stats()  # a closed reader's stay as they are
                self._mine = (st if done is None else _metrics.add_stats(done, st), None)

    # ---- resume -----------------------------------------------------------------------------

    def position(self, consumed):
        """The job's position (bytes) once every rank consumed `consumed` records of this
        epoch's list (ranks go in step: each consumed as many, or all it had)."""
        plans = [self._plan(r, self.world) for r in range(self.world)]
        return plans[0].state([min(consumed, len(p)) for p in plans])

    def state_dict(self, consumed=None):
        """Where the job is: epoch and position. consumed: records each rank consumed this epoch
        (default: what this object yielded, right when iterated in this process; a
        tessera.torch.DataLoader passes its own count)."""
        consumed = self.yielded if consumed is None else consumed
        return {"epoch": self.epoch, "seed": self.seed, "dataset": self.dataset,
                "position": self.position(consumed)}

    def load_state_dict(self, state):
        """Continues the saved epoch from its position: the next iteration reads exactly what
        the job had not read (at any world size and worker count)."""
        if state.get("dataset") != self.dataset or state.get("seed") != self.seed:
            raise ValueError("the state is of another dataset or seed")
        self.epoch = state["epoch"]
        self._resume = state["position"]
        self.yielded = 0


class DataLoader(_TorchLoader):
    """torch's DataLoader over a TesseraIterable, counting the batches it handed out, with
    state_dict() / load_state_dict() for exact resume. Its batch size is the dataset's."""

    def __init__(self, dataset, **kwargs):
        if not isinstance(dataset, TesseraIterable):
            raise TypeError("tessera.torch.DataLoader reads a TesseraIterable")
        kwargs.setdefault("batch_size", dataset.batch_size)
        if kwargs["batch_size"] != dataset.batch_size:
            raise ValueError("the loader's batch_size must be the dataset's")
        super().__init__(dataset, **kwargs)
        self._records = 0
        dataset.track_workers(self.num_workers)

    def __iter__(self):
        self._records = 0
        self.dataset.track_workers(self.num_workers)  # before the workers start
        for batch in super().__iter__():
            # Every batch but a rank's last holds batch_size records (the workers' blocks);
            # position() caps the count at the rank's length.
            self._records += self.batch_size
            yield batch

    def state_dict(self):
        return self.dataset.state_dict(consumed=self._records)

    def reader_stats(self):
        """The dataset's reader stats (TesseraIterable.reader_stats)."""
        return self.dataset.reader_stats()

    def load_state_dict(self, state):
        self.dataset.load_state_dict(state)
        self._records = 0


class TesseraRecords(Dataset):
    """Map-style: record i of the dataset (its complete shards in shard order, by their record
    indexes). Each process opens its own connection on first use. record: as
    TesseraIterable's."""

    def __init__(self, connect, dataset, transform=None, record="auto"):
        self.connect, self.dataset, self.transform = _opts(connect), dataset, transform
        form = record_form(record)
        with Client(self.connect) as c:
            counts = c.record_counts(dataset)
            fmt = c.dataset(dataset)["record_format"]
        # framed: as stored; payload: per the dataset's format (none: as stored too)
        self._format = "none" if form == 1 else fmt
        self._shards = [s for s, _ in counts]
        self._first, t = [], 0
        for _, n in counts:
            self._first.append(t)
            t += n
        self._counts = [n for _, n in counts]
        self._total = t
        self._client = None
        self._pid = None
        self._index = {}

    def __len__(self):
        return self._total

    def _conn(self):
        import os
        if self._client is None or self._pid != os.getpid():
            self._client, self._pid, self._index = Client(self.connect), os.getpid(), {}
        return self._client

    def __getitem__(self, i):
        import bisect
        if i < 0:
            i += self._total
        if not 0 <= i < self._total:
            raise IndexError(i)
        s = bisect.bisect_right(self._first, i) - 1
        while self._counts[s] == 0 or i - self._first[s] >= self._counts[s]:
            s += 1
        c = self._conn()
        shard = self._shards[s]
        if shard not in self._index:
            offs = c.shard_records(self.dataset, shard)
            self._index[shard] = (offs, c.shard(self.dataset, shard)["size"])
        offs, size = self._index[shard]
        k = i - self._first[s]
        end = offs[k + 1] if k + 1 < len(offs) else size
        data = payload(self._format, c.read(self.dataset, shard, offs[k], end - offs[k]))
        return self.transform(data) if self.transform else data


class PlanSampler(Sampler):
    """DistributedSampler's semantics (padding, drop_last, set_epoch) over tessera plans: the
    same indices as the plan a TesseraIterable reads. order="torch": DistributedSampler's own
    indices (its torch.randperm permutation)."""

    def __init__(self, n, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False,
                 order="tessera"):
        self.n = n
        self.rank, self.world = _dist_rank_world(rank, num_replicas)
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        self.order = _check_order(order, "global" if shuffle else "none")

    def set_epoch(self, epoch):
        self.epoch = epoch

    def _plan(self):
        o = dict(shuffle="global" if self.shuffle else "none")
        if self.order == "torch":
            o = dict(shuffle="given", order=_randperm(self.n, self.seed, self.epoch))
        return Plan(self.n, rank=self.rank, world=self.world, seed=self.seed, epoch=self.epoch,
                    assign="strided", remainder="drop" if self.drop_last else "pad", **o)

    def __iter__(self):
        return iter(self._plan())

    def __len__(self):
        return len(self._plan())


class Step(NamedTuple):
    """One training step as StepMonitor saw it: its number (from 1), its time (seconds), the
    reader's data stall inside it (the growth of its stall counter, seconds), and the time the
    loop waited for the step's batch (in next(); with DataLoader workers, the wait for the
    workers)."""

    step: int
    seconds: float
    stall_s: float
    wait_s: float


class StepMonitor:
    """The per-step hook: each training step's time next to the data stall inside it.

        mon = tessera.torch.StepMonitor(loader, on_step=log)
        for batch in mon.wrap(loader):   # or: with mon.step(): ... around a step
            train(batch)                 # mon.last: the step before this one

    source: what the stall is read from (a DataLoader, TesseraIterable or Reader; its
    reader_stats() or stats()). A step of wrap() runs from asking for its batch to asking for
    the next, so its time is the loop's time per step. Each step ends in `last` (a Step),
    `steps` counts them, on_step(step) is called, and, with prometheus_client, the rank's
    tessera_job_steps_total, tessera_job_step_seconds and tessera_job_step_stall_seconds on
    registry (default REGISTRY; histograms=False: none; True: ImportError without
    prometheus_client). rank: the label (default the source's rank)."""

    def __init__(self, source, *, rank=None, registry=None, histograms=None, on_step=None):
        self.source = _metrics.source_of(source)
        self.rank = _metrics.rank_of(source, rank)
        self.on_step = on_step
        self.steps = 0
        self.last = None
        self._t0 = self._stall0 = None
        self._wait = 0.0
        self._m = None
        if histograms or (histograms is None and _metrics.available()):
            steps, secs, stall = _metrics.step_metrics(registry)
            r = str(self.rank)
            self._m = (steps.labels(rank=r), secs.labels(rank=r), stall.labels(rank=r))

    def _stall(self):
        f = getattr(self.source, "reader_stats", None)
        return (f() if f is not None else self.source.stats())["stall_s"]

    def begin(self):
        """A step starts now."""
        self._wait = 0.0
        self._stall0 = self._stall()
        self._t0 = time.perf_counter()

    def end(self):
        """The step begun last ends now: recorded, and returned as a Step."""
        if self._t0 is None:
            raise RuntimeError("StepMonitor.end() without begin()")
        secs = time.perf_counter() - self._t0
        stall = max(self._stall() - self._stall0, 0.0)
        self._t0 = None
        self.steps += 1
        self.last = Step(self.steps, secs, stall, self._wait)
        if self._m is not None:
            self._m[0].inc()
            self._m[1].observe(secs)
            self._m[2].observe(stall)
        if self.on_step is not None:
            self.on_step(self.last)
        return self.last

    class _Span:
        def __init__(self, mon):
            self.mon = mon

        def __enter__(self):
            self.mon.begin()
            return self.mon

        def __exit__(self, *exc):
            self.mon.end()

    def step(self):
        """A with block that is one step (fetch its batch inside it to count that stall)."""
        return StepMonitor._Span(self)

    def wrap(self, iterable):
        """iterable's batches, each step timed from asking for its batch to asking for the
        next (the step after the last batch, which only meets the end, is not counted)."""
        it = iter(iterable)
        self.begin()
        while True:
            t = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                self._t0 = None
                return
            self._wait += time.perf_counter() - t
            yield batch
            self.end()
            self.begin()


__all__ = ["DataLoader", "PlanSampler", "Step", "StepMonitor", "TesseraIterable",
           "TesseraRecords", "torch"]
