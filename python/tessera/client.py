"""Client: one connection to a tessera node (in a cluster, a router over every node), for
datasets, shards, uploads and plain reads. One thread at a time per Client."""

import ctypes
import json
import os

from ._lib import (TIER_FN, DatasetInfo, DatasetRecords, Handle, Opts, P, Policy, ShardInfo,
                   c_size, c_u32, c_u64, c_void_p, check, enc, lib)
from .records import FORMATS, format_code


class ConnectOptions:
    """Where and how to connect: an address ("host:port", any node of a cluster) and, for TLS,
    a CA (and a client certificate and key for a role other than reader). domain: this host's
    failure domain in the cluster map (a node without a domain: its id); reads go to the
    replicas there first (docs/client.md "Locality"). Default: $TESSERA_DOMAIN, else none."""

    def __init__(self, address="127.0.0.1:7070", *, tls_ca=None, tls_cert=None, tls_key=None,
                 tls_server_name=None, timeout_ms=None, client_name="tessera-python",
                 domain=None):
        self.address = address
        self.tls_ca = tls_ca
        self.tls_cert = tls_cert
        self.tls_key = tls_key
        self.tls_server_name = tls_server_name
        self.timeout_ms = timeout_ms
        self.client_name = client_name
        self.domain = domain if domain is not None else os.environ.get("TESSERA_DOMAIN") or None

    def struct(self):
        """The C options; the strings live as long as the returned struct's _keep."""
        o = Opts()
        lib().tessera_opts_init(ctypes.byref(o))
        keep = [enc(v) for v in (self.address, self.tls_ca, self.tls_cert, self.tls_key,
                                 self.tls_server_name, self.client_name, self.domain)]
        (o.address, o.tls_ca, o.tls_cert, o.tls_key, o.tls_server_name, o.client_name,
         o.domain) = keep
        if self.timeout_ms is not None:
            o.timeout_ms = int(self.timeout_ms)
        o._keep = keep
        return o


def _info(d):
    return {
        "name": d.name.decode(), "id": d.id, "state": "sealed" if d.state else "open",
        "shards": d.shards, "shards_writing": d.shards_writing, "bytes": d.bytes,
        "core": d.policy.core, "fringe": d.policy.fringe, "min_core": d.policy.min_core,
        "chunk_size": d.policy.chunk_size, "created_ns": d.created_ns,
        "ec": "%d+%d" % (d.policy.ec_k, d.policy.ec_m) if d.policy.ec_k else None,
        "replica_bytes": ("dropped" if d.policy.ec_dropped else "kept") if d.policy.ec_k else None,
        "record_format": FORMATS[d.policy.record_format]
        if d.policy.record_format < len(FORMATS) else str(d.policy.record_format),
    }


def _shard(s):
    return {
        "shard": s.shard, "state": "complete" if s.state == 1 else "writing", "size": s.size,
        "chunk_size": s.chunk_size, "chunks": s.nchunks, "crc32c": s.crc,
        "records": s.nrecords,
    }


class Client(Handle):
    _free = "tessera_client_close"

    def __init__(self, address="127.0.0.1:7070", **options):
        self.options = (address if isinstance(address, ConnectOptions)
                        else ConnectOptions(address, **options))
        self._h = None
        h = c_void_p()
        o = self.options.struct()
        check(lib().tessera_client_open(ctypes.byref(h), ctypes.byref(o)),
              f"cannot connect to {self.options.address}")
        self._h = h

    def _check(self, rc):
        if rc < 0:
            check(rc, lib().tessera_client_error(self._h).decode())
        return rc

    @property
    def node(self):
        return lib().tessera_client_node(self._h).decode()

    @property
    def role(self):
        return ("none", "reader", "writer", "admin", "node")[lib().tessera_client_role(self._h)]

    @property
    def epoch(self):
        return lib().tessera_client_epoch(self._h)

    def create_dataset(self, name, *, core=1, fringe=0, min_core=0, chunk_size=0, format=None):
        """format: what its records are ("tfrecord", "tar", "jsonl", "len32", "len64"; None:
        not said), so that readers hand out their payloads (tessera.records)."""
        p = Policy(core, fringe, min_core, chunk_size, format_code(format))
        self._check(lib().tessera_dataset_create(self._h, enc(name), ctypes.byref(p)))

    def datasets(self):
        v, n = P(DatasetInfo)(), c_size()
        self._check(lib().tessera_dataset_list(self._h, ctypes.byref(v), ctypes.byref(n)))
        try:
            return [_info(v[i]) for i in range(n.value)]
        finally:
            lib().tessera_buffer_free(ctypes.cast(v, c_void_p))

    def dataset(self, name):
        d = DatasetInfo()
        self._check(lib().tessera_dataset_stat(self._h, enc(name), ctypes.byref(d)))
        return _info(d)

    def seal(self, name):
        self._check(lib().tessera_dataset_seal(self._h, enc(name)))

    def tier(self, name, code, progress=None):
        """Tiers a sealed dataset: code "ec:K+M" (K data and M parity fragments of every shard
        on K+M nodes; a cluster handle with admin rights) or "replicated". progress, if given,
        is called as progress(shards_done, shards, bytes_done, bytes) after each shard."""
        if code == "replicated":
            k = m = 0
        else:
            spec = code[3:] if code.startswith("ec:") else code
            parts = spec.split("+")
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                raise ValueError("tier: want 'ec:K+M' or 'replicated', not %r" % (code,))
            k, m = int(parts[0]), int(parts[1])
        cb = TIER_FN(lambda _arg, d, n, b, t: progress(d, n, b, t)) if progress else TIER_FN()
        self._check(lib().tessera_dataset_tier(self._h, enc(name), k, m, cb, None))

    def delete(self, name):
        self._check(lib().tessera_dataset_delete(self._h, enc(name)))

    def shards(self, name):
        v, n = P(ShardInfo)(), c_size()
        self._check(lib().tessera_shard_list(self._h, enc(name), ctypes.byref(v),
                                             ctypes.byref(n)))
        try:
            return sorted((_shard(v[i]) for i in range(n.value)), key=lambda s: s["shard"])
        finally:
            lib().tessera_buffer_free(ctypes.cast(v, c_void_p))

    def put(self, name, shard, data, records=None):
        """Uploads data (bytes-like) as shard and seals it; records: the record start offsets
        (ascending), stored as the shard's record index."""
        buf = memoryview(data).cast("B")
        cbuf = (ctypes.c_uint8 * len(buf)).from_buffer_copy(buf) if buf.readonly else \
            (ctypes.c_uint8 * len(buf)).from_buffer(buf)
        recs = (c_u64 * len(records))(*records) if records else None
        self._check(lib().tessera_put(self._h, enc(name), shard, cbuf, len(buf), recs,
                                      len(records) if records else 0))

    def put_records(self, name, shard, records):
        """Uploads a list of records (bytes each) as shard, with their record index."""
        offs, at = [], 0
        for r in records:
            offs.append(at)
            at += len(r)
        self.put(name, shard, b"".join(records), offs)

    def read(self, name, shard, offset=0, length=None):
        """Bytes [offset, offset + length) of a complete shard (to its end by default)."""
        if length is None:
            length = self.shard(name, shard)["size"] - offset
        buf = ctypes.create_string_buffer(max(length, 1))
        got = c_size()
        self._check(lib().tessera_read(self._h, enc(name), shard, offset, length, buf,
                                       ctypes.byref(got)))
        return buf.raw[:got.value]

    def shard(self, name, shard):
        s = ShardInfo()
        self._check(lib().tessera_shard_stat(self._h, enc(name), shard, ctypes.byref(s)))
        return _shard(s)

    def shard_records(self, name, shard):
        """The record start offsets of a shard's record index."""
        v, n = P(c_u64)(), c_u32()
        self._check(lib().tessera_shard_records(self._h, enc(name), shard, ctypes.byref(v),
                                                ctypes.byref(n)))
        try:
            return [v[i] for i in range(n.value)]
        finally:
            lib().tessera_buffer_free(ctypes.cast(v, c_void_p))

    def record_counts(self, name):
        """[(shard, records)] of the dataset's complete shards, in shard order."""
        r = P(DatasetRecords)()
        self._check(lib().tessera_dataset_records(self._h, enc(name), ctypes.byref(r)))
        try:
            d = r.contents
            return [(d.shard[i], d.count[i]) for i in range(d.nshards)]
        finally:
            lib().tessera_dataset_records_free(r)

    def status(self):
        j = c_void_p()
        self._check(lib().tessera_status(self._h, ctypes.byref(j)))
        try:
            return json.loads(ctypes.string_at(j).decode())
        finally:
            lib().tessera_buffer_free(j)
