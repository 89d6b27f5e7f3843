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
        }
    }

    /// This kernel compiled for the CPU device with `checks`, or why it is not.
    #[cfg(feature = "jit")]
    #[allow(clippy::result_large_err)] // (cold: the caller falls back or reports it)
    pub(crate) fn cpu_kernel(
        &self,
        checks: tessera_codegen::cpu::Checks,
    ) -> Result<Arc<tessera_codegen::cpu::CpuKernel>, tessera_codegen::cpu::CpuError> {
        let slot = match (checks.checked(), checks.sanitize()) {
            (_, true) => &self.cpu[1],
            (true, false) => &self.cpu[0],
            (false, _) => &self.cpu[2],
        };
        if let Some(k) = slot.get() {
            return Ok(Arc::clone(k));
        }
        let k = tessera_codegen::cpu::compile(&self.func, checks)?;
        Ok(Arc::clone(slot.get_or_init(|| k)))
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
                    self.func.specialized(spec),
                    self.debug.clone(),
                ))
            })
            .clone()
    }
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
