//! # tessera-macros
//!
//! `#[kernel]` turns a Rust function into a Tessera kernel: a (field-less) struct of the same
//! name (generic like the function) implementing `tessera::Kernel`, whose `build`
//! traces the body into tile IR, and whose `launch` takes the arguments as a typed
//! tuple. `#[helper]` marks a function called from kernels (inlined by tracing) so
//! that its control flow is rewritten the same way.
//!
//! Use these through the `tessera` crate (`tessera::prelude::*`); the generated code
//! names `::tessera`.

#![warn(missing_docs)]

use proc_macro::TokenStream;

mod body;
mod kernel;

/// Defines a kernel. Parameters: `&Global<T>` (read-only buffer), `&mut Global<T>`
/// (written buffer), `name: T` for a runtime scalar of element type `T`, and
/// `#[comptime] name: T` for a comptime value (any `Clone + Debug` type), passed at
/// launch and part of the kernel's cache key. Const generics and type parameters are
/// comptime too.
///
/// GPU launches specialize the kernel on its arguments as Triton does: aligned
/// buffers, integers that are multiples of 16, and integers equal to 1 (so a unit
/// stride is a constant and loads through it can be vectorized). Each combination
/// compiles once; `#[no_specialize] name: i32` opts a scalar out (one kernel for
/// every value).
///
/// ```text
/// #[kernel]
/// fn add<const BLOCK: usize>(x: &Global<f32>, y: &Global<f32>, out: &mut Global<f32>, n: i32) {
///     let offs = program_id(0) * BLOCK + arange::<BLOCK>();
///     let mask = offs.lt(n);
///     out.store(offs, x.load(offs, mask) + y.load(offs, mask), mask);
/// }
/// add::<1024>::launch(&dev, n.div_ceil(1024), (&x, &y, &mut out, n))?;
/// ```
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    kernel::expand_kernel(attr.into(), item.into()).into()
}

/// Marks a function called from kernels: its `if`/`for`/`while` are rewritten like a
/// kernel's, and const generics used as tile dimensions get their power-of-two bound.
#[proc_macro_attribute]
pub fn helper(attr: TokenStream, item: TokenStream) -> TokenStream {
    kernel::expand_helper(attr.into(), item.into()).into()
}
