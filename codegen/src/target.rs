//! Compilation targets: what differs between GPUs, described once.
//!
//! The lowering is written once (against `lower::arch::Arch`); everything vendor-specific
//! (warp size, LLVM triple and CPU, address spaces, the kernel calling convention, and
//! the intrinsics emitted for thread ids, barriers, shuffles and matrix units) hangs off
//! [`Target`].

use std::fmt;
use std::str::FromStr;

/// A GPU to compile for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// NVIDIA, by compute capability (80 = sm_80 Ampere, 90 = sm_90 Hopper).
    Nvptx {
        /// Compute capability times ten plus minor (80, 86, 89, 90).
        sm: u32,
        /// The architecture-specific variant (`sm_90a`: PTX with `wgmma`, which only
        /// compute capability 9.0 runs; no forward compatibility).
        arch_specific: bool,
    },
    /// AMD, by gfx architecture.
    Amdgpu(AmdArch),
    /// The SIMT emulator: the same lowering, JIT-compiled for the host and run by
    /// [`crate::emu`], emulating one vendor's warp size and matrix fragment layouts.
    Emu(EmuFlavor),
}

/// Which GPU the SIMT emulator imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EmuFlavor {
    /// Warp 32 and the `mma.sync m16n8k16` fragment layouts: the lowering makes the
    /// same layout decisions as for sm_80.
    Nv,
    /// Wave 64 and the MFMA 16x16x16 fragment layouts, as for gfx942.
    Amd,
    /// Warp 32 and the Hopper warpgroup instructions (`wgmma` from shared-memory
    /// descriptors): the layout decisions of sm_90a.
    Sm90a,
}

impl EmuFlavor {
    /// The GPU target whose layout decisions the emulator reproduces.
    pub fn imitates(self) -> Target {
        match self {
            EmuFlavor::Nv => Target::nvptx(80),
            EmuFlavor::Amd => Target::Amdgpu(AmdArch::Gfx942),
            EmuFlavor::Sm90a => Target::SM90A,
        }
    }
}

/// AMD GPU architectures Tessera knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AmdArch {
    /// CDNA2 (MI200), wave64, MFMA.
    Gfx90a,
    /// CDNA3 (MI300), wave64, MFMA.
    Gfx942,
    /// RDNA3 (RX 7900), wave32, WMMA (Tessera uses the FMA path there).
    Gfx1100,
}

impl AmdArch {
    /// The LLVM CPU name.
    pub fn name(self) -> &'static str {
        match self {
            AmdArch::Gfx90a => "gfx90a",
            AmdArch::Gfx942 => "gfx942",
            AmdArch::Gfx1100 => "gfx1100",
        }
    }

    /// The code object version Tessera emits for this target: 5 on every one. LLVM 22
    /// defaults to version 6, which ROCm before 6.3 refuses
    /// (`HSA_STATUS_ERROR_INVALID_CODE_OBJECT`); version 5 loads on ROCm 5.x and 6.x.
    /// This table is the one place to change it per target.
    pub fn code_object_version(self) -> u32 {
        match self {
            AmdArch::Gfx90a | AmdArch::Gfx942 | AmdArch::Gfx1100 => 5,
        }
    }
}

/// Every target the test suite validates.
pub const ALL_TARGETS: [Target; 6] = [
    Target::nvptx(80),
    Target::nvptx(90),
    Target::SM90A,
    Target::Amdgpu(AmdArch::Gfx90a),
    Target::Amdgpu(AmdArch::Gfx942),
    Target::Amdgpu(AmdArch::Gfx1100),
];

/// The two vendor flavors of the SIMT emulator (not GPU targets: kept out of
/// [`ALL_TARGETS`]); [`EmuFlavor::Sm90a`] is run where a kernel has a `dot`.
pub const EMU_TARGETS: [Target; 2] = [Target::Emu(EmuFlavor::Nv), Target::Emu(EmuFlavor::Amd)];

/// The Hopper emulator flavor, `emu-sm90a`.
pub const EMU_SM90A: Target = Target::Emu(EmuFlavor::Sm90a);

/// A target name that is not one of `sm_80`, `sm_86`, `sm_89`, `sm_90`, `sm_90a`,
/// `gfx90a`, `gfx942`, `gfx1100`, `emu-nv`, `emu-amd`, `emu-sm90a`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown target `{0}` (expected sm_80, sm_86, sm_89, sm_90, sm_90a, gfx90a, gfx942, gfx1100, emu-nv, emu-amd or emu-sm90a)"
)]
pub struct UnknownTarget(pub String);

impl FromStr for Target {
    type Err = UnknownTarget;
    fn from_str(s: &str) -> Result<Target, UnknownTarget> {
        match s {
            "sm_80" => Ok(Target::nvptx(80)),
            "sm_86" => Ok(Target::nvptx(86)),
            "sm_89" => Ok(Target::nvptx(89)),
            "sm_90" => Ok(Target::nvptx(90)),
            "sm_90a" => Ok(Target::SM90A),
            "gfx90a" => Ok(Target::Amdgpu(AmdArch::Gfx90a)),
            "gfx942" => Ok(Target::Amdgpu(AmdArch::Gfx942)),
            "gfx1100" => Ok(Target::Amdgpu(AmdArch::Gfx1100)),
            "emu-nv" => Ok(Target::Emu(EmuFlavor::Nv)),
            "emu-amd" => Ok(Target::Emu(EmuFlavor::Amd)),
            "emu-sm90a" => Ok(EMU_SM90A),
            _ => Err(UnknownTarget(s.to_string())),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Nvptx { sm, arch_specific } => {
                write!(f, "sm_{sm}{}", if *arch_specific { "a" } else { "" })
            }
            Target::Amdgpu(a) => f.write_str(a.name()),
            Target::Emu(EmuFlavor::Nv) => f.write_str("emu-nv"),
            Target::Emu(EmuFlavor::Amd) => f.write_str("emu-amd"),
            Target::Emu(EmuFlavor::Sm90a) => f.write_str("emu-sm90a"),
        }
    }
}

/// The vendor family of a target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Vendor {
    /// NVIDIA (PTX).
    Nvidia,
    /// AMD (AMDGCN code objects).
    Amd,
}

/// The most shared memory a PTX kernel declares statically (CUDA's 48 KiB).
pub const NVIDIA_STATIC_SHARED_BYTES: u32 = 48 * 1024;

impl Target {
    /// sm_90a: Hopper with its architecture-specific instructions (`wgmma`).
    pub const SM90A: Target = Target::Nvptx {
        sm: 90,
        arch_specific: true,
    };

    /// The portable NVIDIA target of compute capability `sm` (`sm_80`, `sm_90`, ...).
    pub const fn nvptx(sm: u32) -> Target {
        Target::Nvptx {
            sm,
            arch_specific: false,
        }
    }

    /// Whether `dot` can use the Hopper warpgroup matrix instructions (`wgmma`):
    /// sm_90a and the emulator imitating it.
    pub fn has_wgmma(self) -> bool {
        match self {
            Target::Nvptx { sm, arch_specific } => arch_specific && sm == 90,
            Target::Emu(f) => f.imitates().has_wgmma(),
            Target::Amdgpu(_) => false,
        }
    }

    /// NVIDIA or AMD; for the emulator, the vendor it imitates.
    pub fn vendor(self) -> Vendor {
        match self {
            Target::Nvptx { .. } => Vendor::Nvidia,
            Target::Amdgpu(_) => Vendor::Amd,
            Target::Emu(f) => f.imitates().vendor(),
        }
    }

    /// True for the SIMT emulator's targets.
    pub fn is_emu(self) -> bool {
        matches!(self, Target::Emu(_))
    }

    /// Threads per warp (wavefront): 32 on NVIDIA and RDNA, 64 on CDNA.
    pub fn warp_size(self) -> u32 {
        match self {
            Target::Nvptx { .. } | Target::Amdgpu(AmdArch::Gfx1100) => 32,
            Target::Amdgpu(_) => 64,
            Target::Emu(f) => f.imitates().warp_size(),
        }
    }

    /// The LLVM target triple; empty for the emulator (the host's, set by the JIT).
    pub fn triple(self) -> &'static str {
        match self {
            Target::Nvptx { .. } => "nvptx64-nvidia-cuda",
            Target::Amdgpu(_) => "amdgcn-amd-amdhsa",
            Target::Emu(_) => "",
        }
    }

    /// The LLVM CPU name (the host's for the emulator).
    pub fn cpu(self) -> String {
        match self {
            Target::Nvptx { .. } => self.to_string(),
            Target::Amdgpu(a) => a.name().to_string(),
            Target::Emu(_) => crate::host_cpu::host_cpu().name.clone(),
        }
    }

    /// LLVM target features. PTX ISA 8.0 is accepted by every CUDA 12.x and 13.x driver.
    /// Empty for the emulator (the JIT uses the host's).
    pub fn features(self) -> &'static str {
        match self {
            Target::Nvptx { .. } => "+ptx80",
            Target::Amdgpu(AmdArch::Gfx1100) => "+wavefrontsize32",
            Target::Amdgpu(_) => "+wavefrontsize64",
            Target::Emu(_) => "",
        }
    }

    /// True when `dot` on f16/bf16 can use the matrix units: `mma.sync` (sm_80+) or
    /// MFMA (CDNA); the emulator emulates them.
    pub fn has_matrix_units(self) -> bool {
        match self {
            Target::Nvptx { sm, .. } => sm >= 80,
            Target::Amdgpu(a) => matches!(a, AmdArch::Gfx90a | AmdArch::Gfx942),
            Target::Emu(_) => true,
        }
    }

    /// LLVM address space of global memory (0, the host's, for the emulator).
    pub fn global_addrspace(self) -> u16 {
        if self.is_emu() { 0 } else { 1 }
    }

    /// LLVM address space of shared (LDS) memory (0, the host's, for the emulator).
    pub fn shared_addrspace(self) -> u16 {
        if self.is_emu() { 0 } else { 3 }
    }

    /// Bytes of shared memory one block may use: on NVIDIA the opt-in maximum per
    /// block of the architecture (sm_80 163 KiB, sm_86/sm_89 99 KiB, sm_90 227 KiB);
    /// past [`NVIDIA_STATIC_SHARED_BYTES`] the kernel declares it dynamic
    /// ([`Self::dynamic_shared`]) and the launch opts in.
    pub fn shared_memory_limit(self) -> u32 {
        match self {
            Target::Nvptx { sm: 80, .. } => 166_912,
            Target::Nvptx { sm: 86 | 89, .. } => 101_376,
            Target::Nvptx { sm, .. } if sm >= 90 => 232_448,
            Target::Nvptx { .. } => NVIDIA_STATIC_SHARED_BYTES,
            Target::Amdgpu(_) => 64 * 1024,
            Target::Emu(f) => f.imitates().shared_memory_limit(),
        }
    }

    /// Whether a kernel needing `bytes` of shared memory declares it dynamic
    /// (`.extern .shared`, sized by the launch): on NVIDIA past the 48 KiB a static
    /// declaration may hold. The runtime launches such kernels with `bytes` of dynamic
    /// shared memory, after raising the kernel's limit to it.
    pub fn dynamic_shared(self, bytes: u32) -> bool {
        matches!(self, Target::Nvptx { .. }) && bytes > NVIDIA_STATIC_SHARED_BYTES
    }

    /// The file extension of the compiled artifact (`ptx`, `hsaco`, or `o`: a host
    /// object for the emulator).
    pub fn artifact_extension(self) -> &'static str {
        match self {
            Target::Emu(_) => "o",
            _ => match self.vendor() {
                Vendor::Nvidia => "ptx",
                Vendor::Amd => "hsaco",
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in ALL_TARGETS.into_iter().chain(EMU_TARGETS) {
            assert_eq!(t.to_string().parse::<Target>(), Ok(t));
        }
        assert_eq!(Target::Emu(EmuFlavor::Nv).warp_size(), 32);
        assert_eq!(Target::Emu(EmuFlavor::Amd).warp_size(), 64);
        assert!("sm_70".parse::<Target>().is_err());
        assert_eq!(Target::Amdgpu(AmdArch::Gfx942).warp_size(), 64);
        assert_eq!("sm_90a".parse::<Target>(), Ok(Target::SM90A));
        assert_eq!(EMU_SM90A.to_string().parse::<Target>(), Ok(EMU_SM90A));
        assert!(Target::SM90A.has_wgmma() && EMU_SM90A.has_wgmma());
        assert!(!Target::nvptx(90).has_wgmma());
        assert_eq!(Target::Amdgpu(AmdArch::Gfx1100).warp_size(), 32);
    }
}
