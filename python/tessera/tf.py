"""tf.data: a dataset's records as a tf.data.Dataset of tf.string, with tf.data's
shard(num_shards, index) semantics built in (record i of the epoch's order goes to shard
i mod num_shards), and an input function for strategy.distribute_datasets_from_function.

A record is its payload by default: for a dataset ingested from TFRecord files (`tessera
ingest tfrecord`) the data alone, as tf.data.TFRecordDataset gives; record="framed" gives the
stored bytes (tessera.records).
"""

import tensorflow as tf

from .reader import Reader
from .records import record_form


def dataset(connect, name, *, num_shards=1, index=0, shuffle="none", seed=0, epoch=0,
            window=16, record="auto", reader=None):
    """tf.data.Dataset of the records of `name` that shard `index` of `num_shards` reads:
    unshuffled, the same elements in the same order as
    tf.data.TFRecordDataset(files).shard(num_shards, index). shuffle: "none", "global" or
    "window" (by seed and epoch). record: "auto", "framed" or "payload" (tessera.records).
    reader: options for tessera.Reader."""
    record_form(record)
    opts = dict(reader or {})

    def gen():
        r = Reader(connect, name, unit="record", rank=index, world=num_shards, seed=seed,
                   epoch=epoch, shuffle=shuffle, window=window, assign="strided",
                   remainder="uneven", record=record, **opts)
        try:
            for rec in r:
                yield rec
        finally:
            r.close()

    return tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec((), tf.string))


def input_fn(connect, name, global_batch_size, *, drop_remainder=False, map_fn=None, **kwargs):
    """For strategy.distribute_datasets_from_function: each input pipeline reads its own
    part (input_pipeline_id of num_input_pipelines), batched at the per-replica batch size."""

    def fn(ctx):
        ds = dataset(connect, name, num_shards=ctx.num_input_pipelines,
                     index=ctx.input_pipeline_id, **kwargs)
        if map_fn is not None:
            ds = ds.map(map_fn)
        return ds.batch(ctx.get_per_replica_batch_size(global_batch_size),
                        drop_remainder=drop_remainder)

    return fn
