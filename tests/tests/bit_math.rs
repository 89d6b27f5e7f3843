//! Integer and bit operations (`popc`, `clz`, `bitcast`) and float `pow` and `fmod`
//! on the CPU, emu-nv and emu-amd (the real GPU lowering), against plain-Rust
//! references on random inputs with the edge cases mixed in; outputs poisoned first.
//! `popc`, `clz`, `bitcast` and `fmod` are exact, so they compare bit for bit; `pow`
//! compares within the documented error of `exp2(y·log2|x|)`, with its special cases
//! exact. Then every target compiles them (ptxas, the AMDGPU linker) to the hardware's
//! instructions.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::fp8::F8E4M3;
use tessera::prelude::*;
use tessera_tests::cpu_and_emulators;

/// Set-bit and leading-zero counts of five integer types, `n` elements each.
#[kernel]
#[allow(clippy::too_many_arguments)]
fn bit_counts<const B: usize>(
    a: &Global<i32>,
    u: &Global<u32>,
    b: &Global<u8>,
    w: &Global<i64>,
    uw: &Global<u64>,
    o32: &mut Global<i32>,
    ou32: &mut Global<u32>,
    o8: &mut Global<u8>,
    o64: &mut Global<i64>,
    ou64: &mut Global<u64>,
    n: i32,
) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    let x = a.load(offs, m);
    o32.store(offs, x.popc(), m);
    o32.store(offs + n, x.clz(), m);
    let x = u.load(offs, m);
    ou32.store(offs, x.popc(), m);
    ou32.store(offs + n, x.clz(), m);
    let x = b.load(offs, m);
    o8.store(offs, x.popc(), m);
    o8.store(offs + n, x.clz(), m);
    let x = w.load(offs, m);
    o64.store(offs, x.popc(), m);
    o64.store(offs + n, x.clz(), m);
    let x = uw.load(offs, m);
    ou64.store(offs, x.popc(), m);
    ou64.store(offs + n, x.clz(), m);
}

/// Random integers of every magnitude (a random bit length), with 0, 1, -1, MIN, MAX.
fn ints(seed: u64, n: usize) -> Vec<u64> {
    let mut r = StdRng::seed_from_u64(seed);
    let edges = [
        0u64,
        1,
        u64::MAX,
        1 << 63,
        (1 << 63) - 1,
        0x8000_0000,
        0x7fff_ffff,
    ];
    (0..n)
        .map(|i| match edges.get(i) {
            Some(&e) => e,
            None => r.r#gen::<u64>() >> r.gen_range(0..64),
        })
        .collect()
}

#[test]
fn popc_and_clz_count_bits_of_every_integer_type() {
    let n = 300;
    let v = ints(1, n);
    let a: Vec<i32> = v.iter().map(|&x| x as i32).collect();
    let u: Vec<u32> = v.iter().map(|&x| (x >> 7) as u32).collect();
    let b: Vec<u8> = v.iter().map(|&x| (x >> 3) as u8).collect();
    let w: Vec<i64> = v.iter().map(|&x| x as i64).collect();
    let uw: Vec<u64> = v.iter().map(|&x| x.rotate_left(5)).collect();
    for dev in cpu_and_emulators() {
        let mut o32 = dev.upload(&vec![-99i32; 2 * n]).unwrap();
        let mut ou32 = dev.upload(&vec![0xA5A5_A5A5u32; 2 * n]).unwrap();
        let mut o8 = dev.upload(&vec![0xA5u8; 2 * n]).unwrap();
        let mut o64 = dev.upload(&vec![-99i64; 2 * n]).unwrap();
        let mut ou64 = dev.upload(&vec![0xA5A5u64; 2 * n]).unwrap();
        bit_counts::<128>::launch(
            &dev,
            (n as u32).div_ceil(128),
            (
                &dev.upload(&a).unwrap(),
                &dev.upload(&u).unwrap(),
                &dev.upload(&b).unwrap(),
                &dev.upload(&w).unwrap(),
                &dev.upload(&uw).unwrap(),
                &mut o32,
                &mut ou32,
                &mut o8,
                &mut o64,
                &mut ou64,
                n as i32,
            ),
        )
        .unwrap();
        macro_rules! check {
            ($out:expr, $input:expr, $t:ty, $what:expr) => {
                let got = $out.download().unwrap();
                let pop: Vec<$t> = $input.iter().map(|x| x.count_ones() as $t).collect();
                let lz: Vec<$t> = $input.iter().map(|x| x.leading_zeros() as $t).collect();
                assert_eq!(got[..n], pop[..], "{dev}: popc of {}", $what);
                assert_eq!(got[n..], lz[..], "{dev}: clz of {}", $what);
            };
        }
        check!(o32, a, i32, "i32");
        check!(ou32, u, u32, "u32");
        check!(o8, b, u8, "u8");
        check!(o64, w, i64, "i64");
        check!(ou64, uw, u64, "u64");
    }
}

/// Bit reinterpretations between the types of each width, and bit manipulation of a
/// float through its integer view (`|x|` and `-x` by the sign bit).
#[kernel]
#[allow(clippy::too_many_arguments)]
fn bitcasts<const B: usize>(
    x: &Global<f32>,
    h: &Global<f16>,
    bh: &Global<bf16>,
    d: &Global<f64>,
    e: &Global<F8E4M3>,
    xu: &mut Global<u32>,
    xi: &mut Global<i32>,
    abs_neg: &mut Global<f32>,
    hb: &mut Global<i16>,
    bhh: &mut Global<f16>,
    du: &mut Global<u64>,
    di: &mut Global<f64>,
    eu: &mut Global<u8>,
    n: i32,
) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    let v = x.load(offs, m);
    let bits = v.bitcast::<u32>();
    xu.store(offs, bits, m);
    xi.store(offs, v.bitcast::<i32>(), m);
    abs_neg.store(offs, (bits & 0x7fff_ffffu32).bitcast::<f32>(), m);
    abs_neg.store(offs + n, (bits ^ 0x8000_0000u32).bitcast::<f32>(), m);
    hb.store(offs, h.load(offs, m).bitcast::<i16>(), m);
    bhh.store(offs, bh.load(offs, m).bitcast::<u16>().bitcast::<f16>(), m);
    let dv = d.load(offs, m);
    du.store(offs, dv.bitcast::<u64>(), m);
    di.store(offs, (dv.bitcast::<i64>() + 1i64).bitcast::<f64>(), m);
    eu.store(offs, e.load(offs, m).bitcast::<u8>(), m);
}

#[test]
fn bitcasts_keep_every_bit() {
    let n = 300;
    let mut r = StdRng::seed_from_u64(2);
    // Every kind of float: random bit patterns (so NaN payloads, infinities,
    // subnormals and both zeros all occur), and the edges explicitly.
    let mut xb: Vec<u32> = (0..n).map(|_| r.r#gen()).collect();
    xb[..6].copy_from_slice(&[0, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 0x7fc0_0001, 1]);
    let x: Vec<f32> = xb.iter().map(|&b| f32::from_bits(b)).collect();
    let hb: Vec<u16> = (0..n).map(|_| r.r#gen()).collect();
    let h: Vec<f16> = hb.iter().map(|&b| f16::from_bits(b)).collect();
    let bb: Vec<u16> = (0..n).map(|_| r.r#gen()).collect();
    let bh: Vec<bf16> = bb.iter().map(|&b| bf16::from_bits(b)).collect();
    let db: Vec<u64> = (0..n).map(|_| r.r#gen()).collect();
    let d: Vec<f64> = db.iter().map(|&b| f64::from_bits(b)).collect();
    let eb: Vec<u8> = (0..n).map(|_| r.r#gen()).collect();
    let e: Vec<F8E4M3> = eb.iter().map(|&b| F8E4M3::from_bits(b)).collect();
    for dev in cpu_and_emulators() {
        let mut xu = dev.upload(&vec![0xA5A5_A5A5u32; n]).unwrap();
        let mut xi = dev.upload(&vec![-99i32; n]).unwrap();
        let mut an = dev.upload(&vec![f32::NAN; 2 * n]).unwrap();
        let mut ohb = dev.upload(&vec![-99i16; n]).unwrap();
        let mut obh = dev.upload(&vec![f16::NAN; n]).unwrap();
        let mut du = dev.upload(&vec![0xA5u64; n]).unwrap();
        let mut di = dev.upload(&vec![f64::NAN; n]).unwrap();
        let mut eu = dev.upload(&vec![0xA5u8; n]).unwrap();
        bitcasts::<128>::launch(
            &dev,
            (n as u32).div_ceil(128),
            (
                &dev.upload(&x).unwrap(),
                &dev.upload(&h).unwrap(),
                &dev.upload(&bh).unwrap(),
                &dev.upload(&d).unwrap(),
                &dev.upload(&e).unwrap(),
                &mut xu,
                &mut xi,
                &mut an,
                &mut ohb,
                &mut obh,
                &mut du,
                &mut di,
                &mut eu,
                n as i32,
            ),
        )
        .unwrap();
        assert_eq!(xu.download().unwrap(), xb, "{dev}: f32 → u32");
        let want: Vec<i32> = xb.iter().map(|&b| b as i32).collect();
        assert_eq!(xi.download().unwrap(), want, "{dev}: f32 → i32");
        let got: Vec<u32> = an.download().unwrap().iter().map(|v| v.to_bits()).collect();
        let abs: Vec<u32> = xb.iter().map(|&b| b & 0x7fff_ffff).collect();
        let neg: Vec<u32> = xb.iter().map(|&b| b ^ 0x8000_0000).collect();
        assert_eq!(got[..n], abs[..], "{dev}: |x| through the bits");
        assert_eq!(got[n..], neg[..], "{dev}: -x through the bits");
        let want: Vec<i16> = hb.iter().map(|&b| b as i16).collect();
        assert_eq!(ohb.download().unwrap(), want, "{dev}: f16 → i16");
        let got: Vec<u16> = obh
            .download()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(got, bb, "{dev}: bf16 → u16 → f16");
        assert_eq!(du.download().unwrap(), db, "{dev}: f64 → u64");
        let got: Vec<u64> = di.download().unwrap().iter().map(|v| v.to_bits()).collect();
        let want: Vec<u64> = db.iter().map(|&b| b.wrapping_add(1)).collect();
        assert_eq!(got, want, "{dev}: f64 → i64 + 1 → f64");
        assert_eq!(eu.download().unwrap(), eb, "{dev}: F8E4M3 → u8");
    }
}

/// `fmod` (and `%`, the same op) in every float type.
#[kernel]
#[allow(clippy::too_many_arguments)]
fn fmods<const B: usize>(
    x: &Global<f32>,
    y: &Global<f32>,
    hx: &Global<f16>,
    hy: &Global<f16>,
    bx: &Global<bf16>,
    by: &Global<bf16>,
    dx: &Global<f64>,
    dy: &Global<f64>,
    o: &mut Global<f32>,
    oh: &mut Global<f16>,
    ob: &mut Global<bf16>,
    od: &mut Global<f64>,
    n: i32,
) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    o.store(offs, x.load(offs, m).fmod(y.load(offs, m)), m);
    oh.store(offs, hx.load(offs, m) % hy.load(offs, m), m);
    ob.store(offs, bx.load(offs, m).fmod(by.load(offs, m)), m);
    od.store(offs, dx.load(offs, m) % dy.load(offs, m), m);
}

/// Random floats of a format with `exp_bits` exponent and `mant` mantissa bits
/// spread over every exponent (finite bit patterns with a random sign), and special
/// values at the front.
fn floats(r: &mut StdRng, n: usize, exp_bits: u32, mant: u32, specials: &[u64]) -> Vec<u64> {
    let bits = 1 + exp_bits + mant;
    let top_exp = (1u64 << exp_bits) - 1;
    let mut v: Vec<u64> = (0..n)
        .map(|_| {
            let e = r.gen_range(0..top_exp);
            let m = r.r#gen::<u64>() & ((1 << mant) - 1);
            let s = u64::from(r.gen_bool(0.5)) << (bits - 1);
            s | (e << mant) | m
        })
        .collect();
    v[..specials.len()].copy_from_slice(specials);
    v
}

#[test]
fn fmod_is_exact_in_every_float_type() {
    let n = 520;
    let mut r = StdRng::seed_from_u64(3);
    // f32: zeros, infinities, NaN, the smallest subnormal, the largest float; then
    // pairs of every exponent difference (the long divisions).
    let s32 = [
        0u64,
        0x8000_0000,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        1,
        0x7f7f_ffff,
    ];
    let xb = floats(&mut r, n, 8, 23, &s32);
    let mut yb = floats(
        &mut r,
        n,
        8,
        23,
        &[1, 0x7f7f_ffff, 0x3f80_0000, 0xbf80_0000],
    );
    // y = 0, ±inf, NaN against random x; x = 3e38 against the smallest subnormal.
    yb[10..14].copy_from_slice(&[0, 0x7f80_0000, 0xff80_0000, 0x7fc0_0000]);
    let x: Vec<f32> = xb.iter().map(|&b| f32::from_bits(b as u32)).collect();
    let y: Vec<f32> = yb.iter().map(|&b| f32::from_bits(b as u32)).collect();
    let to16 = |v: Vec<u64>| v.into_iter().map(|b| b as u16).collect::<Vec<_>>();
    let s16 = [0u64, 0x8000, 0x7c00, 0xfc00, 0x7e00, 1, 0x7bff];
    let hx: Vec<f16> = to16(floats(&mut r, n, 5, 10, &s16))
        .into_iter()
        .map(f16::from_bits)
        .collect();
    let hy: Vec<f16> = to16(floats(&mut r, n, 5, 10, &[1, 0x7bff, 0, 0x7c00]))
        .into_iter()
        .map(f16::from_bits)
        .collect();
    let bx: Vec<bf16> = to16(floats(&mut r, n, 8, 7, &[0, 0x8000, 0x7f80, 1, 0x7f7f]))
        .into_iter()
        .map(bf16::from_bits)
        .collect();
    let by: Vec<bf16> = to16(floats(&mut r, n, 8, 7, &[1, 0x7f7f, 0, 0x7f80]))
        .into_iter()
        .map(bf16::from_bits)
        .collect();
    let s64 = [
        0u64,
        1 << 63,
        0x7ff0 << 48,
        0xfff0 << 48,
        0x7ff8 << 48,
        1,
        0x7fef << 48,
    ];
    let dx: Vec<f64> = floats(&mut r, n, 11, 52, &s64)
        .into_iter()
        .map(f64::from_bits)
        .collect();
    let dy: Vec<f64> = floats(&mut r, n, 11, 52, &[1, 0x7fef << 48, 0, 0x7ff0 << 48])
        .into_iter()
        .map(f64::from_bits)
        .collect();
    // Bits, with every NaN the same (C leaves the NaN's sign and payload open).
    fn key32(v: f32) -> u32 {
        if v.is_nan() { 0x7fc0_0000 } else { v.to_bits() }
    }
    fn key16(v: f32, bits: u16) -> u16 {
        if v.is_nan() { 0x7e00 } else { bits }
    }
    fn key64(v: f64) -> u64 {
        if v.is_nan() {
            0x7ff8 << 48
        } else {
            v.to_bits()
        }
    }
    for dev in cpu_and_emulators() {
        let mut o = dev.upload(&vec![f32::NAN; n]).unwrap();
        let mut oh = dev.upload(&vec![f16::from_bits(0x7e01); n]).unwrap();
        let mut ob = dev.upload(&vec![bf16::from_bits(0x7fc1); n]).unwrap();
        let mut od = dev.upload(&vec![f64::NAN; n]).unwrap();
        // Poison that compares unequal to every result: a NaN key differs from any
        // finite result, and the NaN results are checked against the reference.
        fmods::<128>::launch(
            &dev,
            (n as u32).div_ceil(128),
            (
                &dev.upload(&x).unwrap(),
                &dev.upload(&y).unwrap(),
                &dev.upload(&hx).unwrap(),
                &dev.upload(&hy).unwrap(),
                &dev.upload(&bx).unwrap(),
                &dev.upload(&by).unwrap(),
                &dev.upload(&dx).unwrap(),
                &dev.upload(&dy).unwrap(),
                &mut o,
                &mut oh,
                &mut ob,
                &mut od,
                n as i32,
            ),
        )
        .unwrap();
        let got = o.download().unwrap();
        for i in 0..n {
            let want = x[i] % y[i];
            assert_eq!(
                key32(got[i]),
                key32(want),
                "{dev}: fmod({:e}, {:e}) = {:e}, want {want:e}",
                x[i],
                y[i],
                got[i]
            );
        }
        let got = oh.download().unwrap();
        for i in 0..n {
            let want = f16::from_f32(hx[i].to_f32() % hy[i].to_f32());
            assert_eq!(
                key16(got[i].to_f32(), got[i].to_bits()),
                key16(want.to_f32(), want.to_bits()),
                "{dev}: f16 fmod({}, {}) = {}",
                hx[i],
                hy[i],
                got[i]
            );
        }
        let got = ob.download().unwrap();
        for i in 0..n {
            let want = bf16::from_f32(bx[i].to_f32() % by[i].to_f32());
            assert_eq!(
                key16(got[i].to_f32(), got[i].to_bits()),
                key16(want.to_f32(), want.to_bits()),
                "{dev}: bf16 fmod({}, {}) = {}",
                bx[i],
                by[i],
                got[i]
            );
        }
        let got = od.download().unwrap();
        for i in 0..n {
            let want = dx[i] % dy[i];
            assert_eq!(
                key64(got[i]),
                key64(want),
                "{dev}: f64 fmod({:e}, {:e}) = {:e}, want {want:e}",
                dx[i],
                dy[i],
                got[i]
            );
        }
    }
}

/// Conversions to the half floats and half-float arithmetic, around the subnormals:
/// f32 and f64 to bf16 and f16, and a bf16 product (computed in f32, rounded once).
#[kernel]
#[allow(clippy::too_many_arguments)]
fn half_roundings<const B: usize>(
    x: &Global<f32>,
    d: &Global<f64>,
    bx: &Global<bf16>,
    by: &Global<bf16>,
    ob: &mut Global<bf16>,
    oh: &mut Global<f16>,
    odb: &mut Global<bf16>,
    odh: &mut Global<f16>,
    op: &mut Global<bf16>,
    n: i32,
) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    let v = x.load(offs, m);
    ob.store(offs, v.cast::<bf16>(), m);
    oh.store(offs, v.cast::<f16>(), m);
    let w = d.load(offs, m);
    odb.store(offs, w.cast::<bf16>(), m);
    odh.store(offs, w.cast::<f16>(), m);
    op.store(offs, bx.load(offs, m) * by.load(offs, m), m);
}

/// The 16-bit float nearest `x` (ties to the even encoding), from a guess `near`
/// within an ulp of it: `half`'s f64 conversions cut the low 32 bits before rounding,
/// so they are not always the correctly rounded value. The distances are exact
/// (Sterbenz: the candidates are within a factor of two of `x`, or zero).
fn nearest_even(x: f64, near: u16, value: impl Fn(u16) -> f64) -> u16 {
    if x.is_nan() || x.is_infinite() {
        return near;
    }
    let sign = near & 0x8000;
    let mag = near & 0x7fff;
    // Infinity rounds as the value one ulp past the largest finite one would.
    let at = |c: u16| {
        let v = value(c);
        if v.is_infinite() {
            let (a, b) = (value(c - 1), value(c - 2));
            a + (a - b)
        } else {
            v
        }
    };
    let mut best = near;
    for m in [mag.saturating_sub(1), mag, mag + 1] {
        let c = sign | m;
        let (dc, db) = ((x - at(c)).abs(), (x - at(best)).abs());
        if dc < db || (dc == db && c & 1 == 0) {
            best = c;
        }
    }
    best
}

/// Every device rounds to bf16 and f16 correctly (as `half` does from f32),
/// subnormals included: on a
/// CPU with AVX512-BF16, LLVM's `fptrunc` to bf16 became `vcvtneps2bf16`, which
/// flushes subnormals to zero, and the compiled CPU device gave 0 where the
/// interpreter gave the smallest subnormal. `scripts/test.sh` runs this at every
/// x86-64 level the machine executes (`TESSERA_CPU_TARGET`).
#[test]
fn half_conversions_keep_subnormals_on_every_device() {
    let n = 4096;
    let mut r = StdRng::seed_from_u64(11);
    // f32 values from bf16's and f16's subnormal ranges up past their largest
    // finite values (exponents -150..20), with random mantissas and signs, and the
    // edge cases first.
    let mut x: Vec<f32> = (0..n)
        .map(|_| {
            let e = r.gen_range(-150..20);
            let m: f32 = r.gen_range(1.0..2.0);
            let s = if r.gen_bool(0.5) { -1.0 } else { 1.0 };
            s * m * 2f32.powi(e)
        })
        .collect();
    let edges = [
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::from_bits(0x007f_ffff),
        f32::from_bits(0x0000_8000), // a tie at bf16's smallest subnormal's half
        f32::from_bits(0x0001_8000), // a tie, rounds to even (up)
        f32::from_bits(0x0000_7fff),
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        65520.0,
        2f32.powi(-25),
        2f32.powi(-24) * 1.5,
    ];
    x[..edges.len()].copy_from_slice(&edges);
    let d: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, &v)| f64::from(v) * (1.0 + (i as f64) * 1e-9))
        .collect();
    let bx: Vec<bf16> = (0..n)
        .map(|_| bf16::from_f32(r.gen_range(1.0f32..2.0) * 2f32.powi(r.gen_range(-70..-55))))
        .collect();
    let by: Vec<bf16> = (0..n)
        .map(|_| bf16::from_f32(r.gen_range(-2.0f32..2.0) * 2f32.powi(r.gen_range(-70..-55))))
        .collect();
    let key = |b: u16, nan: bool| if nan { 0x7fff } else { b };
    for dev in cpu_and_emulators() {
        let poison_b = vec![bf16::from_bits(0x7fc1); n];
        let poison_h = vec![f16::from_bits(0x7e01); n];
        let mut ob = dev.upload(&poison_b).unwrap();
        let mut oh = dev.upload(&poison_h).unwrap();
        let mut odb = dev.upload(&poison_b).unwrap();
        let mut odh = dev.upload(&poison_h).unwrap();
        let mut op = dev.upload(&poison_b).unwrap();
        half_roundings::<256>::launch(
            &dev,
            (n as u32).div_ceil(256),
            (
                &dev.upload(&x).unwrap(),
                &dev.upload(&d).unwrap(),
                &dev.upload(&bx).unwrap(),
                &dev.upload(&by).unwrap(),
                &mut ob,
                &mut oh,
                &mut odb,
                &mut odh,
                &mut op,
                n as i32,
            ),
        )
        .unwrap();
        let (gb, gh) = (ob.download().unwrap(), oh.download().unwrap());
        let (gdb, gdh) = (odb.download().unwrap(), odh.download().unwrap());
        let gp = op.download().unwrap();
        for i in 0..n {
            let wb = bf16::from_f32(x[i]);
            assert_eq!(gb[i].to_bits(), wb.to_bits(), "{dev}: bf16({:e})", x[i]);
            let wh = f16::from_f32(x[i]);
            assert_eq!(gh[i].to_bits(), wh.to_bits(), "{dev}: f16({:e})", x[i]);
            // f64 to a half float: one rounding, to the nearest of the candidates.
            let wdb = nearest_even(d[i], bf16::from_f64(d[i]).to_bits(), |b| {
                bf16::from_bits(b).to_f64()
            });
            assert_eq!(
                key(gdb[i].to_bits(), gdb[i].is_nan()),
                key(wdb, d[i].is_nan()),
                "{dev}: bf16({:e} as f64)",
                d[i]
            );
            let wdh = nearest_even(d[i], f16::from_f64(d[i]).to_bits(), |b| {
                f16::from_bits(b).to_f64()
            });
            assert_eq!(gdh[i].to_bits(), wdh, "{dev}: f16({:e} as f64)", d[i]);
            let wp = bf16::from_f32(bx[i].to_f32() * by[i].to_f32());
            assert_eq!(
                gp[i].to_bits(),
                wp.to_bits(),
                "{dev}: {:e} * {:e} in bf16",
                bx[i].to_f32(),
                by[i].to_f32()
            );
        }
    }
}

/// `pow` of f32 tiles, of a tile and a literal exponent, and of f16 tiles.
#[kernel]
fn pows<const B: usize>(
    x: &Global<f32>,
    y: &Global<f32>,
    hx: &Global<f16>,
    o: &mut Global<f32>,
    oh: &mut Global<f16>,
    n: i32,
) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    let (a, b) = (x.load(offs, m), y.load(offs, m));
    o.store(offs, a.pow(b), m);
    o.store(offs + n, a.pow(3.0f32), m);
    oh.store(offs, hx.load(offs, m).pow(0.5f32), m);
}

#[test]
fn pow_follows_c_within_the_approximation() {
    // Every pair of the special operands, then random bases and exponents with
    // |y·log2 x| up to about 60.
    let sx = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        2.0,
        -2.0,
        0.5,
        -0.5,
        3.0,
        -3.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-40,
        -7.25,
    ];
    let sy = [
        0.0f32,
        -0.0,
        1.0,
        -1.0,
        2.0,
        3.0,
        -3.0,
        0.5,
        -0.5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        33554432.0,
        1e30,
        2.5,
    ];
    let mut x = Vec::new();
    let mut y = Vec::new();
    for &a in &sx {
        for &b in &sy {
            x.push(a);
            y.push(b);
        }
    }
    let mut r = StdRng::seed_from_u64(4);
    while x.len() < 600 {
        let a: f32 = r.gen_range(0.01f32..50.0) * if r.gen_bool(0.2) { -1.0 } else { 1.0 };
        let b: f32 = if a < 0.0 {
            r.gen_range(-8i32..8) as f32
        } else {
            r.gen_range(-10.0f32..10.0)
        };
        x.push(a);
        y.push(b);
    }
    let n = x.len();
    let hx: Vec<f16> = x.iter().map(|v| f16::from_f32(v.abs() * 100.0)).collect();
    for dev in cpu_and_emulators() {
        let mut o = dev
            .upload(&vec![f32::from_bits(0x7fc0_1234); 2 * n])
            .unwrap();
        let mut oh = dev.upload(&vec![f16::from_bits(0x7e01); n]).unwrap();
        pows::<128>::launch(
            &dev,
            (n as u32).div_ceil(128),
            (
                &dev.upload(&x).unwrap(),
                &dev.upload(&y).unwrap(),
                &dev.upload(&hx).unwrap(),
                &mut o,
                &mut oh,
                n as i32,
            ),
        )
        .unwrap();
        let got = o.download().unwrap();
        let check = |i: usize, a: f32, b: f32, g: f32| {
            let want = (a as f64).powf(b as f64);
            let ctx = format!("{dev}: pow({a:e}, {b:e}) = {g:e}, want {want:e}");
            if want.is_nan() {
                assert!(g.is_nan(), "{ctx}");
                assert_ne!(g.to_bits(), 0x7fc0_1234, "{ctx}: not written ({i})");
            } else if want == 0.0 || (want as f32).is_infinite() {
                // Zeros and infinities are exact, with their sign (results beyond
                // f32 overflow to infinity).
                assert_eq!(g, want as f32, "{ctx}");
                assert_eq!(g.is_sign_negative(), want.is_sign_negative(), "{ctx}");
            } else if (want as f32).abs() < f32::MIN_POSITIVE {
                // Subnormal results may flush to zero (of the right sign).
                assert!((g as f64 - want).abs() < f32::MIN_POSITIVE as f64, "{ctx}");
                assert_eq!(g.is_sign_negative(), want.is_sign_negative(), "{ctx}");
            } else {
                // (Exact results of non-finite `y·log2|x|`: pow(0, 0), pow(inf, 0).)
                let t = (b as f64 * (a as f64).abs().log2()).abs();
                let t = if t.is_finite() { t } else { 0.0 };
                let tol = (t + 1.0) * 2f64.powi(-20);
                let rel = ((g as f64) - want).abs() / want.abs();
                assert!(rel <= tol, "{ctx}: relative error {rel:e} > {tol:e}");
            }
        };
        for i in 0..n {
            check(i, x[i], y[i], got[i]);
            check(i + n, x[i], 3.0, got[i + n]);
        }
        for (i, (&h, g)) in hx.iter().zip(oh.download().unwrap()).enumerate() {
            let want = f16::from_f64(h.to_f64().sqrt());
            let ctx = format!("{dev}: f16 pow({h}, 0.5) = {g}, want {want} ({i})");
            if want.is_nan() {
                assert!(g.is_nan(), "{ctx}");
            } else if want.is_infinite() {
                assert_eq!(g, want, "{ctx}");
            } else {
                let d = (g.to_f32() - want.to_f32()).abs();
                assert!(d <= want.to_f32().abs() * 2e-3, "{ctx}");
            }
        }
    }
}

/// Everything above compiles for every GPU target to the hardware's bit instructions:
/// ptxas assembles it (sm_80, sm_90a) without spills, the AMD code objects link
/// (gfx90a, gfx942), and `fmod` is the exact integer division on NVIDIA (no
/// `x - trunc(x/y)·y` from LLVM's `frem`).
#[test]
fn bit_and_math_ops_compile_for_every_gpu_target() {
    use tessera::aot::{AmdArch, CompileOptions, Target, compile_kernel};
    use tessera::codegen::tools;
    let o = CompileOptions::default();
    for t in [Target::nvptx(80), Target::SM90A] {
        let art = compile_kernel::<bit_counts<128>>(&(), t, &o).expect("compiles");
        for i in ["popc.b32", "clz.b32", "popc.b64", "clz.b64"] {
            assert!(art.asm.contains(i), "{t}: no {i}:\n{}", art.asm);
        }
        let art2 = compile_kernel::<fmods<128>>(&(), t, &o).expect("compiles");
        assert!(art2.asm.contains("rem.u32"), "{t}: {}", art2.asm);
        assert!(art2.asm.contains("rem.u64"), "{t}: {}", art2.asm);
        assert!(
            !art2.asm.contains("cvt.rzi"),
            "{t}: frem expansion:\n{}",
            art2.asm
        );
        let art3 = compile_kernel::<pows<128>>(&(), t, &o).expect("compiles");
        assert!(art3.asm.contains("lg2.approx"), "{t}: {}", art3.asm);
        let art4 = compile_kernel::<bitcasts<128>>(&(), t, &o).expect("compiles");
        for a in [&art, &art2, &art3, &art4] {
            let r = tools::ptxas(&a.asm, &t.to_string()).expect("ptxas");
            assert_eq!((r.spill_stores_bytes, r.spill_loads_bytes), (0, 0), "{t}");
        }
    }
    for a in [AmdArch::Gfx90a, AmdArch::Gfx942] {
        let t = Target::Amdgpu(a);
        let art = compile_kernel::<bit_counts<128>>(&(), t, &o).expect("compiles");
        for i in ["v_bcnt_u32_b32", "v_ffbh_u32"] {
            assert!(art.asm.contains(i), "{t}: no {i}:\n{}", art.asm);
        }
        compile_kernel::<fmods<128>>(&(), t, &o).expect("fmod compiles");
        compile_kernel::<pows<128>>(&(), t, &o).expect("pow compiles");
        compile_kernel::<bitcasts<128>>(&(), t, &o).expect("bitcast compiles");
    }
}

/// The IR of the new ops, as the printer writes them.
#[test]
fn the_ir_names_the_new_ops() {
    let f = tessera::kernel_ir::<bit_counts<128>>(&()).expect("builds");
    let text = f.to_string();
    assert!(text.contains(" popc ") && text.contains(" clz "), "{text}");
    let f = tessera::kernel_ir::<bitcasts<128>>(&()).expect("builds");
    let text = f.to_string();
    assert!(text.contains(" bitcast "), "{text}");
    // Without the source locations, which move whenever this file is edited.
    let f = tessera::kernel_ir::<pows<128>>(&()).expect("builds");
    let text: String = f
        .to_string()
        .lines()
        .map(|l| match (l.find(" loc("), l.rfind(')')) {
            (Some(a), Some(b)) if b > a => format!("{}{}\n", &l[..a], &l[b + 1..]),
            _ => format!("{l}\n"),
        })
        .collect();
    insta::assert_snapshot!("pows_ir", text);
}
