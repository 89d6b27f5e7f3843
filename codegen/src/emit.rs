//! LLVM IR to PTX text or an HSACO code object. (Placeholder.)

use tessera_ir::Function;

use crate::{Artifact, CodegenError, CompileOptions, Target};

/// Lowers, optimizes and emits `func` for `target`.
pub fn compile(
    func: &Function,
    target: Target,
    opts: &CompileOptions,
) -> Result<Artifact, CodegenError> {
    let _ = (func, opts);
    Err(CodegenError::Tool {
        tool: "emit".into(),
        message: format!("emission for {target} is not implemented yet"),
    })
}
