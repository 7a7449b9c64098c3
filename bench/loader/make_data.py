"""Makes one benchmark data set in every format the loaders read, from the same payloads.

    make_data.py --out DIR --sample-size BYTES --samples N --shards S [--seed K]

Sample i's payload is SAMPLE_SIZE bytes: i as a little-endian int64, then pseudo-random bytes
(numpy's PCG64 seeded per shard), so it does not compress and it names itself. Written:

    DIR/tar/shard-NNNNNN.tar   WebDataset shards: sample i is one member "%010d.bin" (USTAR),
                               S shards of contiguous samples; nginx serves these, the local
                               readers read them, tessera ingests them (a record = a sample)
    DIR/mds/                   the same payloads as MosaicML Streaming MDS shards (one column
                               "bin" of type bytes, no compression), split like the tar shards
    DIR/crc32.npy              zlib.crc32 of every payload, by sample id (the loaders' check)
    DIR/manifest.json          sizes, counts, the shard files
"""

import argparse
import io
import json
import os
import tarfile
import zlib

import numpy as np


def payloads(first, count, size, seed):
    """The payloads of samples first .. first+count-1 (bytes each)."""
    rng = np.random.default_rng([seed, first])
    body = rng.bytes((size - 8) * count)
    for k in range(count):
        head = int(first + k).to_bytes(8, "little")
        yield head + body[k * (size - 8):(k + 1) * (size - 8)]


def tar_member(name, data):
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    info.uname = info.gname = "bench"
    head = info.tobuf(format=tarfile.USTAR_FORMAT)
    pad = (-len(data)) % 512
    return head + data + b"\0" * pad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sample-size", type=int, required=True)
    ap.add_argument("--samples", type=int, required=True)
    ap.add_argument("--shards", type=int, required=True)
    ap.add_argument("--seed", type=int, default=12)
    a = ap.parse_args()
    if a.sample_size < 8 or a.shards < 1 or a.samples % a.shards:
        ap.error("want sample-size >= 8 and samples a multiple of shards")

    from streaming import MDSWriter  # in the bench venv (bench/loader/run makes it)

    os.makedirs(os.path.join(a.out, "tar"), exist_ok=True)
    crc = np.zeros(a.samples, dtype=np.uint32)
    per = a.samples // a.shards
    files, first = [], 0
    # An MDS shard holds 8 bytes per sample besides the payload (offset, length): this
    # size_limit starts a new MDS shard exactly where a new tar file starts.
    with MDSWriter(out=os.path.join(a.out, "mds"), columns={"bin": "bytes"}, compression=None,
                   size_limit=per * (a.sample_size + 8) + a.sample_size // 2) as mds:
        for s in range(a.shards):
            n = per
            name = f"shard-{s:06d}.tar"
            buf = io.BytesIO()
            for k, data in enumerate(payloads(first, n, a.sample_size, a.seed)):
                crc[first + k] = zlib.crc32(data)
                buf.write(tar_member(f"{first + k:010d}.bin", data))
                mds.write({"bin": data})
            buf.write(b"\0" * 1024)
            with open(os.path.join(a.out, "tar", name), "wb") as f:
                f.write(buf.getbuffer())
            files.append({"name": name, "first": first, "samples": n,
                          "bytes": buf.getbuffer().nbytes})
            first += n
    np.save(os.path.join(a.out, "crc32.npy"), crc)
    with open(os.path.join(a.out, "manifest.json"), "w") as f:
        json.dump({"sample_size": a.sample_size, "samples": a.samples, "shards": a.shards,
                   "seed": a.seed, "payload_bytes": a.samples * a.sample_size,
                   "tar": files}, f, indent=1)
    print(f"{a.out}: {a.samples} samples of {a.sample_size} B in {a.shards} shards "
          f"(tar {sum(f['bytes'] for f in files) / 2**20:.0f} MiB, mds "
          f"{len([x for x in os.listdir(os.path.join(a.out, 'mds')) if x.endswith('.mds')])} "
          f"shards)")


if __name__ == "__main__":
    main()
