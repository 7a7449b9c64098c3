"""tessera.jax against JAX itself (jax/jaxlib from PyPI, 8 host CPU devices) and a real
daemon, checked against expectations computed here, not by tessera's Plan: unshuffled, the
epoch is the dataset's order (record i at position i); shuffled, a permutation of it that
another epoch orders differently. Each device's shard of each global batch holds exactly its
rows' records, the padded final batch's mask marks exactly the real rows, and process p of P
(jax.process_index() of jax.process_count(), P faked) takes positions p, p + P, ... of the
epoch."""

import os
import types

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8")
import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from conftest import load, record_id  # noqa: E402
from tessera import Client  # noqa: E402
import tessera.jax as tjax  # noqa: E402

N = 203  # not a multiple of the global batch: the last batch is padded
GB = 32  # the global batch


@pytest.fixture(scope="module")
def jds(node):
    with Client(node.addr) as c:
        load(c, "jax", N, 5)
    return node.addr


@pytest.fixture(scope="module")
def sharding():
    assert len(jax.devices()) == 8
    return NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))


def decode(rec):
    return np.array([record_id(rec), len(rec)], dtype=np.int64)


def epoch_order(addr, sharding, shuffle, epoch):
    """The records of one epoch in the order the batches give them (one process), each
    device's shard checked against the batch's rows and the mask against the real rows."""
    got, nb = [], 0
    for batch, mask in tjax.batches(addr, "jax", sharding, GB, decode=decode, shuffle=shuffle,
                                    seed=6, epoch=epoch):
        assert batch.shape == (GB, 2) and mask.shape == (GB,)
        rows, real = np.asarray(batch), min(GB, N - nb * GB)
        for shard in batch.addressable_shards:
            assert shard.data.shape == (GB // 8, 2)  # each device holds its slice only
            assert (np.asarray(shard.data) == rows[shard.index[0]]).all()
        m = np.asarray(mask)
        assert m[:real].all() and not m[real:].any()
        assert (rows[:real, 1] == [8 + (i * 37) % 300 for i in rows[:real, 0]]).all()
        got.extend(int(x) for x in rows[m][:, 0])
        nb += 1
    assert nb == -(-N // GB)
    return got


def test_unshuffled_epoch_is_the_datasets_order(jds, sharding):
    assert epoch_order(jds, sharding, "none", 2) == list(range(N))


def test_shuffled_epoch_is_a_permutation_of_its_own(jds, sharding):
    e2 = epoch_order(jds, sharding, "global", 2)
    assert sorted(e2) == list(range(N)) and e2 != list(range(N))
    assert epoch_order(jds, sharding, "global", 2) == e2  # the same on every run
    e3 = epoch_order(jds, sharding, "global", 3)
    assert sorted(e3) == list(range(N)) and e3 != e2


@pytest.mark.parametrize("shuffle", ["none", "global"])
@pytest.mark.parametrize("procs", [2, 4])
def test_process_takes_every_pth_position(jds, sharding, monkeypatch, shuffle, procs):
    """Process p of P (faked: tessera.jax sees P processes, and its local rows are kept as
    they are instead of being laid out over the devices) reads positions p, p + P, ... of the
    one-process epoch, in batches of GB / P rows, as many batches in every process."""
    whole = list(range(N)) if shuffle == "none" else epoch_order(jds, sharding, shuffle, 2)
    counts = set()
    for p in range(procs):
        fake = types.SimpleNamespace(
            process_index=lambda p=p: p, process_count=lambda: procs, sharding=jax.sharding,
            make_array_from_process_local_data=lambda sharding, data, shape: data)
        monkeypatch.setattr(tjax, "jax", fake)
        got, nb = [], 0
        for rows, mask in tjax.batches(jds, "jax", sharding, GB, decode=decode,
                                       shuffle=shuffle, seed=6, epoch=2):
            assert rows.shape == (GB // procs, 2)
            got.extend(int(x) for x in rows[mask][:, 0])
            nb += 1
        assert got == whole[p::procs], (p, procs)
        counts.add(nb)
    assert counts == {-(-len(whole[0::procs]) // (GB // procs))}


def test_rows_are_record_payloads(node, tmp_path):
    """An ingested LEN32 dataset says its format: decode gets each record's payload by default,
    its stored bytes (length first) with record="framed"."""
    import struct
    import subprocess

    from conftest import CLI
    rows = [bytes([i]) * 6 for i in range(16)]
    path = tmp_path / "r.len32"
    path.write_bytes(b"".join(struct.pack("<I", 6) + r for r in rows))
    subprocess.run([CLI, "-s", node.addr, "ingest", "len32", str(path), "--dataset", "jrec"],
                   check=True, stdout=subprocess.DEVNULL)
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
    for record, want in (("auto", rows), ("framed", [struct.pack("<I", 6) + r for r in rows])):
        got = [bytes(row) for batch, mask in tjax.batches(node.addr, "jrec", sharding, 8,
                                                          record=record)
               for row in np.asarray(batch)[np.asarray(mask)]]
        assert got == want, record
