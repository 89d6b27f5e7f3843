//! Compilation targets: what differs between GPUs, described once.
//!
//! The lowering is written once against [`TargetInfo`]; everything vendor-specific
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
    },
    /// AMD, by gfx architecture.
    Amdgpu(AmdArch),
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
}

/// Every target the test suite validates.
pub const ALL_TARGETS: [Target; 5] = [
    Target::Nvptx { sm: 80 },
    Target::Nvptx { sm: 90 },
    Target::Amdgpu(AmdArch::Gfx90a),
    Target::Amdgpu(AmdArch::Gfx942),
    Target::Amdgpu(AmdArch::Gfx1100),
];

/// A target name that is not one of `sm_80`, `sm_86`, `sm_89`, `sm_90`, `gfx90a`,
/// `gfx942`, `gfx1100`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown target `{0}` (expected sm_80, sm_86, sm_89, sm_90, gfx90a, gfx942 or gfx1100)")]
pub struct UnknownTarget(pub String);

impl FromStr for Target {
    type Err = UnknownTarget;
    fn from_str(s: &str) -> Result<Target, UnknownTarget> {
        match s {
            "sm_80" => Ok(Target::Nvptx { sm: 80 }),
            "sm_86" => Ok(Target::Nvptx { sm: 86 }),
            "sm_89" => Ok(Target::Nvptx { sm: 89 }),
            "sm_90" => Ok(Target::Nvptx { sm: 90 }),
            "gfx90a" => Ok(Target::Amdgpu(AmdArch::Gfx90a)),
            "gfx942" => Ok(Target::Amdgpu(AmdArch::Gfx942)),
            "gfx1100" => Ok(Target::Amdgpu(AmdArch::Gfx1100)),
            _ => Err(UnknownTarget(s.to_string())),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Nvptx { sm } => write!(f, "sm_{sm}"),
            Target::Amdgpu(a) => f.write_str(a.name()),
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

impl Target {
    /// NVIDIA or AMD.
    pub fn vendor(self) -> Vendor {
        match self {
            Target::Nvptx { .. } => Vendor::Nvidia,
            Target::Amdgpu(_) => Vendor::Amd,
        }
    }

    /// Threads per warp (wavefront): 32 on NVIDIA and RDNA, 64 on CDNA.
    pub fn warp_size(self) -> u32 {
        match self {
            Target::Nvptx { .. } | Target::Amdgpu(AmdArch::Gfx1100) => 32,
            Target::Amdgpu(_) => 64,
        }
    }

    /// The LLVM target triple.
    pub fn triple(self) -> &'static str {
        match self {
            Target::Nvptx { .. } => "nvptx64-nvidia-cuda",
            Target::Amdgpu(_) => "amdgcn-amd-amdhsa",
        }
    }

    /// The LLVM CPU name.
    pub fn cpu(self) -> String {
        match self {
            Target::Nvptx { sm } => format!("sm_{sm}"),
            Target::Amdgpu(a) => a.name().to_string(),
        }
    }

    /// LLVM target features. PTX ISA 8.0 is accepted by every CUDA 12.x and 13.x driver.
    pub fn features(self) -> &'static str {
        match self {
            Target::Nvptx { .. } => "+ptx80",
            Target::Amdgpu(AmdArch::Gfx1100) => "+wavefrontsize32",
            Target::Amdgpu(_) => "+wavefrontsize64",
        }
    }

    /// True when `dot` on f16/bf16 can use the matrix units: `mma.sync` (sm_80+) or
    /// MFMA (CDNA).
    pub fn has_matrix_units(self) -> bool {
        match self {
            Target::Nvptx { sm } => sm >= 80,
            Target::Amdgpu(a) => matches!(a, AmdArch::Gfx90a | AmdArch::Gfx942),
        }
    }

    /// LLVM address space of global memory.
    pub fn global_addrspace(self) -> u16 {
        1
    }

    /// LLVM address space of shared (LDS) memory.
    pub fn shared_addrspace(self) -> u16 {
        3
    }

    /// Bytes of shared memory one block may use without opting in to more.
    pub fn shared_memory_limit(self) -> u32 {
        match self {
            Target::Nvptx { .. } => 48 * 1024,
            Target::Amdgpu(_) => 64 * 1024,
        }
    }

    /// The file extension of the compiled artifact (`ptx` or `hsaco`).
    pub fn artifact_extension(self) -> &'static str {
        match self.vendor() {
            Vendor::Nvidia => "ptx",
            Vendor::Amd => "hsaco",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for t in ALL_TARGETS {
            assert_eq!(t.to_string().parse::<Target>(), Ok(t));
        }
        assert!("sm_70".parse::<Target>().is_err());
        assert_eq!(Target::Amdgpu(AmdArch::Gfx942).warp_size(), 64);
        assert_eq!(Target::Amdgpu(AmdArch::Gfx1100).warp_size(), 32);
    }
}
