"""Loads the dataset the examples read: 'examples', 20,000 records of 64 float32 features and a
label, in 8 shards with their record index, on the local 5-node cluster (scripts/local-cluster
start) or --server/--certs of your own (a writer certificate).

    python3 examples/make_dataset.py
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from tessera import Client, ConnectOptions, TesseraError  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--server", default="127.0.0.1:7201", help="a node's TLS address")
p.add_argument("--certs", default="cluster5/certs", help="ca.pem, writer.pem, writer.key")
p.add_argument("--records", type=int, default=20000)
a = p.parse_args()

rng = np.random.default_rng(0)
w = rng.normal(size=64).astype(np.float32)
with Client(ConnectOptions(a.server, tls_ca=f"{a.certs}/ca.pem",
                           tls_cert=f"{a.certs}/writer.pem",
                           tls_key=f"{a.certs}/writer.key")) as c:
    try:
        c.create_dataset("examples", core=3)
    except TesseraError as e:
        if e.name != "TS_EEXIST":
            raise
    done = {s["shard"] for s in c.shards("examples") if s["state"] == "complete"}
    per = a.records // 8
    for s in range(8):
        if s in done:
            continue
        x = rng.normal(size=(per, 64)).astype(np.float32)
        y = (x @ w > 0).astype(np.float32)
        c.put_records("examples", s, [x[i].tobytes() + y[i].tobytes() for i in range(per)])
    print(f"examples: {per * 8} records in 8 shards on {a.server}")
