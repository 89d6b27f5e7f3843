//! The cross-backend suite (testing tier 3): every example kernel and a set of
//! op-level kernels run on the reference interpreter and on the SIMT emulator in both
//! flavors (`emu-nv`: warp 32, `mma.sync` m16n8k16 layouts; `emu-amd`: wave 64, MFMA
//! 16x16x16 layouts), which executes the real GPU lowering JIT-compiled for the host.
//! Outputs are poisoned first (NaN, or `0xA5` bytes for integers), inputs are random
//! (seeded) and sizes ragged; results are compared element-wise with the interpreter.
//!
//! # Tolerances (|emu − interp| ≤ abs + rel·|interp|)
//!
//! | output type | abs | rel | why |
//! |---|---|---|---|
//! | integers, `i1` | 0 | 0 | exact semantics |
//! | f64 | 1e-12 | 1e-12 | |
//! | f32 | 1e-6 | 2e-5 | tree-order reductions; `exp`/`log`/`tanh`/`sin` approximations (≤ 4 ulp + input scaling) |
//! | f16 | 1e-3 | 2e-3 | ≈ 2 ulp of the output rounding |
//! | bf16 | 1e-2 | 1.6e-2 | ≈ 2 ulp |
//! | `dot`/matmul (f32 accumulator) | 4e-5·k | as the output type | `mma`/MFMA and tree orders round differently |
//!
//! A layout or barrier bug shows up as wrong elements (usually far beyond these), a
//! shared-memory race or a barrier divergence error.

// Each example is included as a module; they share `examples/common`.
#![allow(clippy::duplicate_mod)]

#[path = "../../examples/layernorm.rs"]
#[allow(dead_code)]
mod layernorm;
#[path = "../../examples/matmul.rs"]
#[allow(dead_code)]
mod matmul;
#[path = "../../examples/matmul_fp8.rs"]
#[allow(dead_code)]
mod matmul_fp8;
#[path = "../../examples/matmul_i8.rs"]
#[allow(dead_code)]
mod matmul_i8;
#[path = "../../examples/softmax.rs"]
#[allow(dead_code)]
mod softmax;
#[path = "../../examples/vector_add.rs"]
#[allow(dead_code)]
mod vector_add;

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::codegen::CompileOptions;
use tessera::codegen::emu::{self, EmuError};
use tessera::codegen::target::EmuFlavor;
use tessera::ir::ScalarType;
use tessera::ir::interp::{self, Element, HostBuffer, KernelArg, Scalar as S};
use tessera::ir::{Function, ParamFacts};
use tessera::prelude::*;
use tessera_tests::line_of;

const FLAVORS: [EmuFlavor; 2] = [EmuFlavor::Nv, EmuFlavor::Amd];

/// The flavors a kernel runs on: both vendors', and for a kernel with a `dot` the
/// ones that differ in their matrix instructions (`EMU_MATRIX_FLAVORS`: sm_90a's
/// `wgmma`, gfx950's MFMA, RDNA3's and RDNA4's WMMA; elsewhere they lower as emu-nv
/// and emu-amd do).
fn flavors_for(f: &Function) -> Vec<EmuFlavor> {
    fn has_dot(r: &tessera::ir::ir::Region) -> bool {
        r.ops
            .iter()
            .any(|o| o.kind == tessera::ir::ir::OpKind::Dot || o.regions.iter().any(has_dot))
    }
    let mut v = FLAVORS.to_vec();
    if has_dot(&f.body) {
        // `TESSERA_TEST_MATRIX_FLAVORS=emu-sm90a,...` takes only those (scripts/test.sh
        // reruns this suite at each x86-64 level with sm_90a's; its workspace run
        // takes them all).
        let only = std::env::var("TESSERA_TEST_MATRIX_FLAVORS").ok();
        v.extend(
            tessera::codegen::target::EMU_MATRIX_FLAVORS
                .into_iter()
                .filter(|f| {
                    only.as_deref()
                        .is_none_or(|o| o.split(',').any(|n| n.trim() == f.name()))
                }),
        );
    }
    v
}

/// One launch argument of a case.
enum Arg {
    /// An input buffer (copied fresh for every backend).
    In(Arc<HostBuffer>),
    /// An output buffer of `len` poisoned elements.
    Out(ScalarType, usize),
    /// A scalar.
    Sc(S),
}

fn inp<T: Element>(v: &[T]) -> Arg {
    Arg::In(Arc::new(HostBuffer::from_slice(v)))
}

fn out<T: Element>(len: usize) -> Arg {
    Arg::Out(T::TY, len)
}

fn poisoned(t: ScalarType, len: usize) -> HostBuffer {
    let bytes: Vec<u8> = match t {
        ScalarType::F16 => f16::NAN.to_bits().to_le_bytes().repeat(len),
        ScalarType::BF16 => bf16::NAN.to_bits().to_le_bytes().repeat(len),
        ScalarType::F32 => f32::NAN.to_le_bytes().repeat(len),
        ScalarType::F64 => f64::NAN.to_le_bytes().repeat(len),
        ScalarType::I1 => vec![1u8; len],
        // NaN in both 8-bit float formats.
        ScalarType::F8E4M3 | ScalarType::F8E5M2 => vec![0x7fu8; len],
        t => vec![0xA5u8; len * t.size_bytes()],
    };
    HostBuffer::from_bytes(t, &bytes).expect("whole elements")
}

fn make(args: &[Arg]) -> Vec<KernelArg> {
    args.iter()
        .map(|a| match a {
            Arg::In(b) => KernelArg::Buffer(Arc::new(
                HostBuffer::from_bytes(b.elem(), &b.read_bytes().expect("read")).expect("copy"),
            )),
            Arg::Out(t, n) => KernelArg::Buffer(Arc::new(poisoned(*t, *n))),
            Arg::Sc(s) => KernelArg::Scalar(*s),
        })
        .collect()
}

fn values(b: &HostBuffer) -> Vec<f64> {
    fn v<T: Element>(b: &HostBuffer, f: impl Fn(T) -> f64) -> Vec<f64> {
        b.to_vec::<T>().expect("type").into_iter().map(f).collect()
    }
    match b.elem() {
        ScalarType::I1 => v::<bool>(b, |x| x as u8 as f64),
        ScalarType::I8 => v::<i8>(b, |x| x as f64),
        ScalarType::I16 => v::<i16>(b, |x| x as f64),
        ScalarType::I32 => v::<i32>(b, |x| x as f64),
        ScalarType::I64 => v::<i64>(b, |x| x as f64),
        ScalarType::U8 => v::<u8>(b, |x| x as f64),
        ScalarType::U16 => v::<u16>(b, |x| x as f64),
        ScalarType::U32 => v::<u32>(b, |x| x as f64),
        ScalarType::U64 => v::<u64>(b, |x| x as f64),
        ScalarType::F16 => v::<f16>(b, |x| x.to_f64()),
        ScalarType::BF16 => v::<bf16>(b, |x| x.to_f64()),
        ScalarType::F32 => v::<f32>(b, |x| x as f64),
        ScalarType::F64 => v::<f64>(b, |x| x),
        ScalarType::F8E4M3 => v::<F8E4M3>(b, |x| x.to_f64()),
        ScalarType::F8E5M2 => v::<F8E5M2>(b, |x| x.to_f64()),
    }
}

/// (abs, rel) of the table in the module docs.
fn tolerance(t: ScalarType) -> (f64, f64) {
    match t {
        ScalarType::F64 => (1e-12, 1e-12),
        ScalarType::F32 => (1e-6, 2e-5),
        ScalarType::F16 => (1e-3, 2e-3),
        ScalarType::BF16 => (1e-2, 1.6e-2),
        _ => (0.0, 0.0),
    }
}

/// Runs `f` on the interpreter and both emulator flavors and compares every output;
/// `extra_abs` widens the absolute tolerance (for `dot`).
fn check(name: &str, f: &Function, grid: [u32; 3], args: &[Arg], num_warps: u32, extra_abs: f64) {
    check_with(
        name,
        f,
        grid,
        args,
        &CompileOptions::warps(num_warps),
        extra_abs,
    );
}

/// [`check`] with explicit compile options.
fn check_with(
    name: &str,
    f: &Function,
    grid: [u32; 3],
    args: &[Arg],
    opts: &CompileOptions,
    extra_abs: f64,
) {
    let reference = make(args);
    interp::run(f, grid, &reference).unwrap_or_else(|e| panic!("{name}: interpreter: {e}"));
    let num_warps = opts.num_warps;
    let opts = opts.clone();
    // As written, and specialized as a GPU launch with these arguments would be
    // (aligned buffers, integers that are multiples of 16: the 16-byte paths).
    let spec = tessera::ir::passes::specialize(f, &launch_facts(args));
    let variants: Vec<(&str, &Function)> = if spec == *f {
        vec![("", f)]
    } else {
        vec![("", f), (" (specialized)", &spec)]
    };
    // The compiled CPU device, with accesses checked and without.
    for sanitize in [true, false] {
        let got = make(args);
        tessera::codegen::cpu::launch(f, grid, &got, sanitize)
            .unwrap_or_else(|e| panic!("{name} on the compiled CPU (sanitize {sanitize}): {e}"));
        compare(
            name,
            &format!("the compiled CPU (sanitize {sanitize})"),
            f,
            args,
            &reference,
            &got,
            extra_abs,
        );
    }
    for flavor in flavors_for(f) {
        for &(how, f) in &variants {
            let got = make(args);
            emu::launch(f, flavor, &opts, grid, &got)
                .unwrap_or_else(|e| panic!("{name}{how} on {flavor:?}: {e}"));
            let on = format!("{how} on {flavor:?} (num_warps {num_warps})");
            compare(name, &on, f, args, &reference, &got, extra_abs);
        }
    }
}

/// Compares every output of `got` with the interpreter's (`reference`).
fn compare(
    name: &str,
    on: &str,
    f: &Function,
    args: &[Arg],
    reference: &[KernelArg],
    got: &[KernelArg],
    extra_abs: f64,
) {
    for (i, a) in args.iter().enumerate() {
        let (Arg::Out(t, _), KernelArg::Buffer(w), KernelArg::Buffer(g)) =
            (a, &reference[i], &got[i])
        else {
            continue;
        };
        let (abs, rel) = tolerance(*t);
        let (w, g) = (values(w), values(g));
        for (j, (x, y)) in w.iter().zip(&g).enumerate() {
            let ok = (x.is_nan() && y.is_nan())
                || x == y
                || (x - y).abs() <= abs + extra_abs + rel * x.abs();
            assert!(
                ok,
                "{name} {on}: output {} element {j}: got {y}, interpreter {x}",
                f.params[i].name
            );
        }
    }
}

/// What the runtime specializes a GPU launch on: buffers (aligned allocations,
/// smaller than 2 GiB) and integers that are multiples of 16.
fn launch_facts(args: &[Arg]) -> Vec<ParamFacts> {
    args.iter()
        .map(|a| match a {
            Arg::In(_) | Arg::Out(..) => ParamFacts::new(true, true),
            Arg::Sc(s) => {
                let d = match *s {
                    S::I32(v) => v % 16 == 0,
                    S::I64(v) => v % 16 == 0,
                    S::U32(v) => v % 16 == 0,
                    S::U64(v) => v % 16 == 0,
                    _ => false,
                };
                ParamFacts::new(d, false)
            }
        })
        .collect()
}

fn ir<K: Kernel<Comptime = ()>>() -> Arc<Function> {
    tessera::kernel_ir::<K>(&()).expect("kernel builds")
}

fn rand_f32(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(lo..hi)).collect()
}

fn g1(x: usize) -> [u32; 3] {
    [x as u32, 1, 1]
}

// ---------------------------------------------------------------------------------
// The example kernels.

#[test]
fn vector_add() {
    let n = 1000;
    let f = ir::<vector_add::vector_add<256>>();
    let args = [
        inp(&rand_f32(1, n, -100.0, 100.0)),
        inp(&rand_f32(2, n, -100.0, 100.0)),
        out::<f32>(n),
        Arg::Sc(S::I32(n as i32)),
    ];
    check("vector_add", &f, g1(n.div_ceil(256)), &args, 4, 0.0);
}

#[test]
fn softmax_f32_and_f16() {
    let (rows, cols) = (13usize, 200usize);
    let xs = rand_f32(3, rows * cols, -8.0, 8.0);
    let f = ir::<softmax::softmax<f32, 4, 256>>();
    let args = [
        inp(&xs),
        out::<f32>(rows * cols),
        Arg::Sc(S::I32(rows as i32)),
        Arg::Sc(S::I32(cols as i32)),
    ];
    check("softmax f32", &f, g1(rows.div_ceil(4)), &args, 4, 0.0);
    let xh: Vec<f16> = xs.iter().map(|&v| f16::from_f32(v)).collect();
    let f = ir::<softmax::softmax<f16, 4, 256>>();
    let args = [
        inp(&xh),
        out::<f16>(rows * cols),
        Arg::Sc(S::I32(rows as i32)),
        Arg::Sc(S::I32(cols as i32)),
    ];
    check("softmax f16", &f, g1(rows.div_ceil(4)), &args, 4, 0.0);
}

fn matmul_args<T: Element>(m: usize, n: usize, k: usize, conv: impl Fn(f32) -> T) -> Vec<Arg> {
    let a: Vec<T> = rand_f32(4, m * k, -1.0, 1.0)
        .into_iter()
        .map(&conv)
        .collect();
    let b: Vec<T> = rand_f32(5, k * n, -1.0, 1.0)
        .into_iter()
        .map(&conv)
        .collect();
    vec![
        inp(&a),
        inp(&b),
        out::<T>(m * n),
        Arg::Sc(S::I32(m as i32)),
        Arg::Sc(S::I32(n as i32)),
        Arg::Sc(S::I32(k as i32)),
    ]
}

#[test]
fn matmul_f32_fma_path() {
    let (m, n, k) = (37usize, 45usize, 50usize);
    let f = ir::<matmul::matmul<f32, 16, 32, 16>>();
    let grid = [m.div_ceil(16) as u32, n.div_ceil(32) as u32, 1];
    check(
        "matmul f32",
        &f,
        grid,
        &matmul_args(m, n, k, |v| v),
        4,
        4e-5 * k as f64,
    );
}

#[test]
fn matmul_f16_mma_path() {
    let (m, n, k) = (70usize, 90usize, 70usize);
    let f = ir::<matmul::matmul<f16, 64, 64, 32>>();
    let grid = [m.div_ceil(64) as u32, n.div_ceil(64) as u32, 1];
    let args = matmul_args(m, n, k, f16::from_f32);
    check("matmul f16", &f, grid, &args, 4, 4e-5 * k as f64);
    check("matmul f16 (8 warps)", &f, grid, &args, 8, 4e-5 * k as f64);
}

/// Every `num_stages`, with sizes that are multiples of 16 but not of the tile (the
/// specialized run takes 16-byte loads: `cp.async` rings on emu-nv, register
/// prefetch into the dot's arrays and buffer loads on emu-amd), so the last
/// iteration's copies are half masked off (zero-filled) and so are the edge tiles'.
#[test]
fn pipelined_matmul_every_stage_count() {
    let (m, n, k) = (80usize, 112usize, 176usize);
    let f = ir::<matmul::matmul<f16, 64, 64, 32>>();
    let grid = [m.div_ceil(64) as u32, n.div_ceil(64) as u32, 1];
    let args = matmul_args(m, n, k, f16::from_f32);
    for stages in [1, 2, 3, 4] {
        let opts = CompileOptions {
            num_warps: 4,
            num_stages: Some(stages),
            ..CompileOptions::default()
        };
        let name = format!("matmul f16 ({stages} stages)");
        check_with(&name, &f, grid, &args, &opts, 4e-5 * k as f64);
    }
    // The benchmarked 8-warp tile: on emu-nv a 96 KiB ring (dynamic shared memory on
    // a GPU).
    let (m, n, k) = (144usize, 160usize, 208usize);
    let f = ir::<matmul::matmul<f16, 128, 128, 64>>();
    let grid = [m.div_ceil(128) as u32, n.div_ceil(128) as u32, 1];
    let args = matmul_args(m, n, k, f16::from_f32);
    let name = "matmul f16 128x128x64 (8 warps, default stages)";
    check(name, &f, grid, &args, 8, 4e-5 * k as f64);
}

/// A residual added in the matmul's epilogue, loaded in the accumulator's layout.
#[test]
fn matmul_residual_epilogue() {
    use tessera_tests::kernels::matmul_residual;
    let (m, n, k) = (80usize, 96usize, 64usize);
    let f = ir::<matmul_residual<64, 64, 32>>();
    let grid = [m.div_ceil(64) as u32, n.div_ceil(64) as u32, 1];
    let mut args = matmul_args(m, n, k, f16::from_f32);
    // a, b, c, m, n, k -> a, b, r, c (f32), m, n, k
    let r = rand_f32(6, m * n, -2.0, 2.0);
    args.insert(2, inp(&r));
    args[3] = out::<f32>(m * n);
    check("matmul + residual", &f, grid, &args, 4, 4e-5 * k as f64);
}

#[test]
fn matmul_bf16_mma_path() {
    let (m, n, k) = (70usize, 50usize, 40usize);
    let f = ir::<matmul::matmul<bf16, 64, 64, 32>>();
    let grid = [m.div_ceil(64) as u32, n.div_ceil(64) as u32, 1];
    check(
        "matmul bf16",
        &f,
        grid,
        &matmul_args(m, n, k, bf16::from_f32),
        4,
        4e-5 * k as f64,
    );
}

/// Random bytes over the whole `i8` range.
fn rand_i8(seed: u64, n: usize) -> Vec<i8> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-128..=127)).collect()
}

/// The int8 GEMMs on the integer matrix instructions (`mma.sync` m16n8k32 `.s8` on
/// emu-nv and emu-sm90a, `v_mfma_i32_*_i8` on emu-amd), exact against the
/// interpreter: B `[k][n]` (staged transposed) and Bᵀ given (contiguous along `k`),
/// ragged edges in every dimension and `k` not a multiple of the tile's, the 16x16
/// MFMA (64x64 on 8 waves) and the 32x32 one (64x64 on 4), 4 and 8 warps.
#[test]
fn matmul_i8_matrix_path() {
    let (m, n, k) = (70usize, 90usize, 100usize);
    let (a, b) = (rand_i8(21, m * k), rand_i8(22, k * n));
    let bt = matmul_i8::transpose(&b, k, n);
    let args = |b: &[i8]| {
        vec![
            inp(&a),
            inp(b),
            out::<i32>(m * n),
            Arg::Sc(S::I32(m as i32)),
            Arg::Sc(S::I32(n as i32)),
            Arg::Sc(S::I32(k as i32)),
        ]
    };
    let grid = [m.div_ceil(64) as u32, n.div_ceil(64) as u32, 1];
    let nn = ir::<matmul_i8::matmul_i8<64, 64, 64>>();
    let tn = ir::<matmul_i8::matmul_i8_bt<64, 64, 64>>();
    for warps in [4, 8] {
        check(
            &format!("matmul i8 ({warps} warps)"),
            &nn,
            grid,
            &args(&b),
            warps,
            0.0,
        );
        check(
            &format!("matmul i8 Bᵀ ({warps} warps)"),
            &tn,
            grid,
            &args(&bt),
            warps,
            0.0,
        );
    }
    // Multiples of 16 (the specialized run's 16-byte loads), 32-wide k tiles.
    let (m, n, k) = (96usize, 64usize, 160usize);
    let (a, b) = (rand_i8(23, m * k), rand_i8(24, k * n));
    let args = vec![
        inp(&a),
        inp(&b),
        out::<i32>(m * n),
        Arg::Sc(S::I32(m as i32)),
        Arg::Sc(S::I32(n as i32)),
        Arg::Sc(S::I32(k as i32)),
    ];
    let f = ir::<matmul_i8::matmul_i8<32, 64, 32>>();
    let grid = [m.div_ceil(32) as u32, n.div_ceil(64) as u32, 1];
    check("matmul i8 32x64x32", &f, grid, &args, 4, 0.0);
}

/// f32 → both 8-bit floats (and back), f16/bf16 → E4M3, E4M3 ↔ E5M2.
#[kernel]
#[allow(clippy::too_many_arguments)]
fn fp8_casts<const B: usize>(
    x: &Global<f32>,
    e4: &mut Global<F8E4M3>,
    e5: &mut Global<F8E5M2>,
    back4: &mut Global<f32>,
    back5: &mut Global<f32>,
    via_half: &mut Global<F8E4M3>,
    via_bf16: &mut Global<F8E5M2>,
    cross: &mut Global<F8E5M2>,
    n: i32,
) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    let a = x.load(offs, m);
    let q4 = a.cast::<F8E4M3>();
    e4.store(offs, q4, m);
    e5.store(offs, a.cast::<F8E5M2>(), m);
    back4.store(offs, q4.cast::<f32>(), m);
    back5.store(offs, a.cast::<F8E5M2>().cast::<f32>(), m);
    via_half.store(offs, a.cast::<f16>().cast::<F8E4M3>(), m);
    via_bf16.store(offs, a.cast::<bf16>().cast::<F8E5M2>(), m);
    cross.store(offs, q4.cast::<F8E5M2>(), m);
}

/// Every bit pattern of both formats to f32, f16 and bf16.
#[kernel]
fn fp8_decode<const B: usize>(
    e4: &Global<F8E4M3>,
    e5: &Global<F8E5M2>,
    f4: &mut Global<f32>,
    f5: &mut Global<f32>,
    h5: &mut Global<f16>,
    b4: &mut Global<bf16>,
) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(256);
    let (x4, x5) = (e4.load(offs, m), e5.load(offs, m));
    f4.store(offs, x4.cast::<f32>(), m);
    f5.store(offs, x5.cast::<f32>(), m);
    h5.store(offs, x5.cast::<f16>(), m);
    b4.store(offs, x4.cast::<bf16>(), m);
}

/// The 8-bit float conversions of the lowering (integer code on the bits, on every
/// target) against the interpreter's (`tessera::fp8`'s, CUDA's `satfinite`
/// conversion), bit for bit: every encoding of both formats decoded, and f32
/// values at every boundary (zeros, subnormal ties, the smallest normals, the
/// saturation thresholds and their neighbours, infinities, NaNs) and random ones over
/// the whole range encoded. The poisoned outputs (NaN bits) show unwritten elements.
#[test]
fn fp8_casts_are_bit_exact() {
    let mut xs: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        448.0,
        -448.0,
        464.0,
        464.0001,
        463.99,
        480.0,
        57344.0,
        61439.99,
        61440.0,
        -61440.0,
        1e9,
        -1e9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::MIN_POSITIVE,
        1e-40,
    ];
    for e in [-6, -9, -10, -14, -16, -17] {
        let p = 2f32.powi(e);
        xs.extend([
            p,
            -p,
            p * 1.5,
            p * 0.75,
            p * 1.25,
            p.next_up(),
            p.next_down(),
        ]);
    }
    // Ties of every binade of E4M3 (half an ulp above a value with an odd and an even
    // mantissa).
    for e in -6..=8 {
        for mant in 0..8 {
            let v = (1.0 + mant as f32 / 8.0) * 2f32.powi(e);
            xs.extend([v + 2f32.powi(e - 4), v - 2f32.powi(e - 4)]);
        }
    }
    let mut r = StdRng::seed_from_u64(31);
    while xs.len() < 1500 {
        let v = 2f32.powf(r.gen_range(-20.0..18.0)) * if r.gen_bool(0.5) { 1.0 } else { -1.0 };
        xs.push(v);
    }
    let n = xs.len();
    let f = ir::<fp8_casts<256>>();
    let args = [
        inp(&xs),
        out::<F8E4M3>(n),
        out::<F8E5M2>(n),
        out::<f32>(n),
        out::<f32>(n),
        out::<F8E4M3>(n),
        out::<F8E5M2>(n),
        out::<F8E5M2>(n),
        Arg::Sc(S::I32(n as i32)),
    ];
    check("fp8 casts", &f, g1(n.div_ceil(256)), &args, 4, 0.0);
    // The interpreter itself: `tessera::fp8`'s conversion.
    let bits: Vec<u8> = (0..=255).collect();
    let e4: Vec<F8E4M3> = bits.iter().map(|&b| F8E4M3::from_bits(b)).collect();
    let e5: Vec<F8E5M2> = bits.iter().map(|&b| F8E5M2::from_bits(b)).collect();
    let f = ir::<fp8_decode<64>>();
    let args = [
        inp(&e4),
        inp(&e5),
        out::<f32>(256),
        out::<f32>(256),
        out::<f16>(256),
        out::<bf16>(256),
    ];
    check("fp8 decode", &f, g1(4), &args, 2, 0.0);
}

/// `values` reads 8-bit floats as their f64 value: bit-level mismatches of NaNs
/// (which compare as NaN) stay; a test that the bits agree too.
#[test]
fn fp8_cast_outputs_agree_in_their_bits() {
    let xs: Vec<f32> = (0..512).map(|i| (i as f32 - 256.0) * 1.37).collect();
    let n = xs.len();
    let f = ir::<fp8_casts<128>>();
    let reference = make(&[
        inp(&xs),
        out::<F8E4M3>(n),
        out::<F8E5M2>(n),
        out::<f32>(n),
        out::<f32>(n),
        out::<F8E4M3>(n),
        out::<F8E5M2>(n),
        out::<F8E5M2>(n),
        Arg::Sc(S::I32(n as i32)),
    ]);
    interp::run(&f, g1(n.div_ceil(128)), &reference).expect("interpreter");
    let KernelArg::Buffer(b) = &reference[1] else {
        unreachable!()
    };
    let e4 = b.to_vec::<F8E4M3>().expect("e4m3");
    for (x, got) in xs.iter().zip(&e4) {
        assert_eq!(got.to_bits(), F8E4M3::from_f32(*x).to_bits(), "{x}");
    }
    let got = make(&[
        inp(&xs),
        out::<F8E4M3>(n),
        out::<F8E5M2>(n),
        out::<f32>(n),
        out::<f32>(n),
        out::<F8E4M3>(n),
        out::<F8E5M2>(n),
        out::<F8E5M2>(n),
        Arg::Sc(S::I32(n as i32)),
    ]);
    for flavor in FLAVORS {
        emu::launch(
            &f,
            flavor,
            &CompileOptions::warps(4),
            g1(n.div_ceil(128)),
            &got,
        )
        .expect("emulator");
        for k in [1, 2, 5, 6, 7] {
            let (KernelArg::Buffer(w), KernelArg::Buffer(g)) = (&reference[k], &got[k]) else {
                unreachable!()
            };
            assert_eq!(
                w.read_bytes().expect("read"),
                g.read_bytes().expect("read"),
                "output {k} on {flavor:?}"
            );
        }
    }
}

/// fp8 GEMMs: the example's (A and Bᵀ contiguous along k: `wgmma` `.e4m3`/`.e5m2`
/// on emu-sm90a, f16 matrix instructions elsewhere) and the f16 matmul example's on
/// E4M3 (B `[k][n]`, f16 instructions everywhere, the f32 result cast back to
/// E4M3), ragged sizes, against the interpreter.
#[test]
fn matmul_fp8_matrix_paths() {
    let (m, n, k) = (80usize, 70usize, 100usize);
    let q4 = |v: Vec<f32>| -> Vec<F8E4M3> { v.into_iter().map(F8E4M3::from_f32).collect() };
    let q5 = |v: Vec<f32>| -> Vec<F8E5M2> { v.into_iter().map(F8E5M2::from_f32).collect() };
    let grid = [m.div_ceil(64) as u32, n.div_ceil(64) as u32, 1];
    let sc = |x: usize| Arg::Sc(S::I32(x as i32));
    let args4 = vec![
        inp(&q4(rand_f32(41, m * k, -8.0, 8.0))),
        inp(&q4(rand_f32(42, n * k, -8.0, 8.0))),
        out::<f32>(m * n),
        sc(m),
        sc(n),
        sc(k),
    ];
    let tol = 4e-5 * k as f64;
    let f = ir::<matmul_fp8::matmul_fp8_bt<F8E4M3, 64, 64, 64>>();
    check("matmul e4m3 Bᵀ", &f, grid, &args4, 4, tol);
    let args5 = vec![
        inp(&q5(rand_f32(43, m * k, -8.0, 8.0))),
        inp(&q5(rand_f32(44, n * k, -8.0, 8.0))),
        out::<f32>(m * n),
        sc(m),
        sc(n),
        sc(k),
    ];
    let f = ir::<matmul_fp8::matmul_fp8_bt<F8E5M2, 64, 64, 64>>();
    check("matmul e5m2 Bᵀ", &f, grid, &args5, 4, tol);
    // Halves in [-2, 2]: exact products and sums, so that every order of the sum
    // rounds to the same E4M3.
    let halves = |seed: u64, len: usize| -> Vec<f32> {
        let mut r = StdRng::seed_from_u64(seed);
        (0..len)
            .map(|_| r.gen_range(-4i32..=4) as f32 * 0.5)
            .collect()
    };
    let args = vec![
        inp(&q4(halves(45, m * k))),
        inp(&q4(halves(46, k * n))),
        out::<F8E4M3>(m * n),
        sc(m),
        sc(n),
        sc(k),
    ];
    let f = ir::<matmul::matmul<F8E4M3, 64, 64, 32>>();
    check("matmul e4m3 (B [k][n], e4m3 out)", &f, grid, &args, 4, 0.0);
}

#[test]
fn layernorm() {
    let (rows, cols) = (5usize, 300usize);
    let f = ir::<layernorm::layernorm<f32, 128>>();
    let args = [
        inp(&rand_f32(6, rows * cols, -4.0, 6.0)),
        inp(&rand_f32(7, cols, 0.5, 1.5)),
        inp(&rand_f32(8, cols, -1.0, 1.0)),
        out::<f32>(rows * cols),
        out::<f32>(rows),
        out::<f32>(rows),
        Arg::Sc(S::I32(cols as i32)),
        Arg::Sc(S::F32(1e-5)),
    ];
    check("layernorm", &f, g1(rows), &args, 4, 0.0);
}

// ---------------------------------------------------------------------------------
// The example kernels at sizes that cross several tiles in every dimension (the
// emulator runs GPU threads as coroutines, so realistic shapes fit in CI's time).

#[test]
fn large_vector_add() {
    let n = (1 << 20) + 3;
    let f = ir::<vector_add::vector_add<1024>>();
    let args = [
        inp(&rand_f32(11, n, -100.0, 100.0)),
        inp(&rand_f32(12, n, -100.0, 100.0)),
        out::<f32>(n),
        Arg::Sc(S::I32(n as i32)),
    ];
    check("vector_add 1M+3", &f, g1(n.div_ceil(1024)), &args, 4, 0.0);
}

#[test]
fn large_matmul_f16_256() {
    let (m, n, k) = (256usize, 256usize, 256usize);
    let args = matmul_args(m, n, k, f16::from_f32);
    let f = ir::<matmul::matmul<f16, 64, 64, 32>>();
    let grid = [(m / 64) as u32, (n / 64) as u32, 1];
    check(
        "matmul f16 256^3 (64x64x32)",
        &f,
        grid,
        &args,
        4,
        4e-5 * k as f64,
    );
    let f = ir::<matmul::matmul<f16, 128, 128, 32>>();
    let grid = [(m / 128) as u32, (n / 128) as u32, 1];
    check(
        "matmul f16 256^3 (128x128x32, 8 warps)",
        &f,
        grid,
        &args,
        8,
        4e-5 * k as f64,
    );
}

#[test]
fn large_matmul_f32_ragged() {
    let (m, n, k) = (250usize, 190usize, 130usize);
    let f = ir::<matmul::matmul<f32, 32, 32, 16>>();
    let grid = [m.div_ceil(32) as u32, n.div_ceil(32) as u32, 1];
    check(
        "matmul f32 250x190x130",
        &f,
        grid,
        &matmul_args(m, n, k, |v| v),
        4,
        4e-5 * k as f64,
    );
}

#[test]
fn large_softmax_1024x1000() {
    let (rows, cols) = (1024usize, 1000usize);
    let f = ir::<softmax::softmax<f32, 4, 1024>>();
    let args = [
        inp(&rand_f32(13, rows * cols, -8.0, 8.0)),
        out::<f32>(rows * cols),
        Arg::Sc(S::I32(rows as i32)),
        Arg::Sc(S::I32(cols as i32)),
    ];
    check("softmax f32 1024x1000", &f, g1(rows / 4), &args, 4, 0.0);
}

#[test]
fn large_layernorm_256x1000() {
    let (rows, cols) = (256usize, 1000usize);
    let f = ir::<layernorm::layernorm<f32, 256>>();
    let args = [
        inp(&rand_f32(14, rows * cols, -4.0, 6.0)),
        inp(&rand_f32(15, cols, 0.5, 1.5)),
        inp(&rand_f32(16, cols, -1.0, 1.0)),
        out::<f32>(rows * cols),
        out::<f32>(rows),
        out::<f32>(rows),
        Arg::Sc(S::I32(cols as i32)),
        Arg::Sc(S::F32(1e-5)),
    ];
    check("layernorm 256x1000", &f, g1(rows), &args, 4, 0.0);
}

#[test]
fn large_causal_attention_seq256() {
    use tessera_tests::kernels::{attention, attention_reference};
    let (seq, d) = (256usize, 64usize);
    let h = |seed| -> Vec<f16> {
        rand_f32(seed, seq * d, -1.0, 1.0)
            .into_iter()
            .map(f16::from_f32)
            .collect()
    };
    let (q, k, v) = (h(17), h(18), h(19));
    let scale = 1.0 / (d as f32).sqrt();
    let f = ir::<attention<64, 64, 64>>();
    let args = [
        inp(&q),
        inp(&k),
        inp(&v),
        out::<f16>(seq * d),
        Arg::Sc(S::I32(seq as i32)),
        Arg::Sc(S::F32(scale)),
    ];
    // The interpreter against an f64 reference first (P is rounded to f16 before
    // P·V, as on the matrix units), then the emulator against the interpreter.
    let reference = make(&args);
    interp::run(&f, g1(seq / 64), &reference).expect("interpreter");
    let KernelArg::Buffer(o) = &reference[3] else {
        unreachable!()
    };
    let want = attention_reference(&q, &k, &v, seq, d, scale as f64);
    for (i, (g, w)) in values(o).iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 4e-3 + 4e-3 * w.abs(),
            "attention (interpreter) element {i}: {g} vs {w}"
        );
    }
    check("causal attention seq 256", &f, g1(seq / 64), &args, 4, 2e-3);
}

/// The library FlashAttention-2 forward (`tessera::attention::attention_fwd`) on
/// every flavor against the interpreter: 2 heads, ragged lengths, causal and not, head
/// dim 64 (f16) and 128 (bf16). On emu-sm90a both dots take wgmma (`Kᵀ` K-major, `P`
/// from registers), on emu-nv `mma.sync` with `P` from registers.
#[test]
fn flash_attention_forward() {
    use tessera::attention::{LOG2_E, attention_fwd};
    fn case<T: Element + DotInput<Acc = f32>, const HD: usize>(
        name: &str,
        conv: impl Fn(f32) -> T,
        (seq_q, seq_k, causal): (usize, usize, bool),
        abs: f64,
    ) where
        attention_fwd<T, 64, 64, HD>: Kernel<Comptime = ()>,
    {
        let heads = 2;
        let h = |seed, n| -> Vec<T> {
            rand_f32(seed, n, -1.0, 1.0)
                .into_iter()
                .map(&conv)
                .collect()
        };
        let (q, k, v) = (
            h(31, heads * seq_q * HD),
            h(32, heads * seq_k * HD),
            h(33, heads * seq_k * HD),
        );
        let f = ir::<attention_fwd<T, 64, 64, HD>>();
        let args = [
            inp(&q),
            inp(&k),
            inp(&v),
            out::<T>(heads * seq_q * HD),
            Arg::Sc(S::I32(seq_q as i32)),
            Arg::Sc(S::I32(seq_k as i32)),
            Arg::Sc(S::F32(LOG2_E / (HD as f32).sqrt())),
            Arg::Sc(S::I32(i32::from(causal))),
        ];
        check(
            name,
            &f,
            [seq_q.div_ceil(64) as u32, heads as u32, 1],
            &args,
            4,
            abs,
        );
    }
    case::<f16, 64>(
        "attention f16 d64 causal",
        f16::from_f32,
        (150, 150, true),
        2e-3,
    );
    case::<f16, 64>("attention f16 d64", f16::from_f32, (100, 176, false), 2e-3);
    case::<bf16, 128>(
        "attention bf16 d128",
        bf16::from_f32,
        (80, 112, false),
        1.6e-2,
    );
}

// ---------------------------------------------------------------------------------
// Op-level kernels.

#[kernel]
fn float_ops<const B: usize>(x: &Global<f32>, y: &Global<f32>, out: &mut Global<f32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    let a = x.load(offs, m);
    let b = y.load(offs, m);
    let w = n * 0;
    out.store(offs + w, a + b * a - b, m);
    out.store(offs + n, a / b, m);
    out.store(offs + n * 2, a.abs().sqrt() + b.abs().rsqrt(), m);
    out.store(offs + n * 3, (a * 0.25).exp() + b.abs().log(), m);
    out.store(offs + n * 4, a.maximum(b) - a.minimum(b), m);
    out.store(offs + n * 5, a.fma(b, a), m);
    out.store(offs + n * 6, select(a.gt(b), a, b) + (a * 0.1).tanh(), m);
    out.store(offs + n * 7, a.sin() + b.cos() + a.floor() - b.ceil(), m);
}

#[kernel]
fn int_ops<const B: usize>(x: &Global<i32>, y: &Global<i32>, out: &mut Global<i32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    let a = x.load(offs, m);
    let b = y.load_or(offs, m, 1);
    out.store(offs, a + b * a - b, m);
    out.store(offs + n, a / b, m);
    out.store(offs + n * 2, a % b, m);
    out.store(offs + n * 3, (a >> 3) ^ (a << 2), m);
    out.store(offs + n * 4, (a & b) | (a ^ b), m);
    out.store(offs + n * 5, a.maximum(b) - a.minimum(b).abs(), m);
    out.store(offs + n * 6, select(a.le(b), 1, 0), m);
}

#[kernel]
#[allow(clippy::too_many_arguments)]
fn casts<const B: usize>(
    x: &Global<f32>,
    h: &mut Global<f16>,
    bh: &mut Global<bf16>,
    i: &mut Global<i32>,
    u: &mut Global<u8>,
    back: &mut Global<f32>,
    wide: &mut Global<i64>,
    n: i32,
) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    let a = x.load(offs, m);
    h.store(offs, a.cast::<f16>(), m);
    bh.store(offs, a.cast::<bf16>(), m);
    i.store(offs, a.cast::<i32>(), m);
    u.store(offs, a.cast::<u8>(), m);
    back.store(
        offs,
        a.cast::<f16>().cast::<f32>() + a.cast::<i32>().cast::<f32>(),
        m,
    );
    wide.store(offs, a.cast::<i64>() * 3000000000i64, m);
}

#[test]
fn elementwise_and_casts() {
    let n = 300;
    let xs = rand_f32(9, n, -300.0, 300.0);
    let ys: Vec<f32> = rand_f32(10, n, 0.5, 9.0)
        .into_iter()
        .enumerate()
        .map(|(i, v)| if i % 2 == 0 { v } else { -v })
        .collect();
    let f = ir::<float_ops<128>>();
    let xs_small: Vec<f32> = xs.iter().map(|v| v / 40.0).collect();
    let args = [
        inp(&xs_small),
        inp(&ys),
        out::<f32>(8 * n),
        Arg::Sc(S::I32(n as i32)),
    ];
    check("float ops", &f, g1(n.div_ceil(128)), &args, 4, 0.0);

    let mut r = StdRng::seed_from_u64(11);
    let xi: Vec<i32> = (0..n).map(|_| r.gen_range(-100000..100000)).collect();
    let yi: Vec<i32> = (0..n)
        .map(|_| r.gen_range(1..1000) * if r.gen_bool(0.5) { 1 } else { -1 })
        .collect();
    let f = ir::<int_ops<64>>();
    let args = [
        inp(&xi),
        inp(&yi),
        out::<i32>(7 * n),
        Arg::Sc(S::I32(n as i32)),
    ];
    check("int ops", &f, g1(n.div_ceil(64)), &args, 2, 0.0);

    let f = ir::<casts<128>>();
    let args = [
        inp(&xs),
        out::<f16>(n),
        out::<bf16>(n),
        out::<i32>(n),
        out::<u8>(n),
        out::<f32>(n),
        out::<i64>(n),
        Arg::Sc(S::I32(n as i32)),
    ];
    check("casts", &f, g1(n.div_ceil(128)), &args, 4, 0.0);
}

/// Reductions and scans along both axes of an `R x C` tile.
#[kernel]
#[allow(clippy::too_many_arguments)]
fn reduce_scan<const R: usize, const C: usize>(
    x: &Global<f32>,
    xi: &Global<i32>,
    sums: &mut Global<f32>,
    maxes: &mut Global<f32>,
    isums: &mut Global<i32>,
    scans: &mut Global<f32>,
    iscans: &mut Global<i32>,
) {
    let r = arange::<R>().expand_dims::<1>();
    let c = arange::<C>().expand_dims::<0>();
    let offs = r * (C as i32) + c;
    let v = x.load_unmasked(offs);
    let vi = xi.load_unmasked(offs);
    sums.store_unmasked(arange::<C>(), v.sum::<0>());
    sums.store_unmasked(arange::<R>() + C as i32, v.sum::<1>());
    maxes.store_unmasked(arange::<C>(), v.max::<0>());
    maxes.store_unmasked(arange::<R>() + C as i32, v.min::<1>());
    isums.store_unmasked(arange::<C>(), vi.sum::<0>());
    isums.store_unmasked(arange::<R>() + C as i32, vi.max::<1>());
    scans.store_unmasked(offs, v.cumsum::<0>());
    scans.store_unmasked(offs + (R * C) as i32, v.cumsum::<1>());
    iscans.store_unmasked(offs, vi.scan::<1>(ReduceOp::Max, true));
    iscans.store_unmasked(offs + (R * C) as i32, vi.cumsum::<0>());
}

fn reduce_case<K: Kernel<Comptime = ()>>(name: &str, r: usize, c: usize, num_warps: u32) {
    let f = ir::<K>();
    let mut rng = StdRng::seed_from_u64(12);
    let xi: Vec<i32> = (0..r * c).map(|_| rng.gen_range(-1000..1000)).collect();
    let args = [
        inp(&rand_f32(13, r * c, -1.0, 1.0)),
        inp(&xi),
        out::<f32>(r + c),
        out::<f32>(r + c),
        out::<i32>(r + c),
        out::<f32>(2 * r * c),
        out::<i32>(2 * r * c),
    ];
    check(name, &f, g1(1), &args, num_warps, 1e-5);
}

#[test]
fn reductions_and_scans_along_each_axis() {
    reduce_case::<reduce_scan<16, 64>>("reduce 16x64", 16, 64, 4);
    reduce_case::<reduce_scan<64, 16>>("reduce 64x16", 64, 16, 4);
    reduce_case::<reduce_scan<8, 8>>("reduce 8x8 (8 warps)", 8, 8, 8);
}

/// Row and column `max`/`min` of an `R x C` tile: rows `R..` of the output hold mins.
#[kernel]
fn extremes<const R: usize, const C: usize>(x: &Global<f32>, out: &mut Global<f32>) {
    let offs = arange::<R>().expand_dims::<1>() * (C as i32) + arange::<C>().expand_dims::<0>();
    let v = x.load_unmasked(offs);
    out.store_unmasked(arange::<R>(), v.max::<1>());
    out.store_unmasked(arange::<R>() + R as i32, v.min::<1>());
    out.store_unmasked(arange::<C>() + 2 * R as i32, v.max::<0>());
    out.store_unmasked(arange::<C>() + (2 * R + C) as i32, v.min::<0>());
}

/// `max` and `min` reductions propagate NaN (of either sign) and order `-0 < +0`
/// exactly as the interpreter does, on both emulator flavors: the GPU lowering splits
/// a lane's registers into a NaN-free extreme and one unordered test per pair, and
/// this pins that the split changes no result, bit for bit (any NaN for a NaN).
#[test]
fn max_and_min_reductions_propagate_nan_and_order_zeros() {
    const R: usize = 8;
    const C: usize = 256;
    let mut rng = StdRng::seed_from_u64(21);
    let neg_nan = f32::from_bits(0xffc0_0001);
    let mut x = rand_f32(22, R * C, -1.0, 1.0);
    let mut at = |row: usize, v: f32, rng: &mut StdRng| x[row * C + rng.gen_range(0..C)] = v;
    at(1, f32::NAN, &mut rng);
    at(3, f32::INFINITY, &mut rng);
    at(3, f32::NEG_INFINITY, &mut rng);
    at(6, neg_nan, &mut rng);
    for c in 0..C {
        x[2 * C + c] = if rng.gen_bool(0.5) { 0.0 } else { -0.0 };
        x[4 * C + c] = f32::NEG_INFINITY;
        x[5 * C + c] = -0.0;
        x[7 * C + c] = -x[7 * C + c].abs() - 0.5;
    }
    x[4 * C + 77] = neg_nan;
    let f = ir::<extremes<R, C>>();
    let len = 2 * (R + C);
    let args = |x: &[f32]| {
        vec![
            KernelArg::Buffer(Arc::new(HostBuffer::from_slice(x))),
            KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&vec![1234.5f32; len]))),
        ]
    };
    let want = args(&x);
    interp::run(&f, g1(1), &want).expect("interpreter");
    let bits = |a: &[KernelArg]| -> Vec<f32> {
        let KernelArg::Buffer(b) = &a[1] else {
            unreachable!()
        };
        b.to_vec::<f32>().expect("f32")
    };
    let want = bits(&want);
    assert!(
        want[1].is_nan() && want[R + 1].is_nan() && want[4].is_nan(),
        "{want:?}"
    );
    assert_eq!((want[2].to_bits(), want[R + 2].to_bits()), (0, 0x8000_0000));
    for flavor in FLAVORS {
        let got = args(&x);
        emu::launch(&f, flavor, &CompileOptions::warps(4), g1(1), &got)
            .unwrap_or_else(|e| panic!("{flavor:?}: {e}"));
        for (i, (w, g)) in want.iter().zip(bits(&got)).enumerate() {
            assert!(
                (w.is_nan() && g.is_nan()) || w.to_bits() == g.to_bits(),
                "{flavor:?}: output {i}: emu {g:e} ({:#x}), interpreter {w:e} ({:#x})",
                g.to_bits(),
                w.to_bits()
            );
        }
    }
}

/// `c = a · b + c` for one tile.
#[kernel]
fn dot_tile<T: DotInput<Acc = f32>, const M: usize, const N: usize, const K: usize>(
    a: &Global<T>,
    b: &Global<T>,
    c: &mut Global<f32>,
) {
    let rm = arange::<M>().expand_dims::<1>();
    let rn = arange::<N>().expand_dims::<0>();
    let rk = arange::<K>();
    let at = a.load_unmasked(rm * (K as i32) + rk.expand_dims::<0>());
    let bt = b.load_unmasked(rk.expand_dims::<1>() * (N as i32) + rn);
    let offs = rm * (N as i32) + rn;
    let acc = c.load_unmasked(offs);
    c.store_unmasked(offs, dot(at, bt, acc));
}

fn dot_case<T: Element + DotInput<Acc = f32>, const M: usize, const N: usize, const K: usize>(
    conv: impl Fn(f32) -> T,
    num_warps: u32,
) where
    dot_tile<T, M, N, K>: Kernel<Comptime = ()>,
{
    let f = ir::<dot_tile<T, M, N, K>>();
    let a: Vec<T> = rand_f32(14, M * K, -1.0, 1.0)
        .into_iter()
        .map(&conv)
        .collect();
    let b: Vec<T> = rand_f32(15, K * N, -1.0, 1.0)
        .into_iter()
        .map(&conv)
        .collect();
    // `c` is read and written: an input here, compared like an output below.
    let c = rand_f32(16, M * N, -1.0, 1.0);
    let reference = [inp(&a), inp(&b), inp(&c)];
    let name = format!(
        "dot {}x{}x{} {:?} ({num_warps} warps)",
        M,
        N,
        K,
        <T as Element>::TY
    );
    let want = make(&reference);
    interp::run(&f, g1(1), &want).unwrap();
    let KernelArg::Buffer(w) = &want[2] else {
        unreachable!()
    };
    let w = values(w);
    for flavor in flavors_for(&f) {
        let got = make(&reference);
        emu::launch(&f, flavor, &CompileOptions::warps(num_warps), g1(1), &got)
            .unwrap_or_else(|e| panic!("{name} on {flavor:?}: {e}"));
        let KernelArg::Buffer(g) = &got[2] else {
            unreachable!()
        };
        for (j, (x, y)) in w.iter().zip(values(g)).enumerate() {
            assert!(
                (x - y).abs() <= 4e-5 * K as f64,
                "{name} on {flavor:?}: element {j}: emu {y}, interpreter {x}"
            );
        }
    }
}

#[test]
fn dot_shapes() {
    dot_case::<f32, 16, 16, 16>(|v| v, 4);
    dot_case::<f16, 16, 8, 16>(f16::from_f32, 1);
    dot_case::<f16, 16, 16, 16>(f16::from_f32, 1);
    dot_case::<f16, 32, 32, 32>(f16::from_f32, 4);
    dot_case::<bf16, 64, 32, 16>(bf16::from_f32, 4);
    dot_case::<f16, 16, 64, 64>(f16::from_f32, 2);
    dot_case::<bf16, 32, 16, 64>(bf16::from_f32, 8);
    // MFMA 32x32x8 on emu-amd: k = 8 (one step), one wave per 32x32 tile, bf16.
    dot_case::<f16, 32, 32, 8>(f16::from_f32, 1);
    dot_case::<bf16, 64, 64, 16>(bf16::from_f32, 4);
    // More waves than 32x32 tiles: 16x16x16 instead.
    dot_case::<f16, 64, 64, 32>(f16::from_f32, 8);
}

/// Runtime `for`/`if`/`while` with carried values (as in `execution.rs`).
#[kernel]
fn control_flow<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32, limit: f32) {
    let lanes = arange::<B>();
    let mut acc = zeros::<f32, S1<B>>();
    for start in (0..n).step_by(B) {
        let offs = start + lanes;
        acc += x.load(offs, offs.lt(n));
    }
    let total = acc.sum::<0>();
    let mut flag = zeros::<f32, ()>();
    if total.gt(limit) {
        flag = flag + 1.0;
    } else {
        flag = flag - 1.0;
    }
    let mut v = total.maximum(1.0);
    let mut steps = zeros::<i32, ()>();
    while v.ge(1.0) {
        v = v * 0.5;
        steps += 1;
    }
    out.store_unmasked(lanes, acc);
    out.store_unmasked(B as i32, flag);
    out.store_unmasked(B as i32 + 1, steps.cast::<f32>());
}

#[test]
fn control_flow_agrees() {
    let f = ir::<control_flow<32>>();
    for (n, limit) in [(0usize, 1.0f32), (31, 1e9), (1000, 100.0)] {
        let args = [
            inp(&rand_f32(17, n.max(1), 0.0, 4.0)),
            out::<f32>(34),
            Arg::Sc(S::I32(n as i32)),
            Arg::Sc(S::F32(limit)),
        ];
        check(&format!("control flow n={n}"), &f, g1(1), &args, 1, 1e-5);
    }
}

/// Histogram with integer atomics, a float atomic sum and an atomic max.
#[kernel]
fn atomics<const B: usize>(
    x: &Global<i32>,
    hist: &mut Global<i32>,
    total: &mut Global<f32>,
    top: &mut Global<i32>,
    n: i32,
) {
    let offs = program_id(0) * B + arange::<B>();
    let m = offs.lt(n);
    let v = x.load(offs, m);
    hist.atomic_add(v % 16, full::<i32, S1<B>>(1), m);
    total.atomic_add(offs * 0, v.cast::<f32>() * 0.5, m);
    top.atomic_max(offs * 0, v, m);
}

#[test]
fn atomics_agree() {
    let n = 700usize;
    let mut r = StdRng::seed_from_u64(18);
    let xs: Vec<i32> = (0..n).map(|_| r.gen_range(0..10000)).collect();
    let f = ir::<atomics<128>>();
    let args = [
        inp(&xs),
        inp(&[0i32; 16]),
        inp(&[0.0f32]),
        inp(&[i32::MIN]),
        Arg::Sc(S::I32(n as i32)),
    ];
    // The atomics' targets are inputs (zeroed); compare them after the launches.
    let want = make(&args);
    interp::run(&f, g1(n.div_ceil(128)), &want).unwrap();
    for flavor in FLAVORS {
        let got = make(&args);
        emu::launch(
            &f,
            flavor,
            &CompileOptions::default(),
            g1(n.div_ceil(128)),
            &got,
        )
        .unwrap_or_else(|e| panic!("atomics on {flavor:?}: {e}"));
        for i in 1..4 {
            let (KernelArg::Buffer(w), KernelArg::Buffer(g)) = (&want[i], &got[i]) else {
                unreachable!()
            };
            let (w, g) = (values(w), values(g));
            for (x, y) in w.iter().zip(&g) {
                assert!(
                    (x - y).abs() <= 1e-6 * x.abs(),
                    "atomics on {flavor:?}: {} {w:?} vs {g:?}",
                    f.params[i].name
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Errors.

#[kernel]
fn overrun<const B: usize>(x: &Global<f32>, out: &mut Global<f32>) {
    let offs = program_id(0) * B + arange::<B>();
    let v = x.load_unmasked(offs); // OVERRUN
    out.store_unmasked(offs, v);
}

#[test]
fn out_of_bounds_names_the_line() {
    let f = ir::<overrun<64>>();
    let line = line_of(include_str!("cross_backend.rs"), "// OVERRUN");
    for flavor in FLAVORS {
        let args = make(&[inp(&[1.0f32; 100]), out::<f32>(128)]);
        let err = emu::launch(&f, flavor, &CompileOptions::default(), g1(2), &args)
            .expect_err("reads past the end of x");
        let msg = err.to_string();
        assert!(
            matches!(&err, EmuError::OutOfBounds { span, buffer, block: [1, 0, 0], index, len: 100, .. }
                if span.line == line && buffer == "x" && *index >= 100),
            "{flavor:?}: {msg}"
        );
        assert!(msg.contains(&format!("cross_backend.rs:{line}:")), "{msg}");
    }
}

/// A counter every thread reads (a uniform scalar load), then the program writes inside
/// an `if` on the value read: every thread of the program must see the value from
/// before the write (the GPU lowering loads once per block and broadcasts).
#[kernel]
fn read_then_bump<const B: usize>(counter: &mut Global<i32>, out: &mut Global<i32>) {
    let at = program_id(0) * 0;
    let yes = at.eq(0);
    let c = counter.load(at, yes);
    let i = arange::<B>();
    if c.eq(0) {
        counter.store(at, c + 1, yes);
        out.store(i, i * 0 + 1, i.lt(B as i32));
    } else {
        out.store(i, i * 0 + 2, i.lt(B as i32));
    }
}

#[test]
fn a_scalar_read_before_the_block_writes_it_is_one_value() {
    let f = ir::<read_then_bump<256>>();
    let args = [inp(&[0i32]), out::<i32>(256)];
    // `counter` is an input buffer copied fresh for every backend, and written.
    check("read then bump", &f, g1(1), &args, 4, 0.0);
    let got = make(&args);
    emu::launch(&f, EmuFlavor::Nv, &CompileOptions::default(), g1(1), &got).expect("launch");
    let (KernelArg::Buffer(c), KernelArg::Buffer(o)) = (&got[0], &got[1]) else {
        unreachable!()
    };
    assert_eq!(c.to_vec::<i32>().expect("i32"), vec![1]);
    assert_eq!(o.to_vec::<i32>().expect("i32"), vec![1; 256]);
}

/// `x / d` elementwise, `d` holding one zero.
#[kernel]
fn divide<const B: usize>(x: &Global<i32>, d: &Global<i32>, out: &mut Global<i32>) {
    let i = arange::<B>();
    let all = i.lt(B as i32);
    let q = x.load(i, all) / d.load(i, all); // DIVIDE
    out.store(i, q, all);
}

/// Integer division by zero has one meaning: the CPU interpreter and the emulator
/// (the GPU lowering) both report it with the op's line; on a GPU it yields 0.
#[test]
fn integer_division_by_zero_is_reported_by_the_interpreter_and_the_emulator() {
    let f = ir::<divide<128>>();
    let line = line_of(include_str!("cross_backend.rs"), "// DIVIDE");
    let mut d: Vec<i32> = (0..128).map(|i| i % 7 + 1).collect();
    d[77] = 0;
    let args = [inp(&vec![84i32; 128]), inp(&d), out::<i32>(128)];
    let err = interp::run(&f, g1(1), &make(&args)).expect_err("divides by zero");
    assert!(
        err.to_string()
            .contains(&format!("cross_backend.rs:{line}:")),
        "{err}"
    );
    for flavor in FLAVORS {
        let got = make(&args);
        let err = emu::launch(&f, flavor, &CompileOptions::default(), g1(1), &got)
            .expect_err("divides by zero");
        assert!(
            matches!(&err, EmuError::DivisionByZero { span, .. } if span.line == line),
            "{flavor:?}: {err}"
        );
        assert!(
            err.to_string().contains("integer division by zero"),
            "{err}"
        );
    }
    // Without the zero, every backend agrees.
    d[77] = 5;
    check(
        "divide",
        &f,
        g1(1),
        &[inp(&vec![84i32; 128]), inp(&d), out::<i32>(128)],
        4,
        0.0,
    );
}

/// `out = xᵀ · 2`: a transpose of a loaded tile, a layout conversion. On one warp it
/// exchanges register and lane bits by warp shuffles; on 4 warps it goes through
/// shared memory (the warps exchange data).
#[kernel]
fn transpose_tile<const R: usize, const C: usize>(x: &Global<f32>, out: &mut Global<f32>) {
    let rows = arange::<R>().expand_dims::<1>();
    let cols = arange::<C>().expand_dims::<0>();
    let t = x.load_unmasked(rows * C as i32 + cols).trans() * 2.0f32;
    let (tr, tc) = (
        arange::<C>().expand_dims::<1>(),
        arange::<R>().expand_dims::<0>(),
    );
    out.store_unmasked(tr * R as i32 + tc, t);
}

#[test]
fn transpose_by_shuffles_and_through_shared_memory() {
    let f = ir::<transpose_tile<16, 32>>();
    let x = rand_f32(11, 16 * 32, -4.0, 4.0);
    let args = [inp(&x), out::<f32>(16 * 32)];
    for warps in [1, 4] {
        check(
            &format!("transpose ({warps} warps)"),
            &f,
            g1(1),
            &args,
            warps,
            0.0,
        );
    }
    // Which path each takes, on both vendors' layouts.
    for (target, warps, want) in [
        ("sm_80", 1, "convert by warp shuffles"),
        ("gfx942", 1, "convert by warp shuffles"),
        ("sm_80", 4, "convert through shared memory"),
    ] {
        let t: tessera::codegen::Target = target.parse().expect("a target");
        let text =
            tessera::codegen::lower::lower_with_layouts(&f, t, &CompileOptions::warps(warps))
                .expect("lowers");
        assert!(
            text.contains(want),
            "{target}, {warps} warps: no `{want}` in\n{text}"
        );
    }
}
