//! Offline validation of the GPU code generated for every example kernel (testing
//! tier 4), without a GPU:
//!
//! - the PTX for sm_80 and sm_90 assembles with `ptxas`, with no register spills;
//! - the HSACO for gfx90a, gfx942 and gfx1100 links and disassembles (`llvm-objdump`);
//! - the f16 matmul uses the matrix units (HMMA/HGMMA in the sm_90 SASS, `v_mfma` on
//!   gfx942);
//! - vector_add with `n` declared divisible by 16 uses 128-bit global accesses;
//! - snapshots of the PTX (sm_90) and AMDGCN assembly (gfx942) of vector_add,
//!   softmax (f32) and matmul (f16). Review a changed snapshot like a code change.
//!
//! The tools come from `bash scripts/setup.sh` (see `tessera::codegen::tools`).

// Each example is included as a module; they share `examples/common`.
#![allow(clippy::duplicate_mod)]

#[path = "../../examples/layernorm.rs"]
#[allow(dead_code)]
mod layernorm;
#[path = "../../examples/matmul.rs"]
#[allow(dead_code)]
mod matmul;
#[path = "../../examples/softmax.rs"]
#[allow(dead_code)]
mod softmax;
#[path = "../../examples/vector_add.rs"]
#[allow(dead_code)]
mod vector_add;

use tessera::aot::{AmdArch, Artifact, CompileOptions, Target, compile_ir, compile_kernel};
use tessera::codegen::tools;
use tessera::kernel_ir;
use tessera::prelude::*;

type Compile = fn(Target) -> Result<Artifact, Error>;

fn compile<K: Kernel<Comptime = ()>>(target: Target) -> Result<Artifact, Error> {
    compile_kernel::<K>(&(), target, &CompileOptions::default())
}

/// Every example kernel, as the examples launch it.
const KERNELS: [(&str, Compile); 6] = [
    ("vector_add", compile::<vector_add::vector_add<1024>>),
    ("softmax_f32", compile::<softmax::softmax<f32, 4, 1024>>),
    ("softmax_f16", compile::<softmax::softmax<f16, 4, 1024>>),
    ("matmul_f32", compile::<matmul::matmul<f32, 64, 64, 32>>),
    ("matmul_f16", compile::<matmul::matmul<f16, 64, 64, 32>>),
    ("layernorm", compile::<layernorm::layernorm<f32, 256>>),
];

const SM80: Target = Target::Nvptx { sm: 80 };
const SM90: Target = Target::Nvptx { sm: 90 };
const GFX942: Target = Target::Amdgpu(AmdArch::Gfx942);

fn build(name: &str, f: Compile, target: Target) -> Artifact {
    f(target).unwrap_or_else(|e| panic!("{name} for {target}: {e}"))
}

fn ptx(art: &Artifact) -> &str {
    &art.asm
}

#[test]
fn ptx_assembles_without_spills() {
    let mut failures = Vec::new();
    for (name, f) in KERNELS {
        for target in [SM80, SM90] {
            let art = build(name, f, target);
            match tools::ptxas(ptx(&art), &target.to_string()) {
                Ok(r) => {
                    println!(
                        "{name} {target}: {} registers, {} B smem, spills {}/{} B",
                        r.registers, r.shared_bytes, r.spill_stores_bytes, r.spill_loads_bytes
                    );
                    if r.spill_stores_bytes + r.spill_loads_bytes != 0 {
                        failures.push(format!("{name} {target} spills:\n{}", r.log));
                    }
                }
                Err(e) => failures.push(format!("{name} {target}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn hsaco_links_and_disassembles() {
    let mut failures = Vec::new();
    for (name, f) in KERNELS {
        for arch in [AmdArch::Gfx90a, AmdArch::Gfx942, AmdArch::Gfx1100] {
            let art = build(name, f, Target::Amdgpu(arch));
            let label = format!("{name} {}", arch.name());
            if !art.binary.starts_with(b"\x7fELF") {
                failures.push(format!("{label}: the HSACO is not an ELF file"));
                continue;
            }
            match tools::amdgpu_disasm(&art.binary, arch) {
                Ok(dis) if dis.contains("s_endpgm") && dis.contains(&art.meta.name) => {}
                Ok(dis) => failures.push(format!("{label}: unexpected disassembly:\n{dis}")),
                Err(e) => failures.push(format!("{label}: {e}")),
            }
            match tools::amdgpu_resources(&art.binary) {
                Ok(res) => println!("{label}: {res:?}"),
                Err(e) => failures.push(format!("{label}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn matmul_f16_uses_the_matrix_units() {
    let f = compile::<matmul::matmul<f16, 64, 64, 32>>;
    let art = build("matmul_f16", f, SM90);
    let report = tools::ptxas(ptx(&art), "sm_90").expect("ptxas");
    let sass = tools::sass(&report.cubin).expect("cuobjdump");
    assert!(
        sass.contains("HMMA") || sass.contains("HGMMA"),
        "no HMMA/HGMMA in the sm_90 SASS:\n{sass}"
    );
    let art = build("matmul_f16", f, GFX942);
    let dis = tools::amdgpu_disasm(&art.binary, AmdArch::Gfx942).expect("llvm-objdump");
    assert!(dis.contains("v_mfma"), "no v_mfma on gfx942:\n{dis}");
}

/// With `n` declared a multiple of 16 (and the pointers 16-byte aligned), every
/// thread's contiguous f32 elements move as 128-bit accesses.
#[test]
fn vector_add_uses_128_bit_accesses() {
    let mut func = (*kernel_ir::<vector_add::vector_add<1024>>(&()).expect("builds")).clone();
    for i in 0..func.params.len() {
        let is_ptr = func.ty(func.params[i].value).elem.is_ptr();
        let p = &mut func.params[i];
        if is_ptr || p.name == "n" {
            p.attrs.divisibility = Some(16);
        }
    }
    assert!(func.params.iter().any(|p| p.name == "n"));
    let art = compile_ir(&func, SM90, &CompileOptions::default()).expect("compiles");
    let wide = |op: &str| {
        art.asm.lines().any(|l| {
            let l = l.trim();
            l.starts_with(op) && l.contains(".v4.") && (l.contains("32") || l.contains("f32"))
        })
    };
    assert!(wide("ld.global"), "no ld.global.v4 in:\n{}", art.asm);
    assert!(wide("st.global"), "no st.global.v4 in:\n{}", art.asm);
    tools::ptxas(&art.asm, "sm_90").expect("assembles");
}

/// The assembly without what changes from machine to machine or LLVM build to LLVM
/// build: `.ident` and LLVM version comments, temp paths, and long hex hashes.
fn stable(asm: &str) -> String {
    let mut out = String::with_capacity(asm.len());
    for line in asm.lines() {
        let t = line.trim_start();
        let comment = t.starts_with("//") || t.starts_with(';');
        if t.starts_with(".ident")
            || (comment && (t.contains("LLVM version") || t.contains("clang version")))
            || line.contains("/tmp/")
        {
            continue;
        }
        out.push_str(&mask_hashes(line));
        out.push('\n');
    }
    out
}

/// Replaces runs of 16 or more hex digits with `<hash>`.
fn mask_hashes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.len() >= 16 && run.chars().any(|c| c.is_ascii_digit()) {
            out.push_str("<hash>");
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in line.chars() {
        if c.is_ascii_hexdigit() {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

#[test]
fn snapshot_filter() {
    let text = ".ident \"x\"\n// LLVM version 22\n  mov.u32 %r1, 0;\nk_0123456789abcdef01:\n";
    assert_eq!(stable(text), "  mov.u32 %r1, 0;\nk_<hash>:\n");
}

#[test]
fn ptx_snapshots_sm90() {
    insta::assert_snapshot!(
        "ptx_sm90_vector_add",
        stable(&build("vector_add", KERNELS[0].1, SM90).asm)
    );
    insta::assert_snapshot!(
        "ptx_sm90_softmax_f32",
        stable(&build("softmax_f32", KERNELS[1].1, SM90).asm)
    );
    insta::assert_snapshot!(
        "ptx_sm90_matmul_f16",
        stable(&build("matmul_f16", KERNELS[4].1, SM90).asm)
    );
}

#[test]
fn amdgcn_snapshots_gfx942() {
    insta::assert_snapshot!(
        "amdgcn_gfx942_vector_add",
        stable(&build("vector_add", KERNELS[0].1, GFX942).asm)
    );
    insta::assert_snapshot!(
        "amdgcn_gfx942_softmax_f32",
        stable(&build("softmax_f32", KERNELS[1].1, GFX942).asm)
    );
    insta::assert_snapshot!(
        "amdgcn_gfx942_matmul_f16",
        stable(&build("matmul_f16", KERNELS[4].1, GFX942).asm)
    );
}
