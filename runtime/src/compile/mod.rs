//! Compilation: kernels and the IR cache (a `#[kernel]` traced once per set of
//! comptime arguments, verified, optimized and kept with its GPU specializations for
//! every later launch), dumps of its stages, kernel keys and artifacts
//! ([`artifact`]), the disk cache ([`disk_cache`]) and the JIT/AOT compiler
//! (`aot`, feature `jit`).

use std::any::TypeId;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, OnceLock};

use tessera_ir::debug::DebugSites;
use tessera_ir::{BuildError, Function, ParamFacts};

use crate::error::Error;

#[cfg(feature = "jit")]
pub mod aot;
pub mod artifact;
pub mod disk_cache;
pub(crate) mod dump;

/// A kernel defined with `#[kernel]`: the macro implements this for the kernel's
/// struct. `Comptime` is the tuple of its `#[comptime]` parameters.
pub trait Kernel: 'static {
    /// The kernel's name.
    const NAME: &'static str;
    /// The `#[comptime]` parameters, in order.
    type Comptime: Clone + Debug + 'static;
    /// Traces the body into IR for these comptime arguments.
    fn build(ct: &Self::Comptime) -> Result<Function, BuildError>;
    /// The block shapes of the kernel's tensor-descriptor parameters, in order.
    fn desc_blocks() -> Vec<Vec<u32>> {
        Vec::new()
    }
}

/// A built, verified and optimized kernel.
pub(crate) struct Compiled {
    pub(crate) func: Arc<Function>,
    /// The kernel's `device_print`/`device_assert` sites, when it has any: its last
    /// parameter is then the output buffer ([`tessera_ir::debug`]).
    pub(crate) debug: Option<Arc<DebugSites>>,
    /// The printed IR: what the GPU kernel keys hash.
    pub(crate) ir_text: String,
    /// GPU specializations of this IR on launch facts (which parameters are
    /// divisible by 16), built on first use.
    specs: Mutex<HashMap<Vec<ParamFacts>, Arc<Compiled>>>,
    /// The kernel compiled for the CPU device (bounds checked, sanitized, unchecked),
    /// kept once built: a launch then skips the CPU compiler's cache lookup.
    #[cfg(feature = "jit")]
    cpu: [std::sync::OnceLock<Arc<tessera_codegen::cpu::CpuKernel>>; 3],
    /// Set once a compilation started by [`Compiled::cpu_compiling`] has ended (its
    /// kernel, if any, is then in `cpu`), per slot of `cpu`.
    #[cfg(feature = "jit")]
    cpu_done: [std::sync::OnceLock<Arc<std::sync::atomic::AtomicBool>>; 3],
}

impl Compiled {
    fn new(func: Function, debug: Option<Arc<DebugSites>>) -> Compiled {
        Compiled {
            ir_text: tessera_ir::printer::print_function(&func),
            func: Arc::new(func),
            debug,
            specs: Mutex::new(HashMap::new()),
            #[cfg(feature = "jit")]
            cpu: Default::default(),
            #[cfg(feature = "jit")]
            cpu_done: Default::default(),
        }
    }

    /// This kernel compiled for the CPU device with `checks`, or why it is not.
    #[cfg(feature = "jit")]
    #[allow(clippy::result_large_err)] // (cold: the caller falls back or reports it)
    pub(crate) fn cpu_kernel(
        &self,
        checks: tessera_codegen::cpu::Checks,
    ) -> Result<Arc<tessera_codegen::cpu::CpuKernel>, tessera_codegen::cpu::CpuError> {
        let slot = &self.cpu[Self::cpu_slot(checks)];
        if let Some(k) = slot.get() {
            return Ok(Arc::clone(k));
        }
        let store = cpu_objects().map(|s| s as &dyn tessera_codegen::cpu::ObjectStore);
        let k = tessera_codegen::cpu::compile_with(&self.func, checks, store)?;
        Ok(Arc::clone(slot.get_or_init(|| k)))
    }

    #[cfg(feature = "jit")]
    fn cpu_slot(checks: tessera_codegen::cpu::Checks) -> usize {
        match (checks.checked(), checks.sanitize()) {
            (_, true) => 1,
            (true, false) => 0,
            (false, _) => 2,
        }
    }

    /// This kernel compiled for the CPU device with `checks`, if that is done (in this
    /// process, or found in the disk cache by an earlier launch).
    #[cfg(feature = "jit")]
    pub(crate) fn cpu_ready(
        &self,
        checks: tessera_codegen::cpu::Checks,
    ) -> Option<Arc<tessera_codegen::cpu::CpuKernel>> {
        self.cpu[Self::cpu_slot(checks)].get().cloned()
    }

    /// Compiles this kernel for the CPU device on a thread of its own (started by the
    /// first call; later calls share it): the flag is set when it has ended, its
    /// kernel then ready ([`Compiled::cpu_ready`]) unless compiling failed (which
    /// [`Compiled::cpu_kernel`] then reports).
    #[cfg(feature = "jit")]
    pub(crate) fn cpu_compiling(
        self: &Arc<Self>,
        checks: tessera_codegen::cpu::Checks,
    ) -> Arc<std::sync::atomic::AtomicBool> {
        use std::sync::atomic::{AtomicBool, Ordering};
        Arc::clone(self.cpu_done[Self::cpu_slot(checks)].get_or_init(|| {
            let done = Arc::new(AtomicBool::new(false));
            let (this, flag) = (Arc::clone(self), Arc::clone(&done));
            let spawned = crate::backend::in_flight::spawn("tessera-cpu-compile", move || {
                // Below the launch's own threads, which the interpreter runs on
                // meanwhile (on Linux a thread's nice value is its own).
                #[cfg(target_os = "linux")]
                // SAFETY: `setpriority` reads no memory of ours; `who` 0 is this
                // thread. A failure only leaves the priority as it was.
                unsafe {
                    libc::setpriority(libc::PRIO_PROCESS, 0, 10);
                }
                let _ = this.cpu_kernel(checks);
                flag.store(true, Ordering::Release);
            });
            if spawned.is_err() {
                // No thread: the launch compiles when the interpreter stops.
                done.store(true, Ordering::Release);
            }
            done
        }))
    }

    /// This kernel specialized like Triton does: parameters known to be 16-byte
    /// aligned pointers or multiples of 16, which codegen turns into 128-bit accesses,
    /// and pointers into buffers smaller than 2 GiB (32-bit buffer offsets on AMD).
    /// Each specialization has its own IR text, so its own artifact key.
    pub(crate) fn specialized(&self, facts: Vec<ParamFacts>) -> Arc<Compiled> {
        let mut specs = self.specs.lock().unwrap_or_else(|e| e.into_inner());
        specs
            .entry(facts)
            .or_insert_with_key(|spec| {
                Arc::new(Compiled::new(
                    tessera_ir::passes::specialize(&self.func, spec),
                    self.debug.clone(),
                ))
            })
            .clone()
    }
}

/// Compiled CPU kernels kept in the disk cache ([`disk_cache`]), under the same key
/// scheme and trust model as GPU kernels: a later process links them without
/// compiling.
#[cfg(feature = "jit")]
struct CpuObjects(disk_cache::DiskCache);

#[cfg(feature = "jit")]
impl CpuObjects {
    fn key(ir_text: &str, identity: &str) -> disk_cache::CacheKey {
        disk_cache::CacheKey::new(ir_text, "host-cpu", artifact::COMPILER_VERSION, identity)
    }
}

#[cfg(feature = "jit")]
impl tessera_codegen::cpu::ObjectStore for CpuObjects {
    fn get(&self, ir_text: &str, identity: &str) -> Option<Vec<u8>> {
        self.0.get(&Self::key(ir_text, identity))
    }
    fn put(&self, ir_text: &str, identity: &str, bytes: &[u8]) {
        if let Err(e) = self.0.put(&Self::key(ir_text, identity), bytes) {
            log::warn!("not caching a compiled CPU kernel: {e}");
        }
    }
    fn remove(&self, ir_text: &str, identity: &str) {
        log::warn!("discarding an unusable compiled CPU kernel from the cache");
        self.0.remove(&Self::key(ir_text, identity));
    }
}

/// The process's store of compiled CPU kernels (`None`: `TESSERA_CACHE_DIR=off`, or
/// no cache folder).
#[cfg(feature = "jit")]
fn cpu_objects() -> Option<&'static CpuObjects> {
    static STORE: OnceLock<Option<CpuObjects>> = OnceLock::new();
    STORE
        .get_or_init(|| {
            disk_cache::DiskCache::from_env()
                .ok()
                .flatten()
                .map(CpuObjects)
        })
        .as_ref()
}

type IrKey = (TypeId, String);

fn cache() -> &'static Mutex<HashMap<IrKey, Arc<Compiled>>> {
    static CACHE: OnceLock<Mutex<HashMap<IrKey, Arc<Compiled>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The IR of kernel `K` for comptime arguments `ct`, after verification and
/// optimization, with `device_print`/`device_assert` lowered to stores into the
/// hidden last parameter ([`tessera_ir::debug`]): built on first use, then served from an in-process cache keyed by
/// the kernel's type (which includes its generic arguments) and `ct`.
pub fn kernel_ir<K: Kernel>(ct: &K::Comptime) -> Result<Arc<Function>, Error> {
    Ok(compile::<K>(ct)?.func.clone())
}

pub(crate) fn compile<K: Kernel>(ct: &K::Comptime) -> Result<Arc<Compiled>, Error> {
    let key: IrKey = (TypeId::of::<K>(), format!("{ct:?}"));
    if let Some(c) = lock_cache().get(&key) {
        return Ok(c.clone());
    }
    // Build outside the lock: kernels may be built concurrently.
    let mut func = K::build(ct).map_err(|source| Error::Build {
        kernel: K::NAME.to_string(),
        source,
    })?;
    let verify = |f: &Function| {
        tessera_ir::verify::verify(f).map_err(|source| Error::Verify {
            kernel: K::NAME.to_string(),
            source,
        })
    };
    verify(&func)?;
    tessera_ir::passes::optimize(&mut func);
    verify(&func)?;
    // `device_print`/`device_assert` become stores into a hidden buffer, the same
    // IR for every backend.
    let debug = tessera_ir::debug::lower_debug_ops(&mut func)
        .map_err(|reason| Error::Launch {
            kernel: K::NAME.to_string(),
            reason,
        })?
        .map(Arc::new);
    if debug.is_some() {
        tessera_ir::passes::optimize(&mut func);
        verify(&func)?;
    }
    dump::dump_ir(&func, &key.1)?;
    let compiled = Arc::new(Compiled::new(func, debug));
    Ok(lock_cache().entry(key).or_insert(compiled).clone())
}

fn lock_cache() -> std::sync::MutexGuard<'static, HashMap<IrKey, Arc<Compiled>>> {
    // A panic while holding the lock cannot leave the map inconsistent (inserts are
    // single calls), so a poisoned lock is still usable.
    cache().lock().unwrap_or_else(|e| e.into_inner())
}
