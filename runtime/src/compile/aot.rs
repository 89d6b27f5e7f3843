//! Ahead-of-time compilation: a kernel's PTX or HSACO without a GPU (feature `jit`).
//!
//! ```no_run
//! use tessera::aot::{CompileOptions, Target, compile_kernel};
//! use tessera::prelude::*;
//!
//! #[kernel]
//! fn add<const BLOCK: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
//!     let offs = program_id(0) * BLOCK + arange::<BLOCK>();
//!     let mask = offs.lt(n);
//!     out.store(offs, x.load(offs, mask) + 1.0, mask);
//! }
//!
//! # fn main() -> Result<(), tessera::Error> {
//! let sm90: Target = "sm_90".parse().expect("a known target");
//! let art = compile_kernel::<add<1024>>(&(), sm90, &CompileOptions::default())?;
//! std::fs::write("add.ptx", &art.binary).expect("writable");
//! # Ok(())
//! # }
//! ```
//!
//! `TESSERA_DUMP=llvm,ptx,amdgcn` (or `all`) writes each compilation's optimized LLVM
//! IR (`.ll`), PTX (`.ptx`) and AMDGCN assembly (`.s`) to `TESSERA_DUMP_DIR`, named
//! `<kernel>-<hash>.<ext>`; the hash covers the IR, the target and the options.
//! `TESSERA_DUMP=layout` writes the lowered IR with each value's layout and every
//! layout conversion as comments (`.layout`, see
//! [`tessera_codegen::lower::lower_with_layouts`]).

use std::path::PathBuf;

use tessera_ir::Function;

pub use crate::artifact::Specialization;
use crate::artifact::{ArtifactStore, KernelBinary, KernelOptions, kernel_key};

use crate::compile::dump::{dump_enabled, dump_hash, dump_text};
use crate::{Error, Kernel, kernel_ir};

pub use tessera_codegen::target::ALL_TARGETS;
pub use tessera_codegen::{
    AmdArch, Artifact, CommEngine, CompileOptions, KernelMeta, Target, Vendor,
};

/// Compiles kernel `K` (with comptime arguments `ct`) specialized as `spec` for
/// `target`, from its cached, verified and optimized IR ([`kernel_ir`]).
pub fn compile_kernel_specialized<K: Kernel>(
    ct: &K::Comptime,
    spec: &Specialization,
    target: Target,
    opts: &CompileOptions,
) -> Result<Artifact, Error> {
    let func = spec.apply(kernel_ir::<K>(ct)?.as_ref());
    compile_ir(&func, target, opts)
}

/// Compiles kernel `K` (with comptime arguments `ct`) for `target`, from its cached,
/// verified and optimized IR ([`kernel_ir`]), assuming nothing about the launch.
pub fn compile_kernel<K: Kernel>(
    ct: &K::Comptime,
    target: Target,
    opts: &CompileOptions,
) -> Result<Artifact, Error> {
    let func = kernel_ir::<K>(ct)?;
    compile_ir(&func, target, opts)
}

/// Compiles verified IR for `target` (for IR that was changed after [`kernel_ir`],
/// e.g. with parameter facts added). Writes the dumps `TESSERA_DUMP` asks for.
pub fn compile_ir(
    func: &Function,
    target: Target,
    opts: &CompileOptions,
) -> Result<Artifact, Error> {
    tessera_codegen::emit::use_lld(crate::config::get()?.lld.clone());
    let art = tessera_codegen::compile(func, target, opts)?;
    if dump_enabled("layout")? {
        let text = tessera_codegen::lower::lower_with_layouts(func, target, opts)?;
        let ir = tessera_ir::printer::print_function(func);
        let hash = dump_hash(&[&ir, &target.to_string(), &format!("{opts:?}")]);
        dump_text("layout", &func.name, hash, "layout", text.as_bytes())?;
    }
    let any = |stages: &[&str]| -> Result<bool, Error> {
        for s in stages {
            if dump_enabled(s)? {
                return Ok(true);
            }
        }
        Ok(false)
    };
    if any(&["llvm", "ptx", "amdgcn"])? {
        let ir = tessera_ir::printer::print_function(func);
        let hash = dump_hash(&[&ir, &target.to_string(), &format!("{opts:?}")]);
        dump_text("llvm", &func.name, hash, "ll", art.llvm_ir.as_bytes())?;
        let (stage, ext) = match target.vendor() {
            Vendor::Nvidia => ("ptx", "ptx"),
            Vendor::Amd => ("amdgcn", "s"),
        };
        dump_text(stage, &func.name, hash, ext, art.asm.as_bytes())?;
    }
    Ok(art)
}

/// Compiles verified IR through NVIDIA's Tile IR for `gpu` (`sm_90`, `sm_100`, ...:
/// [`tessera_codegen::tileir::GPUS`]) with the `tileiras` of `TESSERA_TILEIRAS` (else
/// found on `PATH` or in the workspace's `.tools/bin`), in the newest bytecode version
/// both know. Returns the runtime's binary: target `tileir-<gpu>`, a cubin, launched
/// with a block of (1, 1, 1). `TESSERA_DUMP=tileir` writes the bytecode (`.tilebc`).
pub fn compile_tileir_ir(func: &Function, gpu: &str) -> Result<KernelBinary, Error> {
    tessera_codegen::tools::use_tileiras(crate::config::get()?.tileiras.clone());
    let art = tessera_codegen::tileir::compile(func, gpu)?;
    if dump_enabled("tileir")? {
        let ir = tessera_ir::printer::print_function(func);
        let hash = dump_hash(&[&ir, gpu, &art.kernel.version]);
        dump_text("tileir", &func.name, hash, "tilebc", &art.kernel.bytecode)?;
    }
    Ok(KernelBinary {
        name: art.kernel.name,
        target: format!("tileir-{gpu}"),
        num_threads: 1,
        shared_bytes: 0,
        binary: art.cubin,
    })
}

/// [`precompile`] through Tile IR ([`compile_tileir_ir`]) for `gpu`: the cubin a
/// launch with [`crate::KernelBackend::TileIr`] (or the device's choice on
/// compute capability 10.0 and later) finds on a GPU of that compute capability.
pub fn precompile_tileir<K: Kernel>(
    ct: &K::Comptime,
    spec: &Specialization,
    gpu: &str,
    store: &ArtifactStore,
) -> Result<PathBuf, Error> {
    let func = spec.apply(kernel_ir::<K>(ct)?.as_ref());
    store_tileir_ir(&func, gpu, store)
}

/// [`compile_tileir_ir`], written to `store` under the key a launch of `func`'s
/// kernel with these facts computes. Returns the written file.
pub fn store_tileir_ir(
    func: &Function,
    gpu: &str,
    store: &ArtifactStore,
) -> Result<PathBuf, Error> {
    let bin = compile_tileir_ir(func, gpu)?;
    let ir = tessera_ir::printer::print_function(func);
    let key = kernel_key(&ir, &bin.target, &tile_ir_options());
    store.put(&func.name, &key, &bin)
}

/// The key options of every Tile IR kernel (`tileiras` chooses warps and stages).
pub fn tile_ir_options() -> KernelOptions {
    KernelOptions {
        backend: Some(crate::KernelBackend::TileIr),
        ..KernelOptions::default()
    }
}

/// The runtime's form of an artifact: binary and launch facts.
pub fn kernel_binary(art: &Artifact) -> KernelBinary {
    KernelBinary {
        name: art.meta.name.clone(),
        target: art.target.to_string(),
        num_threads: art.meta.num_threads,
        shared_bytes: art.meta.shared_bytes,
        binary: art.binary.clone(),
    }
}

/// Compiles kernel `K` (comptime arguments `ct`) for `target` and writes it to
/// `store` under the key a runtime computes at launch (with or without LLVM), so a
/// [`crate::Device::with_artifacts`] / `TESSERA_AOT_DIR` runtime finds it. Returns the
/// written file (`<dir>/<kernel>-<key>.tkb`).
pub fn precompile<K: Kernel>(
    ct: &K::Comptime,
    spec: &Specialization,
    target: Target,
    opts: &CompileOptions,
    store: &ArtifactStore,
) -> Result<PathBuf, Error> {
    precompile_ir(
        &spec.apply(kernel_ir::<K>(ct)?.as_ref()),
        target,
        opts,
        store,
    )
}

/// [`precompile`] of a kernel's (specialized) IR.
pub fn precompile_ir(
    func: &Function,
    target: Target,
    opts: &CompileOptions,
    store: &ArtifactStore,
) -> Result<PathBuf, Error> {
    let art = compile_ir(func, target, opts)?;
    let ir = tessera_ir::printer::print_function(func);
    let key = kernel_key(
        &ir,
        &target.to_string(),
        &KernelOptions {
            num_warps: opts.num_warps,
            num_stages: opts.num_stages,
            off_node: opts.engine != CommEngine::Direct,
            backend: Some(crate::KernelBackend::Llvm),
            warp_specialize: opts.warp_specialize,
            cluster: opts.cluster,
            consumer_groups: opts.consumer_groups,
        },
    );
    store.put(&func.name, &key, &kernel_binary(&art))
}

/// [`precompile`] for every specialization a launch of `K` can look up
/// ([`Specialization::for_launches`]): what a build without LLVM needs to launch
/// it with any arguments. Returns the written files.
pub fn precompile_launches<K: Kernel>(
    ct: &K::Comptime,
    target: Target,
    opts: &CompileOptions,
    store: &ArtifactStore,
) -> Result<Vec<PathBuf>, Error> {
    precompile_ir_launches(kernel_ir::<K>(ct)?.as_ref(), target, opts, store)
}

/// [`precompile_launches`] of a kernel's IR (as [`kernel_ir`] gives it).
pub fn precompile_ir_launches(
    ir: &Function,
    target: Target,
    opts: &CompileOptions,
    store: &ArtifactStore,
) -> Result<Vec<PathBuf>, Error> {
    Specialization::for_launches(ir)
        .iter()
        .map(|sp| precompile_ir(&sp.apply(ir), target, opts, store))
        .collect()
}
