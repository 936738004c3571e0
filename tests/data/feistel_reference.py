#!/usr/bin/env python3
"""feistel_reference.py — an independent transcription, in Python, of the
algorithms that abi/src/sampler_feistel.c, sampler_distributed.c and
sampler_bucket.c document (written from their header comments, not from the
C code), printing the golden values that tests/c/test-sampler.c pins:

  pi N=1000000 seed=42 epoch=0: pi(0..5)
  dist N=10 world=3 seed=7 epoch=1 shuffle=1 drop_last=D rank=R: indices
  bucket N=24 world=2 bs=2 seed=5 epoch=1 shuffle=1 drop_last=D bounds=B rank=R: batches

test-sampler.c (feistel_reference_transcription_agrees) runs this script
with the repository's virtual environment's Python (or python3) when one is
present and compares its output with the C implementation's, line by line.
A change to the order of any sampler breaks resuming old checkpoints: if
this script and the C code disagree, the C code changed.

usage: python3 feistel_reference.py
"""

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1

SALT_DISTRIBUTED = 0x64697374  # "dist"
SALT_BATCH_ORDER = 0x62617463  # "batc"
SALT_BUCKET = 0x6275636B       # "buck" + (bucket number << 32)


def splitmix64(state):
    """(new state, output): Steele, Lea, Flood 2014."""
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def mix32(x):
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    x ^= x >> 16
    return x


class Feistel:
    """The keyed bijection pi of [0, n) for (seed, epoch, salt)."""

    def __init__(self, n, seed, epoch, salt):
        self.n = n
        b = 2
        while b < 64 and (1 << b) < n:
            b += 1
        self.a = (b + 1) // 2  # left half
        self.c = b // 2        # right half
        state, s1 = splitmix64(seed & M64)
        state, s2 = splitmix64(s1 ^ ((epoch * 0xD6E8FEB86659FD93) & M64))
        state = s2 ^ ((salt * 0xA0761D6478BD642F) & M64)
        self.keys = []
        for _ in range(4):
            state, out = splitmix64(state)
            self.keys.append(out & M32)

    def encrypt(self, x):
        a, c = self.a, self.c
        left, right = x >> c, x & ((1 << c) - 1)
        widths = (a, c, a, c)  # width of the new right half after each round
        for k, w in zip(self.keys, widths):
            left, right = right, (left ^ mix32(right ^ k)) & ((1 << w) - 1)
        return (left << c) | right

    def __call__(self, i):
        y = self.encrypt(i)
        while y >= self.n:  # cycle walking
            y = self.encrypt(y)
        return y


def distributed(n, world, rank, seed, epoch, shuffle, drop_last):
    per_rank = n // world if drop_last else -(-n // world)
    pi = Feistel(n, seed, epoch, SALT_DISTRIBUTED)
    out = []
    for k in range(per_rank):
        g = (rank + k * world) % n  # positions >= n repeat position g mod n
        out.append(pi(g) if shuffle else g)
    return out


def bucket(lengths, world, rank, bs, seed, epoch, shuffle, drop_last,
           bounds=None, num_buckets=0):
    n = len(lengths)
    if bounds is None:  # quantile bounds, duplicates merged
        srt = sorted(lengths)
        bounds = []
        for k in range(num_buckets):
            if n == 0:
                break
            at = -(-((k + 1) * n) // num_buckets)
            u = srt[at - 1]
            if not bounds or u > bounds[-1]:
                bounds.append(u)
    slots = [[] for _ in range(len(bounds) + 1)]
    for i, length in enumerate(lengths):  # first bound >= length, else overflow
        j = next((j for j, u in enumerate(bounds) if u >= length), len(bounds))
        slots[j].append(i)
    members = [m for m in slots if m]  # empty buckets skipped; ascending ids
    g = bs * world
    nbatch = [len(m) // g if drop_last else -(-len(m) // g) for m in members]
    offsets = [sum(nbatch[:i]) for i in range(len(members) + 1)]
    total = offsets[-1]
    sigma = Feistel(total, seed, epoch, SALT_BATCH_ORDER)
    out = []
    for pos in range(total):
        slot = sigma(pos) if shuffle else pos
        b = max(i for i in range(len(members)) if offsets[i] <= slot)
        j = slot - offsets[b]
        m = members[b]
        ni = len(m)
        pi = Feistel(ni, seed, epoch, SALT_BUCKET + (b << 32))
        p0 = (j * world + rank) * bs
        batch = []
        for t in range(bs):
            p = (p0 + t) % ni
            batch.append(m[pi(p) if shuffle else p])
        out.append(batch)
    return out


def golden_lengths():
    """The lengths of the bucket case: 24 samples, 1 to 99."""
    return [(i * 37 + 11) % 97 + 1 for i in range(24)]


def main():
    pi = Feistel(1000000, 42, 0, SALT_DISTRIBUTED)
    print("pi N=1000000 seed=42 epoch=0: " + " ".join(str(pi(i)) for i in range(6)))
    for drop in (0, 1):
        for rank in range(3):
            v = distributed(10, 3, rank, 7, 1, 1, drop)
            print(f"dist N=10 world=3 seed=7 epoch=1 shuffle=1 drop_last={drop} "
                  f"rank={rank}: " + " ".join(map(str, v)))
    lengths = golden_lengths()
    for drop in (0, 1):
        for name, kw in (("20,60", {"bounds": [20, 60]}), ("q3", {"num_buckets": 3})):
            for rank in range(2):
                v = bucket(lengths, 2, rank, 2, 5, 1, 1, drop, **kw)
                print(f"bucket N=24 world=2 bs=2 seed=5 epoch=1 shuffle=1 "
                      f"drop_last={drop} bounds={name} rank={rank}: "
                      + " | ".join(" ".join(map(str, b)) for b in v))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
