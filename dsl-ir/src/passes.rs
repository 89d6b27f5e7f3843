//! Placeholder (replaced by the passes).
use crate::ir::Function;
/// Runs all passes.
pub fn optimize(f: &mut Function) {
    let _ = f;
}
