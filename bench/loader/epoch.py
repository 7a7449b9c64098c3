"""One epoch of one data set through a PyTorch DataLoader, from one system; prints one JSON line.

    epoch.py --system SYSTEM --data DIR [--addr HOST:PORT] [--name DATASET] [--url URL]
             [--step-ms MS] [--step-kind sleep|busy] [--workers 2] [--batch 64] [--seed S]
             [--hint-bytes B] [--reader JSON]

SYSTEM: tessera (TesseraIterable over a tesserad or a cluster, shuffle="window"; --hint-bytes:
the readers' HINT distance, tessera.Reader's hint_bytes: 0 = no hints, default the library's;
--reader: other tessera.Reader options, e.g. '{"window_bytes": 16777216}'),
wds-http (WebDataset over http:// URLs, shardshuffle + a 1000-sample buffer), streaming
(MosaicML StreamingDataset, remote = DIR/mds, local = a fresh cache folder, shuffle=True),
local-wds (WebDataset over the tar files on local disk), local-raw (a minimal tar reader over
the same files: a shard is read whole, its samples yielded in a shuffled order).

Every system yields the sample's payload (bytes-like) in the worker; one collate function
makes a (batch, sample_size) uint8 tensor of the batch. The training loop takes batches, and
for each: records the sample ids (the payload's first 8 bytes), checks one row's CRC32
against DIR/crc32.npy, then runs the step: STEP_MS of sleep ("the accelerator computes, the
host waits": the loader's core stays free) or of busy-looping on the CPU (--step-kind busy).

Reported: samples/s and GB/s (payload bytes) over the epoch (from iter(loader) to the last
batch, the workers' start included); time to the first batch; data stall = the time the loop
waited in next() after the first batch, divided by the epoch time after the first batch;
whether every sample arrived exactly once.
"""

import argparse
import glob
import json
import os
import random
import shutil
import sys
import tempfile
import time
import zlib

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

SHUFFLE_BUFFER = 1000  # WebDataset's sample shuffle buffer (per worker)


def collate(samples):
    """Payloads (bytes-like, all of one size) -> a (len, size) uint8 tensor."""
    buf = bytearray().join(samples)
    return torch.frombuffer(buf, dtype=torch.uint8).view(len(samples), -1)


def tar_payload(rec):
    """A tar record (one 512-byte USTAR header, the member, padding) -> the member's bytes."""
    size = int(bytes(rec[124:136]).rstrip(b"\0 ") or b"0", 8)
    return rec[512:512 + size]


# ---- the systems ------------------------------------------------------------------------------


def tessera_loader(a):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
    import tessera.torch as tt

    reader = json.loads(a.reader)
    if a.hint_bytes is not None:
        reader["hint_bytes"] = a.hint_bytes
    ds = tt.TesseraIterable(a.addr, a.name, batch_size=a.batch, shuffle="window", seed=a.seed,
                            copy=False, transform=tar_payload, reader=reader)
    return tt.DataLoader(ds, num_workers=a.workers, collate_fn=collate)


def wds_loader(a, urls):
    import webdataset as wds

    ds = (wds.WebDataset(urls, shardshuffle=len(urls), seed=a.seed, empty_check=False)
          .shuffle(SHUFFLE_BUFFER)
          .map(lambda s: s["bin"]))
    return DataLoader(ds, batch_size=a.batch, num_workers=a.workers, collate_fn=collate)


def streaming_loader(a):
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()

    class Payloads(StreamingDataset):
        def __getitem__(self, i):
            return super().__getitem__(i)["bin"]

    cache = tempfile.mkdtemp(prefix="streaming-cache-", dir=a.scratch)
    a.cleanup.append(lambda: shutil.rmtree(cache, ignore_errors=True))
    ds = Payloads(remote=os.path.join(a.data, "mds"), local=cache, shuffle=True,
                  shuffle_seed=a.seed, batch_size=a.batch)
    return DataLoader(ds, batch_size=a.batch, num_workers=a.workers, collate_fn=collate)


class LocalTar(IterableDataset):
    """The tar shards from local files, shards shuffled per epoch and dealt to the workers in
    turn; each shard is read whole and its samples yielded in a shuffled order."""

    def __init__(self, files, seed):
        self.files, self.seed = files, seed

    def __iter__(self):
        info = get_worker_info()
        n, w = (info.num_workers, info.id) if info else (1, 0)
        rng = random.Random(self.seed)
        files = list(self.files)
        rng.shuffle(files)
        for path in files[w::n]:
            with open(path, "rb") as f:
                data = memoryview(f.read())
            recs, at = [], 0
            while at + 512 <= len(data) and data[at] != 0:
                size = int(bytes(data[at + 124:at + 136]).rstrip(b"\0 ") or b"0", 8)
                recs.append((at + 512, size))
                at += 512 + size + (-size) % 512
            rng.shuffle(recs)
            for off, size in recs:
                yield data[off:off + size]


def local_raw_loader(a, files):
    return DataLoader(LocalTar(files, a.seed), batch_size=a.batch, num_workers=a.workers,
                      collate_fn=collate)


def make_loader(a, manifest):
    files = [os.path.join(a.data, "tar", f["name"]) for f in manifest["tar"]]
    if a.system == "tessera":
        return tessera_loader(a)
    if a.system == "wds-http":
        return wds_loader(a, [f"{a.url.rstrip('/')}/{f['name']}" for f in manifest["tar"]])
    if a.system == "local-wds":
        return wds_loader(a, files)
    if a.system == "local-raw":
        return local_raw_loader(a, files)
    if a.system == "streaming":
        return streaming_loader(a)
    raise SystemExit(f"unknown system {a.system}")


# ---- the training loop --------------------------------------------------------------------------


def step(kind, seconds, start):
    end = start + seconds
    if kind == "busy":
        while time.perf_counter() < end:
            pass
    else:
        left = end - time.perf_counter()
        if left > 0:
            time.sleep(left)


def run_epoch(a, manifest, loader):
    crc = np.load(os.path.join(a.data, "crc32.npy"))
    seen = np.zeros(manifest["samples"], dtype=np.int32)
    size = manifest["sample_size"]
    step_s = a.step_ms / 1000
    waited = first = 0.0
    batches = samples = bad = 0
    t_start = time.perf_counter()
    it = iter(loader)
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        if batches == 0:
            first = t1 - t_start
        else:
            waited += t1 - t0
        if batch.dim() != 2 or batch.shape[1] != size:
            raise SystemExit(f"batch {batches} has shape {tuple(batch.shape)}, want (*, {size})")
        ids = batch[:, :8].clone().view(torch.int64).view(-1).numpy()
        np.add.at(seen, ids, 1)
        row = batches % len(ids)
        if zlib.crc32(batch[row].numpy()) != crc[ids[row]]:
            bad += 1
        batches += 1
        samples += len(ids)
        step(a.step_kind, step_s, t1)
    t_end = time.perf_counter()
    epoch = t_end - t_start
    return {
        "samples": samples, "batches": batches, "epoch_s": round(epoch, 4),
        "samples_per_s": round(samples / epoch, 1),
        "gb_per_s": round(samples * size / epoch / 1e9, 4),
        "first_batch_s": round(first, 4),
        "stall": round(waited / max(epoch - first, 1e-9), 4),
        "stall_s": round(waited, 4),
        "unique": int(np.count_nonzero(seen)), "dups": int(seen[seen > 1].sum() - (seen > 1).sum()),
        "missing": int(np.count_nonzero(seen == 0)), "crc_checked": batches, "crc_bad": bad,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--system", required=True,
                    choices=["tessera", "wds-http", "streaming", "local-wds", "local-raw"])
    ap.add_argument("--label", help="the system's name in the report (default: --system)")
    ap.add_argument("--data", required=True, help="a folder made by make_data.py")
    ap.add_argument("--addr", help="tessera: a node's address")
    ap.add_argument("--name", help="tessera: the dataset")
    ap.add_argument("--url", help="wds-http: the URL of the folder of tar shards")
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--step-kind", choices=["sleep", "busy"], default="sleep")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hint-bytes", type=int, default=None,
                    help="tessera: the readers' hint_bytes (0: no hints; default: the library's)")
    ap.add_argument("--reader", default="{}",
                    help="tessera: JSON of tessera.Reader options (window_units, window_bytes, "
                    "depth, ...) over the adapter's defaults")
    ap.add_argument("--scratch", default=None, help="folder for Streaming's cache")
    ap.add_argument("--extra", default="{}", help="JSON merged into the output line")
    a = ap.parse_args()
    a.cleanup = []
    with open(os.path.join(a.data, "manifest.json")) as f:
        manifest = json.load(f)
    try:
        loader = make_loader(a, manifest)
        ru0 = os.times()
        out = run_epoch(a, manifest, loader)
        ru1 = os.times()
        del loader
    finally:
        for fn in a.cleanup:
            fn()
    # CPU seconds of this process and its (reaped) children: the loader's cost on its core.
    out["loader_cpu_s"] = round((ru1.user + ru1.system + ru1.children_user
                                 + ru1.children_system) - (ru0.user + ru0.system
                                 + ru0.children_user + ru0.children_system), 3)
    line = {"system": a.label or a.system, "dataset": os.path.basename(a.data.rstrip("/")),
            "sample_size": manifest["sample_size"], "step_ms": a.step_ms,
            "step_kind": a.step_kind, "workers": a.workers, "batch": a.batch, **out,
            **json.loads(a.extra)}
    print(json.dumps(line, separators=(",", ":")), flush=True)
    ok = out["missing"] == 0 and out["dups"] == 0 and out["crc_bad"] == 0
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
