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
}
