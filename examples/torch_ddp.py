"""A PyTorch DDP training loop (gloo, 2 ranks on this machine) reading 'examples' from tessera
(examples/make_dataset.py first). Ranks are started with torch.multiprocessing and the env://
variables (Debian's torch 1.13 torchrun fails under Python 3.11 in its elastic agent).

    python3 examples/torch_ddp.py [--server 127.0.0.1:7101] [--epochs 2]
"""

import argparse
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from tessera.torch import DataLoader, TesseraIterable  # noqa: E402


def decode(rec):
    v = np.frombuffer(rec, dtype=np.float32)
    return torch.from_numpy(v[:64].copy()), torch.tensor(v[64])


def run(rank, world, args):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(args.port))
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ds = TesseraIterable(args.server, "examples", batch_size=64, seed=1, transform=decode)
    loader = DataLoader(ds, num_workers=2)
    for epoch in range(args.epochs):
        ds.set_epoch(epoch)
        total, correct, n = 0.0, 0, 0
        for x, y in loader:
            out = model(x).squeeze(1)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(out, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            correct += int(((out > 0).float() == y).sum())
            n += len(y)
        stats = torch.tensor([total, correct, n], dtype=torch.float64)
        dist.all_reduce(stats)
        if rank == 0:
            print(f"epoch {epoch}: {int(stats[2])} records, loss {stats[0] / stats[2]:.3f}, "
                  f"accuracy {stats[1] / stats[2]:.3f}")
    del model, opt  # the DDP module holds the group: release it before the group goes
    dist.barrier()  # and leave together (torch 1.13's gloo teardown is fragile otherwise)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--server", default="127.0.0.1:7101")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--port", type=int, default=29511)
    a = p.parse_args()
    mp.spawn(run, args=(2, a), nprocs=2)
