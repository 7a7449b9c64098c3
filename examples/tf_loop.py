"""A tf.data + Keras training loop reading 'examples' from tessera (examples/make_dataset.py
first). Run it with the framework environment: build/venv-fw/bin/python examples/tf_loop.py

    build/venv-fw/bin/python examples/tf_loop.py [--server 127.0.0.1:7101] [--epochs 2]
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
import tessera.tf as ttf  # noqa: E402


def decode(rec):
    v = tf.io.decode_raw(rec, tf.float32)
    return v[:64], v[64]


p = argparse.ArgumentParser()
p.add_argument("--server", default="127.0.0.1:7101")
p.add_argument("--epochs", type=int, default=2)
a = p.parse_args()

model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=tf.keras.optimizers.SGD(0.1),
              loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
              metrics=[tf.keras.metrics.BinaryAccuracy(threshold=0.0)])
for epoch in range(a.epochs):
    ds = (ttf.dataset(a.server, "examples", shuffle="window", window=4, seed=1, epoch=epoch)
          .map(decode).batch(64).prefetch(2))
    loss = model.fit(ds, epochs=1, verbose=0, shuffle=False).history["loss"][0]
    print(f"epoch {epoch}: loss {loss:.3f}, accuracy "
          f"{model.evaluate(ds, verbose=0)[1]:.3f}")
