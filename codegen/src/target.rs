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
    /// Wave 64 and gfx950's double-`k` MFMA (`v_mfma_f32_16x16x32_f16`,
    /// `..._32x32x16_f16`): the layout decisions of gfx950 (MI350X/MI355X).
    Gfx950,
    /// Wave 32 and RDNA3's WMMA (`v_wmma_f32_16x16x16_f16`, A and B replicated in
    /// both halves of the wave): the layout decisions of gfx1100.
    Gfx1100,
    /// Wave 32 and RDNA4's WMMA (eight elements of A and B per lane): the layout
    /// decisions of gfx1200/gfx1201.
    Gfx1200,
}

impl EmuFlavor {
    /// The GPU target whose layout decisions the emulator reproduces.
    pub fn imitates(self) -> Target {
        match self {
            EmuFlavor::Nv => Target::nvptx(80),
            EmuFlavor::Amd => Target::Amdgpu(AmdArch::Gfx942),
            EmuFlavor::Sm90a => Target::SM90A,
            EmuFlavor::Gfx950 => Target::Amdgpu(AmdArch::Gfx950),
            EmuFlavor::Gfx1100 => Target::Amdgpu(AmdArch::Gfx1100),
            EmuFlavor::Gfx1200 => Target::Amdgpu(AmdArch::Gfx1200),
        }
    }

    /// Its name, as `TESSERA_DEVICE` and `--target` spell it.
    pub fn name(self) -> &'static str {
        match self {
            EmuFlavor::Nv => "emu-nv",
            EmuFlavor::Amd => "emu-amd",
            EmuFlavor::Sm90a => "emu-sm90a",
            EmuFlavor::Gfx950 => "emu-gfx950",
            EmuFlavor::Gfx1100 => "emu-gfx1100",
            EmuFlavor::Gfx1200 => "emu-gfx1200",
        }
    }

    /// Every flavour.
    pub const ALL: [EmuFlavor; 6] = [
        EmuFlavor::Nv,
        EmuFlavor::Amd,
        EmuFlavor::Sm90a,
        EmuFlavor::Gfx950,
        EmuFlavor::Gfx1100,
        EmuFlavor::Gfx1200,
    ];
}

/// AMD GPU architectures Tessera knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AmdArch {
    /// CDNA2 (MI200), wave64, MFMA.
    Gfx90a,
    /// CDNA3 (MI300), wave64, MFMA.
    Gfx942,
    /// CDNA4 (MI350X/MI355X), wave64, MFMA with twice the `k` per instruction, 160 KiB
    /// of LDS.
    Gfx950,
    /// RDNA3 (RX 7900), wave32, WMMA.
    Gfx1100,
    /// RDNA4 (RX 9070 XT), wave32, WMMA with eight elements of A and B per lane.
    Gfx1200,
    /// RDNA4 (RX 9070 non-XT and others): gfx1200's instruction set.
    Gfx1201,
}

impl AmdArch {
    /// The LLVM CPU name.
    pub fn name(self) -> &'static str {
        match self {
            AmdArch::Gfx90a => "gfx90a",
            AmdArch::Gfx942 => "gfx942",
            AmdArch::Gfx950 => "gfx950",
            AmdArch::Gfx1100 => "gfx1100",
            AmdArch::Gfx1200 => "gfx1200",
            AmdArch::Gfx1201 => "gfx1201",
        }
    }

    /// Every AMD architecture Tessera compiles for.
    pub const ALL: [AmdArch; 6] = [
        AmdArch::Gfx90a,
        AmdArch::Gfx942,
        AmdArch::Gfx950,
        AmdArch::Gfx1100,
        AmdArch::Gfx1200,
        AmdArch::Gfx1201,
    ];

    /// RDNA (gfx11, gfx12): wave 32 and WMMA; CDNA (gfx9) is wave 64 and MFMA.
    pub fn is_rdna(self) -> bool {
        matches!(self, AmdArch::Gfx1100 | AmdArch::Gfx1200 | AmdArch::Gfx1201)
    }

    /// RDNA4 (gfx12): its WMMA takes eight elements of A and B per lane.
    pub fn is_gfx12(self) -> bool {
        matches!(self, AmdArch::Gfx1200 | AmdArch::Gfx1201)
    }

    /// Bytes of LDS one workgroup may use: 160 KiB on gfx950, 64 KiB elsewhere.
    pub fn lds_bytes(self) -> u32 {
        match self {
            AmdArch::Gfx950 => 160 * 1024,
            _ => 64 * 1024,
        }
    }

    /// The code object version Tessera emits for this target: 5 on every one. LLVM 22
    /// defaults to version 6, which ROCm before 6.3 refuses
    /// (`HSA_STATUS_ERROR_INVALID_CODE_OBJECT`); version 5 loads on ROCm 5.x and 6.x.
    /// This table is the one place to change it per target.
    pub fn code_object_version(self) -> u32 {
        match self {
            AmdArch::Gfx90a
            | AmdArch::Gfx942
            | AmdArch::Gfx950
            | AmdArch::Gfx1100
            | AmdArch::Gfx1200
            | AmdArch::Gfx1201 => 5,
        }
    }
}

/// Every target the test suite validates.
pub const ALL_TARGETS: [Target; 8] = [
    Target::nvptx(80),
    Target::nvptx(90),
    Target::SM90A,
    Target::Amdgpu(AmdArch::Gfx90a),
    Target::Amdgpu(AmdArch::Gfx942),
    Target::Amdgpu(AmdArch::Gfx950),
    Target::Amdgpu(AmdArch::Gfx1100),
    Target::Amdgpu(AmdArch::Gfx1200),
];

/// The two vendor flavors of the SIMT emulator (not GPU targets: kept out of
/// [`ALL_TARGETS`]); [`EmuFlavor::Sm90a`] and the newer AMD ones
/// ([`EMU_MATRIX_FLAVORS`]) are run where a kernel has a `dot`.
pub const EMU_TARGETS: [Target; 2] = [Target::Emu(EmuFlavor::Nv), Target::Emu(EmuFlavor::Amd)];

/// The flavours that differ from [`EMU_TARGETS`] only in their matrix instructions
/// (and what follows from them: layouts, shared-memory arrays), run where a kernel
/// has a `dot`: sm_90a's `wgmma`, gfx950's MFMA, RDNA3's and RDNA4's WMMA.
pub const EMU_MATRIX_FLAVORS: [EmuFlavor; 4] = [
    EmuFlavor::Sm90a,
    EmuFlavor::Gfx950,
    EmuFlavor::Gfx1100,
    EmuFlavor::Gfx1200,
];

/// The Hopper emulator flavor, `emu-sm90a`.
pub const EMU_SM90A: Target = Target::Emu(EmuFlavor::Sm90a);

/// A target name that is not one of `sm_80`, `sm_86`, `sm_89`, `sm_90`, `sm_90a`,
/// `gfx90a`, `gfx942`, `gfx950`, `gfx1100`, `gfx1200`, `gfx1201`, or an emulator
/// flavour ([`EmuFlavor::name`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown target `{0}` (expected sm_80, sm_86, sm_89, sm_90, sm_90a, gfx90a, gfx942, gfx950, gfx1100, gfx1200, gfx1201, emu-nv, emu-amd, emu-sm90a, emu-gfx950, emu-gfx1100 or emu-gfx1200)"
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
            _ => AmdArch::ALL
                .into_iter()
                .find(|a| a.name() == s)
                .map(Target::Amdgpu)
                .or_else(|| {
                    EmuFlavor::ALL
                        .into_iter()
                        .find(|f| f.name() == s)
                        .map(Target::Emu)
                })
                .ok_or_else(|| UnknownTarget(s.to_string())),
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
            Target::Emu(e) => f.write_str(e.name()),
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
            Target::Nvptx { .. } => 32,
            Target::Amdgpu(a) if a.is_rdna() => 32,
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
            Target::Amdgpu(a) if a.is_rdna() => "+wavefrontsize32",
            Target::Amdgpu(_) => "+wavefrontsize64",
            Target::Emu(_) => "",
        }
    }

    /// True when `dot` on f16/bf16 can use the matrix units: `mma.sync` (sm_80+),
    /// MFMA (CDNA) or WMMA (RDNA3, RDNA4); the emulator emulates them.
    pub fn has_matrix_units(self) -> bool {
        match self {
            Target::Nvptx { sm, .. } => sm >= 80,
            Target::Amdgpu(_) | Target::Emu(_) => true,
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
            Target::Amdgpu(a) => a.lds_bytes(),
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
        for t in ALL_TARGETS
            .into_iter()
            .chain(AmdArch::ALL.map(Target::Amdgpu))
            .chain(EmuFlavor::ALL.map(Target::Emu))
        {
            assert_eq!(t.to_string().parse::<Target>(), Ok(t));
        }
        assert_eq!(Target::Amdgpu(AmdArch::Gfx1200).warp_size(), 32);
        assert_eq!(Target::Emu(EmuFlavor::Gfx950).warp_size(), 64);
        assert_eq!(
            Target::Amdgpu(AmdArch::Gfx950).shared_memory_limit(),
            163_840
        );
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
