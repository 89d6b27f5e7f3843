//! The SIMT emulator executor (feature `jit`): the kernel lowered for a GPU flavour
//! (`emu-nv`, `emu-amd`, `emu-sm90a`), JIT-compiled for the host and run by
//! [`tessera_codegen::emu::launch_with`], every access checked.
//!
//! Contract: every buffer argument is host memory. The kernel is specialized like a
//! GPU launch with these arguments (alignment, sizes, integers equal to 1, tensor
//! maps), so the emulator runs the code a GPU would; on `emu-sm90a` the
//! descriptors get the emulator's tensor maps ([`super::tensor_map::build`]),
//! registered for the launch. A communicating kernel runs as its device's rank
//! (the world's host heaps), through the vendor's off-node engine when the ranks
//! span emulated nodes; a wait that fails comes back as `EmuError::Comm`.

use tessera_codegen::emu::{EmuKernel, EmuLaunch, EmuLimits, EmuTensorMap, EmuWorld};
use tessera_codegen::target::EmuFlavor;
use tessera_codegen::{CommEngine, CompileOptions};
use tessera_ir::ParamFacts;
use tessera_ir::interp::{KernelArg, Scalar};

use super::{Executor, FlatArg, Job, arg_facts, host_args, spans_nodes, tensor_map};
use crate::buffer::Storage;
use crate::error::Error;
use crate::properties::EmuKind;

/// The SIMT emulator of one flavour.
pub(crate) struct Emu(pub(crate) EmuKind);

impl Executor for Emu {
    fn launch(&self, job: &Job<'_>) -> Result<(), Error> {
        let mut kargs = host_args(job)?;
        let device = job.device;
        let flavor = match self.0 {
            EmuKind::Nv => EmuFlavor::Nv,
            EmuKind::Amd => EmuFlavor::Amd,
            EmuKind::Sm90a => EmuFlavor::Sm90a,
            EmuKind::Gfx950 => EmuFlavor::Gfx950,
            EmuKind::Gfx1100 => EmuFlavor::Gfx1100,
            EmuKind::Gfx1200 => EmuFlavor::Gfx1200,
        };
        // Ranks on several (emulated) nodes: off-node peers through the vendor's
        // engine (the emulator implements its functions).
        let nodes = device.comm.as_ref().and_then(|c| c.nodes());
        let engine = match (spans_nodes(device), flavor) {
            (false, _) => CommEngine::Direct,
            (true, _) if self.0.is_amd() => CommEngine::Rocshmem,
            (true, _) => CommEngine::Nvshmem,
        };
        let copts = CompileOptions {
            num_warps: job.kopts.num_warps,
            num_stages: job.kopts.num_stages,
            engine,
            warp_specialize: job.kopts.warp_specialize,
            cluster: job.kopts.cluster,
            consumer_groups: job.kopts.consumer_groups,
        };
        // A kernel that waits for other programs needs all of them resident, as on
        // the GPU imitated (or the device's part of it).
        if job.compiled.func.uses_blocking() {
            let programs = job.grid.iter().map(|&g| u64::from(g)).product();
            crate::backend::check_resident(
                job.kernel,
                &device.name(),
                programs,
                self.0.programs_per_multiprocessor(copts.num_warps),
                device.properties().multiprocessors,
            )?;
        }
        // Specialized like a GPU launch with these arguments, so the emulator runs
        // the code a GPU would.
        let mut spec: Vec<ParamFacts> = job
            .args
            .iter()
            .map(|a| arg_facts(a, host_address(a)))
            .collect();
        // On emu-sm90a, tensor maps for TMA copies (registered for the launch; a
        // descriptor without one reads through masked loads).
        let maps = if flavor == EmuFlavor::Sm90a {
            tensor_map::build(
                job.args,
                job.tensor_maps,
                host_address,
                &mut spec,
                |m| {
                    let map = EmuTensorMap::new(
                        m.base,
                        m.elem_bytes,
                        m.dims,
                        m.strides,
                        m.box_dims,
                        m.swizzle,
                    );
                    Ok(map.ok().map(|map| {
                        let h = map.register();
                        (h.id(), h)
                    }))
                },
                |arg, id| kargs[arg] = KernelArg::Scalar(Scalar::U64(id)),
            )?
        } else {
            Vec::new()
        };
        let compiled = job.compiled.specialized(spec);
        // Communicating kernels get this rank's hidden arguments; a wait that fails
        // comes back as `EmuError::Comm` (decoded from the rank's error record).
        // SAFETY: the world's host heaps (one per rank, each starting with its
        // control words, `HEAP_ALIGN`-aligned) outlive the launch: the rank's
        // `Shared` holds them, and `c` holds it.
        let world = device.comm.as_ref().map(|c| {
            let w = unsafe { EmuWorld::new(c.rank(), c.host_heap_bases(), c.timeout()) };
            match &nodes {
                Some(n) => w.with_nodes(n.clone()),
                None => w,
            }
        });
        let config = crate::config::get()?;
        config.choose_host_cpu()?;
        let limits = EmuLimits {
            timeout: job.watchdog,
            barrier_timeout: Some(config.emu_barrier_timeout),
            dump_llvm: config.dump.contains("emu-llvm"),
        };
        tessera_codegen::emu::launch_with(
            &EmuKernel::new(&compiled.func, flavor, &copts),
            &EmuLaunch {
                grid: job.grid,
                args: &kargs,
                world: world.as_ref(),
                limits,
            },
        )
        .map_err(|e| Error::Emu(Box::new(e)))?;
        drop(maps);
        Ok(())
    }
}

/// The host address of a buffer argument (`None` for a scalar, or a buffer that is
/// not host memory).
fn host_address(a: &FlatArg<'_>) -> Option<u64> {
    match a {
        FlatArg::Buffer {
            storage: Storage::Host(raw),
            ..
        }
        | FlatArg::Symmetric {
            storage: Storage::Host(raw),
            ..
        } => Some(raw.as_mut_ptr() as u64),
        _ => None,
    }
}
