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
/// comptime too. Buffer and descriptor types may be spelled through type aliases
/// (`type Buf = Global<f32>; fn k(x: &Buf)`); a generic element type needs only
/// `T: DType` (the launch asks `T: Element`); a const generic is read as the constant
/// in generic arguments even when named like a prelude type (`const D: usize`,
/// `arange::<D>()`); `-> ()` is allowed, any other return type is not.
///
/// GPU launches specialize the kernel on its arguments as Triton does: aligned
/// buffers, integers that are multiples of 16, and integers equal to 1 (so a unit
/// stride is a constant and loads through it can be vectorized). Each combination
/// compiles once; `#[no_specialize] name: i32` opts a scalar out (one kernel for
/// every value).
///
/// The body is ordinary Rust run once while the kernel is built ("traced"). `if`,
/// `while` and `for` over ranges are rewritten: a `bool` condition or integer bounds
/// are comptime (the taken branch runs, the loop is unrolled), a `Scalar<bool>`
/// condition or a `Scalar<i32>` bound is runtime (both branches and the loop body are
/// traced once, into IR). Variables declared outside a construct and assigned inside
/// it (`x = ..`, `x += ..`, `x.f = ..`, `x[i] = ..`) are passed through it; at runtime
/// only tiles can be. Limits, each a build error rather than wrong code:
///
/// - a `panic!`/`assert!` fails the build (naming the kernel and line), also inside
///   a runtime branch never taken at run time (it is traced anyway): check run-time
///   conditions with `device_assert`;
/// - comptime loops stop after 2^20 iterations and `#[helper]` calls nest at most 256
///   deep (a recursion that never reaches its comptime base case);
/// - a change the macro cannot pass through a runtime construct (`v.push(..)`,
///   `x.add_assign(..)` and other in-place methods of std types, `*r = ..`) is
///   rejected when that construct is traced. Not detected: a variable changed through
///   a `&mut` passed to a function (`f(&mut count)`), or by a method outside that list;
///   keep comptime bookkeeping out of runtime constructs;
/// - macro arguments are plain Rust: `return`, `break`, `continue`, `?`, `loop`,
///   `match`, `while`, `for` and assignments there are compile errors.
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
