//! The GPU backends behind one interface.
//!
//! [`GpuBackend`] is everything the rest of the runtime asks of a GPU: memory
//! (allocation, copies, exportable heaps and their IPC handles), streams and events,
//! module loading, launches and occupancy, peer access, and its properties. The CUDA
//! backend ([`cuda`], the driver API through cudarc) and the HIP backend (`hip`,
//! feature `hip`, `libamdhip64` loaded at run time) implement it; the CPU and the
//! emulator run kernels on the host and sit beside it in [`crate::Device`].
//!
//! Launching is not here: `crate::executor` (beside this folder, above devices and
//! compilation) holds one executor per kind of device, `executor/gpu.rs` the one
//! that runs a kernel through a [`GpuBackend`] (specialization, binaries, tensor
//! maps, the communicating kernels' checks), `executor/{interp,cpu,emu}.rs` the host
//! ones.
//!
//! Memory is named by device address (`u64`): [`DevMem`] is an allocation (or a view
//! of one) together with the backend that frees it, so buffers, symmetric heaps and
//! foreign memory are one type. Streams and events are the backend's raw handles
//! ([`RawStream`], [`RawEvent`]); [`RawStream::DEFAULT`] is the device's default
//! stream, on which everything runs unless the caller names another.
//!
//! This module is below everything but [`crate::properties`] and [`crate::error`]:
//! it imports nothing else from the runtime (checked by `tests/module_cycles.rs`).

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::properties::{DeviceKind, DeviceProperties};

pub(crate) mod cuda;
#[cfg(feature = "hip")]
pub(crate) mod hip;
#[cfg(feature = "jit")]
pub(crate) mod in_flight;
pub(crate) mod lane;

pub(crate) use lane::partition;

/// NVIDIA kernels needing more shared memory than this declare it dynamic (the
/// codegen's `NVIDIA_STATIC_SHARED_BYTES`): their launch passes
/// [`KernelBinary::shared_bytes`] of dynamic shared memory and raises the kernel's
/// limit to it.
pub const DYNAMIC_SHARED_PAST: u32 = 48 * 1024;

/// A compiled kernel as a GPU driver loads it: the PTX text or HSACO code object plus
/// the launch facts (entry symbol, threads per block, shared memory). Its file form
/// is in [`crate::artifact`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelBinary {
    /// The entry point's symbol.
    pub name: String,
    /// The target it was compiled for (`sm_90`, `gfx942`, ...).
    pub target: String,
    /// Threads per block.
    pub num_threads: u32,
    /// Shared memory in bytes: declared in the PTX up to 48 KiB, past that dynamic
    /// (an unsized `.extern .shared` array the launch sizes to this), see
    /// [`DYNAMIC_SHARED_PAST`].
    pub shared_bytes: u32,
    /// PTX text (NVIDIA) or an HSACO code object (AMD).
    pub binary: Vec<u8>,
}

/// One kernel parameter as a GPU receives it: its bytes, by size (device addresses
/// are `U64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GpuArg {
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
}

impl GpuArg {
    /// A pointer to the parameter's value, as `cuLaunchKernel` and
    /// `hipModuleLaunchKernel` take each parameter (valid while `self` is).
    pub(crate) fn as_param(&self) -> *mut std::ffi::c_void {
        match self {
            GpuArg::U8(v) => v as *const u8 as *mut std::ffi::c_void,
            GpuArg::U16(v) => v as *const u16 as *mut std::ffi::c_void,
            GpuArg::U32(v) => v as *const u32 as *mut std::ffi::c_void,
            GpuArg::U64(v) => v as *const u64 as *mut std::ffi::c_void,
        }
    }
}

/// A backend's stream handle (`CUstream`, `hipStream_t`) as an integer; 0 is the
/// device's default stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RawStream(pub(crate) u64);

impl RawStream {
    /// The device's default stream (the legacy null stream on both vendors).
    pub(crate) const DEFAULT: RawStream = RawStream(0);
}

/// A backend's event handle (`CUevent`, `hipEvent_t`) as an integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RawEvent(pub(crate) u64);

/// A kernel loaded into a backend's context (a module and its function).
pub(crate) trait GpuKernel: Send + Sync {
    /// What it was loaded from.
    fn binary(&self) -> &KernelBinary;
    /// For the backend that loaded it, to reach its own type.
    fn as_any(&self) -> &dyn Any;
}

/// Tensor-map parameters (`cuTensorMapEncodeTiled`): a tensor at device address `base`
/// with `elem_bytes`-byte elements, `dims` and element `strides` (outermost first, the
/// last stride 1), read in boxes of `box_dims` (outermost first) with the
/// `swizzle`-byte swizzle (32, 64 or 128), zero fill.
pub(crate) struct TensorMapSpec<'a> {
    pub(crate) base: u64,
    pub(crate) elem_bytes: u32,
    pub(crate) dims: &'a [u64],
    pub(crate) strides: &'a [u64],
    pub(crate) box_dims: &'a [u32],
    pub(crate) swizzle: u32,
}

/// A tensor map built for a launch: its device address, and what keeps it alive.
/// Hold it until the launch is queued; the backend frees the map (in stream order,
/// after the kernels that read it) once nothing holds it.
pub(crate) struct TensorMap {
    pub(crate) addr: u64,
    _keep: Arc<dyn Any + Send + Sync>,
}

impl TensorMap {
    /// The map at `addr`, kept alive by `keep`.
    pub(crate) fn new(addr: u64, keep: Arc<dyn Any + Send + Sync>) -> TensorMap {
        TensorMap { addr, _keep: keep }
    }
}

/// One GPU, as the runtime drives it. Every method may be called from any thread;
/// the backend makes its context current itself. Calls that take a stream queue
/// their work on it in order with the work queued before; methods that hand host
/// memory back (`dtoh`) or take host memory (`htod`) return once the copy is done.
pub(crate) trait GpuBackend: Send + Sync + 'static {
    /// [`DeviceKind::Cuda`] or [`DeviceKind::Hip`].
    fn kind(&self) -> DeviceKind;
    /// Its index among the devices of its kind.
    fn ordinal(&self) -> usize;
    /// What it is made of.
    fn props(&self) -> &DeviceProperties;
    /// Its short name (`cuda:0`, `hip:1`).
    fn id(&self) -> String {
        let vendor = match self.kind() {
            DeviceKind::Hip => "hip",
            _ => "cuda",
        };
        format!("{vendor}:{}", self.ordinal())
    }
    /// For [`GpuBackend::enable_peer_access`] and kernels: the concrete type.
    fn as_any(&self) -> &dyn Any;

    // Memory.

    /// A zero-filled allocation of `bytes` (> 0) bytes, ordered on `stream` (usable
    /// by the work queued there after this call); free with [`GpuBackend::free`].
    fn alloc(&self, bytes: usize, stream: RawStream) -> Result<u64, Error>;
    /// Frees an [`GpuBackend::alloc`] allocation once the work queued before on
    /// `stream` is done (errors are ignored: this runs in destructors).
    fn free(&self, ptr: u64, stream: RawStream);
    /// A zeroed allocation another process can open ([`GpuBackend::ipc_handle`]),
    /// whose stores peers see (a symmetric heap); complete when this returns. Free
    /// with [`GpuBackend::free_exportable`].
    fn alloc_exportable(&self, bytes: usize) -> Result<u64, Error>;
    /// Frees an [`GpuBackend::alloc_exportable`] allocation (errors ignored).
    fn free_exportable(&self, ptr: u64);
    /// Copies `data` to device address `dst` after the work queued on `stream`;
    /// returns when the copy is done.
    fn htod(&self, dst: u64, data: &[u8], stream: RawStream) -> Result<(), Error>;
    /// Copies `out.len()` bytes from device address `src` after the work queued on
    /// `stream`; returns when the copy is done.
    fn dtoh(&self, src: u64, out: &mut [u8], stream: RawStream) -> Result<(), Error>;
    /// Queues a copy of `bytes` bytes from `src` on `src_dev` (this device, or
    /// another of the same kind: a peer copy) to `dst` on this device.
    fn copy(
        &self,
        dst: u64,
        src_dev: &dyn GpuBackend,
        src: u64,
        bytes: usize,
        stream: RawStream,
    ) -> Result<(), Error>;
    /// Writes the 32-bit `value` at `dst` on a stream of its own that does not wait
    /// for other streams, so it lands while a kernel runs (raising a heap's abort
    /// word); returns when written.
    fn poke_u32(&self, dst: u64, value: u32) -> Result<(), Error>;

    // Streams and events.

    /// Waits until everything queued on `stream` has finished.
    fn synchronize(&self, stream: RawStream) -> Result<(), Error>;
    /// Waits until everything queued on the device, on every stream, has finished.
    fn synchronize_device(&self) -> Result<(), Error>;
    /// A new stream, ordered with the default stream (work on either waits for the
    /// work queued before it on the other).
    fn stream_create(&self) -> Result<RawStream, Error>;
    /// Destroys a stream from [`GpuBackend::stream_create`] (after its work).
    fn stream_destroy(&self, stream: RawStream);
    /// A new event.
    fn event_create(&self) -> Result<RawEvent, Error>;
    /// Records `event` on `stream`.
    fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<(), Error>;
    /// Waits for `event`.
    fn event_synchronize(&self, event: RawEvent) -> Result<(), Error>;
    /// The time between two completed events.
    fn event_elapsed(&self, start: RawEvent, end: RawEvent) -> Result<Duration, Error>;
    /// Destroys an event.
    fn event_destroy(&self, event: RawEvent);

    // Kernels.

    /// The kernel with cache key `key`, loading `bin()` on first use.
    fn load(
        &self,
        key: &str,
        bin: &mut dyn FnMut() -> Result<KernelBinary, Error>,
    ) -> Result<Arc<dyn GpuKernel>, Error>;
    /// Programs of `kernel` one multiprocessor holds at once.
    fn occupancy(&self, kernel: &dyn GpuKernel) -> Result<u32, Error>;
    /// Launches `kernel` on `stream`: `grid` blocks of its threads, with the
    /// parameters in order, in thread-block clusters of `cluster` blocks (`[1, 1,
    /// 1]`: none; the caller checked that it divides `grid` and that the device has
    /// clusters). A kernel that `waits` for other programs must have every program
    /// resident at once (checked against [`GpuBackend::occupancy`]).
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        kernel: &dyn GpuKernel,
        grid: [u32; 3],
        cluster: [u32; 3],
        args: &[GpuArg],
        waits: bool,
        stream: RawStream,
    ) -> Result<(), Error>;
    /// Checks a launch of `grid` blocks of `kernel` against the vendor's grid
    /// `limits` and, for a kernel that `waits` for other programs, that every
    /// program is resident at once ([`GpuBackend::occupancy`]).
    fn check_launch(
        &self,
        kernel: &dyn GpuKernel,
        grid: [u32; 3],
        waits: bool,
        limits: GridLimits,
    ) -> Result<(), Error> {
        let b = kernel.binary();
        check_grid(&b.name, limits, grid, b.num_threads)?;
        if waits {
            let per_unit = self.occupancy(kernel)?;
            let programs = grid.iter().map(|&g| g as u64).product();
            let p = self.props();
            check_resident(&b.name, &p.name, programs, per_unit, p.multiprocessors)?;
        }
        Ok(())
    }
    /// A tensor map for TMA copies; `None` where the backend has none or the driver
    /// refuses to encode this one (the kernel then reads through masked loads, with
    /// the same results). Other failures (memory, a faulted device) are errors.
    fn tensor_map(&self, _spec: &TensorMapSpec<'_>) -> Result<Option<TensorMap>, Error> {
        Ok(None)
    }

    // Partitions ([`crate::Device::partition`]).

    /// A stream for one part of this device: it waits for no other stream (the
    /// default stream included), and where the backend can keep a stream's kernels
    /// to some multiprocessors (HIP's CU masks) they run on `units` only. Returns
    /// the stream and whether it is so confined. Destroy it with
    /// [`GpuBackend::stream_destroy`].
    fn part_stream(&self, units: std::ops::Range<u32>) -> Result<(RawStream, bool), Error>;
    /// This device split into `parts` devices on disjoint multiprocessors that the
    /// hardware keeps apart (CUDA green contexts), each with its own default stream
    /// and `props().part` set; `None` where the backend or its driver has no such
    /// thing (the parts are then [`Lane`]s).
    fn confined_parts(&self, _parts: u32) -> Option<Result<Vec<Arc<dyn GpuBackend>>, Error>> {
        None
    }

    // Several devices and processes.

    /// Lets kernels and copies on this device access `other`'s memory.
    fn enable_peer_access(&self, other: &dyn GpuBackend) -> Result<(), Error>;
    /// The IPC handle of an [`GpuBackend::alloc_exportable`] allocation.
    fn ipc_handle(&self, ptr: u64) -> Result<Vec<u8>, Error>;
    /// Opens another process's IPC handle: the allocation's address here. Close with
    /// [`GpuBackend::ipc_close`].
    fn ipc_open(&self, handle: &[u8]) -> Result<u64, Error>;
    /// Closes an address opened by [`GpuBackend::ipc_open`] (errors ignored).
    fn ipc_close(&self, ptr: u64);
}

/// Device memory: an allocation of its own (freed on drop), or a range of memory
/// someone else owns (a symmetric heap, foreign memory), kept alive by `keep`.
pub(crate) struct DevMem {
    /// Its device address.
    pub(crate) ptr: u64,
    /// The GPU it is on.
    pub(crate) gpu: Arc<dyn GpuBackend>,
    keep: Keep,
}

enum Keep {
    /// Freed with [`GpuBackend::free`] on drop.
    Owned,
    /// Not freed; the owner is kept alive as long as the view.
    View(#[allow(dead_code)] Arc<dyn Any + Send + Sync>),
    /// Memory another library owns: its owner is dropped (which may free it, on a
    /// stream Tessera's are not ordered with) only after the device has finished
    /// every kernel that may use it.
    Foreign(Option<Arc<dyn Any + Send + Sync>>),
}

impl DevMem {
    /// A zero-filled allocation of `bytes` bytes (at least one byte is allocated, so
    /// empty buffers have an address too).
    pub(crate) fn alloc(gpu: &Arc<dyn GpuBackend>, bytes: usize) -> Result<DevMem, Error> {
        let ptr = gpu.alloc(bytes.max(1), RawStream::DEFAULT)?;
        Ok(DevMem {
            ptr,
            gpu: gpu.clone(),
            keep: Keep::Owned,
        })
    }

    /// Memory another library owns at `ptr` on `gpu`, kept alive by `owner`, which is
    /// dropped only after the device has finished its work (see `Keep::Foreign`).
    pub(crate) fn foreign(
        gpu: &Arc<dyn GpuBackend>,
        ptr: u64,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> DevMem {
        DevMem {
            ptr,
            gpu: gpu.clone(),
            keep: Keep::Foreign(Some(owner)),
        }
    }

    /// A view of memory at `ptr` on `gpu`, which `owner` keeps alive; never freed by
    /// this value.
    pub(crate) fn view(
        gpu: &Arc<dyn GpuBackend>,
        ptr: u64,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> DevMem {
        DevMem {
            ptr,
            gpu: gpu.clone(),
            keep: Keep::View(owner),
        }
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        match &mut self.keep {
            Keep::Owned => self.gpu.free(self.ptr, RawStream::DEFAULT),
            Keep::View(_) => {}
            Keep::Foreign(owner) => {
                if let Err(e) = self.gpu.synchronize_device() {
                    log::warn!(
                        "releasing foreign memory on {} after a failed synchronize: {e}",
                        self.gpu.id()
                    );
                }
                drop(owner.take());
            }
        }
    }
}

/// Which GPU launch limits apply ([`check_grid`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GridLimits {
    /// CUDA: x < 2^31, y and z <= 65535 blocks.
    Cuda,
    /// HIP (AMD): each dimension's work items (blocks x threads) within 32 bits.
    #[cfg_attr(not(feature = "hip"), allow(dead_code))]
    Hip,
}

/// Checks a launch of `grid` blocks of `threads` threads against the vendor's limits,
/// naming the kernel and the limit (instead of the driver's bare "invalid value").
pub(crate) fn check_grid(
    kernel: &str,
    limits: GridLimits,
    grid: [u32; 3],
    threads: u32,
) -> Result<(), Error> {
    let bad = |reason: String| {
        Err(Error::Launch {
            kernel: kernel.to_string(),
            reason,
        })
    };
    match limits {
        GridLimits::Cuda => {
            if grid[0] > i32::MAX as u32 {
                return bad(format!(
                    "a grid of {} programs along x: CUDA allows at most 2^31 - 1",
                    grid[0]
                ));
            }
            for (axis, &g) in ["y", "z"].iter().zip(&grid[1..]) {
                if g > 65_535 {
                    return bad(format!(
                        "a grid of {g} programs along {axis}: CUDA allows at most 65535 (put the large extent on x)"
                    ));
                }
            }
        }
        GridLimits::Hip => {
            let dims = [threads as u64, 1, 1];
            for ((axis, &g), d) in ["x", "y", "z"].iter().zip(&grid).zip(dims) {
                if g as u64 * d > u32::MAX as u64 {
                    return bad(format!(
                        "{g} programs of {d} threads along {axis}: HIP dispatches at most 2^32 - 1 work items per dimension"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// For a kernel that waits for other programs (`wait_until`, `barrier_all`): every
/// one of its `programs` must be resident at once, and the device holds at most
/// `per_unit` per multiprocessor (the driver's occupancy answer) on `units` of them.
pub(crate) fn check_resident(
    kernel: &str,
    device: &str,
    programs: u64,
    per_unit: u32,
    units: u32,
) -> Result<(), Error> {
    let limit = per_unit as u64 * units as u64;
    if programs <= limit {
        return Ok(());
    }
    Err(Error::Launch {
        kernel: kernel.to_string(),
        reason: format!(
            "it waits for other programs (wait_until / barrier_all), so all {programs} programs must be resident at once, \
             but {device} holds at most {limit} ({per_unit} per multiprocessor x {units}): launch at most {limit} programs \
             and loop over the work in each, or give each program fewer warps or less shared memory"
        ),
    })
}

/// Before a copy from `src` to `dst` (devices of one backend kind): `false` when there
/// is nothing to copy, an error across kinds; waits for the source device when it is
/// another device (any of its streams may still be writing the source).
pub(crate) fn before_copy(
    dst: &dyn GpuBackend,
    src: &dyn GpuBackend,
    bytes: usize,
) -> Result<bool, Error> {
    if bytes == 0 {
        return Ok(false);
    }
    if src.kind() != dst.kind() {
        return Err(Error::Driver {
            device: dst.id(),
            what: "copying between devices".into(),
            message: format!("{} is not a {:?} device", src.id(), dst.kind()),
        });
    }
    if src.ordinal() != dst.ordinal() {
        src.synchronize_device()?;
    }
    Ok(true)
}

/// The concrete kernel type of a backend, or an error naming the mix-up (a kernel
/// loaded by another backend).
pub(crate) fn downcast_kernel<'k, K: 'static>(
    kernel: &'k dyn GpuKernel,
    device: &str,
) -> Result<&'k K, Error> {
    kernel
        .as_any()
        .downcast_ref::<K>()
        .ok_or_else(|| Error::Launch {
            kernel: kernel.binary().name.clone(),
            reason: format!("the kernel was loaded on another device than {device}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_limits_name_the_kernel_and_the_limit() {
        assert!(check_grid("k", GridLimits::Cuda, [1 << 30, 65_535, 65_535], 1024).is_ok());
        let e = check_grid("k", GridLimits::Cuda, [1, 65_536, 1], 128).unwrap_err();
        assert!(
            matches!(&e, Error::Launch { kernel, reason } if kernel == "k" && reason.contains("65535") && reason.contains(" y")),
            "{e}"
        );
        assert!(check_grid("k", GridLimits::Cuda, [u32::MAX, 1, 1], 128).is_err());
        // HIP: work items per dimension within 32 bits.
        assert!(check_grid("k", GridLimits::Hip, [(1 << 24) - 1, 1 << 20, 1], 256).is_ok());
        assert!(check_grid("k", GridLimits::Hip, [1 << 24, 1, 1], 256).is_err());
        let e = check_grid("k", GridLimits::Hip, [1 << 24, 1, 1], 512).unwrap_err();
        assert!(e.to_string().contains("2^32 - 1 work items"), "{e}");
    }

    #[test]
    fn waiting_kernels_need_every_program_resident() {
        assert!(check_resident("ring", "H200", 132 * 2, 2, 132).is_ok());
        let e = check_resident("ring", "H200", 132 * 2 + 1, 2, 132).unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("ring") && s.contains("265 programs") && s.contains("at most 264"),
            "{s}"
        );
        // No residency at all (occupancy 0): any launch is refused.
        assert!(check_resident("ring", "MI300X", 1, 0, 304).is_err());
    }
}
