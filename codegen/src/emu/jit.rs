//! Compiling a kernel for the host: the SIMT lowering with the [`Emu`] arch, an entry
//! wrapper taking the arguments as an array of pointers, LLVM's `default<O2>` pipeline
//! for the host CPU, and MCJIT. Compiled kernels are cached in memory for the life of
//! the process (keyed by the kernel's printed IR, the flavor and the options).
//!
//! The wrapper `void __tessera_emu_entry(ptr args)` loads parameter `i` from the
//! memory `args[i]` points to (a buffer's base pointer, or a scalar's bytes; `i1` as a
//! byte) and calls the kernel, so Rust calls every kernel signature the same way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Once, OnceLock};

use inkwell::AddressSpace;
use inkwell::OptimizationLevel;
use inkwell::context::Context;
use inkwell::targets::{CodeModel, RelocMode};
use inkwell::types::BasicMetadataTypeEnum;
use inkwell::values::BasicMetadataValueEnum;
use tessera_ir::Function;

use super::EmuError;
use crate::lower::arch::Emu;
use crate::lower::{Site, lower_with_sites};
use crate::target::EmuFlavor;
use crate::{CompileOptions, KernelMeta};

/// The entry wrapper's symbol.
const ENTRY: &str = "__tessera_emu_entry";

/// A kernel compiled for the host.
pub(crate) struct Compiled {
    /// `__tessera_emu_entry`.
    pub entry: unsafe extern "C" fn(*const *const u8),
    /// Launch facts.
    pub meta: KernelMeta,
    /// Site id → op.
    pub sites: Vec<Site>,
    /// The largest stack frame of the compiled code, as LLVM's code generator
    /// reported it (bytes).
    pub frame_bytes: u64,
}

type Key = (String, EmuFlavor, CompileOptions);

fn cache() -> &'static Mutex<HashMap<Key, Arc<Compiled>>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Arc<Compiled>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The compilation options of every kernel compiled for the emulator so far, with
/// its name and flavor (diagnostics: which option sets reached the compiler).
pub fn compiled_kernels() -> Vec<(String, EmuFlavor, CompileOptions)> {
    let map = cache().lock().unwrap_or_else(|p| p.into_inner());
    map.iter()
        .map(|((_, flavor, opts), c)| (c.meta.name.clone(), *flavor, opts.clone()))
        .collect()
}

/// Verifies `module`, optimizes it for this machine's CPU with the pass `pipeline`,
/// prints it when `dump` is set, JIT-compiles it at `level` (MCJIT) and returns the
/// address of function `entry`. The code is never freed: the engine and the module
/// are kept for the rest of the process (the callers' caches hand out pointers into
/// it). The emulator's (and unit tests' that run lowered helpers on the host).
pub(crate) fn jit_for_host(
    module: inkwell::module::Module<'_>,
    level: OptimizationLevel,
    pipeline: &str,
    dump: bool,
    entry: &str,
) -> Result<usize, String> {
    crate::host::optimize_for_host(
        &module,
        level,
        pipeline,
        dump,
        RelocMode::Default,
        CodeModel::JITDefault,
    )?;
    let ee = module
        .create_jit_execution_engine(level)
        .map_err(|m| m.to_string())?;
    let addr = ee.get_function_address(entry).map_err(|e| e.to_string())?;
    std::mem::forget(ee);
    std::mem::forget(module);
    Ok(addr)
}

pub(crate) fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        crate::host::init_target();
        for (name, addr) in super::symbols() {
            let Ok(c) = std::ffi::CString::new(name) else {
                continue;
            };
            // SAFETY: LLVM copies the name; the address is a function of this process
            // with the signature the lowering declares for `name`.
            unsafe { inkwell::llvm_sys::support::LLVMAddSymbol(c.as_ptr(), addr as *mut _) };
        }
    });
}

/// Compiles (or fetches from the cache) `func` for the emulator.
pub(crate) fn compile(
    func: &Function,
    flavor: EmuFlavor,
    opts: &CompileOptions,
    dump_llvm: bool,
) -> Result<Arc<Compiled>, EmuError> {
    let key = (
        tessera_ir::printer::print_function(func),
        flavor,
        opts.clone(),
    );
    let lock = || cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = lock().get(&key) {
        return Ok(c.clone());
    }
    let c = Arc::new(build(func, flavor, opts, dump_llvm)?);
    Ok(lock().entry(key).or_insert(c).clone())
}

fn build(
    func: &Function,
    flavor: EmuFlavor,
    opts: &CompileOptions,
    dump_llvm: bool,
) -> Result<Compiled, EmuError> {
    init();
    let jit_err = |message: String| EmuError::Jit {
        kernel: func.name.clone(),
        message,
    };
    // The JIT-compiled code lives as long as the process: so do its context and engine.
    let ctx: &'static Context = Box::leak(Box::new(Context::create()));
    let lowered = lower_with_sites(ctx, func, &Emu { flavor }, opts)?;
    let module = lowered.module;
    let kernel = module
        .get_function(&lowered.meta.name)
        .ok_or_else(|| jit_err("the lowered module has no kernel".into()))?;
    // A private name: a kernel called like a libc function must not shadow it.
    kernel.as_global_value().set_name("__tessera_emu_kernel");
    kernel.set_linkage(inkwell::module::Linkage::Internal);

    let ptr = ctx.ptr_type(AddressSpace::default());
    let entry = module.add_function(ENTRY, ctx.void_type().fn_type(&[ptr.into()], false), None);
    let b = ctx.create_builder();
    b.position_at_end(ctx.append_basic_block(entry, "entry"));
    let args = entry
        .get_nth_param(0)
        .ok_or_else(|| jit_err("entry without parameter".into()))?
        .into_pointer_value();
    let llvm = |e: inkwell::builder::BuilderError| jit_err(e.to_string());
    let mut vals: Vec<BasicMetadataValueEnum> = Vec::new();
    for (i, ty) in kernel.get_type().get_param_types().iter().enumerate() {
        let i = ctx.i64_type().const_int(i as u64, false);
        // SAFETY: the launcher passes one pointer per kernel parameter.
        let slot = unsafe { b.build_in_bounds_gep(ptr, args, &[i], "") }.map_err(llvm)?;
        let p = b
            .build_load(ptr, slot, "")
            .map_err(llvm)?
            .into_pointer_value();
        let ty = match ty {
            BasicMetadataTypeEnum::MetadataType(_) => {
                return Err(jit_err("metadata kernel parameter".into()));
            }
            t => inkwell::types::BasicTypeEnum::try_from(*t)
                .map_err(|_| jit_err("unexpected kernel parameter type".into()))?,
        };
        let v = b.build_load(ty, p, "").map_err(llvm)?;
        if let Some(inst) = inkwell::values::BasicValue::as_instruction_value(&v) {
            let _ = inst.set_alignment(1);
        }
        vals.push(v.into());
    }
    b.build_call(kernel, &vals, "").map_err(llvm)?;
    b.build_return(None).map_err(llvm)?;

    // Stack probes: a frame larger than a page touches every page it spans, so a
    // stack overflow hits the guard page instead of skipping it; and every frame's
    // size is reported (`warn-stack-size` 0 makes LLVM diagnose any frame), so the
    // launcher can size the threads' stacks.
    let mut f = module.get_first_function();
    while let Some(func) = f {
        if func.count_basic_blocks() > 0 {
            for (k, v) in [("probe-stack", "inline-asm"), ("warn-stack-size", "0")] {
                func.add_attribute(
                    inkwell::attributes::AttributeLoc::Function,
                    ctx.create_string_attribute(k, v),
                );
            }
        }
        f = func.get_next_function();
    }
    let frames = FrameSizes::install(ctx);
    let addr = jit_for_host(
        module,
        OptimizationLevel::Default,
        "default<O2>",
        dump_llvm,
        ENTRY,
    )
    .map_err(jit_err)?;
    let frame_bytes = frames.largest();
    // SAFETY: `addr` is the address of the JIT-compiled `void(ptr)` entry wrapper,
    // whose code is never freed.
    let entry: unsafe extern "C" fn(*const *const u8) = unsafe { std::mem::transmute(addr) };
    Ok(Compiled {
        entry,
        meta: lowered.meta,
        sites: lowered.sites,
        frame_bytes,
    })
}

/// Collects the frame sizes LLVM's code generator reports for the functions of one
/// context (the `warn-stack-size` diagnostics).
struct FrameSizes {
    sizes: &'static Mutex<Vec<u64>>,
}

impl FrameSizes {
    /// Installs the diagnostic handler on `ctx` (which lives for the process).
    fn install(ctx: &'static Context) -> FrameSizes {
        let sizes: &'static Mutex<Vec<u64>> = Box::leak(Box::new(Mutex::new(Vec::new())));
        extern "C" fn handler(
            info: inkwell::llvm_sys::prelude::LLVMDiagnosticInfoRef,
            data: *mut std::ffi::c_void,
        ) {
            // SAFETY: LLVM passes a valid diagnostic; its description is a C string
            // we own and free with `LLVMDisposeMessage`.
            let text = unsafe {
                let p = inkwell::llvm_sys::core::LLVMGetDiagInfoDescription(info);
                let s = std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned();
                inkwell::llvm_sys::core::LLVMDisposeMessage(p);
                s
            };
            if let Some(rest) = text.split("stack frame size (").nth(1)
                && let Some(n) = rest.split(')').next().and_then(|n| n.trim().parse().ok())
            {
                // SAFETY: `data` is the leaked `Mutex` installed with this handler.
                let sizes = unsafe { &*(data as *const Mutex<Vec<u64>>) };
                sizes.lock().unwrap_or_else(|p| p.into_inner()).push(n);
            }
        }
        // SAFETY: the handler and its data (leaked) live for the process, like the
        // context.
        unsafe {
            inkwell::llvm_sys::core::LLVMContextSetDiagnosticHandler(
                ctx.raw(),
                Some(handler),
                sizes as *const Mutex<Vec<u64>> as *mut std::ffi::c_void,
            )
        };
        FrameSizes { sizes }
    }

    fn largest(&self) -> u64 {
        let v = self.sizes.lock().unwrap_or_else(|p| p.into_inner());
        v.iter().copied().max().unwrap_or(0)
    }
}
