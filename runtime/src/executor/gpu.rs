//! The GPU executor: a kernel on a GPU through its backend ([`GpuBackend`]: CUDA,
//! HIP), whichever vendor it is.
//!
//! Contract: every buffer argument is device memory of the launching GPU (its
//! address is the parameter). The kernel is specialized on the launch's facts
//! (aligned addresses, integers that are multiples of 16 or equal to 1, buffers
//! under 2 GiB, tensor maps) and its binary found in the device's artifact folder,
//! else (feature `jit`) the disk cache or the compiler; the backend loads it once
//! per key. On `sm_90a` the descriptors get the driver's tensor maps
//! ([`super::tensor_map::build`]). A communicating kernel gets the rank's hidden
//! arguments, is compiled for the vendor's off-node engine when the world spans
//! nodes, and is synchronized after the launch so that a trap or a failed wait is
//! reported as its own error; other kernels are only queued on the job's stream.
//!
//! On CUDA GPUs a launch is compiled by one of two code generators
//! ([`KernelBackend`]): Tessera's LLVM lowering (PTX) or NVIDIA's Tile IR (a cubin
//! from `tileiras`, target `tileir-sm_*`, no tensor maps; the same hidden arguments).
//! When the device chose Tile IR (compute capability 10.0 and later) and the kernel
//! has no Tile IR binary (an op Tile IR lacks, no `tileiras`, a world across nodes), the
//! launch falls back to LLVM, logged once; the refusal is remembered per key.

use std::sync::{Arc, Mutex};

use tessera_ir::interp;
use tessera_ir::{Function, ParamFacts};

use super::{Executor, FlatArg, Job, arg_facts, spans_nodes, tensor_map};
#[cfg(not(feature = "jit"))]
use crate::artifact::ArtifactStore;
use crate::artifact::{KernelBackend, KernelBinary, KernelOptions, kernel_key, tile_ir_target};
use crate::backend::{GpuArg, GpuBackend, RawStream};
use crate::compile::Compiled;
use crate::device::Device;
use crate::disk_cache::CacheKey;
use crate::error::Error;
use crate::properties::DeviceKind;

/// A GPU, through its backend.
pub(crate) struct Gpu<'g>(pub(crate) &'g dyn GpuBackend);

impl Executor for Gpu<'_> {
    fn launch(&self, job: &Job<'_>) -> Result<(), Error> {
        let (backend, may_fall_back) = choose_backend(job)?;
        if backend == KernelBackend::TileIr {
            match self.launch_tile_ir(job) {
                Ok(()) => return Ok(()),
                Err(TileIr::Refused(why)) if may_fall_back => note_fallback(job.kernel, &why),
                Err(TileIr::Refused(why)) => {
                    return Err(job.invalid(format!("not compiled through Tile IR: {why}")));
                }
                Err(TileIr::Failed(e)) => return Err(e),
            }
        }
        self.launch_llvm(job)
    }
}

/// Why a Tile IR launch did not happen.
enum TileIr {
    /// The kernel has no Tile IR binary here (no target, an op Tile IR lacks, no
    /// `tileiras`, no artifact): the device's choice falls back to LLVM.
    Refused(String),
    /// The binary was there and loading or launching it failed.
    Failed(Error),
}

/// The launch's code generator and whether it may fall back to LLVM (only when the
/// device chose): [`LaunchOptions::backend`], else `TESSERA_KERNEL_BACKEND` (on CUDA
/// GPUs), else [`KernelBackend::for_device`].
///
/// [`LaunchOptions::backend`]: crate::LaunchOptions::backend
fn choose_backend(job: &Job<'_>) -> Result<(KernelBackend, bool), Error> {
    if let Some(b) = job.kopts.backend {
        return Ok((b, false));
    }
    if job.device.kind() == DeviceKind::Cuda
        && let Some(b) = crate::config::get()?.kernel_backend
    {
        return Ok((b, false));
    }
    Ok((KernelBackend::for_device(job.device), true))
}

/// Logs (once per kernel and reason) that the device's choice of Tile IR fell back
/// to LLVM.
fn note_fallback(kernel: &str, why: &str) {
    static SEEN: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let k = (kernel.to_string(), why.to_string());
    if !seen.contains(&k) {
        log::info!("kernel `{kernel}` runs on the LLVM path: {why}");
        seen.push(k);
    }
}

impl Gpu<'_> {
    /// The launch through Tile IR: the kernel specialized on the launch's facts (which
    /// become Tile IR assumptions), its cubin from the artifact folder, the disk cache
    /// or `tileiras`, launched one tile block per program with a block of (1, 1, 1).
    /// No tensor maps (`tileiras` builds its own TMA descriptors); a communicating
    /// kernel gets the hidden arguments of the SIMT path's ABI and the same checks
    /// after the launch (a world across nodes stays on the SIMT path: NVSHMEM).
    fn launch_tile_ir(&self, job: &Job<'_>) -> Result<(), TileIr> {
        let (g, device) = (self.0, job.device);
        let target = tile_ir_target(device).map_err(TileIr::Refused)?;
        let func = &job.compiled.func;
        if func.uses_comm() && spans_nodes(device) {
            return Err(TileIr::Refused(
                "it communicates on a world across nodes (NVSHMEM's device library links into PTX only)"
                    .into(),
            ));
        }
        let invalid = |r| TileIr::Failed(job.invalid(r));
        let (mut gargs, spec) = gpu_args(job.args).map_err(invalid)?;
        gargs.extend(gpu_comm_args(device, func).map_err(invalid)?);
        let kopts = &KernelOptions {
            backend: Some(KernelBackend::TileIr),
            off_node: false,
            ..job.kopts.clone()
        };
        let (compiled, key) = gpu_specialization(device, &target, job.compiled, spec, kopts)
            .map_err(TileIr::Failed)?;
        if let Some(why) = refused(&key, None) {
            return Err(TileIr::Refused(why));
        }
        let mut why = None;
        let k = g.load(&key.hex(), &mut || {
            resolve_binary(device, &target, &compiled, &key, kopts)
                .inspect_err(|e| why = Some(e.to_string()))
        });
        let k = match (k, why) {
            (Ok(k), _) => k,
            (Err(_), Some(why)) => {
                return Err(TileIr::Refused(
                    refused(&key, Some(why)).unwrap_or_default(),
                ));
            }
            (Err(e), None) => return Err(TileIr::Failed(e)),
        };
        let job = &resident(g, job, k.as_ref()).map_err(TileIr::Failed)?;
        launch_checked(g, job, k.as_ref(), &gargs, &compiled.func, || ()).map_err(TileIr::Failed)
    }

    /// The launch through Tessera's LLVM lowering.
    fn launch_llvm(&self, job: &Job<'_>) -> Result<(), Error> {
        let (g, device) = (self.0, job.device);
        let invalid = |reason| job.invalid(reason);
        let (mut gargs, mut spec) = gpu_args(job.args).map_err(invalid)?;
        // TMA: the driver's tensor maps; a descriptor without one (unaligned, a block
        // TMA cannot copy, an encoding the driver refuses, a backend without TMA)
        // reads through masked loads, with the same results. The maps stay alive
        // until the launch is queued.
        let maps = if device.gpu_target() == Some("sm_90a") {
            tensor_map::build(
                job.args,
                job.tensor_maps,
                device_address,
                &mut spec,
                |m| Ok(g.tensor_map(m)?.map(|map| (map.addr, map))),
                |arg, addr| gargs[arg] = GpuArg::U64(addr),
            )?
        } else {
            Vec::new()
        };
        gargs.extend(gpu_comm_args(device, &job.compiled.func).map_err(invalid)?);
        // A world across nodes: compiled for the vendor's engine (and keyed so).
        let kopts = &KernelOptions {
            off_node: job.compiled.func.uses_comm() && spans_nodes(device),
            backend: Some(KernelBackend::Llvm),
            ..job.kopts.clone()
        };
        let target = device
            .gpu_target()
            .ok_or_else(|| invalid("not a GPU device".into()))?;
        let (compiled, key) = gpu_specialization(device, target, job.compiled, spec, kopts)?;
        let k = g.load(&key.hex(), &mut || {
            resolve_binary(device, target, &compiled, &key, kopts)
        })?;
        let job = &resident(g, job, k.as_ref())?;
        launch_checked(g, job, k.as_ref(), &gargs, &compiled.func, || drop(maps))
    }
}

/// Queues `k` with `args` on the job's stream, then `queued()` (what must live until
/// the launch is queued goes there), then the checks after a communicating kernel: a
/// trap, a failed wait's error record.
/// `job` with its persistent grid capped at the programs of `k` the device (or its
/// part) holds at once: the kernel's occupancy per multiprocessor times theirs.
fn resident<'a>(
    g: &dyn GpuBackend,
    job: &Job<'a>,
    k: &dyn crate::backend::GpuKernel,
) -> Result<Job<'a>, Error> {
    let per_unit = if job.persistent { g.occupancy(k)? } else { 1 };
    Ok(job.resident(per_unit))
}

fn launch_checked(
    g: &dyn GpuBackend,
    job: &Job<'_>,
    k: &dyn crate::backend::GpuKernel,
    args: &[GpuArg],
    func: &Function,
    queued: impl FnOnce(),
) -> Result<(), Error> {
    g.launch(
        k,
        job.grid,
        job.kopts.cluster,
        args,
        func.uses_blocking(),
        job.stream,
    )?;
    queued();
    check_trap(g, job.stream, func)?;
    check_comm_record(job.device, g, job.stream, func)
}

/// The refusal recorded for the Tile IR key `key`, after recording `why` when given:
/// a kernel Tile IR refused once is not compiled again on every launch.
fn refused(key: &CacheKey, why: Option<String>) -> Option<String> {
    static REFUSED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());
    let mut r = REFUSED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(why) = why {
        r.push((key.hex(), why));
    }
    r.iter()
        .find(|(k, _)| *k == key.hex())
        .map(|(_, w)| w.clone())
}

/// The device address of a buffer argument (`None` for a scalar, or a buffer that
/// is not device memory).
fn device_address(a: &FlatArg<'_>) -> Option<u64> {
    match a {
        FlatArg::Buffer { storage, .. } | FlatArg::Symmetric { storage, .. } => {
            storage.device_address()
        }
        FlatArg::Scalar(_) => None,
    }
}

fn gpu_scalar(s: interp::Scalar) -> GpuArg {
    use interp::Scalar as S;
    match s {
        S::I1(b) => GpuArg::U8(b as u8),
        S::I8(v) => GpuArg::U8(v as u8),
        S::U8(v) => GpuArg::U8(v),
        S::I16(v) => GpuArg::U16(v as u16),
        S::U16(v) => GpuArg::U16(v),
        S::F16(v) => GpuArg::U16(v.to_bits()),
        S::BF16(v) => GpuArg::U16(v.to_bits()),
        S::I32(v) => GpuArg::U32(v as u32),
        S::U32(v) => GpuArg::U32(v),
        S::F32(v) => GpuArg::U32(v.to_bits()),
        S::I64(v) => GpuArg::U64(v as u64),
        S::U64(v) => GpuArg::U64(v),
        S::F64(v) => GpuArg::U64(v.to_bits()),
    }
}

/// A GPU launch's arguments (buffers by device address) and its specialization: which
/// arguments are divisible by 16 (aligned addresses, integer multiples of 16), which
/// integers equal 1, and which buffers are smaller than 2 GiB.
fn gpu_args(args: &[FlatArg<'_>]) -> Result<(Vec<GpuArg>, Vec<ParamFacts>), String> {
    args.iter()
        .map(|a| match a {
            FlatArg::Buffer { .. } | FlatArg::Symmetric { .. } => {
                let addr = device_address(a).ok_or("buffer storage mismatch")?;
                Ok((GpuArg::U64(addr), arg_facts(a, Some(addr))))
            }
            FlatArg::Scalar(s) => Ok((gpu_scalar(*s), arg_facts(a, None))),
        })
        .collect::<Result<Vec<_>, &str>>()
        .map(|v| v.into_iter().unzip())
        .map_err(str::to_string)
}

/// The hidden parameters of a communicating kernel on a GPU rank (none for other
/// kernels): `rank, world_size, heap_bases, timeout_ns` (the codegen's comm ABI).
fn gpu_comm_args(device: &Device, func: &Function) -> Result<Vec<GpuArg>, String> {
    if !func.uses_comm() {
        return Ok(Vec::new());
    }
    let c = device.comm.as_ref().ok_or(
        "the kernel communicates: launch it on a rank's device (`rank.device()` of a World)",
    )?;
    let hidden = c.gpu_hidden_args().ok_or(
        "the kernel communicates, but this rank's world has no heaps on this GPU (build it with `World::local(n).on(&gpu)` or `World::on_each`)",
    )?;
    Ok(hidden.to_vec())
}

/// After a GPU launch of a kernel that waits: synchronizes, and turns a device-side
/// error record (a wait that timed out, or was released by another rank's failure)
/// into an error naming the wait's file:line:col. Other kernels are not synchronized.
/// A communicating kernel can trap on the device (`remote_ptr` of a peer out of
/// range): wait for it here, so the fault is reported as this kernel's, not as a
/// sticky error of whatever call comes next.
fn check_trap(gpu: &dyn GpuBackend, stream: RawStream, func: &Function) -> Result<(), Error> {
    if !func.uses_comm() {
        return Ok(());
    }
    gpu.synchronize(stream).map_err(|e| Error::Launch {
        kernel: func.name.clone(),
        reason: format!(
            "the kernel faulted on the device (a trap: e.g. a peer rank out of range in `remote_ptr`); the device is unusable until the process restarts: {e}"
        ),
    })
}

fn check_comm_record(
    device: &Device,
    gpu: &dyn GpuBackend,
    stream: RawStream,
    func: &Function,
) -> Result<(), Error> {
    let Some(c) = device.comm.as_ref().filter(|_| func.uses_blocking()) else {
        return Ok(());
    };
    gpu.synchronize(stream)?;
    let words = c.ctrl_words()?;
    match tessera_ir::comm::decode_record(func, c.rank(), &words, c.timeout()) {
        Some(fault) => {
            c.abort();
            Err(Error::CommFault(Box::new(fault)))
        }
        None => Ok(()),
    }
}

/// The specialization of `compiled` a GPU launch with facts `spec` runs, and its key
/// for `target` (`sm_90a`, `tileir-sm_100`, ...).
/// Without the `jit` feature only precompiled artifacts can run, and those cover
/// divisibility but not the specialization of 1 ([`Specialization::for_launches`]):
/// when the artifact folder has no binary specialized on the integers equal to 1,
/// the launch runs the one without those facts (correct for every value).
///
/// [`Specialization::for_launches`]: crate::artifact::Specialization::for_launches
fn gpu_specialization(
    device: &Device,
    target: &str,
    compiled: &Compiled,
    spec: Vec<ParamFacts>,
    kopts: &KernelOptions,
) -> Result<(Arc<Compiled>, CacheKey), Error> {
    let ones = spec.iter().any(|f| f.equal_to_one);
    let general: Vec<ParamFacts> = spec
        .iter()
        .map(|f| ParamFacts {
            equal_to_one: false,
            ..*f
        })
        .collect();
    let exact = compiled.specialized(spec);
    let key = kernel_key(&exact.ir_text, target, kopts);
    if cfg!(feature = "jit") || !ones {
        return Ok((exact, key));
    }
    let precompiled = device
        .artifact_store()?
        .is_some_and(|s| s.path(&exact.func.name, &key).is_file());
    if precompiled {
        return Ok((exact, key));
    }
    let general = compiled.specialized(general);
    let key = kernel_key(&general.ir_text, target, kopts);
    Ok((general, key))
}

/// Finds the binary of `compiled` for `device`: in the device's artifact folder
/// ([`Device::with_artifacts`] or `TESSERA_AOT_DIR`) first, then (feature `jit`) in
/// the disk cache, else by compiling it now.
fn resolve_binary(
    device: &Device,
    target: &str,
    compiled: &Compiled,
    key: &CacheKey,
    kopts: &KernelOptions,
) -> Result<KernelBinary, Error> {
    let name = &compiled.func.name;
    let store = device.artifact_store()?;
    if let Some(store) = &store {
        match store.get(name, target, key) {
            Ok(bin) => return Ok(bin),
            Err(Error::MissingArtifact { .. }) if cfg!(feature = "jit") => {}
            Err(e) => return Err(e),
        }
    }
    #[cfg(feature = "jit")]
    {
        let _ = store;
        let cache = crate::disk_cache::DiskCache::from_env()?;
        let compile = || {
            if let Some(gpu) = target.strip_prefix("tileir-") {
                return crate::aot::compile_tileir_ir(&compiled.func, gpu);
            }
            let t: tessera_codegen::Target = target.parse().map_err(|e| Error::Launch {
                kernel: name.clone(),
                reason: format!("{e}"),
            })?;
            let engine = match (kopts.off_node, t.vendor()) {
                (false, _) => tessera_codegen::CommEngine::Direct,
                (true, tessera_codegen::Vendor::Amd) => tessera_codegen::CommEngine::Rocshmem,
                (true, _) => tessera_codegen::CommEngine::Nvshmem,
            };
            let opts = tessera_codegen::CompileOptions {
                num_warps: kopts.num_warps,
                num_stages: kopts.num_stages,
                engine,
                warp_specialize: kopts.warp_specialize,
                cluster: kopts.cluster,
                consumer_groups: kopts.consumer_groups,
            };
            let art = crate::aot::compile_ir(&compiled.func, t, &opts)?;
            Ok(crate::aot::kernel_binary(&art))
        };
        crate::artifact::cached_or_compile(cache.as_ref(), key, compile).map(|(b, _)| b)
    }
    #[cfg(not(feature = "jit"))]
    {
        let _ = (store, kopts);
        Err(Error::MissingArtifact {
            kernel: name.clone(),
            target: target.to_string(),
            dir: "<no folder>".into(),
            file: ArtifactStore::new("").path(name, key).display().to_string(),
            hint: "set TESSERA_AOT_DIR or use Device::with_artifacts".into(),
        })
    }
}
