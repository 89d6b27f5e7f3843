//! The matrix instructions as the hardware defines them, for the emulator.
//!
//! These layouts are written from the vendors' documents, independently of the ones
//! the lowering uses (`lower::arch`), on purpose: a lowering that puts a fragment
//! element in the wrong register computes a wrong product here, just as on a GPU.
//!
//! - NVIDIA `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32` (PTX ISA,
//!   "Matrix Fragments for mma.m16n8k16 with floating point type"), 32 lanes, with
//!   `group = lane / 4` and `t = lane % 4`:
//!   - A (16×16): four 32-bit registers, each two 16-bit elements (low half first):
//!     element `i` (0..8) is `A[group + 8 * ((i / 2) % 2)][2 * t + i % 2 + 8 * (i / 4)]`;
//!   - B (16×8): two registers: element `i` (0..4) is `B[2 * t + i % 2 + 8 * (i / 2)][group]`;
//!   - C and D (16×8): four f32: element `i` is `C[group + 8 * (i / 2)][2 * t + i % 2]`.
//! - AMD `v_mfma_f32_16x16x16{f16,bf16_1k}` (CDNA3 ISA, matrix instruction
//!   calculator), 64 lanes, item `i` in 0..4:
//!   - A (16×16): `A[lane % 16][4 * (lane / 16) + i]`;
//!   - B (16×16): `B[4 * (lane / 16) + i][lane % 16]`;
//!   - C and D (16×16): `C[4 * (lane / 16) + i][lane % 16]`.
//! - AMD `v_mfma_f32_32x32x8{f16,bf16_1k}` (same sources), 64 lanes, item `i` in 0..4
//!   of A and B, item `v` in 0..16 of C and D:
//!   - A (32×8): `A[lane % 32][4 * (lane / 32) + i]`;
//!   - B (8×32): `B[4 * (lane / 32) + i][lane % 32]`;
//!   - C and D (32×32): `C[v % 4 + 4 * (lane / 32) + 8 * (v / 4)][lane % 32]`.
//!
//! - NVIDIA `mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32` (PTX ISA, "Matrix
//!   Fragments for mma.m16n8k32"), `group = lane / 4`, `t = lane % 4`, byte `j` of a
//!   `.b32` register is element `4 * register + j`:
//!   - A (16×32): element `i` (0..16) is `A[group + 8 * ((i / 4) % 2)][4 * t + i % 4 + 16 * (i / 8)]`;
//!   - B (32×8): element `i` (0..8) is `B[4 * t + i % 4 + 16 * (i / 4)][group]`;
//!   - C and D (16×8): four s32, as the f32 ones of m16n8k16.
//! - AMD `v_mfma_i32_16x16x32_i8` and `v_mfma_i32_32x32x16_i8` (CDNA3 ISA, matrix
//!   instruction calculator): each lane holds 8 bytes of A and of B (two registers,
//!   byte `i` in 0..8), C and D as in the f16 instructions of the same M×N:
//!   - 16x16x32: `A[lane % 16][8 * (lane / 16) + i]`, `B[8 * (lane / 16) + i][lane % 16]`;
//!   - 32x32x16: `A[lane % 32][8 * (lane / 32) + i]`, `B[8 * (lane / 32) + i][lane % 32]`.
//!
//! - NVIDIA `mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32` (PTX ISA
//!   8.4, sm_89+): the fragments of the `.s8` form above, each byte an OCP 8-bit float
//!   (E4M3: bias 7, no infinities, NaN `S.1111.111`; E5M2: bias 15, IEEE-like), C and D
//!   four f32.
//! - AMD gfx950 (CDNA4 ISA, "Matrix Arithmetic Instructions"; the matrix instruction
//!   calculator) `v_mfma_f32_16x16x32_{f16,bf16}` and `v_mfma_f32_32x32x16_{f16,bf16}`:
//!   each lane holds 8 elements of A and of B (four registers, two 16-bit elements
//!   each, the first in the low half), C and D as in the gfx942 instructions of the
//!   same M×N:
//!   - 16x16x32: `A[lane % 16][8 * (lane / 16) + i]`, `B[8 * (lane / 16) + i][lane % 16]`;
//!   - 32x32x16: `A[lane % 32][8 * (lane / 32) + i]`, `B[8 * (lane / 32) + i][lane % 32]`.
//! - AMD RDNA3 (gfx11) `v_wmma_f32_16x16x16_{f16,bf16}` in wave32 (RDNA3 ISA, "Wave
//!   Matrix Multiply Accumulate"; GPUOpen, "How to accelerate AI applications on RDNA
//!   3 using WMMA"): each lane holds 16 elements of A and of B (eight registers), and
//!   the two halves of the wave hold the same ones (lanes `16..32` repeat lanes
//!   `0..16`; anything else is undefined, and reported here):
//!   - A: `A[lane % 16][i]`; B: `B[i][lane % 16]`;
//!   - C and D (eight f32 registers `v`): `C[2 * v + lane / 16][lane % 16]`.
//! - AMD RDNA4 (gfx12) `v_wmma_f32_16x16x16_{f16,bf16}` in wave32 (RDNA4 ISA, "Wave
//!   Matrix Multiply Accumulate"; AMD's matrix instruction calculator): each lane
//!   holds 8 elements of A and of B (four registers), `k` interleaved between the
//!   halves of the wave four at a time:
//!   - A: `A[lane % 16][8 * (i / 4) + 4 * (lane / 16) + i % 4]`; B: `B[same k][lane % 16]`;
//!   - C and D (eight f32 registers `v`): `C[v + 8 * (lane / 16)][lane % 16]`.
//! - The OCP 8-bit float forms of these on gfx950 (`v_mfma_f32_{16x16x32,32x32x16}_
//!   {fp8_fp8,bf8_bf8}`: gfx942's opcodes, which gfx950 reads as OCP E4M3/E5M2, not
//!   FNUZ; LLVM's AMDGPU notes, MLIR's `hasOcpFp8`) and RDNA4
//!   (`v_wmma_f32_16x16x16_{fp8_fp8,bf8_bf8}`): 8 bytes of A and of B per lane (two
//!   registers, byte `i` at bits `8 (i % 4)` of register `i / 4`) at the places of
//!   the 16-bit forms, but for RDNA4, whose 8-bit `k` are in order:
//!   `A[lane % 16][8 * (lane / 16) + i]`.
//! - AMD gfx950 `v_mfma_f32_{16x16x128,32x32x64}_f8f6f4` on E4M3/E5M2 (CDNA4 ISA; the
//!   unscaled form of `v_mfma_scale_*`, its formats chosen by `cbsz`/`blgp`): 32
//!   bytes of A and of B per lane (eight registers), in two runs of 16 `k`, C and D as
//!   in the 16x16 and 32x32 instructions above:
//!   - 16x16x128: `A[lane % 16][64 * (i / 16) + 16 * (lane / 16) + i % 16]`;
//!   - 32x32x64: `A[lane % 32][32 * (i / 16) + 16 * (lane / 32) + i % 16]`;
//!   - B: `B[same k][lane % 16 or 32]`. (A numbering of `k` that A and B share
//!     leaves the product the same; it matters to the scaled forms, whose scales
//!     cover blocks of 32 `k`, which Tessera does not use yet.)
//!
//! Integer products are exact; the sum and the addition of C wrap modulo 2^32 (the
//! instructions without `.satfinite`).
//!
//! Products of 16-bit inputs are exact in f32; the sum over k is accumulated in f32 in
//! increasing k, then added to C (the hardware's internal order is unspecified; tests
//! compare with a tolerance).

// Index loops mirror the ISA formulas (row/column from lane and item).
#![allow(clippy::needless_range_loop)]

use half::{bf16, f16};

/// 16-bit input element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
}

impl Half {
    fn to_f32(self, bits: u16) -> f32 {
        match self {
            Half::F16 => f16::from_bits(bits).to_f32(),
            Half::Bf16 => bf16::from_bits(bits).to_f32(),
        }
    }
}

fn product(a: &[f32], b: &[f32], c: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut d = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0f32;
            for p in 0..k {
                s += a[i * k + p] * b[p * n + j];
            }
            d[i * n + j] = s + c[i * n + j];
        }
    }
    d
}

/// An E8M0 scale (byte 0 of `w`): `2^(e - 127)`, NaN for 255.
fn e8m0(w: u32) -> f32 {
    match w as u8 {
        255 => f32::NAN,
        // 2^-127: f32's subnormal with only bit 22 set.
        0 => f32::from_bits(1 << 22),
        e => f32::from_bits((e as u32) << 23),
    }
}

/// [`amd_mma`]'s block-scaled product: `m x k` A, `k x n` B, C, and each lane's scale
/// words of A and B.
fn scaled_product(
    a: &[f32],
    b: &[f32],
    c: &[f32],
    (m, n, k): (usize, usize, usize),
    sa: &[u32],
    sb: &[u32],
) -> Vec<f32> {
    let mut d = c.to_vec();
    for i in 0..m {
        for j in 0..n {
            for blk in 0..k / 32 {
                let mut s = 0.0f32;
                for p in 32 * blk..32 * (blk + 1) {
                    s += a[i * k + p] * b[p * n + j];
                }
                let scale = e8m0(sa[i + m * blk]) * e8m0(sb[j + n * blk]);
                d[i * n + j] += s * scale;
            }
        }
    }
    d
}

/// NVIDIA m16n8k16: given every lane's fragments (`a[lane]` four registers of two
/// halves, `b[lane]` two registers, `c[lane]` four floats), the D fragments.
pub fn nv_m16n8k16(ty: Half, a: &[[u32; 4]], b: &[[u32; 2]], c: &[[f32; 4]]) -> Vec<[f32; 4]> {
    assert!(
        a.len() == 32 && b.len() == 32 && c.len() == 32,
        "one warp of 32 lanes"
    );
    let half = |regs: &[u32], i: usize| (regs[i / 2] >> (16 * (i % 2))) as u16;
    let (mut am, mut bm, mut cm) = (vec![0.0; 256], vec![0.0; 128], vec![0.0; 128]);
    for lane in 0..32 {
        let (g, t) = (lane / 4, lane % 4);
        for i in 0..8 {
            let (r, col) = (g + 8 * ((i / 2) % 2), 2 * t + i % 2 + 8 * (i / 4));
            am[r * 16 + col] = ty.to_f32(half(&a[lane], i));
        }
        for i in 0..4 {
            let r = 2 * t + i % 2 + 8 * (i / 2);
            bm[r * 8 + g] = ty.to_f32(half(&b[lane], i));
        }
        for i in 0..4 {
            cm[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = c[lane][i];
        }
    }
    let d = product(&am, &bm, &cm, 16, 8, 16);
    (0..32)
        .map(|lane| {
            let (g, t) = (lane / 4, lane % 4);
            std::array::from_fn(|i| d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2])
        })
        .collect()
}

/// AMD 16x16x16: given every lane's fragments (`a[lane]`, `b[lane]` four halves each,
/// `c[lane]` four floats), the D fragments.
pub fn amd_16x16x16(ty: Half, a: &[[u16; 4]], b: &[[u16; 4]], c: &[[f32; 4]]) -> Vec<[f32; 4]> {
    assert!(
        a.len() == 64 && b.len() == 64 && c.len() == 64,
        "one wave of 64 lanes"
    );
    let (mut am, mut bm, mut cm) = (vec![0.0; 256], vec![0.0; 256], vec![0.0; 256]);
    for lane in 0..64 {
        for i in 0..4 {
            let k = 4 * (lane / 16) + i;
            am[(lane % 16) * 16 + k] = ty.to_f32(a[lane][i]);
            bm[k * 16 + lane % 16] = ty.to_f32(b[lane][i]);
            cm[k * 16 + lane % 16] = c[lane][i];
        }
    }
    let d = product(&am, &bm, &cm, 16, 16, 16);
    (0..64)
        .map(|lane| std::array::from_fn(|i| d[(4 * (lane / 16) + i) * 16 + lane % 16]))
        .collect()
}

/// `v_mfma_f32_32x32x8{f16,bf16_1k}` for one wave: every lane's A and B elements
/// (16-bit bits) and C; returns every lane's D.
pub fn amd_32x32x8(ty: Half, a: &[[u16; 4]], b: &[[u16; 4]], c: &[[f32; 16]]) -> Vec<[f32; 16]> {
    assert!(
        a.len() == 64 && b.len() == 64 && c.len() == 64,
        "one wave of 64 lanes"
    );
    let (mut am, mut bm, mut cm) = (vec![0.0; 32 * 8], vec![0.0; 8 * 32], vec![0.0; 32 * 32]);
    let row = |lane: usize, v: usize| v % 4 + 4 * (lane / 32) + 8 * (v / 4);
    for lane in 0..64 {
        for i in 0..4 {
            let k = 4 * (lane / 32) + i;
            am[(lane % 32) * 8 + k] = ty.to_f32(a[lane][i]);
            bm[k * 32 + lane % 32] = ty.to_f32(b[lane][i]);
        }
        for v in 0..16 {
            cm[row(lane, v) * 32 + lane % 32] = c[lane][v];
        }
    }
    let d = product(&am, &bm, &cm, 32, 32, 8);
    (0..64)
        .map(|lane| std::array::from_fn(|v| d[row(lane, v) * 32 + lane % 32]))
        .collect()
}

/// `D = A B + C` on `i32`, wrapping, for row-major `m x k` A, `k x n` B, `m x n` C.
fn product_i32(a: &[i32], b: &[i32], c: &[i32], m: usize, n: usize, k: usize) -> Vec<i32> {
    let mut d = vec![0i32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = c[i * n + j];
            for p in 0..k {
                s = s.wrapping_add(a[i * k + p].wrapping_mul(b[p * n + j]));
            }
            d[i * n + j] = s;
        }
    }
    d
}

/// `D = A·B + C` of `m x k` by `k x n` row-major matrices ([`product`], [`product_i32`]).
type Product<T> = fn(&[T], &[T], &[T], usize, usize, usize) -> Vec<T>;

/// Signed byte `i` of the `.b32` registers `regs` (byte `j` of register `i / 4`).
fn s8(regs: &[u32], i: usize) -> i32 {
    (regs[i / 4] >> (8 * (i % 4))) as u8 as i8 as i32
}

/// NVIDIA m16n8k32 (the `.s8` and 8-bit float forms share their fragments): every
/// lane's fragments (`a[lane]` four registers of four bytes, `b[lane]` two, `c[lane]`
/// four accumulators) give the D fragments; byte `j` of register `i / 4` is element
/// `i`, read by `elem`, and `product` multiplies the matrices and adds C.
fn nv_m16n8k32<T: Copy + Default>(
    a: &[[u32; 4]],
    b: &[[u32; 2]],
    c: &[[T; 4]],
    elem: impl Fn(u8) -> T,
    product: Product<T>,
) -> Vec<[T; 4]> {
    assert!(
        a.len() == 32 && b.len() == 32 && c.len() == 32,
        "one warp of 32 lanes"
    );
    let byte = |regs: &[u32], i: usize| elem((regs[i / 4] >> (8 * (i % 4))) as u8);
    let z = T::default();
    let (mut am, mut bm, mut cm) = (vec![z; 16 * 32], vec![z; 32 * 8], vec![z; 16 * 8]);
    for lane in 0..32 {
        let (g, t) = (lane / 4, lane % 4);
        for i in 0..16 {
            let (r, col) = (g + 8 * ((i / 4) % 2), 4 * t + i % 4 + 16 * (i / 8));
            am[r * 32 + col] = byte(&a[lane], i);
        }
        for i in 0..8 {
            bm[(4 * t + i % 4 + 16 * (i / 4)) * 8 + g] = byte(&b[lane], i);
        }
        for i in 0..4 {
            cm[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = c[lane][i];
        }
    }
    let d = product(&am, &bm, &cm, 16, 8, 32);
    (0..32)
        .map(|lane| {
            let (g, t) = (lane / 4, lane % 4);
            std::array::from_fn(|i| d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2])
        })
        .collect()
}

/// NVIDIA m16n8k32 `.s8`: every lane's fragments (`a[lane]` four registers of four
/// bytes, `b[lane]` two, `c[lane]` four s32) give the D fragments.
pub fn nv_m16n8k32_s8(a: &[[u32; 4]], b: &[[u32; 2]], c: &[[i32; 4]]) -> Vec<[i32; 4]> {
    nv_m16n8k32(a, b, c, |x| x as i8 as i32, product_i32)
}

/// An OCP 8-bit float format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8 {
    /// E4M3 (`f8e4m3`).
    E4M3,
    /// E5M2 (`f8e5m2`).
    E5M2,
}

impl Fp8 {
    fn to_f32(self, bits: u8) -> f32 {
        match self {
            Fp8::E4M3 => tessera_ir::fp8::F8E4M3::from_bits(bits).to_f32(),
            Fp8::E5M2 => tessera_ir::fp8::F8E5M2::from_bits(bits).to_f32(),
        }
    }
}

/// NVIDIA m16n8k32 on 8-bit floats: the `.s8` fragments ([`nv_m16n8k32_s8`]) with
/// each byte decoded as `fmt`, f32 C and D. Products of two 8-bit floats are exact in
/// f32; the sum is taken in increasing k, then C added.
pub fn nv_m16n8k32_f8(fmt: Fp8, a: &[[u32; 4]], b: &[[u32; 2]], c: &[[f32; 4]]) -> Vec<[f32; 4]> {
    nv_m16n8k32(a, b, c, |x| fmt.to_f32(x), product)
}

/// AMD `v_mfma_i32_{16x16x32,32x32x16}_i8` for one wave (`mn` 16 or 32, `R` = 4 or
/// 16 accumulators): every lane's A and B (two registers of four bytes each) and C
/// give every lane's D.
pub fn amd_i8<const R: usize>(
    mn: usize,
    a: &[[u32; 2]],
    b: &[[u32; 2]],
    c: &[[i32; R]],
) -> Vec<[i32; R]> {
    assert!(
        a.len() == 64 && b.len() == 64 && c.len() == 64,
        "one wave of 64 lanes"
    );
    assert!(
        (mn, R) == (16, 4) || (mn, R) == (32, 16),
        "16x16x32 or 32x32x16"
    );
    let k = 512 / mn;
    let (mut am, mut bm, mut cm) = (vec![0; mn * k], vec![0; k * mn], vec![0; mn * mn]);
    // C/D row of item `v` (16x16: `4 * (lane / 16) + v`; 32x32: `v % 4 + 4 * (lane / 32)
    // + 8 * (v / 4)`).
    let row = |lane: usize, v: usize| {
        if mn == 16 {
            4 * (lane / 16) + v
        } else {
            v % 4 + 4 * (lane / 32) + 8 * (v / 4)
        }
    };
    for lane in 0..64 {
        for i in 0..8 {
            let kk = 8 * (lane / mn) + i;
            am[(lane % mn) * k + kk] = s8(&a[lane], i);
            bm[kk * mn + lane % mn] = s8(&b[lane], i);
        }
        for v in 0..R {
            cm[row(lane, v) * mn + lane % mn] = c[lane][v];
        }
    }
    let d = product_i32(&am, &bm, &cm, mn, mn, k);
    (0..64)
        .map(|lane| std::array::from_fn(|v| d[row(lane, v) * mn + lane % mn]))
        .collect()
}

/// The element types of the AMD matrix instructions after gfx942's ([`AmdMma`]): the
/// 16-bit floats, and the OCP 8-bit floats gfx950 and RDNA4 take (gfx942's own
/// 8-bit instructions read the FNUZ encodings; gfx950 and gfx12 read OCP's E4M3 and
/// E5M2 with the same opcodes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmdElem {
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// OCP E4M3 (`fp8`).
    E4M3,
    /// OCP E5M2 (`bf8`).
    E5M2,
}

impl AmdElem {
    /// Every type, in the order of their kinds ([`AmdMma::kind`]).
    pub const ALL: [AmdElem; 4] = [AmdElem::F16, AmdElem::Bf16, AmdElem::E4M3, AmdElem::E5M2];

    /// Bits of one element.
    pub fn bits(self) -> usize {
        match self {
            AmdElem::F16 | AmdElem::Bf16 => 16,
            AmdElem::E4M3 | AmdElem::E5M2 => 8,
        }
    }

    fn to_f32(self, bits: u32) -> f32 {
        match self {
            AmdElem::F16 => Half::F16.to_f32(bits as u16),
            AmdElem::Bf16 => Half::Bf16.to_f32(bits as u16),
            AmdElem::E4M3 => Fp8::E4M3.to_f32(bits as u8),
            AmdElem::E5M2 => Fp8::E5M2.to_f32(bits as u8),
        }
    }
}

/// The AMD matrix instructions after gfx942's (gfx950's MFMA, RDNA's WMMA), one wave
/// each, on the [`AmdElem`] types they take; layouts in the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmdMma {
    /// gfx950 `v_mfma_f32_16x16x32_{f16,bf16,fp8_fp8,bf8_bf8}` (wave 64).
    Mfma16x16x32,
    /// gfx950 `v_mfma_f32_32x32x16_{f16,bf16,fp8_fp8,bf8_bf8}` (wave 64).
    Mfma32x32x16,
    /// RDNA3 `v_wmma_f32_16x16x16_{f16,bf16}` (wave 32).
    Wmma11,
    /// RDNA4 `v_wmma_f32_16x16x16_{f16,bf16,fp8_fp8,bf8_bf8}` (wave 32).
    Wmma12,
    /// gfx950 `v_mfma_f32_16x16x128_f8f6f4` on E4M3 or E5M2 (wave 64).
    Mfma16x16x128,
    /// gfx950 `v_mfma_f32_32x32x64_f8f6f4` on E4M3 or E5M2 (wave 64).
    Mfma32x32x64,
    /// gfx950 `v_mfma_scale_f32_16x16x128_f8f6f4` on E4M3 or E5M2, E8M0 scales over
    /// blocks of 32 `k` (wave 64).
    ScaledMfma16x16x128,
    /// gfx950 `v_mfma_scale_f32_32x32x64_f8f6f4` on E4M3 or E5M2, E8M0 scales over
    /// blocks of 32 `k` (wave 64).
    ScaledMfma32x32x64,
}

impl AmdMma {
    /// Every instruction, in the order of their kinds ([`AmdMma::kind`]).
    pub const ALL: [AmdMma; 8] = [
        AmdMma::Mfma16x16x32,
        AmdMma::Mfma32x32x16,
        AmdMma::Wmma11,
        AmdMma::Wmma12,
        AmdMma::Mfma16x16x128,
        AmdMma::Mfma32x32x64,
        AmdMma::ScaledMfma16x16x128,
        AmdMma::ScaledMfma32x32x64,
    ];

    /// Whether the instruction takes a scale of A and of B in each lane (one `.b32`
    /// register each after B's, the E8M0 scale in byte 0).
    pub fn scaled(self) -> bool {
        matches!(
            self,
            AmdMma::ScaledMfma16x16x128 | AmdMma::ScaledMfma32x32x64
        )
    }

    /// Lanes of the wave that executes it.
    pub fn lanes(self) -> usize {
        match self {
            AmdMma::Wmma11 | AmdMma::Wmma12 => 32,
            _ => 64,
        }
    }

    /// `(m, n, k)`.
    pub fn shape(self) -> (usize, usize, usize) {
        match self {
            AmdMma::Mfma16x16x32 => (16, 16, 32),
            AmdMma::Mfma32x32x16 => (32, 32, 16),
            AmdMma::Wmma11 | AmdMma::Wmma12 => (16, 16, 16),
            AmdMma::Mfma16x16x128 | AmdMma::ScaledMfma16x16x128 => (16, 16, 128),
            AmdMma::Mfma32x32x64 | AmdMma::ScaledMfma32x32x64 => (32, 32, 64),
        }
    }

    /// Elements of A (and of B) per lane.
    pub fn per_lane(self) -> usize {
        match self {
            AmdMma::Wmma11 => 16,
            AmdMma::Mfma16x16x128
            | AmdMma::Mfma32x32x64
            | AmdMma::ScaledMfma16x16x128
            | AmdMma::ScaledMfma32x32x64 => 32,
            _ => 8,
        }
    }

    /// `.b32` registers of A (and of B) per lane on `e`.
    pub fn words(self, e: AmdElem) -> usize {
        self.per_lane() * e.bits() / 32
    }

    /// f32 registers of C (and D) per lane.
    pub fn c_regs(self) -> usize {
        let (m, n, _) = self.shape();
        m * n / self.lanes()
    }

    /// Whether the instruction exists on `e` (RDNA3 has no 8-bit float WMMA; the
    /// `f8f6f4` ones take 8-bit floats only here).
    pub fn takes(self, e: AmdElem) -> bool {
        match self {
            AmdMma::Wmma11 => e.bits() == 16,
            AmdMma::Mfma16x16x128
            | AmdMma::Mfma32x32x64
            | AmdMma::ScaledMfma16x16x128
            | AmdMma::ScaledMfma32x32x64 => e.bits() == 8,
            _ => true,
        }
    }

    /// The number the emulator's ABI gives the instruction on `e` (after the ones of
    /// `tessera_emu_mma_words` 0 to 4).
    pub fn kind(self, e: AmdElem) -> i32 {
        let i = AmdMma::ALL.iter().position(|&x| x == self).unwrap_or(0) as i32;
        let j = AmdElem::ALL.iter().position(|&x| x == e).unwrap_or(0) as i32;
        5 + 4 * i + j
    }

    /// The instruction and type of [`AmdMma::kind`] `k`.
    pub fn from_kind(k: i32) -> Option<(AmdMma, AmdElem)> {
        let i = usize::try_from(k.checked_sub(5)?).ok()?;
        let ins = *AmdMma::ALL.get(i / 4)?;
        let e = AmdElem::ALL[i % 4];
        ins.takes(e).then_some((ins, e))
    }

    /// `(row, k)` of A's element `i` in `lane` (and `(k, column)` of B's) on `e`.
    fn a_at(self, e: AmdElem, lane: usize, i: usize) -> (usize, usize) {
        match self {
            AmdMma::Mfma16x16x32 => (lane % 16, 8 * (lane / 16) + i),
            AmdMma::Mfma32x32x16 => (lane % 32, 8 * (lane / 32) + i),
            AmdMma::Wmma11 => (lane % 16, i),
            // RDNA4 interleaves the half-waves' `k` four at a time for 16-bit
            // elements; 8-bit ones are in order.
            AmdMma::Wmma12 if e.bits() == 16 => (lane % 16, 8 * (i / 4) + 4 * (lane / 16) + i % 4),
            AmdMma::Wmma12 => (lane % 16, 8 * (lane / 16) + i),
            // 32 bytes a lane, two runs of 16 `k`: the lane group's own 16 in each
            // half of the `k` range.
            AmdMma::Mfma16x16x128 | AmdMma::ScaledMfma16x16x128 => {
                (lane % 16, 64 * (i / 16) + 16 * (lane / 16) + i % 16)
            }
            AmdMma::Mfma32x32x64 | AmdMma::ScaledMfma32x32x64 => {
                (lane % 32, 32 * (i / 16) + 16 * (lane / 32) + i % 16)
            }
        }
    }

    /// `(row, column)` of C's register `v` in `lane`.
    fn c_at(self, lane: usize, v: usize) -> (usize, usize) {
        match self {
            AmdMma::Mfma16x16x32 | AmdMma::Mfma16x16x128 | AmdMma::ScaledMfma16x16x128 => {
                (4 * (lane / 16) + v, lane % 16)
            }
            AmdMma::Mfma32x32x16 | AmdMma::Mfma32x32x64 | AmdMma::ScaledMfma32x32x64 => {
                (v % 4 + 4 * (lane / 32) + 8 * (v / 4), lane % 32)
            }
            AmdMma::Wmma11 => (2 * v + lane / 16, lane % 16),
            AmdMma::Wmma12 => (v + 8 * (lane / 16), lane % 16),
        }
    }
}

/// One [`AmdMma`] instruction on `e` for one wave: every lane's A and B (its `.b32`
/// registers, elements packed from the low bits up) and C give every lane's D. An
/// element two lanes hold (RDNA3's repeated halves) must be the same in both; a lane
/// with the wrong number of registers, or lanes that disagree, are an error.
/// Products of these types are exact in f32; the sum is taken in increasing `k`,
/// then C added.
///
/// A block-scaled instruction ([`AmdMma::scaled`]) takes every lane's scale of A and
/// of B (`scales`, byte 0 an E8M0 exponent: `2^(e - 127)`, 255 NaN). CDNA4's
/// (AMD's "Matrix Core Programming on CDNA3 and CDNA4", its figures 8 and 9): the
/// scales are `m x k / 32` for A and `k / 32 x n` for B, lane `l` holding A's of row
/// `l % m`, block `l / m` (and B's of column `l % n`, the same block); each
/// block's dot product is multiplied by its two scales "after the normal dot
/// product and prior to accumulation": `D = C + Σ_j sa sb Σ_{k in j} A B`, each
/// block's sum in increasing `k`, the blocks in increasing `j`, in f32.
pub fn amd_mma(
    ins: AmdMma,
    e: AmdElem,
    a: &[Vec<u32>],
    b: &[Vec<u32>],
    c: &[Vec<f32>],
    scales: Option<(&[u32], &[u32])>,
) -> Result<Vec<Vec<f32>>, String> {
    let (m, n, k) = ins.shape();
    let (lanes, per, regs) = (ins.lanes(), ins.per_lane(), ins.c_regs());
    let words = ins.words(e);
    if !ins.takes(e) {
        return Err(format!("{ins:?} has no {e:?} form"));
    }
    if a.len() != lanes || b.len() != lanes || c.len() != lanes {
        return Err(format!(
            "{ins:?}: operands of {} lanes, not {lanes}",
            a.len()
        ));
    }
    if let Some(l) =
        (0..lanes).find(|&l| a[l].len() != words || b[l].len() != words || c[l].len() != regs)
    {
        return Err(format!(
            "{ins:?}: lane {l} has {} A, {} B and {} C registers, not {words}, {words} and {regs}",
            a[l].len(),
            b[l].len(),
            c[l].len()
        ));
    }
    let bits = e.bits();
    let per_word = 32 / bits;
    let mask = (1u32 << bits) - 1;
    let elem = |w: &[u32], i: usize| (w[i / per_word] >> (bits * (i % per_word))) & mask;
    // A[row][k] and B[k][col] (B's element `i` of `lane` is where A's would be, with
    // the row read as B's column).
    let mut am: Vec<Option<u32>> = vec![None; m * k];
    let mut bm: Vec<Option<u32>> = vec![None; k * n];
    for lane in 0..lanes {
        for i in 0..per {
            let (r, kk) = ins.a_at(e, lane, i);
            for (name, slot, v) in [
                ("A", &mut am[r * k + kk], elem(&a[lane], i)),
                ("B", &mut bm[kk * n + r], elem(&b[lane], i)),
            ] {
                match *slot {
                    Some(old) if old != v => {
                        return Err(format!(
                            "{ins:?}: lanes disagree on {name}'s element ({r}, {kk}) \
                             (0x{old:x} and lane {lane}'s 0x{v:x}): the lanes that \
                             hold the same element must hold the same value"
                        ));
                    }
                    _ => *slot = Some(v),
                }
            }
        }
    }
    let to_f32 = |x: Option<u32>| e.to_f32(x.unwrap_or(0));
    let af: Vec<f32> = am.into_iter().map(to_f32).collect();
    let bf: Vec<f32> = bm.into_iter().map(to_f32).collect();
    let mut cm = vec![0.0f32; m * n];
    for (lane, cl) in c.iter().enumerate() {
        for (v, x) in cl.iter().enumerate() {
            let (r, col) = ins.c_at(lane, v);
            cm[r * n + col] = *x;
        }
    }
    let d = match (ins.scaled(), scales) {
        (false, None) => product(&af, &bf, &cm, m, n, k),
        (true, Some((sa, sb))) if sa.len() == lanes && sb.len() == lanes => {
            scaled_product(&af, &bf, &cm, (m, n, k), sa, sb)
        }
        _ => {
            return Err(format!(
                "{ins:?}: scales given to an instruction that takes none, or not one a lane"
            ));
        }
    };
    Ok((0..lanes)
        .map(|lane| {
            (0..regs)
                .map(|v| {
                    let (r, col) = ins.c_at(lane, v);
                    d[r * n + col]
                })
                .collect()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val(i: usize, j: usize, s: usize) -> f32 {
        // Small integers and halves: exact in f16 and bf16, exact products.
        (((i * 7 + j * 3 + s) % 11) as f32 - 5.0) * 0.5
    }

    #[test]
    fn nv_fragments_compute_the_matrix_product() {
        for ty in [Half::F16, Half::Bf16] {
            let bits = |x: f32| match ty {
                Half::F16 => f16::from_f32(x).to_bits(),
                Half::Bf16 => bf16::from_f32(x).to_bits(),
            } as u32;
            // Scatter A, B, C by the PTX layout, multiply, gather D.
            let mut a = vec![[0u32; 4]; 32];
            let mut b = vec![[0u32; 2]; 32];
            let mut c = vec![[0f32; 4]; 32];
            for lane in 0..32 {
                let (g, t) = (lane / 4, lane % 4);
                for i in 0..8 {
                    let (r, col) = (g + 8 * ((i / 2) % 2), 2 * t + i % 2 + 8 * (i / 4));
                    a[lane][i / 2] |= bits(val(r, col, 1)) << (16 * (i % 2));
                }
                for i in 0..4 {
                    let r = 2 * t + i % 2 + 8 * (i / 2);
                    b[lane][i / 2] |= bits(val(r, g, 2)) << (16 * (i % 2));
                }
                for i in 0..4 {
                    c[lane][i] = val(g + 8 * (i / 2), 2 * t + i % 2, 3);
                }
            }
            let d = nv_m16n8k16(ty, &a, &b, &c);
            for lane in 0..32 {
                let (g, t) = (lane / 4, lane % 4);
                for i in 0..4 {
                    let (r, col) = (g + 8 * (i / 2), 2 * t + i % 2);
                    let want: f32 = (0..16).map(|p| val(r, p, 1) * val(p, col, 2)).sum::<f32>()
                        + val(r, col, 3);
                    assert_eq!(d[lane][i], want, "{ty:?} lane {lane} item {i}");
                }
            }
        }
    }

    #[test]
    fn amd_fragments_compute_the_matrix_product() {
        let bits = |x: f32| f16::from_f32(x).to_bits();
        let mut a = vec![[0u16; 4]; 64];
        let mut b = vec![[0u16; 4]; 64];
        let mut c = vec![[0f32; 4]; 64];
        for lane in 0..64 {
            for i in 0..4 {
                let k = 4 * (lane / 16) + i;
                a[lane][i] = bits(val(lane % 16, k, 1));
                b[lane][i] = bits(val(k, lane % 16, 2));
                c[lane][i] = val(k, lane % 16, 3);
            }
        }
        let d = amd_16x16x16(Half::F16, &a, &b, &c);
        for lane in 0..64 {
            for i in 0..4 {
                let (r, col) = (4 * (lane / 16) + i, lane % 16);
                let want: f32 =
                    (0..16).map(|p| val(r, p, 1) * val(p, col, 2)).sum::<f32>() + val(r, col, 3);
                assert_eq!(d[lane][i], want, "lane {lane} item {i}");
            }
        }
    }

    /// A signed byte of a fixed pattern covering -128..=127.
    fn byte(i: usize, j: usize, s: usize) -> i32 {
        ((i * 37 + j * 11 + s * 101) % 256) as i32 - 128
    }

    /// Packs bytes into `.b32` registers, byte `i` at bits `8 * (i % 4)`.
    fn pack<const N: usize>(bytes: impl Fn(usize) -> i32) -> [u32; N] {
        std::array::from_fn(|r| {
            (0..4).fold(0u32, |w, j| {
                w | ((bytes(4 * r + j) as u8 as u32) << (8 * j))
            })
        })
    }

    #[test]
    fn nv_s8_fragments_compute_the_matrix_product() {
        let mut a = vec![[0u32; 4]; 32];
        let mut b = vec![[0u32; 2]; 32];
        let mut c = vec![[0i32; 4]; 32];
        for lane in 0..32 {
            let (g, t) = (lane / 4, lane % 4);
            a[lane] = pack(|i| byte(g + 8 * ((i / 4) % 2), 4 * t + i % 4 + 16 * (i / 8), 1));
            b[lane] = pack(|i| byte(4 * t + i % 4 + 16 * (i / 4), g, 2));
            for i in 0..4 {
                c[lane][i] = byte(g + 8 * (i / 2), 2 * t + i % 2, 3) * 1000;
            }
        }
        let d = nv_m16n8k32_s8(&a, &b, &c);
        for lane in 0..32 {
            let (g, t) = (lane / 4, lane % 4);
            for i in 0..4 {
                let (r, col) = (g + 8 * (i / 2), 2 * t + i % 2);
                let want: i32 = (0..32)
                    .map(|p| byte(r, p, 1) * byte(p, col, 2))
                    .sum::<i32>()
                    + byte(r, col, 3) * 1000;
                assert_eq!(d[lane][i], want, "lane {lane} item {i}");
            }
        }
    }

    /// The fp8 form reads the `.s8` fragments' bytes as 8-bit floats: every
    /// encoding but NaNs and infinities (a pattern over the byte values), against the
    /// product of the decoded matrices in f64 (the f32 sum within its rounding).
    #[test]
    fn nv_f8_fragments_compute_the_matrix_product() {
        for fmt in [Fp8::E4M3, Fp8::E5M2] {
            let code = |i: usize, j: usize, s: usize| {
                let b = byte(i, j, s) as u8;
                // Finite values only: E4M3's NaN is S.1111.111, E5M2's top exponent.
                match fmt {
                    Fp8::E4M3 if b & 0x7f == 0x7f => b & 0xf0,
                    Fp8::E5M2 if b & 0x7c == 0x7c => b & 0x83,
                    _ => b,
                }
            };
            let v = |i: usize, j: usize, s: usize| fmt.to_f32(code(i, j, s)) as f64;
            let mut a = vec![[0u32; 4]; 32];
            let mut b = vec![[0u32; 2]; 32];
            let mut c = vec![[0f32; 4]; 32];
            for lane in 0..32 {
                let (g, t) = (lane / 4, lane % 4);
                a[lane] =
                    pack(|i| code(g + 8 * ((i / 4) % 2), 4 * t + i % 4 + 16 * (i / 8), 1) as i32);
                b[lane] = pack(|i| code(4 * t + i % 4 + 16 * (i / 4), g, 2) as i32);
                for i in 0..4 {
                    c[lane][i] = byte(g + 8 * (i / 2), 2 * t + i % 2, 3) as f32;
                }
            }
            let d = nv_m16n8k32_f8(fmt, &a, &b, &c);
            for lane in 0..32 {
                let (g, t) = (lane / 4, lane % 4);
                for i in 0..4 {
                    let (r, col) = (g + 8 * (i / 2), 2 * t + i % 2);
                    let want: f64 = (0..32).map(|p| v(r, p, 1) * v(p, col, 2)).sum::<f64>()
                        + byte(r, col, 3) as f64;
                    // f32 sums: within 32 roundings of the terms' magnitude.
                    let mag: f64 = (0..32).map(|p| (v(r, p, 1) * v(p, col, 2)).abs()).sum();
                    let got = d[lane][i] as f64;
                    assert!(
                        (got - want).abs() <= 32.0 * f64::from(f32::EPSILON) * (mag + 1.0),
                        "{fmt:?} lane {lane} item {i}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn amd_i8_fragments_compute_the_matrix_product() {
        fn check<const R: usize>(mn: usize, row: impl Fn(usize, usize) -> usize) {
            let k = 512 / mn;
            let mut a = vec![[0u32; 2]; 64];
            let mut b = vec![[0u32; 2]; 64];
            let mut c = vec![[0i32; R]; 64];
            for lane in 0..64 {
                a[lane] = pack(|i| byte(lane % mn, 8 * (lane / mn) + i, 1));
                b[lane] = pack(|i| byte(8 * (lane / mn) + i, lane % mn, 2));
                for v in 0..R {
                    c[lane][v] = byte(row(lane, v), lane % mn, 3) * 1000;
                }
            }
            let d = amd_i8(mn, &a, &b, &c);
            for lane in 0..64 {
                for v in 0..R {
                    let (r, col) = (row(lane, v), lane % mn);
                    let want: i32 = (0..k).map(|p| byte(r, p, 1) * byte(p, col, 2)).sum::<i32>()
                        + byte(r, col, 3) * 1000;
                    assert_eq!(d[lane][v], want, "{mn}: lane {lane} item {v}");
                }
            }
        }
        check::<4>(16, |lane, v| 4 * (lane / 16) + v);
        check::<16>(32, |lane, v| v % 4 + 4 * (lane / 32) + 8 * (v / 4));
    }

    #[test]
    fn a_swapped_fragment_gives_a_wrong_product() {
        // The point of an independent layout: moving one A element elsewhere changes D.
        let one = f16::from_f32(1.0).to_bits() as u32;
        let mut a = vec![[0u32; 4]; 32];
        let b = vec![[one | (one << 16); 2]; 32];
        let c = vec![[0f32; 4]; 32];
        a[0][0] = one; // A[0][0] = 1
        let d = nv_m16n8k16(Half::F16, &a, &b, &c);
        assert_eq!(d[0][0], 1.0); // D[0][0] = sum_k A[0][k] * 1
        let mut a2 = vec![[0u32; 4]; 32];
        a2[0][1] = one; // element a2: A[8][0] instead
        let d2 = nv_m16n8k16(Half::F16, &a2, &b, &c);
        assert_eq!(d2[0][0], 0.0);
        assert_eq!(d2[0][2], 1.0);
    }

    #[test]
    fn amd_32x32x8_fragments_compute_the_matrix_product() {
        let ty = Half::F16;
        let bits = |x: f32| f16::from_f32(x).to_bits();
        let (mut a, mut b) = (vec![[0u16; 4]; 64], vec![[0u16; 4]; 64]);
        let mut c = vec![[0f32; 16]; 64];
        for lane in 0..64 {
            for i in 0..4 {
                let k = 4 * (lane / 32) + i;
                a[lane][i] = bits(val(lane % 32, k, 1));
                b[lane][i] = bits(val(k, lane % 32, 2));
            }
            for v in 0..16 {
                c[lane][v] = val(v % 4 + 4 * (lane / 32) + 8 * (v / 4), lane % 32, 3);
            }
        }
        let d = amd_32x32x8(ty, &a, &b, &c);
        for lane in 0..64 {
            for v in 0..16 {
                let (r, col) = (v % 4 + 4 * (lane / 32) + 8 * (v / 4), lane % 32);
                let want: f32 =
                    (0..8).map(|k| val(r, k, 1) * val(k, col, 2)).sum::<f32>() + val(r, col, 3);
                assert_eq!(d[lane][v], want, "lane {lane} item {v}");
            }
        }
    }
    /// The bits of `x` (small integers and halves, exact in every type) as `e`.
    fn amd_bits(e: AmdElem, x: f32) -> u32 {
        match e {
            AmdElem::F16 => f16::from_f32(x).to_bits() as u32,
            AmdElem::Bf16 => bf16::from_f32(x).to_bits() as u32,
            AmdElem::E4M3 => tessera_ir::fp8::F8E4M3::from_f32(x).to_bits() as u32,
            AmdElem::E5M2 => tessera_ir::fp8::F8E5M2::from_f32(x).to_bits() as u32,
        }
    }

    /// Scatters A, B and C of the `(m, n, k)` product by the layouts written out in
    /// the module docs (not [`AmdMma`]'s own maps), runs the instruction, and checks
    /// every lane's D.
    fn check_amd(
        ins: AmdMma,
        e: AmdElem,
        a_at: impl Fn(usize, usize) -> (usize, usize),
        c_at: impl Fn(usize, usize) -> (usize, usize),
    ) {
        let (m, n, k) = ins.shape();
        let (lanes, per, regs) = (ins.lanes(), ins.per_lane(), ins.c_regs());
        assert_eq!(regs * lanes, m * n);
        let bits = e.bits();
        let words = per * bits / 32;
        let mut a = vec![vec![0u32; words]; lanes];
        let mut b = vec![vec![0u32; words]; lanes];
        let mut c = vec![vec![0f32; regs]; lanes];
        let per_word = 32 / bits;
        for lane in 0..lanes {
            for i in 0..per {
                let (r, kk) = a_at(lane, i);
                let sh = bits * (i % per_word);
                a[lane][i / per_word] |= amd_bits(e, val(r, kk, 1)) << sh;
                b[lane][i / per_word] |= amd_bits(e, val(kk, r, 2)) << sh;
            }
            for v in 0..regs {
                let (r, col) = c_at(lane, v);
                c[lane][v] = val(r, col, 3);
            }
        }
        let d = amd_mma(ins, e, &a, &b, &c, None).expect("the instruction");
        for lane in 0..lanes {
            for v in 0..regs {
                let (r, col) = c_at(lane, v);
                let want: f32 =
                    (0..k).map(|p| val(r, p, 1) * val(p, col, 2)).sum::<f32>() + val(r, col, 3);
                assert_eq!(d[lane][v], want, "{ins:?} {e:?} lane {lane} item {v}");
            }
        }
        // Moving A's first element to the next place changes D.
        let mut a2 = a.clone();
        a2[0][0] = a[0][0].rotate_left(bits as u32);
        let same = amd_mma(ins, e, &a2, &b, &c, None).map(|d2| d2 == d);
        assert_ne!(
            same,
            Ok(true),
            "{ins:?} {e:?}: a moved A element left D unchanged"
        );
    }

    #[test]
    fn gfx950_and_rdna_fragments_compute_the_matrix_product() {
        for e in AmdElem::ALL {
            check_amd(
                AmdMma::Mfma16x16x32,
                e,
                |l, i| (l % 16, 8 * (l / 16) + i),
                |l, v| (4 * (l / 16) + v, l % 16),
            );
            check_amd(
                AmdMma::Mfma32x32x16,
                e,
                |l, i| (l % 32, 8 * (l / 32) + i),
                |l, v| (v % 4 + 4 * (l / 32) + 8 * (v / 4), l % 32),
            );
            let gfx12_k = |l: usize, i: usize| {
                if e.bits() == 16 {
                    8 * (i / 4) + 4 * (l / 16) + i % 4
                } else {
                    8 * (l / 16) + i
                }
            };
            check_amd(
                AmdMma::Wmma12,
                e,
                |l, i| (l % 16, gfx12_k(l, i)),
                |l, v| (v + 8 * (l / 16), l % 16),
            );
        }
        for e in [AmdElem::E4M3, AmdElem::E5M2] {
            check_amd(
                AmdMma::Mfma16x16x128,
                e,
                |l, i| (l % 16, 64 * (i / 16) + 16 * (l / 16) + i % 16),
                |l, v| (4 * (l / 16) + v, l % 16),
            );
            check_amd(
                AmdMma::Mfma32x32x64,
                e,
                |l, i| (l % 32, 32 * (i / 16) + 16 * (l / 32) + i % 16),
                |l, v| (v % 4 + 4 * (l / 32) + 8 * (v / 4), l % 32),
            );
        }
        for e in [AmdElem::F16, AmdElem::Bf16] {
            check_amd(
                AmdMma::Wmma11,
                e,
                |l, i| (l % 16, i),
                |l, v| (2 * v + l / 16, l % 16),
            );
        }
        for ins in AmdMma::ALL {
            for e in AmdElem::ALL {
                let back = AmdMma::from_kind(ins.kind(e));
                assert_eq!(back, ins.takes(e).then_some((ins, e)));
            }
        }
        assert_eq!(AmdMma::from_kind(4), None);
        assert_eq!(AmdMma::from_kind(29), None);
    }

    /// The block-scaled gfx950 instructions, scattered by the layouts of the module
    /// docs: every lane's D against `C + Σ_k A sa B sb` (exact data: the order of the
    /// sums does not matter), and a scale moved to the next lane changes D.
    #[test]
    fn gfx950_scaled_mfma_applies_each_block_s_scales() {
        for (ins, e) in [
            (AmdMma::ScaledMfma16x16x128, AmdElem::E4M3),
            (AmdMma::ScaledMfma32x32x64, AmdElem::E5M2),
        ] {
            let (m, n, k) = ins.shape();
            let (lanes, regs) = (ins.lanes(), ins.c_regs());
            let a_at = |l: usize, i: usize| {
                if m == 16 {
                    (l % 16, 64 * (i / 16) + 16 * (l / 16) + i % 16)
                } else {
                    (l % 32, 32 * (i / 16) + 16 * (l / 32) + i % 16)
                }
            };
            let c_at = |l: usize, v: usize| {
                if m == 16 {
                    (4 * (l / 16) + v, l % 16)
                } else {
                    (v % 4 + 4 * (l / 32) + 8 * (v / 4), l % 32)
                }
            };
            // Exponents -3..=3 around 127, different for every row (column) and block.
            let sa_exp = |r: usize, blk: usize| 124 + ((r * 3 + blk * 5) % 7) as u32;
            let sb_exp = |col: usize, blk: usize| 124 + ((col * 2 + blk * 3 + 1) % 7) as u32;
            let mut a = vec![vec![0u32; 8]; lanes];
            let mut b = vec![vec![0u32; 8]; lanes];
            let mut c = vec![vec![0f32; regs]; lanes];
            let (mut sa, mut sb) = (vec![0u32; lanes], vec![0u32; lanes]);
            for lane in 0..lanes {
                for i in 0..32 {
                    let (r, kk) = a_at(lane, i);
                    a[lane][i / 4] |= amd_bits(e, val(r, kk, 1)) << (8 * (i % 4));
                    b[lane][i / 4] |= amd_bits(e, val(kk, r, 2)) << (8 * (i % 4));
                }
                for v in 0..regs {
                    let (r, col) = c_at(lane, v);
                    c[lane][v] = val(r, col, 3);
                }
                sa[lane] = sa_exp(lane % m, lane / m);
                sb[lane] = sb_exp(lane % n, lane / n);
            }
            let d = amd_mma(ins, e, &a, &b, &c, Some((&sa, &sb))).expect("the instruction");
            let pow = |x: u32| 2f32.powi(x as i32 - 127);
            for lane in 0..lanes {
                for v in 0..regs {
                    let (r, col) = c_at(lane, v);
                    let want: f32 = (0..k)
                        .map(|p| {
                            val(r, p, 1)
                                * pow(sa_exp(r, p / 32))
                                * val(p, col, 2)
                                * pow(sb_exp(col, p / 32))
                        })
                        .sum::<f32>()
                        + val(r, col, 3);
                    assert_eq!(d[lane][v], want, "{ins:?} lane {lane} item {v}");
                }
            }
            let mut sa2 = sa.clone();
            sa2.rotate_left(1);
            let d2 = amd_mma(ins, e, &a, &b, &c, Some((&sa2, &sb))).expect("moved");
            assert_ne!(d, d2, "{ins:?}: moved scales left D unchanged");
            assert!(
                amd_mma(ins, e, &a, &b, &c, None).is_err(),
                "scales are needed"
            );
        }
        assert!(e8m0(255).is_nan());
        assert_eq!(e8m0(0), 2f32.powi(-127));
        assert_eq!(e8m0(127), 1.0);
    }

    #[test]
    fn fp8_formats_are_not_interchangeable() {
        // E4M3 bytes read as E5M2 give another product: a swapped format is caught.
        let ins = AmdMma::Mfma16x16x32;
        let one = amd_bits(AmdElem::E4M3, 1.5);
        let a = vec![vec![one * 0x0101_0101; 2]; 64];
        let c = vec![vec![0f32; 4]; 64];
        let d4 = amd_mma(ins, AmdElem::E4M3, &a, &a, &c, None).expect("e4m3");
        let d5 = amd_mma(ins, AmdElem::E5M2, &a, &a, &c, None).expect("e5m2");
        assert_eq!(d4[0][0], 32.0 * 1.5 * 1.5);
        assert_ne!(d4, d5);
        assert!(amd_mma(AmdMma::Wmma11, AmdElem::E4M3, &a, &a, &c, None).is_err());
    }

    #[test]
    fn rdna3_halves_that_disagree_are_reported() {
        let one = f16::from_f32(1.0).to_bits() as u32;
        let a = vec![vec![one; 8]; 32];
        let mut b = a.clone();
        b[17][3] = 0; // lane 17 no longer repeats lane 1's B
        let c = vec![vec![0f32; 8]; 32];
        let e = amd_mma(AmdMma::Wmma11, AmdElem::F16, &a, &b, &c, None).expect_err("undefined");
        assert!(e.contains("disagree on B"), "{e}");
        assert!(amd_mma(AmdMma::Wmma11, AmdElem::F16, &a, &a, &c, None).is_ok());
    }
}
