//! The compiled CPU device: tile IR lowered for the host (`lower/host/`: one
//! function per program instance, each tile op a loop nest over its elements, tiles in
//! a per-thread scratch area, offsets and pointers built from `arange` kept affine so
//! that loads and stores are contiguous vector accesses), optimized by LLVM for this
//! machine's CPU (`default<O3>`, its vector extensions), and run with one program
//! instance per task on rayon's pool.
//!
//! [`launch`] compiles a kernel once per process (keyed by its printed IR and whether
//! accesses are checked) and runs its grid. Compiled code is a relocatable object
//! linked into the process by ORC's LLJIT (`object.rs`); [`compile_with`] keeps it,
//! with what a launch needs, in an [`ObjectStore`] (the runtime's disk cache), so a
//! later process links it without compiling. A kernel the compiled device does not
//! lower comes back as [`CpuError::Unsupported`], naming the op, so that the caller
//! runs it on the interpreter instead; nothing runs before that is known. So does a
//! launch whose buffers overlap where the compiled code reads one while it writes
//! the other (a load fused into a store to another parameter, which reads memory
//! as the store goes, not the whole tile first).
//!
//! **Memory safety.** Every load and store that runs is checked against the buffer
//! its pointer came from ([`Checks::BOUNDS`], the default in every build; a vector run
//! at its first and last element), and an access outside it fails the launch with
//! [`InterpError::OutOfBounds`] (the kernel, op, `file:line:col`, program id and tile
//! element) before it touches memory. [`Checks::SANITIZE`] reports, as the
//! interpreter does, also the loads whose values a mask discards later (they are
//! not fused then). Only [`Checks::unchecked`], an `unsafe` constructor, drops the
//! checks.
//!
//! **Results** are those of the interpreter, with the same errors: integer division
//! by zero and non-positive `for` steps are always reported. Elementwise math follows the SIMT lowering's helpers, which the emulator
//! holds to the interpreter: bit-exact for integer, comparison, select and
//! conversion ops and IEEE `+ - * / sqrt`; `sin`/`cos`/`tanh`/... within a few ulp
//! (libm calls, one per element). `exp`, `exp2`, `log` and `log2` are the host's own
//! arithmetic (so that they vectorize): within 1 ulp of libm over the sweeps in
//! `tests/cpu_device.rs`, which assert 2. Sums (`reduce`,
//! `dot`) may be reassociated (vectorized) and `dot` contracts its products into
//! FMAs, so they match within rounding. When program instances fail, the error of
//! the lowest failing program id is returned, as on the interpreter.
//!
//! **Communication.** Communicating kernels are compiled too: `remote_ptr` adds the
//! distance from this rank's copy of a symmetric buffer to the peer's (every rank's
//! heap is mapped in this process), so remote loads and stores are host accesses;
//! `signal` is an atomic read-modify-write with the op's ordering; `wait_until` and
//! `barrier_all` call the runtime, which polls with the interpreter's protocol and
//! timeouts. The program instances of a kernel that waits are coroutines, all
//! resident, run round robin by a few OS threads per rank (the world's ranks
//! together get as many as the machine has cores), never an OS thread per program.
//! Ranks behind a communication engine (other nodes) run on the interpreter.
//!
//! **Speed** comes from fusion (a chain of elementwise ops and the loads that feed it
//! computed in the loop of the op that consumes it, with vector loads), row
//! reductions by vectors, `dot` register blocks sized for the host's vector
//! registers, and code generated for this CPU; BENCHMARKS.md, "The compiled CPU
//! device", has the figures against numpy and torch.

// Kernel errors are cold and carry the interpreter's whole diagnostic.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use inkwell::OptimizationLevel;
use inkwell::context::Context;
use rayon::prelude::*;
use tessera_ir::interp::{CommWorld, InterpError, KernelArg, MAX_RESIDENT};
use tessera_ir::ir::CmpPred;
use tessera_ir::{Elem, Function, Span};

use crate::lower::LowerError;
use crate::lower::host::{
    BARRIER, CHECK, ERR_WORDS, HOST_KERNEL, HostSite, POLL, SiteKind, WAIT, WaitStatus, lower_host,
};

mod object;
mod world;

/// Why [`launch`] did not run a kernel, or how it failed.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    /// The kernel uses an op the compiled device does not lower (run it on the
    /// interpreter).
    #[error("{span}: kernel `{kernel}` is not compiled for the CPU: {message}")]
    Unsupported {
        /// Kernel name.
        kernel: String,
        /// The op's source location.
        span: Span,
        /// Which op, and why.
        message: String,
    },
    /// A failure of the kernel or its arguments, as the interpreter reports it.
    #[error(transparent)]
    Exec(#[from] InterpError),
    /// LLVM failed to compile the lowered kernel (a bug).
    #[error("compiling kernel `{kernel}` for the CPU: {message}")]
    Jit {
        /// Kernel name.
        kernel: String,
        /// LLVM's message.
        message: String,
    },
}

type Entry =
    unsafe extern "C" fn(*const u64, *const u64, *const u32, *mut u8, *mut u64, *const u64) -> i32;

/// A kernel compiled for the host ([`compile`]), launched by [`launch_with`].
pub struct CpuKernel {
    /// The kernel it was compiled from.
    func: Arc<Function>,
    entry: Entry,
    sites: Vec<HostSite>,
    scratch_bytes: u64,
    /// Parameter pairs whose buffers must not overlap (see `HostLowered::disjoint`).
    disjoint: Vec<(usize, usize)>,
    /// Parameters whose peers' copies the code reaches (see `HostLowered::remote`).
    remote: Vec<usize>,
    /// The kernel waits for other programs (`wait_until`, `barrier_all`).
    blocking: bool,
    /// Seconds LLVM took (lowering, optimization, machine code).
    pub compile_secs: f64,
}

impl std::fmt::Debug for CpuKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuKernel")
            .field("scratch_bytes", &self.scratch_bytes)
            .field("compile_secs", &self.compile_secs)
            .finish()
    }
}

/// How compiled code checks its memory accesses. Every mode a safe caller can
/// choose keeps every access inside the launch's buffers: [`Checks::BOUNDS`] (the
/// default) checks each access that happens, a vector run at its two ends (so a
/// contiguous tile costs two comparisons a run, not one an element);
/// [`Checks::SANITIZE`] also reports what the interpreter reports and the compiled
/// code would not touch (a load whose value a mask later discards), at the cost of
/// load fusion. [`Checks::unchecked`] (`unsafe`) checks nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Checks(Mode);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Mode {
    Bounds,
    Sanitize,
    Unchecked,
}

impl Checks {
    /// Every access that happens is checked against its buffer (the default).
    pub const BOUNDS: Checks = Checks(Mode::Bounds);
    /// Every access the program makes is checked and reported as the interpreter
    /// reports it (`TESSERA_SANITIZE`); loads are not fused.
    pub const SANITIZE: Checks = Checks(Mode::Sanitize);

    /// No access is checked.
    ///
    /// # Safety
    ///
    /// Every load and store of every kernel compiled with it, in every launch, must
    /// lie inside the buffer it goes through: an access outside it reads or writes
    /// the host process's memory (undefined behaviour: corrupted heaps, crashes,
    /// data leaked between buffers). Meant for measuring what the checks cost.
    pub const unsafe fn unchecked() -> Checks {
        Checks(Mode::Unchecked)
    }

    /// Whether accesses are checked at all.
    pub fn checked(self) -> bool {
        self.0 != Mode::Unchecked
    }

    /// Whether this is the sanitizer ([`Checks::SANITIZE`]).
    pub fn sanitize(self) -> bool {
        self.0 == Mode::Sanitize
    }
}

impl From<bool> for Checks {
    /// `true`: [`Checks::SANITIZE`]; `false`: [`Checks::BOUNDS`].
    fn from(sanitize: bool) -> Checks {
        if sanitize {
            Checks::SANITIZE
        } else {
            Checks::BOUNDS
        }
    }
}

type Key = (String, Checks);
/// A compiled kernel, or where and why the kernel does not lower.
type Cached = Result<Arc<CpuKernel>, (Span, String)>;
/// A failed program: its linear id, error record and program id.
type Failure = (u64, [u64; ERR_WORDS], [u32; 3]);

/// Compiled kernels, and kernels known not to lower (with the reason).
fn cache() -> &'static Mutex<HashMap<Key, Cached>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Cached>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Where compiled kernels are kept between processes (the runtime's disk cache):
/// entries are named by a kernel's printed IR and its code identity
/// ([`code_identity`]), and hold what [`compile_with`] wrote there.
pub trait ObjectStore {
    /// The bytes stored for (`ir_text`, `identity`), if any.
    fn get(&self, ir_text: &str, identity: &str) -> Option<Vec<u8>>;
    /// Stores `bytes` for (`ir_text`, `identity`); a failure only costs a later
    /// recompilation.
    fn put(&self, ir_text: &str, identity: &str, bytes: &[u8]);
    /// Removes an entry [`compile_with`] could not use.
    fn remove(&self, ir_text: &str, identity: &str);
}

/// What determines compiled CPU code besides the kernel's IR: the host CPU it was
/// generated for ([`crate::host_cpu`]), the checks, LLVM's version and this build of
/// the lowering (a fingerprint of tessera-codegen's and tessera-ir's sources).
pub fn code_identity(checks: Checks) -> String {
    static HOST: OnceLock<String> = OnceLock::new();
    let host = HOST.get_or_init(|| {
        let cpu = crate::host_cpu::host_cpu();
        format!(
            "cpu-object-v1 {} {} [{}] llvm{:?} {}",
            inkwell::targets::TargetMachine::get_default_triple()
                .as_str()
                .to_string_lossy(),
            cpu.name,
            cpu.features,
            inkwell::support::get_llvm_version(),
            env!("TESSERA_CODEGEN_FINGERPRINT"),
        )
    });
    format!("{host} {:?}", checks.0)
}

/// Readies what linking a compiled kernel needs (LLVM's host target, the JIT that
/// links kernels into the process, the host's [`code_identity`]): about a
/// millisecond a process that a launch soon after then does not spend; and rayon's
/// threads, which the launch runs programs on. The CPU
/// device calls it on a thread of its own when it is made; calling it again does
/// nothing.
pub fn prepare() {
    init();
    let _ = code_identity(Checks::BOUNDS);
    object::prepare(runtime_symbols);
    // Rayon's pool starts its threads on first use.
    rayon::broadcast(|_| ());
}

/// How many kernels this process has compiled with LLVM for the CPU device (not
/// counting those loaded from an [`ObjectStore`]).
pub fn compilations() -> u64 {
    COMPILATIONS.load(Ordering::Relaxed)
}

static COMPILATIONS: AtomicU64 = AtomicU64::new(0);

/// Compiles `func` for the host (or fetches it from the process's cache), its memory
/// accesses checked as `checks` says (`true`: the sanitizer, `false`: bounds).
pub fn compile(func: &Function, checks: impl Into<Checks>) -> Result<Arc<CpuKernel>, CpuError> {
    compile_with(func, checks, None)
}

/// [`compile`], looking in `store` before compiling and keeping what it compiles
/// there. An entry that cannot be used (damaged, or written by a foreign writer) is
/// removed and the kernel compiled again.
pub fn compile_with(
    func: &Function,
    checks: impl Into<Checks>,
    store: Option<&dyn ObjectStore>,
) -> Result<Arc<CpuKernel>, CpuError> {
    let checks = checks.into();
    let key = (tessera_ir::printer::print_function(func), checks);
    let lock = || cache().lock().unwrap_or_else(|p| p.into_inner());
    let unsupported = |(span, message): (Span, String)| CpuError::Unsupported {
        kernel: func.name.clone(),
        span,
        message,
    };
    if let Some(c) = lock().get(&key) {
        return c.clone().map_err(unsupported);
    }
    let built = match stored_or_build(func, checks, &key.0, store) {
        Ok(k) => Ok(Arc::new(k)),
        Err(CpuError::Unsupported { span, message, .. }) => Err((span, message)),
        Err(e) => return Err(e),
    };
    lock()
        .entry(key)
        .or_insert(built)
        .clone()
        .map_err(unsupported)
}

fn stored_or_build(
    func: &Function,
    checks: Checks,
    ir_text: &str,
    store: Option<&dyn ObjectStore>,
) -> Result<CpuKernel, CpuError> {
    let t0 = std::time::Instant::now();
    let identity = code_identity(checks);
    if let Some(store) = store
        && let Some(bytes) = store.get(ir_text, &identity)
    {
        match object::Artifact::from_bytes(&bytes).and_then(|a| load(func, a, t0)) {
            Ok(k) => return Ok(k),
            // Not an error of the user's: the kernel is compiled again.
            Err(_) => store.remove(ir_text, &identity),
        }
    }
    let artifact = build(func, checks, ir_text, &identity)?;
    if let Some(store) = store {
        store.put(ir_text, &identity, &artifact.to_bytes());
    }
    load(func, artifact, t0).map_err(|message| CpuError::Jit {
        kernel: func.name.clone(),
        message,
    })
}

/// The runtime functions compiled code calls, by the names the lowering declares, and
/// the half-precision conversions LLVM's back end may call.
fn runtime_symbols() -> Vec<(&'static str, usize)> {
    let mut v = vec![
        (POLL, tessera_cpu_poll as *const () as usize),
        (WAIT, world::tessera_cpu_wait as *const () as usize),
        (BARRIER, world::tessera_cpu_barrier as *const () as usize),
        (CHECK, world::tessera_cpu_check as *const () as usize),
    ];
    v.extend(crate::host::builtins());
    v
}

/// Links `artifact`'s object into the process and makes it a kernel (`t0`: when its
/// compilation or loading began).
fn load(
    func: &Function,
    artifact: object::Artifact,
    t0: std::time::Instant,
) -> Result<CpuKernel, String> {
    init();
    let addr = object::link(&artifact.object, &artifact.entry, runtime_symbols)?;
    // SAFETY: `addr` is the artifact's entry: the lowered `HOST_KERNEL` (renamed),
    // whose LLVM signature is `i32 (ptr, ptr, ptr, ptr, ptr, ptr)` (see
    // `lower::host`); linked code is never freed. The artifact was compiled by this
    // process or read from the caller's store, whose entries are trusted as compiled
    // code (the disk cache's trust model: a private folder, checksummed entries).
    let entry: Entry = unsafe { std::mem::transmute::<usize, Entry>(addr) };
    Ok(CpuKernel {
        func: Arc::new(func.clone()),
        entry,
        sites: artifact.sites,
        scratch_bytes: artifact.scratch_bytes,
        disjoint: artifact.disjoint,
        remote: artifact.remote,
        blocking: func.uses_blocking(),
        compile_secs: t0.elapsed().as_secs_f64(),
    })
}

pub use crate::host::cores;

/// The process's clock origin for deadlines.
fn epoch() -> std::time::Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    *EPOCH.get_or_init(std::time::Instant::now)
}

/// The watchdog poll the compiled loops call once per iteration: `err[3]` holds the
/// deadline (nanoseconds after [`epoch`], 0 for none), `err[4]` counts the polls;
/// the clock is read every 1024th. Returns 1 once the deadline has passed.
extern "C" fn tessera_cpu_poll(err: *mut u64) -> i32 {
    // SAFETY: the compiled kernel passes its `err` record, five words that `launch`
    // owns for the program's run (and nothing else touches meanwhile).
    let rec = unsafe { std::slice::from_raw_parts_mut(err, 5) };
    rec[4] = rec[4].wrapping_add(1);
    if rec[4] & 1023 != 0 {
        return 0;
    }
    // A program of a waiting kernel gives the others on its thread a turn.
    world::loop_turn();
    (rec[3] != 0 && epoch().elapsed().as_nanos() as u64 >= rec[3]) as i32
}

fn init() {
    crate::host::init_target();
}

/// Lowers `func`, optimizes it for the host and generates its object, the entry
/// named after the IR and the code identity (so that any set of artifacts links
/// into one process).
fn build(
    func: &Function,
    checks: Checks,
    ir_text: &str,
    identity: &str,
) -> Result<object::Artifact, CpuError> {
    use sha2::Digest;
    init();
    let jit_err = |message: String| CpuError::Jit {
        kernel: func.name.clone(),
        message,
    };
    let ctx = Context::create();
    let lowered =
        lower_host(&ctx, func, checks.checked(), checks.sanitize()).map_err(|e| match e {
            LowerError::Unsupported { span, message } => CpuError::Unsupported {
                kernel: func.name.clone(),
                span,
                message,
            },
            LowerError::Llvm(m) => jit_err(m),
        })?;
    COMPILATIONS.fetch_add(1, Ordering::Relaxed);
    let mut h = sha2::Sha256::new();
    for part in [ir_text, identity] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let digest: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let entry = format!("tessera_cpu_{digest}");
    let module = &lowered.module;
    // Only the entry is visible outside the object: every other definition is
    // internal (no clash between kernels linked into one process).
    let mut f = module.get_first_function();
    while let Some(fv) = f {
        if fv.count_basic_blocks() > 0 {
            fv.set_linkage(inkwell::module::Linkage::Internal);
        }
        f = fv.get_next_function();
    }
    let mut g = module.get_first_global();
    while let Some(gv) = g {
        if gv.get_initializer().is_some() {
            gv.set_linkage(inkwell::module::Linkage::Internal);
        }
        g = gv.get_next_global();
    }
    let kernel = module
        .get_function(HOST_KERNEL)
        .ok_or_else(|| jit_err(format!("the lowered module has no `{HOST_KERNEL}`")))?;
    kernel.set_linkage(inkwell::module::Linkage::External);
    kernel.as_global_value().set_name(&entry);
    let machine = crate::host::optimize_for_host(
        module,
        OptimizationLevel::Aggressive,
        "default<O3>",
        std::env::var_os("TESSERA_DUMP_CPU_LLVM").is_some(),
        inkwell::targets::RelocMode::PIC,
        inkwell::targets::CodeModel::Small,
    )
    .map_err(jit_err)?;
    let object = machine
        .write_to_memory_buffer(module, inkwell::targets::FileType::Object)
        .map_err(|m| jit_err(m.to_string()))?
        .as_slice()
        .to_vec();
    Ok(object::Artifact {
        entry,
        scratch_bytes: lowered.scratch_bytes,
        disjoint: lowered.disjoint,
        remote: lowered.remote,
        sites: lowered.sites,
        object,
    })
}

/// One launch of a [`CpuKernel`]: the grid, the arguments, the world, the watchdog,
/// and who hands out the program instances. `CpuLaunch { grid, args,
/// ..Default::default() }` runs every program as rank 0 of a world of one, without
/// a watchdog.
#[derive(Clone, Copy, Default)]
pub struct CpuLaunch<'a> {
    /// Program instances along x, y and z.
    pub grid: [u32; 3],
    /// One per kernel parameter, in order (as for [`tessera_ir::interp::run`]).
    pub args: &'a [KernelArg],
    /// The world a communicating kernel runs in (remote accesses, signals, waits,
    /// `barrier_all`: see the module docs, "Communication"); `None`: rank 0 of a
    /// world of one. Symmetric buffers must be host memory on every rank (a buffer
    /// behind a communication engine gives [`CpuError::Unsupported`]). When a
    /// program fails, every rank's waits are released (the world is aborted) before
    /// the error is returned.
    pub world: Option<&'a CommWorld>,
    /// A watchdog: once the launch has run this long, every loop of every program
    /// instance stops at its next iteration, and the launch fails with
    /// [`InterpError::LaunchTimeout`] naming the loop (as on the interpreter).
    pub timeout: Option<std::time::Duration>,
    /// Run only the program instances this hands out (linear ids, `x` fastest) until
    /// it returns `None`, as [`tessera_ir::interp::run_claimed`] does on the
    /// interpreter, so that the two can take turns at one launch (see the runtime's
    /// `TESSERA_CPU_JIT`); a kernel that waits is refused then
    /// ([`CpuError::Unsupported`], before anything runs). `None`: every program.
    pub claim: Option<&'a (dyn Fn() -> Option<u64> + Sync)>,
}

impl std::fmt::Debug for CpuLaunch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuLaunch")
            .field("grid", &self.grid)
            .field("args", &self.args.len())
            .field("world", &self.world.map(|w| (w.rank, w.size)))
            .field("timeout", &self.timeout)
            .field("claimed", &self.claim.is_some())
            .finish()
    }
}

/// Runs `kernel` (from [`compile`]) on the compiled CPU device as `launch` says
/// (see the module docs): the CPU device's one launch entry ([`launch`] is its
/// shorthand). A caller that launches one kernel often keeps it, and skips the
/// compile cache's lookup (which prints the IR).
///
/// Arguments are checked as the interpreter checks them; what the compiled code
/// cannot run here (buffers behind a communication engine, overlapping buffers it
/// reads while it writes, a waiting kernel in turns) gives
/// [`CpuError::Unsupported`] before anything runs.
pub fn launch_with(kernel: &CpuKernel, launch: &CpuLaunch<'_>) -> Result<(), CpuError> {
    let CpuLaunch {
        grid,
        args,
        world,
        timeout,
        claim,
    } = *launch;
    if claim.is_some() && kernel.blocking {
        return Err(CpuError::Unsupported {
            kernel: kernel.func.name.clone(),
            span: kernel.func.span.clone(),
            message: "the programs of a kernel that waits cannot be run in turns".into(),
        });
    }
    drive(kernel, grid, args, world, timeout, claim)
}

/// Compiles `func` ([`compile`], `checks`) and runs every program instance of `grid`
/// on `args` ([`launch_with`]), as rank 0 of a world of one, without a watchdog.
///
/// Every op the device does not lower gives [`CpuError::Unsupported`] before
/// anything runs.
pub fn launch(
    func: &Function,
    grid: [u32; 3],
    args: &[KernelArg],
    checks: impl Into<Checks>,
) -> Result<(), CpuError> {
    let kernel = compile(func, checks)?;
    launch_with(
        &kernel,
        &CpuLaunch {
            grid,
            args,
            ..Default::default()
        },
    )
}

fn drive(
    kernel: &CpuKernel,
    grid: [u32; 3],
    args: &[KernelArg],
    world: Option<&CommWorld>,
    timeout: Option<std::time::Duration>,
    claim: Option<&(dyn Fn() -> Option<u64> + Sync)>,
) -> Result<(), CpuError> {
    let func = &*kernel.func;
    let arg_err = |param: &str, message: String| {
        CpuError::Exec(InterpError::ArgMismatch {
            kernel: func.name.clone(),
            span: func.span.clone(),
            param: param.to_string(),
            message,
        })
    };
    let not_here = |message: String| CpuError::Unsupported {
        kernel: func.name.clone(),
        span: func.span.clone(),
        message,
    };
    if args.len() != func.params.len() {
        return Err(arg_err(
            "<count>",
            format!(
                "expected {} arguments, got {}",
                func.params.len(),
                args.len()
            ),
        ));
    }
    let single;
    let world = match world {
        Some(w) => w,
        None => {
            single = CommWorld::single();
            &single
        }
    };
    let size = world.size as usize;
    let me = world.rank as usize;
    let mut words = vec![0u64; args.len()];
    let mut lens = vec![0u64; args.len()];
    // This rank, the number of ranks, then per parameter and rank the distance to
    // that rank's copy (see `lower::host`).
    let mut comm_words = vec![0u64; 2 + args.len() * size];
    comm_words[0] = world.rank as u64;
    comm_words[1] = world.size as u64;
    let mut reach: Vec<Vec<(u64, u64)>> = vec![Vec::new(); args.len()];
    let mut symmetric = vec![false; args.len()];
    // Kept alive (and their memory with them) until every program instance is done.
    let mut held: Vec<Arc<tessera_ir::interp::HostBuffer>> = Vec::new();
    for (k, (p, a)) in func.params.iter().zip(args).enumerate() {
        match (func.ty(p.value).elem, a) {
            (Elem::Ptr { pointee, .. }, KernelArg::Buffer(b)) => {
                if b.elem() != pointee {
                    return Err(arg_err(
                        &p.name,
                        format!("expected a buffer of {pointee}, got one of {}", b.elem()),
                    ));
                }
                if b.is_remote() {
                    return Err(not_here(format!(
                        "buffer `{}` lives on another node",
                        p.name
                    )));
                }
                words[k] = b.as_mut_ptr() as u64;
                lens[k] = b.size_bytes() as u64;
                reach[k].push((words[k], lens[k]));
                held.push(Arc::clone(b));
            }
            (Elem::Ptr { pointee, .. }, KernelArg::Symmetric(copies)) => {
                if copies.len() != size {
                    return Err(arg_err(
                        &p.name,
                        format!(
                            "a symmetric buffer with {} copies in a world of {size} rank(s)",
                            copies.len()
                        ),
                    ));
                }
                if let Some(b) = copies.iter().find(|b| b.elem() != pointee) {
                    return Err(arg_err(
                        &p.name,
                        format!("expected a buffer of {pointee}, got one of {}", b.elem()),
                    ));
                }
                if copies.iter().any(|b| b.is_remote()) {
                    return Err(not_here(format!(
                        "symmetric buffer `{}` has copies behind a communication engine",
                        p.name
                    )));
                }
                let local = &copies[me];
                if copies.iter().any(|b| b.size_bytes() != local.size_bytes()) {
                    return Err(not_here(format!(
                        "the copies of symmetric buffer `{}` differ in size",
                        p.name
                    )));
                }
                words[k] = local.as_mut_ptr() as u64;
                lens[k] = local.size_bytes() as u64;
                reach[k].push((words[k], lens[k]));
                for (r, c) in copies.iter().enumerate() {
                    let at = c.as_mut_ptr() as u64;
                    comm_words[2 + k * size + r] = at.wrapping_sub(words[k]);
                    if r != me {
                        reach[k].push((at, lens[k]));
                    }
                    held.push(Arc::clone(c));
                }
                symmetric[k] = true;
            }
            (Elem::Scalar(t), KernelArg::Scalar(s)) => {
                if s.ty() != t {
                    return Err(arg_err(
                        &p.name,
                        format!("expected a {t} scalar, got {}", s.ty()),
                    ));
                }
                words[k] = crate::host::scalar_slot(*s);
            }
            (e, _) => {
                return Err(arg_err(&p.name, format!("expected an argument for {e:?}")));
            }
        }
    }
    // A pointer into a buffer that is not symmetric has no copy on a peer: the
    // interpreter reports that (as `InvalidPointer`) where the kernel makes one.
    if let Some(&k) = kernel.remote.iter().find(|&&k| !symmetric[k]) {
        return Err(not_here(format!(
            "`{}` is not a symmetric buffer, and the kernel reaches a peer's copy of it",
            func.params[k].name
        )));
    }
    if kernel.blocking
        && !world.ctrl.first().is_some_and(|b| {
            !b.is_remote() && b.size_bytes() >= tessera_ir::interp::ctrl::WORDS * 8
        })
    {
        return Err(not_here(
            "the world's control words are not host memory".into(),
        ));
    }
    // The compiled code reads some buffers while it writes others (a fused load):
    // overlapping ones take the interpreter, which reads a whole tile first.
    for &(r, w) in &kernel.disjoint {
        let (a, b) = ((words[r], lens[r]), (words[w], lens[w]));
        if a.0 < b.0.saturating_add(b.1) && b.0 < a.0.saturating_add(a.1) {
            return Err(not_here(format!(
                "buffers `{}` and `{}` overlap, and the compiled kernel reads the first \
                 while it writes the second",
                func.params[r].name, func.params[w].name
            )));
        }
    }
    let total = grid.iter().map(|&g| g as u64).product::<u64>();
    if total == 0 {
        return Ok(());
    }
    if kernel.blocking && total > MAX_RESIDENT {
        return Err(CpuError::Exec(InterpError::TooManyPrograms {
            kernel: func.name.clone(),
            span: func.span.clone(),
            programs: total,
            limit: MAX_RESIDENT,
        }));
    }
    let deadline = timeout.map_or(0, |t| {
        (epoch().elapsed() + t)
            .as_nanos()
            .clamp(1, u64::MAX as u128) as u64
    });
    // The lowest failure so far (abandoned waits rank after every real failure, as
    // on the interpreter).
    let first_fail = AtomicU64::new(u64::MAX);
    let failures: Mutex<Vec<Failure>> = Mutex::new(Vec::new());
    let scratch_words = (kernel.scratch_bytes as usize).div_ceil(8) + 8;
    let comm = world::Comm {
        world,
        words: comm_words,
        reach,
        participants: total * size as u64,
    };
    let (words, lens) = (&words[..], &lens[..]);
    let run = |scratch: &mut [u64], lin: u64| {
        if lin > first_fail.load(Ordering::Relaxed) {
            return;
        }
        let (gx, gy) = (grid[0] as u64, grid[1] as u64);
        let pid = [
            (lin % gx) as u32,
            ((lin / gx) % gy) as u32,
            (lin / (gx * gy)) as u32,
        ];
        let pids = [pid[0], pid[1], pid[2], grid[0], grid[1], grid[2]];
        let base = scratch.as_mut_ptr() as usize;
        let aligned = base.next_multiple_of(64) as *mut u8;
        let mut err = [0u64; ERR_WORDS];
        err[3] = deadline;
        // SAFETY: the entry has the signature `Entry`; `words`/`lens` hold one word
        // per parameter; `pids` six `i32`s; the scratch area holds `scratch_bytes`
        // from a 64-byte boundary (`scratch_words` leaves 64 bytes to align);
        // `err` `ERR_WORDS` words; `comm.words` two words and one per parameter and
        // rank. The buffers' memory (every rank's copy of the symmetric ones) is
        // held by `held` for the launch; every access is checked to lie inside its
        // buffer (or some rank's copy of it), unless the kernel was compiled with
        // `Checks::unchecked`, whose (unsafe) caller vouches for every index.
        let rc = unsafe {
            (kernel.entry)(
                words.as_ptr(),
                lens.as_ptr(),
                pids.as_ptr(),
                aligned,
                err.as_mut_ptr(),
                comm.words.as_ptr(),
            )
        };
        if rc != 0 {
            let abandoned = kernel
                .sites
                .get(err[0] as usize)
                .is_some_and(|s| matches!(s.kind, SiteKind::Wait(_)))
                && err[1] == WaitStatus::Aborted as u64;
            if !abandoned {
                world.abort();
            }
            let key = lin | if abandoned { 1 << 63 } else { 0 };
            first_fail.fetch_min(key, Ordering::Relaxed);
            failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((key, err, pid));
        }
    };
    if kernel.blocking {
        // The world's ranks share this machine (thread ranks, or processes on one
        // node): together they use as many threads as it has cores.
        let cores = cores();
        let workers = cores.div_ceil(size.max(1));
        world::run_resident(&comm, total, workers, scratch_words, &|lin, scratch| {
            run(scratch, lin)
        })
        .map_err(|message| CpuError::Jit {
            kernel: func.name.clone(),
            message,
        })?;
    } else if let Some(claim) = claim {
        // One loop a worker, each taking the next program as it finishes one.
        (0..rayon::current_num_threads())
            .into_par_iter()
            .for_each_init(
                || vec![0u64; scratch_words],
                |scratch, _| {
                    let _launch = world::enter(&comm);
                    while let Some(lin) = claim() {
                        if lin < total {
                            run(scratch, lin)
                        }
                    }
                },
            );
    } else {
        (0..total).into_par_iter().for_each_init(
            || vec![0u64; scratch_words],
            |scratch, lin| {
                let _launch = world::enter(&comm);
                run(scratch, lin)
            },
        );
    }
    drop(held);
    let fails = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    let Some(&(key, err, pid)) = fails.iter().min_by_key(|f| f.0) else {
        return Ok(());
    };
    let lin = key & !(1 << 63);
    Err(CpuError::Exec(decode(
        func,
        &kernel.sites,
        err,
        (pid, lin),
        (args, world),
        timeout,
    )))
}

/// ``signal `sig`[3]``: the signal word at `addr`, named after the buffer holding it.
fn signal_name(func: &Function, args: &[KernelArg], addr: u64) -> String {
    for (p, a) in func.params.iter().zip(args) {
        let bufs: &[Arc<tessera_ir::interp::HostBuffer>] = match a {
            KernelArg::Buffer(b) => std::slice::from_ref(b),
            KernelArg::Symmetric(c) => c,
            KernelArg::Scalar(_) => continue,
        };
        for b in bufs {
            let base = b.as_mut_ptr() as u64;
            if addr >= base && addr < base + b.size_bytes() as u64 {
                return format!("signal `{}`[{}]", p.name, (addr - base) / 8);
            }
        }
    }
    format!("signal word at {addr:#x}")
}

fn unravel(shape: &[u32], mut i: u64) -> Vec<u32> {
    let mut out = vec![0u32; shape.len()];
    for d in (0..shape.len()).rev() {
        let n = shape[d].max(1) as u64;
        out[d] = (i % n) as u32;
        i /= n;
    }
    out
}

/// The interpreter's error for a failure record `[site, lane, index, ..]`.
fn decode(
    func: &Function,
    sites: &[HostSite],
    err: [u64; ERR_WORDS],
    (pid, lin): ([u32; 3], u64),
    (args, world): (&[KernelArg], &CommWorld),
    timeout: Option<std::time::Duration>,
) -> InterpError {
    let Some(site) = sites.get(err[0] as usize) else {
        return InterpError::InvalidIr {
            kernel: func.name.clone(),
            op: "?",
            span: func.span.clone(),
            message: format!("the compiled kernel failed at unknown site {}", err[0]),
        };
    };
    if err[1] == u64::MAX {
        return InterpError::LaunchTimeout {
            kernel: func.name.clone(),
            op: site.op,
            span: site.span.clone(),
            program: lin,
            timeout: timeout.unwrap_or_default(),
        };
    }
    let lane = unravel(&site.shape, err[1]);
    match &site.kind {
        SiteKind::Access { param, remote } => {
            let (buffer, len) = match param {
                Some(k) => {
                    let len = match args.get(*k) {
                        Some(KernelArg::Buffer(b)) => b.len(),
                        Some(KernelArg::Symmetric(c)) => c.first().map_or(0, |b| b.len()),
                        _ => 0,
                    };
                    let name = func
                        .params
                        .get(*k)
                        .map_or_else(|| "?".into(), |p| p.name.clone());
                    let name = if *remote {
                        format!("{name} (this rank's or a peer's copy)")
                    } else {
                        name
                    };
                    (name, len)
                }
                None => ("<one of the kernel's buffers>".into(), 0),
            };
            InterpError::OutOfBounds {
                kernel: func.name.clone(),
                op: site.op,
                span: site.span.clone(),
                program_id: pid,
                index: err[2] as i64,
                lane,
                buffer,
                len,
            }
        }
        SiteKind::Peer => InterpError::BadPeer {
            kernel: func.name.clone(),
            op: site.op,
            span: site.span.clone(),
            rank: world.rank,
            program_id: pid,
            peer: err[2] as i64,
            world_size: world.size,
        },
        SiteKind::Wait(pred) => {
            if err[1] == WaitStatus::Aborted as u64 {
                return InterpError::Aborted {
                    kernel: func.name.clone(),
                    op: site.op,
                    span: site.span.clone(),
                    rank: world.rank,
                    program_id: pid,
                    failed_rank: err[5] as u32,
                };
            }
            let (what, pred, expected, observed) = match pred {
                Some(p) => (signal_name(func, args, err[6]), p.symbol(), err[7], err[5]),
                None => (
                    format!(
                        "arrivals of all {} program instances ({} rank(s) x {}; {} arrived)",
                        err[6],
                        world.size,
                        err[6] / world.size.max(1) as u64,
                        err[5]
                    ),
                    CmpPred::Ge.symbol(),
                    err[6],
                    err[5],
                ),
            };
            InterpError::WaitTimeout {
                kernel: func.name.clone(),
                op: site.op,
                span: site.span.clone(),
                rank: world.rank,
                program_id: pid,
                what,
                pred,
                expected,
                observed,
                timeout: world.timeout,
            }
        }
        SiteKind::DivZero => InterpError::DivisionByZero {
            kernel: func.name.clone(),
            op: site.op,
            span: site.span.clone(),
            program_id: pid,
            lane,
        },
        SiteKind::Loop => InterpError::InvalidIr {
            kernel: func.name.clone(),
            op: site.op,
            span: site.span.clone(),
            message: "a loop site failed without its watchdog".into(),
        },
        SiteKind::Step => InterpError::Unsupported {
            kernel: func.name.clone(),
            op: site.op,
            span: site.span.clone(),
            message: format!("for step must be positive, got {}", err[2] as i64),
        },
    }
}
