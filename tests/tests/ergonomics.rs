//! The conveniences a Triton user reaches for: reductions that keep the reduced axis
//! (`sum_keepdims`, `max_keepdims`, `argmax_keepdims`, ...), `cumprod`, `select` whose condition
//! and values broadcast (a scalar condition, literal and scalar operands), and Rust
//! comparisons (`<`, `>=`) of comptime values inside a kernel body, on the CPU, emu-nv
//! and emu-amd against plain-Rust references on random inputs; outputs poisoned first.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::Element;
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

// ---------------------------------------------------------------------------------
// What a new user trips over (issue 41, item 8): kernels written the natural way, that
// used to be rejected or to misbehave.

/// A const generic named `D` (a head dimension, say), which is also the prelude's
/// dimension type: `#[kernel]` and `#[helper]` read `S1<D>`, `arange::<D>()` and
/// `D<D>` as the constant.
#[kernel]
fn scale_by_d<const D: usize>(x: &Global<f32>, y: &mut Global<f32>) {
    let offs = program_id(0) * D as i32 + arange::<D>();
    let t: Tile<f32, S1<D>> = x.load_unmasked(offs);
    y.store_unmasked(offs, twice_d(t) + D as f32);
}

#[helper]
fn twice_d<const D: usize>(t: Tile<f32, (D<D>,)>) -> Tile<f32, S1<D>> {
    t + t
}

#[test]
fn a_const_generic_named_d() {
    let dev = Device::cpu();
    let x: Vec<f32> = (0..64).map(|i| i as f32).collect();
    let mut y = dev.upload(&vec![f32::NAN; 64]).unwrap();
    scale_by_d::<16>::launch(&dev, 4u32, (&dev.upload(&x).unwrap(), &mut y)).unwrap();
    let want: Vec<f32> = x.iter().map(|v| 2.0 * v + 16.0).collect();
    assert_eq!(y.download().unwrap(), want);
}

/// A kernel generic over its element type, bounded by `DType` alone: moving data needs
/// no more (`#[kernel]` asks `T: Element` of the launch).
#[kernel]
fn copy_any<T: DType>(x: &Global<T>, y: &mut Global<T>, n: i32) {
    let offs = program_id(0) * 64 + arange::<64>();
    let m = offs.lt(n);
    y.store(offs, x.load(offs, m), m);
}

/// Generic over a float element type (`T: Float`), with a scalar of that type.
#[kernel]
fn axpy_any<T: Float>(x: &Global<T>, y: &mut Global<T>, a: T, n: i32) {
    let offs = program_id(0) * 64 + arange::<64>();
    let m = offs.lt(n);
    y.store(offs, x.load(offs, m) * a + y.load(offs, m), m);
}

fn copy_case<T: Element + PartialEq + std::fmt::Debug>(dev: &Device, data: Vec<T>, poison: T) {
    let n = data.len();
    let mut y = dev.upload(&vec![poison; n]).unwrap();
    let x = dev.upload(&data).unwrap();
    copy_any::<T>::launch(dev, n.div_ceil(64), (&x, &mut y, n as i32)).unwrap();
    assert_eq!(y.download().unwrap(), data);
}

#[test]
fn kernels_generic_over_the_element_type() {
    let dev = Device::cpu();
    copy_case(&dev, (0..100).map(|i| i as f32 * 0.5).collect(), f32::NAN);
    copy_case(
        &dev,
        (0..100).map(|i| (i % 100) as i8 - 50).collect(),
        i8::MIN,
    );
    copy_case(
        &dev,
        (0..100).map(|i| F8E4M3::from_f32(i as f32 / 8.0)).collect(),
        F8E4M3::from_f32(-1.0),
    );

    let n = 100;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let mut y = dev.upload(&vec![1.0f32; n]).unwrap();
    axpy_any::<f32>::launch(
        &dev,
        2u32,
        (&dev.upload(&x).unwrap(), &mut y, 0.5f32, n as i32),
    )
    .unwrap();
    let want: Vec<f32> = x.iter().map(|v| v * 0.5 + 1.0).collect();
    assert_eq!(y.download().unwrap(), want);

    let xh: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    let mut yh = dev.upload(&vec![f16::from_f32(1.0); n]).unwrap();
    axpy_any::<f16>::launch(
        &dev,
        2u32,
        (
            &dev.upload(&xh).unwrap(),
            &mut yh,
            f16::from_f32(0.5),
            n as i32,
        ),
    )
    .unwrap();
    let want: Vec<f16> = x.iter().map(|v| f16::from_f32(v * 0.5 + 1.0)).collect();
    assert_eq!(yh.download().unwrap(), want);
}

/// `-> ()` on a kernel.
#[kernel]
#[allow(clippy::unused_unit)]
fn returns_unit(y: &mut Global<i32>) -> () {
    y.store_unmasked(arange::<16>(), arange::<16>() * 3);
}

/// Buffers spelled through type aliases, plain and generic.
type F32Buf = Global<f32>;
type Buf<T> = Global<T>;

#[kernel]
fn add_aliased(x: &F32Buf, y: &F32Buf, out: &mut F32Buf) {
    let offs = arange::<32>();
    out.store_unmasked(offs, x.load_unmasked(offs) + y.load_unmasked(offs));
}

#[kernel]
fn negate_aliased<T: Num>(x: &Buf<T>, out: &mut Buf<T>) {
    let offs = arange::<32>();
    out.store_unmasked(offs, x.load_unmasked(offs) * -1);
}

type Block16 = TensorDesc<f32, S1<16>>;

#[kernel]
fn shift_aliased_desc(src: &Block16, dst: &mut Block16) {
    let x = program_id(0) * 16;
    dst.store([x], src.load([x - 1]) + 1.0f32);
}

#[test]
fn unit_return_and_aliased_buffers() {
    let dev = Device::cpu();
    let mut y = dev.upload(&[-1i32; 16]).unwrap();
    returns_unit::launch(&dev, 1u32, (&mut y,)).unwrap();
    let want: Vec<i32> = (0..16).map(|i| 3 * i).collect();
    assert_eq!(y.download().unwrap(), want);

    let a: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..32).map(|i| 100.0 - i as f32).collect();
    let mut out = dev.upload(&[f32::NAN; 32]).unwrap();
    let (da, db) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
    add_aliased::launch(&dev, 1u32, (&da, &db, &mut out)).unwrap();
    assert_eq!(out.download().unwrap(), vec![100.0f32; 32]);

    let q: Vec<i32> = (0..32).map(|i| i - 7).collect();
    let mut neg = dev.upload(&[0i32; 32]).unwrap();
    negate_aliased::<i32>::launch(&dev, 1u32, (&dev.upload(&q).unwrap(), &mut neg)).unwrap();
    let want: Vec<i32> = q.iter().map(|v| -v).collect();
    assert_eq!(neg.download().unwrap(), want);

    // A descriptor through an alias: `dst[x] = src[x - 1] + 1` (0 read before the start).
    let n = 40usize;
    let src: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let s = dev.upload(&src).unwrap();
    let mut d = dev.upload(&vec![f32::NAN; n]).unwrap();
    let sd = tessera::TensorDescriptor::new(&s, &[n], &[1], &[16]).unwrap();
    let mut dd = tessera::TensorDescriptor::new_mut(&mut d, &[n], &[1], &[16]).unwrap();
    shift_aliased_desc::launch(&dev, n.div_ceil(16) as u32, (&sd, &mut dd)).unwrap();
    drop(dd);
    let want: Vec<f32> = (0..n)
        .map(|i| if i == 0 { 1.0 } else { i as f32 })
        .collect();
    assert_eq!(d.download().unwrap(), want);
}

// A tile kept in a thread-local by one kernel and used by another: a tile cannot
// outlive its kernel (a `static` cannot hold one at all: tests/ui/tile_in_static.rs).
thread_local! {
    static KEPT: std::cell::Cell<Option<Tile<f32, S1<16>>>> = const { std::cell::Cell::new(None) };
}

#[kernel]
fn keep_tile(x: &Global<f32>, y: &mut Global<f32>) {
    let t = x.load_unmasked(arange::<16>());
    KEPT.set(Some(t));
    y.store_unmasked(arange::<16>(), t);
}

#[kernel]
fn reuse_tile(y: &mut Global<f32>) {
    let t = KEPT.get().expect("keep_tile was built first");
    y.store_unmasked(arange::<16>(), t + 1.0); // the escaped tile's use
}

#[test]
fn a_tile_cannot_outlive_its_kernel() {
    let dev = Device::cpu();
    let x = dev.upload(&[2.0f32; 16]).unwrap();
    let mut y = dev.upload(&[0.0f32; 16]).unwrap();
    keep_tile::launch(&dev, 1u32, (&x, &mut y)).unwrap();
    assert_eq!(y.download().unwrap(), vec![2.0f32; 16]);
    let err = reuse_tile::launch(&dev, 1u32, (&mut y,)).unwrap_err();
    let msg = err.to_string();
    let line = tessera_tests::line_of(include_str!("ergonomics.rs"), "// the escaped tile's use");
    assert!(
        msg.contains(&format!("ergonomics.rs:{line}:")),
        "names the use: {msg}"
    );
    assert!(
        msg.contains(
            "tile made while building kernel `keep_tile` is used while building kernel \
             `reuse_tile`: a tile cannot outlive its kernel"
        ),
        "{msg}"
    );
}
