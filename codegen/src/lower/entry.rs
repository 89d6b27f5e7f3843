//! The SIMT lowering's entry points: options checked, the kernel pipelined and its
//! tensor-descriptor accesses expanded (or kept for TMA), then lowered, with fewer
//! stages or on f16 where the first form does not fit the target.

use std::cell::RefCell;
use std::collections::HashMap;

use inkwell::context::Context;
use inkwell::module::Module;
use tessera_ir::ir::Op;
use tessera_ir::{Function, ScalarType};

use super::arch::{self, Arch};
use super::{Cx, LowerError, Lowerer, Site, engine, kernel_symbol, tma};
use crate::{CodegenError, CompileOptions, KernelMeta, Target};

/// The result of [`lower_with_sites`].
pub struct Lowered<'ctx> {
    /// The module holding the kernel.
    pub module: Module<'ctx>,
    /// Launch facts.
    pub meta: KernelMeta,
    /// The site table: site id → op.
    pub sites: Vec<Site>,
    /// With [`lower_with_layouts`]: the lowered IR (after [`crate::pipeline`]) with
    /// each op's result layouts and layout conversions as comments.
    pub layouts: Option<String>,
}

/// Lowers `func` for `target` like [`lower_kernel`] and returns the IR it lowered
/// (after [`crate::pipeline`]) annotated, before each op, with the layout of each
/// result and every layout change the op needed: register renamings, values
/// recomputed in another layout, conversions through shared memory, operands kept in
/// a `dot`'s shared arrays, and the matrix instruction and arrays of each `dot`.
/// What `TESSERA_DUMP=layout` writes.
pub fn lower_with_layouts(
    func: &Function,
    target: Target,
    opts: &CompileOptions,
) -> Result<String, CodegenError> {
    let ctx = Context::create();
    let arch = arch::for_target(target);
    let l = lower_impl(&ctx, func, arch.as_ref(), opts, true)?;
    Ok(l.layouts.unwrap_or_default())
}

/// Lowers `func` into a new LLVM module for `target`: one kernel entry point named
/// like the function, taking its parameters in order (pointers as global-address-space
/// pointers, scalars by value), run by `opts.num_warps * warp_size` threads per block.
pub fn lower_kernel<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    target: Target,
    opts: &CompileOptions,
) -> Result<(Module<'ctx>, KernelMeta), CodegenError> {
    if !opts.num_warps.is_power_of_two() || opts.num_warps > 16 {
        return Err(CodegenError::Options(format!(
            "num_warps must be a power of two from 1 to 16, got {}",
            opts.num_warps
        )));
    }
    if opts.num_stages.is_some_and(|s| !(1..=8).contains(&s)) {
        return Err(CodegenError::Options(format!(
            "num_stages must be from 1 to 8, got {:?}",
            opts.num_stages
        )));
    }
    // (A grid of one cluster: the shape alone.)
    tessera_ir::cluster::check(opts.cluster, opts.cluster).map_err(CodegenError::Options)?;
    if let Some(g) = opts.consumer_groups
        && !(1..=2).contains(&g)
    {
        return Err(CodegenError::Options(format!(
            "consumer_groups must be 1 or 2, got {g}"
        )));
    }
    let arch = arch::for_target(target);
    lower_with_arch(ctx, func, arch.as_ref(), opts)
}

/// [`lower_kernel`] with an explicit [`Arch`] (the emulator plugs in here).
pub fn lower_with_arch<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    arch: &dyn Arch,
    opts: &CompileOptions,
) -> Result<(Module<'ctx>, KernelMeta), CodegenError> {
    let l = lower_with_sites(ctx, func, arch, opts)?;
    Ok((l.module, l.meta))
}

/// [`lower_with_arch`], also returning the site table the [`Arch`] hooks were given.
pub fn lower_with_sites<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    arch: &dyn Arch,
    opts: &CompileOptions,
) -> Result<Lowered<'ctx>, CodegenError> {
    lower_impl(ctx, func, arch, opts, false)
}

pub(super) fn lower_impl<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    arch: &dyn Arch,
    opts: &CompileOptions,
    with_layouts: bool,
) -> Result<Lowered<'ctx>, CodegenError> {
    if func.uses_comm() {
        engine::check(arch.target(), opts.engine)?;
    }
    // `dot_scaled`: on the target's block-scaled instructions where it has them for
    // the op's format and shape (gfx950's MXFP8); else decoded and scaled to f32,
    // then an f32 `dot` (its definition).
    if has_scaled_mma(arch)
        && let Some(g) = super::dot::with_native_scales(func)
        && let Ok(l) = lower_as_is(ctx, &g, arch, opts, with_layouts)
    {
        return Ok(l);
    }
    let expanded = tessera_ir::passes::expand_dot_scaled(func).map_err(|message| {
        CodegenError::Unsupported {
            kernel: func.name.clone(),
            target: arch.target(),
            span: func.span.clone(),
            message,
        }
    })?;
    if let Some(g) = expanded {
        return lower_impl(ctx, &g, arch, opts, with_layouts);
    }
    // `dot`s of 8-bit floats: on `wgmma` or `mma.sync` m16n8k32 (sm_89's instruction,
    // or its fragments converted to f16 in registers on sm_80, sm_86 and sm_90) as they
    // are where they can be (else the whole kernel again with them on f16), elsewhere
    // on f16 (`crate::fp8`).
    if crate::fp8::has_fp8_dot(func) {
        if (arch.target().has_wgmma() || arch.mma(ScalarType::F8E4M3).is_some())
            && let Ok(l) = lower_as_is(ctx, func, arch, opts, with_layouts)
        {
            return Ok(l);
        }
        if let Some(up) = crate::fp8::upcast_dots(func) {
            return lower_as_is(ctx, &up, arch, opts, with_layouts);
        }
    }
    lower_as_is(ctx, func, arch, opts, with_layouts)
}

/// Whether `arch` has a block-scaled matrix instruction at all
/// ([`Arch::scaled_mma_for`] on a tile every one of them fits).
fn has_scaled_mma(arch: &dyn Arch) -> bool {
    arch.scaled_mma_for(ScalarType::F8E4M3, 128, 128, 128, 4)
        .is_some()
}

/// [`lower_impl`] with the `dot`s as they are.
fn lower_as_is<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    arch: &dyn Arch,
    opts: &CompileOptions,
    with_layouts: bool,
) -> Result<Lowered<'ctx>, CodegenError> {
    let stages = opts
        .num_stages
        .unwrap_or_else(|| arch.default_num_stages())
        .clamp(1, 8);
    let (l, rings) = match lower_staged(ctx, func, arch, opts, with_layouts, stages) {
        Ok(x) => x,
        // By default, a kernel whose pipelined form the target cannot hold (its
        // operand tiles in flight exceed the shared memory) takes fewer stages, down
        // to none; the first error stands if every count fails, or if the user chose
        // the stages.
        Err(e @ CodegenError::Unsupported { .. }) if opts.num_stages.is_none() && stages > 1 => {
            let fewer = [2, 1].into_iter().filter(|&s| s < stages);
            for s in fewer {
                if let Ok((l, _)) = lower_staged(ctx, func, arch, opts, with_layouts, s) {
                    return Ok(l);
                }
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    // By default, more than 2 stages are for `cp.async` rings: where no loop got one
    // (unknown alignment, no `cp.async`), register prefetch keeps one tile in flight
    // (a deeper one would hold every further tile in registers).
    if opts.num_stages.is_none() && stages > 2 && !rings {
        return Ok(lower_staged(ctx, func, arch, opts, with_layouts, 2)?.0);
    }
    Ok(l)
}

/// [`lower_impl`] with `stages`; also whether a loop got a `cp.async` ring.
///
/// Tensor-descriptor accesses become masked memory ops
/// ([`tessera_ir::tensor_desc::expand`]) except the accesses [`tma::tma_candidate`]
/// keeps for TMA; when one of those does not end up in a `dot`'s ring, the kernel is
/// lowered again with every access expanded.
fn lower_staged<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    arch: &dyn Arch,
    opts: &CompileOptions,
    with_layouts: bool,
    stages: u32,
) -> Result<(Lowered<'ctx>, bool), CodegenError> {
    let target = arch.target();
    let mut expanded = func.clone();
    let keep = |f: &Function, op: &Op| tma::tma_candidate(target, f, op, stages);
    tessera_ir::tensor_desc::expand(&mut expanded, &keep);
    let kept = tessera_ir::tensor_desc::count(&expanded);
    match lower_expanded(ctx, &expanded, arch, opts, with_layouts, stages) {
        Err(_) if kept > 0 => {
            let mut all = func.clone();
            tessera_ir::tensor_desc::expand(&mut all, &|_, _| false);
            lower_expanded(ctx, &all, arch, opts, with_layouts, stages)
        }
        r => r,
    }
}

/// [`lower_staged`] of a kernel whose descriptor accesses are expanded or TMA loads:
/// with double-buffered loop `dot`s (`plan::Plan::double`), or, when that runs out
/// of shared memory (or fails otherwise), without.
fn lower_expanded<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    arch: &dyn Arch,
    opts: &CompileOptions,
    with_layouts: bool,
    stages: u32,
) -> Result<(Lowered<'ctx>, bool), CodegenError> {
    match lower_buffered(ctx, func, arch, opts, with_layouts, stages, true) {
        Ok(l) => Ok(l),
        Err(CodegenError::Unsupported { .. }) | Err(CodegenError::Llvm { .. }) => {
            lower_buffered(ctx, func, arch, opts, with_layouts, stages, false)
        }
        Err(e) => Err(e),
    }
}

/// [`lower_expanded`] with or without double-buffered loop `dot`s.
fn lower_buffered<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    arch: &dyn Arch,
    opts: &CompileOptions,
    with_layouts: bool,
    stages: u32,
    double_buffer: bool,
) -> Result<(Lowered<'ctx>, bool), CodegenError> {
    let target = arch.target();
    // Only loads feeding `dot`s on the matrix units: their loop keeps the tile in the
    // `dot`'s shared arrays (`plan::staging`), not in registers.
    let nw = opts.num_warps;
    let matrix_dot = |f: &Function, d: &Op| {
        let (a, b) = (f.ty(d.operands[0]), f.ty(d.operands[1]));
        let (Some(s), [m, k], [_, n]) = (a.scalar_type(), &a.shape[..], &b.shape[..]) else {
            return false;
        };
        // (8-bit floats: on `wgmma`, and on `mma.sync` where `mma_for` has them, see
        // `crate::fp8`.)
        (s.is_fp8() && target.has_wgmma())
            || arch
                .mma_for(s, *m, *n, *k, nw)
                .is_some_and(|i| m % i.m == 0 && n % i.n == 0 && k % i.k == 0)
    };
    let pipelined = crate::pipeline::pipeline_loads(func, stages, &matrix_dot);
    let func = &pipelined;
    let err = |e: LowerError| match e {
        LowerError::Unsupported { span, message } => CodegenError::Unsupported {
            kernel: func.name.clone(),
            target,
            span,
            message,
        },
        LowerError::Llvm(message) => CodegenError::Llvm {
            kernel: func.name.clone(),
            target,
            message,
        },
    };
    let module = ctx.create_module(&func.name);
    if !target.triple().is_empty() {
        module.set_triple(&inkwell::targets::TargetTriple::create(target.triple()));
    }
    let cx = Cx {
        ctx,
        module,
        b: ctx.create_builder(),
        host: matches!(target, crate::target::Target::Emu(_)),
    };
    let mut l = Lowerer::new(cx, arch, func, opts.num_warps).map_err(err)?;
    l.double_buffer = double_buffer;
    l.engine = opts.engine;
    l.warp_specialize = opts.warp_specialize;
    l.consumer_groups = opts.consumer_groups;
    if target.has_wgmma() {
        l.cluster = opts.cluster;
    }
    if with_layouts {
        l.notes = Some(RefCell::new(HashMap::new()));
    }
    l.run().map_err(err)?;
    let shared_bytes = l.finish_shared().map_err(err)?;
    let num_threads = l.block_threads();
    let layouts = l.notes.take().map(|n| {
        let n = n.into_inner();
        tessera_ir::printer::print_function_with_notes(func, &|op| {
            n.get(&(op as *const Op)).cloned().unwrap_or_default()
        })
    });
    let meta = KernelMeta {
        name: kernel_symbol(&func.name),
        num_threads,
        shared_bytes,
    };
    let rings = !l.plan.async_dots.is_empty();
    Ok((
        Lowered {
            sites: l.sites.into_inner(),
            module: l.cx.module,
            meta,
            layouts,
        },
        rings,
    ))
}
