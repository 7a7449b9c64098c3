"""A JAX training loop over 8 host CPU devices: global batches from tessera sharded over a
Mesh (each device holds its slice; the padded last batch is masked out of the loss). Reads
'examples' (examples/make_dataset.py first). Run it with the framework environment:

    build/venv-fw/bin/python examples/jax_loop.py [--server 127.0.0.1:7101] [--epochs 2]
"""

import argparse
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import tessera.jax as tjax  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--server", default="127.0.0.1:7101")
p.add_argument("--epochs", type=int, default=2)
a = p.parse_args()

mesh = Mesh(np.array(jax.devices()), ("data",))
sharding = NamedSharding(mesh, PartitionSpec("data"))


def loss_fn(w, batch, mask):
    x, y = batch[:, :64], batch[:, 64]
    logits = x @ w[:64] + w[64]
    per = jnp.logaddexp(0.0, logits) - y * logits
    return jnp.sum(per * mask) / jnp.maximum(jnp.sum(mask), 1), jnp.sum(((logits > 0) == y) * mask)


@jax.jit
def step(w, batch, mask):
    (loss, correct), g = jax.value_and_grad(loss_fn, has_aux=True)(w, batch, mask)
    return w - 0.1 * g, loss, correct


w = jnp.zeros(65)
for epoch in range(a.epochs):
    n = correct = 0
    for batch, mask in tjax.batches(a.server, "examples", sharding, 256, shuffle="global",
                                    seed=1, epoch=epoch,
                                    decode=lambda r: np.frombuffer(r, dtype=np.float32)):
        w, loss, c = step(w, batch, mask)
        n += int(mask.sum())
        correct += int(c)
    print(f"epoch {epoch}: {n} records, last loss {float(loss):.3f}, accuracy {correct / n:.3f}")
