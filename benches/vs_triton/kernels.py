"""Tessera's four example kernels, written in idiomatic Triton.

Each kernel has the same semantics, tile sizes and launch shape as its Tessera
counterpart in `examples/` (compiled with num_warps=4 by compare.py):

| Triton here          | Tessera                                   | tiles             |
|----------------------|-------------------------------------------|-------------------|
| vector_add           | examples/vector_add.rs `vector_add::<1024>` | BLOCK=1024        |
| softmax              | examples/softmax.rs `softmax::<f32,4,1024>` | ROWS=4, BLOCK=1024|
| matmul (f16 in/out)  | examples/matmul.rs `matmul::<f16,64,64,32>` | 64x64x32, also 128x128x32 |
| layernorm            | examples/layernorm.rs `layernorm::<f32,256>`| BLOCK=256, loops over columns |

Conventions shared with the Tessera kernels: row-major, contiguous rows (the row
stride is the row length, there are no stride arguments), i32 sizes, f32 statistics.
"""

import triton
import triton.language as tl


@triton.jit
def vector_add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[i] = x[i] + y[i]; one BLOCK-element tile per program, tail masked."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def softmax(x_ptr, out_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """Row softmax of ROWS rows per program in f32; BLOCK must cover n_cols, the tail
    columns (and rows past n_rows) are masked and read as -inf."""
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS))[:, None]  # ROWS x 1
    cols = tl.arange(0, BLOCK)[None, :]  # 1 x BLOCK
    mask = (rows < n_rows) & (cols < n_cols)
    offs = rows * n_cols + cols
    v = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(v - tl.max(v, axis=1)[:, None])
    y = e / tl.sum(e, axis=1)[:, None]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, m, n, k, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """C = A @ B (row-major m x k, k x n), one BM x BN tile of C per program
    (program_id(0) over rows, program_id(1) over columns), tl.dot accumulating in f32,
    rows/columns/k masked like Tessera's (loads read 0 outside)."""
    rm = (tl.program_id(0) * BM + tl.arange(0, BM))[:, None]  # BM x 1
    rn = (tl.program_id(1) * BN + tl.arange(0, BN))[None, :]  # 1 x BN
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, k, BK):
        kk = k0 + rk
        k_col = kk[None, :]  # 1 x BK
        k_row = kk[:, None]  # BK x 1
        a = tl.load(a_ptr + rm * k + k_col, mask=(rm < m) & (k_col < k), other=0.0)
        b = tl.load(b_ptr + k_row * n + rn, mask=(k_row < k) & (rn < n), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rm * n + rn, acc.to(c_ptr.dtype.element_ty), mask=(rm < m) & (rn < n))


@triton.jit
def matmul_bt(a_ptr, bt_ptr, c_ptr, m, n, k, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """C = A @ B with B given transposed (A m x k, Bt n x k, both row-major: the
    8-bit GEMMs' layout, both operands contiguous along k), as
    examples/matmul_i8.rs `matmul_i8_bt` and examples/matmul_fp8.rs `matmul_fp8_bt`:
    tl.dot accumulating in C's type (int32 for int8, f32 for fp8), masked edges."""
    rm = (tl.program_id(0) * BM + tl.arange(0, BM))[:, None]  # BM x 1
    rn = (tl.program_id(1) * BN + tl.arange(0, BN))[None, :]  # 1 x BN
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=c_ptr.dtype.element_ty)
    for k0 in range(0, k, BK):
        kk = k0 + rk
        k_col = kk[None, :]  # 1 x BK
        k_row = kk[:, None]  # BK x 1
        a = tl.load(a_ptr + rm * k + k_col, mask=(rm < m) & (k_col < k), other=0.0)
        b = tl.load(bt_ptr + rn * k + k_row, mask=(k_row < k) & (rn < n), other=0.0)
        acc = tl.dot(a, b, acc, out_dtype=c_ptr.dtype.element_ty)
    tl.store(c_ptr + rm * n + rn, acc, mask=(rm < m) & (rn < n))


@triton.jit
def matmul_mx(a_ptr, sa_ptr, b_ptr, sb_ptr, c_ptr, n, k, BM: tl.constexpr, BN: tl.constexpr,
              BK: tl.constexpr):
    """examples/matmul_mx.rs `matmul_mx` on MXFP8 E4M3: C (f32, m x n) = A (m x k) @ B
    (k x n), both row-major, with E8M0 scales over blocks of 32 along k (A's m x k/32,
    B's k/32 x n, read transposed as tl.dot_scaled takes them); m, n, k multiples of
    the tiles, no masks (as ours)."""
    rm = (tl.program_id(0) * BM + tl.arange(0, BM))[:, None]  # BM x 1
    rn = tl.program_id(1) * BN + tl.arange(0, BN)  # BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, k, BK):
        kk = k0 + tl.arange(0, BK)
        ks = k0 // 32 + tl.arange(0, BK // 32)
        a = tl.load(a_ptr + rm * k + kk[None, :])
        b = tl.load(b_ptr + kk[:, None] * n + rn[None, :])
        sa = tl.load(sa_ptr + rm * (k // 32) + ks[None, :])
        sb = tl.load(sb_ptr + ks[None, :] * n + rn[:, None])  # BN x BK/32
        acc = tl.dot_scaled(a, sa, "e4m3", b, sb, "e4m3", acc)
    tl.store(c_ptr + rm * n + rn[None, :], acc)


@triton.jit
def matmul_desc(a_desc, b_desc, c_desc, k, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """examples/matmul_desc.rs `matmul_desc::<128,128,64>`: every operand a host
    tensor descriptor (TMA on sm_90a), f16 in, f32 out."""
    m0 = tl.program_id(0) * BM
    n0 = tl.program_id(1) * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, k, BK):
        acc = tl.dot(a_desc.load([m0, k0]), b_desc.load([k0, n0]), acc)
    c_desc.store([m0, n0], acc)


@triton.jit
def matmul_desc_ws(a_desc, b_desc, c_desc, k, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """`matmul_desc` with Triton's automatic warp specialization of the k-loop
    (`tl.range(..., warp_specialize=True)`: on sm_90a its Hopper pass splits a producer
    warp group issuing the TMA loads off the consumers), as examples/matmul_desc.rs's
    kernel is warp-specialized on sm_90a."""
    m0 = tl.program_id(0) * BM
    n0 = tl.program_id(1) * BN
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in tl.range(0, k, BK, warp_specialize=True):
        acc = tl.dot(a_desc.load([m0, k0]), b_desc.load([k0, n0]), acc)
    c_desc.store([m0, n0], acc)


@triton.jit
def matmul_desc_persistent(a_desc, b_desc, c_desc, m, n, k, NUM_SMS: tl.constexpr,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """examples/matmul_desc.rs `matmul_desc_persistent::<128,128,64>`: a persistent
    kernel walking the output tiles in grouped order (8 tile rows), its k-loop
    warp-specialized (Triton's persistent-matmul tutorial's form, with `flatten`)."""
    m_tiles = tl.cdiv(m, BM)
    n_tiles = tl.cdiv(n, BN)
    tiles = m_tiles * n_tiles
    for t in tl.range(tl.program_id(0), tiles, NUM_SMS, flatten=True, warp_specialize=True):
        per = 8 * n_tiles
        first_m = (t // per) * 8
        rows = min(m_tiles - first_m, 8)
        pm = first_m + (t % per) % rows
        pn = (t % per) // rows
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, k, BK):
            acc = tl.dot(a_desc.load([pm * BM, k0]), b_desc.load([k0, pn * BN]), acc)
        c_desc.store([pm * BM, pn * BN], acc)


@triton.jit
def layernorm(x_ptr, w_ptr, b_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps, BLOCK: tl.constexpr):
    """y = (x - mean) / sqrt(var + eps) * w + b per row (one row per program), walking
    the row BLOCK columns at a time in three passes; also writes mean and 1/std."""
    row = tl.program_id(0)
    base = row * n_cols
    cols = tl.arange(0, BLOCK)
    nf = n_cols.to(tl.float32)

    acc = tl.zeros((BLOCK, ), dtype=tl.float32)
    for off in range(0, n_cols, BLOCK):
        c = off + cols
        acc += tl.load(x_ptr + base + c, mask=c < n_cols, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / nf

    sq = tl.zeros((BLOCK, ), dtype=tl.float32)
    for off in range(0, n_cols, BLOCK):
        c = off + cols
        mask = c < n_cols
        d = tl.where(mask, tl.load(x_ptr + base + c, mask=mask, other=0.0).to(tl.float32) - mean, 0.0)
        sq += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / nf + eps)

    for off in range(0, n_cols, BLOCK):
        c = off + cols
        mask = c < n_cols
        xv = tl.load(x_ptr + base + c, mask=mask, other=0.0).to(tl.float32)
        wv = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
        bv = tl.load(b_ptr + c, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + c, ((xv - mean) * rstd * wv + bv).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


# name -> (kernel, signature, constexprs, num_warps, which Tessera kernel it matches)
# Pointers get tt.divisibility=16 (16-byte aligned), every i32 size too (multiple of 16),
# as Triton's launcher would specialize them for the benchmark shapes.
CASES = {
    "vector_add": (vector_add, {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                                "BLOCK": "constexpr"}, {"BLOCK": 1024}, 4, "vector_add::<1024>"),
    "softmax_f32": (softmax, {"x_ptr": "*fp32", "out_ptr": "*fp32", "n_rows": "i32", "n_cols": "i32",
                              "ROWS": "constexpr", "BLOCK": "constexpr"}, {"ROWS": 4, "BLOCK": 1024}, 4,
                    "softmax::<f32, 4, 1024>"),
    "matmul_f16_64x64x32": (matmul, {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "m": "i32",
                                     "n": "i32", "k": "i32", "BM": "constexpr", "BN": "constexpr",
                                     "BK": "constexpr"}, {"BM": 64, "BN": 64, "BK": 32}, 4,
                            "matmul::<f16, 64, 64, 32>"),
    "matmul_f16_128x128x32": (matmul, {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "m": "i32",
                                       "n": "i32", "k": "i32", "BM": "constexpr", "BN": "constexpr",
                                       "BK": "constexpr"}, {"BM": 128, "BN": 128, "BK": 32}, 4,
                              "matmul::<f16, 128, 128, 32>"),
    "layernorm_f32": (layernorm, {"x_ptr": "*fp32", "w_ptr": "*fp32", "b_ptr": "*fp32", "y_ptr": "*fp32",
                                  "mean_ptr": "*fp32", "rstd_ptr": "*fp32", "n_cols": "i32", "eps": "fp32",
                                  "BLOCK": "constexpr"}, {"BLOCK": 256}, 4, "layernorm::<f32, 256>"),
}


@triton.jit
def attention_fwd(q_ptr, k_ptr, v_ptr, o_ptr, seq_q, seq_k, scale_log2, causal,
                  BM: tl.constexpr, BN: tl.constexpr, HD: tl.constexpr):
    """FlashAttention-2 forward, the semantics of runtime/src/attention.rs
    (`tessera::attention::attention_fwd`): q, o are [heads][seq_q][HD], k, v
    [heads][seq_k][HD] row-major; program (i, h) takes BM query rows of head h and
    walks the keys BN at a time with an exp2 online softmax; `causal` (0 or 1, a
    runtime value) masks keys j > i and stops the loop at the diagonal."""
    pid = tl.program_id(0)
    head = tl.program_id(1)
    q_base = head * seq_q * HD
    kv_base = head * seq_k * HD
    rm = (pid * BM + tl.arange(0, BM))[:, None]
    dc = tl.arange(0, HD)[None, :]
    dr = tl.arange(0, HD)[:, None]
    q = tl.load(q_ptr + q_base + rm * HD + dc, mask=rm < seq_q, other=0.0)
    m_i = tl.full((BM, ), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BM, ), dtype=tl.float32)
    acc = tl.zeros((BM, HD), dtype=tl.float32)
    not_causal = 1 - causal
    hi = tl.minimum(seq_k, (pid + 1) * BM + not_causal * seq_k)
    last_key = rm + not_causal * seq_k
    for n0 in range(0, hi, BN):
        rn = n0 + tl.arange(0, BN)
        kc = rn[None, :]
        kr = rn[:, None]
        k = tl.load(k_ptr + kv_base + kc * HD + dr, mask=kc < seq_k, other=0.0)
        s = tl.dot(q, k) * scale_log2
        s = tl.where((last_key >= kc) & (kc < seq_k), s, -1.0e30)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + kv_base + kr * HD + dc, mask=kr < seq_k, other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + q_base + rm * HD + dc, out.to(o_ptr.dtype.element_ty), mask=rm < seq_q)
