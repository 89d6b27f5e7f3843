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
    /// Wave 64 and gfx950's double-`k` MFMA (as for MI350X/MI355X).
    Gfx950,
    /// Wave 32 and RDNA3's WMMA (as for gfx1100).
    Gfx1100,
    /// Wave 32 and RDNA4's WMMA (as for gfx1200/gfx1201).
    Gfx1200,
}

impl EmuKind {
    /// Every kind, in the order of their device ordinals.
    pub const ALL: [EmuKind; 6] = [
        EmuKind::Nv,
        EmuKind::Amd,
        EmuKind::Sm90a,
        EmuKind::Gfx950,
        EmuKind::Gfx1100,
        EmuKind::Gfx1200,
    ];

    /// The device name, as `TESSERA_DEVICE` spells it.
    pub fn name(self) -> &'static str {
        match self {
            EmuKind::Nv => "emu-nv",
            EmuKind::Amd => "emu-amd",
            EmuKind::Sm90a => "emu-sm90a",
            EmuKind::Gfx950 => "emu-gfx950",
            EmuKind::Gfx1100 => "emu-gfx1100",
            EmuKind::Gfx1200 => "emu-gfx1200",
        }
    }

    /// Its index among the emulator's kinds (the device's ordinal).
    pub fn ordinal(self) -> usize {
        EmuKind::ALL.iter().position(|&k| k == self).unwrap_or(0)
    }

    /// Whether it imitates an AMD GPU.
    pub fn is_amd(self) -> bool {
        !matches!(self, EmuKind::Nv | EmuKind::Sm90a)
    }

    /// Threads per warp of the GPU it imitates.
    pub fn warp_size(self) -> u32 {
        match self {
            EmuKind::Nv | EmuKind::Sm90a | EmuKind::Gfx1100 | EmuKind::Gfx1200 => 32,
            EmuKind::Amd | EmuKind::Gfx950 => 64,
        }
    }

    /// Multiprocessors of the GPU it imitates: an H100 SXM's 132 SMs, an MI300X's
    /// 304 CUs, an MI355X's 256, an RX 7900 XTX's 96 (48 WGPs of two CUs), an RX
    /// 9070 XT's 64. The emulator runs any number of programs at once; this is the
    /// budget its residency check holds a waiting kernel to, as on that GPU.
    pub fn multiprocessors(self) -> u32 {
        match self {
            EmuKind::Nv | EmuKind::Sm90a => 132,
            EmuKind::Amd => 304,
            EmuKind::Gfx950 => 256,
            EmuKind::Gfx1100 => 96,
            EmuKind::Gfx1200 => 64,
        }
    }

    /// Programs of `num_warps` warps one emulated multiprocessor holds at once: 2048
    /// threads, as on sm_80/sm_90 (64 warps of 32) and CDNA3 (32 waves of 64), at most
    /// 32 blocks.
    pub fn programs_per_multiprocessor(self, num_warps: u32) -> u32 {
        (2048 / (num_warps.max(1) * self.warp_size())).clamp(1, 32)
    }
}

/// How a part of a partitioned device ([`crate::Device::partition`]) keeps its
/// kernels to its own multiprocessors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Confinement {
    /// A CUDA green context of its own, holding its SMs (`cuGreenCtxCreate`): the
    /// hardware runs its kernels there and nowhere else.
    GreenContext,
    /// A HIP stream with a CU mask (`hipExtStreamCreateWithCUMask`): its kernels run
    /// on its CUs only.
    CuMask,
    /// Nothing confines it: its own stream, and launches of waiting kernels sized to
    /// its share of the multiprocessors, so every part's programs fit on the device
    /// at once (the emulator, or a GPU without green contexts or CU masks).
    Sized,
}

impl Confinement {
    /// How the output names it.
    pub fn describe(self) -> &'static str {
        match self {
            Confinement::GreenContext => "green context",
            Confinement::CuMask => "CU mask",
            Confinement::Sized => "sized launches",
        }
    }
}

/// One part of a partitioned device: which, of how many, and how it is confined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Part {
    /// Its index, from 0.
    pub index: u32,
    /// How many parts the device was split into.
    pub parts: u32,
    /// How its kernels are kept to its multiprocessors.
    pub confinement: Confinement,
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
    /// For a part of a partitioned device ([`crate::Device::partition`]): which part;
    /// `multiprocessors` is then the part's share.
    pub part: Option<Part>,
}
