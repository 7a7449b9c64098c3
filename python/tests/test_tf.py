"""tessera.tf against TensorFlow itself (tensorflow-cpu from PyPI, in its own virtual
environment) and a real daemon: TFRecord files ingested with `tessera ingest` read back through
tessera.tf equal tf.data.TFRecordDataset(file).shard(W, r) for many (W, r), parse with
tf.io.parse_single_example into the original features, and distribute_datasets_from_function
gives each input pipeline its own part."""

import os
import subprocess
import sys
import textwrap

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

from conftest import CLI  # noqa: E402
import tessera.tf as ttf  # noqa: E402

N = 157
FEATURES = {"id": tf.io.FixedLenFeature([], tf.int64),
            "payload": tf.io.FixedLenFeature([], tf.string)}


def example(i):
    return tf.train.Example(features=tf.train.Features(feature={
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
        "payload": tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[bytes((i * 3 + j) & 0xFF for j in range(i % 50))])),
    })).SerializeToString()


def ingest(addr, d, name, n, shards):
    path = str(d / f"{name}.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for i in range(n):
            w.write(example(i))
    subprocess.run([CLI, "-s", addr, "ingest", "tfrecord", path, "--dataset", name,
                    "--shards", str(shards)], check=True, stdout=subprocess.DEVNULL)
    return path


@pytest.fixture(scope="module")
def tfdata(node, tmp_path_factory):
    d = tmp_path_factory.mktemp("tf")
    for n in (1, 6, 31):
        ingest(node.addr, d, f"tf{n}", n, min(n, 3))
    return node.addr, ingest(node.addr, d, "tf", N, 4)


@pytest.mark.parametrize("n", [1, 6, 31, N])
@pytest.mark.parametrize("w", [1, 2, 3, 4, 5, 8, 200])
def test_equals_tfrecorddataset_shard(tfdata, n, w):
    addr, path = tfdata
    name = "tf" if n == N else f"tf{n}"
    path = path if n == N else os.path.join(os.path.dirname(path), f"{name}.tfrecord")
    for r in range(w):
        want = [x.numpy() for x in tf.data.TFRecordDataset(path).shard(w, r)]
        got = [x.numpy() for x in ttf.dataset(addr, name, num_shards=w, index=r)]
        assert got == want, (n, w, r)


def test_records_are_payloads_unless_framed(tfdata):
    """An ingested TFRecord dataset says its format: records are the examples by default (as
    TFRecordDataset gives), the stored framing with record="framed" (the file's bytes)."""
    addr, path = tfdata
    framed = b"".join(x.numpy() for x in ttf.dataset(addr, "tf", record="framed"))
    assert framed == open(path, "rb").read()
    payloads = [x.numpy() for x in ttf.dataset(addr, "tf", record="payload")]
    assert payloads == [example(i) for i in range(N)]
    with pytest.raises(ValueError):
        ttf.dataset(addr, "tf", record="tfrecord")


def test_parse_single_example(tfdata):
    addr, _ = tfdata
    ds = ttf.dataset(addr, "tf", shuffle="global", seed=3)
    ds = ds.map(lambda s: tf.io.parse_single_example(s, FEATURES))
    seen = set()
    for ex in ds:
        i = int(ex["id"].numpy())
        assert ex["payload"].numpy() == bytes((i * 3 + j) & 0xFF for j in range(i % 50))
        seen.add(i)
    assert seen == set(range(N))


def test_input_pipelines_get_their_own_part(tfdata):
    addr, _ = tfdata
    fn = ttf.input_fn(addr, "tf", 12,
                      map_fn=lambda s: tf.io.parse_single_example(s, FEATURES)["id"])
    parts = []
    for i in range(3):
        ctx = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=i,
                                         num_replicas_in_sync=6)
        parts.append([int(x) for b in fn(ctx) for x in b.numpy()])
        assert max(len(b) for b in fn(ctx)) == ctx.get_per_replica_batch_size(12)
    assert all(set(a).isdisjoint(b) for a in parts for b in parts if a is not b)
    assert sorted(x for p in parts for x in p) == list(range(N))


MIRRORED = textwrap.dedent("""
    import os, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    sys.path.insert(0, {pkg!r})
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tessera.tf as ttf
    feats = {{"id": tf.io.FixedLenFeature([], tf.int64)}}
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    fn = ttf.input_fn({addr!r}, "tf", 16,
                      map_fn=lambda s: tf.io.parse_single_example(s, feats)["id"])
    dist = strategy.distribute_datasets_from_function(fn)
    per = [[], []]
    for batch in dist:
        for k, t in enumerate(strategy.experimental_local_results(batch)):
            per[k].extend(int(x) for x in t.numpy())
    assert per[0] and per[1], per
    assert set(per[0]).isdisjoint(per[1])
    assert sorted(per[0] + per[1]) == list(range({n}))
    print("mirrored ok", len(per[0]), len(per[1]))
""")


def test_mirrored_strategy_two_devices(tfdata, tmp_path):
    addr, _ = tfdata
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED.format(pkg=os.path.join(os.path.dirname(__file__), ".."),
                                      addr=addr, n=N))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "mirrored ok" in out.stdout
