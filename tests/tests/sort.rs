//! In-tile `sort`, `sort_descending`, `sort_with_indices`, `topk` and
//! `topk_with_indices` along the last axis of 1-D and 2-D tiles, on the CPU, emu-nv
//! and emu-amd (the bitonic network through block-local memory, the race checker on),
//! against Rust's stable sort on random data with many ties, NaNs and both zeros;
//! outputs poisoned first and compared bit for bit (the order is total).

use std::cmp::Ordering;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::prelude::*;
use tessera_tests::cpu_and_emulators;

#[kernel]
#[allow(clippy::too_many_arguments)]
fn sorts<const N: usize, const R: usize, const C: usize, const K: usize>(
    x: &Global<f32>,
    q: &Global<i32>,
    asc: &mut Global<f32>,
    desc: &mut Global<f32>,
    arg: &mut Global<i32>,
    rows: &mut Global<i32>,
    rows_arg: &mut Global<i32>,
    top: &mut Global<f32>,
    top_arg: &mut Global<i32>,
) {
    let i = arange::<N>();
    let v = x.load_unmasked(i);
    asc.store_unmasked(i, v.sort());
    desc.store_unmasked(i, v.sort_descending());
    let (_, a) = v.sort_with_indices(false);
    arg.store_unmasked(i, a);
    let r = arange::<R>().expand_dims::<1>();
    let c = arange::<C>().expand_dims::<0>();
    let t = q.load_unmasked(r * C as i32 + c);
    let (s, si) = t.sort_with_indices(true);
    rows.store_unmasked(r * C as i32 + c, s);
    rows_arg.store_unmasked(r * C as i32 + c, si);
    let f = x.load_unmasked(r * C as i32 + c);
    let (tv, ti) = f.topk_with_indices::<K>();
    let kc = arange::<K>().expand_dims::<0>();
    top.store_unmasked(r * K as i32 + kc, tv);
    top_arg.store_unmasked(r * K as i32 + kc, ti);
}

/// The order of the network: NaN after every number, `-0.0 == 0.0`.
fn order(a: f32, b: f32) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).expect("numbers"),
    }
}

/// Stable argsort of `v` by `cmp`.
fn argsort<T: Copy>(v: &[T], cmp: impl Fn(T, T) -> Ordering) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| cmp(v[a], v[b]));
    idx
}

#[test]
fn sorts_and_topk_match_a_stable_sort() {
    const N: usize = 1024;
    const R: usize = 8;
    const C: usize = 128;
    const K: usize = 8;
    let mut r = StdRng::seed_from_u64(13);
    // Few distinct values (many ties), NaNs, and both zeros.
    let x: Vec<f32> = (0..N)
        .map(|i| match i % 61 {
            0 => f32::NAN,
            1 => -0.0,
            2 => 0.0,
            _ => r.gen_range(-20..20) as f32 * 0.5,
        })
        .collect();
    let q: Vec<i32> = (0..R * C).map(|_| r.gen_range(-5..5)).collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let up = argsort(&x, order);
    let down = argsort(&x, |a, b| order(b, a));
    let want_asc: Vec<f32> = up.iter().map(|&i| x[i]).collect();
    let want_desc: Vec<f32> = down.iter().map(|&i| x[i]).collect();
    for dev in cpu_and_emulators() {
        let pf = |n: usize| dev.upload(&vec![f32::from_bits(0x7fc0_dead); n]).unwrap();
        let pi = |n: usize| dev.upload(&vec![-99i32; n]).unwrap();
        let (mut asc, mut desc, mut top) = (pf(N), pf(N), pf(R * K));
        let (mut arg, mut rows, mut rows_arg, mut top_arg) =
            (pi(N), pi(R * C), pi(R * C), pi(R * K));
        sorts::<N, R, C, K>::launch(
            &dev,
            1u32,
            (
                &dev.upload(&x).unwrap(),
                &dev.upload(&q).unwrap(),
                &mut asc,
                &mut desc,
                &mut arg,
                &mut rows,
                &mut rows_arg,
                &mut top,
                &mut top_arg,
            ),
        )
        .unwrap_or_else(|e| panic!("{dev}: {e}"));
        assert_eq!(
            bits(&asc.download().unwrap()),
            bits(&want_asc),
            "{dev}: ascending"
        );
        assert_eq!(
            bits(&desc.download().unwrap()),
            bits(&want_desc),
            "{dev}: descending"
        );
        let got: Vec<usize> = arg
            .download()
            .unwrap()
            .iter()
            .map(|&i| i as usize)
            .collect();
        assert_eq!(got, up, "{dev}: argsort");
        let (rows, rows_arg) = (rows.download().unwrap(), rows_arg.download().unwrap());
        let (top, top_arg) = (top.download().unwrap(), top_arg.download().unwrap());
        for row in 0..R {
            let qr = &q[row * C..(row + 1) * C];
            let want = argsort(qr, |a: i32, b: i32| b.cmp(&a));
            let got_i: Vec<usize> = rows_arg[row * C..(row + 1) * C]
                .iter()
                .map(|&i| i as usize)
                .collect();
            assert_eq!(got_i, want, "{dev}: row {row} indices");
            let want_v: Vec<i32> = want.iter().map(|&i| qr[i]).collect();
            assert_eq!(rows[row * C..(row + 1) * C], want_v[..], "{dev}: row {row}");
            let xr = &x[row * C..(row + 1) * C];
            let best = argsort(xr, |a, b| order(b, a));
            let want_v: Vec<f32> = best[..K].iter().map(|&i| xr[i]).collect();
            assert_eq!(
                bits(&top[row * K..(row + 1) * K]),
                bits(&want_v),
                "{dev}: top-{K} of row {row}"
            );
            let got_i: Vec<usize> = top_arg[row * K..(row + 1) * K]
                .iter()
                .map(|&i| i as usize)
                .collect();
            assert_eq!(got_i, best[..K], "{dev}: top-{K} indices of row {row}");
        }
    }
}

/// ptxas assembles the network (sm_80, sm_90a) without spills; the AMD code objects
/// link.
#[test]
fn sorts_compile_for_every_gpu_target() {
    use tessera::aot::{AmdArch, CompileOptions, Target, compile_kernel};
    use tessera::codegen::tools;
    let o = CompileOptions::default();
    for t in [Target::nvptx(80), Target::SM90A] {
        let art = compile_kernel::<sorts<1024, 8, 128, 8>>(&(), t, &o).expect("compiles");
        let r = tools::ptxas(&art.asm, &t.to_string()).expect("ptxas");
        assert_eq!((r.spill_stores_bytes, r.spill_loads_bytes), (0, 0), "{t}");
    }
    for a in [AmdArch::Gfx90a, AmdArch::Gfx942] {
        compile_kernel::<sorts<1024, 8, 128, 8>>(&(), Target::Amdgpu(a), &o).expect("compiles");
    }
}
