"""tessera.torch against PyTorch itself (Debian's torch, CPU, gloo) and real daemons: the plans
equal DistributedSampler's and the seed-style split; DataLoader workers see every record once;
set_epoch; exact resume (other worker counts, twice in a row, 4 ranks -> 3); two DDP ranks
training on disjoint records; a replica killed mid-epoch after it served reads."""

import os
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

import tessera.torch
from conftest import CLI, load, record, record_id
from tessera import Client, Plan, Reader, TesseraError
from tessera.torch import DataLoader, PlanSampler, TesseraIterable, TesseraRecords

N = 960  # records of the "torch" dataset: divisible by 1..6 and 8, so no padding there


@pytest.fixture(scope="module")
def ds(node):
    with Client(node.addr) as c:
        load(c, "torch", N, 7)
        load(c, "odd", 101, 3)
    return node.addr


CASES = [(n, w) for n in (0, 1, 2, 5, 7, 10, 33, 100, 101) for w in (1, 2, 3, 4, 7, 8, 16)]


@pytest.mark.parametrize("n,w", CASES)
def test_plans_equal_distributed_sampler(n, w):
    for r in range(w):
        for drop in (False, True):
            want = list(DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=False,
                                           drop_last=drop))
            got = list(Plan(n, rank=r, world=w, assign="strided",
                            remainder="drop" if drop else "pad"))
            assert got == want, (n, w, r, drop)
            assert list(PlanSampler(n, num_replicas=w, rank=r, shuffle=False,
                                    drop_last=drop)) == want


@pytest.mark.parametrize("n,w", CASES)
def test_contiguous_equals_split_by_index(n, w):
    for r in range(w):
        want = [int(x) for x in np.array_split(np.arange(n), w)[r]]
        assert list(Plan(n, rank=r, world=w, assign="contiguous")) == want


def test_shuffled_sampler_is_a_permutation_per_epoch():
    seen = []
    for epoch in (0, 1):
        s = [PlanSampler(100, num_replicas=3, rank=r, seed=5) for r in range(3)]
        for x in s:
            x.set_epoch(epoch)
        order = [list(x) for x in s]
        every = [i for o in order for i in o]
        assert len(every) == 102 and set(every) == set(range(100))  # padded by 2
        seen.append(order)
        assert order == [list(x) for x in s]  # deterministic
    assert seen[0] != seen[1]


def _records_of(loader):
    out = []
    for batch in loader:
        assert isinstance(batch, list)
        out.extend(batch)
    return out


@pytest.mark.parametrize("workers", [0, 2, 3])
@pytest.mark.parametrize("shuffle", [True, "window"])
def test_dataloader_sees_every_record_once(ds, workers, shuffle):
    world, got = 2, []
    for rank in range(world):
        d = TesseraIterable(ds, "torch", batch_size=16, rank=rank, world=world, seed=1,
                            shuffle=shuffle, window=2)
        assert len(d) == N // world  # asked before anything was read
        recs = _records_of(DataLoader(d, num_workers=workers))
        assert len(recs) == len(d) == N // world
        for r in recs:
            assert bytes(r) == record(record_id(r))
        got.extend(record_id(r) for r in recs)
    assert sorted(got) == list(range(N))


def test_rank_sets_equal_distributed_sampler(ds):
    """Unshuffled, each rank reads exactly DistributedSampler's indices, in its order."""
    for drop in (False, True):
        for rank in range(3):
            d = TesseraIterable(ds, "odd", batch_size=4, rank=rank, world=3, shuffle=False,
                                drop_last=drop)
            ids = [record_id(r) for r in _records_of(DataLoader(d, num_workers=2))]
            assert ids == list(DistributedSampler(range(101), num_replicas=3, rank=rank,
                                                  shuffle=False, drop_last=drop))


def test_set_epoch_changes_the_order_deterministically(ds):
    def order(epoch):
        d = TesseraIterable(ds, "torch", batch_size=8, seed=3)
        d.set_epoch(epoch)
        return [record_id(r) for r in _records_of(DataLoader(d, num_workers=2))]
    a, b, c = order(1), order(1), order(2)
    assert a == b
    assert a != c
    assert sorted(a) == sorted(c) == list(range(N))


def _take(loader, batches):
    out, it = [], iter(loader)
    for _ in range(batches):
        out.extend(next(it))
    return out


def test_state_dict_resumes_exactly_twice_in_a_row(ds):
    d = TesseraIterable(ds, "torch", batch_size=8, seed=9)
    d.set_epoch(4)
    full = [record_id(r) for r in _records_of(DataLoader(d, num_workers=2))]

    d1 = TesseraIterable(ds, "torch", batch_size=8, seed=9)
    d1.set_epoch(4)
    l1 = DataLoader(d1, num_workers=2)
    first = [record_id(r) for r in _take(l1, 5)]
    state = l1.state_dict()

    d2 = TesseraIterable(ds, "torch", batch_size=8, seed=9)
    l2 = DataLoader(d2, num_workers=3)  # another worker count
    l2.load_state_dict(state)
    second = [record_id(r) for r in _take(l2, 7)]
    state2 = l2.state_dict()

    d3 = TesseraIterable(ds, "torch", batch_size=8, seed=9)
    l3 = DataLoader(d3, num_workers=0)
    l3.load_state_dict(state2)
    rest = [record_id(r) for r in _records_of(l3)]
    assert first + second + rest == full


def test_resume_with_tuple_samples(ds):
    """Samples that collate into several tensors (x, y): batches, not fields, are counted."""
    def split(rec):
        return torch.tensor(record_id(rec)), torch.tensor(len(rec))
    d = TesseraIterable(ds, "torch", batch_size=8, seed=5, transform=split)
    loader = DataLoader(d, num_workers=2)
    first = []
    it = iter(loader)
    for _ in range(3):
        x, y = next(it)
        first.extend(int(i) for i in x)
    state = loader.state_dict()
    d2 = TesseraIterable(ds, "torch", batch_size=8, seed=5, transform=split)
    l2 = DataLoader(d2, num_workers=1)
    l2.load_state_dict(state)
    rest = [int(i) for x, _ in l2 for i in x]
    assert len(first) == 24 and sorted(first + rest) == list(range(N))


def test_resume_at_another_world_size(ds):
    """4 ranks read 6 batches each and save; 3 ranks resume: every record exactly once."""
    seen = []
    loaders = []
    for rank in range(4):
        d = TesseraIterable(ds, "torch", batch_size=10, rank=rank, world=4, seed=2)
        d.set_epoch(7)
        loaders.append(DataLoader(d, num_workers=2))
        seen.extend(record_id(r) for r in _take(loaders[-1], 6))
    states = [l.state_dict() for l in loaders]
    assert all(s["position"] == states[0]["position"] for s in states)  # ranks agree
    for rank in range(3):
        d = TesseraIterable(ds, "torch", batch_size=10, rank=rank, world=3, seed=2)
        l = DataLoader(d, num_workers=3 - rank)
        l.load_state_dict(states[0])
        seen.extend(record_id(r) for r in _records_of(l))
    assert sorted(seen) == list(range(N))


@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_at_another_world_size_keeps_ranks_in_step(ds, drop_last):
    """Issue 28: 101 records at 3 ranks, 5 batches of 3 each, resumed at 2 ranks: both ranks
    read as many batches (DDP's all-reduce needs it; [29, 28] records before), the remainder
    policy holds (pad: every record, 1 repeated; drop_last: none twice), and a state saved
    after the resume is the same on both ranks. Also 3 records, 2 ranks -> 3 ([1, 1, 0])."""
    def loaders(world, state=None, workers=1):
        out = []
        for rank in range(world):
            d = TesseraIterable(ds, "odd", batch_size=3, rank=rank, world=world, seed=4,
                                drop_last=drop_last)
            d.set_epoch(2)
            out.append(DataLoader(d, num_workers=workers))
            if state:
                out[-1].load_state_dict(state)
        return out

    first = loaders(3)
    seen = [record_id(r) for l in first for r in _take(l, 5)]
    state = first[0].state_dict()
    second = loaders(2, state, workers=2)
    lens = [len(l.dataset) for l in second]
    assert lens[0] == lens[1], lens
    rest = [[record_id(r) for r in _records_of(l)] for l in second]
    assert len(rest[0]) == len(rest[1]) == lens[0]
    assert [s["position"] for s in (second[0].state_dict(), second[1].state_dict())] \
        == [second[0].state_dict()["position"]] * 2
    every = seen + rest[0] + rest[1]
    if drop_last:
        assert len(set(every)) == len(every)
    else:
        assert set(every) == set(range(101)) and len(every) == 102 + 1  # 1 padded per phase

    for world, again in ((2, 3),):
        plans = [Plan(3, rank=r, world=world, assign="strided", remainder="pad")
                 for r in range(world)]
        st = plans[0].state([1] * world)
        assert [len(Plan(3, rank=r, world=again, assign="strided", remainder="pad", resume=st))
                for r in range(again)] == [1, 1, 1]


def test_map_style_dataset(ds):
    d = TesseraRecords(ds, "odd")
    assert len(d) == 101
    loader = torch.utils.data.DataLoader(d, batch_size=7, num_workers=2,
                                         sampler=PlanSampler(101, num_replicas=1, rank=0,
                                                             seed=4))
    got = [record_id(r) for b in loader for r in b]
    assert sorted(got) == list(range(101))
    assert d[100] == record(100) and d[-1] == record(100)
    with pytest.raises(IndexError):
        d[101]


def test_errors_are_exceptions_with_codes(ds):
    with pytest.raises(TesseraError) as e:
        Reader(ds, "nosuch")
    assert e.value.name == "TS_ENOENT" and "nosuch" in str(e.value)
    with pytest.raises(TesseraError) as e:
        Reader(ds, "torch", rank=2, world=2)
    assert e.value.name == "TS_EINVAL"
    with pytest.raises(ValueError):
        Reader(ds, "torch", shuffle="sideways")


def test_zero_copy_views_outlive_the_reader(ds):
    r = Reader(ds, "odd", copy=False)
    views = [next(iter(r)) for _ in range(3)]
    r.close()
    assert [record_id(v) for v in views] == [0, 1, 2]
    arr = np.frombuffer(views[2], dtype=np.uint8)
    assert arr.tobytes() == record(2)


def test_zero_copy_views_given_back_while_reading(ds):
    """Views dropped while reading give their buffers back to the reader, which reads later
    records into them: every record intact, the ones still held too."""
    r = Reader(ds, "torch", copy=False, window_units=4, shuffle="global", seed=3)
    held, seen = [], []
    for v in r:
        held.append(v)
        if len(held) > 2:
            held.pop(0)
        for h in held:
            assert bytes(h) == record(record_id(h))
        seen.append(record_id(v))
    r.close()
    assert sorted(seen) == list(range(N))
    assert all(bytes(h) == record(record_id(h)) for h in held)  # they outlive the reader


DDP = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {pkg!r})
    import torch, torch.distributed as dist
    from tessera.torch import TesseraIterable, DataLoader
    # Rendezvous through a file: no port to pick (gloo's own sockets take the kernel's).
    dist.init_process_group("gloo", init_method={init!r}, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    rank = dist.get_rank()
    d = TesseraIterable({addr!r}, "torch", batch_size=16, seed=11)
    d.set_epoch(1)
    model = torch.nn.Linear(4, 1)
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ids = []
    for batch in DataLoader(d, num_workers=2):
        ids.extend(int.from_bytes(b[:8], "little") for b in batch)
        x = torch.tensor([[(i >> j) & 1 for j in range(4)] for i in ids[-len(batch):]],
                         dtype=torch.float32)
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, ids)
    if rank == 0:
        a, b = set(every[0]), set(every[1])
        assert not (a & b), "ranks overlap"
        assert sorted(a | b) == list(range({n})), "ranks do not cover the dataset"
        print("ddp ok", len(a), len(b))
    # Teardown in a fixed order (torch 1.13 + gloo aborted a rank now and then at exit with
    # "terminate called without an active exception" when the DDP module outlived the group
    # and rank 0, the store's host, left first): the module first, then both ranks together.
    del model, opt
    dist.barrier()
    dist.destroy_process_group()
""")


def test_ddp_two_ranks_train_on_disjoint_records(ds, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP.format(pkg=os.path.join(os.path.dirname(__file__), "..", ""),
                                 addr=ds, n=N, init=f"file://{tmp_path / 'rendezvous'}"))
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = [p.communicate(timeout=300)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "ddp ok 480 480" in outs[0]


def test_replica_killed_mid_epoch(cluster, monkeypatch):
    """n3 is killed (-9) mid-epoch once it has served records to the loader (the reader's
    per-node stats say so); the epoch still yields every record once and intact, n3's part
    read again from the other replicas."""
    nodes, writer = cluster
    with Client(writer) as c:
        load(c, "kill", 3000, 12, core=3, min_core=2)
    readers = []

    class Watched(tessera.torch.Reader):
        """The loader's reader, kept for its stats (taken once more as it closes)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            readers.append(self)

        def close(self):
            if self._h:
                self.last_stats = self.stats()
            super().close()

    monkeypatch.setattr(tessera.torch, "Reader", Watched)
    window, seen, at_kill = 16, [], None
    d = TesseraIterable(nodes[0].addr, "kill", batch_size=32, seed=1,
                        reader={"window_units": window})
    # No worker processes: the reader is in this one, so its stats can be read at the kill.
    for i, batch in enumerate(DataLoader(d, num_workers=0)):
        for r in batch:
            assert bytes(r) == record(record_id(r))
            seen.append(record_id(r))
        if i == 20 and at_kill is None:
            at_kill = readers[0].stats()
            nodes[2].kill9()
    assert at_kill is not None and len(readers) == 1
    n3_at_kill = at_kill["served"].get("n3", {}).get("units", 0)
    assert n3_at_kill > 0, at_kill["served"]
    assert sorted(seen) == list(range(3000))
    end = readers[0].last_stats
    assert sum(n["units"] for n in end["served"].values()) == 3000, end["served"]
    # After the kill n3 served only what the reader held ahead; the rest was read elsewhere.
    assert end["served"]["n3"]["units"] - n3_at_kill <= window, (at_kill, end)
    assert end["retries"] + end["reconnects"] > 0, end


# ---- what a record is (issue 28): payload by default for a dataset that says its format ----

def _crc32c(data, _t=[]):
    if not _t:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
            _t.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = _t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked(data):
    c = _crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _tar(samples):
    import io
    import tarfile
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as t:
        for s in samples:
            for ext in ("cls", "txt"):
                data = s[ext]
                info = tarfile.TarInfo(f"train/{s['__key__'].split('/')[-1]}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()  # with the end-of-archive blocks and tar's padding


PAYLOADS = [b"x" * (i % 7) + bytes([i]) * i for i in range(23)]
FORMATS = {
    "tfrecord": (lambda ps: b"".join(struct.pack("<Q", len(p)) +
                                     struct.pack("<I", _masked(struct.pack("<Q", len(p)))) + p +
                                     struct.pack("<I", _masked(p)) for p in ps), PAYLOADS),
    "len32": (lambda ps: b"".join(struct.pack("<I", len(p)) + p for p in ps), PAYLOADS),
    "jsonl": (lambda ps: b"".join(p + b"\n" for p in ps) + b"\n\n",
              [b'{"i": %d, "s": "%s"}' % (i, b"y" * i) for i in range(23)]),
    "tar": (_tar, [{"__key__": f"train/{i:03d}", "cls": b"%d" % i, "txt": b"t" * i}
                   for i in range(23)]),
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_what_a_record_is(node, tmp_path, fmt):
    """Records of an ingested file are their payloads by default in Reader, TesseraIterable and
    TesseraRecords (the TFRecord's data, the tar sample's members, the JSON text, the LEN32
    bytes), their stored bytes with record="framed" (the file, byte for byte)."""
    from tessera.records import tar_sample
    write, want = FORMATS[fmt]
    blob = write(want)
    path = tmp_path / f"data.{fmt}"
    path.write_bytes(blob)
    name = f"what-{fmt}"
    subprocess.run([CLI, "-s", node.addr, "ingest", fmt, str(path), "--dataset", name],
                   check=True, stdout=subprocess.DEVNULL)
    as_sample = tar_sample if fmt == "tar" else bytes

    assert [as_sample(r) for r in Reader(node.addr, name)] == want
    assert [as_sample(r) for r in Reader(node.addr, name, copy=False)] == want
    framed = list(Reader(node.addr, name, record="framed"))
    assert b"".join(framed) == blob
    it = TesseraIterable(node.addr, name, shuffle=False)
    assert [as_sample(r) for r in it] == want
    recs = TesseraRecords(node.addr, name)
    assert [as_sample(recs[i]) for i in range(len(recs))] == want
    assert TesseraRecords(node.addr, name, record="framed")[len(want) - 1] == framed[-1]
    with pytest.raises(ValueError):
        TesseraIterable(node.addr, name, record="bytes")


def test_records_of_a_dataset_without_format_are_its_bytes(node):
    with Client(node.addr) as c:
        load(c, "raw", 9, 2)
        assert c.dataset("raw")["record_format"] == "none"
    want = [record(i) for i in range(9)]
    assert list(Reader(node.addr, "raw")) == want
    assert list(Reader(node.addr, "raw", record="payload")) == want
    assert list(Reader(node.addr, "raw", record="framed")) == want


@pytest.mark.parametrize("name,n", [("torch", N), ("odd", 101)])
@pytest.mark.parametrize("drop", [False, True])
def test_torch_order_equals_distributed_sampler(ds, name, n, drop):
    """order="torch": the very indices of DistributedSampler(shuffle=True, seed) per rank and
    epoch (tessera's own permutation differs: same structure, another order)."""
    for epoch in (0, 3):
        for r in range(3):
            s = DistributedSampler(range(n), num_replicas=3, rank=r, shuffle=True, seed=5,
                                   drop_last=drop)
            s.set_epoch(epoch)
            want = list(s)
            d = TesseraIterable(ds, name, rank=r, world=3, seed=5, order="torch", drop_last=drop)
            d.set_epoch(epoch)
            assert [record_id(x) for x in d] == want
            p = PlanSampler(n, num_replicas=3, rank=r, seed=5, drop_last=drop, order="torch")
            p.set_epoch(epoch)
            assert list(p) == want
            own = TesseraIterable(ds, name, rank=r, world=3, seed=5, drop_last=drop)
            own.set_epoch(epoch)
            assert len(own) == len(want)


def test_torch_order_resumes_at_another_world_size(ds):
    first = []
    for rank in range(3):
        d = TesseraIterable(ds, "torch", batch_size=8, rank=rank, world=3, seed=1, order="torch")
        first.append(DataLoader(d, num_workers=2))
    seen = [record_id(r) for l in first for r in _take(l, 4)]
    state = first[0].state_dict()
    for rank in range(2):
        d = TesseraIterable(ds, "torch", batch_size=8, rank=rank, world=2, seed=1, order="torch")
        l = DataLoader(d, num_workers=1)
        l.load_state_dict(state)
        seen.extend(record_id(r) for r in _records_of(l))
    assert sorted(seen) == list(range(N))
    with pytest.raises(ValueError):
        TesseraIterable(ds, "torch", shuffle="window", order="torch")
