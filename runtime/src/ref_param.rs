//! Kernel parameters behind a reference whose type `#[kernel]` cannot read by name:
//! a type alias (`type Buf = Global<f32>; fn k(x: &Buf)`). The macro recognizes
//! `&Global<T>`, `&Symmetric<T>` and `&TensorDesc<T, S>` as written; any other
//! `&X`/`&mut X` goes through [`RefParam`], which the kernel-side types implement.

use tessera_ir::dsl::{Global, KernelParams, Shape, Symmetric, TensorDesc};

use crate::launch::LaunchArg;
use crate::{Buffer, Element, SymBuffer, TensorDescriptor};

/// A type a kernel takes by reference (`&X` read-only, `&mut X` written): a buffer,
/// a symmetric buffer or a tensor descriptor, however it is spelled. Used by the code
/// `#[kernel]` generates; not a public API.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a kernel parameter behind a reference",
    label = "references are only allowed to buffers (`&Global<T>`, `&mut Global<T>`, `&Symmetric<T>`, `&mut Symmetric<T>`) and tensor descriptors (`&TensorDesc<T, S>`, `&mut TensorDesc<T, S>`), or type aliases of them",
    note = "runtime scalars are taken by value (`n: i32`), comptime values with `#[comptime] name: T`"
)]
pub trait RefParam: Sized {
    /// What the host passes at launch: `Buffer<T>`, `SymBuffer<T>` or
    /// `TensorDescriptor<'a, T>`.
    type Host<'a>;

    /// Declares the parameter `name` of the kernel being traced.
    fn declare(params: &mut KernelParams, name: &str, readonly: bool) -> Self;

    /// The launch argument for a read-only parameter.
    fn arg<'a>(host: &'a Self::Host<'_>) -> LaunchArg<'a>;

    /// The launch argument for a written parameter.
    fn arg_mut<'a>(host: &'a mut Self::Host<'_>) -> LaunchArg<'a>;
}

impl<T: Element> RefParam for Global<T> {
    type Host<'a> = Buffer<T>;

    fn declare(params: &mut KernelParams, name: &str, readonly: bool) -> Self {
        params.buffer::<T>(name, readonly)
    }

    fn arg<'a>(host: &'a Buffer<T>) -> LaunchArg<'a> {
        LaunchArg::buffer(host)
    }

    fn arg_mut<'a>(host: &'a mut Buffer<T>) -> LaunchArg<'a> {
        LaunchArg::buffer_mut(host)
    }
}

impl<T: Element> RefParam for Symmetric<T> {
    type Host<'a> = SymBuffer<T>;

    fn declare(params: &mut KernelParams, name: &str, readonly: bool) -> Self {
        params.symmetric::<T>(name, readonly)
    }

    fn arg<'a>(host: &'a SymBuffer<T>) -> LaunchArg<'a> {
        LaunchArg::symmetric(host)
    }

    fn arg_mut<'a>(host: &'a mut SymBuffer<T>) -> LaunchArg<'a> {
        LaunchArg::symmetric_mut(host)
    }
}

impl<T: Element, S: Shape> RefParam for TensorDesc<T, S> {
    type Host<'a> = TensorDescriptor<'a, T>;

    fn declare(params: &mut KernelParams, name: &str, readonly: bool) -> Self {
        params.tensor_desc::<T, S>(name, readonly)
    }

    fn arg<'a>(host: &'a TensorDescriptor<'_, T>) -> LaunchArg<'a> {
        LaunchArg::desc(host, &S::dims())
    }

    fn arg_mut<'a>(host: &'a mut TensorDescriptor<'_, T>) -> LaunchArg<'a> {
        LaunchArg::desc_mut(host, &S::dims())
    }
}
