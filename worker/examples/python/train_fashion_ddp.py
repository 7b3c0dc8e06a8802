#!/usr/bin/python3
"""A torch.distributed DDP trainer on Fashion-MNIST, as a cohort command job runs it.

Plain torch.distributed, nothing of cohort's: init_process_group("gloo") with no arguments reads
the launch environment every rank gets (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; cohortd's
agent sets them, so do torchrun and srun wrappers). Uses only Debian's python3-torch: the IDX files
of Debian's dataset-fashion-mnist package are read directly (no torchvision).

  # one machine, two ranks by hand:
  for r in 0 1; do RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
    python3 train_fashion_ddp.py --max-steps 200 & done; wait
  # as a cohort command job: configs/jobs/fashion_ddp_python.yaml

Each rank trains on its shard of the training set (same shuffle on every rank, rank r takes every
WORLD_SIZE-th sample from r) for --max-steps steps; DistributedDataParallel averages the gradients.
Then every rank evaluates its shard of the test set, the counts are summed with all_reduce, and
rank 0 prints "test accuracy: A (N samples)".
"""

import argparse
import gzip
import os
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# Where Debian's dataset-fashion-mnist puts the files (`dpkg -L dataset-fashion-mnist`).
DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"
IDX_UBYTE = 0x08  # the IDX type code of unsigned bytes, the only one Fashion-MNIST uses


def read_idx(path):
    """An IDX file (optionally .gz) as a uint8 tensor of its shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != IDX_UBYTE:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes (magic {data[:4].hex()})")
    ndim = data[3]
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    count = 1
    for d in shape:
        count *= d
    if len(data) != 4 + 4 * ndim + count:
        raise ValueError(f"{path}: {len(data)} bytes, the header {shape} says {4 + 4 * ndim + count}")
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).reshape(shape)


def load_split(data_dir, prefix):
    """(images [N, 784] float in [0, 1], labels [N] long) of `prefix` ("train" or "t10k")."""
    def find(name):
        for candidate in (name + ".gz", name):
            path = os.path.join(data_dir, candidate)
            if os.path.exists(path):
                return path
        raise FileNotFoundError(
            f"{os.path.join(data_dir, name)}(.gz) not found: install Debian's dataset-fashion-mnist "
            f"or pass --data-dir")
    images = read_idx(find(f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(find(f"{prefix}-labels-idx1-ubyte"))
    return images.reshape(images.shape[0], -1).float().div_(255.0), labels.long()


class Mlp(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(784, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-steps", type=int, default=300, help="optimizer steps to train (default 300)")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank and step (default 64)")
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    parser.add_argument("--hidden", type=int, default=128, help="hidden units of the MLP (default 128)")
    parser.add_argument("--data-dir", default=os.environ.get("FASHION_MNIST_DIR", DEFAULT_DATA_DIR),
                        help=f"the IDX files (default $FASHION_MNIST_DIR, else {DEFAULT_DATA_DIR})")
    args = parser.parse_args()

    # The ranks of a node share its cores.
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank} of {world} joined (MASTER_ADDR={os.environ.get('MASTER_ADDR')} "
          f"MASTER_PORT={os.environ.get('MASTER_PORT')} attempt={os.environ.get('COHORT_ATTEMPT', '-')} "
          f"resume={os.environ.get('COHORT_RESUME', '0')})", flush=True)

    train_x, train_y = load_split(args.data_dir, "train")
    test_x, test_y = load_split(args.data_dir, "t10k")
    generator = torch.Generator().manual_seed(0)  # the same order on every rank
    order = torch.randperm(train_x.shape[0], generator=generator)[rank::world]
    train_x, train_y = train_x[order], train_y[order]

    torch.manual_seed(1)
    model = nn.parallel.DistributedDataParallel(Mlp(args.hidden))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = time.monotonic()
    position = 0
    for step in range(1, args.max_steps + 1):
        if position + args.batch_size > train_x.shape[0]:
            position = 0
        x = train_x[position:position + args.batch_size]
        y = train_y[position:position + args.batch_size]
        position += args.batch_size
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if rank == 0 and (step % 100 == 0 or step == args.max_steps):
            print(f"step {step}/{args.max_steps}  loss={loss.item():.4f}", flush=True)
    seconds = time.monotonic() - start

    model.eval()
    with torch.no_grad():
        x, y = test_x[rank::world], test_y[rank::world]
        correct = model(x).argmax(1).eq(y).sum()
        counts = torch.tensor([float(correct), float(y.shape[0])])
    dist.all_reduce(counts)  # SUM over ranks
    if rank == 0:
        print(f"test accuracy: {counts[0].item() / counts[1].item():.4f} ({int(counts[1].item())} samples, "
              f"{args.max_steps} steps x {world} ranks x {args.batch_size}, {seconds:.1f}s)", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
