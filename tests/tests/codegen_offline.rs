//! Offline validation of the GPU code generated for every example kernel (testing
//! tier 4), without a GPU:
//!
//! - the PTX for sm_80 and sm_90 assembles with `ptxas`, with no register spills;
//!   so does that of every kernel the `aot` example compiles (`examples/aot_jobs.rs`),
//!   for every NVIDIA target it takes (sm_80, sm_86, sm_89, sm_90, sm_90a);
//! - the HSACO for gfx90a, gfx942 and gfx1100 links and disassembles (`llvm-objdump`);
//! - the f16 matmul uses the matrix units (HMMA/HGMMA in the sm_90 SASS, `v_mfma` on
//!   gfx942);
//! - vector_add with `n` declared divisible by 16 uses 128-bit global accesses;
//! - snapshots of the PTX (sm_90) and AMDGCN assembly (gfx942) of vector_add,
//!   softmax (f32) and matmul (f16). Review a changed snapshot like a code change;
//! - communicating kernels: one using every primitive compiles for sm_80, sm_90,
//!   gfx90a, gfx942 and gfx1100 (PTX assembles without spills, HSACO links), and the
//!   release/acquire sequences of `signal`, `wait_until` and `barrier_all` are what
//!   the memory models need (snapshots of a small put/signal/wait/barrier kernel).
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

/// Every communication primitive: rank/world_size, remote loads, stores and atomics,
/// put_signal, signal (set/add, device scope), wait_until (system and device scope),
/// fence, quiet, barrier_all.
#[kernel]
fn comm_all<const B: usize>(
    data: &mut Symmetric<f32>,
    sig: &mut Symmetric<u64>,
    counter: &mut Symmetric<u32>,
    out: &mut Global<f32>,
) {
    let me = rank();
    let n = world_size();
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let offs = arange::<B>();
    let all = offs.lt(B as i32);
    let v = data.load(offs, all);
    data.put_signal(right, offs, v * 2.0f32, all, sig, 0, 1u64, SignalOp::Set);
    let t = sig.wait_until(0, CmpPred::Ge, 1u64);
    let got = data.get(left, offs, all);
    out.store(offs, got + t.value().cast::<f32>(), all);
    let mut c = counter.on(0);
    c.atomic_add(0, zeros::<u32, ()>() + 1u32, me.ge(0));
    // System scope (another GPU's memory): the atom itself must be `.sys`.
    c.atomic_rmw(
        AtomicOp::Max,
        1,
        me.cast::<u32>(),
        me.ge(0),
        MemOrder::AcqRel,
        MemScope::System,
    );
    let mut sig_left = sig.on(left);
    let old = sig_left.atomic_cas(2, zeros::<u64, ()>(), zeros::<u64, ()>() + 5u64, me.ge(0));
    out.store(0, old.cast::<f32>(), me.ge(0));
    fence(MemOrder::Release, MemScope::System);
    quiet();
    sig.signal_with(
        left,
        1,
        1u64,
        SignalOp::Add,
        MemOrder::Release,
        MemScope::Device,
    );
    sig.wait_until_with(1, CmpPred::Eq, 1u64, MemScope::Device);
    barrier_all();
}

/// A small communicating kernel for the snapshots: put_signal, wait_until,
/// barrier_all.
#[kernel]
fn comm_small<const B: usize>(data: &mut Symmetric<f32>, sig: &mut Symmetric<u64>) {
    let offs = arange::<B>();
    let all = offs.lt(B as i32);
    let peer = (rank() + 1) % world_size();
    let v = data.load(offs, all);
    data.put_signal(peer, offs, v, all, sig, 0, 1u64, SignalOp::Set);
    sig.wait_until(0, CmpPred::Ge, 1u64);
    barrier_all();
}

const COMM_KERNELS: [(&str, Compile); 5] = [
    ("comm_all", compile::<comm_all<128>>),
    ("comm_small", compile::<comm_small<128>>),
    // The fused plans' kernels, at the tiles they launch with (the matmul's path).
    (
        "ag_gemm_f16",
        compile::<
            tessera::fused::ag_gemm_kernel<
                f16,
                { tessera::fused::BM },
                { tessera::fused::BN },
                { tessera::fused::BK },
            >,
        >,
    ),
    (
        "gemm_rs_f16",
        compile::<
            tessera::fused::gemm_rs_kernel<
                f16,
                { tessera::fused::BM },
                { tessera::fused::BN },
                { tessera::fused::BK },
            >,
        >,
    ),
    (
        "sp_attention_f16",
        compile::<
            tessera::sp_attention::sp_attention_kernel<
                f16,
                { tessera::sp_attention::BM },
                { tessera::sp_attention::BN },
                64,
            >,
        >,
    ),
];

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

const SM80: Target = Target::nvptx(80);
const SM90: Target = Target::nvptx(90);
const SM90A: Target = Target::SM90A;
const SM89: Target = Target::nvptx(89);
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
        for target in [SM80, SM90, SM90A] {
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

#[path = "../../examples/aot_jobs.rs"]
mod aot_jobs;

/// Compiles every kernel the `aot` example compiles (its job list,
/// `examples/aot_jobs.rs`) as it compiles them by default (each job's warps, else the
/// default; launches specialized as all-divisible) for each of `targets`, one thread
/// per target, and gives each artifact to `check`; returns every failure.
fn each_aot_kernel(
    targets: &[Target],
    check: impl Fn(&str, Target, &Artifact) -> Vec<String> + Sync,
) -> Vec<String> {
    use tessera::aot::Specialization;
    std::thread::scope(|s| {
        let runs: Vec<_> = targets
            .iter()
            .map(|&target| {
                let check = &check;
                s.spawn(move || {
                    let mut failures = Vec::new();
                    for (name, warps, compile, _, _, _) in
                        aot_jobs::JOBS.iter().filter(|j| (j.5)(target))
                    {
                        let opts = CompileOptions {
                            num_warps: warps.unwrap_or(CompileOptions::default().num_warps),
                            ..CompileOptions::default()
                        };
                        match compile(&Specialization::AllDivisible, target, &opts) {
                            Ok(art) => failures.extend(check(name, target, &art)),
                            Err(e) => failures.push(format!("{name} {target}: {e}")),
                        }
                    }
                    failures
                })
            })
            .collect();
        runs.into_iter()
            .flat_map(|r| r.join().expect("a target's thread"))
            .collect()
    })
}

/// Every kernel the `aot` example compiles, for every NVIDIA target it takes: the PTX
/// assembles with no register spills (the fp8 128x128x128 GEMM included, whose f16
/// operand tiles once spilled on sm_80, sm_86 and sm_90).
#[test]
fn every_aot_kernel_assembles_without_spills_on_every_nvidia_target() {
    let targets: Vec<Target> = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"]
        .iter()
        .map(|t| t.parse().expect("a target"))
        .collect();
    // About 250 kernels, compiled and assembled.
    let failures = each_aot_kernel(&targets, |name, target, art| {
        match tools::ptxas(ptx(art), &target.to_string()) {
            Ok(r) => {
                println!(
                    "{name} {target}: {} registers, {} B smem, spills {}/{} B",
                    r.registers, r.shared_bytes, r.spill_stores_bytes, r.spill_loads_bytes
                );
                if r.spill_stores_bytes + r.spill_loads_bytes != 0 {
                    vec![format!("{name} {target} spills:\n{}", r.log)]
                } else {
                    Vec::new()
                }
            }
            Err(e) => vec![format!("{name} {target}: {e}")],
        }
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every kernel the `aot` example compiles, for every AMD target it takes (gfx950 and
/// RDNA3/RDNA4 included: `aot --target gfx950`, `gfx1100`, `gfx1200` compile every
/// example, collective and fused kernel): the code object links, is version 5, and
/// uses no scratch memory (no spilled VGPRs) — but for the tiles in `WAVE32_SPILLS`
/// on RDNA.
#[test]
fn every_aot_kernel_links_without_scratch_on_every_amd_target() {
    /// The jobs whose warps were chosen for 64-lane waves (CDNA) and 32-lane warps with
    /// one register fragment per operand (NVIDIA): on RDNA a warp has 32 lanes, so
    /// each lane holds twice the accumulator of a CDNA lane, and RDNA3's WMMA takes
    /// A and B whole in each half-wave (16 elements a lane, twice mma.sync's): they
    /// need more than the 256 VGPRs a lane has. (The loop-table tiles, 128x128x32 on
    /// 4 warps and 128x128x64 on 8, fit on RDNA4.)
    const WAVE32_SPILLS: [(&str, &[AmdArch]); 4] = [
        ("matmul_f16_128x128x32", &[AmdArch::Gfx1100]),
        (
            "matmul_f16_128x256x64",
            &[AmdArch::Gfx1100, AmdArch::Gfx1200, AmdArch::Gfx1201],
        ),
        (
            "attention_fwd_128x64",
            &[AmdArch::Gfx1100, AmdArch::Gfx1200, AmdArch::Gfx1201],
        ),
        // (RDNA4 takes the bytes as they are; RDNA3 multiplies them as f16 tiles.)
        ("matmul_fp8_bt_128x128x128", &[AmdArch::Gfx1100]),
    ];
    let targets = AmdArch::ALL.map(Target::Amdgpu);
    let failures = each_aot_kernel(&targets, |name, target, art| {
        let label = format!("{name} {target}");
        let mut failures = Vec::new();
        match tools::amdgpu_code_object_version(&art.binary) {
            Ok(5) => {}
            Ok(v) => failures.push(format!("{label}: code object v{v}")),
            Err(e) => failures.push(format!("{label}: {e}")),
        }
        match tools::amdgpu_resources(&art.binary) {
            Ok(res) => {
                for r in res {
                    println!("{label}: {r:?}");
                    // (Spilled SGPRs go to VGPR lanes, not memory.)
                    let spills = r.scratch_bytes + r.vgpr_spills != 0;
                    let expected = WAVE32_SPILLS
                        .iter()
                        .any(|(n, a)| *n == name && a.iter().any(|&a| Target::Amdgpu(a) == target));
                    if spills != expected {
                        failures.push(format!("{label}: {r:?} (spills expected: {expected})"));
                    }
                }
            }
            Err(e) => failures.push(format!("{label}: {e}")),
        }
        failures
    });
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn hsaco_links_and_disassembles() {
    let mut failures = Vec::new();
    for (name, f) in KERNELS {
        for arch in AmdArch::ALL {
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

#[test]
fn comm_kernels_assemble_and_link() {
    let mut failures = Vec::new();
    for (name, f) in COMM_KERNELS {
        for target in [SM80, SM90, SM90A] {
            let art = build(name, f, target);
            // The fused plans' GEMMs take the warpgroup instructions on sm_90a.
            if target == SM90A
                && (name.contains("gemm") || name.contains("attention"))
                && !art.asm.contains("wgmma.mma_async")
            {
                failures.push(format!("{name} {target}: no wgmma"));
            }
            match tools::ptxas(ptx(&art), &target.to_string()) {
                Ok(r) if r.spill_stores_bytes + r.spill_loads_bytes != 0 => {
                    failures.push(format!("{name} {target} spills:\n{}", r.log))
                }
                Ok(r) => println!("{name} {target}: {} registers", r.registers),
                Err(e) => failures.push(format!("{name} {target}: {e}")),
            }
        }
        for arch in AmdArch::ALL {
            let art = build(name, f, Target::Amdgpu(arch));
            let label = format!("{name} {}", arch.name());
            match tools::amdgpu_disasm(&art.binary, arch) {
                Ok(dis) if dis.contains("s_endpgm") && dis.contains(&art.meta.name) => {}
                Ok(dis) => failures.push(format!("{label}: unexpected disassembly:\n{dis}")),
                Err(e) => failures.push(format!("{label}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The first line at or after `from` that contains `pat` (its index).
fn find_from(lines: &[&str], from: usize, pat: &str) -> Option<usize> {
    (from..lines.len()).find(|&i| lines[i].contains(pat))
}

#[test]
fn comm_release_acquire_sequences_ptx() {
    let art = build("comm_all", COMM_KERNELS[0].1, SM90);
    let asm = &art.asm;
    // Hidden parameters after the user's four.
    assert!(asm.contains("comm_all_param_7"), "no hidden params:\n{asm}");
    // System-scope signal: every thread fences, block barrier, one release atomic.
    let lines: Vec<&str> = asm.lines().collect();
    let fence = find_from(&lines, 0, "fence.acq_rel.sys").expect("fence.acq_rel.sys");
    let bar = find_from(&lines, fence, "bar.sync").expect("bar.sync after the fence");
    let atom = find_from(&lines, bar, "atom.release.sys").expect("atom.release.sys after bar");
    assert!(fence < bar && bar < atom);
    // Acquire polling and the timer.
    assert!(asm.contains("ld.acquire.sys"), "no acquire load:\n{asm}");
    assert!(asm.contains("%globaltimer"), "no globaltimer:\n{asm}");
    assert!(asm.contains("nanosleep.u32"), "no back-off:\n{asm}");
    // Device-scope signal and wait.
    assert!(
        asm.contains("fence.acq_rel.gpu"),
        "no device-scope fence:\n{asm}"
    );
    assert!(
        asm.contains(".release.gpu"),
        "no device-scope release:\n{asm}"
    );
    assert!(
        asm.contains("ld.acquire.gpu"),
        "no device-scope acquire:\n{asm}"
    );
    // A bad peer traps.
    assert!(asm.contains("trap;"), "no trap:\n{asm}");
    // The remote `atomic_add` (acq_rel, device): LLVM emits a relaxed `atom`, so the
    // lowering brackets it with device-scope fences.
    let add = find_from(&lines, 0, "atom.global.add.u32").expect("the remote atomic_add");
    assert!(
        lines[add.saturating_sub(16)..add]
            .iter()
            .any(|l| l.contains("fence.acq_rel.gpu")),
        "no release fence before the atomic:\n{asm}"
    );
    let after = find_from(&lines, add, "fence.acq_rel.gpu").expect("acquire fence after");
    assert!(after - add < 8, "{asm}");
    // The system-scope remote max is a `.sys` atom (LLVM would emit `.gpu`), bracketed
    // by system fences; the remote CAS (device scope) stays LLVM's, which keeps its
    // ordering and scope.
    let max = find_from(&lines, 0, "atom.relaxed.sys.global.max.u32")
        .expect("a .sys atom for the system-scope atomic max");
    assert!(
        lines[max.saturating_sub(16)..max]
            .iter()
            .any(|l| l.contains("fence.acq_rel.sys")),
        "no system release fence before the .sys atom:\n{asm}"
    );
    assert!(
        find_from(&lines, max, "fence.acq_rel.sys").is_some_and(|f| f - max < 8),
        "no system acquire fence after the .sys atom:\n{asm}"
    );
    assert!(
        asm.contains("atom.acq_rel.gpu.global.cas.b64"),
        "no device-scope CAS:\n{asm}"
    );
}

#[test]
fn comm_release_acquire_sequences_amdgcn() {
    let art = build("comm_small", COMM_KERNELS[1].1, GFX942);
    let lines: Vec<&str> = art.asm.lines().collect();
    // Signal: every wave drains its stores (vmcnt(0)) before the workgroup barrier,
    // and one release atomic follows it.
    let wait = find_from(&lines, 0, "s_waitcnt vmcnt(0)").expect("s_waitcnt vmcnt(0)");
    let bar = find_from(&lines, wait, "s_barrier").expect("s_barrier after the waitcnt");
    let atom = find_from(&lines, bar, "global_atomic_swap_x2").expect("swap after the barrier");
    assert!(wait < bar && bar < atom, "{}", art.asm);
    // The writeback of the system-scope release (gfx942: buffer_wbl2 sc0 sc1).
    assert!(
        lines[..atom]
            .iter()
            .any(|l| l.contains("buffer_wbl2 sc0 sc1")),
        "no system-scope writeback before the release:\n{}",
        art.asm
    );
    // The wait's system-scope acquire (AMDGPUUsage, "Memory Model GFX942"): the
    // polling load bypasses the caches (`sc0 sc1`) and is followed by the
    // system-scope invalidate `buffer_inv sc0 sc1` before anything else is read.
    let poll = lines
        .iter()
        .position(|l| l.contains("global_load_dwordx2") && l.trim_end().ends_with("sc0 sc1"))
        .unwrap_or_else(|| panic!("no system-scope polling load:\n{}", art.asm));
    let inv = find_from(&lines, poll, "buffer_inv sc0 sc1").expect("buffer_inv after the poll");
    assert!(
        lines[poll + 1..inv]
            .iter()
            .all(|l| !l.contains("global_load") && !l.contains("s_load")),
        "a load between the acquire and its invalidate:\n{}",
        lines[poll..=inv].join("\n")
    );
    // Polling with the 100 MHz realtime counter.
    assert!(
        art.asm.contains("s_memrealtime") && art.asm.contains("s_sleep"),
        "no s_memrealtime or s_sleep:\n{}",
        art.asm
    );
}

#[test]
fn comm_snapshots() {
    insta::assert_snapshot!(
        "ptx_sm90_comm_small",
        stable(&build("comm_small", COMM_KERNELS[1].1, SM90).asm)
    );
    insta::assert_snapshot!(
        "amdgcn_gfx942_comm_small",
        stable(&build("comm_small", COMM_KERNELS[1].1, GFX942).asm)
    );
}

/// Every HSACO is code object version 5 (ROCm before 6.3 refuses LLVM 22's default,
/// version 6): the AMDGPU metadata note says `amdhsa.version: [1, 2]`, and the ELF
/// header's OS/ABI is AMDGPU_HSA (64) with ABI version 3 (`ELFABIVERSION_AMDGPU_HSA_V5`).
#[test]
fn every_hsaco_is_code_object_v5() {
    let mut failures = Vec::new();
    for (name, f) in KERNELS.iter().chain(COMM_KERNELS.iter()) {
        for arch in AmdArch::ALL {
            let art = build(name, *f, Target::Amdgpu(arch));
            let label = format!("{name} {}", arch.name());
            match tools::amdgpu_code_object_version(&art.binary) {
                Ok(5) => {}
                Ok(v) => failures.push(format!("{label}: code object v{v} in the notes")),
                Err(e) => failures.push(format!("{label}: {e}")),
            }
            let (osabi, abiv) = (art.binary.get(7).copied(), art.binary.get(8).copied());
            if (osabi, abiv) != (Some(64), Some(3)) {
                failures.push(format!(
                    "{label}: ELF OS/ABI {osabi:?}, ABI version {abiv:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(
        tools::parse_amdhsa_version("amdhsa.version:\n  - 1\n  - 2\n"),
        Some(5)
    );
    assert_eq!(
        tools::parse_amdhsa_version("amdhsa.version: [ 1, 3 ]"),
        Some(6)
    );
}

/// The matmul's operand loads are issued `num_stages - 1` iterations ahead: with 3
/// stages, 2 prologue loads per operand and 1 in the loop, the loop carrying 2 tiles
/// per operand; the pipelined IR verifies and computes what the plain one does.
#[test]
fn matmul_operand_loads_are_pipelined() {
    use tessera::codegen::pipeline::pipeline_loads;
    use tessera::ir::interp::{self, HostBuffer, KernelArg, Scalar};
    use tessera::ir::{OpKind, printer::print_function};
    let f = kernel_ir::<matmul::matmul<f16, 32, 32, 16>>(&()).expect("builds");
    let all = |_: &tessera::ir::Function, _: &tessera::ir::Op| true;
    let p = pipeline_loads(&f, 3, &all);
    tessera::ir::verify::verify(&p).expect("verifies");
    let loads = |f: &tessera::ir::Function| {
        let mut n = (0, 0);
        f.walk(&mut |op| {
            if matches!(op.kind, OpKind::Load { .. }) {
                n.0 += 1;
            }
            if op.kind == OpKind::For {
                n.1 = op.operands.len();
            }
        });
        n
    };
    // Plain: 2 loads, a `for` with lb, ub, step and the accumulator.
    assert_eq!(loads(&f), (2, 4), "{}", print_function(&f));
    // Pipelined: 2 x 2 in the prologue, 2 in the loop; 2 x 2 more carried tiles.
    assert_eq!(loads(&p), (6, 8), "{}", print_function(&p));
    assert_eq!(pipeline_loads(&f, 1, &all), *f);
    let none = |_: &tessera::ir::Function, _: &tessera::ir::Op| false;
    assert_eq!(pipeline_loads(&f, 3, &none), *f);
    // Same results on the interpreter, for a k that is not a multiple of the tile.
    let (m, n, k) = (40usize, 36usize, 37usize);
    let mut seed = 7u64;
    let mut rnd = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        half::f16::from_f32(((seed >> 33) % 17) as f32 / 8.0 - 1.0)
    };
    let a: Vec<half::f16> = (0..m * k).map(|_| rnd()).collect();
    let b: Vec<half::f16> = (0..k * n).map(|_| rnd()).collect();
    let run = |f: &tessera::ir::Function| {
        let c = std::sync::Arc::new(HostBuffer::new(tessera::ir::ScalarType::F16, m * n));
        let args = vec![
            KernelArg::Buffer(std::sync::Arc::new(HostBuffer::from_slice(&a))),
            KernelArg::Buffer(std::sync::Arc::new(HostBuffer::from_slice(&b))),
            KernelArg::Buffer(c.clone()),
            KernelArg::Scalar(Scalar::I32(m as i32)),
            KernelArg::Scalar(Scalar::I32(n as i32)),
            KernelArg::Scalar(Scalar::I32(k as i32)),
        ];
        interp::run(f, [2, 2, 1], &args).expect("runs");
        c.to_vec::<half::f16>().expect("f16")
    };
    assert_eq!(run(&f), run(&p));
}

/// The runtime asks for dynamic shared memory exactly where the compiler stops
/// declaring it statically (the sm_80 ring filetests,
/// `tests/filetests/asm/sm_80/matmul_128x128x*_ring.tir`, check both sides of it).
#[test]
fn dynamic_shared_memory_starts_where_static_ends() {
    assert_eq!(
        tessera::artifact::DYNAMIC_SHARED_PAST,
        tessera::codegen::target::NVIDIA_STATIC_SHARED_BYTES
    );
}

/// FlashAttention-2 forward on sm_90a at the benchmarked tile (128 x 64, head dim
/// 64, 4 warps): both dots on wgmma, `Kᵀ` (contiguous along `k`) loaded 16 bytes at a
/// time and staged K-major (`imm-trans-b` 0); `P` goes to its wgmma from registers
/// (the accumulator layout of `Q Kᵀ` holds the A fragments) and `V` is N-major; the running
/// row statistics stay in the accumulator's sliced layout (no conversion through
/// shared memory); no spills and no wait injected by ptxas.
#[test]
fn sm90a_attention_takes_wgmma_without_conversions_or_spills() {
    use tessera::codegen::lower::lower_with_layouts;
    use tessera::ir::ParamFacts;
    let func =
        kernel_ir::<tessera::attention::attention_fwd<f16, 128, 64, 64>>(&()).expect("builds");
    let spec = tessera::ir::passes::specialize(
        &func,
        &vec![ParamFacts::new(true, true); func.params.len()],
    );
    let opts = CompileOptions::warps(4);
    let art = compile_ir(&spec, SM90A, &opts).expect("compiles");
    let ptx = &art.asm;
    let count = |s: &str| ptx.matches(s).count();
    assert_eq!(
        count("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16"),
        16,
        "{ptx}"
    );
    assert_eq!(count(", p, 1, 1, 0, 0;"), 8, "Q Kᵀ with a K-major B: {ptx}");
    assert_eq!(
        count(", p, 1, 1, 1;"),
        8,
        "P V: A from registers, N-major B: {ptx}"
    );
    assert_eq!(count("ld.global.u16") + count("ld.global.b16"), 0, "{ptx}");
    let text = lower_with_layouts(&spec, SM90A, &opts).expect("lowers");
    assert!(!text.contains("convert through shared memory"), "{text}");
    let report = tools::ptxas(ptx, "sm_90a").expect("ptxas");
    assert_eq!(
        (report.spill_stores_bytes, report.spill_loads_bytes),
        (0, 0),
        "{} registers",
        report.registers
    );
    assert!(!report.log.contains("C7517"), "{}", report.log);
}

/// On gfx942 the attention's chained dots compute the transposed products (B's
/// fragment in A's place), so each lane holds one row of `S` and of the output: the
/// row max and sum combine 32 registers and one lane pair (2 `ds_bpermute` in all, 160
/// before), `P` feeds `P V` from registers (the loop writes only `Kᵀ` and `V` to LDS),
/// `exp2` is `v_exp_f32` alone (no `v_ldexp` range fix-up), the NaN-propagating row max
/// takes `v_max3_f32` with one unordered test per pair (not a compare and a select per
/// element), and the key mask `kc < seq_k` is computed once per run of 16 equal columns.
#[test]
fn gfx942_attention_keeps_rows_in_lanes() {
    use tessera::codegen::lower::lower_with_layouts;
    use tessera::ir::ParamFacts;
    let func =
        kernel_ir::<tessera::attention::attention_fwd<f16, 128, 64, 64>>(&()).expect("builds");
    let spec = tessera::ir::passes::specialize(
        &func,
        &vec![ParamFacts::new(true, true); func.params.len()],
    );
    let opts = CompileOptions::warps(4);
    let text = lower_with_layouts(&spec, GFX942, &opts).expect("lowers");
    assert_eq!(text.matches("(transposed product)").count(), 2, "{text}");
    assert!(text.contains("operand A from registers"), "{text}");
    assert!(!text.contains("convert through shared memory"), "{text}");
    let art = compile_ir(&spec, GFX942, &opts).expect("compiles");
    let dis = tools::amdgpu_disasm(&art.binary, AmdArch::Gfx942).expect("llvm-objdump");
    let count = |op: &str| {
        dis.lines()
            .filter(|l| l.trim_start().starts_with(op))
            .count()
    };
    assert_eq!(count("v_mfma_f32_32x32x8"), 32, "{dis}");
    assert_eq!(count("ds_bpermute_b32"), 2, "{dis}");
    assert_eq!(count("v_ldexp_f32"), 0, "{dis}");
    assert!(count("v_max3_f32") >= 8, "{dis}");
    assert!(count("v_cmp_o_f32") <= 2, "{dis}");
    // `last_key >= kc` per element (32 a lane), `kc < seq_k` per run (4 a lane).
    let cmp_i32 = count("v_cmp_gt_i32") + count("v_cmp_ge_i32") + count("v_cmp_lt_i32");
    assert!(cmp_i32 <= 52, "{cmp_i32} integer compares: {dis}");
    // Q once, the prologue's and the loop's Kᵀ and V; `P` through LDS was 32 more.
    let writes = count("ds_write");
    assert!(writes <= 28, "{writes} LDS writes: {dis}");
    assert!(!dis.contains("scratch_"), "{dis}");
}

/// Layout assignment leaves no conversion through shared memory in any example or
/// fused kernel, plain or specialized as launches are, on either vendor: the anchors
/// (16-byte operand loads, the matrix units' accumulators, stores in their value's
/// layout) reach every use by register renaming or by recomputing index and mask
/// values (`TESSERA_DUMP=layout` shows each).
#[test]
fn no_kernel_converts_through_shared_memory() {
    use tessera::codegen::lower::lower_with_layouts;
    use tessera::ir::ParamFacts;
    type Ir = fn() -> std::sync::Arc<tessera::ir::Function>;
    fn ir<K: Kernel<Comptime = ()>>() -> std::sync::Arc<tessera::ir::Function> {
        kernel_ir::<K>(&()).expect("builds")
    }
    use tessera::fused::{BK, BM, BN};
    use tessera_tests::kernels::matmul_residual;
    let kernels: [(&str, Ir, u32); 11] = [
        ("vector_add", ir::<vector_add::vector_add<1024>>, 4),
        ("softmax_f32", ir::<softmax::softmax<f32, 4, 1024>>, 4),
        ("softmax_f16", ir::<softmax::softmax<f16, 4, 1024>>, 4),
        ("matmul_f32", ir::<matmul::matmul<f32, 64, 64, 32>>, 4),
        ("matmul_f16", ir::<matmul::matmul<f16, 64, 64, 32>>, 4),
        (
            "matmul_f16_128x128x32",
            ir::<matmul::matmul<f16, 128, 128, 32>>,
            4,
        ),
        (
            "matmul_f16_128x128x64",
            ir::<matmul::matmul<f16, 128, 128, 64>>,
            8,
        ),
        ("layernorm", ir::<layernorm::layernorm<f32, 256>>, 4),
        (
            "ag_gemm_f16",
            ir::<tessera::fused::ag_gemm_kernel<f16, BM, BN, BK>>,
            4,
        ),
        (
            "gemm_rs_f16",
            ir::<tessera::fused::gemm_rs_kernel<f16, BM, BN, BK>>,
            4,
        ),
        // The residual is loaded straight into the accumulator's layout.
        ("matmul_residual", ir::<matmul_residual<64, 64, 32>>, 4),
    ];
    let mut found = Vec::new();
    for (name, f, warps) in kernels {
        let f = f();
        let facts = vec![ParamFacts::new(true, true); f.params.len()];
        for func in [(*f).clone(), tessera::ir::passes::specialize(&f, &facts)] {
            for target in [SM80, SM90, GFX942] {
                let text = lower_with_layouts(&func, target, &CompileOptions::warps(warps))
                    .expect("lowers");
                let n = text.matches("convert through shared memory").count();
                if n > 0 {
                    found.push(format!("{name} on {target}: {n}"));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "conversions through shared memory: {found:?}"
    );
}

/// Softmax (f16 and f32) and vector_add move 16 bytes a thread, specialized as
/// launched, with no thread replicating another's elements; layernorm's 256-wide row
/// on 128 threads takes 2 elements a thread (8 bytes) rather than leaving half the
/// warps to load what the other half loads.
#[test]
fn elementwise_kernels_take_16_byte_accesses_without_replicas() {
    use tessera::codegen::lower::lower_with_layouts;
    use tessera::ir::ParamFacts;
    type Ir = fn() -> std::sync::Arc<tessera::ir::Function>;
    fn ir<K: Kernel<Comptime = ()>>() -> std::sync::Arc<tessera::ir::Function> {
        kernel_ir::<K>(&()).expect("builds")
    }
    let kernels: [(&str, Ir, bool); 4] = [
        ("vector_add", ir::<vector_add::vector_add<1024>>, true),
        ("softmax_f32", ir::<softmax::softmax<f32, 4, 1024>>, true),
        ("softmax_f16", ir::<softmax::softmax<f16, 4, 1024>>, true),
        ("layernorm", ir::<layernorm::layernorm<f32, 256>>, false),
    ];
    for (name, f, wide) in kernels {
        let f = f();
        let spec =
            tessera::ir::passes::specialize(&f, &vec![ParamFacts::new(true, true); f.params.len()]);
        let art = compile_ir(&spec, SM90, &CompileOptions::default()).expect("compiles");
        let v4 = art
            .asm
            .lines()
            .filter(|l| l.trim_start().starts_with("ld.global") && l.contains(".v4."))
            .count();
        assert_eq!(v4 > 0, wide, "{name}: {v4} 16-byte loads");
        // Every load's layout: no zero (replicated) lane or warp basis.
        let text = lower_with_layouts(&spec, SM90, &CompileOptions::default()).expect("lowers");
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.contains(" = load ") {
                let lay = lines[i - 1];
                let threads = lay.split(" | lane").nth(1).unwrap_or("");
                assert!(!threads.contains(" -"), "{name}: a replicated load: {lay}");
            }
        }
    }
}

#[path = "../../examples/matmul_fp8.rs"]
#[allow(dead_code)]
mod matmul_fp8;
#[path = "../../examples/matmul_i8.rs"]
#[allow(dead_code)]
mod matmul_i8;

/// The int8 GEMMs on the integer matrix instructions, specialized as launches are,
/// at the example's tile (64x64x64, 4 warps) and at 128x128x64 on 8 warps:
/// `mma.sync` m16n8k32 `.s8` (IMMA) on sm_80 and sm_90, and on sm_90a when B is
/// `[k][n]`; `wgmma` m64nNk32 `.s8` (IGMMA, no IMMA) on sm_90a when Bᵀ is given (both
/// operands K-major); `v_mfma_i32_32x32x8i8` / `v_mfma_i32_32x32x16_i8` on gfx90a /
/// gfx942 where a 32x32 tile is there for every wave, the 16x16 ones otherwise. No
/// spills.
#[test]
fn matmul_i8_uses_the_integer_matrix_units() {
    use tessera::ir::ParamFacts;
    let cases = [
        (
            "i8 64x64x64",
            kernel_ir::<matmul_i8::matmul_i8<64, 64, 64>>(&()).expect("builds"),
            4,
            false,
        ),
        (
            "i8 Bᵀ 64x64x64",
            kernel_ir::<matmul_i8::matmul_i8_bt<64, 64, 64>>(&()).expect("builds"),
            4,
            true,
        ),
        (
            "i8 128x128x64",
            kernel_ir::<matmul_i8::matmul_i8<128, 128, 64>>(&()).expect("builds"),
            8,
            false,
        ),
        (
            "i8 Bᵀ 128x128x64",
            kernel_ir::<matmul_i8::matmul_i8_bt<128, 128, 64>>(&()).expect("builds"),
            8,
            true,
        ),
    ];
    for (name, func, warps, bt) in cases {
        let facts = vec![ParamFacts::new(true, true); func.params.len()];
        let spec = tessera::ir::passes::specialize(&func, &facts);
        let opts = CompileOptions::warps(warps);
        for t in [SM80, SM90, SM90A] {
            let art = compile_ir(&spec, t, &opts).expect("compiles");
            let ptx = &art.asm;
            let wgmma = t == SM90A && bt;
            let mma = ptx.contains("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32");
            let wg = ptx.contains("wgmma.mma_async.sync.aligned.m64n");
            assert_eq!((mma, wg), (!wgmma, wgmma), "{name} {t}:\n{ptx}");
            let r = tools::ptxas(ptx, &t.to_string()).expect("ptxas");
            assert_eq!(
                (r.spill_stores_bytes, r.spill_loads_bytes),
                (0, 0),
                "{name} {t}: {} registers",
                r.registers
            );
            let sass = tools::sass(&r.cubin).expect("cuobjdump");
            if wgmma {
                assert!(
                    sass.contains("IGMMA") && !sass.contains("IMMA."),
                    "{name} {t}:\n{sass}"
                );
            } else {
                assert!(sass.contains("IMMA"), "{name} {t}:\n{sass}");
            }
        }
        for (arch, wide, narrow) in [
            (
                AmdArch::Gfx90a,
                "v_mfma_i32_32x32x8i8",
                "v_mfma_i32_16x16x16i8",
            ),
            (
                AmdArch::Gfx942,
                "v_mfma_i32_32x32x16_i8",
                "v_mfma_i32_16x16x32_i8",
            ),
        ] {
            let art = compile_ir(&spec, Target::Amdgpu(arch), &opts).expect("compiles");
            let dis = tools::amdgpu_disasm(&art.binary, arch).expect("llvm-objdump");
            // A 32x32 tile for every wave: 4 for 4 waves (64x64), 16 for 8 (128x128).
            assert!(dis.contains(wide), "{name} {arch:?}: no {wide}:\n{dis}");
            assert!(!dis.contains(narrow), "{name} {arch:?}: {narrow}");
        }
    }
    // Fewer 32x32 tiles than waves: the 16x16 instructions.
    let f = kernel_ir::<matmul_i8::matmul_i8<32, 64, 64>>(&()).expect("builds");
    for (arch, narrow) in [
        (AmdArch::Gfx90a, "v_mfma_i32_16x16x16i8"),
        (AmdArch::Gfx942, "v_mfma_i32_16x16x32_i8"),
    ] {
        let art =
            compile_ir(&f, Target::Amdgpu(arch), &CompileOptions::warps(4)).expect("compiles");
        let dis = tools::amdgpu_disasm(&art.binary, arch).expect("llvm-objdump");
        assert!(dis.contains(narrow), "{arch:?}: no {narrow}:\n{dis}");
    }
}

/// The f16/bf16 GEMM and attention on AMD's newer matrix instructions, specialized as
/// launches are, with no scratch and no spills: gfx950's double-`k` MFMA
/// (`v_mfma_f32_32x32x16_*` where a 32x32 tile is there for every wave, else
/// `v_mfma_f32_16x16x32_*`; none of gfx942's instructions), RDNA3's and RDNA4's
/// `v_wmma_f32_16x16x16_*` on gfx1100 and gfx1200 (no FMA loop: no `v_fma_f32` /
/// `v_fmac_f32` in the GEMMs' main loops); the 8-bit floats on gfx950's and RDNA4's
/// own instructions. The cross-backend suite runs the same lowering on emu-gfx950,
/// emu-gfx1100 and emu-gfx1200.
#[test]
fn newer_amd_targets_use_their_matrix_units() {
    use tessera::ir::ParamFacts;
    let spec = |f: std::sync::Arc<tessera::ir::Function>| {
        let facts = vec![ParamFacts::new(true, true); f.params.len()];
        tessera::ir::passes::specialize(&f, &facts)
    };
    let cases = [
        (
            "f16 64x64x64",
            spec(kernel_ir::<matmul::matmul<f16, 64, 64, 64>>(&()).expect("builds")),
            4,
            "f16",
            true,
        ),
        (
            "bf16 128x128x64",
            spec(kernel_ir::<matmul::matmul<bf16, 128, 128, 64>>(&()).expect("builds")),
            8,
            "bf16",
            true,
        ),
        (
            "f16 32x64x32",
            spec(kernel_ir::<matmul::matmul<f16, 32, 64, 32>>(&()).expect("builds")),
            4,
            "f16",
            false,
        ),
        (
            // The example's tile (the shape the tuner starts from on every GPU).
            "attention f16 64x64 d64",
            spec(
                kernel_ir::<tessera::attention::attention_fwd<f16, 64, 64, 64>>(&())
                    .expect("builds"),
            ),
            4,
            "f16",
            true,
        ),
    ];
    for (name, f, warps, ty, wide) in cases {
        for arch in [AmdArch::Gfx950, AmdArch::Gfx1100, AmdArch::Gfx1200] {
            let art = compile_ir(&f, Target::Amdgpu(arch), &CompileOptions::warps(warps))
                .expect("compiles");
            let dis = tools::amdgpu_disasm(&art.binary, arch).expect("llvm-objdump");
            let count = |op: &str| {
                dis.lines()
                    .filter(|l| l.trim_start().starts_with(op))
                    .count()
            };
            let label = format!("{name} {}", arch.name());
            let want = match arch {
                AmdArch::Gfx950 if wide => format!("v_mfma_f32_32x32x16_{ty}"),
                AmdArch::Gfx950 => format!("v_mfma_f32_16x16x32_{ty}"),
                _ => format!("v_wmma_f32_16x16x16_{ty}"),
            };
            assert!(count(&want) > 0, "{label}: no {want}:\n{dis}");
            // None of gfx942's instructions where the double-`k` ones tile the product.
            assert_eq!(count("v_mfma_f32_16x16x16"), 0, "{label}");
            assert_eq!(count("v_mfma_f32_32x32x8"), 0, "{label}");
            if !name.starts_with("attention") {
                assert_eq!(
                    count("v_fma_f32") + count("v_fmac_f32"),
                    0,
                    "{label}: an FMA loop"
                );
            }
            for r in tools::amdgpu_resources(&art.binary).expect("llvm-readobj") {
                assert_eq!(
                    (r.scratch_bytes, r.vgpr_spills, r.sgpr_spills),
                    (0, 0, 0),
                    "{label}: {r:?}"
                );
            }
        }
    }
    // The OCP 8-bit floats (A and Bᵀ given, both contiguous along k): gfx950's
    // `v_mfma_f32_32x32x64_f8f6f4` (unscaled; a `k` of 64 or 128 takes these, else
    // gfx942's `fp8_fp8` opcodes, read as OCP) and RDNA4's
    // `v_wmma_f32_16x16x16_fp8_fp8` take the bytes as they are; RDNA3, without 8-bit
    // WMMA, multiplies them as f16.
    let fp8 =
        spec(kernel_ir::<matmul_fp8::matmul_fp8_bt<F8E4M3, 64, 64, 64>>(&()).expect("builds"));
    for (arch, want, not) in [
        (
            AmdArch::Gfx950,
            "v_mfma_f32_32x32x64_f8f6f4",
            "v_mfma_f32_32x32x16_f16",
        ),
        (
            AmdArch::Gfx1200,
            "v_wmma_f32_16x16x16_fp8_fp8",
            "v_wmma_f32_16x16x16_f16",
        ),
        (AmdArch::Gfx1100, "v_wmma_f32_16x16x16_f16", "_fp8_fp8"),
    ] {
        let art =
            compile_ir(&fp8, Target::Amdgpu(arch), &CompileOptions::warps(4)).expect("compiles");
        let dis = tools::amdgpu_disasm(&art.binary, arch).expect("llvm-objdump");
        assert!(dis.contains(want), "fp8 {arch:?}: no {want}:\n{dis}");
        assert!(!dis.contains(not), "fp8 {arch:?}: {not}");
    }
}

/// fp8 GEMMs, specialized as launches are: on sm_90a with A and Bᵀ given (both
/// contiguous along k) `wgmma` `m64nNk32.f32.e4m3.e4m3` / `.e5m2.e5m2` (QGMMA in the
/// SASS) from a `cp.async` ring, no spills; on sm_89 `mma.sync` m16n8k32 on the
/// 8-bit floats (QMMA, PTX ISA 8.4); on sm_80 and sm_90 the same 8-bit arrays and
/// fragments (Bᵀ given: from a `cp.async` ring), each fragment converted to f16 for
/// two HMMA (`cvt.rn.f16x2.e4m3x2` for E4M3 on sm_90); with B `[k][n]` on sm_90a, and
/// on gfx942 always, the operands cast to f16 for the f16 matrix instructions (HGMMA,
/// `v_mfma_f32_*_f16`), see `tessera::codegen::fp8`. No spills, at 128x128x128 on 8
/// warps too.
#[test]
fn matmul_fp8_uses_the_8_bit_or_the_f16_matrix_units() {
    use tessera::ir::ParamFacts;
    let spec = |f: std::sync::Arc<tessera::ir::Function>| {
        let facts = vec![ParamFacts::new(true, true); f.params.len()];
        tessera::ir::passes::specialize(&f, &facts)
    };
    let cases = [
        (
            "e4m3 Bᵀ 64x64x64",
            spec(kernel_ir::<matmul_fp8::matmul_fp8_bt<F8E4M3, 64, 64, 64>>(&()).expect("builds")),
            4,
            true,
            "m64n64k32.f32.e4m3.e4m3",
        ),
        (
            "e5m2 Bᵀ 128x128x128",
            spec(
                kernel_ir::<matmul_fp8::matmul_fp8_bt<F8E5M2, 128, 128, 128>>(&()).expect("builds"),
            ),
            8,
            true,
            "m64n128k32.f32.e5m2.e5m2",
        ),
        (
            "e4m3 B [k][n] 64x64x32",
            spec(kernel_ir::<matmul::matmul<F8E4M3, 64, 64, 32>>(&()).expect("builds")),
            4,
            false,
            "m64n64k16.f32.f16.f16",
        ),
    ];
    for (name, func, warps, native, wgmma) in cases {
        let opts = CompileOptions::warps(warps);
        let art = compile_ir(&func, SM90A, &opts).expect("compiles");
        let ptx = &art.asm;
        assert!(
            ptx.contains(&format!("wgmma.mma_async.sync.aligned.{wgmma}")),
            "{name} sm_90a:\n{ptx}"
        );
        assert_eq!(ptx.contains("cp.async.cg.shared.global"), native, "{name}");
        let r = tools::ptxas(ptx, "sm_90a").expect("ptxas");
        assert_eq!(
            (r.spill_stores_bytes, r.spill_loads_bytes),
            (0, 0),
            "{name} sm_90a"
        );
        let sass = tools::sass(&r.cubin).expect("cuobjdump");
        assert_eq!(sass.contains("QGMMA"), native, "{name}:\n{sass}");
        assert!(sass.contains("GMMA"), "{name}:\n{sass}");
        // sm_80 and sm_90: the exact f16 path (HMMA), on fragments converted from
        // the 8-bit arrays. sm_89: `mma.sync` on the 8-bit floats themselves (QMMA),
        // in a PTX of ISA 8.4 (every other kernel stays at 8.0). (On sm_90 ptxas turns
        // that instruction into conversions and HMMA.)
        let ty = if name.starts_with("e4m3") {
            "e4m3"
        } else {
            "e5m2"
        };
        let bt = native;
        for t in [SM80, SM89, SM90] {
            let art = compile_ir(&func, t, &opts).expect("compiles");
            let native = t == SM89;
            let want = if native {
                format!("mma.sync.aligned.m16n8k32.row.col.f32.{ty}.{ty}.f32")
            } else {
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32".to_string()
            };
            assert!(art.asm.contains(&want), "{name} {t}:\n{}", art.asm);
            // Both operands contiguous along k: 8-bit copies into a ring.
            assert_eq!(
                art.asm.contains("cp.async.cg.shared.global"),
                bt,
                "{name} {t}"
            );
            assert_eq!(
                art.asm.contains("cvt.rn.f16x2.e4m3x2"),
                t == SM90 && ty == "e4m3",
                "{name} {t}"
            );
            let version = if native {
                ".version 8.4"
            } else {
                ".version 8.0"
            };
            assert!(art.asm.contains(version), "{name} {t}");
            let r = tools::ptxas(&art.asm, &t.to_string()).expect("ptxas");
            assert_eq!(
                (r.spill_stores_bytes, r.spill_loads_bytes),
                (0, 0),
                "{name} {t}"
            );
            let sass = tools::sass(&r.cubin).expect("cuobjdump");
            let unit = if native { "QMMA" } else { "HMMA" };
            assert!(sass.contains(unit), "{name} {t}: no {unit}:\n{sass}");
        }
        let art = compile_ir(&func, GFX942, &opts).expect("compiles");
        let dis = tools::amdgpu_disasm(&art.binary, AmdArch::Gfx942).expect("llvm-objdump");
        assert!(
            dis.contains("v_mfma_f32_32x32x8_f16") || dis.contains("v_mfma_f32_16x16x16_f16"),
            "{name} gfx942"
        );
    }
    // Quantizing casts: integer code on every target, assembled.
    let q = kernel_ir::<matmul_fp8::quantize<F8E5M2, 1024>>(&()).expect("builds");
    for t in [SM80, SM90A] {
        let art = compile_ir(&q, t, &CompileOptions::default()).expect("compiles");
        tools::ptxas(&art.asm, &t.to_string()).expect("ptxas");
    }
    compile_ir(&q, GFX942, &CompileOptions::default()).expect("compiles");
}

/// The software pipeliner leaves a loop that waits alone: in the sequence-parallel
/// attention kernel the peers' key loop waits for each block's signal right before
/// loading it (a load issued iterations ahead would read it before it arrived), while
/// the local key loop, with no wait, is pipelined.
#[test]
fn loops_that_wait_are_not_pipelined() {
    use tessera::codegen::pipeline::pipeline_loads;
    use tessera::ir::{Function, OpKind};
    let f = kernel_ir::<tessera::sp_attention::sp_attention_kernel<f16, 64, 64, 64>>(&())
        .expect("builds");
    let all = |_: &Function, _: &tessera::ir::Op| true;
    let p = pipeline_loads(&f, 3, &all);
    // Per `for`, in order: whether its body waits, and its operand count (the
    // pipeliner adds the tiles it carries).
    let loops = |f: &Function| {
        let mut v = Vec::new();
        f.walk(&mut |op| {
            if op.kind == OpKind::For {
                let mut waits = false;
                for r in &op.regions {
                    for o in &r.ops {
                        waits |= matches!(o.kind, OpKind::WaitUntil { .. });
                    }
                }
                v.push((waits, op.operands.len()));
            }
        });
        v
    };
    let (before, after) = (loops(&f), loops(&p));
    assert_eq!(before.len(), after.len());
    let mut pipelined = 0;
    for (b, a) in before.iter().zip(&after) {
        if b.0 {
            assert_eq!(b, a, "a waiting loop was pipelined");
        } else if a.1 > b.1 {
            pipelined += 1;
        }
    }
    assert!(before.iter().any(|l| l.0), "no waiting loop in the kernel");
    assert!(
        pipelined >= 1,
        "the local key loop is pipelined: {before:?} -> {after:?}"
    );
}

/// The sequence-parallel attention kernel carries its running statistics and
/// accumulator through two nested loops (the sources, then each one's keys): the
/// outer loop's carried values take the inner loop's layouts, so nothing crosses a
/// back edge or leaves the loops through shared memory; no spills.
#[test]
fn sp_attention_state_crosses_nested_loops_without_conversions() {
    use tessera::codegen::lower::lower_with_layouts;
    let f = kernel_ir::<
        tessera::sp_attention::sp_attention_kernel<
            f16,
            { tessera::sp_attention::BM },
            { tessera::sp_attention::BN },
            64,
        >,
    >(&())
    .expect("builds");
    for target in [SM80, SM90A] {
        let text = lower_with_layouts(&f, target, &CompileOptions::default()).expect("lowers");
        assert!(
            !text.contains("through shared memory"),
            "{target}: a conversion in\n{text}"
        );
        let art = compile_ir(&f, target, &CompileOptions::default()).expect("compiles");
        let r = tools::ptxas(&art.asm, &target.to_string()).expect("ptxas");
        assert_eq!(
            (r.spill_stores_bytes, r.spill_loads_bytes),
            (0, 0),
            "{target}"
        );
    }
}

#[path = "../../examples/matmul_desc.rs"]
#[allow(dead_code)]
mod matmul_desc;

/// `func` specialized as an sm_90a launch that built its tensor maps (the `_tmap`
/// parameters marked `tensor_map`; pointers and integers divisible by 16).
fn with_tensor_maps(func: &tessera::ir::Function) -> tessera::ir::Function {
    let facts: Vec<tessera::ir::ParamFacts> = func
        .params
        .iter()
        .map(|p| {
            let mut f = tessera::ir::ParamFacts::new(!p.name.ends_with("_tmap"), true);
            f.tensor_map = p.name.ends_with("_tmap");
            f
        })
        .collect();
    tessera::ir::passes::specialize(func, &facts)
}

/// The indices of the lines of `lines` that contain `s`.
fn lines_with(lines: &[&str], s: &str) -> Vec<usize> {
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains(s))
        .map(|(i, _)| i)
        .collect()
}

/// The descriptor GEMM specialized as an sm_90a launch that built its tensor maps
/// (`tensor_map` on the `_tmap` parameters): both operands arrive by TMA, one
/// 128x64 box for A and two 64x64 boxes for B (128-byte swizzle) per stage, each
/// stage's copies announced on its mbarrier (`arrive.expect_tx`) and waited for with
/// `try_wait.parity` at the top of the iteration; no `cp.async`; HGMMA from the
/// ring, no spills; C leaves by TMA stores (`UTMASTG`) of a swizzled staging box.
/// Without tensor maps (or on sm_80) the same kernel reads through `cp.async` and
/// stores masked.
#[test]
fn sm90a_descriptor_matmul_uses_tma_and_mbarriers() {
    use tessera::ir::ParamFacts;
    let func = kernel_ir::<matmul_desc::matmul_desc<128, 128, 64>>(&()).expect("builds");
    let facts = |tma: bool| -> Vec<ParamFacts> {
        func.params
            .iter()
            .map(|p| {
                let mut f = ParamFacts::new(!p.name.ends_with("_tmap"), true);
                f.tensor_map = tma && p.name.ends_with("_tmap");
                f
            })
            .collect()
    };
    let tma = tessera::ir::passes::specialize(&func, &facts(true));
    assert!(tessera::ir::printer::print_function(&tma).contains("tensor_map"));
    // (Warp specialization off: `sm90a_descriptor_matmul_is_warp_specialized`
    // checks it on.)
    let opts = CompileOptions {
        warp_specialize: Some(false),
        ..CompileOptions::warps(8)
    };
    let art = compile_ir(&tma, SM90A, &opts).expect("compiles");
    assert_eq!(art.meta.num_threads, 256);
    let ptx = &art.asm;
    let count = |s: &str| ptx.matches(s).count();
    // Prologue (2 stages) + the loop's copy: A one box, B two.
    assert_eq!(
        count("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"),
        3 * 3,
        "{ptx}"
    );
    assert_eq!(
        count("mbarrier.arrive.expect_tx.shared::cta.b64"),
        3 * 2,
        "{ptx}"
    );
    assert_eq!(
        count("mbarrier.try_wait.parity.shared::cta.b64"),
        1,
        "{ptx}"
    );
    assert_eq!(count("mbarrier.init.shared::cta.b64"), 4, "{ptx}");
    assert_eq!(count("cp.async.cg.shared.global"), 0, "{ptx}");
    assert!(
        count("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16") > 0,
        "{ptx}"
    );
    // The f32 C block: four 128 x 32 boxes (128-byte rows) staged in shared memory.
    assert_eq!(
        count("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group"),
        4,
        "{ptx}"
    );
    assert_eq!(count("cp.async.bulk.wait_group.read 0"), 1, "{ptx}");
    let report = tools::ptxas(ptx, "sm_90a").expect("ptxas");
    assert_eq!(
        (report.spill_stores_bytes, report.spill_loads_bytes),
        (0, 0),
        "{} registers",
        report.registers
    );
    let sass = tools::sass(&report.cubin).expect("cuobjdump");
    assert!(sass.contains("UTMALDG.2D"), "{sass}");
    assert!(sass.contains("UTMASTG.2D"), "{sass}");
    assert!(sass.contains("HGMMA.64x128x16.F32"), "{sass}");
    // Without tensor maps: the masked loads' cp.async ring, the same wgmma.
    let plain = tessera::ir::passes::specialize(&func, &facts(false));
    let art = compile_ir(&plain, SM90A, &CompileOptions::warps(8)).expect("compiles");
    assert_eq!(art.asm.matches("cp.async.bulk.tensor").count(), 0);
    assert!(
        art.asm.matches("cp.async.cg.shared.global").count() > 0,
        "{}",
        art.asm
    );
    tools::ptxas(&art.asm, "sm_90a").expect("ptxas");
    // sm_80 ignores the tensor maps.
    let art = compile_ir(&tma, SM80, &CompileOptions::warps(8)).expect("compiles");
    assert_eq!(art.asm.matches("cp.async.bulk").count(), 0);
    assert_eq!(art.asm.matches("mbarrier").count(), 0);
}

/// The same descriptor GEMM warp-specialized (the compiler's choice on sm_90a, 8
/// consumer warps): 384 threads; the producer warpgroup gives registers back
/// (`USETMAXREG.DEALLOC` 40) and issues every TMA copy, the prologue's included; the
/// consumers take registers (`USETMAXREG.TRY_ALLOC` 232) and only compute (HGMMA),
/// wait for each slot's full mbarrier and release it on its empty one (an arrival
/// per warp after `bar.warp.sync`), with no block barrier in the loop; after the
/// loop they meet at named barrier 1 (256 threads) for the TMA store. No spills.
/// The persistent descriptor matmul (`matmul_desc_persistent`: a loop over tiles
/// around the k-loop) on sm_90a with 8 consumer warps is warp-specialized across the
/// tiles: the block splits before the loop over tiles (one `setmaxnreg` pair), the
/// producer's copies (`UTMALDG`, in its own loop over tiles) all come before the
/// consumers take their registers, the consumers' `HGMMA`s and TMA stores after;
/// the ring's mbarriers are initialized once (8, before the split), and no prologue
/// copies are issued outside the producer. No spills.
#[test]
fn sm90a_persistent_matmul_is_warp_specialized_across_tiles() {
    let tma = with_tensor_maps(
        &kernel_ir::<matmul_desc::matmul_desc_persistent<128, 128, 64>>(&()).expect("builds"),
    );
    let art = compile_ir(&tma, SM90A, &CompileOptions::warps(8)).expect("compiles");
    assert_eq!(art.meta.num_threads, 384);
    let ptx = &art.asm;
    let count = |s: &str| ptx.matches(s).count();
    assert_eq!(count("setmaxnreg.dec.sync.aligned.u32 40;"), 1, "{ptx}");
    assert_eq!(count("setmaxnreg.inc.sync.aligned.u32 232;"), 1, "{ptx}");
    assert_eq!(count("mbarrier.init.shared::cta.b64"), 8, "{ptx}");
    // Only the producer loop's copies: A one box, B two.
    assert_eq!(
        count("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"),
        3,
        "{ptx}"
    );
    let report = tools::ptxas(ptx, "sm_90a").expect("ptxas");
    assert_eq!(
        (report.spill_stores_bytes, report.spill_loads_bytes),
        (0, 0),
        "{} registers",
        report.registers
    );
    let sass = tools::sass(&report.cubin).expect("cuobjdump");
    let lines: Vec<&str> = sass.lines().collect();
    let at = |s: &str| lines_with(&lines, s);
    let (alloc, dealloc) = (at("USETMAXREG.TRY_ALLOC"), at("USETMAXREG.DEALLOC"));
    assert_eq!((alloc.len(), dealloc.len()), (1, 1), "{sass}");
    let (loads, mmas, stores) = (at("UTMALDG.2D"), at("HGMMA.64x128x16.F32"), at("UTMASTG"));
    assert!(
        !loads.is_empty() && !mmas.is_empty() && !stores.is_empty(),
        "{sass}"
    );
    // ptxas lays out the consumers' code (from their `setmaxnreg.inc`) and the
    // producer's (from its `setmaxnreg.dec`) one after the other, in either order:
    // the copies are all the producer's, the matrix work and the stores the
    // consumers'.
    let (a, d) = (alloc[0], dealloc[0]);
    let consumer = |i: usize| a < i && (i < d || d < a);
    let producer = |i: usize| d < i && (i < a || a < d);
    assert!(loads.iter().all(|&i| producer(i)), "{sass}");
    assert!(mmas.iter().chain(&stores).all(|&i| consumer(i)), "{sass}");
}

/// Ping-pong on sm_90a: the persistent descriptor matmul with one warpgroup per
/// 128x128 tile (4 warps; 2 stages, so that a second store staging box fits) has,
/// as the compiler's choice, two consumer groups and a producer warpgroup: 384
/// threads, registers 40 and 232; each group's block barrier is named barrier
/// `1 + group` of 128 threads, the groups take turns on named barriers 3 and 4 (256
/// threads: one waits, `bar.sync`, the other arrives, `bar.arrive`), every id a
/// constant (ptxas counts 5 barriers, not all 16). ptxas accepts it with no spills; in the SASS the copies are the producer's, the `HGMMA`s, TMA
/// stores and the turn barriers (`BAR.SYNC`, `BAR.ARV`) the consumers'. With
/// `consumer_groups: Some(1)`: 256 threads and no `bar.arrive`.
#[test]
fn sm90a_persistent_matmul_ping_pongs() {
    let tma = with_tensor_maps(
        &kernel_ir::<matmul_desc::matmul_desc_persistent<128, 128, 64>>(&()).expect("builds"),
    );
    let opts = |groups| CompileOptions {
        num_stages: Some(2),
        consumer_groups: groups,
        ..CompileOptions::warps(4)
    };
    let art = compile_ir(&tma, SM90A, &opts(None)).expect("compiles");
    assert_eq!(art.meta.num_threads, 384);
    let ptx = &art.asm;
    let count = |s: &str| ptx.matches(s).count();
    assert_eq!(count("setmaxnreg.dec.sync.aligned.u32 40;"), 1, "{ptx}");
    assert_eq!(count("setmaxnreg.inc.sync.aligned.u32 232;"), 1, "{ptx}");
    // Each group's own barrier; the turns (group 0 waits at 3 and hands over at
    // 4, group 1 the other way round).
    assert!(
        count("bar.sync 1, 128;") >= 1 && count("bar.sync 2, 128;") >= 1,
        "{ptx}"
    );
    for turn in [
        "bar.sync 3, 256;",
        "bar.sync 4, 256;",
        "bar.arrive 3, 256;",
        "bar.arrive 4, 256;",
    ] {
        assert_eq!(count(turn), 1, "{turn}:\n{ptx}");
    }
    let report = tools::ptxas(ptx, "sm_90a").expect("ptxas");
    assert_eq!(
        (report.spill_stores_bytes, report.spill_loads_bytes),
        (0, 0),
        "{} registers",
        report.registers
    );
    assert!(report.log.contains("used 5 barriers"), "{}", report.log);
    let sass = tools::sass(&report.cubin).expect("cuobjdump");
    let lines: Vec<&str> = sass.lines().collect();
    let at = |s: &str| lines_with(&lines, s);
    let (alloc, dealloc) = (at("USETMAXREG.TRY_ALLOC"), at("USETMAXREG.DEALLOC"));
    assert_eq!((alloc.len(), dealloc.len()), (1, 1), "{sass}");
    let (loads, mmas, stores) = (at("UTMALDG.2D"), at("HGMMA.64x128x16.F32"), at("UTMASTG"));
    let (syncs, arrives) = (at("BAR.SYNC"), at("BAR.ARV"));
    assert!(
        !loads.is_empty() && !mmas.is_empty() && !stores.is_empty(),
        "{sass}"
    );
    assert!(!syncs.is_empty() && !arrives.is_empty(), "{sass}");
    let (a, d) = (alloc[0], dealloc[0]);
    let consumer = |i: usize| a < i && (i < d || d < a);
    let producer = |i: usize| d < i && (i < a || a < d);
    assert!(loads.iter().all(|&i| producer(i)), "{sass}");
    assert!(
        mmas.iter()
            .chain(&stores)
            .chain(&arrives)
            .all(|&i| consumer(i)),
        "{sass}"
    );
    // One group: the cooperative kernel.
    let art = compile_ir(&tma, SM90A, &opts(Some(1))).expect("compiles");
    assert_eq!(art.meta.num_threads, 256);
    assert_eq!(art.asm.matches("bar.arrive").count(), 0);
}

/// Thread-block clusters on sm_90a (`CompileOptions::cluster`): the warp-specialized
/// descriptor matmul in clusters of 2x2 blocks multicasts both operands (A along
/// grid axis 1, B along axis 0, each block issuing its share of the boxes with
/// `.multicast::cluster`), initializes its empty mbarriers for the consumer warps
/// of the 3 blocks writing each slot (itself and its 2 neighbours), releases slots
/// across the cluster (`mapa` + a cluster-scope arrival per lane), meets the
/// cluster at a `barrier.cluster` after the mbarriers' initialization, and keeps the
/// producer until the last releases are in. ptxas accepts it with no spills; the
/// SASS has the multicast TMA loads (`UTMALDG.2D.MULTICAST`), the cluster barrier
/// (`UCGABAR_ARV`/`UCGABAR_WAIT`) and remote arrivals, all loads on the producer's
/// side of the register split.
#[test]
fn sm90a_clustered_matmul_multicasts() {
    let tma = with_tensor_maps(
        &kernel_ir::<matmul_desc::matmul_desc<128, 128, 64>>(&()).expect("builds"),
    );
    let opts = CompileOptions {
        cluster: [2, 2, 1],
        ..CompileOptions::warps(8)
    };
    let art = compile_ir(&tma, SM90A, &opts).expect("compiles");
    let ptx = &art.asm;
    let count = |s: &str| ptx.matches(s).count();
    // Empty mbarriers: 8 consumer warps of each of 3 blocks.
    assert_eq!(count("mbarrier.init.shared::cta.b64"), 8, "{ptx}");
    assert!(
        ptx.contains("], 24;"),
        "empty mbarriers of 24 arrivals:\n{ptx}"
    );
    assert!(count(".multicast::cluster") >= 3, "{ptx}");
    assert_eq!(count("barrier.cluster.arrive.release.aligned"), 1, "{ptx}");
    assert_eq!(count("barrier.cluster.wait.acquire.aligned"), 1, "{ptx}");
    assert!(count("mapa.shared::cluster.u32") >= 1, "{ptx}");
    assert!(
        count("mbarrier.arrive.release.cluster.shared::cluster.b64") >= 1,
        "{ptx}"
    );
    assert!(count("%cluster_ctarank") >= 1, "{ptx}");
    let report = tools::ptxas(ptx, "sm_90a").expect("ptxas");
    assert_eq!(
        (report.spill_stores_bytes, report.spill_loads_bytes),
        (0, 0),
        "{} registers",
        report.registers
    );
    let sass = tools::sass(&report.cubin).expect("cuobjdump");
    let lines: Vec<&str> = sass.lines().collect();
    let at = |s: &str| lines_with(&lines, s);
    let alloc = at("USETMAXREG.TRY_ALLOC");
    let loads = at("UTMALDG.2D.MULTICAST");
    assert_eq!(alloc.len(), 1, "{sass}");
    assert!(!loads.is_empty(), "{sass}");
    assert!(loads.iter().all(|&i| i < alloc[0]), "{sass}");
    assert!(
        !at("UCGABAR_ARV").is_empty() && !at("UCGABAR_WAIT").is_empty(),
        "{sass}"
    );
    // Without clusters, none of it.
    let art = compile_ir(&tma, SM90A, &CompileOptions::warps(8)).expect("compiles");
    for what in ["multicast", "barrier.cluster", "mapa", "%cluster_ctarank"] {
        assert_eq!(art.asm.matches(what).count(), 0, "{what}");
    }
}

#[test]
fn sm90a_descriptor_matmul_is_warp_specialized() {
    let tma = with_tensor_maps(
        &kernel_ir::<matmul_desc::matmul_desc<128, 128, 64>>(&()).expect("builds"),
    );
    let art = compile_ir(&tma, SM90A, &CompileOptions::warps(8)).expect("compiles");
    assert_eq!(art.meta.num_threads, 384);
    let ptx = &art.asm;
    let count = |s: &str| ptx.matches(s).count();
    assert!(ptx.contains(".maxntid 384"), "{ptx}");
    assert_eq!(count("setmaxnreg.dec.sync.aligned.u32 40;"), 1, "{ptx}");
    assert_eq!(count("setmaxnreg.inc.sync.aligned.u32 232;"), 1, "{ptx}");
    // Full and empty mbarriers of 4 slots; the consumers' and the producer's waits.
    assert_eq!(count("mbarrier.init.shared::cta.b64"), 8, "{ptx}");
    assert_eq!(
        count("mbarrier.try_wait.parity.shared::cta.b64"),
        2,
        "{ptx}"
    );
    assert_eq!(count("mbarrier.arrive.shared::cta.b64"), 1, "{ptx}");
    assert_eq!(count("bar.warp.sync"), 1, "{ptx}");
    // The prologue's 2 stages and the producer loop's: A one box, B two.
    assert_eq!(
        count("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"),
        3 * 3,
        "{ptx}"
    );
    // After the loop, the consumers' barrier.
    assert!(count("bar.sync 1, 256;") >= 1, "{ptx}");
    let report = tools::ptxas(ptx, "sm_90a").expect("ptxas");
    assert_eq!(
        (report.spill_stores_bytes, report.spill_loads_bytes),
        (0, 0),
        "{} registers",
        report.registers
    );
    let sass = tools::sass(&report.cubin).expect("cuobjdump");
    let lines: Vec<&str> = sass.lines().collect();
    let at = |s: &str| lines_with(&lines, s);
    let (dealloc, alloc) = (at("USETMAXREG.DEALLOC"), at("USETMAXREG.TRY_ALLOC"));
    assert_eq!((dealloc.len(), alloc.len()), (1, 1), "{sass}");
    let (loads, mmas) = (at("UTMALDG.2D"), at("HGMMA.64x128x16.F32"));
    assert!(!loads.is_empty() && !mmas.is_empty(), "{sass}");
    // ptxas lays the producer's code out before the consumers': every TMA load
    // comes before the consumers take their registers, every HGMMA after.
    assert!(loads.iter().all(|&i| i < alloc[0]), "{sass}");
    assert!(mmas.iter().all(|&i| i > alloc[0]), "{sass}");
    // The consumer loop has no block barrier: the only BAR.SYNC 0x0 are before the
    // split (mbarrier initialization).
    assert!(
        at("BAR.SYNC.DEFER_BLOCKING 0x0")
            .iter()
            .all(|&i| i < dealloc[0]),
        "{sass}"
    );
    // Off (LaunchOptions::warp_specialize(false)): the block of 8 warps, no setmaxnreg.
    let off = CompileOptions {
        warp_specialize: Some(false),
        ..CompileOptions::warps(8)
    };
    let art = compile_ir(&tma, SM90A, &off).expect("compiles");
    assert_eq!(art.meta.num_threads, 256);
    assert_eq!(art.asm.matches("setmaxnreg").count(), 0);
    // 4 warps: one consumer warpgroup (registers are plenty: no setmaxnreg).
    let art = compile_ir(&tma, SM90A, &CompileOptions::warps(4)).expect("compiles");
    assert_eq!(art.meta.num_threads, 256);
    assert_eq!(art.asm.matches("setmaxnreg").count(), 0);
    assert!(art.asm.contains("bar.sync 1, 128;"), "{}", art.asm);
    tools::ptxas(&art.asm, "sm_90a").expect("ptxas");
}

/// `dst[i, j] = src[i - 1, j + 3] + 1` over blocks of `BM x BN` (the block coordinates
/// of the load are not the store's, so neither box is the other's).
#[kernel]
fn desc_shift_2d<const BM: usize, const BN: usize>(
    src: &TensorDesc<f32, S2<BM, BN>>,
    dst: &mut TensorDesc<f32, S2<BM, BN>>,
) {
    let i = program_id(0) * BM as i32;
    let j = program_id(1) * BN as i32;
    dst.store([i, j], src.load([i - 1, j + 3]) + 1.0f32);
}

/// The 3-D form, loads only: the block is summed over its first axis.
#[kernel]
fn desc_sum_3d<const B: usize>(src: &TensorDesc<f16, S3<2, B, B>>, out: &mut Global<f32>) {
    let t = src
        .load((0, program_id(0) * B as i32, 0))
        .cast::<f32>()
        .sum::<0>();
    let offs = arange::<B>().expand_dims::<1>() * B as i32 + arange::<B>().expand_dims::<0>();
    out.store_unmasked(offs, t);
}

/// A descriptor load that feeds no `dot` is TMA on sm_90a too: copies into a staging
/// box completing on an mbarrier (initialized, waited for once, invalidated), read
/// back with 16-byte shared loads; the 2-D block of 32 f32 columns is one 128-byte
/// box, 128 columns are four boxes; a 3-D f16 block is one 3-D box. PTX assembles, the
/// SASS has `UTMALDG`; without tensor maps, or on sm_80, no TMA.
#[test]
fn sm90a_descriptor_loads_outside_dots_are_tma() {
    use tessera::ir::ParamFacts;
    fn facts(func: &tessera::ir::Function, tma: bool) -> Vec<ParamFacts> {
        func.params
            .iter()
            .map(|p| {
                let mut f = ParamFacts::new(!p.name.ends_with("_tmap"), true);
                f.tensor_map = tma && p.name.ends_with("_tmap");
                f
            })
            .collect()
    }
    let load = "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes";
    for (func, boxes) in [
        (kernel_ir::<desc_shift_2d<16, 32>>(&()).expect("builds"), 1),
        (kernel_ir::<desc_shift_2d<8, 128>>(&()).expect("builds"), 4),
    ] {
        let tma = tessera::ir::passes::specialize(&func, &facts(&func, true));
        let art = compile_ir(&tma, SM90A, &CompileOptions::warps(4)).expect("compiles");
        let ptx = &art.asm;
        let count = |s: &str| ptx.matches(s).count();
        assert_eq!(count(load), boxes, "{ptx}");
        assert_eq!(count("mbarrier.init.shared::cta.b64"), 1, "{ptx}");
        assert_eq!(
            count("mbarrier.arrive.expect_tx.shared::cta.b64"),
            1,
            "{ptx}"
        );
        assert_eq!(
            count("mbarrier.try_wait.parity.shared::cta.b64"),
            1,
            "{ptx}"
        );
        assert_eq!(count("mbarrier.inval.shared::cta.b64"), 1, "{ptx}");
        assert!(count("ld.shared.v4.b32") > 0, "{ptx}");
        assert_eq!(count("ld.global"), 0, "{ptx}");
        assert_eq!(
            count("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group"),
            boxes,
            "{ptx}"
        );
        let report = tools::ptxas(ptx, "sm_90a").expect("ptxas");
        assert_eq!(
            (report.spill_stores_bytes, report.spill_loads_bytes),
            (0, 0)
        );
        let sass = tools::sass(&report.cubin).expect("cuobjdump");
        assert!(sass.contains("UTMALDG.2D"), "{sass}");
        // Without tensor maps (and on sm_80): the masked loads.
        for (f, t) in [
            (
                tessera::ir::passes::specialize(&func, &facts(&func, false)),
                SM90A,
            ),
            (tma, SM80),
        ] {
            let art = compile_ir(&f, t, &CompileOptions::warps(4)).expect("compiles");
            assert_eq!(art.asm.matches("cp.async.bulk").count(), 0, "{}", art.asm);
            assert_eq!(art.asm.matches("mbarrier").count(), 0, "{}", art.asm);
        }
    }
    let func = kernel_ir::<desc_sum_3d<64>>(&()).expect("builds");
    let tma = tessera::ir::passes::specialize(&func, &facts(&func, true));
    let art = compile_ir(&tma, SM90A, &CompileOptions::warps(4)).expect("compiles");
    assert_eq!(
        art.asm
            .matches("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier")
            .count(),
        1,
        "{}",
        art.asm
    );
    tools::ptxas(&art.asm, "sm_90a").expect("ptxas");
}
