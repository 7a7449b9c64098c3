"""Plan: which units (shards or records) one rank reads in an epoch and in which order,
computed by libtessera (docs/client.md "Plans"); the same answer on every machine."""

import ctypes

from ._lib import Handle, PlanOpts, c_size, c_u64, c_void_p, check, lib

SHUFFLE = {"none": 0, "global": 1, "window": 2, "given": 3}
ASSIGN = {"contiguous": 0, "strided": 1}
REMAINDER = {"uneven": 0, "drop": 1, "pad": 2}


def _pick(table, what, value):
    if value not in table:
        raise ValueError(f"{what} must be one of {', '.join(table)} (got {value!r})")
    return table[value]


def plan_opts(units=0, *, rank=0, world=1, seed=0, epoch=0, shuffle="none",
              assign="contiguous", remainder="uneven", window=16, group_sizes=None, order=None):
    """The C plan options; group sizes and a given order (shuffle="given": a permutation of
    range(units), e.g. torch.randperm's) live in the struct's _keep."""
    o = PlanOpts()
    lib().tessera_plan_opts_init(ctypes.byref(o))
    o.units, o.rank, o.world, o.seed, o.epoch = units, rank, world, seed, epoch
    o.shuffle = _pick(SHUFFLE, "shuffle", shuffle)
    o.assign = _pick(ASSIGN, "assign", assign)
    o.remainder = _pick(REMAINDER, "remainder", remainder)
    o.window = window
    if group_sizes is not None:
        g = (c_u64 * len(group_sizes))(*group_sizes)
        o.group_sizes, o.ngroups = ctypes.cast(g, ctypes.POINTER(c_u64)), len(group_sizes)
        o._keep = g
    if order is not None:
        t = (c_u64 * len(order))(*order)
        o.order = ctypes.cast(t, ctypes.POINTER(c_u64))
        o._keep_order = t
    return o


def encode_state(plan_handle, consumed):
    """The job's position (every rank's consumed count) as bytes, from any rank's plan."""
    c = (c_u64 * len(consumed))(*consumed)
    out, n = c_void_p(), c_size()
    check(lib().tessera_plan_state(plan_handle, c, len(consumed), ctypes.byref(out),
                                   ctypes.byref(n)), "the counts do not fit this plan")
    try:
        return ctypes.string_at(out, n.value)
    finally:
        lib().tessera_buffer_free(out)


class Plan(Handle):
    """A plan over `units` units for rank `rank` of `world`. resume: a state (bytes) saved by
    state() of the same options at any world size; the plan then holds exactly the units not
    read yet."""

    _free = "tessera_plan_free"

    def __init__(self, units, *, resume=None, **options):
        self._h = None
        self._opts = plan_opts(units, **options)
        h = c_void_p()
        if resume is not None:
            check(lib().tessera_plan_resume(ctypes.byref(h), ctypes.byref(self._opts), resume,
                                            len(resume)),
                  "the saved state does not fit these plan options")
        else:
            check(lib().tessera_plan_new(ctypes.byref(h), ctypes.byref(self._opts)),
                  "these options make no plan (rank < world, world >= 1, window >= 1)")
        self._h = h

    def __len__(self):
        return lib().tessera_plan_len(self._h)

    def __getitem__(self, k):
        if k < 0:
            k += len(self)
        u = c_u64()
        check(lib().tessera_plan_unit(self._h, k, ctypes.byref(u)))
        return u.value

    def __iter__(self):
        for k in range(len(self)):
            yield self[k]

    def state(self, consumed):
        """The position of a job whose rank i consumed consumed[i] units of its plan."""
        return encode_state(self._h, consumed)
