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

use std::path::PathBuf;

use tessera_ir::Function;

use crate::artifact::{ArtifactStore, KernelBinary, KernelOptions, kernel_key};

use crate::launch::{dump_enabled, dump_hash, dump_text};
use crate::{Error, Kernel, kernel_ir};

pub use tessera_codegen::target::ALL_TARGETS;
pub use tessera_codegen::{AmdArch, Artifact, CompileOptions, KernelMeta, Target, Vendor};

/// Which parameters a precompiled kernel may assume divisible by 16 (16-byte aligned
/// pointers, integers that are multiples of 16), as the runtime specializes GPU
/// launches (see [`tessera_ir::Function::specialized`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Specialization {
    /// Assume nothing: correct for every launch (but not what a launch looks up).
    None,
    /// Every pointer and integer parameter: what a launch with aligned buffers and
    /// sizes that are multiples of 16 uses (the common case, and what Triton's
    /// launcher assumes in that case).
    AllDivisible,
    /// One flag per parameter, in order.
    Divisible(Vec<bool>),
}

impl Specialization {
    /// Applies it to IR.
    pub fn apply(&self, func: &Function) -> Function {
        match self {
            Specialization::None => func.clone(),
            Specialization::AllDivisible => func.specialized(&vec![true; func.params.len()]),
            Specialization::Divisible(flags) => func.specialized(flags),
        }
    }

    /// Every specialization a launch of `func` can ask for: buffers are always
    /// 16-byte aligned (runtime allocations are), and each integer parameter is or is
    /// not a multiple of 16. With more than four integer parameters only "none" and
    /// "all" of them are listed.
    pub fn for_launches(func: &Function) -> Vec<Specialization> {
        let ints: Vec<usize> = func
            .params
            .iter()
            .enumerate()
            .filter(|(_, p)| func.ty(p.value).scalar_type().is_some_and(|s| s.is_int()))
            .map(|(i, _)| i)
            .collect();
        let masks: Vec<u32> = if ints.len() <= 4 {
            (0..1u32 << ints.len()).collect()
        } else {
            vec![0, (1u32 << ints.len().min(31)) - 1]
        };
        masks
            .into_iter()
            .map(|m| {
                let mut flags: Vec<bool> = func
                    .params
                    .iter()
                    .map(|p| func.ty(p.value).elem.is_ptr())
                    .collect();
                for (bit, &i) in ints.iter().enumerate() {
                    flags[i] = m & (1 << bit) != 0;
                }
                Specialization::Divisible(flags)
            })
            .collect()
    }
}

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
    let art = tessera_codegen::compile(func, target, opts)?;
    if ["llvm", "ptx", "amdgcn"].iter().any(|s| dump_enabled(s)) {
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
    let func = spec.apply(kernel_ir::<K>(ct)?.as_ref());
    let art = compile_ir(&func, target, opts)?;
    let ir = tessera_ir::printer::print_function(&func);
    let key = kernel_key(
        &ir,
        &target.to_string(),
        &KernelOptions {
            num_warps: opts.num_warps,
        },
    );
    store.put(&func.name, &key, &kernel_binary(&art))
}
