"""The tessera package itself against a real daemon: Client calls, Plan, Reader (items, stats,
resume through states), errors as exceptions with their codes."""

import time

import pytest

from conftest import load, record, record_id
from tessera import Client, ConnectOptions, Plan, Reader, TesseraError


@pytest.fixture(scope="module")
def c(node):
    with Client(node.addr) as c:
        load(c, "core", 500, 4, chunk_size=64 << 10)
        yield c


def test_client_calls(c):
    assert c.role == "admin" and c.node
    d = c.dataset("core")
    assert d["shards"] == 4 and d["chunk_size"] == 64 << 10
    assert "core" in [x["name"] for x in c.datasets()]
    shards = c.shards("core")
    assert [s["records"] for s in shards] == [125] * 4
    assert c.record_counts("core") == [(0, 125), (1, 125), (2, 125), (3, 125)]
    offs = c.shard_records("core", 1)
    assert len(offs) == 125 and offs[0] == 0
    assert c.read("core", 1, offs[3], offs[4] - offs[3]) == record(128)
    assert c.status()["node"]
    c.create_dataset("empty")
    assert c.shards("empty") == []
    c.delete("empty")
    with pytest.raises(TesseraError) as e:
        c.dataset("empty")
    assert e.value.code < 0 and e.value.name == "TS_ENOENT"


def test_reader_items_and_stats(c):
    r = Reader(c, "core", shuffle="window", window=2, seed=1, rank=1, world=3)
    items = list(r.items())
    assert len(items) == len(r) == r.consumed
    plan = Plan(500, shuffle="window", window=2, seed=1, rank=1, world=3,
                group_sizes=[125] * 4)
    assert [i.unit for i in items] == list(plan)
    for i in items:
        assert i.data == record(i.unit) and record_id(i.data) == i.unit
        assert i.shard == i.unit // 125 and i.record == i.unit % 125
    s = r.stats()
    assert s["units"] == len(items) and s["bytes"] == sum(len(i.data) for i in items)
    assert s["stall_s"] >= 0 and s["retries"] == 0
    assert sum(v["units"] for v in s["served"].values()) == len([i for i in items if i.data])
    r.close()


def test_reader_hints(c):
    """The reader tells the node what it will read next (HINT): hints are sent and taken by
    default, none with hint_bytes=0, and the units are the same either way."""
    want = list(Reader(c, "core", shuffle="global", seed=3, hint_bytes=0))
    # A small window: the connections claim as the caller takes, the hint thread runs ahead.
    r = Reader(c, "core", shuffle="global", seed=3, window_units=4)
    got = []
    for x in r:
        got.append(x)
        if len(got) < 100:
            time.sleep(0.001)
    assert got == want
    s = r.stats()
    assert s["hinted_units"] > 0 and s["hint_queued"] > 0 and s["hint_dropped"] == 0
    r.close()
    r = Reader(c, "core", shuffle="global", seed=3, hint_bytes=0)
    assert list(r) == want
    assert r.stats()["hinted_units"] == 0
    r.close()


def test_domain_reads_local_first(cluster, monkeypatch):
    """ConnectOptions(domain=...): the cluster's map puts n1..n3 in domains d1..d3, and a
    reader in d2 (opened on n1) reads every unit from n2, one in d3 from n3. A malformed domain
    is refused; $TESSERA_DOMAIN is the default."""
    nodes, writer = cluster
    with Client(writer) as w:
        load(w, "local", 300, 6, core=3, min_core=2)
    for domain, node in (("d2", "n2"), ("d3", "n3")):
        r = Reader(ConnectOptions(nodes[0].addr, domain=domain), "local", shuffle="global",
                   seed=2)
        items = list(r.items())
        assert sorted(i.unit for i in items) == list(range(300))
        assert all(i.data == record(i.unit) and i.node == node for i in items)
        assert set(r.stats()["served"]) == {node}, r.stats()["served"]
        r.close()
    with pytest.raises(TesseraError) as e:
        Client(nodes[0].addr, domain="not a domain")
    assert e.value.name == "TS_EINVAL"
    monkeypatch.setenv("TESSERA_DOMAIN", "d1")
    assert ConnectOptions(nodes[0].addr).domain == "d1"
    assert ConnectOptions(nodes[0].addr, domain="d3").domain == "d3"


def test_shard_units(c):
    got = {i.shard: i.data for i in Reader(c, "core", unit="shard", shuffle="global").items()}
    assert sorted(got) == [0, 1, 2, 3]
    assert got[2] == b"".join(record(k) for k in range(250, 375))


def test_stream_equals_iteration(c, monkeypatch):
    """stream() (batched) gives what iteration gives, in order, for small records and for shard
    units larger than a batch (a 4 KiB batch here: the ~20 KiB shards come one by one), as bytes
    and as views."""
    import tessera.reader
    monkeypatch.setattr(tessera.reader, "BATCH_BYTES", 4096)
    monkeypatch.setattr(tessera.reader, "BATCH_UNIT", 1024)
    for unit in ("record", "shard"):
        want = list(Reader(c, "core", unit=unit, shuffle="global", seed=9))
        for copy in (True, False):
            r = Reader(c, "core", unit=unit, shuffle="global", seed=9, copy=copy)
            got = [bytes(x) for x in r.stream()]
            assert got == want
            assert r.consumed == len(want)
            r.close()


def test_stream_views_held_while_buffers_are_filled_again(c, monkeypatch):
    """stream() fills a batch buffer again only when no view of it is left: views held across
    the whole stream keep their bytes, and a buffer whose views were dropped is used again."""
    import weakref

    import tessera.reader
    monkeypatch.setattr(tessera.reader, "BATCH_BYTES", 4096)
    monkeypatch.setattr(tessera.reader, "BATCH_UNIT", 1024)
    want = list(Reader(c, "core", shuffle="global", seed=5))
    r = Reader(c, "core", shuffle="global", seed=5, copy=False)
    held, first, left, again = [], None, False, False
    for i, v in enumerate(r.stream()):
        if first is None:
            first = weakref.ref(v.obj)  # the first batch's buffer; its views are dropped
        elif v.obj is not first():
            left = True
        elif left:
            again = True  # a later batch in the first one's buffer
        if i >= 100 and i % 7 == 3:
            held.append((i, v))  # kept to the end: its buffer must not be filled again
    assert again, "no batch buffer was used again"
    assert len(held) > 50 and all(bytes(v) == want[i] for i, v in held)
    r.close()


def test_resume_through_states(c):
    seen = []
    readers = [Reader(c, "core", rank=r, world=2, shuffle="global", seed=4) for r in range(2)]
    for r, take in zip(readers, (30, 77)):
        it = iter(r)
        seen.extend(record_id(next(it)) for _ in range(take))
    state = readers[0].state([r.consumed for r in readers])
    for r in readers:
        r.close()
    for rank in range(3):
        seen.extend(record_id(x) for x in Reader(c, "core", rank=rank, world=3,
                                                 shuffle="global", seed=4, resume=state))
    assert sorted(seen) == list(range(500))
    with pytest.raises(TesseraError) as e:
        Reader(c, "core", resume=b"not a state")
    assert e.value.name == "TS_EINVAL" and "saved position" in str(e.value)


def test_plan_is_constant_memory_for_huge_n():
    p = Plan(1 << 40, rank=3, world=7, shuffle="global", seed=1)
    assert len(p) == (1 << 40) // 7 + (3 < (1 << 40) % 7)
    assert 0 <= p[len(p) - 1] < 1 << 40


def test_tier_ec_and_back(cluster, node):
    """Client.tier: a sealed dataset on the 3-node cluster to ec:2+1 (its info says so, its
    replicas' bytes dropped; every record still reads the same through the fragments, the Reader
    too), progress per shard, then back to replicated (the bytes back on the replicas);
    refusals: an open dataset, a bad code, a single node (TS_ENOTSUP)."""
    import os
    nodes, writer = cluster
    certs = os.path.dirname(writer.tls_ca)
    admin = ConnectOptions(nodes[0].tls_addr, tls_ca=writer.tls_ca,
                           tls_cert=os.path.join(certs, "admin.pem"),
                           tls_key=os.path.join(certs, "admin.key"))
    with Client(admin) as a:
        load(a, "tiered", 240, 4, core=3, min_core=2)
        with pytest.raises(TesseraError) as e:
            a.tier("tiered", "ec:2+1")
        assert e.value.name == "TS_EINVAL"  # open
        a.seal("tiered")
        with pytest.raises(ValueError):
            a.tier("tiered", "ec:2")
        seen = []
        a.tier("tiered", "ec:2+1", progress=lambda *p: seen.append(p))
        assert [p[0] for p in seen] == [1, 2, 3, 4] and seen[-1][2] == seen[-1][3]
        assert a.dataset("tiered")["ec"] == "2+1"
        assert a.dataset("tiered")["replica_bytes"] == "dropped"  # the fragments alone hold them
        ids = []
        for s, n in a.record_counts("tiered"):  # read through the fragments now
            offs = a.shard_records("tiered", s) + [None]
            data = a.read("tiered", s)
            for i in range(n):
                rec = data[offs[i]:offs[i + 1]]
                ids.append(record_id(rec))
                assert rec == record(ids[-1])
        assert ids == list(range(240))
        got = sorted(record_id(i.data) for i in Reader(admin, "tiered").items())
        assert got == list(range(240))
        a.tier("tiered", "replicated")
        assert a.dataset("tiered")["ec"] is None
        got = sorted(record_id(i.data) for i in Reader(admin, "tiered").items())
        assert got == list(range(240))  # from the replicas again
    with Client(node.addr) as one:
        one.create_dataset("alone")
        one.seal("alone")
        with pytest.raises(TesseraError) as e:
            one.tier("alone", "ec:2+1")
        assert e.value.name == "TS_ENOTSUP"
