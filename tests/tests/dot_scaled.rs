//! `dot_scaled`: block-scaled matrix products (MXFP8 E4M3 and E5M2, MXFP4, NVFP4) on
//! random elements and scales. The interpreter is checked bit for bit against a
//! reference that decodes every element and scale with its own tables and sums in
//! the op's order; the CPU device and the emulators (which compute the op by
//! conversion: decoded, scaled, an f32 `dot`) against the interpreter; the Tile IR
//! backend takes Blackwell's block-scaled tensor-core instructions.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::ir::fp8::{F8E4M3, F8E5M2};
use tessera::prelude::*;
use tessera_tests::cpu_and_emulators;

const M: usize = 32;
const K: usize = 64;
const N: usize = 32;

/// `out = dot_scaled(a, sa, b, sb, c)` of `M x K` times `K x N`, the operands'
/// stored shapes given: `a` is `M x KA`, `b` `K x NB`, the scales `M x KS` and
/// `KS x N`.
#[kernel]
fn scaled<
    T: ScaledInputType,
    S: ScaleElem,
    const M: usize,
    const K: usize,
    const N: usize,
    const KA: usize,
    const NB: usize,
    const KS: usize,
>(
    a: &Global<T>,
    sa: &Global<S>,
    b: &Global<T>,
    sb: &Global<S>,
    c: &Global<f32>,
    out: &mut Global<f32>,
) {
    let rm = arange::<M>().expand_dims::<1>();
    let rk = arange::<K>().expand_dims::<1>();
    let rs = arange::<KS>().expand_dims::<1>();
    let ca = arange::<KA>().expand_dims::<0>();
    let cb = arange::<NB>().expand_dims::<0>();
    let cs = arange::<KS>().expand_dims::<0>();
    let cn = arange::<N>().expand_dims::<0>();
    let at = a.load_unmasked(rm * KA as i32 + ca);
    let bt = b.load_unmasked(rk * NB as i32 + cb);
    let sat = sa.load_unmasked(rm * KS as i32 + cs);
    let sbt = sb.load_unmasked(rs * N as i32 + cn);
    let co = rm * N as i32 + cn;
    out.store_unmasked(co, dot_scaled(at, sat, bt, sbt, c.load_unmasked(co)));
}

/// The element types the kernel above is instantiated with.
pub trait ScaledInputType: tessera::ir::dsl::ScaledInput + bytemuck::Pod {}
impl ScaledInputType for F8E4M3 {}
impl ScaledInputType for F8E5M2 {}
impl ScaledInputType for E2M1x2 {}
/// The scale types the kernel above is instantiated with.
pub trait ScaleElem: tessera::ir::dsl::ScaleType + bytemuck::Pod {}
impl ScaleElem for E8M0 {}
impl ScaleElem for F8E4M3 {}

/// E2M1 by its table (OCP MX v1.0, table of FP4 E2M1 values).
fn e2m1(n: u8) -> f32 {
    let v = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0][usize::from(n & 7)];
    if n & 8 != 0 { -v } else { v }
}

/// One case's inputs as bytes and their decoded values.
struct Case {
    a: Vec<u8>,
    b: Vec<u8>,
    sa: Vec<u8>,
    sb: Vec<u8>,
    /// The decoded `M x K` and `K x N` elements and the scales.
    av: Vec<f32>,
    bv: Vec<f32>,
    sav: Vec<f32>,
    sbv: Vec<f32>,
    c: Vec<f32>,
    /// `(M, K, N)`.
    dims: (usize, usize, usize),
}

/// Random elements (no NaN encodings) and scales (2^-8 to 2^8), in `format`
/// (`e4m3`, `e5m2`, `e2m1`) with E8M0 or (NVFP4) E4M3 scales.
fn case(format: &str, nvfp4: bool, seed: u64) -> Case {
    case_of(format, nvfp4, seed, (M, K, N))
}

/// [`case`] of an `m x k` by `k x n` product.
fn case_of(format: &str, nvfp4: bool, seed: u64, (m, k, n): (usize, usize, usize)) -> Case {
    let mut rng = StdRng::seed_from_u64(seed);
    let v = if nvfp4 { 16 } else { 32 };
    let ks = k / v;
    let elem = |rng: &mut StdRng| -> (u8, f32) {
        loop {
            let x: u8 = rng.r#gen();
            let d = match format {
                "e4m3" => F8E4M3::from_bits(x).to_f32(),
                "e5m2" => F8E5M2::from_bits(x).to_f32(),
                _ => e2m1(x & 0xF),
            };
            if d.is_finite() {
                return (if format == "e2m1" { x & 0xF } else { x }, d);
            }
        }
    };
    let matrix = |rows: usize, cols: usize, rng: &mut StdRng| -> (Vec<u8>, Vec<f32>) {
        let vals: Vec<(u8, f32)> = (0..rows * cols).map(|_| elem(rng)).collect();
        let decoded = vals.iter().map(|p| p.1).collect();
        let bytes = if format == "e2m1" {
            vals.chunks(2).map(|p| p[0].0 | (p[1].0 << 4)).collect()
        } else {
            vals.iter().map(|p| p.0).collect()
        };
        (bytes, decoded)
    };
    let (a, av) = matrix(m, k, &mut rng);
    let (b, bv) = matrix(k, n, &mut rng);
    let scales = |n: usize, rng: &mut StdRng| -> (Vec<u8>, Vec<f32>) {
        (0..n)
            .map(|_| {
                let e: i32 = rng.gen_range(-8..=8);
                if nvfp4 {
                    // A positive E4M3 power of two times 1 to 1.875.
                    let x = F8E4M3::from_f32(
                        2f32.powi(e / 2) * (1.0 + rng.gen_range(0..8) as f32 / 8.0),
                    );
                    (x.to_bits(), x.to_f32())
                } else {
                    ((e + 127) as u8, 2f32.powi(e))
                }
            })
            .unzip()
    };
    let (sa, sav) = scales(m * ks, &mut rng);
    let (sb, sbv) = scales(ks * n, &mut rng);
    let c = (0..m * n).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
    Case {
        a,
        b,
        sa,
        sb,
        av,
        bv,
        sav,
        sbv,
        c,
        dims: (m, k, n),
    }
}

/// The op's definition, from the decoded values: each operand times its block's
/// scale in f32, then the products added to `c` in order of increasing `k`.
fn reference(x: &Case, v: usize) -> Vec<f32> {
    let (m, k, n) = x.dims;
    let ks = k / v;
    let mut out = x.c.clone();
    for i in 0..m {
        for j in 0..n {
            let mut s = out[i * n + j];
            for p in 0..k {
                let a = x.av[i * k + p] * x.sav[i * ks + p / v];
                let b = x.bv[p * n + j] * x.sbv[(p / v) * n + j];
                s += a * b;
            }
            out[i * n + j] = s;
        }
    }
    out
}

/// Launches the case on `dev` with kernel `scaled::<$t, $s, $ka, $nb, $ks>`; the
/// output (poisoned first: every element written).
macro_rules! run {
    ($dev:expr, $x:expr, $t:ty, $s:ty, $ka:expr, $nb:expr, $ks:expr) => {
        run!($dev, $x, $t, $s, M, K, N, $ka, $nb, $ks)
    };
    ($dev:expr, $x:expr, $t:ty, $s:ty, $m:expr, $k:expr, $n:expr, $ka:expr, $nb:expr, $ks:expr) => {{
        let (dev, x): (&Device, &Case) = ($dev, $x);
        let a: Vec<$t> = bytemuck::cast_slice(&x.a).to_vec();
        let b: Vec<$t> = bytemuck::cast_slice(&x.b).to_vec();
        let sa: Vec<$s> = bytemuck::cast_slice(&x.sa).to_vec();
        let sb: Vec<$s> = bytemuck::cast_slice(&x.sb).to_vec();
        let (a, b) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
        let (sa, sb) = (dev.upload(&sa).unwrap(), dev.upload(&sb).unwrap());
        let c = dev.upload(&x.c).unwrap();
        let mut out = dev.upload(&vec![f32::NAN; $m * $n]).unwrap();
        scaled::<$t, $s, { $m }, { $k }, { $n }, { $ka }, { $nb }, { $ks }>::launch(
            dev,
            1usize,
            (&a, &sa, &b, &sb, &c, &mut out),
        )
        .unwrap_or_else(|e| panic!("{dev}: {e}"));
        out.download().unwrap()
    }};
}

/// Every format on every host device: the interpreter bit for bit against the
/// reference; the compiled CPU device and the emulators within f32 rounding of it
/// (their f32 `dot` may add in another order).
#[test]
fn every_format_matches_its_definition() {
    for (seed, fmt) in [(1, "e4m3"), (2, "e5m2"), (3, "mxfp4"), (4, "nvfp4")] {
        let x = match fmt {
            "mxfp4" => case("e2m1", false, seed),
            "nvfp4" => case("e2m1", true, seed),
            f => case(f, false, seed),
        };
        let v = if fmt == "nvfp4" { 16 } else { 32 };
        let want = reference(&x, v);
        for dev in cpu_and_emulators() {
            let got = match fmt {
                "e4m3" => run!(&dev, &x, F8E4M3, E8M0, K, N, K / 32),
                "e5m2" => run!(&dev, &x, F8E5M2, E8M0, K, N, K / 32),
                "mxfp4" => run!(&dev, &x, E2M1x2, E8M0, K / 2, N / 2, K / 32),
                _ => run!(&dev, &x, E2M1x2, F8E4M3, K / 2, N / 2, K / 16),
            };
            let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                if dev.id() == "interp" {
                    assert_eq!(g.to_bits(), w.to_bits(), "{fmt} {dev} [{i}]: {g} vs {w}");
                } else {
                    assert!(
                        (g - w).abs() <= scale * 1e-5,
                        "{fmt} {dev} [{i}]: {g} vs {w}"
                    );
                }
            }
        }
    }
}

/// A shape that does not fit is an error at the call, naming the op.
#[test]
fn a_scale_of_the_wrong_shape_is_an_error_at_the_call() {
    #[kernel]
    fn bad(a: &Global<F8E4M3>, s: &Global<E8M0>, out: &mut Global<f32>) {
        let at = a.load_unmasked(
            arange::<32>().expand_dims::<1>() * 64 + arange::<64>().expand_dims::<0>(),
        );
        let bt = a.load_unmasked(
            arange::<64>().expand_dims::<1>() * 32 + arange::<32>().expand_dims::<0>(),
        );
        // Four scales a row: E8M0 scales are one per 32 elements, two for K = 64.
        let sa = s.load_unmasked(
            arange::<32>().expand_dims::<1>() * 4 + arange::<4>().expand_dims::<0>(),
        );
        let sb = s.load_unmasked(
            arange::<2>().expand_dims::<1>() * 32 + arange::<32>().expand_dims::<0>(),
        );
        let co = arange::<32>().expand_dims::<1>() * 32 + arange::<32>().expand_dims::<0>();
        out.store_unmasked(co, dot_scaled(at, sa, bt, sb, zeros::<f32, S2<32, 32>>()));
    }
    let e = tessera::kernel_ir::<bad>(&()).expect_err("the scales do not fit");
    let s = e.to_string();
    assert!(s.contains("dot_scaled") && s.contains("scale"), "{s}");
    assert!(s.contains("dot_scaled.rs"), "at the call: {s}");
}

/// Through Tile IR for Blackwell, each format takes the block-scaled tensor-core
/// instructions (`UTCQMMA` for MXFP8, `UTCOMMA` for MXFP4 and NVFP4, the scales
/// copied into tensor memory by `UTCCP`).
#[test]
fn tile_ir_takes_blackwell_s_block_scaled_mma() {
    use tessera::codegen::{tileir, tools};
    // Tiles the tensor cores take (smaller ones `tileiras` computes with FFMAs).
    const T: usize = 128;
    for (name, f) in [
        (
            "mxfp8",
            tessera::kernel_ir::<scaled<F8E4M3, E8M0, T, T, T, T, T, { T / 32 }>>(&()).unwrap(),
        ),
        (
            "mxfp4",
            tessera::kernel_ir::<scaled<E2M1x2, E8M0, T, T, T, { T / 2 }, { T / 2 }, { T / 32 }>>(
                &(),
            )
            .unwrap(),
        ),
        (
            "nvfp4",
            tessera::kernel_ir::<scaled<E2M1x2, F8E4M3, T, T, T, { T / 2 }, { T / 2 }, { T / 16 }>>(
                &(),
            )
            .unwrap(),
        ),
    ] {
        let art = tileir::compile(&f, "sm_100").unwrap_or_else(|e| panic!("{name}: {e}"));
        let sass = tools::sass(&art.cubin).expect("cuobjdump reads it");
        // The 8-bit and 4-bit block-scaled MMAs, the scales copied into tensor memory.
        let mma = if name == "mxfp8" { "UTCQMMA" } else { "UTCOMMA" };
        let has = |p: &str| sass.lines().any(|l| l.contains(p));
        assert!(has(mma) && has("UTCCP"), "{name}: no {mma} with UTCCP in\n{sass}");
        // Hopper has neither the instructions nor the types: an error at the call.
        let e = tileir::compile(&f, "sm_90").expect_err("no block-scaled MMA on sm_90");
        let s = e.to_string();
        assert!(s.contains("dot_scaled.rs") && s.contains("sm_100"), "{s}");
    }
}

/// The op prints and parses back (the IR text round-trips).
#[test]
fn dot_scaled_round_trips_through_the_ir_text() {
    let f = tessera::kernel_ir::<scaled<E2M1x2, F8E4M3, M, K, N, { K / 2 }, { N / 2 }, { K / 16 }>>(&())
        .unwrap();
    let text = tessera::ir::printer::print_function(&f);
    assert!(text.contains("dot_scaled e2m1"), "{text}");
    let back = tessera::ir::parser::parse_function(&text).expect("parses");
    assert_eq!(tessera::ir::printer::print_function(&back), text);
}

/// gfx950 multiplies MXFP8 on its block-scaled MFMA (`v_mfma_scale_f32_16x16x128`
/// and `32x32x64_f8f6f4`, each lane's E8M0 scale of A and B in a register) where
/// they tile the product: the instructions are in its code, and emu-gfx950, which
/// executes them from AMD's description (each block's dot product times its two
/// scales), matches the op's definition on random elements and scales. MXFP4 (no
/// native form here) takes the conversion there.
#[test]
fn gfx950_takes_its_block_scaled_mfma() {
    use tessera::aot::{AmdArch, CompileOptions, Target, compile_ir};
    use tessera::codegen::tools;
    let dev = Device::emu(tessera::EmuKind::Gfx950).expect("the emulator is built in");
    // (shape, the instruction: 16x16x128 when the 32x32 tiles are fewer than the
    // waves, 32x32x64 when they are not, or when 128 does not divide K).
    macro_rules! shape {
        ($m:expr, $k:expr, $n:expr, $ins:expr) => {{
            for (seed, fmt) in [(11, "e4m3"), (12, "e5m2")] {
                let x = case_of(fmt, false, seed, ($m, $k, $n));
                let want = reference(&x, 32);
                let got = if fmt == "e4m3" {
                    run!(&dev, &x, F8E4M3, E8M0, $m, $k, $n, $k, $n, { $k / 32 })
                } else {
                    run!(&dev, &x, F8E5M2, E8M0, $m, $k, $n, $k, $n, { $k / 32 })
                };
                let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let label = concat!(stringify!($m), "x", stringify!($k), "x", stringify!($n));
                    assert!((g - w).abs() <= scale * 1e-5, "{fmt} {label} [{i}]: {g} vs {w}");
                }
            }
            let f = tessera::kernel_ir::<
                scaled<F8E4M3, E8M0, { $m }, { $k }, { $n }, { $k }, { $n }, { $k / 32 }>,
            >(&())
            .expect("builds");
            let art = compile_ir(&f, Target::Amdgpu(AmdArch::Gfx950), &CompileOptions::warps(4))
                .expect("compiles");
            let dis = tools::amdgpu_disasm(&art.binary, AmdArch::Gfx950).expect("llvm-objdump");
            let count = |op: &str| dis.lines().filter(|l| l.trim_start().starts_with(op)).count();
            let ins = format!("v_mfma_scale_f32_{}_f8f6f4", $ins);
            assert!(count(&ins) > 0, "{}: no {ins}:\n{dis}", stringify!($m x $k x $n));
            // No decoding into f32 and no f32 FMA loop.
            assert_eq!(count("v_fma_f32") + count("v_fmac_f32"), 0, "{dis}");
        }};
    }
    shape!(32, 64, 32, "32x32x64");
    shape!(32, 256, 32, "16x16x128");
    shape!(64, 128, 64, "32x32x64");
    // MXFP4 by conversion on the same device.
    let x = case("e2m1", false, 13);
    let want = reference(&x, 32);
    let got = run!(&dev, &x, E2M1x2, E8M0, K / 2, N / 2, K / 32);
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= scale * 1e-5, "mxfp4 [{i}]: {g} vs {w}");
    }
}

/// `out = a · b` (MXFP8 E4M3, f32 out) of `M x K` by `K x N`, `BK` of `k` a step
/// (the scales `M x K/32` and `K/32 x N`, `KS = BK / 32` a step), accumulated in a
/// loop: the loop-carried accumulator and each step's scales on gfx950's block-scaled
/// MFMA.
#[kernel]
fn scaled_loop<const M: usize, const N: usize, const K: usize, const BK: usize, const KS: usize>(
    a: &Global<F8E4M3>,
    sa: &Global<E8M0>,
    b: &Global<F8E4M3>,
    sb: &Global<E8M0>,
    out: &mut Global<f32>,
) {
    let rm = arange::<M>().expand_dims::<1>();
    let cn = arange::<N>().expand_dims::<0>();
    let mut acc = zeros::<f32, S2<M, N>>();
    for k0 in (0..K as i32).step_by(BK) {
        let ka = (k0 + arange::<BK>()).expand_dims::<0>();
        let kr = (k0 + arange::<BK>()).expand_dims::<1>();
        let ks = (k0 / 32 + arange::<KS>()).expand_dims::<0>();
        let ksr = (k0 / 32 + arange::<KS>()).expand_dims::<1>();
        let at = a.load_unmasked(rm * K as i32 + ka);
        let bt = b.load_unmasked(kr * N as i32 + cn);
        let sat = sa.load_unmasked(rm * (K / 32) as i32 + ks);
        let sbt = sb.load_unmasked(ksr * N as i32 + cn);
        acc = dot_scaled(at, sat, bt, sbt, acc);
    }
    out.store_unmasked(rm * N as i32 + cn, acc);
}

/// On emu-gfx950: a loop of block-scaled MFMA on 8 warps (the loop-carried
/// accumulator, each step's scales loaded in the instructions' layout), and a shape
/// no block-scaled instruction tiles (16 rows: the conversion), both against the
/// op's definition, every element written.
#[test]
fn gfx950_block_scaled_loops_and_untiled_shapes() {
    let dev = Device::emu(tessera::EmuKind::Gfx950).expect("the emulator is built in");
    const LM: usize = 128;
    const LN: usize = 64;
    const LK: usize = 256;
    let mut x = case_of("e4m3", false, 21, (LM, LK, LN));
    x.c = vec![0.0; LM * LN];
    let want = reference(&x, 32);
    let a: Vec<F8E4M3> = bytemuck::cast_slice(&x.a).to_vec();
    let b: Vec<F8E4M3> = bytemuck::cast_slice(&x.b).to_vec();
    let sa: Vec<E8M0> = bytemuck::cast_slice(&x.sa).to_vec();
    let sb: Vec<E8M0> = bytemuck::cast_slice(&x.sb).to_vec();
    let (a, b) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
    let (sa, sb) = (dev.upload(&sa).unwrap(), dev.upload(&sb).unwrap());
    let mut out = dev.upload(&vec![f32::NAN; LM * LN]).unwrap();
    scaled_loop::<LM, LN, LK, 128, 4>::launch_with(
        &dev,
        1usize,
        &LaunchOptions::new().num_warps(8),
        (&a, &sa, &b, &sb, &mut out),
    )
    .unwrap_or_else(|e| panic!("{dev}: {e}"));
    let got = out.download().unwrap();
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= scale * 1e-5, "loop [{i}]: {g} vs {w}");
    }
    // The instructions each case takes (the conversion's has none).
    let scaled_mfma = |f: std::sync::Arc<tessera::ir::Function>, warps: u32| {
        use tessera::aot::{AmdArch, CompileOptions, Target, compile_ir};
        let art = compile_ir(
            &f,
            Target::Amdgpu(AmdArch::Gfx950),
            &CompileOptions::warps(warps),
        )
        .expect("compiles");
        let dis = tessera::codegen::tools::amdgpu_disasm(&art.binary, AmdArch::Gfx950)
            .expect("llvm-objdump");
        dis.lines()
            .filter(|l| l.trim_start().starts_with("v_mfma_scale_f32"))
            .count()
    };
    let f = tessera::kernel_ir::<scaled_loop<LM, LN, LK, 128, 4>>(&()).expect("builds");
    assert!(
        scaled_mfma(f, 8) > 0,
        "the loop takes the block-scaled MFMA"
    );
    // 16 x 64 x 16: neither 32x32x64 (16 rows) nor 16x16x128 (K = 64) tiles it.
    let f = tessera::kernel_ir::<scaled<F8E5M2, E8M0, 16, 64, 16, 64, 16, 2>>(&()).expect("builds");
    assert_eq!(scaled_mfma(f, 4), 0, "16x64x16 takes the conversion");
    let x = case_of("e5m2", false, 22, (16, 64, 16));
    let want = reference(&x, 32);
    let got = run!(&dev, &x, F8E5M2, E8M0, 16, 64, 16, 64, 16, 2);
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= scale * 1e-5, "16x64x16 [{i}]: {g} vs {w}");
    }
}
