//! Block-scaled GEMM (`dot_scaled`): `C = A · B` with MXFP4 and MXFP8 operands, the
//! formats of low-precision inference and training.
//!
//! The host quantizes f32 matrices block by block: every 32 consecutive values along
//! K share one power-of-two scale (E8M0), chosen so the block's largest magnitude
//! fits the element format (6 for FP4 E2M1, 448 for FP8 E4M3), and each value is
//! rounded to the format. The kernel multiplies the quantized tiles with
//! `dot_scaled`, which NVIDIA's Tile IR backend runs on Blackwell's block-scaled
//! tensor cores and every other backend computes exactly as defined (decoded,
//! scaled, an f32 `dot`). The result is checked against the same product of the
//! decoded values in f64.
//!
//! `cargo run --release --example matmul_mx`

mod common;

use tessera::prelude::*;

const BM: usize = 32;
const BN: usize = 32;
const BK: usize = 64;

/// One `BM x BN` tile of `C` (`m x n`, f32) from A (`m x k`, elements `T`, `AK`
/// stored per `BK` along a row) with scales `sa` (`m x k/32`) and B (`k x n`, `BNS`
/// stored per `BN` along a row) with scales `sb` (`k/32 x n`, `KS = BK / 32` per
/// tile); `m`, `n`, `k` multiples of the tiles. (On gfx950, MXFP8 takes the
/// block-scaled MFMA.)
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn matmul_mx<
    T: ScaledInput,
    const BM: usize,
    const BN: usize,
    const BK: usize,
    const AK: usize,
    const BNS: usize,
    const KS: usize,
>(
    a: &Global<T>,
    sa: &Global<E8M0>,
    b: &Global<T>,
    sb: &Global<E8M0>,
    c: &mut Global<f32>,
    n: i32,
    k: i32,
) {
    let per = (BK / AK) as i32; // elements a stored element (2 for E2M1)
    let rm = (program_id(0) * BM + arange::<BM>()).expand_dims::<1>();
    let cn = (program_id(1) * BN + arange::<BN>()).expand_dims::<0>();
    let cbs = (program_id(1) * BNS + arange::<BNS>()).expand_dims::<0>();
    let mut acc = zeros::<f32, S2<BM, BN>>();
    for k0 in (0..k).step_by(BK) {
        let ka = (k0 / per + arange::<AK>()).expand_dims::<0>();
        let kr = (k0 + arange::<BK>()).expand_dims::<1>();
        let ks = (k0 / 32 + arange::<KS>()).expand_dims::<0>();
        let ksr = (k0 / 32 + arange::<KS>()).expand_dims::<1>();
        let at = a.load_unmasked(rm * (k / per) + ka);
        let bt = b.load_unmasked(kr * (n / per) + cbs);
        let sat = sa.load_unmasked(rm * (k / 32) + ks);
        let sbt = sb.load_unmasked(ksr * n + cn);
        acc = dot_scaled(at, sat, bt, sbt, acc);
    }
    c.store_unmasked(rm * n + cn, acc);
}

/// The E8M0 exponent for a block whose largest magnitude is `amax`, so that it maps
/// to at most `fmax` (the element format's largest value): `ceil(log2(amax / fmax))`.
fn block_exponent(amax: f32, fmax: f32) -> i32 {
    if amax == 0.0 {
        return 0;
    }
    ((amax / fmax).log2().ceil() as i32).clamp(-127, 127)
}

/// `x` (`rows x cols`, blocks of 32 along `along_rows ? rows : cols`) quantized:
/// the scales' exponents and each element's value divided by its scale.
fn scale_blocks(
    x: &[f32],
    rows: usize,
    cols: usize,
    along_cols: bool,
    fmax: f32,
) -> (Vec<i32>, Vec<f32>) {
    let (sr, sc) = if along_cols {
        (rows, cols / 32)
    } else {
        (rows / 32, cols)
    };
    let mut exps = vec![0i32; sr * sc];
    for r in 0..sr {
        for c in 0..sc {
            let at = |i: usize| {
                if along_cols {
                    x[r * cols + c * 32 + i]
                } else {
                    x[(r * 32 + i) * cols + c]
                }
            };
            let amax = (0..32).map(|i| at(i).abs()).fold(0.0f32, f32::max);
            exps[r * sc + c] = block_exponent(amax, fmax);
        }
    }
    let scaled = (0..rows * cols)
        .map(|i| {
            let (r, c) = (i / cols, i % cols);
            let e = if along_cols {
                exps[r * sc + c / 32]
            } else {
                exps[(r / 32) * sc + c]
            };
            x[i] / 2f32.powi(e)
        })
        .collect();
    (exps, scaled)
}

/// `C = A · B` in f64 from the decoded values, and `sum |a||b|` per element.
fn reference(a: &[f64], b: &[f64], (m, n, k): (usize, usize, usize)) -> (Vec<f64>, Vec<f64>) {
    let (mut c, mut mag) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                let v = a[i * k + p] * b[p * n + j];
                c[i * n + j] += v;
                mag[i * n + j] += v.abs();
            }
        }
    }
    (c, mag)
}

fn main() {
    common::run_main(|| {
        let dev = Device::best()?;
        let (mut rng, seed) = common::rng();
        let (m, n, k) = (128, 96, 256);
        println!("block-scaled matmul on {dev} (seed {seed}), {m}x{n}x{k}");
        let a32 = common::uniform(&mut rng, m * k, -3.0, 3.0);
        let b32 = common::uniform(&mut rng, k * n, -0.5, 0.5);
        let grid = (m / BM, n / BN);
        let (ni, ki) = (n as i32, k as i32);
        let to_e8m0 = |e: &[i32]| -> Vec<E8M0> { e.iter().map(|&e| E8M0::pow2(e)).collect() };
        let decode = |v: &[f32], exps: &[i32], idx: &dyn Fn(usize) -> usize| -> Vec<f64> {
            (0..v.len())
                .map(|i| f64::from(v[i]) * 2f64.powi(exps[idx(i)]))
                .collect()
        };
        let a_idx = |i: usize| (i / k) * (k / 32) + (i % k) / 32;
        let b_idx = |i: usize| ((i / n) / 32) * n + i % n;
        let check = |name: &str, av: &[f64], bv: &[f64], got: Vec<f32>| -> Result<(), String> {
            let (want, mag) = reference(av, bv, (m, n, k));
            let got: Vec<f64> = got.into_iter().map(f64::from).collect();
            let tol: Vec<f64> = mag
                .iter()
                .map(|s| 1e-30 + s * k as f64 * f64::from(f32::EPSILON))
                .collect();
            common::check(name, &got, &want, &tol)
        };

        // MXFP4: E2M1 pairs along each row of A (K) and of B (N).
        let (ea, xa) = scale_blocks(&a32, m, k, true, 6.0);
        let (eb, xb) = scale_blocks(&b32, k, n, false, 6.0);
        let pack = |x: &[f32]| -> (Vec<E2M1x2>, Vec<f32>) {
            let p: Vec<E2M1x2> = x.chunks(2).map(|c| E2M1x2::from_f32s(c[0], c[1])).collect();
            let v = p
                .iter()
                .flat_map(|q| {
                    let (a, b) = q.to_f32s();
                    [a, b]
                })
                .collect();
            (p, v)
        };
        let ((pa, va), (pb, vb)) = (pack(&xa), pack(&xb));
        let (da, db) = (dev.upload(&pa)?, dev.upload(&pb)?);
        let (dsa, dsb) = (dev.upload(&to_e8m0(&ea))?, dev.upload(&to_e8m0(&eb))?);
        let mut dc = dev.upload(&vec![f32::NAN; m * n])?;
        matmul_mx::<E2M1x2, BM, BN, BK, { BK / 2 }, { BN / 2 }, { BK / 32 }>::launch(
            &dev,
            grid,
            (&da, &dsa, &db, &dsb, &mut dc, ni, ki),
        )?;
        check(
            "mxfp4",
            &decode(&va, &ea, &a_idx),
            &decode(&vb, &eb, &b_idx),
            dc.download()?,
        )?;

        // MXFP8: E4M3 elements.
        let (ea, xa) = scale_blocks(&a32, m, k, true, 448.0);
        let (eb, xb) = scale_blocks(&b32, k, n, false, 448.0);
        let q = |x: &[f32]| -> (Vec<F8E4M3>, Vec<f32>) {
            let p: Vec<F8E4M3> = x.iter().map(|&v| F8E4M3::from_f32(v)).collect();
            let v = p.iter().map(|q| q.to_f32()).collect();
            (p, v)
        };
        let ((pa, va), (pb, vb)) = (q(&xa), q(&xb));
        let (da, db) = (dev.upload(&pa)?, dev.upload(&pb)?);
        let (dsa, dsb) = (dev.upload(&to_e8m0(&ea))?, dev.upload(&to_e8m0(&eb))?);
        let mut dc = dev.upload(&vec![f32::NAN; m * n])?;
        matmul_mx::<F8E4M3, BM, BN, BK, BK, BN, { BK / 32 }>::launch(
            &dev,
            grid,
            (&da, &dsa, &db, &dsb, &mut dc, ni, ki),
        )?;
        check(
            "mxfp8 e4m3",
            &decode(&va, &ea, &a_idx),
            &decode(&vb, &eb, &b_idx),
            dc.download()?,
        )?;
        Ok(())
    });
}
