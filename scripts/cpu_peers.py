#!/usr/bin/env python3
"""Times what a user would run instead of Tessera's CPU device, for runtime/benches/cpu.rs.

Prints one line per case, `name seconds implementation`, the median of `reps` runs
after a warm-up, for the same sizes as the benchmark: numpy always (its matmul is the
BLAS numpy links, OpenBLAS from PyPI's wheels), torch on the CPU when it is installed.
"""
import statistics
import sys
import time

import numpy as np


def median_time(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main():
    rng = np.random.default_rng(1)
    n = 1 << 22
    x = rng.uniform(-1, 1, n).astype(np.float32)
    y = rng.uniform(-1, 1, n).astype(np.float32)
    out = np.empty_like(x)
    rows, cols = 4096, 1024
    s = rng.uniform(-3, 5, (rows, cols)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    b = rng.uniform(-1, 1, cols).astype(np.float32)
    m = 512
    a = rng.uniform(-1, 1, (m, m)).astype(np.float32)
    bb = rng.uniform(-1, 1, (m, m)).astype(np.float32)

    def np_softmax():
        e = np.exp(s - s.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def np_layernorm():
        mu = s.mean(axis=1, keepdims=True)
        var = ((s - mu) ** 2).mean(axis=1, keepdims=True)
        return (s - mu) / np.sqrt(var + 1e-5) * w + b

    res = [
        ("vector_add", median_time(lambda: np.add(x, y, out=out), 21), "numpy"),
        ("softmax", median_time(np_softmax, 7), "numpy"),
        ("layernorm", median_time(np_layernorm, 7), "numpy"),
        ("matmul", median_time(lambda: a @ bb, 11), "numpy (its BLAS)"),
    ]
    try:
        import torch

        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        tout = torch.empty_like(tx)
        ts = torch.from_numpy(s)
        tw, tb = torch.from_numpy(w), torch.from_numpy(b)
        ta, tbb = torch.from_numpy(a), torch.from_numpy(bb)
        with torch.no_grad():
            res += [
                ("vector_add", median_time(lambda: torch.add(tx, ty, out=tout), 21), "torch"),
                ("softmax", median_time(lambda: torch.softmax(ts, dim=1), 7), "torch"),
                (
                    "layernorm",
                    median_time(
                        lambda: torch.nn.functional.layer_norm(ts, (cols,), tw, tb, 1e-5), 7
                    ),
                    "torch",
                ),
                ("matmul", median_time(lambda: ta @ tbb, 11), "torch"),
            ]
    except ImportError:
        print("# torch not installed: numpy only", file=sys.stderr)
    for name, t, imp in res:
        print(f"{name} {t:.9f} {imp}")


if __name__ == "__main__":
    main()
