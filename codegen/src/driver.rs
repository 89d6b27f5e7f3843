//! The compile driver: a kernel lowered into a fresh LLVM context
//! ([`crate::lower`]), NVSHMEM's device library linked where the kernel reaches
//! other nodes through it ([`crate::nvshmem`]), then optimized and emitted
//! ([`crate::emit`]). The leaf steps know nothing of each other; this file orders
//! them.

use inkwell::context::Context;
use tessera_ir::Function;

use crate::emit::emit_module_with;
use crate::{Artifact, CodegenError, CompileOptions, Target};

/// Lowers, optimizes and emits `func` for `target`.
pub(crate) fn compile(
    func: &Function,
    target: Target,
    opts: &CompileOptions,
) -> Result<Artifact, CodegenError> {
    let ctx = Context::create();
    let (module, meta) = crate::lower::lower_kernel(&ctx, func, target, opts)?;
    if module.get_function(&meta.name).is_none() {
        return Err(CodegenError::Llvm {
            kernel: func.name.clone(),
            target,
            message: format!(
                "the lowered module has no entry point `{}` (the lowering produced no kernel)",
                meta.name
            ),
        });
    }
    let mut min_ptx = None;
    if opts.engine == crate::CommEngine::Nvshmem
        && func.uses_comm()
        && let Target::Nvptx { sm, .. } = target
    {
        crate::nvshmem::link(&module, sm, &meta.name)?;
        min_ptx = Some(crate::nvshmem::PTX_ISA);
    }
    let out = emit_module_with(&module, target, &func.name, min_ptx)?;
    Ok(Artifact {
        target,
        meta,
        binary: out.binary,
        asm: out.asm,
        llvm_ir: out.llvm_ir,
    })
}
