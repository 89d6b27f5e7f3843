//! `reduce_with` and `associative_scan` with combine functions of the user's
//! (`#[helper]`s over tuples of tiles): value + index reductions, a non-commutative
//! combine (2x2 matrix products, which catch operands swapped or out of order), and
//! forward and reverse scans, on the CPU, emu-nv and emu-amd against plain-Rust folds
//! on random inputs; outputs poisoned first.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::prelude::*;
use tessera_tests::cpu_and_emulators;

/// The larger value and its index; on ties the lower index.
#[helper]
fn max_and_index<const R: usize, const C: usize>(
    a: (Tile<f32, S2<R, C>>, Tile<i32, S2<R, C>>),
    b: (Tile<f32, S2<R, C>>, Tile<i32, S2<R, C>>),
) -> (Tile<f32, S2<R, C>>, Tile<i32, S2<R, C>>) {
    let take_b = b.0.gt(a.0) | (b.0.eq(a.0) & b.1.lt(a.1));
    (select(take_b, b.0, a.0), select(take_b, b.1, a.1))
}

/// The product of 2x2 integer matrices `a · b` (wrapping), as four tiles: associative,
/// not commutative.
#[helper]
#[allow(clippy::type_complexity)]
fn mat_mul<const R: usize, const C: usize>(
    a: (
        Tile<i32, S2<R, C>>,
        Tile<i32, S2<R, C>>,
        Tile<i32, S2<R, C>>,
        Tile<i32, S2<R, C>>,
    ),
    b: (
        Tile<i32, S2<R, C>>,
        Tile<i32, S2<R, C>>,
        Tile<i32, S2<R, C>>,
        Tile<i32, S2<R, C>>,
    ),
) -> (
    Tile<i32, S2<R, C>>,
    Tile<i32, S2<R, C>>,
    Tile<i32, S2<R, C>>,
    Tile<i32, S2<R, C>>,
) {
    (
        a.0 * b.0 + a.1 * b.2,
        a.0 * b.1 + a.1 * b.3,
        a.2 * b.0 + a.3 * b.2,
        a.2 * b.1 + a.3 * b.3,
    )
}

/// A 1-D sum, for a scan of a single tile.
#[helper]
fn add<const N: usize>(a: Tile<f32, S1<N>>, b: Tile<f32, S1<N>>) -> Tile<f32, S1<N>> {
    a + b
}

#[kernel]
#[allow(clippy::too_many_arguments)]
fn combines<const R: usize, const C: usize>(
    x: &Global<f32>,
    m: &Global<i32>,
    best: &mut Global<f32>,
    best_at: &mut Global<i32>,
    col_best_at: &mut Global<i32>,
    prods: &mut Global<i32>,
    scans: &mut Global<i32>,
    rscans: &mut Global<i32>,
    sums: &mut Global<f32>,
    total: &mut Global<f32>,
) {
    let r = arange::<R>().expand_dims::<1>();
    let c = arange::<C>().expand_dims::<0>();
    let offs = r * C as i32 + c;
    let v = x.load_unmasked(offs);
    let cols = (c + r * 0).cast::<i32>();
    let (b, at) = reduce_with::<1, _, _>((v, cols), max_and_index);
    best.store_unmasked(arange::<R>(), b);
    best_at.store_unmasked(arange::<R>(), at);
    let rows = r + c * 0;
    let (_, rat) = reduce_with::<0, _, _>((v, rows), max_and_index);
    col_best_at.store_unmasked(arange::<C>(), rat);
    let mats = (
        m.load_unmasked(offs * 4),
        m.load_unmasked(offs * 4 + 1),
        m.load_unmasked(offs * 4 + 2),
        m.load_unmasked(offs * 4 + 3),
    );
    let p = reduce_with::<1, _, _>(mats, mat_mul);
    let rr = arange::<R>() * 4;
    prods.store_unmasked(rr, p.0);
    prods.store_unmasked(rr + 1, p.1);
    prods.store_unmasked(rr + 2, p.2);
    prods.store_unmasked(rr + 3, p.3);
    let s = associative_scan::<1, _, _>(mats, false, mat_mul);
    let t = associative_scan::<1, _, _>(mats, true, mat_mul);
    for (k, (a, b)) in [(s.0, t.0), (s.1, t.1), (s.2, t.2), (s.3, t.3)]
        .into_iter()
        .enumerate()
    {
        scans.store_unmasked(offs * 4 + k as i32, a);
        rscans.store_unmasked(offs * 4 + k as i32, b);
    }
    let row0 = x.load_unmasked(arange::<C>());
    sums.store_unmasked(arange::<C>(), associative_scan::<0, _, _>(row0, false, add));
    total.store_unmasked(0, reduce_with::<0, _, _>(row0, add));
}

type Mat = [i32; 4];

fn mul(a: Mat, b: Mat) -> Mat {
    let (m, a) = (|x: i32, y: i32| x.wrapping_mul(y), a);
    [
        m(a[0], b[0]).wrapping_add(m(a[1], b[2])),
        m(a[0], b[1]).wrapping_add(m(a[1], b[3])),
        m(a[2], b[0]).wrapping_add(m(a[3], b[2])),
        m(a[2], b[1]).wrapping_add(m(a[3], b[3])),
    ]
}

#[test]
fn user_combines_reduce_and_scan_in_order() {
    const R: usize = 8;
    const C: usize = 32;
    let mut rng = StdRng::seed_from_u64(17);
    let x: Vec<f32> = (0..R * C)
        .map(|_| rng.gen_range(-6..6) as f32 * 0.5)
        .collect();
    let m: Vec<i32> = (0..R * C * 4).map(|_| rng.gen_range(-2..3)).collect();
    let mat = |i: usize| -> Mat { [m[4 * i], m[4 * i + 1], m[4 * i + 2], m[4 * i + 3]] };
    let first_max = |v: &mut dyn Iterator<Item = f32>| {
        let mut best = (f32::NEG_INFINITY, -1i32);
        for (i, x) in v.enumerate() {
            if x > best.0 {
                best = (x, i as i32);
            }
        }
        best
    };
    for dev in cpu_and_emulators() {
        let pf = |n: usize| dev.upload(&vec![f32::NAN; n]).unwrap();
        let pi = |n: usize| dev.upload(&vec![-99i32; n]).unwrap();
        let (mut best, mut sums, mut total) = (pf(R), pf(C), pf(1));
        let (mut best_at, mut col_at, mut prods) = (pi(R), pi(C), pi(4 * R));
        let (mut scans, mut rscans) = (pi(4 * R * C), pi(4 * R * C));
        combines::<R, C>::launch(
            &dev,
            1u32,
            (
                &dev.upload(&x).unwrap(),
                &dev.upload(&m).unwrap(),
                &mut best,
                &mut best_at,
                &mut col_at,
                &mut prods,
                &mut scans,
                &mut rscans,
                &mut sums,
                &mut total,
            ),
        )
        .unwrap_or_else(|e| panic!("{dev}: {e}"));
        let (best, best_at, col_at) = (
            best.download().unwrap(),
            best_at.download().unwrap(),
            col_at.download().unwrap(),
        );
        let (prods, scans, rscans) = (
            prods.download().unwrap(),
            scans.download().unwrap(),
            rscans.download().unwrap(),
        );
        for r in 0..R {
            let (b, at) = first_max(&mut (0..C).map(|c| x[r * C + c]));
            assert_eq!(
                (best[r], best_at[r]),
                (b, at),
                "{dev}: row {r} max and index"
            );
            let p = (0..C).map(|c| mat(r * C + c)).reduce(mul).unwrap();
            assert_eq!(prods[4 * r..4 * r + 4], p[..], "{dev}: row {r} product");
            let mut acc = mat(r * C);
            for c in 0..C {
                if c > 0 {
                    acc = mul(acc, mat(r * C + c));
                }
                let k = 4 * (r * C + c);
                assert_eq!(scans[k..k + 4], acc[..], "{dev}: scan [{r}][{c}]");
                let rev = (c..C).map(|cc| mat(r * C + cc)).reduce(mul).unwrap();
                assert_eq!(rscans[k..k + 4], rev[..], "{dev}: reverse scan [{r}][{c}]");
            }
        }
        for c in 0..C {
            let (_, at) = first_max(&mut (0..R).map(|r| x[r * C + c]));
            assert_eq!(col_at[c], at, "{dev}: column {c} argmax");
        }
        let mut run = 0.0f32;
        for (c, &s) in sums.download().unwrap().iter().enumerate() {
            run += x[c];
            // Integers and halves: every order of the additions is exact.
            assert_eq!(s, run, "{dev}: running sum {c}");
        }
        assert_eq!(
            total.download().unwrap(),
            vec![run],
            "{dev}: 1-D reduction to a scalar"
        );
    }
}

/// The networks compile for every GPU target: ptxas assembles them (sm_80, sm_90a)
/// without spills; the AMD code objects link.
#[test]
fn combines_compile_for_every_gpu_target() {
    use tessera::aot::{AmdArch, CompileOptions, Target, compile_kernel};
    use tessera::codegen::tools;
    let o = CompileOptions::default();
    for t in [Target::nvptx(80), Target::SM90A] {
        let art = compile_kernel::<combines<8, 32>>(&(), t, &o).expect("compiles");
        let r = tools::ptxas(&art.asm, &t.to_string()).expect("ptxas");
        assert_eq!((r.spill_stores_bytes, r.spill_loads_bytes), (0, 0), "{t}");
    }
    for a in [AmdArch::Gfx90a, AmdArch::Gfx942] {
        compile_kernel::<combines<8, 32>>(&(), Target::Amdgpu(a), &o).expect("compiles");
    }
}
