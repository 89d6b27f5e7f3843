//! Launch specialization and hints (#17 item 7): integer arguments equal to 1 become
//! constants, as in Triton, so a tutorial-style matmul with runtime strides gets
//! 16-byte loads when its unit strides are 1; `multiple_of`/`max_contiguous` make
//! `% n`-wrapped offsets vectorizable; `#[no_specialize]` opts a parameter out.
//!
//! The codegen checks compile for sm_80 and gfx942 with the facts a launch records
//! and read the PTX and AMDGCN; each has a baseline that must not vectorize (the same
//! kernel without the fact or the hint), so the tests fail when the specialization or
//! the hint stops reaching the axis analysis. The execution checks run the strided
//! matmul on the CPU and both emulators (whose launches specialize like a GPU's) with
//! unit and non-unit strides against a plain-Rust reference.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::EmuKind;
use tessera::aot::{AmdArch, CompileOptions, Target, compile_ir};
use tessera::ir::{Function, ParamFacts};
use tessera::kernel_ir;
use tessera::prelude::*;

/// Triton's tutorial 03 matmul, Tessera style: `C = A · B` with every stride a
/// runtime argument and the operand rows/columns wrapped with `% m` / `% n` (so
/// every load is in bounds); `HINT` promises that each program's `BN` columns are
/// consecutive and start at a multiple of `BN` (true when `n` is a multiple of `BN`;
/// `HINT = 1` promises nothing).
#[kernel]
#[allow(clippy::too_many_arguments)]
fn matmul_strided<const BM: usize, const BN: usize, const BK: usize, const HINT: usize>(
    a: &Global<f16>,
    b: &Global<f16>,
    c: &mut Global<f16>,
    m: i32,
    n: i32,
    k: i32,
    stride_am: i32,
    stride_ak: i32,
    stride_bk: i32,
    stride_bn: i32,
    stride_cm: i32,
    stride_cn: i32,
) {
    let offs_am = ((program_id(0) * BM + arange::<BM>()) % m).expand_dims::<1>();
    let offs_bn = ((program_id(1) * BN + arange::<BN>()) % n)
        .multiple_of(HINT as u32)
        .max_contiguous(HINT as u32)
        .expand_dims::<0>();
    let rk = arange::<BK>();
    let (k_col, k_row) = (rk.expand_dims::<0>(), rk.expand_dims::<1>());
    let a_off = offs_am * stride_am + k_col * stride_ak;
    let b_off = k_row * stride_bk + offs_bn * stride_bn;
    let mut acc = zeros::<f32, S2<BM, BN>>();
    for k0 in (0..k).step_by(BK) {
        // Masks of one row / one column, broadcast against the offsets.
        let a_t = a.load(a_off + k0 * stride_ak, k_col.lt(k - k0));
        let b_t = b.load(b_off + k0 * stride_bk, k_row.lt(k - k0));
        acc = dot(a_t, b_t, acc);
    }
    let rm = (program_id(0) * BM + arange::<BM>()).expand_dims::<1>();
    let rn = (program_id(1) * BN + arange::<BN>()).expand_dims::<0>();
    c.store(
        rm * stride_cm + rn * stride_cn,
        acc.cast::<f16>(),
        rm.lt(m) & rn.lt(n),
    );
}

/// `y[i] = x[i * stride]` for `i < n`.
#[kernel]
fn gather_strided<const B: usize>(x: &Global<f32>, y: &mut Global<f32>, n: i32, stride: i32) {
    let i = program_id(0) * B + arange::<B>();
    y.store(i, x.load(i * stride, i.lt(n)), i.lt(n));
}

/// [`gather_strided`] with the stride opted out of specialization.
#[kernel]
fn gather_unspecialized<const B: usize>(
    x: &Global<f32>,
    y: &mut Global<f32>,
    n: i32,
    #[no_specialize] stride: i32,
) {
    let i = program_id(0) * B + arange::<B>();
    y.store(i, x.load(i * stride, i.lt(n)), i.lt(n));
}

const SM80: Target = Target::nvptx(80);
const GFX942: Target = Target::Amdgpu(AmdArch::Gfx942);

/// The facts of a launch with aligned buffers and these integer arguments (the
/// runtime's rule: multiples of 16, and 1).
fn launch_facts(f: &Function, ints: &[i64], ones: bool) -> Vec<ParamFacts> {
    let mut ints = ints.iter();
    f.params
        .iter()
        .map(|p| {
            if f.ty(p.value).elem.is_ptr() {
                ParamFacts::new(true, true)
            } else {
                let v = *ints.next().expect("one value per integer parameter");
                let mut facts = ParamFacts::of_int(v.into());
                facts.equal_to_one &= ones;
                facts
            }
        })
        .collect()
}

/// The row-major strides of the matmul at `m x n x k`: `m, n, k, lda, 1, ldb, 1, ldc, 1`.
fn row_major(m: i64, n: i64, k: i64) -> [i64; 9] {
    [m, n, k, k, 1, n, 1, n, 1]
}

/// The global loads of `asm` by width: how many move 16 bytes per instruction and
/// how many move less. PTX: `cp.async` copies (`cp-size` is the third operand) and
/// `ld.global` (`.v4.b32` is 16 bytes); AMDGCN: `global_load_*`/`buffer_load_*`
/// (`dwordx4` is 16 bytes).
fn load_widths(asm: &str, amd: bool) -> (usize, usize) {
    let (mut wide, mut narrow) = (0, 0);
    for l in asm.lines().map(str::trim) {
        let is_wide = if amd {
            if !(l.starts_with("global_load") || l.starts_with("buffer_load")) {
                continue;
            }
            l.contains("dwordx4") || l.contains("b128")
        } else if l.starts_with("cp.async.") && l.contains(".shared.global") {
            l.split(',').nth(2).map(str::trim) == Some("16")
        } else if l.starts_with("ld.global") {
            l.contains(".v4.b32") || l.contains(".v2.b64")
        } else {
            continue;
        };
        if is_wide {
            wide += 1;
        } else {
            narrow += 1;
        }
    }
    (wide, narrow)
}

/// With unit strides specialized to 1 (and the column hint), every global load of
/// the tutorial-style matmul is 16 bytes wide on sm_80 and gfx942; the same launch
/// without the specialization of 1 has none, and without the hint B's loads stay
/// narrow.
#[test]
fn unit_strides_and_hints_give_16_byte_accesses() {
    let hinted = kernel_ir::<matmul_strided<64, 64, 32, 64>>(&()).expect("builds");
    let unhinted = kernel_ir::<matmul_strided<64, 64, 32, 1>>(&()).expect("builds");
    let ints = row_major(256, 256, 256);
    for target in [SM80, GFX942] {
        let amd = target == GFX942;
        let compile = |f: &Function, ones: bool| {
            let spec = tessera::ir::passes::specialize(f, &launch_facts(f, &ints, ones));
            compile_ir(&spec, target, &CompileOptions::default()).expect("compiles")
        };
        let art = compile(&hinted, true);
        let (wide, narrow) = load_widths(&art.asm, amd);
        assert!(wide > 0, "{target:?}: no 16-byte loads\n{}", art.asm);
        assert_eq!(narrow, 0, "{target:?}: narrower loads left\n{}", art.asm);
        if !amd {
            tessera::codegen::tools::ptxas(&art.asm, "sm_80").expect("ptxas accepts");
        }

        // Strides unknown: nothing is contiguous.
        let art = compile(&hinted, false);
        let (wide, narrow) = load_widths(&art.asm, amd);
        assert_eq!(
            wide, 0,
            "{target:?}: 16-byte loads without the unit strides"
        );
        assert!(narrow > 0, "{target:?}: no loads\n{}", art.asm);

        // No hint: `% n` hides the columns' contiguity, so B's loads stay narrow.
        let art = compile(&unhinted, true);
        let (wide, narrow) = load_widths(&art.asm, amd);
        assert!(
            wide > 0 && narrow > 0,
            "{target:?}: {wide} wide, {narrow} narrow"
        );
    }
}

/// The specialization rewrites a parameter equal to 1 into the constant and records
/// it in the IR (so the kernel has its own cache key); `#[no_specialize]` keeps the
/// parameter a runtime value and records no value facts.
#[test]
fn equal_to_one_is_a_constant_unless_opted_out() {
    use tessera::ir::printer::print_function;
    let spec = kernel_ir::<gather_strided<1024>>(&()).expect("builds");
    let facts = launch_facts(&spec, &[1024, 1], true);
    let s = tessera::ir::passes::specialize(&spec, &facts);
    let text = print_function(&s);
    assert!(text.contains("equal_to_1"), "{text}");
    let stride = s.params[3].value;
    let mut uses = 0;
    s.walk(&mut |op| uses += op.operands.iter().filter(|&&o| o == stride).count());
    assert_eq!(uses, 0, "the stride is still read:\n{text}");
    // Multiplying by the constant 1 is folded away.
    let muls = |f: &Function| {
        let mut n = 0;
        f.walk(&mut |op| {
            n += usize::from(matches!(
                op.kind,
                tessera::ir::OpKind::Binary(tessera::ir::ir::BinaryOp::Mul)
            ))
        });
        n
    };
    assert_eq!(muls(&s) + 1, muls(&spec), "{text}");
    let art = compile_ir(&s, SM80, &CompileOptions::default()).expect("compiles");
    assert!(art.asm.contains("ld.global.v4"), "{}", art.asm);

    let opted = kernel_ir::<gather_unspecialized<1024>>(&()).expect("builds");
    assert!(print_function(&opted).contains("no_specialize"));
    let s = tessera::ir::passes::specialize(&opted, &launch_facts(&opted, &[1024, 16], true));
    let text = print_function(&s);
    assert!(!text.contains("equal_to_1"), "{text}");
    assert!(
        !text.contains("div=16, no_specialize") && text.contains("%n: i32 {div=16}"),
        "{text}"
    );
    let s = tessera::ir::passes::specialize(&opted, &launch_facts(&opted, &[1024, 1], true));
    assert!(!print_function(&s).contains("equal_to_1"));
    let art = compile_ir(&s, SM80, &CompileOptions::default()).expect("compiles");
    assert!(!art.asm.contains("ld.global.v4"), "{}", art.asm);
}

/// `C = A · B` from strided f16 storage, in f64.
struct Strided<'a> {
    data: &'a [f16],
    rows: usize,
    cols: usize,
    stride_r: usize,
    stride_c: usize,
}

impl Strided<'_> {
    fn at(&self, r: usize, c: usize) -> f64 {
        assert!(r < self.rows && c < self.cols);
        self.data[r * self.stride_r + c * self.stride_c].to_f64()
    }
}

/// The strided matmul on the CPU and both emulators: row-major operands (unit
/// strides, specialized to 1), a padded A with a column-major B (no unit stride on
/// B's columns), and a column-major C; every element of C checked, poisoned first.
#[test]
fn strided_matmul_matches_the_reference_on_every_backend() {
    const BM: usize = 64;
    const BN: usize = 64;
    let (m, n, k) = (72usize, 128usize, 80usize);
    let mut rng = StdRng::seed_from_u64(17);
    let mut random = |len: usize| -> Vec<f16> {
        (0..len)
            .map(|_| f16::from_f32(rng.gen_range(-1.0f32..1.0)))
            .collect()
    };
    // (lda, a col stride, B row stride, B col stride, C row stride, C col stride).
    let layouts = [
        ("row-major", [k, 1, n, 1, n, 1]),
        ("padded A, column-major B and C", [k + 16, 1, 1, k, 1, m]),
    ];
    let mut devs = vec![Device::cpu()];
    for kind in [EmuKind::Nv, EmuKind::Amd] {
        devs.push(Device::emu(kind).expect("emulator"));
    }
    for (what, [sam, sak, sbk, sbn, scm, scn]) in layouts {
        let a = random((m - 1) * sam + (k - 1) * sak + 1);
        let b = random((k - 1) * sbk + (n - 1) * sbn + 1);
        let c_len = (m - 1) * scm + (n - 1) * scn + 1;
        let a_v = Strided {
            data: &a,
            rows: m,
            cols: k,
            stride_r: sam,
            stride_c: sak,
        };
        let b_v = Strided {
            data: &b,
            rows: k,
            cols: n,
            stride_r: sbk,
            stride_c: sbn,
        };
        for dev in &devs {
            let (da, db) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
            let mut dc = dev.upload(&vec![f16::NAN; c_len]).unwrap();
            let i = |v: usize| v as i32;
            matmul_strided::<BM, BN, 32, BN>::launch(
                dev,
                (m.div_ceil(BM) as u32, n.div_ceil(BN) as u32),
                (
                    &da,
                    &db,
                    &mut dc,
                    i(m),
                    i(n),
                    i(k),
                    i(sam),
                    i(sak),
                    i(sbk),
                    i(sbn),
                    i(scm),
                    i(scn),
                ),
            )
            .unwrap_or_else(|e| panic!("{what} on {dev:?}: {e}"));
            let c = dc.download().unwrap();
            let mut got = Vec::new();
            let mut want = Vec::new();
            let mut mag = Vec::new();
            for r in 0..m {
                for col in 0..n {
                    got.push(c[r * scm + col * scn].to_f64());
                    let (mut s, mut g) = (0.0, 0.0);
                    for p in 0..k {
                        let t = a_v.at(r, p) * b_v.at(p, col);
                        s += t;
                        g += t.abs();
                    }
                    want.push(s);
                    mag.push(g);
                }
            }
            // f32 accumulation, then one rounding to f16.
            tessera_tests::assert_close(&format!("{what} on {dev:?}"), &got, &want, |e| {
                mag[e] * 1e-5 + want[e].abs() * 1e-3 + 1e-4
            });
        }
    }
}

/// A contiguity promised past the tile's size.
#[kernel]
fn bad_hint(x: &mut Global<i32>) {
    let i = arange::<64>().max_contiguous(128); // BAD_HINT
    x.store_unmasked(i, i);
}

/// A hint with one value too many for its rank.
#[kernel]
fn bad_hint_rank(x: &mut Global<i32>) {
    let i = arange::<64>().multiple_of([16, 16]); // BAD_RANK
    x.store_unmasked(i, i);
}

/// Impossible hints are build errors at the user's line, not wrong code.
#[test]
fn impossible_hints_are_errors_at_the_call() {
    let src = include_str!("specialize.rs");
    for (e, marker, what) in [
        (
            kernel_ir::<bad_hint>(&()).unwrap_err(),
            "// BAD_HINT",
            "exceeds the dimension's size 64",
        ),
        (
            kernel_ir::<bad_hint_rank>(&()).unwrap_err(),
            "// BAD_RANK",
            "one value per dimension",
        ),
    ] {
        let msg = e.to_string();
        let line = tessera_tests::line_of(src, marker);
        assert!(msg.contains(what), "{msg}");
        assert!(msg.contains(&format!("specialize.rs:{line}:")), "{msg}");
    }
}
