//! LLVM target machines for each [`Target`]: NVPTX and AMDGPU with the target's
//! CPU and features, the host's for the emulator. The compile driver (`emit`) and
//! the NVSHMEM bitcode linker (`nvshmem`) both build theirs here.

use std::sync::Once;

use inkwell::OptimizationLevel;
use inkwell::targets::{
    CodeModel, InitializationConfig, RelocMode, Target as LlvmTarget, TargetMachine, TargetTriple,
};

use crate::{Target, Vendor};

/// Creates the LLVM target machine for `target` (optimization level 3; the host's
/// for the emulator).
pub fn target_machine(target: Target) -> Result<TargetMachine, String> {
    target_machine_with(target, target.features())
}

/// [`target_machine`] with the LLVM target features `features` (e.g. a newer PTX ISA
/// than [`Target::features`]'s); ignored for the emulator.
pub fn target_machine_with(target: Target, features: &str) -> Result<TargetMachine, String> {
    init_llvm();
    if target.is_emu() {
        LlvmTarget::initialize_native(&InitializationConfig::default())?;
        let triple = TargetMachine::get_default_triple();
        let t = LlvmTarget::from_triple(&triple).map_err(|e| e.to_string())?;
        let cpu = crate::host_cpu::host_cpu();
        return t
            .create_target_machine(
                &triple,
                &cpu.name,
                &cpu.features,
                OptimizationLevel::Aggressive,
                RelocMode::PIC,
                CodeModel::Default,
            )
            .ok_or_else(|| "LLVM cannot create a target machine for the host".to_string());
    }
    let name = match target.vendor() {
        Vendor::Nvidia => "nvptx64",
        Vendor::Amd => "amdgcn",
    };
    let llvm_target = LlvmTarget::from_name(name)
        .ok_or_else(|| format!("LLVM was built without the `{name}` target"))?;
    llvm_target
        .create_target_machine(
            &TargetTriple::create(target.triple()),
            &target.cpu(),
            features,
            OptimizationLevel::Aggressive,
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| {
            format!(
                "LLVM cannot create a target machine for {} ({}, {})",
                target.triple(),
                target.cpu(),
                features
            )
        })
}

/// Registers the NVPTX and AMDGPU back ends with LLVM, once per process.
fn init_llvm() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let config = InitializationConfig::default();
        LlvmTarget::initialize_nvptx(&config);
        LlvmTarget::initialize_amd_gpu(&config);
    });
}
