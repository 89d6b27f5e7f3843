//! Executors: what runs a launch on each kind of device, behind one interface.
//!
//! [`crate::launch`] checks a launch's arguments, spreads its tensor descriptors over
//! their parameters, adds the debug buffer, and hands the result to [`run`] as a
//! [`Job`]; [`run`] picks the device's [`Executor`], whose
//! [`launch`](Executor::launch) runs the job (the host executors) or queues it on
//! the job's stream (GPUs). One file per executor:
//!
//! | file | executor | devices |
//! |---|---|---|
//! | `interp.rs` | [`interp::Interp`]: tessera-ir's reference interpreter | `interp`; `cpu` and `emu-*` without feature `jit` |
//! | `cpu.rs` | `cpu::Cpu` (feature `jit`): kernels compiled for the host ([`tessera_codegen::cpu`]), the interpreter for what it does not compile, the two in turns while a kernel compiles (`TESSERA_CPU_JIT=background`) | `cpu` |
//! | `emu.rs` | `emu::Emu` (feature `jit`): the SIMT emulator ([`tessera_codegen::emu`]) | `emu-nv`, `emu-amd`, `emu-sm90a` |
//! | `gpu.rs` | [`gpu::Gpu`]: a GPU through its [`crate::backend::GpuBackend`] (CUDA, HIP): specialization, binaries (artifacts, disk cache, JIT), the communicating kernels' hidden arguments and error records | `cuda:N`, `hip:N` |
//! | `tensor_map.rs` | [`tensor_map::build`]: a launch's tensor maps (TMA), built once, for the emulator and GPUs alike | |
//!
//! The executors sit beside `backend/`, not in it: a backend is the driver of one
//! GPU vendor and imports nothing but errors and properties, while an executor
//! needs devices, configuration, the compile cache and artifacts. In the layering of
//! `lib.rs` (checked by `tests/module_cycles.rs`) this module is above `compile` and
//! below `launch`: it imports neither `launch` nor `world`.
//!
//! **Contract.** A [`Job`]'s arguments are flat (one per kernel parameter, the debug
//! buffer last when the kernel prints or asserts), counted, on the launching device
//! and of its world; its grid is non-empty, each axis below 2^31. An executor adds
//! what its device needs (host arguments, GPU parameters, tensor maps, a
//! communicating kernel's hidden arguments), specializes the kernel on the launch's
//! facts where it compiles it, and returns the launch's error, if any, as an
//! [`Error`].

use std::sync::Arc;
use std::time::Duration;

use tessera_ir::ParamFacts;
use tessera_ir::interp::{HostBuffer, KernelArg, Scalar};

use crate::artifact::KernelOptions;
use crate::backend::RawStream;
use crate::buffer::{Buffer, Element, Storage};
use crate::compile::Compiled;
use crate::device::{Backend, Device};
use crate::error::Error;

#[cfg(feature = "jit")]
mod cpu;
#[cfg(feature = "jit")]
mod emu;
pub(crate) mod gpu;
pub(crate) mod interp;
pub(crate) mod tensor_map;

pub(crate) use tensor_map::TmaRequest;

/// Runs a launch on one kind of device: the interpreter, the compiled CPU, the SIMT
/// emulator, or a GPU backend. Each is a small value holding what is its own (the
/// emulator's flavour, the GPU's backend); [`run`] makes the device's.
pub(crate) trait Executor {
    /// Runs `job` (a host executor returns once every program has ended; a GPU's
    /// returns once the kernel is queued on `job.stream`, or has ended where it
    /// must be checked).
    fn launch(&self, job: &Job<'_>) -> Result<(), Error>;
}

/// Runs `job` with the executor of its device.
pub(crate) fn run(job: &Job<'_>) -> Result<(), Error> {
    match &job.device.backend {
        Backend::Interp => interp::Interp.launch(job),
        #[cfg(feature = "jit")]
        Backend::Cpu => cpu::Cpu.launch(job),
        #[cfg(feature = "jit")]
        Backend::Emu(kind) => emu::Emu(*kind).launch(job),
        // Without LLVM, the CPU device and the emulators run kernels on the
        // interpreter.
        #[cfg(not(feature = "jit"))]
        Backend::Cpu | Backend::Emu(_) => interp::Interp.launch(job),
        Backend::Gpu(g) => gpu::Gpu(g.as_ref()).launch(job),
    }
}

/// One launch as the executors see it (see the module docs for what it promises).
pub(crate) struct Job<'a> {
    /// The kernel's name, for errors.
    pub(crate) kernel: &'a str,
    /// The launching device.
    pub(crate) device: &'a Device,
    /// The kernel's IR (unspecialized).
    pub(crate) compiled: &'a Arc<Compiled>,
    /// The options that change the compiled code.
    pub(crate) kopts: &'a KernelOptions,
    /// The stream (GPUs; the host executors run at once).
    pub(crate) stream: RawStream,
    /// Program instances along x, y and z.
    pub(crate) grid: [u32; 3],
    /// A persistent grid (`Grid::persistent`): `grid[0]` is the tile count, which a
    /// GPU caps at the programs resident at once ([`Job::resident`]).
    pub(crate) persistent: bool,
    /// The device's launch watchdog (`TESSERA_LAUNCH_TIMEOUT`).
    pub(crate) watchdog: Option<Duration>,
    /// One argument per kernel parameter.
    pub(crate) args: &'a [FlatArg<'a>],
    /// The tensor maps a TMA target may build ([`tensor_map::build`]).
    pub(crate) tensor_maps: &'a [TmaRequest],
}

impl<'a> Job<'a> {
    /// The job with a persistent grid capped at `per_unit` programs per
    /// multiprocessor of the device (its part's share); other jobs as they are.
    pub(crate) fn resident(&self, per_unit: u32) -> Job<'a> {
        let mut grid = self.grid;
        if self.persistent {
            let units = self.device.properties().multiprocessors.max(1);
            // The cluster divides the grid: round down to a multiple of it.
            let c = self.kopts.cluster[0].max(1);
            let cap = (per_unit.max(1).saturating_mul(units) / c * c).max(c);
            grid[0] = grid[0].min(cap);
        }
        Job {
            grid,
            persistent: false,
            ..*self
        }
    }

    /// A launch error naming the kernel.
    pub(crate) fn invalid(&self, reason: String) -> Error {
        Error::Launch {
            kernel: self.kernel.to_string(),
            reason,
        }
    }

    /// The name of parameter `i`.
    pub(crate) fn param_name(&self, i: usize) -> String {
        self.compiled
            .func
            .params
            .get(i)
            .map(|p| p.name.clone())
            .unwrap_or_default()
    }
}

/// One kernel parameter's argument, tensor descriptors spread over their
/// parameters already ([`crate::launch`]).
#[derive(Clone)]
pub(crate) enum FlatArg<'a> {
    /// A buffer.
    Buffer {
        /// Its storage.
        storage: &'a Storage,
        /// Its size in bytes.
        bytes: usize,
        /// The device it lives on.
        device: &'a Device,
    },
    /// A symmetric buffer.
    Symmetric {
        /// This rank's copy.
        storage: &'a Storage,
        /// Its size in bytes.
        bytes: usize,
        /// The device it lives on.
        device: &'a Device,
        /// Every rank's copy (host worlds).
        copies: &'a Arc<[Arc<HostBuffer>]>,
        /// The identity of the world it was allocated in
        /// ([`crate::device::RankLink::world_id`]).
        world: usize,
    },
    /// A runtime scalar.
    Scalar(Scalar),
}

impl<'a> FlatArg<'a> {
    /// Buffer `b`.
    pub(crate) fn buffer<T: Element>(b: &'a Buffer<T>) -> FlatArg<'a> {
        FlatArg::Buffer {
            storage: &b.storage,
            bytes: b.len() * T::TY.size_bytes(),
            device: b.device(),
        }
    }
}

/// The arguments of a launch on the host (the interpreter, the compiled CPU, the
/// emulator): every buffer must be in host memory.
pub(crate) fn host_args(job: &Job<'_>) -> Result<Vec<KernelArg>, Error> {
    job.args
        .iter()
        .enumerate()
        .map(|(i, a)| match a {
            FlatArg::Buffer {
                storage: Storage::Host(raw),
                ..
            } => Ok(KernelArg::Buffer(Arc::clone(raw))),
            FlatArg::Buffer { .. } => Err(job.invalid(format!(
                "buffer `{}` is not in host memory",
                job.param_name(i)
            ))),
            FlatArg::Symmetric { copies, .. } => Ok(KernelArg::Symmetric(Arc::clone(copies))),
            FlatArg::Scalar(s) => Ok(KernelArg::Scalar(*s)),
        })
        .collect()
}

/// A scalar argument's value facts: an integer that is a multiple of 16 or equal to 1
/// (floats and booleans get none).
fn scalar_facts(s: &Scalar) -> ParamFacts {
    use Scalar as S;
    let v: i128 = match *s {
        S::I8(v) => v.into(),
        S::I16(v) => v.into(),
        S::I32(v) => v.into(),
        S::I64(v) => v.into(),
        S::U8(v) => v.into(),
        S::U16(v) => v.into(),
        S::U32(v) => v.into(),
        S::U64(v) => v.into(),
        _ => return ParamFacts::default(),
    };
    ParamFacts::of_int(v)
}

/// Buffers smaller than this get [`ParamFacts::within_2gib`].
const TWO_GIB: usize = 1 << 31;

/// A launch's facts about argument `a`, a buffer at device address `addr` (nothing
/// is known of a buffer without one) or a scalar: what a kernel is specialized on.
pub(crate) fn arg_facts(a: &FlatArg<'_>, addr: Option<u64>) -> ParamFacts {
    match a {
        FlatArg::Buffer { bytes, .. } | FlatArg::Symmetric { bytes, .. } => addr
            .map_or_else(ParamFacts::default, |addr| {
                ParamFacts::new(addr.is_multiple_of(16), *bytes < TWO_GIB)
            }),
        FlatArg::Scalar(s) => scalar_facts(s),
    }
}

/// Whether `device` is a rank of a world whose ranks span several nodes (real or
/// emulated): its communicating kernels reach off-node peers through the vendor's
/// engine.
pub(crate) fn spans_nodes(device: &Device) -> bool {
    let nodes = device.comm.as_ref().and_then(|c| c.nodes());
    nodes.is_some_and(|n| n.iter().any(|&x| x != n[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_facts_are_multiples_of_16_and_ones() {
        use Scalar as S;
        let f = |s| {
            let f = scalar_facts(&s);
            (f.divisible_by_16, f.equal_to_one)
        };
        assert_eq!(f(S::I32(1)), (false, true));
        assert_eq!(f(S::U64(1)), (false, true));
        assert_eq!(f(S::I8(1)), (false, true));
        assert_eq!(f(S::I64(-16)), (true, false));
        assert_eq!(f(S::U32(0)), (true, false));
        assert_eq!(f(S::I32(17)), (false, false));
        assert_eq!(f(S::I32(-1)), (false, false));
        assert_eq!(f(S::F32(1.0)), (false, false));
        assert_eq!(f(S::I1(true)), (false, false));
    }
}
