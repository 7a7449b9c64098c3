"""libtessera through ctypes: loading the library, the mirrored structs (checked against the
library's own sizes at load), and errors as exceptions.

The library is found, in order: $TESSERA_LIBRARY (a path); libtessera.so.0 / libtessera.so on the
dynamic linker's path (e.g. after `cmake --install`); then, when the package is used from a source
checkout, that checkout's build/lib/libtessera.so. ctypes releases the GIL for the
length of every call into it, so a thread waiting in the reader does not hold up the others.
"""

import ctypes
import ctypes.util
import os

c_char_p = ctypes.c_char_p
c_int = ctypes.c_int
c_uint = ctypes.c_uint
c_u8 = ctypes.c_uint8
c_u32 = ctypes.c_uint32
c_u64 = ctypes.c_uint64
c_size = ctypes.c_size_t
c_void_p = ctypes.c_void_p
P = ctypes.POINTER

NAME_MAX = 128
MAX_READ = 64 << 20


class TesseraError(Exception):
    """A tessera call failed: `code` is the TS_E* code (negative), `name` its symbol
    ("TS_ENOENT"), and the message says what the library or the server said."""

    def __init__(self, code, message=""):
        self.code = code
        self.name = lib().ts_errname(code).decode()
        text = lib().ts_strerror(code).decode()
        self.message = message or text
        super().__init__(f"{self.message} ({self.name})" if message else f"{text} ({self.name})")


class Opts(ctypes.Structure):
    _fields_ = [
        ("address", c_char_p),
        ("tls_ca", c_char_p),
        ("tls_cert", c_char_p),
        ("tls_key", c_char_p),
        ("tls_server_name", c_char_p),
        ("client_name", c_char_p),
        ("timeout_ms", c_int),
        ("max_inflight", c_uint),
        ("domain", c_char_p),
    ]


class Policy(ctypes.Structure):
    _fields_ = [("core", c_u8), ("fringe", c_u8), ("min_core", c_u8), ("chunk_size", c_u32),
                ("record_format", c_u8), ("ec_k", c_u8), ("ec_m", c_u8),
                ("ec_dropped", c_u8)]


class DatasetInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * (NAME_MAX + 1)),
        ("id", c_u64),
        ("policy", Policy),
        ("state", c_int),
        ("created_ns", c_u64),
        ("shards", c_u32),
        ("shards_writing", c_u32),
        ("bytes", c_u64),
    ]


class ShardInfo(ctypes.Structure):
    _fields_ = [
        ("shard", c_u32),
        ("state", c_int),
        ("size", c_u64),
        ("expect_size", c_u64),
        ("chunk_size", c_u32),
        ("nchunks", c_u32),
        ("crc", c_u32),
        ("nrecords", c_u32),
    ]


class PlanOpts(ctypes.Structure):
    _fields_ = [
        ("units", c_u64),
        ("group_sizes", P(c_u64)),
        ("ngroups", c_size),
        ("seed", c_u64),
        ("epoch", c_u64),
        ("rank", c_u32),
        ("world", c_u32),
        ("assign", c_int),
        ("remainder", c_int),
        ("shuffle", c_int),
        ("window", c_u32),
        ("order", P(c_u64)),
    ]


ALLOC_FN = ctypes.CFUNCTYPE(c_void_p, c_void_p, c_size)
FREE_FN = ctypes.CFUNCTYPE(None, c_void_p, c_void_p)
# tessera_dataset_tier's progress: (arg, shards done, shards, bytes done, bytes)
TIER_FN = ctypes.CFUNCTYPE(None, c_void_p, c_u32, c_u32, c_u64, c_u64)


class ReaderOpts(ctypes.Structure):
    _fields_ = [
        ("dataset", c_char_p),
        ("unit", c_int),
        ("plan", PlanOpts),
        ("resume", c_void_p),
        ("resume_len", c_size),
        ("window_units", c_u32),
        ("window_bytes", c_u64),
        ("connections", c_u32),
        ("depth", c_u32),
        ("retries", c_u32),
        ("index_shards", c_u32),
        ("split_block", c_u32),
        ("split_n", c_u32),
        ("split_i", c_u32),
        ("alloc", c_void_p),
        ("free_fn", c_void_p),
        ("alloc_arg", c_void_p),
        ("record", c_int),
        ("hint_bytes", c_u64),
    ]


class Unit(ctypes.Structure):
    _fields_ = [
        ("k", c_u64),
        ("unit", c_u64),
        ("shard", c_u32),
        ("record", c_u64),
        ("offset", c_u64),
        ("data", c_void_p),
        ("len", c_size),
        ("node", c_char_p),
        ("buffer", c_void_p),
    ]


READER_MAX_NODES = 64


class ReaderNode(ctypes.Structure):
    _fields_ = [("node", ctypes.c_char * 64), ("units", c_u64), ("bytes", c_u64)]


class ReaderStats(ctypes.Structure):
    _fields_ = [
        ("units", c_u64),
        ("bytes", c_u64),
        ("stall_ns", c_u64),
        ("stalls", c_u64),
        ("retries", c_u64),
        ("reconnects", c_u64),
        ("index_loads", c_u64),
        ("ahead_bytes_max", c_u64),
        ("ahead_bytes", c_u64),
        ("nnodes", c_size),
        ("nodes", ReaderNode * READER_MAX_NODES),
        ("hinted_units", c_u64),
        ("hint_queued", c_u64),
        ("hint_dropped", c_u64),
    ]


class DatasetRecords(ctypes.Structure):
    _fields_ = [
        ("nshards", c_u32),
        ("shard", P(c_u32)),
        ("count", P(c_u64)),
        ("first", P(c_u64)),
        ("total", c_u64),
        ("bytes", P(c_u64)),
        ("format", c_int),
    ]


_CHECKED = {
    "tessera_opts": Opts,
    "ts_dataset_policy": Policy,
    "ts_dataset_info": DatasetInfo,
    "ts_shard_info": ShardInfo,
    "tessera_plan_opts": PlanOpts,
    "tessera_reader_opts": ReaderOpts,
    "tessera_unit": Unit,
    "tessera_reader_stats": ReaderStats,
    "tessera_reader_node": ReaderNode,
    "tessera_dataset_records": DatasetRecords,
}

# (name, result type, argument types)
_FUNCS = [
    ("ts_strerror", c_char_p, [c_int]),
    ("ts_errname", c_char_p, [c_int]),
    ("tessera_abi_size", c_size, [c_char_p]),
    ("tessera_buffer_free", None, [c_void_p]),
    ("tessera_opts_init", None, [P(Opts)]),
    ("tessera_client_open", c_int, [P(c_void_p), P(Opts)]),
    ("tessera_client_close", None, [c_void_p]),
    ("tessera_client_role", c_int, [c_void_p]),
    ("tessera_client_error", c_char_p, [c_void_p]),
    ("tessera_client_node", c_char_p, [c_void_p]),
    ("tessera_client_epoch", c_u64, [c_void_p]),
    ("tessera_dataset_create", c_int, [c_void_p, c_char_p, P(Policy)]),
    ("tessera_dataset_list", c_int, [c_void_p, P(P(DatasetInfo)), P(c_size)]),
    ("tessera_dataset_stat", c_int, [c_void_p, c_char_p, P(DatasetInfo)]),
    ("tessera_dataset_seal", c_int, [c_void_p, c_char_p]),
    ("tessera_dataset_tier", c_int, [c_void_p, c_char_p, ctypes.c_uint, ctypes.c_uint, TIER_FN,
                                     c_void_p]),
    ("tessera_dataset_delete", c_int, [c_void_p, c_char_p]),
    ("tessera_shard_stat", c_int, [c_void_p, c_char_p, c_u32, P(ShardInfo)]),
    ("tessera_shard_list", c_int, [c_void_p, c_char_p, P(P(ShardInfo)), P(c_size)]),
    ("tessera_shard_records", c_int, [c_void_p, c_char_p, c_u32, P(P(c_u64)), P(c_u32)]),
    ("tessera_dataset_records", c_int, [c_void_p, c_char_p, P(P(DatasetRecords))]),
    ("tessera_dataset_records_free", None, [P(DatasetRecords)]),
    ("tessera_put", c_int, [c_void_p, c_char_p, c_u32, c_void_p, c_size, P(c_u64), c_u32]),
    ("tessera_read", c_int, [c_void_p, c_char_p, c_u32, c_u64, c_size, c_void_p, P(c_size)]),
    ("tessera_status", c_int, [c_void_p, P(c_void_p)]),
    ("tessera_record_payload", c_int, [c_int, c_void_p, c_size, P(c_size), P(c_size)]),
    ("tessera_plan_opts_init", None, [P(PlanOpts)]),
    ("tessera_plan_new", c_int, [P(c_void_p), P(PlanOpts)]),
    ("tessera_plan_free", None, [c_void_p]),
    ("tessera_plan_len", c_u64, [c_void_p]),
    ("tessera_plan_unit", c_int, [c_void_p, c_u64, P(c_u64)]),
    ("tessera_plan_state", c_int, [c_void_p, P(c_u64), c_u32, P(c_void_p), P(c_size)]),
    ("tessera_plan_resume", c_int, [P(c_void_p), P(PlanOpts), c_void_p, c_size]),
    ("tessera_reader_opts_init", None, [P(ReaderOpts)]),
    ("tessera_reader_open", c_int,
     [P(c_void_p), P(Opts), P(ReaderOpts), ctypes.c_char_p, c_size]),
    ("tessera_reader_next", c_int, [c_void_p, P(Unit)]),
    ("tessera_reader_keep", c_int, [c_void_p]),
    ("tessera_reader_give_back", None, [c_void_p, c_void_p]),
    ("tessera_reader_next_many", c_int,
     [c_void_p, c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint32,
      ctypes.POINTER(ctypes.c_uint32)]),
    ("tessera_reader_len", c_u64, [c_void_p]),
    ("tessera_reader_consumed", c_u64, [c_void_p]),
    ("tessera_reader_plan", c_void_p, [c_void_p]),
    ("tessera_reader_stats", None, [c_void_p, P(ReaderStats)]),
    ("tessera_reader_error", c_char_p, [c_void_p]),
    ("tessera_reader_close", None, [c_void_p]),
]

_lib = None


def _find():
    path = os.environ.get("TESSERA_LIBRARY")
    if path:
        return path
    for name in ("libtessera.so.0", "libtessera.so"):
        try:
            ctypes.CDLL(name)
            return name
        except OSError:
            pass
    found = ctypes.util.find_library("tessera")
    if found:
        return found
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "lib",
                        "libtessera.so")
    if os.path.exists(here):
        return os.path.abspath(here)
    raise OSError(
        "libtessera not found: install it (cmake --install) or set TESSERA_LIBRARY "
        "to the path of libtessera.so"
    )


def lib():
    """The loaded library, its functions typed and its struct layouts checked."""
    global _lib
    if _lib is not None:
        return _lib
    handle = ctypes.CDLL(_find())
    for name, res, args in _FUNCS:
        f = getattr(handle, name)
        f.restype = res
        f.argtypes = args
    for cname, py in _CHECKED.items():
        want = handle.tessera_abi_size(cname.encode())
        if want != ctypes.sizeof(py):
            raise OSError(
                f"libtessera's struct {cname} is {want} bytes, this package expects "
                f"{ctypes.sizeof(py)}: the package and the library are from different versions"
            )
    _lib = handle
    return _lib


class Handle:
    """A library object owned by Python: closed by close(), a with block, or collection.
    Subclasses name the library function that releases it in _free."""

    _h = None
    _free = None

    def close(self):
        if self._h:
            getattr(lib(), self._free)(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


def check(rc, message=""):
    """Raises TesseraError for a negative code; returns rc otherwise."""
    if rc < 0:
        raise TesseraError(rc, message)
    return rc


def enc(s):
    return None if s is None else (s.encode() if isinstance(s, str) else bytes(s))
