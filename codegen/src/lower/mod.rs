//! Tile IR to SIMT LLVM IR. (Placeholder: emits the kernel signature and an empty
//! body; the lowering replaces it.)

use inkwell::context::Context;
use inkwell::module::Module;
use tessera_ir::Function;

use crate::{CodegenError, CompileOptions, KernelMeta, Target};

/// Lowers `func` into a new LLVM module for `target`: one kernel entry point named
/// like the function, taking its parameters in order (pointers as global-address-space
/// pointers, scalars by value), run by `opts.num_warps * warp_size` threads per block.
pub fn lower_kernel<'ctx>(
    ctx: &'ctx Context,
    func: &Function,
    target: Target,
    opts: &CompileOptions,
) -> Result<(Module<'ctx>, KernelMeta), CodegenError> {
    let module = ctx.create_module(&func.name);
    let meta = KernelMeta {
        name: func.name.clone(),
        num_threads: opts.num_warps * target.warp_size(),
        shared_bytes: 0,
    };
    Ok((module, meta))
}
