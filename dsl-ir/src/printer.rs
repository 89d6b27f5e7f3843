//! Placeholder (replaced by the printer).
use crate::ir::Function;
/// Prints a function.
pub fn print_function(f: &Function) -> String {
    format!("{f:#?}")
}
