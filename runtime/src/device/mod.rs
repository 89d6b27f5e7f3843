//! Devices: where kernels run and buffers live.
//!
//! | device | backend | kernels |
//! |---|---|---|
//! | `cpu` | kernels compiled for the host (feature `jit`: [`tessera_codegen::cpu`]), program instances on a thread pool; communicating kernels too (remote accesses straight into the peers' heaps, waiting programs as coroutines); a kernel it does not compile (atomics, tensor descriptors, ranks on other nodes) runs on the interpreter | traced IR through LLVM (the interpreter without `jit`) |
//! | `interp` | the reference interpreter (the same CPU memory: buffers are shared with `cpu`) | traced IR (no LLVM) |
//! | `cuda:N` | the CUDA driver API through cudarc, `libcuda` loaded at run time | PTX: precompiled ([`crate::ArtifactStore`]) or JIT-compiled (feature `jit`) |
//! | `hip:N` | the HIP runtime, `libamdhip64` loaded at run time (feature `hip`) | HSACO, likewise |
//!
//! **Streams.** Every GPU device has a *default stream* (the legacy null stream),
//! shared by every [`Device`] handle to it: the plain launches, copies and fills are
//! queued on it in program order, so they never race with each other. More streams
//! come from [`Device::stream`] (see [`Stream`]). Launches and device-to-device
//! copies are asynchronous; [`crate::Buffer::download`] and [`Device::time`] wait for
//! the default stream, [`Device::synchronize`] for every stream of the device. An error
//! raised by a kernel while it runs asynchronously is reported by the next call that
//! waits.
//!
//! **Several GPUs.** [`Device::all`] lists every device (CUDA, then HIP, then the
//! CPU). Each GPU has its own context, stream, module cache and memory; a buffer
//! belongs to one device and launching with a buffer from another device is an
//! error. [`Device::enable_peer_access`] lets kernels on one GPU address another's
//! memory (the groundwork of the symmetric heap: one allocation per device at the same
//! offset, with a heap-base table translating `buf.on(peer)`), and
//! [`crate::Buffer::copy_to_device`] copies between devices (peer-to-peer between
//! GPUs of one vendor, through the host otherwise).

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_ir::interp::CommWorld;

use crate::backend::{self, GpuArg, GpuBackend, RawStream};
use crate::error::Error;
pub use crate::properties::{Confinement, DeviceKind, DeviceProperties, EmuKind, Part};

mod stream;
pub use stream::{Event, Stream};

/// Where a device's kernels run.
#[derive(Clone)]
pub(crate) enum Backend {
    /// The CPU: kernels compiled for the host (feature `jit`), the interpreter for
    /// the rest.
    Cpu,
    /// The reference interpreter.
    Interp,
    /// The SIMT emulator.
    Emu(EmuKind),
    /// A GPU, through its backend.
    Gpu(Arc<dyn GpuBackend>),
}

/// What a launch needs from the rank a device handle belongs to: implemented by the
/// world, so that neither devices nor launches know the world's internals.
pub(crate) trait RankLink: Send + Sync {
    /// This rank.
    fn rank(&self) -> u32;
    /// The identity of the rank's world (symmetric buffers of another world are
    /// refused).
    fn world_id(&self) -> usize;
    /// The interpreter's view of this rank's world.
    fn interp_world(&self) -> CommWorld;
    /// Host worlds (CPU, emulator): every rank's heap base address (empty for GPU
    /// worlds).
    #[cfg_attr(not(feature = "jit"), allow(dead_code))]
    fn host_heap_bases(&self) -> Vec<u64>;
    /// How long device-side waits poll.
    fn timeout(&self) -> Duration;
    /// Each rank's node, when the world places its ranks on several
    /// (`World::ranks_per_node`).
    #[cfg_attr(not(feature = "jit"), allow(dead_code))]
    fn nodes(&self) -> Option<Vec<u32>>;
    /// GPU worlds: the hidden parameters of a communicating kernel on this rank
    /// (`rank, world_size, heap_bases, timeout_ns`: the codegen's comm ABI); `None`
    /// when the world has no heaps on this GPU.
    fn gpu_hidden_args(&self) -> Option<[GpuArg; 4]>;
    /// This rank's control words (read after the work queued on its device): where
    /// a launch finds the device-side error record.
    fn ctrl_words(&self) -> Result<Vec<u64>, Error>;
    /// Marks this rank as failed, releasing the other ranks.
    fn abort(&self);
}

/// `part 2 of 4, green context`.
fn describe_part(p: &Part) -> String {
    format!(
        "part {} of {}, {}",
        p.index + 1,
        p.parts,
        p.confinement.describe()
    )
}

/// A device kernels are launched on. Cheap to clone; clones share the GPU context,
/// stream and kernel cache.
#[derive(Clone)]
pub struct Device {
    pub(crate) backend: Backend,
    /// The folder given to [`Device::with_artifacts`].
    pub(crate) artifacts: Option<Arc<PathBuf>>,
    /// The rank this device handle belongs to, for kernels that communicate.
    pub(crate) comm: Option<Arc<dyn RankLink>>,
    /// The launch watchdog set by [`Device::with_launch_timeout`].
    launch_timeout: Option<Duration>,
    /// [`Device::unchecked`]: the CPU device's compiled kernels check no access.
    #[cfg_attr(not(feature = "jit"), allow(dead_code))]
    pub(crate) unchecked: bool,
    /// [`Device::with_cpu_jit`] (`None`: `TESSERA_CPU_JIT`).
    #[cfg_attr(not(feature = "jit"), allow(dead_code))]
    pub(crate) cpu_jit: Option<crate::config::CpuJit>,
    /// An emulator's part ([`Device::partition`]; a GPU's part is its backend).
    emu_part: Option<Part>,
}

impl PartialEq for Device {
    /// Two handles are equal when they name the same device (whatever their
    /// artifact folders).
    fn eq(&self, other: &Device) -> bool {
        self.kind() == other.kind() && self.ordinal() == other.ordinal()
    }
}
impl Eq for Device {}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.id())
    }
}

/// Readies the compiled CPU device's linker on a thread of its own, once per
/// process ([`tessera_codegen::cpu::prepare`]), so that a kernel whose compiled code
/// is in the disk cache launches at once. The host CPU level is chosen first, as a
/// launch would (an invalid `TESSERA_CPU_TARGET` is left for the launch to report).
/// The calling thread's end (the process's exit, for `main`) waits for it: LLVM
/// working while the exit runs LLVM's static destructors corrupts the heap (a
/// program that only made `Device::cpu()` and returned died so, now and then).
#[cfg(feature = "jit")]
fn prepare_cpu() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let spawned = crate::backend::in_flight::spawn("tessera-cpu-prepare", || {
            if let Ok(config) = crate::config::get()
                && config.choose_host_cpu().is_ok()
            {
                tessera_codegen::cpu::prepare();
            }
        });
        if let Err(e) = spawned {
            log::debug!("not readying the CPU device ahead of its first launch: {e}");
        }
    });
}

impl Device {
    fn from_backend(backend: Backend) -> Device {
        #[cfg(feature = "jit")]
        if matches!(backend, Backend::Cpu) {
            prepare_cpu();
        }
        Device {
            backend,
            artifacts: None,
            comm: None,
            launch_timeout: None,
            unchecked: false,
            cpu_jit: None,
            emu_part: None,
        }
    }

    /// The CPU device (always available): kernels compiled for the host with the
    /// `jit` feature, each kernel it does not compile on the interpreter (logged at
    /// `info`); the interpreter alone without `jit`.
    pub fn cpu() -> Device {
        Device::from_backend(Backend::Cpu)
    }

    /// The reference interpreter (`TESSERA_DEVICE=interp`): the CPU device's memory,
    /// every kernel interpreted, every access checked. It equals [`Device::cpu`]
    /// (buffers move freely between the two handles).
    pub fn interp() -> Device {
        Device::from_backend(Backend::Interp)
    }

    /// The SIMT emulator (needs the `jit` feature, i.e. LLVM): kernels run the real GPU
    /// lowering, JIT-compiled for the host, with buffers in host memory.
    pub fn emu(kind: EmuKind) -> Result<Device, Error> {
        if cfg!(feature = "jit") {
            Ok(Device::from_backend(Backend::Emu(kind)))
        } else {
            Err(Error::DeviceUnavailable {
                device: kind.name().into(),
                reason: "the emulator needs tessera's `jit` feature (LLVM)".into(),
            })
        }
    }

    /// CUDA device `ordinal`. Fails with [`Error::DeviceUnavailable`] when no CUDA
    /// driver is installed (checked before any driver call) or there is no such GPU.
    pub fn cuda(ordinal: usize) -> Result<Device, Error> {
        backend::cuda::open(ordinal).map(|d| Device::from_backend(Backend::Gpu(d)))
    }

    /// HIP device `ordinal` (needs the `hip` feature).
    pub fn hip(ordinal: usize) -> Result<Device, Error> {
        #[cfg(feature = "hip")]
        {
            backend::hip::open(ordinal).map(|d| Device::from_backend(Backend::Gpu(d)))
        }
        #[cfg(not(feature = "hip"))]
        {
            Err(Error::DeviceUnavailable {
                device: format!("hip:{ordinal}"),
                reason: "this build has no HIP support (enable tessera's `hip` feature)".into(),
            })
        }
    }

    /// The device named by `TESSERA_DEVICE` if set, else the best one present: CUDA
    /// device 0, then HIP device 0, then the CPU.
    pub fn best() -> Result<Device, Error> {
        match &crate::config::get()?.device {
            Some(name) => Device::by_name(name),
            None => Ok(Device::cuda(0)
                .or_else(|_| Device::hip(0))
                .unwrap_or_else(|_| Device::cpu())),
        }
    }

    /// Every device present: the CUDA devices, then the HIP devices, then the CPU.
    pub fn all() -> Vec<Device> {
        let mut out: Vec<Device> = (0..backend::cuda::count())
            .filter_map(|i| Device::cuda(i).ok())
            .collect();
        #[cfg(feature = "hip")]
        out.extend((0..backend::hip::count()).filter_map(|i| Device::hip(i).ok()));
        out.push(Device::cpu());
        out
    }

    /// The device called `name`: `cpu`, `interp`, an emulator ([`EmuKind::name`]:
    /// `emu-nv`, `emu-amd`, `emu-sm90a`, `emu-gfx950`, `emu-gfx1100`, `emu-gfx1200`),
    /// `cuda`, `cuda:N`, `hip`, `hip:N`.
    pub fn by_name(name: &str) -> Result<Device, Error> {
        let (base, index) = match name.split_once(':') {
            Some((b, i)) => (
                b,
                Some(
                    i.parse::<usize>()
                        .map_err(|_| Error::UnknownDevice(name.to_string()))?,
                ),
            ),
            None => (name, None),
        };
        match (base, index) {
            ("cpu", None) => Ok(Device::cpu()),
            ("interp", None) => Ok(Device::interp()),
            ("cuda", i) => Device::cuda(i.unwrap_or(0)),
            ("hip", i) => Device::hip(i.unwrap_or(0)),
            (emu, None) if emu.starts_with("emu-") => EmuKind::ALL
                .into_iter()
                .find(|k| k.name() == emu)
                .map_or_else(|| Err(Error::UnknownDevice(name.to_string())), Device::emu),
            _ => Err(Error::UnknownDevice(name.to_string())),
        }
    }

    /// This device, loading precompiled kernels from `dir` (an [`crate::ArtifactStore`]
    /// folder) before `TESSERA_AOT_DIR` and the JIT.
    pub fn with_artifacts(&self, dir: impl Into<PathBuf>) -> Device {
        Device {
            artifacts: Some(Arc::new(dir.into())),
            ..self.clone()
        }
    }

    /// This device with a launch watchdog on the CPU and the emulators: a launch
    /// that runs longer than `timeout` stops every runtime loop (`for`, `while`) at
    /// its next test and fails naming the kernel and the loop's line, instead of
    /// running forever. Without it, `TESSERA_LAUNCH_TIMEOUT` (a duration, e.g. `30` or
    /// `0.5`) sets the limit; unset, launches are unbounded. GPUs ignore it (their
    /// kernels run to completion).
    pub fn with_launch_timeout(&self, timeout: Duration) -> Device {
        Device {
            launch_timeout: Some(timeout),
            ..self.clone()
        }
    }

    /// This device launching kernels whose compiled CPU code is not ready as `jit`
    /// says (the CPU device; other devices ignore it): [`CpuJit::Background`] starts
    /// on the interpreter while LLVM compiles, [`CpuJit::Wait`] compiles first, so
    /// that every program runs compiled code. Without it, `TESSERA_CPU_JIT` decides
    /// (default: background).
    ///
    /// [`CpuJit::Background`]: crate::config::CpuJit::Background
    /// [`CpuJit::Wait`]: crate::config::CpuJit::Wait
    pub fn with_cpu_jit(&self, jit: crate::config::CpuJit) -> Device {
        Device {
            cpu_jit: Some(jit),
            ..self.clone()
        }
    }

    /// This device without the CPU device's bounds checks: kernels compiled for the
    /// host through the returned handle check no memory access (other devices, and
    /// the interpreter, are unaffected). Every safe handle checks every access that
    /// happens, at a cost measured in BENCHMARKS.md ("The compiled CPU device");
    /// this exists to measure that cost.
    ///
    /// # Safety
    ///
    /// Every load and store of every kernel launched through the returned handle (and
    /// its clones) must lie inside the buffer it goes through. An access outside it
    /// reads or writes the host process's memory: undefined behaviour (a corrupted
    /// heap, a crash later, one buffer's data leaking into another).
    pub unsafe fn unchecked(&self) -> Device {
        Device {
            unchecked: true,
            ..self.clone()
        }
    }

    /// This device split into `parts` devices, each with its own share of the
    /// multiprocessors and its own default stream, so that kernels launched on
    /// different parts run at the same time and every part's waiting kernels stay
    /// resident together (several ranks of a world on one GPU: [`crate::World::on`]
    /// partitions a device its ranks share this way).
    ///
    /// - **CUDA**: a green context per part (`cuGreenCtxCreate`; CUDA 12.4+ drivers,
    ///   unless `TESSERA_GREEN_CONTEXTS=off`): the hardware keeps each part's
    ///   kernels on its SMs (groups of a multiple of 8 SMs on Hopper, the rest
    ///   unused). Without them, a stream per part that waits for no other stream.
    /// - **HIP**: a stream per part with a CU mask (`hipExtStreamCreateWithCUMask`).
    /// - **The emulator**: parts of the GPU it imitates ([`EmuKind::multiprocessors`]).
    ///
    /// Each part's [`Device::properties`] report its share of the multiprocessors
    /// and which part it is ([`DeviceProperties::part`]); a waiting kernel
    /// (`wait_until`, `barrier_all`) launched on a part must have all its programs
    /// resident in that share, or the launch fails saying so. Parts compare equal
    /// to the device (buffers move freely between them). The CPU is not split: its
    /// parts are the device itself (its ranks' programs are coroutines, all resident).
    pub fn partition(&self, parts: usize) -> Result<Vec<Device>, Error> {
        let n = u32::try_from(parts).unwrap_or(u32::MAX);
        let units = self.properties().multiprocessors;
        if self.properties().part.is_some() {
            return Err(Error::Usage(format!(
                "{} is a part of a device already: partition the device itself",
                self.name()
            )));
        }
        match &self.backend {
            Backend::Cpu | Backend::Interp => Ok(vec![self.clone(); parts]),
            Backend::Emu(_) => {
                if parts == 0 || n > units {
                    return Err(Error::Usage(format!(
                        "{} imitates {units} multiprocessors: it splits into 1 to {units} parts, not {parts}",
                        self.id()
                    )));
                }
                Ok((0..n)
                    .map(|index| Device {
                        emu_part: Some(Part {
                            index,
                            parts: n,
                            confinement: Confinement::Sized,
                        }),
                        ..self.clone()
                    })
                    .collect())
            }
            Backend::Gpu(g) => {
                let green = crate::config::get()?.green_contexts;
                Ok(backend::partition(g, n, green)?
                    .into_iter()
                    .map(|b| Device {
                        backend: Backend::Gpu(b),
                        ..self.clone()
                    })
                    .collect())
            }
        }
    }

    /// The watchdog of a launch on this handle: [`Device::with_launch_timeout`],
    /// else `TESSERA_LAUNCH_TIMEOUT` (a value that is not a duration is an error
    /// naming the variable).
    pub(crate) fn launch_timeout(&self) -> Result<Option<Duration>, Error> {
        if let Some(t) = self.launch_timeout {
            return Ok(Some(t));
        }
        Ok(crate::config::get()?.launch_timeout)
    }

    /// Its kind.
    pub fn kind(&self) -> DeviceKind {
        match &self.backend {
            Backend::Cpu | Backend::Interp => DeviceKind::Cpu,
            Backend::Emu(_) => DeviceKind::Emu,
            Backend::Gpu(g) => g.kind(),
        }
    }

    /// Its index among the devices of its kind (0 for the CPU).
    pub fn ordinal(&self) -> usize {
        match &self.backend {
            Backend::Cpu | Backend::Interp => 0,
            Backend::Emu(k) => k.ordinal(),
            Backend::Gpu(g) => g.ordinal(),
        }
    }

    /// Its short name, as `TESSERA_DEVICE` spells it: `cpu`, `cuda:0`, `hip:1`.
    pub fn id(&self) -> String {
        match self.kind() {
            DeviceKind::Cpu if matches!(self.backend, Backend::Interp) => "interp".into(),
            DeviceKind::Cpu => "cpu".into(),
            DeviceKind::Emu => EmuKind::ALL
                .get(self.ordinal())
                .map_or("emu", |k| k.name())
                .into(),
            DeviceKind::Cuda => format!("cuda:{}", self.ordinal()),
            DeviceKind::Hip => format!("hip:{}", self.ordinal()),
        }
    }

    /// A short description, e.g. `cpu (interpreter, 2 threads)` or
    /// `cuda:0 (NVIDIA H200, sm_90, 132 SMs)`.
    pub fn name(&self) -> String {
        match &self.backend {
            Backend::Cpu if cfg!(feature = "jit") => format!(
                "cpu (compiled for the host, {} threads)",
                rayon::current_num_threads()
            ),
            Backend::Cpu | Backend::Interp => format!(
                "{} (reference interpreter, {} threads)",
                self.id(),
                rayon::current_num_threads()
            ),
            Backend::Emu(k) => match self.emu_part {
                Some(p) => format!(
                    "{} (SIMT emulator, warp {}, {} of {} SMs: {})",
                    self.id(),
                    k.warp_size(),
                    self.properties().multiprocessors,
                    k.multiprocessors(),
                    describe_part(&p)
                ),
                None => format!("{} (SIMT emulator, warp {})", self.id(), k.warp_size()),
            },
            _ => {
                let p = self.properties();
                let part = p
                    .part
                    .map(|part| format!(": {}", describe_part(&part)))
                    .unwrap_or_default();
                format!(
                    "{} ({}, {}, {} SMs{part})",
                    self.id(),
                    p.name,
                    p.target,
                    p.multiprocessors
                )
            }
        }
    }

    /// Its properties.
    pub fn properties(&self) -> DeviceProperties {
        match &self.backend {
            Backend::Cpu | Backend::Interp => DeviceProperties {
                name: self.id(),
                target: "host".into(),
                compute_capability: None,
                driver_version: None,
                multiprocessors: rayon::current_num_threads() as u32,
                warp_size: 1,
                shared_per_block: usize::MAX,
                shared_per_block_optin: usize::MAX,
                total_memory: 0,
                part: None,
            },
            Backend::Emu(k) => DeviceProperties {
                name: self.id(),
                target: self.id(),
                compute_capability: None,
                driver_version: None,
                multiprocessors: match self.emu_part {
                    Some(p) => {
                        backend::lane::share(k.multiprocessors(), p.parts, p.index).len() as u32
                    }
                    None => k.multiprocessors(),
                },
                warp_size: k.warp_size(),
                shared_per_block: 48 * 1024,
                shared_per_block_optin: 48 * 1024,
                total_memory: 0,
                part: self.emu_part,
            },
            Backend::Gpu(g) => g.props().clone(),
        }
    }

    /// Waits until everything queued on the device, on every stream, has finished.
    pub fn synchronize(&self) -> Result<(), Error> {
        match &self.backend {
            Backend::Cpu | Backend::Interp | Backend::Emu(_) => Ok(()),
            Backend::Gpu(g) => g.synchronize_device(),
        }
    }

    /// Runs `f` and measures the device time of the work it queues: with events
    /// recorded on the device's stream around it on a GPU (then waits for them), with
    /// the wall clock on the CPU.
    pub fn time<R>(&self, f: impl FnOnce() -> Result<R, Error>) -> Result<(R, Duration), Error> {
        match &self.backend {
            Backend::Cpu | Backend::Interp | Backend::Emu(_) => {
                let t = Instant::now();
                let r = f()?;
                Ok((r, t.elapsed()))
            }
            Backend::Gpu(_) => {
                let start = Event::new(self)?;
                let end = Event::new(self)?;
                start.record_raw(RawStream::DEFAULT)?;
                let r = f()?;
                end.record_raw(RawStream::DEFAULT)?;
                Ok((r, end.elapsed_since(&start)?))
            }
        }
    }

    /// Lets kernels and copies on this device access `other`'s memory directly (CUDA
    /// peer access / HIP peer access). A no-op for the same device; an error across
    /// vendors, for the CPU, or when the GPUs cannot reach each other.
    pub fn enable_peer_access(&self, other: &Device) -> Result<(), Error> {
        if self == other {
            return Ok(());
        }
        match (&self.backend, &other.backend) {
            (Backend::Gpu(a), Backend::Gpu(b)) if a.kind() == b.kind() => {
                a.enable_peer_access(b.as_ref())
            }
            _ => Err(Error::DeviceUnavailable {
                device: other.id(),
                reason: format!("no peer access between {} and {}", self.id(), other.id()),
            }),
        }
    }

    /// The compilation target of a GPU (`sm_90`, `gfx942`).
    pub(crate) fn gpu_target(&self) -> Option<&str> {
        match &self.backend {
            Backend::Cpu | Backend::Interp | Backend::Emu(_) => None,
            Backend::Gpu(g) => Some(&g.props().target),
        }
    }

    /// Whether launches here form thread-block clusters
    /// ([`crate::LaunchOptions::cluster`]): CUDA GPUs of compute capability 9.0 and
    /// newer, and `emu-sm90a`.
    pub fn has_clusters(&self) -> bool {
        match &self.backend {
            Backend::Emu(k) => *k == EmuKind::Sm90a,
            Backend::Gpu(g) => g.props().target.strip_prefix("sm_").is_some_and(|v| {
                v.trim_end_matches(|c: char| c.is_ascii_alphabetic())
                    .parse::<u32>()
                    .is_ok_and(|n| n >= 90)
            }),
            Backend::Cpu | Backend::Interp => false,
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(Device::by_name("cpu").unwrap(), Device::cpu());
        assert!(matches!(
            Device::by_name("tpu"),
            Err(Error::UnknownDevice(_))
        ));
        assert!(matches!(
            Device::by_name("cuda:x"),
            Err(Error::UnknownDevice(_))
        ));
        assert!(matches!(
            Device::by_name("cpu:1"),
            Err(Error::UnknownDevice(_))
        ));
        assert_eq!(Device::cpu().id(), "cpu");
        assert_eq!(Device::all().last(), Some(&Device::cpu()));
        let d = Device::cpu().with_artifacts("/nonexistent");
        assert_eq!(d, Device::cpu());
        assert_eq!(d.artifacts.as_deref(), Some(&PathBuf::from("/nonexistent")));
    }
}
