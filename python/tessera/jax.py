"""JAX: global batches as jax.Arrays over a Mesh, each process reading its own part of the
epoch (plan rank jax.process_index() of jax.process_count(), strided) and each device
holding exactly its slice (jax.make_array_from_process_local_data). The last batch is padded
to the global batch size; the mask marks the real rows.
"""

import jax
import numpy as np

from .client import Client
from .plan import Plan
from .reader import Reader


def batches(connect, name, sharding, global_batch_size, *, decode=None, shuffle="none",
            seed=0, epoch=0, window=16, record="auto", reader=None):
    """Yields (batch, mask) per global batch: batch a jax.Array of global_batch_size rows of
    decode(record) (an np.ndarray of one shape and dtype; default: the record's bytes as
    uint8, all records of one length), laid out by `sharding` (e.g. NamedSharding(mesh,
    PartitionSpec("data"))); mask a bool jax.Array of the same rows and sharding, False on
    padding. Every process yields as many batches. record: what decode gets of a record,
    "auto" (its payload when the dataset says its format), "framed" or "payload"."""
    decode = decode or (lambda b: np.frombuffer(b, dtype=np.uint8))
    pid, pcount = jax.process_index(), jax.process_count()
    if global_batch_size % pcount:
        raise ValueError(f"global batch {global_batch_size} is not divisible by "
                         f"{pcount} processes")
    local = global_batch_size // pcount
    with Client(connect) as c:
        units = sum(n for _, n in c.record_counts(name))
    # Every process makes as many batches as the longest part needs (rank 0's).
    nbatches = -(-len(Plan(units, rank=0, world=pcount, assign="strided")) // local)
    rows_spec = jax.sharding.PartitionSpec(sharding.spec[0] if len(sharding.spec) else None)
    mask_sharding = jax.sharding.NamedSharding(sharding.mesh, rows_spec)
    reader = Reader(connect, name, unit="record", rank=pid, world=pcount, seed=seed,
                    epoch=epoch, shuffle=shuffle, window=window, assign="strided",
                    remainder="uneven", record=record, **dict(reader or {}))
    try:
        it, proto = iter(reader), None
        for _ in range(nbatches):
            rows = []
            for rec in it:
                rows.append(decode(rec))
                if len(rows) == local:
                    break
            proto = rows[0] if rows else proto
            if proto is None:
                raise ValueError(f"{name} has no records to take the row shape from")
            data = np.zeros((local,) + proto.shape, dtype=proto.dtype)
            for i, row in enumerate(rows):
                data[i] = row
            mask = np.zeros(local, dtype=bool)
            mask[:len(rows)] = True
            yield (jax.make_array_from_process_local_data(
                       sharding, data, (global_batch_size,) + proto.shape),
                   jax.make_array_from_process_local_data(
                       mask_sharding, mask, (global_batch_size,)))
    finally:
        reader.close()
