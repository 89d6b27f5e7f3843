//! What devices are: their kinds and properties (the bottom of the runtime, with
//! [`crate::Error`]; every other module may use these).

/// The kind of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// The host CPU, running kernels with the reference interpreter (program instances
    /// in parallel on a thread pool).
    Cpu,
    /// An NVIDIA GPU through the CUDA driver.
    Cuda,
    /// An AMD GPU through the HIP runtime (feature `hip`).
    Hip,
    /// The SIMT emulator (feature `jit`): the GPU lowering JIT-compiled for the host,
    /// warps emulated with NVIDIA (`emu-nv`, ordinal 0) or AMD (`emu-amd`, ordinal 1)
    /// lane layouts.
    Emu,
}

/// Which vendor's lowering the emulator runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EmuKind {
    /// Warp 32 and `mma.sync` fragment layouts (as for sm_80).
    Nv,
    /// Wave 64 and MFMA layouts (as for gfx942).
    Amd,
    /// Warp 32 and the Hopper warpgroup instructions, `wgmma` (as for sm_90a).
    Sm90a,
}

impl EmuKind {
    /// The device name, as `TESSERA_DEVICE` spells it.
    pub fn name(self) -> &'static str {
        match self {
            EmuKind::Nv => "emu-nv",
            EmuKind::Amd => "emu-amd",
            EmuKind::Sm90a => "emu-sm90a",
        }
    }

    /// Threads per warp of the GPU it imitates.
    pub fn warp_size(self) -> u32 {
        match self {
            EmuKind::Nv | EmuKind::Sm90a => 32,
            EmuKind::Amd => 64,
        }
    }
}

/// What a device is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceProperties {
    /// The product name (`NVIDIA H200`, `AMD Instinct MI300X`, or `cpu`).
    pub name: String,
    /// The compilation target for it (`sm_90`, `gfx942`; `host` for the CPU).
    pub target: String,
    /// CUDA compute capability (major, minor); `None` elsewhere.
    pub compute_capability: Option<(u32, u32)>,
    /// The CUDA driver's API version (major, minor: `(13, 0)` for a CUDA 13.0 driver,
    /// r580); `None` elsewhere.
    pub driver_version: Option<(u32, u32)>,
    /// Streaming multiprocessors / compute units (CPU: worker threads).
    pub multiprocessors: u32,
    /// Threads per warp (wavefront); 1 on the CPU.
    pub warp_size: u32,
    /// Shared memory one block may use without opting in, in bytes.
    pub shared_per_block: usize,
    /// Shared memory one block may use after opting in, in bytes.
    pub shared_per_block_optin: usize,
    /// Device memory in bytes (0 for the CPU: host memory).
    pub total_memory: usize,
}
