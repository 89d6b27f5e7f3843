//! `argmax`/`argmin` along an axis: the lowest index of the extreme value, NaN as the
//! extreme (its first index), on the CPU, emu-nv and emu-amd (the real lowering),
//! against a plain-Rust reference on random data with many ties (values from a small
//! set) and some NaNs; outputs poisoned first.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::EmuKind;
use tessera::prelude::*;

/// Row-wise (axis 1) and column-wise (axis 0) argmax and argmin of an `R x C` tile.
#[kernel]
fn arg_tiles<const R: usize, const C: usize>(
    x: &Global<f32>,
    q: &Global<i32>,
    row_max: &mut Global<i32>,
    row_min: &mut Global<i32>,
    col_max: &mut Global<i32>,
    col_min: &mut Global<i32>,
    qrow_max: &mut Global<i32>,
) {
    let r = arange::<R>().expand_dims::<1>();
    let c = arange::<C>().expand_dims::<0>();
    let t = x.load_unmasked(r * C as i32 + c);
    row_max.store_unmasked(arange::<R>(), t.argmax::<1>());
    row_min.store_unmasked(arange::<R>(), t.argmin::<1>());
    col_max.store_unmasked(arange::<C>(), t.argmax::<0>());
    col_min.store_unmasked(arange::<C>(), t.argmin::<0>());
    let qi = q.load_unmasked(r * C as i32 + c);
    qrow_max.store_unmasked(arange::<R>(), qi.argmax::<1>());
}

/// The reference: the first index of the extreme, NaN the extreme.
fn arg(v: &[f32], max: bool) -> i32 {
    if let Some(i) = v.iter().position(|x| x.is_nan()) {
        return i as i32;
    }
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if (max && x > v[best]) || (!max && x < v[best]) {
            best = i;
        }
    }
    best as i32
}

#[test]
fn argmax_and_argmin_take_the_first_extreme() {
    const R: usize = 16;
    const C: usize = 64;
    let mut rng = StdRng::seed_from_u64(7);
    let x: Vec<f32> = (0..R * C)
        .map(|i| {
            if i % 97 == 5 {
                f32::NAN
            } else {
                rng.gen_range(-4..4) as f32 * 0.5
            }
        })
        .collect();
    let q: Vec<i32> = (0..R * C).map(|_| rng.gen_range(-3..3)).collect();
    let rows: Vec<Vec<f32>> = (0..R).map(|r| x[r * C..(r + 1) * C].to_vec()).collect();
    let cols: Vec<Vec<f32>> = (0..C)
        .map(|c| (0..R).map(|r| x[r * C + c]).collect())
        .collect();
    let qrows: Vec<Vec<f32>> = (0..R)
        .map(|r| q[r * C..(r + 1) * C].iter().map(|&v| v as f32).collect())
        .collect();
    let mut devs = vec![Device::cpu()];
    for k in [EmuKind::Nv, EmuKind::Amd] {
        devs.push(Device::emu(k).unwrap());
    }
    for dev in devs {
        let (dx, dq) = (dev.upload(&x).unwrap(), dev.upload(&q).unwrap());
        let p = |n: usize| dev.upload(&vec![-99i32; n]).unwrap();
        let (mut a, mut b, mut c, mut d, mut e) = (p(R), p(R), p(C), p(C), p(R));
        arg_tiles::<R, C>::launch(
            &dev,
            1u32,
            (&dx, &dq, &mut a, &mut b, &mut c, &mut d, &mut e),
        )
        .unwrap();
        let got = |b: tessera::Buffer<i32>| b.download().unwrap();
        let want = |v: &[Vec<f32>], max: bool| v.iter().map(|r| arg(r, max)).collect::<Vec<_>>();
        assert_eq!(got(a), want(&rows, true), "{dev}: row argmax");
        assert_eq!(got(b), want(&rows, false), "{dev}: row argmin");
        assert_eq!(got(c), want(&cols, true), "{dev}: column argmax");
        assert_eq!(got(d), want(&cols, false), "{dev}: column argmin");
        assert_eq!(got(e), want(&qrows, true), "{dev}: i32 row argmax");
    }
}
