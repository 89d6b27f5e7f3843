//! The conveniences a Triton user reaches for: reductions that keep the reduced axis
//! (`sum_keepdims`, `max_keepdims`, `argmax_keepdims`, ...), `cumprod`, `select` whose condition
//! and values broadcast (a scalar condition, literal and scalar operands), and Rust
//! comparisons (`<`, `>=`) of comptime values inside a kernel body, on the CPU, emu-nv
//! and emu-amd against plain-Rust references on random inputs; outputs poisoned first.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::prelude::*;
use tessera_tests::cpu_and_emulators;

const R: usize = 8;
const C: usize = 32;

#[kernel]
#[allow(clippy::too_many_arguments)]
fn keep_and_select<const R: usize, const C: usize>(
    x: &Global<f32>,
    q: &Global<i32>,
    soft: &mut Global<f32>,
    centered: &mut Global<f32>,
    onehot: &mut Global<i32>,
    qprod: &mut Global<i32>,
    picked: &mut Global<f32>,
    flags: &mut Global<i32>,
    limit: f32,
) {
    let r = arange::<R>().expand_dims::<1>();
    let c = arange::<C>().expand_dims::<0>();
    let offs = r * C as i32 + c;
    let t = x.load_unmasked(offs);
    // Row softmax and column centering, broadcasting the kept axis back.
    let e = (t - t.max_keepdims::<1>()).exp();
    soft.store_unmasked(offs, e / e.sum_keepdims::<1>());
    centered.store_unmasked(offs, t - t.min_keepdims::<0>());
    // One-hot rows of the argmax (a tile condition, two literal values), and of the
    // column argmin.
    onehot.store_unmasked(offs, select(c.eq(t.argmax_keepdims::<1>()), 1, 0));
    let col_min = r.eq(t.argmin_keepdims::<0>());
    onehot.store_unmasked(offs + (R * C) as i32, select(col_min, 1, 0));
    let qi = q.load_unmasked(offs);
    qprod.store_unmasked(offs, qi * qi.prod_keepdims::<1>());
    qprod.store_unmasked(offs + (R * C) as i32, qi.cumprod::<1>());
    soft.store_unmasked(offs + (R * C) as i32, (t * 0.25f32 + 1.0f32).cumprod::<0>());
    // A scalar condition picks one of two tiles; a tile condition picks between a tile
    // and a scalar parameter (a clamp).
    let base = program_id(0) * (2 * R * C) as i32;
    let first = program_id(0).eq(0);
    picked.store_unmasked(base + offs, select(first, t, t * 2.0));
    picked.store_unmasked(base + (R * C) as i32 + offs, select(t.gt(limit), limit, t));
    // Comparisons of Rust values (const parameters, literals) are plain Rust.
    let ok = if R < C && 2.5f32 >= 1.0 && !(C <= R) && C > 1 {
        1
    } else {
        0
    };
    flags.store_unmasked(arange::<1>(), full::<i32, (D<1>,)>(ok));
}

#[test]
#[allow(clippy::needless_range_loop)] // (r, c) index several tiles at once
fn keepdims_reductions_and_broadcasting_select() {
    let mut rng = StdRng::seed_from_u64(21);
    let x: Vec<f32> = (0..R * C)
        .map(|_| rng.gen_range(-4..4) as f32 * 0.75)
        .collect();
    let q: Vec<i32> = (0..R * C).map(|_| rng.gen_range(-3..4)).collect();
    let limit = 1.25f32;
    let at = |r: usize, c: usize| x[r * C + c];
    for dev in cpu_and_emulators() {
        let f = |n: usize| dev.upload(&vec![f32::NAN; n]).unwrap();
        let i = |n: usize| dev.upload(&vec![-99i32; n]).unwrap();
        let (mut soft, mut centered, mut picked) = (f(2 * R * C), f(R * C), f(4 * R * C));
        let (mut onehot, mut qprod, mut flags) = (i(2 * R * C), i(2 * R * C), i(1));
        keep_and_select::<R, C>::launch(
            &dev,
            2u32,
            (
                &dev.upload(&x).unwrap(),
                &dev.upload(&q).unwrap(),
                &mut soft,
                &mut centered,
                &mut onehot,
                &mut qprod,
                &mut picked,
                &mut flags,
                limit,
            ),
        )
        .unwrap();
        let soft = soft.download().unwrap();
        let centered = centered.download().unwrap();
        let onehot = onehot.download().unwrap();
        let qprod = qprod.download().unwrap();
        let picked = picked.download().unwrap();
        for r in 0..R {
            let row: Vec<f32> = (0..C).map(|c| at(r, c)).collect();
            let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let s: f64 = row.iter().map(|&v| ((v - m) as f64).exp()).sum();
            // The first index of the row maximum.
            let am = row.iter().position(|&v| v == m).unwrap();
            let p = q[r * C..(r + 1) * C]
                .iter()
                .fold(1i32, |a, &b| a.wrapping_mul(b));
            for c in 0..C {
                let k = r * C + c;
                let want = ((row[c] - m) as f64).exp() / s;
                assert!(
                    (soft[k] as f64 - want).abs() <= 1e-5 + 2e-5 * want,
                    "{dev}: softmax[{r}][{c}] = {}, want {want}",
                    soft[k]
                );
                let col_min = (0..R).map(|rr| at(rr, c)).fold(f32::INFINITY, f32::min);
                assert_eq!(centered[k], row[c] - col_min, "{dev}: centered[{r}][{c}]");
                assert_eq!(
                    onehot[k],
                    i32::from(c == am),
                    "{dev}: argmax one-hot [{r}][{c}]"
                );
                let amin = (0..R).position(|rr| at(rr, c) == col_min).unwrap();
                assert_eq!(
                    onehot[R * C + k],
                    i32::from(r == amin),
                    "{dev}: argmin one-hot [{r}][{c}]"
                );
                assert_eq!(qprod[k], q[k].wrapping_mul(p), "{dev}: q·prod[{r}][{c}]");
                let cp = q[r * C..=k].iter().fold(1i32, |a, &b| a.wrapping_mul(b));
                assert_eq!(qprod[R * C + k], cp, "{dev}: cumprod along rows [{r}][{c}]");
                let fp: f64 = (0..=r).map(|rr| (at(rr, c) * 0.25 + 1.0) as f64).product();
                let g = soft[R * C + k] as f64;
                assert!(
                    (g - fp).abs() <= 1e-6 + 1e-5 * fp.abs(),
                    "{dev}: cumprod along columns [{r}][{c}] = {g}, want {fp}"
                );
                for pid in 0..2 {
                    let base = pid * 2 * R * C;
                    let scaled = if pid == 0 { row[c] } else { row[c] * 2.0 };
                    assert_eq!(
                        picked[base + k],
                        scaled,
                        "{dev}: program {pid} pick [{r}][{c}]"
                    );
                    assert_eq!(
                        picked[base + R * C + k],
                        row[c].min(limit),
                        "{dev}: program {pid} clamp [{r}][{c}]"
                    );
                }
            }
        }
        assert_eq!(
            flags.download().unwrap(),
            vec![1],
            "{dev}: comptime comparisons"
        );
    }
}

/// `#[kernel]` routes `<`, `<=`, `>`, `>=` through `compare`, which computes what the
/// operators do on Rust values, NaN included.
#[test]
fn rust_comparisons_keep_their_meaning() {
    use tessera::__private::{OrdOp, compare};
    for (a, b) in [
        (1.0f32, 2.0f32),
        (2.0, 1.0),
        (1.0, 1.0),
        (f32::NAN, 1.0),
        (1.0, f32::NAN),
    ] {
        assert_eq!(compare(OrdOp::Lt, &a, &b), a < b, "{a} < {b}");
        assert_eq!(compare(OrdOp::Le, &a, &b), a <= b, "{a} <= {b}");
        assert_eq!(compare(OrdOp::Gt, &a, &b), a > b, "{a} > {b}");
        assert_eq!(compare(OrdOp::Ge, &a, &b), a >= b, "{a} >= {b}");
    }
    assert!(compare(OrdOp::Lt, "abc", "abd"));
    assert!(compare(OrdOp::Ge, &usize::MAX, &0usize));
}
