#!/usr/bin/env python3
"""Baselines for the GPU check: PyTorch (and a Triton matmul) on the shapes that
examples/gpu_check.rs benchmarks, side by side with Tessera's numbers.

    python3 gpu_bench.py --ours ours.json [--tileir ours-tileir.json]

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


def triton_attention():
    """A FlashAttention-2 style forward in Triton (not causal; 128 query rows and 64
    keys per step, as Tessera's kernel), written for this comparison. Returns a
    function (q, k, v) -> o on (heads, seq, dim) tensors, or None."""
    try:
        import torch
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def kernel(q_ptr, k_ptr, v_ptr, o_ptr, S, scale_log2,
               D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
        base = tl.program_id(1) * S * D
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        dims = tl.arange(0, D)
        live = rows[:, None] < S
        q = tl.load(q_ptr + base + rows[:, None] * D + dims[None, :], mask=live, other=0.0)
        m = tl.full((BM,), float("-inf"), tl.float32)
        l = tl.zeros((BM,), tl.float32)
        acc = tl.zeros((BM, D), tl.float32)
        for start in range(0, S, BN):
            keys = start + tl.arange(0, BN)
            kt = tl.load(k_ptr + base + keys[None, :] * D + dims[:, None],
                         mask=keys[None, :] < S, other=0.0)
            s = tl.dot(q, kt) * scale_log2
            s = tl.where(keys[None, :] < S, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m - m_new)
            l = l * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + base + keys[:, None] * D + dims[None, :],
                        mask=keys[:, None] < S, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        o = acc / l[:, None]
        tl.store(o_ptr + base + rows[:, None] * D + dims[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=live)

    def run(q, k, v):
        h, s, d = q.shape
        o = torch.empty_like(q)
        grid = (triton.cdiv(s, 128), h)
        kernel[grid](q, k, v, o, s, d ** -0.5 * 1.4426950408889634,
                     D=d, BM=128, BN=64, num_warps=8, num_stages=3)
        return o

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
    # The same, against ours with a 2048-column tile.
    out.append(("layernorm_b2048", "GB/s", 8 * r * c / ms / 1e6, None))

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
                print("triton matmul: WRONG RESULT (not timed)", file=sys.stderr)
            else:
                tri = flops / bench(lambda: run(a, bb), iters=10) / 1e9
        except Exception as e:  # a Triton failure must not hide the other numbers
            print(f"triton matmul failed: {e}", file=sys.stderr)
    out.append(("matmul_f16", "TFLOP/s", flops / ms / 1e9, tri))
    # The same product, ours at the 128x128x64 and 128x256x64 tiles with 8 warps.
    out.append(("matmul_f16_128x128x64", "TFLOP/s", flops / ms / 1e9, tri))
    out.append(("matmul_f16_128x256x64", "TFLOP/s", flops / ms / 1e9, tri))
    # The same product, ours through tensor descriptors (TMA + wgmma).
    out.append(("matmul_desc_f16", "TFLOP/s", flops / ms / 1e9, tri))
    out.append(("matmul_desc_f16_no_ws", "TFLOP/s", flops / ms / 1e9, tri))
    out.append(("matmul_desc_f16_cluster2x1", "TFLOP/s", flops / ms / 1e9, tri))
    out.append(("matmul_desc_persistent_f16", "TFLOP/s", flops / ms / 1e9, tri))
    out.append(("matmul_desc_pingpong_f16", "TFLOP/s", flops / ms / 1e9, tri))
    del a, bb

    # Few tiles, long K (1024 x 1024 x 16384: 64 tiles of 128x128 for 132 SMs):
    # ours persistent, and split 4 ways along K (split-K, atomic adds).
    m, k = 1024, 16384
    a = torch.randn((m, k), device="cuda", dtype=torch.float16)
    bb = torch.randn((k, m), device="cuda", dtype=torch.float16)
    flops = 2 * m * m * k
    ms = bench(lambda: torch.matmul(a, bb), iters=10)
    out.append(("matmul_desc_few_tiles_persistent_f16", "TFLOP/s", flops / ms / 1e9, None))
    out.append(("matmul_desc_few_tiles_split_k4_f16", "TFLOP/s", flops / ms / 1e9, None))
    del a, bb

    # FlashAttention forward, not causal: 32 heads of 4096 tokens, head dim 64 (torch
    # picks its flash backend; Triton: triton_attention above).
    h, s, d = 32, 4096, 64
    q, k, v = (torch.randn((1, h, s, d), device="cuda", dtype=torch.float16) for _ in range(3))
    flops = 4 * h * s * s * d
    ms = bench(lambda: F.scaled_dot_product_attention(q, k, v), iters=10)
    tri = None
    run = triton_attention()
    if run is not None:
        try:
            q3, k3, v3 = q[0].contiguous(), k[0].contiguous(), v[0].contiguous()
            ref = F.scaled_dot_product_attention(q, k, v)[0]
            if not torch.allclose(run(q3, k3, v3).float(), ref.float(), atol=2e-2, rtol=2e-2):
                print("triton attention: WRONG RESULT (not timed)", file=sys.stderr)
            else:
                tri = flops / bench(lambda: run(q3, k3, v3), iters=10) / 1e9
        except Exception as e:  # a Triton failure must not hide the other numbers
            print(f"triton attention failed: {e}", file=sys.stderr)
    out.append(("attention_f16", "TFLOP/s", flops / ms / 1e9, tri))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ours", help="gpu_check --json output")
    p.add_argument("--tileir", help="gpu_check --json output of the Tile IR path")
    args = p.parse_args()
    device = "?"

    def load(path):
        nonlocal device
        if not path:
            return {}
        try:
            with open(path) as f:
                data = json.load(f)
            device = data.get("device", device)
            return {b["name"]: b["value"] for b in data.get("bench", [])}
        except (OSError, ValueError) as e:
            print(f"cannot read {path}: {e}", file=sys.stderr)
            return {}

    ours = load(args.ours)
    tile = load(args.tileir)
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
    head = (f"{'kernel':<22} {'unit':<8} {'tessera':>10} {'torch':>10} {'triton':>10} "
            f"{'vs torch':>9} {'vs triton':>9}")
    if args.tileir:
        head += f" {'tileir':>10} {'tileir/torch':>12}"
    print(head)
    for name, unit, t, tri in rows:
        mine = ours.get(name)
        ratio = "-" if mine is None else f"{mine / t:8.2f}x"
        rtri = "-" if mine is None or tri is None else f"{mine / tri:8.2f}x"
        line = (f"{name:<22} {unit:<8} {fmt(mine):>10} {fmt(t):>10} {fmt(tri):>10} "
                f"{ratio:>9} {rtri:>9}")
        if args.tileir:
            tv = tile.get(name)
            tr = "-" if tv is None else f"{tv / t:11.2f}x"
            line += f" {fmt(tv):>10} {tr:>12}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
