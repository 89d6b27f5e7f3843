#!/usr/bin/env python3
"""Baselines for the GPU check: PyTorch (and a Triton matmul) on the shapes that
examples/gpu_check.rs benchmarks, side by side with Tessera's numbers.

    python3 gpu_bench.py --ours ours.json

Runs on the lent GPU machine (PyTorch + Triton + driver, no Rust). Prints the table
last. Shapes must match `benchmarks()` in examples/gpu_check.rs.
"""

import argparse
import json
import sys


def bench(fn, iters=20):
    """Median milliseconds of fn() by CUDA events, after two warm-up runs."""
    import torch

    fn()
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def triton_matmul():
    """A tutorial-style Triton matmul (grouped tile ordering, f32 accumulation),
    written for this comparison. Returns a function (a, b) -> c, or None."""
    try:
        import torch
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def kernel(a_ptr, b_ptr, c_ptr, M, N, K,
               sam, sak, sbk, sbn, scm, scn,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GM: tl.constexpr):
        pid = tl.program_id(0)
        n_m = tl.cdiv(M, BM)
        n_n = tl.cdiv(N, BN)
        per_group = GM * n_n
        group = pid // per_group
        first_m = group * GM
        size_m = min(n_m - first_m, GM)
        pm = first_m + (pid % per_group) % size_m
        pn = (pid % per_group) // size_m
        rm = (pm * BM + tl.arange(0, BM)) % M
        rn = (pn * BN + tl.arange(0, BN)) % N
        rk = tl.arange(0, BK)
        a = a_ptr + rm[:, None] * sam + rk[None, :] * sak
        b = b_ptr + rk[:, None] * sbk + rn[None, :] * sbn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BK)):
            am = rk[None, :] < K - k * BK
            bm = rk[:, None] < K - k * BK
            acc = tl.dot(tl.load(a, mask=am, other=0.0), tl.load(b, mask=bm, other=0.0), acc)
            a += BK * sak
            b += BK * sbk
        cm = pm * BM + tl.arange(0, BM)
        cn = pn * BN + tl.arange(0, BN)
        c = c_ptr + cm[:, None] * scm + cn[None, :] * scn
        tl.store(c, acc.to(tl.float16), mask=(cm[:, None] < M) & (cn[None, :] < N))

    def run(a, b):
        M, K = a.shape
        _, N = b.shape
        c = torch.empty((M, N), device=a.device, dtype=torch.float16)
        grid = (triton.cdiv(M, 128) * triton.cdiv(N, 256),)
        kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                     c.stride(0), c.stride(1), BM=128, BN=256, BK=64, GM=8,
                     num_warps=8, num_stages=3)
        return c

    return run


def baselines():
    """(name, unit, torch value, triton value or None) per benchmark."""
    import torch
    import torch.nn.functional as F

    out = []
    n = 1 << 26
    x = torch.rand(n, device="cuda")
    y = torch.rand(n, device="cuda")
    o = torch.empty_like(x)
    ms = bench(lambda: torch.add(x, y, out=o))
    out.append(("vector_add", "GB/s", 12 * n / ms / 1e6, None))
    del x, y, o

    r, c = 4096 * 4, 1024
    x = torch.rand((r, c), device="cuda")
    ms = bench(lambda: torch.softmax(x, dim=-1))
    out.append(("softmax_f32", "GB/s", 8 * r * c / ms / 1e6, None))

    r, c = 4096, 8192
    x = torch.rand((r, c), device="cuda")
    w = torch.ones(c, device="cuda")
    b = torch.zeros(c, device="cuda")
    ms = bench(lambda: F.layer_norm(x, (c,), w, b, 1e-5))
    out.append(("layernorm", "GB/s", 8 * r * c / ms / 1e6, None))

    s = 4096
    a = torch.randn((s, s), device="cuda", dtype=torch.float16)
    bb = torch.randn((s, s), device="cuda", dtype=torch.float16)
    flops = 2 * s ** 3
    ms = bench(lambda: torch.matmul(a, bb), iters=10)
    tri = None
    run = triton_matmul()
    if run is not None:
        try:
            ref = torch.matmul(a, bb)
            got = run(a, bb)
            if not torch.allclose(got.float(), ref.float(), atol=1e-1, rtol=1e-2):
                print("triton matmul: WRONG RESULT", file=sys.stderr)
            tri = flops / bench(lambda: run(a, bb), iters=10) / 1e9
        except Exception as e:  # a Triton failure must not hide the other numbers
            print(f"triton matmul failed: {e}", file=sys.stderr)
    out.append(("matmul_f16", "TFLOP/s", flops / ms / 1e9, tri))
    # The same product, ours through tensor descriptors (TMA + wgmma).
    out.append(("matmul_desc_f16", "TFLOP/s", flops / ms / 1e9, tri))
    del a, bb

    # FlashAttention forward, not causal: 32 heads of 4096 tokens, head dim 64 (torch
    # picks its flash backend). No Triton attention kernel here (yet).
    h, s, d = 32, 4096, 64
    q, k, v = (torch.randn((1, h, s, d), device="cuda", dtype=torch.float16) for _ in range(3))
    ms = bench(lambda: F.scaled_dot_product_attention(q, k, v), iters=10)
    out.append(("attention_f16", "TFLOP/s", 4 * h * s * s * d / ms / 1e9, None))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ours", help="gpu_check --json output")
    args = p.parse_args()
    ours = {}
    device = "?"
    if args.ours:
        try:
            with open(args.ours) as f:
                data = json.load(f)
            device = data.get("device", "?")
            ours = {b["name"]: b["value"] for b in data.get("bench", [])}
        except (OSError, ValueError) as e:
            print(f"cannot read {args.ours}: {e}", file=sys.stderr)
    try:
        import torch

        if not torch.cuda.is_available():
            print("no CUDA device for PyTorch", file=sys.stderr)
            return 1
        gpu = torch.cuda.get_device_name()
        rows = baselines()
    except ImportError:
        print("PyTorch is not installed", file=sys.stderr)
        return 1

    def fmt(v):
        return "-" if v is None else f"{v:10.1f}"

    print(f"\nbenchmarks on {gpu} (tessera: {device})")
    print(f"{'kernel':<16} {'unit':<8} {'tessera':>10} {'torch':>10} {'triton':>10} "
          f"{'vs torch':>9} {'vs triton':>9}")
    for name, unit, t, tri in rows:
        mine = ours.get(name)
        ratio = "-" if mine is None else f"{mine / t:8.2f}x"
        rtri = "-" if mine is None or tri is None else f"{mine / tri:8.2f}x"
        print(f"{name:<16} {unit:<8} {fmt(mine):>10} {fmt(t):>10} {fmt(tri):>10} "
              f"{ratio:>9} {rtri:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
