#!/usr/bin/python3
"""Peer of //bench:train_fashion_mnist (issue 5): the same Fashion-MNIST CNN, data, per-rank
batch, optimizer and epochs in PyTorch DDP over gloo, one intra-op thread per rank.

    /usr/bin/python3 bench/ddp_fashion_mnist.py --ranks 2 --epochs 1

Uses Debian's python3-torch (hence /usr/bin/python3). Ends with the same line as the C++ side:
    RESULT acc=0.9123 samples_per_s=1234 epoch_s=45.6 comm_wait=n/a cpu_ms_per_step=80.5 faults_per_step=2100
DDP does not expose the time step() waits on its allreduces, so comm_wait is reported as n/a.
cpu_ms_per_step and faults_per_step: CPU time and minor page faults of rank 0's process (all its
threads, gloo's included) per training step.

It computes what the C++ side computes, so both reach the same test accuracy: rank 0's
initialization (torch.manual_seed(rank), broadcast), the same shards, each epoch's batch order
drawn exactly as worker/train's BatchIterator draws it (scatter_order: Fisher-Yates over
std::mt19937_64 seeded with epoch_seed(rank, epoch)), and BatchNorm statistics kept per rank
during training (broadcast_buffers=False; the C++ side broadcasts no buffers either) and averaged
after each epoch.
"""
import argparse
import ctypes
import gzip
import os
import resource
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

DATA_DIR = "/usr/share/datasets/fashion-mnist"
EVAL_BATCH = 1000


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def read_split(train, limit):
    prefix = "train" if train else "t10k"
    images = read_idx(os.path.join(DATA_DIR, prefix + "-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(DATA_DIR, prefix + "-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    if limit > 0:
        x, y = x[:limit], y[:limit]
    return x, y


MASK64 = (1 << 64) - 1


class Mt19937_64:
    """std::mt19937_64 (the C++ standard's 64-bit Mersenne Twister), bit for bit."""

    def __init__(self, seed):
        self.mt = [seed & MASK64]
        for i in range(1, 312):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & MASK64)
        self.index = 312

    def __call__(self):
        mt = self.mt
        if self.index >= 312:
            for i in range(312):
                x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
                mt[i] = mt[(i + 156) % 312] ^ (x >> 1) ^ (0xB5026F5AA96619E9 if x & 1 else 0)
            self.index = 0
        x = mt[self.index]
        self.index += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        return (x ^ (x >> 43)) & MASK64


def epoch_seed(seed, epoch):
    """worker/train/multi_node_iterator.cc's epoch_seed (splitmix64 of both)."""
    z = (seed + 0x9E3779B97F4A7C15 * (epoch + 1)) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def scatter_order(n, seed):
    """worker/train/scatter_dataset.cc's scatter_order(n, shuffle=true, seed)."""
    order = list(range(n))
    rng = Mt19937_64(seed)
    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = MASK64 - MASK64 % bound
        draw = rng()
        while draw >= limit:
            draw = rng()
        j = draw % bound
        order[i], order[j] = order[j], order[i]
    return torch.tensor(order, dtype=torch.int64)


def shard(x, y, rank, size, equal):
    """ChainerMN's partition, as worker/train/scatter_dataset.h's scatter_range."""
    n = x.shape[0]
    begin = n * rank // size
    end = begin + (n + size - 1) // size if equal else n * (rank + 1) // size
    idx = torch.arange(begin, end) % n
    return x[idx], y[idx]


class FashionCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(3136, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        h = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        h = F.max_pool2d(F.relu(self.bn2(self.conv2(h))), 2)
        return self.fc2(F.relu(self.fc1(h.flatten(1))))


def set_openblas_threads(n):
    """torch.set_num_threads leaves OpenBLAS's own threads alone; cohort's ranks set both
    (worker/base/blas_threads.h), and so does this side, so that both run one BLAS thread."""
    try:
        # RTLD_NOLOAD: the OpenBLAS torch already loaded, never a second copy with its own threads.
        ctypes.CDLL("libopenblas.so.0", mode=os.RTLD_NOLOAD | os.RTLD_NOW).openblas_set_num_threads(n)
    except (OSError, AttributeError):
        pass  # another BLAS: nothing to set


def run(rank, args, store_path):
    torch.set_num_threads(1)
    set_openblas_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank, world_size=args.ranks)
    size = args.ranks
    xtr, ytr = shard(*read_split(True, args.limit), rank, size, equal=True)
    xte, yte = shard(*read_split(False, args.limit), rank, size, equal=False)
    torch.manual_seed(rank)
    # Broadcasts rank 0's parameters. BN statistics stay per rank until the epoch's end.
    model = nn.parallel.DistributedDataParallel(FashionCnn(), broadcast_buffers=False)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    total_time, total_samples, total_cpu, total_steps, total_faults = 0.0, 0, 0.0, 0, 0
    acc = 0.0
    for epoch in range(args.epochs):
        model.train()
        order = scatter_order(xtr.shape[0], epoch_seed(rank, epoch))
        loss_sum, steps = 0.0, 0
        start = time.perf_counter()
        cpu_start = time.process_time()
        faults_start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for b in range(0, xtr.shape[0], args.batch):
            idx = order[b:b + args.batch]
            opt.zero_grad()
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            loss_sum += loss.item()
            steps += 1
        seconds = time.perf_counter() - start
        total_cpu += time.process_time() - cpu_start
        total_faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_start
        total_steps += steps
        total_time += seconds
        total_samples += xtr.shape[0] * size
        # BN running statistics averaged over ranks, as AllreducePersistent on the C++ side.
        for buf in model.module.buffers():
            if buf.is_floating_point():
                dist.all_reduce(buf)
                buf /= size
        model.eval()
        with torch.no_grad():
            correct, loss_te = 0.0, 0.0
            for b in range(0, xte.shape[0], EVAL_BATCH):
                logits = model.module(xte[b:b + EVAL_BATCH])
                loss_te += F.cross_entropy(logits, yte[b:b + EVAL_BATCH], reduction="sum").item()
                correct += (logits.argmax(1) == yte[b:b + EVAL_BATCH]).sum().item()
        stats = torch.tensor([correct, loss_te, float(xte.shape[0]), loss_sum / max(steps, 1)], dtype=torch.float64)
        dist.all_reduce(stats)
        acc = stats[0].item() / stats[2].item()
        if rank == 0:
            print(f"epoch {epoch + 1}  train_loss={stats[3].item() / size:.4f}  "
                  f"test_loss={stats[1].item() / stats[2].item():.4f}  test_acc={acc:.4f}  time={seconds:.1f}s",
                  flush=True)
    if rank == 0:
        print(f"ranks={size} backend=gloo epochs={args.epochs}")
        print(f"RESULT acc={acc:.4f} samples_per_s={total_samples / total_time:.0f} "
              f"epoch_s={total_time / args.epochs:.1f} comm_wait=n/a "
              f"cpu_ms_per_step={1000 * total_cpu / max(total_steps, 1):.1f} "
              f"faults_per_step={total_faults / max(total_steps, 1):.0f}", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--limit", type=int, default=0, help="first N train/test samples only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddp-fashion-") as tmp:
        mp.spawn(run, args=(args, os.path.join(tmp, "store")), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
