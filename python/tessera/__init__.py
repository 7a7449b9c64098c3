"""tessera: the Python client of tessera, a shard-serving storage service for training data,
over libtessera (ctypes; no compiled extension). See docs/client.md "Python".

    from tessera import Client, Reader, Plan
    with Client("10.0.0.5:7070") as c:
        c.put_records("train", 0, [b"a", b"bc"])
    for record in Reader("10.0.0.5:7070", "train", rank=0, world=4, shuffle="global", epoch=3):
        ...

Adapters: tessera.torch (PyTorch), tessera.tf (tf.data), tessera.jax (JAX).
"""

from ._lib import TesseraError
from .client import Client, ConnectOptions
from .plan import Plan
from .reader import Item, Reader

__all__ = ["Client", "ConnectOptions", "Item", "Plan", "Reader", "TesseraError"]
__version__ = "0.1.0"
