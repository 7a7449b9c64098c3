"""Reader: one rank's plan of a dataset read ahead over several connections, units returned in
plan order (docs/client.md "Readers"). Iterating gives the units' bytes; with copy=False,
memoryviews over the library's buffers, freed when the last view goes."""

import ctypes
import threading
import weakref
from itertools import accumulate, chain
from sys import getrefcount

from ._lib import (READER_MAX_NODES, Handle, ReaderOpts, ReaderStats, TesseraError, Unit,
                   c_void_p, check, enc, lib)
from .client import Client, ConnectOptions
from .plan import encode_state, plan_opts
from .records import record_form

try:  # numpy (optional): a batch buffer without zeroing 256 KiB that is written over at once
    from numpy import empty as _empty
    from numpy import uint8 as _uint8

    def _batch_buffer(n):
        return _empty(n, _uint8)
except ImportError:  # pragma: no cover - numpy is there wherever torch is
    _batch_buffer = bytearray

UNIT = {"shard": 0, "record": 1}
BATCH_BYTES = 256 << 10  # one batch of small units (Reader.stream)
BATCH_MAX = 256
BATCH_UNIT = 16 << 10  # units up to this size (on average) are batched
BATCH_SPARE = 4  # batch buffers a stream keeps to fill again (warm, and no allocation)
NO_HINTS = (1 << 64) - 1  # TESSERA_READER_NO_HINTS


class _Kept:
    """Owns a buffer the reader let go of (tessera_reader_keep): given back to the reader for
    its next units while it is open (no fresh memory per unit), else freed."""

    __slots__ = ("ptr", "reader")

    def __init__(self, ptr, reader):
        self.ptr, self.reader = ptr, weakref.ref(reader)  # views do not keep a reader open

    def __del__(self):
        reader = self.reader()
        if reader is not None:
            with reader._lock:  # not while another thread closes it
                if reader._h:
                    lib().tessera_reader_give_back(reader._h, self.ptr)
                    return
        lib().tessera_buffer_free(self.ptr)


class Item:
    """One unit: its bytes (or a memoryview) and where it came from."""

    __slots__ = ("data", "k", "unit", "shard", "record", "offset", "node")

    def __init__(self, data, u):
        self.data = data
        self.k, self.unit, self.shard = u.k, u.unit, u.shard
        self.record, self.offset = u.record, u.offset
        self.node = u.node.decode() if u.node else ""

    def __repr__(self):
        return (f"Item(k={self.k}, unit={self.unit}, shard={self.shard}, record={self.record}, "
                f"{len(self.data)} bytes from {self.node or '-'})")


class Reader(Handle):
    """Reads rank `rank` of `world`'s plan of `dataset`.

    connect: an address, a ConnectOptions or a Client (its options are used; the reader opens
    connections of its own). unit: "record" or "shard". Plan options: seed, epoch, shuffle
    ("none", "global", "window", or "given" with order: a permutation of the units), window
    (shards per shuffle window), assign ("contiguous",
    "strided"), remainder ("uneven", "drop", "pad"). resume: a state from state(). Reader
    options: window_units, window_bytes, connections, depth, retries (library defaults when
    None); split_block, split_n, split_i: this worker's part of the rank's plan (blocks i, i+n,
    ... of split_block positions). copy: True gives bytes; False memoryviews without a copy.
    record: what a record unit is (tessera.records): "auto" (its payload when the dataset says
    its record format, e.g. the data of a TFRecord; else its bytes), "framed" or "payload".
    hint_bytes: how much of the plan past the caller the reader tells the nodes about (HINT),
    so they read it ahead into their caches (None: the library's 64 MiB; 0: no hints).
    """

    _free = "tessera_reader_close"
    _lock = threading.RLock()  # replaced per reader; guards _h against views given back
    _closed_stats = None  # stats() once closed

    def __init__(self, connect, dataset, *, unit="record", rank=0, world=1, seed=0, epoch=0,
                 shuffle="none", window=16, assign="contiguous", remainder="uneven", order=None,
                 resume=None, window_units=None, window_bytes=None, connections=None,
                 depth=None, retries=None, split_block=1, split_n=1, split_i=0, copy=True,
                 record="auto", hint_bytes=None):
        if isinstance(connect, Client):
            connect = connect.options
        elif not isinstance(connect, ConnectOptions):
            connect = ConnectOptions(connect)
        if unit not in UNIT:
            raise ValueError(f"unit must be 'record' or 'shard' (got {unit!r})")
        self._h = None
        self._lock = threading.RLock()  # reentrant: a view may be collected inside close()
        self.dataset, self.rank, self.world, self.copy = dataset, rank, world, copy
        o = ReaderOpts()
        lib().tessera_reader_opts_init(ctypes.byref(o))
        defaults = {k: getattr(o, k) for k in ("window_units", "window_bytes", "connections",
                                               "depth", "retries")}
        self._name = enc(dataset)
        o.dataset = self._name
        o.unit = UNIT[unit]
        self._plan_opts = plan_opts(len(order) if order is not None else 0, rank=rank,
                                    world=world, seed=seed, epoch=epoch, shuffle=shuffle,
                                    assign=assign, remainder=remainder, window=window,
                                    order=order)  # keeps the order's array alive
        o.plan = self._plan_opts
        if resume is not None:
            self._resume = ctypes.create_string_buffer(bytes(resume), len(resume))
            o.resume, o.resume_len = ctypes.cast(self._resume, c_void_p), len(resume)
        for k, v in (("window_units", window_units), ("window_bytes", window_bytes),
                     ("connections", connections), ("depth", depth), ("retries", retries)):
            setattr(o, k, defaults[k] if v is None else v)
        o.split_block, o.split_n, o.split_i = split_block, split_n, split_i
        o.record = record_form(record)
        if hint_bytes is not None:  # 0: no hints
            o.hint_bytes = hint_bytes if hint_bytes > 0 else NO_HINTS
        co = connect.struct()
        err = ctypes.create_string_buffer(512)
        h = c_void_p()
        rc = lib().tessera_reader_open(ctypes.byref(h), ctypes.byref(co), ctypes.byref(o), err,
                                       512)
        check(rc, err.value.decode())
        self._h = h
        self._u = Unit()

    def close(self):
        with self._lock:
            if self._h:
                self._closed_stats = dict(self.stats(), ahead_bytes=0)  # counters stay
            super().close()

    def __len__(self):
        """Units this rank's plan holds."""
        return lib().tessera_reader_len(self._h)

    @property
    def consumed(self):
        """Units returned so far."""
        return lib().tessera_reader_consumed(self._h)

    def _data(self, u):
        """The bytes of unit u, just returned: a copy, or a view that keeps the buffer."""
        if self.copy:
            return ctypes.string_at(u.data, u.len)
        lib().tessera_reader_keep(self._h)
        arr = (ctypes.c_uint8 * u.len).from_address(u.data)
        arr._owner = _Kept(u.buffer, self)  # data may be a payload past the buffer's start
        return memoryview(arr)

    def _fail(self, rc):
        raise TesseraError(rc, lib().tessera_reader_error(self._h).decode())

    def next_item(self):
        """The next unit as an Item, or None at the end of the plan. Raises TesseraError (with
        the dataset, shard and record) for a unit no replica could serve."""
        if not self._h:
            raise ValueError("the reader is closed")
        rc = lib().tessera_reader_next(self._h, ctypes.byref(self._u))
        if rc == 0:
            return None
        if rc < 0:
            self._fail(rc)
        return Item(self._data(self._u), self._u)

    def __iter__(self):
        """The units' data in plan order (the hot path: no Item per unit)."""
        if not self._h:
            raise ValueError("the reader is closed")
        nxt, h, u = lib().tessera_reader_next, self._h, self._u
        ref, string_at = ctypes.byref(u), ctypes.string_at
        while True:
            rc = nxt(h, ref)
            if rc <= 0:
                if rc < 0:
                    self._fail(rc)
                return
            yield string_at(u.data, u.len) if self.copy else self._data(u)

    def stream(self):
        """The units' data in plan order, like iteration, small ones fetched in batches: units
        of at most BATCH_UNIT bytes come one library call per batch, copied once, back to back,
        into a buffer (a numpy array, else a bytearray; one of the stream's last few that no
        view refers to any more, else a fresh one), as memoryviews into it (bytes with
        copy=True); larger ones one by one, as iteration gives them (without a copy when
        copy=False). The stream watches the sizes it gets and switches between the two. For
        small records (a few KiB) this costs a fraction of iteration's per-unit calls.
        `consumed` then counts the units fetched: up to a batch more than were yielded when the
        stream is left early."""
        if not self._h:
            raise ValueError("the reader is closed")
        nxt, many, h, u = lib().tessera_reader_next, lib().tessera_reader_next_many, self._h, self._u
        ref, string_at = ctypes.byref(u), ctypes.string_at
        lens, n = (ctypes.c_size_t * BATCH_MAX)(), ctypes.c_uint32()
        lens_ref = ctypes.cast(lens, ctypes.POINTER(ctypes.c_size_t))
        n_ref = ctypes.byref(n)
        batched, small_run = True, 0
        spare = []  # batch buffers, filled again once no view of theirs is left
        while True:
            if batched:
                buf = None
                for i in range(len(spare)):
                    if getrefcount(spare[i]) == 2:  # this list and the call: no view is left
                        buf = spare[i]
                        break
                if buf is None:
                    buf = _batch_buffer(BATCH_BYTES)
                    if len(spare) < BATCH_SPARE:
                        spare.append(buf)
                rc = many(h, (ctypes.c_char * BATCH_BYTES).from_buffer(buf), BATCH_BYTES,
                          lens_ref, BATCH_MAX, n_ref)
                if rc <= 0:
                    if rc < 0:
                        self._fail(rc)
                    return
                k = n.value
                if k:
                    # The batch's slices made and handed on in C (map), not per unit in Python.
                    ends = list(accumulate(lens[:k]))
                    views = map(memoryview(buf).__getitem__, map(slice, chain((0,), ends), ends))
                    yield from map(bytes, views) if self.copy else views
                    batched = ends[-1] <= k * BATCH_UNIT  # large units: one by one from now
                    continue
                batched = False  # larger than a batch: on its own, and so on while large
            rc = nxt(h, ref)
            if rc <= 0:
                if rc < 0:
                    self._fail(rc)
                return
            small_run = small_run + 1 if u.len <= BATCH_UNIT else 0
            batched = small_run >= 16
            yield string_at(u.data, u.len) if self.copy else self._data(u)

    def items(self):
        while True:
            item = self.next_item()
            if item is None:
                return
            yield item

    def state(self, consumed):
        """The job's position (bytes) from every rank's consumed count, in rank order."""
        return encode_state(lib().tessera_reader_plan(self._h), consumed)

    def stats(self):
        """What the reader did so far (docs/client.md "Readers"): units and bytes returned,
        stall_s (time waited in the library for data) and stalls, retries, reconnects,
        index_loads, ahead_bytes (held ahead now), ahead_bytes_max, and per node ("served") its
        units and bytes. Counters only grow; after close(), the last ones (ahead_bytes 0)."""
        if not self._h:
            return dict(self._closed_stats or stats_dict(ReaderStats()))
        s = ReaderStats()
        lib().tessera_reader_stats(self._h, ctypes.byref(s))
        return stats_dict(s)


def stats_dict(s):
    """A ReaderStats struct as Reader.stats() gives it."""
    return {
        "units": s.units, "bytes": s.bytes, "stall_s": s.stall_ns / 1e9, "stalls": s.stalls,
        "retries": s.retries, "reconnects": s.reconnects, "index_loads": s.index_loads,
        "ahead_bytes": s.ahead_bytes, "ahead_bytes_max": s.ahead_bytes_max,
        "hinted_units": s.hinted_units, "hint_queued": s.hint_queued,
        "hint_dropped": s.hint_dropped,
        "served": {s.nodes[i].node.decode(): {"units": s.nodes[i].units,
                                              "bytes": s.nodes[i].bytes}
                   for i in range(min(s.nnodes, READER_MAX_NODES))},
    }
