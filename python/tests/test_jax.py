"""tessera.jax against JAX itself (jax/jaxlib from PyPI, 8 host CPU devices) and a real
daemon: each device's shard of each global batch holds exactly the plan's records for its
rows, and the padded final batch's mask marks exactly the real rows."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8")
import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from conftest import load, record_id  # noqa: E402
from tessera import Client, Plan  # noqa: E402
import tessera.jax as tjax  # noqa: E402

N = 203  # not a multiple of the global batch: the last batch is padded


@pytest.fixture(scope="module")
def jds(node):
    with Client(node.addr) as c:
        load(c, "jax", N, 5)
    return node.addr


def decode(rec):
    return np.array([record_id(rec), len(rec)], dtype=np.int64)


@pytest.mark.parametrize("shuffle", ["none", "global"])
def test_device_shards_hold_the_plans_records(jds, shuffle):
    assert len(jax.devices()) == 8
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    gb = 32
    order = list(Plan(N, shuffle=shuffle, seed=6, epoch=2, assign="strided"))
    got, nb = [], 0
    for batch, mask in tjax.batches(jds, "jax", sharding, gb, decode=decode, shuffle=shuffle,
                                    seed=6, epoch=2):
        assert batch.shape == (gb, 2) and mask.shape == (gb,)
        for shard in batch.addressable_shards:
            rows = shard.index[0]
            assert shard.data.shape == (gb // 8, 2)  # each device holds its slice only
            for j, row in enumerate(np.asarray(shard.data)):
                pos = nb * gb + rows.start + j
                if pos < N:
                    assert row[0] == order[pos]
        m = np.asarray(mask)
        real = min(gb, N - nb * gb)
        assert m[:real].all() and not m[real:].any()
        got.extend(int(x) for x in np.asarray(batch)[m][:, 0])
        nb += 1
    assert nb == -(-N // gb)
    assert got == order


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
