//! # tessera-codegen
//!
//! Lowers verified tile IR to GPU code through LLVM (inkwell):
//!
//! ```text
//! tile IR ──axis info──▶ layouts ──lower──▶ SIMT LLVM IR ──LLVM──▶ PTX (nvptx)
//!                                                       └────────▶ object ─ld.lld─▶ HSACO (amdgpu)
//! ```
//!
//! - [`target`]: the targets and everything vendor-specific about them;
//! - [`layout`]: how a tile's elements are spread over registers, lanes and warps;
//! - [`axis`]: contiguity/divisibility analysis that licenses wide memory accesses;
//! - [`lower`]: tile IR to SIMT LLVM IR, written once for every target;
//! - the compile driver (`driver.rs`: lower, link, emit, in order) and [`emit`]: LLVM
//!   IR to PTX text or an HSACO code object;
//! - [`comm`]: the ABI of communicating kernels (hidden parameters, error records);
//! - [`nvshmem`]: NVSHMEM's device library, linked into kernels that reach other
//!   nodes ([`CommEngine`]);
//! - [`tileir`]: the second NVIDIA backend, Tile IR bytecode for NVIDIA's `tileiras`
//!   (Blackwell included);
//! - [`tools`]: offline validators (ptxas, SASS and AMDGPU disassembly, resource usage);
//! - [`emu`]: the SIMT emulator (the GPU lowering JIT-compiled for the host), one
//!   launch entry [`emu::launch_with`];
//! - [`cpu`]: the compiled CPU device (tile IR to vectorized host code), compiled by
//!   [`cpu::compile`] and launched by [`cpu::launch_with`].

pub mod axis;
pub mod cpu;
/// The device-side ABI of communicating kernels (hidden parameters, control words,
/// error records): [`tessera_ir::comm`], which needs no LLVM.
pub use tessera_ir::comm;
mod driver;
pub mod emit;
pub mod emu;
pub mod fp8;
mod host;
pub mod host_cpu;
pub mod layout;
pub mod lower;
mod machine;
pub mod nvshmem;
pub mod pipeline;
pub mod target;
pub mod tileir;
pub mod tools;

pub use target::{AmdArch, EmuFlavor, Target, Vendor};

use tessera_ir::{Function, Span};

/// Options of one compilation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Warps (wavefronts) per program instance; the block has
    /// `num_warps * warp_size` threads. A power of two from 1 to 16.
    pub num_warps: u32,
    /// Loop iterations whose `dot` operand tiles are in flight at once
    /// ([`pipeline`]): 1 turns pipelining off, `None` takes the target's default
    /// ([`lower::arch::Arch::default_num_stages`]). At most 8.
    pub num_stages: Option<u32>,
    /// How a communicating kernel reaches its peers ([`CommEngine`]).
    pub engine: CommEngine,
    /// Warp specialization of a loop whose `dot` operands arrive by TMA (sm_90a,
    /// the emulator's `emu-sm90a`): a producer warpgroup issues the copies into the
    /// ring while the consumer warpgroups (`num_warps` of them) only compute
    /// ([`lower`]'s `plan::ring` decides where it applies). `None`: where it
    /// applies; `Some(false)`: never. (`Some(true)` is the same as `None`: a loop
    /// it cannot apply to is lowered without it.)
    pub warp_specialize: Option<bool>,
    /// Thread-block clusters (sm_90 and newer, `emu-sm90a`): the launch groups its
    /// programs into clusters of `x * y * z` (at most 8) co-scheduled on one GPC,
    /// and a warp-specialized TMA ring multicasts an operand that every program of
    /// a cluster row loads alike (its coordinates do not depend on `program_id`
    /// along a clustered axis) to all of them, each issuing a share of the copies.
    /// `[1, 1, 1]` (the default): no clusters. Targets without clusters ignore it.
    pub cluster: [u32; 3],
    /// Consumer groups of a warp-specialized persistent kernel (sm_90a,
    /// `emu-sm90a`): with 2 ("ping-pong"), two groups of `num_warps` warps each take
    /// alternate tiles of the loop over tiles, one group's main loop issuing `wgmma`
    /// while the other runs its epilogue, their main loops ordered by named
    /// barriers; the producer feeds both from one ring. 1: the consumer warps
    /// work on every tile together. `None`: the compiler's choice (2 where it
    /// applies: one warpgroup per tile and room for a second group's registers).
    /// Kernels it does not apply to ignore it.
    pub consumer_groups: Option<u32>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            num_warps: 4,
            num_stages: None,
            engine: CommEngine::Direct,
            warp_specialize: None,
            cluster: [1, 1, 1],
            consumer_groups: None,
        }
    }
}

impl CompileOptions {
    /// Programs per cluster (1: no clusters).
    pub fn cluster_size(&self) -> u32 {
        self.cluster.iter().product()
    }
}

/// How a communicating kernel reaches its peers' symmetric heaps.
///
/// - [`CommEngine::Direct`]: every peer is reached by loads, stores and atomics
///   through mapped memory (threads, processes on one node, CUDA/HIP IPC).
/// - [`CommEngine::Nvshmem`]: peers on this node still are; a peer on another node
///   is reached through NVSHMEM's device library, linked into the kernel (NVIDIA
///   targets, and the emulator, which implements those functions from their
///   documented semantics). The heap-base table marks an off-node peer by a tag in
///   the top byte of its entry ([`crate::comm::OFF_NODE_SHIFT`]); every load, store
///   and atomic through a pointer that may be remote tests the tag and calls
///   `nvshmem_uintN_p`/`_g`/`_atomic_*` for a tagged one; a signal to an off-node
///   peer is `nvshmemx_signal_op`, after every thread's `nvshmem_quiet`; a
///   system-scope release fence (`quiet`), `barrier_all` and the kernel's end also
///   quiet. See [`lower::engine`].
/// - [`CommEngine::Rocshmem`]: the same hook for AMD's rocSHMEM; compiling with it
///   fails with [`CodegenError::Tool`] until rocSHMEM's device library is found
///   (see [`lower::engine`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CommEngine {
    /// Mapped memory only.
    #[default]
    Direct,
    /// NVSHMEM for off-node peers.
    Nvshmem,
    /// rocSHMEM for off-node peers (not available yet).
    Rocshmem,
}

impl CompileOptions {
    /// `num_warps` warps, the target's default stages.
    pub fn warps(num_warps: u32) -> CompileOptions {
        CompileOptions {
            num_warps,
            ..CompileOptions::default()
        }
    }
}

/// What the runtime needs to know to launch a compiled kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelMeta {
    /// The symbol of the kernel entry point.
    pub name: String,
    /// Threads per block (`num_warps * warp_size`).
    pub num_threads: u32,
    /// Static shared memory in bytes.
    pub shared_bytes: u32,
}

/// A compiled kernel.
#[derive(Clone, Debug)]
pub struct Artifact {
    /// What it was compiled for.
    pub target: Target,
    /// Launch facts.
    pub meta: KernelMeta,
    /// What a driver loads: PTX text (NVIDIA) or an HSACO code object (AMD).
    pub binary: Vec<u8>,
    /// Human-readable assembly: the PTX, or the AMDGCN assembly.
    pub asm: String,
    /// The optimized LLVM IR.
    pub llvm_ir: String,
}

/// Why a kernel could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// The kernel uses something this target does not support yet.
    #[error("{span}: kernel `{kernel}`: {message} is not supported on {target}")]
    Unsupported {
        /// The kernel.
        kernel: String,
        /// The target.
        target: Target,
        /// Where.
        span: Span,
        /// What.
        message: String,
    },
    /// Invalid options.
    #[error("invalid compile options: {0}")]
    Options(String),
    /// LLVM rejected the generated IR or failed to emit code: a bug in Tessera.
    #[error("internal error: LLVM failed for kernel `{kernel}` on {target}: {message}")]
    Llvm {
        /// The kernel.
        kernel: String,
        /// The target.
        target: Target,
        /// LLVM's message.
        message: String,
    },
    /// The kernel uses something the Tile IR backend ([`tileir`]) does not lower.
    #[error("{span}: kernel `{kernel}`: {message} (Tile IR backend)")]
    TileIr {
        /// The kernel.
        kernel: String,
        /// Where.
        span: Span,
        /// What.
        message: String,
    },
    /// An external tool (ld.lld) failed or is missing.
    #[error("{tool} failed: {message}")]
    Tool {
        /// The tool.
        tool: String,
        /// What happened.
        message: String,
    },
}

/// Compiles a verified kernel for `target`.
pub fn compile(
    func: &Function,
    target: Target,
    opts: &CompileOptions,
) -> Result<Artifact, CodegenError> {
    if !opts.num_warps.is_power_of_two() || opts.num_warps > 16 {
        return Err(CodegenError::Options(format!(
            "num_warps must be a power of two from 1 to 16, got {}",
            opts.num_warps
        )));
    }
    driver::compile(func, target, opts)
}
