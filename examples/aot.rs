//! Compiles every example kernel for a GPU, without a GPU.
//!
//! ```sh
//! cargo run --release --example aot -- --target sm_90 --out kernels [--num-warps 4]
//! cargo run --release --example aot -- --target all --out kernels   # kernels/<target>/...
//! ```
//!
//! For each kernel it writes `<name>.ptx` (NVIDIA) or `<name>.hsaco` plus its assembly
//! `<name>.s` (AMD), and the optimized LLVM IR `<name>.ll`. Kernels instantiated twice
//! (f32 and f16) carry the element type in their name: `softmax_f16.ptx`.
//!
//! `--specialize all` (the default) compiles each kernel for launches whose buffers are
//! 16-byte aligned and whose integer arguments are multiples of 16 (what the runtime
//! picks for such launches, as Triton does): this is what allows 128-bit accesses.
//! `--specialize none` assumes nothing.
//!
//! `--tileir <gpu>` (`sm_100`, `sm_103`, `sm_120`, ... and `sm_80` to `sm_90`) compiles
//! every kernel through the Tile IR backend instead (`--target sm_100` and the other
//! Blackwell GPUs, which only that backend compiles for, mean the same) (`tessera::codegen::tileir`:
//! Tile IR bytecode, then NVIDIA's `tileiras`), writing `<name>.tilebc` and
//! `<name>.cubin`; a kernel with an op that backend does not lower yet is listed
//! with the op and its place, and does not fail the run. With `--store`, each is
//! also stored for every specialization a launch looks up (target `tileir-<gpu>`),
//! which a launch through the Tile IR backend on that GPU finds without `tileiras`.
//!
//! With `--store <dir>` it also writes every kernel into an artifact store
//! (`tessera::ArtifactStore`: `<dir>/<kernel>-<key>.tkb`, one folder for all targets),
//! which a runtime built without LLVM loads (`TESSERA_AOT_DIR=<dir>` or
//! `Device::with_artifacts`): see `examples/gpu_check.rs` and `scripts/gpu-check.sh`.

// The example kernels are included as modules (by `aot_jobs.rs`); each also has its
// own `main`.
#![allow(clippy::duplicate_mod)]

#[path = "aot_jobs.rs"]
mod aot_jobs;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use aot_jobs::JOBS;
use tessera::ArtifactStore;
use tessera::aot::{ALL_TARGETS, CompileOptions, Specialization, Target, Vendor};

const USAGE: &str = "usage: aot (--target <sm_80|sm_86|sm_89|sm_90|sm_100..sm_121|gfx90a|gfx942|gfx950|gfx1100|gfx1200|gfx1201|all> \
                     | --tileir <sm_80..sm_121>) \
                     --out <dir> [--num-warps <1|2|4|8|16>] [--num-stages <1..8>] \
                     [--specialize <all|none>] [--store <dir>] [--off-node <dir>]";

#[derive(Debug)]
struct Args {
    targets: Vec<Target>,
    out: PathBuf,
    opts: CompileOptions,
    store: Option<PathBuf>,
    spec: Specialization,
    /// Also store into this artifact store, for NVIDIA targets, the kernels the GPU
    /// check's NVSHMEM world runs (`ring_pass` and the all-reduce's sum kernels)
    /// compiled for a world across nodes (NVSHMEM's device library linked: about
    /// 0.6 MB of PTX each, so the GPU check packs them compressed).
    off_node: Option<PathBuf>,
    /// Compile through the Tile IR backend for this GPU (`sm_100`, ...).
    tileir: Option<String>,
}

/// The value of the option just read, as a string.
fn value_of(p: &mut lexopt::Parser) -> Result<String, String> {
    use lexopt::ValueExt;
    p.value()
        .and_then(|v| v.string())
        .map_err(|e| format!("{e}\n{USAGE}"))
}

fn parse_args(
    args: impl IntoIterator<Item = impl Into<std::ffi::OsString>>,
) -> Result<Args, String> {
    use lexopt::prelude::*;
    let (mut targets, mut out, mut opts) = (None, None, CompileOptions::default());
    let mut store = None;
    let mut spec = Specialization::AllDivisible;
    let mut off_node = None;
    let mut tileir = None;
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next().map_err(|e| format!("{e}\n{USAGE}"))? {
        match arg {
            Long("target") => {
                let v = value_of(&mut p)?;
                // Blackwell and later have no LLVM target here: NVIDIA's Tile IR
                // compiles for them (as `--tileir`).
                let sm = v.strip_prefix("sm_").and_then(|n| n.parse::<u32>().ok());
                if sm.is_some_and(|n| n >= 100)
                    && tessera::codegen::tileir::GPUS.contains(&v.as_str())
                {
                    tileir = Some(v);
                    targets.get_or_insert_with(Vec::new);
                    continue;
                }
                targets = Some(if v == "all" {
                    ALL_TARGETS.to_vec()
                } else {
                    vec![v.parse::<Target>().map_err(|e| e.to_string())?]
                });
            }
            Long("out") => out = Some(PathBuf::from(value_of(&mut p)?)),
            Long("store") => store = Some(PathBuf::from(value_of(&mut p)?)),
            Long("num-warps") => {
                let v = value_of(&mut p)?;
                opts.num_warps = v
                    .parse()
                    .ok()
                    .filter(|n: &u32| n.is_power_of_two() && *n <= 16)
                    .ok_or_else(|| format!("--num-warps: `{v}` is not 1, 2, 4, 8 or 16"))?;
            }
            Long("num-stages") => {
                let v = value_of(&mut p)?;
                opts.num_stages = Some(
                    v.parse()
                        .ok()
                        .filter(|n: &u32| (1..=8).contains(n))
                        .ok_or_else(|| format!("--num-stages: `{v}` is not 1 to 8"))?,
                );
            }
            Long("specialize") => {
                spec = match value_of(&mut p)?.as_str() {
                    "all" => Specialization::AllDivisible,
                    "none" => Specialization::None,
                    v => return Err(format!("--specialize: `{v}` is not `all` or `none`")),
                }
            }
            Long("off-node") => off_node = Some(PathBuf::from(value_of(&mut p)?)),
            Long("tileir") => {
                let v = value_of(&mut p)?;
                let ok = v
                    .strip_prefix("sm_")
                    .and_then(|n| n.parse::<u32>().ok())
                    .is_some_and(|n| (80..=121).contains(&n));
                if !ok {
                    return Err(format!("--tileir: `{v}` is not sm_80 to sm_121\n{USAGE}"));
                }
                tileir = Some(v);
            }
            Short('h') | Long("help") => return Err(USAGE.to_string()),
            other => return Err(format!("{}\n{USAGE}", other.unexpected())),
        }
    }
    let targets = match (targets, &tileir) {
        (Some(t), _) => t,
        (None, Some(_)) => Vec::new(),
        (None, None) => return Err(format!("--target or --tileir is required\n{USAGE}")),
    };
    Ok(Args {
        targets,
        tileir,
        out: out.ok_or_else(|| format!("--out is required\n{USAGE}"))?,
        opts,
        store,
        spec,
        off_node,
    })
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Every job through the Tile IR backend for `gpu` (see the module docs).
fn run_tileir(args: &Args, gpu: &str) -> Result<usize, String> {
    use tessera::codegen::CodegenError;
    use tessera::codegen::tileir;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let (mut failed, mut missing): (usize, Vec<&str>) = (0, Vec::new());
    for (name, _, _, _, ir, _) in JOBS {
        let ir = ir().map_err(|e| format!("{name}: {e}"))?;
        let f = match args.spec {
            Specialization::AllDivisible => {
                let facts = vec![tessera::ir::ParamFacts::new(true, true); ir.params.len()];
                tessera::ir::passes::specialize(&ir, &facts)
            }
            _ => (*ir).clone(),
        };
        let t = Instant::now();
        match tileir::compile(&f, gpu) {
            Ok(art) => {
                // Into the store: every specialization a launch can look up.
                if let Some(s) = &args.store {
                    let store = ArtifactStore::new(s);
                    for sp in Specialization::for_launches(&ir) {
                        tessera::aot::store_tileir_ir(&sp.apply(&ir), gpu, &store)
                            .map_err(|e| format!("{name}: {e}"))?;
                    }
                }
                let file = args.out.join(format!("{name}.cubin"));
                write(
                    &args.out.join(format!("{name}.tilebc")),
                    &art.kernel.bytecode,
                )?;
                write(&file, &art.cubin)?;
                println!(
                    "{gpu:>8} {name:<12} {:>9} bytes {:>9.1} ms  {} (Tile IR {})",
                    art.cubin.len(),
                    t.elapsed().as_secs_f64() * 1e3,
                    file.display(),
                    art.kernel.version
                );
            }
            Err(e @ CodegenError::TileIr { .. }) => {
                println!("{gpu:>8} {name:<12} not lowered to Tile IR yet: {e}");
                missing.push(name);
            }
            Err(e) => {
                eprintln!("{gpu:>8} {name:<12} FAILED: {e}");
                failed += 1;
            }
        }
    }
    if !missing.is_empty() {
        println!(
            "{gpu:>8} {} of {} kernels not lowered to Tile IR yet: {}",
            missing.len(),
            JOBS.len(),
            missing.join(", ")
        );
    }
    Ok(failed)
}

fn run(args: &Args) -> Result<(), String> {
    let mut failed = 0usize;
    if let Some(gpu) = &args.tileir {
        failed += run_tileir(args, gpu)?;
    }
    for &target in &args.targets {
        let dir = if args.targets.len() > 1 {
            args.out.join(target.to_string())
        } else {
            args.out.clone()
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let tname = target.to_string();
        for (name, warps, compile, store, _, _) in JOBS.iter().filter(|j| (j.5)(target)) {
            let opts = CompileOptions {
                num_warps: warps.unwrap_or(args.opts.num_warps),
                num_stages: args.opts.num_stages,
                ..CompileOptions::default()
            };
            let t = Instant::now();
            let art = match compile(&args.spec, target, &opts) {
                Ok(art) => art,
                Err(e) => {
                    eprintln!("{tname:>8} {name:<12} FAILED: {e}");
                    failed += 1;
                    continue;
                }
            };
            let elapsed = t.elapsed();
            let file = dir.join(format!("{name}.{}", target.artifact_extension()));
            write(&file, &art.binary)?;
            if target.vendor() == Vendor::Amd {
                write(&dir.join(format!("{name}.s")), art.asm.as_bytes())?;
            }
            write(&dir.join(format!("{name}.ll")), art.llvm_ir.as_bytes())?;
            if let Some(s) = &args.store {
                store(target, &opts, &ArtifactStore::new(s)).map_err(|e| e.to_string())?;
            }
            println!(
                "{tname:>8} {name:<12} {:>9} bytes {:>5} threads {:>6} B smem {:>9.1} ms  {}",
                art.binary.len(),
                art.meta.num_threads,
                art.meta.shared_bytes,
                elapsed.as_secs_f64() * 1e3,
                file.display()
            );
        }
        // The NVSHMEM world's kernels, compiled for a world across nodes.
        if let (Some(s), Vendor::Nvidia) = (&args.off_node, target.vendor()) {
            let t = Instant::now();
            let nv = CompileOptions {
                engine: tessera::aot::CommEngine::Nvshmem,
                ..args.opts.clone()
            };
            let store = ArtifactStore::new(s);
            let mut files =
                tessera::collectives::precompile_all_reduce_sum::<f32>(target, &nv, &store)
                    .map_err(|e| format!("{tname}: the all-reduce's kernels, off-node: {e}"))?;
            for (name, _, _, precompile, _, _) in JOBS.iter().filter(|j| j.0 == "ring_pass") {
                files.extend(
                    precompile(target, &nv, &store)
                        .map_err(|e| format!("{tname}: {name}, off-node: {e}"))?,
                );
            }
            println!(
                "{tname:>8} off-node (NVSHMEM linked): {} artifacts in {:.1} s",
                files.len(),
                t.elapsed().as_secs_f64()
            );
        }
        // The collectives' own kernels (f32), for a runtime without LLVM.
        if let Some(s) = &args.store {
            let t = Instant::now();
            let files =
                tessera::collectives::precompile::<f32>(target, &args.opts, &ArtifactStore::new(s))
                    .map_err(|e| format!("{tname}: the collectives' kernels: {e}"))?;
            println!(
                "{tname:>8} collectives (f32): {} artifacts in {:.1} s",
                files.len(),
                t.elapsed().as_secs_f64()
            );
        }
    }
    if failed > 0 {
        return Err(format!("{failed} kernel(s) failed to compile"));
    }
    Ok(())
}

fn main() -> ExitCode {
    // Tessera's messages (the `log` facade), filtered by TESSERA_LOG.
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("TESSERA_LOG", "warn")).init();
    let result = parse_args(std::env::args_os().skip(1)).and_then(|args| run(&args));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("aot: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Args, String> {
        parse_args(s.split_whitespace())
    }

    #[test]
    fn arguments() {
        let a = parse("--target gfx942 --out x --num-warps 8").unwrap();
        assert_eq!(
            a.targets,
            vec![Target::Amdgpu(tessera::aot::AmdArch::Gfx942)]
        );
        assert_eq!(a.opts.num_warps, 8);
        assert_eq!(a.store, None);
        assert_eq!(a.off_node, None);
        let a = parse("--target sm_90 --out x --store y --off-node z").unwrap();
        assert_eq!(a.store, Some(PathBuf::from("y")));
        assert_eq!(a.off_node, Some(PathBuf::from("z")));
        assert_eq!(
            parse("--target all --out x").unwrap().targets.len(),
            ALL_TARGETS.len()
        );
        assert!(
            parse("--target sm_70 --out x")
                .unwrap_err()
                .contains("unknown target")
        );
        assert!(
            parse("--out x")
                .unwrap_err()
                .contains("--target or --tileir is required")
        );
        let a = parse("--tileir sm_100 --out x").unwrap();
        assert_eq!((a.tileir.as_deref(), a.targets.len()), (Some("sm_100"), 0));
        // Blackwell as a target is the Tile IR path.
        let a = parse("--target sm_120 --out x").unwrap();
        assert_eq!((a.tileir.as_deref(), a.targets.len()), (Some("sm_120"), 0));
        assert!(parse("--target sm_99 --out x").is_err());
        assert!(
            parse("--tileir sm_70 --out x")
                .unwrap_err()
                .contains("not sm_80 to sm_121")
        );
        assert!(
            parse("--target sm_90")
                .unwrap_err()
                .contains("--out is required")
        );
        assert!(
            parse("--target")
                .unwrap_err()
                .contains("missing argument for option '--target'")
        );
        assert_eq!(parse("--target=sm_90 --out=x").unwrap().targets.len(), 1);
        assert!(parse("--num-warps x --target sm_90 --out y").is_err());
        assert!(parse("--num-warps 3 --target sm_90 --out y").is_err());
        assert!(
            parse("--bogus")
                .unwrap_err()
                .contains("invalid option '--bogus'")
        );
    }
}
