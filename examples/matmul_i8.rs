//! int8 GEMM: `C = A · B` with `i8` inputs and exact `i32` accumulation, on the
//! matrix units (`mma.sync` m16n8k32 `.s8` on NVIDIA sm_80+, `wgmma` `.s8` on sm_90a
//! when B is K-major, `v_mfma_i32_*_i8` on AMD gfx90a/gfx942), at sizes that are not
//! multiples of the tile. Results are compared exactly with a plain-Rust reference.
//!
//! Two layouts of B: `[K][N]` row-major (`matmul_i8`), and `[N][K]` row-major, that is
//! Bᵀ stored (`matmul_i8_bt`: the "TN" layout int8 GEMM libraries expect, where both
//! operands are contiguous along k).
//!
//! `cargo run --release --example matmul_i8`

mod common;

use std::time::Instant;

use rand::Rng;
use tessera::prelude::*;

/// One `BM x BN` tile of `C` (`m x n`, row-major) per program, from A (`m x k`) and B
/// (`k x n`), both row-major; out-of-range rows and columns are masked.
#[kernel]
pub fn matmul_i8<const BM: usize, const BN: usize, const BK: usize>(
    a: &Global<i8>,
    b: &Global<i8>,
    c: &mut Global<i32>,
    m: i32,
    n: i32,
    k: i32,
) {
    let rm = (program_id(0) * BM + arange::<BM>()).expand_dims::<1>(); // BM x 1
    let rn = (program_id(1) * BN + arange::<BN>()).expand_dims::<0>(); // 1 x BN
    let rk = arange::<BK>();
    let mut acc = zeros::<i32, S2<BM, BN>>();
    for k0 in (0..k).step_by(BK) {
        let kk = k0 + rk;
        let (k_col, k_row) = (kk.expand_dims::<0>(), kk.expand_dims::<1>());
        let a_tile = a.load(rm * k + k_col, rm.lt(m) & k_col.lt(k));
        let b_tile = b.load(k_row * n + rn, k_row.lt(k) & rn.lt(n));
        acc = dot(a_tile, b_tile, acc);
    }
    c.store(rm * n + rn, acc, rm.lt(m) & rn.lt(n));
}

/// As [`matmul_i8`] with B given transposed: `bt` is `n x k` row-major (B's column
/// `j` is row `j` of `bt`), so the B tile is loaded contiguous along k.
#[kernel]
pub fn matmul_i8_bt<const BM: usize, const BN: usize, const BK: usize>(
    a: &Global<i8>,
    bt: &Global<i8>,
    c: &mut Global<i32>,
    m: i32,
    n: i32,
    k: i32,
) {
    let rm = (program_id(0) * BM + arange::<BM>()).expand_dims::<1>(); // BM x 1
    let rn = (program_id(1) * BN + arange::<BN>()).expand_dims::<0>(); // 1 x BN
    let rk = arange::<BK>();
    let mut acc = zeros::<i32, S2<BM, BN>>();
    for k0 in (0..k).step_by(BK) {
        let kk = k0 + rk;
        let (k_col, k_row) = (kk.expand_dims::<0>(), kk.expand_dims::<1>());
        let a_tile = a.load(rm * k + k_col, rm.lt(m) & k_col.lt(k));
        let b_tile = bt.load(rn * k + k_row, k_row.lt(k) & rn.lt(n));
        acc = dot(a_tile, b_tile, acc);
    }
    c.store(rm * n + rn, acc, rm.lt(m) & rn.lt(n));
}

/// `C = A · B` in `i64` (A `m x k`, B `k x n`, row-major); every `|C|` here stays far
/// below 2^31 (`k * 128 * 128`), so it equals the wrapping `i32` result.
pub fn reference(a: &[i8], b: &[i8], m: usize, n: usize, k: usize) -> Vec<i64> {
    let mut c = vec![0i64; m * n];
    for i in 0..m {
        for p in 0..k {
            let av = a[i * k + p] as i64;
            for j in 0..n {
                c[i * n + j] += av * b[p * n + j] as i64;
            }
        }
    }
    c
}

/// Bᵀ (`n x k`) of the row-major `k x n` B.
pub fn transpose(b: &[i8], k: usize, n: usize) -> Vec<i8> {
    let mut t = vec![0i8; n * k];
    for p in 0..k {
        for j in 0..n {
            t[j * k + p] = b[p * n + j];
        }
    }
    t
}

fn main() {
    common::run_main(|| {
        let dev = Device::best()?;
        let (mut rng, seed) = common::rng();
        println!("int8 matmul on {dev} (seed {seed})");
        let (m, n, k) = (300usize, 200usize, 176usize);
        let a: Vec<i8> = (0..m * k).map(|_| rng.gen_range(-128..=127)).collect();
        let b: Vec<i8> = (0..k * n).map(|_| rng.gen_range(-128..=127)).collect();
        let want: Vec<f64> = reference(&a, &b, m, n, k)
            .into_iter()
            .map(|v| v as f64)
            .collect();
        let exact = vec![0.0; m * n];
        let da = dev.upload(&a)?;
        let db = dev.upload(&b)?;
        let dbt = dev.upload(&transpose(&b, k, n))?;
        let grid = (m.div_ceil(64), n.div_ceil(64));
        let (mi, ni, ki) = (m as i32, n as i32, k as i32);
        for bt in [false, true] {
            // Poison: an element the kernel skips is caught.
            let mut dc = dev.upload(&vec![i32::MIN + 7; m * n])?;
            let launch = |dc: &mut tessera::Buffer<i32>| {
                if bt {
                    matmul_i8_bt::<64, 64, 64>::launch(&dev, grid, (&da, &dbt, dc, mi, ni, ki))
                } else {
                    matmul_i8::<64, 64, 64>::launch(&dev, grid, (&da, &db, dc, mi, ni, ki))
                }
            };
            launch(&mut dc)?; // builds the IR
            let t = Instant::now();
            launch(&mut dc)?;
            let secs = t.elapsed().as_secs_f64();
            let name = if bt {
                "matmul i8 (Bᵀ given)"
            } else {
                "matmul i8"
            };
            println!(
                "{name}: {m}x{n}x{k} in {:.2} ms ({:.2} GOP/s)",
                secs * 1e3,
                2.0 * (m * n * k) as f64 / secs / 1e9
            );
            let got: Vec<f64> = dc.download()?.into_iter().map(|v| v as f64).collect();
            common::check(name, &got, &want, &exact)?;
        }
        Ok(())
    });
}
