//! The host floor below both host executors, the compiled CPU device (`cpu`) and the
//! SIMT emulator (`emu`): LLVM's host target and the pass pipeline for it, the
//! program stacks that waiting programs and emulated threads run on (`stack`), the
//! machine's core count, launch arguments' scalar slots, and the half-precision
//! conversions LLVM's x86 back end calls ([`builtins`]). Neither executor
//! reaches into the other.

use std::sync::{Once, OnceLock};

use half::{bf16, f16};
use inkwell::OptimizationLevel;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, InitializationConfig, RelocMode, Target as LlvmTarget, TargetMachine,
};
use tessera_ir::interp::Scalar;

pub(crate) mod stack;

/// Initializes LLVM's native target, once per process.
pub(crate) fn init_target() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let _ = LlvmTarget::initialize_native(&InitializationConfig::default());
    });
}

/// The machine's cores, asked once (`available_parallelism` reads cgroup files: tens
/// of microseconds, a small launch's whole cost).
pub fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// A scalar's bytes in a zero-padded 8-byte slot (`i1` is one byte).
pub(crate) fn scalar_slot(s: Scalar) -> u64 {
    match s {
        Scalar::I1(x) => x as u64,
        Scalar::I8(x) => x as u8 as u64,
        Scalar::I16(x) => x as u16 as u64,
        Scalar::I32(x) => x as u32 as u64,
        Scalar::I64(x) => x as u64,
        Scalar::U8(x) => x as u64,
        Scalar::U16(x) => x as u64,
        Scalar::U32(x) => x as u64,
        Scalar::U64(x) => x,
        Scalar::F16(x) => x.to_bits() as u64,
        Scalar::BF16(x) => x.to_bits() as u64,
        Scalar::F32(x) => x.to_bits() as u64,
        Scalar::F64(x) => x.to_bits(),
    }
}

/// Verifies `module`, stamps it for the host CPU ([`for_this_cpu`]), runs the pass
/// `pipeline` (printing the result when `dump` is set) and returns the target machine
/// it was optimized for (`reloc` and `model` for the code it will generate).
pub(crate) fn optimize_for_host(
    module: &inkwell::module::Module<'_>,
    level: OptimizationLevel,
    pipeline: &str,
    dump: bool,
    reloc: RelocMode,
    model: CodeModel,
) -> Result<TargetMachine, String> {
    module
        .verify()
        .map_err(|m| format!("invalid LLVM IR: {m}"))?;
    let triple = TargetMachine::get_default_triple();
    let target = LlvmTarget::from_triple(&triple).map_err(|m| m.to_string())?;
    let cpu = crate::host_cpu::host_cpu();
    let machine = target
        .create_target_machine(&triple, &cpu.name, &cpu.features, level, reloc, model)
        .ok_or_else(|| "no target machine for the host".to_string())?;
    module.set_triple(&triple);
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    for_this_cpu(module);
    module
        .run_passes(pipeline, &machine, PassBuilderOptions::create())
        .map_err(|m| m.to_string())?;
    if dump {
        eprintln!("{}", module.print_to_string().to_string());
    }
    Ok(machine)
}

/// Stamps the host CPU ([`crate::host_cpu::host_cpu`]: this machine's, unless a lower
/// level was chosen) and its features on every function `module` defines.
///
/// LLVM's MCJIT engine (`create_jit_execution_engine`) builds its own target machine
/// for the generic CPU of the triple (x86-64: SSE2, no AVX, no FMA) and ignores the
/// one the optimizer ran with, but each function's `target-cpu` and
/// `target-features` attributes override it. Without them the compiled CPU
/// device's `dot` micro-kernel ran at 18.6 GFLOP/s on one AMD Zen 2 core, with them
/// at 85.9 (clang's build of the same loop: 100).
pub(crate) fn for_this_cpu(module: &inkwell::module::Module<'_>) {
    let ctx = module.get_context();
    let host = crate::host_cpu::host_cpu();
    let mut f = module.get_first_function();
    while let Some(func) = f {
        if func.count_basic_blocks() > 0 {
            for (k, v) in [
                ("target-cpu", &host.name),
                ("target-features", &host.features),
            ] {
                if v.is_empty() {
                    continue;
                }
                func.add_attribute(
                    inkwell::attributes::AttributeLoc::Function,
                    ctx.create_string_attribute(k, v),
                );
            }
        }
        f = func.get_next_function();
    }
}

// Half-precision conversion routines LLVM's x86 back end calls when the CPU lacks
// F16C/AVX512-BF16. The 16-bit values travel in the low bits of an XMM register (the
// `_Float16`/`__bf16` ABI), which is where an `f32` argument or result lives too.
extern "C" fn extend_hf_sf(x: f32) -> f32 {
    f16::from_bits(x.to_bits() as u16).to_f32()
}
extern "C" fn trunc_sf_hf(x: f32) -> f32 {
    f32::from_bits(f16::from_f32(x).to_bits() as u32)
}
extern "C" fn trunc_df_hf(x: f64) -> f32 {
    f32::from_bits(f16::from_f64(x).to_bits() as u32)
}
extern "C" fn extend_bf_sf(x: f32) -> f32 {
    bf16::from_bits(x.to_bits() as u16).to_f32()
}
extern "C" fn trunc_sf_bf(x: f32) -> f32 {
    f32::from_bits(bf16::from_f32(x).to_bits() as u32)
}
extern "C" fn trunc_df_bf(x: f64) -> f32 {
    f32::from_bits(bf16::from_f64(x).to_bits() as u32)
}

/// The compiler-rt half-precision conversions above, by the names LLVM's x86 back end
/// calls them (code for a CPU without F16C or AVX512-BF16 needs them; a Rust
/// executable does not export its own): every JIT of host code defines them.
pub(crate) fn builtins() -> [(&'static str, usize); 6] {
    [
        ("__extendhfsf2", extend_hf_sf as *const () as usize),
        ("__truncsfhf2", trunc_sf_hf as *const () as usize),
        ("__truncdfhf2", trunc_df_hf as *const () as usize),
        ("__extendbfsf2", extend_bf_sf as *const () as usize),
        ("__truncsfbf2", trunc_sf_bf as *const () as usize),
        ("__truncdfbf2", trunc_df_bf as *const () as usize),
    ]
}
