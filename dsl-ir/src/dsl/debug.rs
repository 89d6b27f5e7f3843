//! Device printing and assertions ([`device_print`], [`device_assert`]): reported on
//! the host after the launch, with the program id, the element's index and the
//! caller's file:line, on the CPU, the emulators and GPUs alike.

use super::{DType, Shape, Tile, emit0};
use crate::ir::{OpKind, Span, ValueId};

/// What [`device_print`] accepts: one tile or scalar, a tuple of up to eight of them
/// (tiles of one shape, scalars mixed in), or `()` for the prefix alone.
pub trait PrintArgs {
    /// The IR values, in order.
    fn values(self) -> Vec<ValueId>;
}

impl<T: DType, S: Shape> PrintArgs for Tile<T, S> {
    fn values(self) -> Vec<ValueId> {
        vec![self.id()]
    }
}

impl PrintArgs for () {
    fn values(self) -> Vec<ValueId> {
        Vec::new()
    }
}

macro_rules! print_tuple {
    ($($a:ident),+) => {
        impl<$($a: PrintArgs),+> PrintArgs for ($($a,)+) {
            #[allow(non_snake_case)]
            fn values(self) -> Vec<ValueId> {
                let ($($a,)+) = self;
                let mut v = Vec::new();
                $(v.extend($a.values());)+
                v
            }
        }
    };
}
print_tuple!(A);
print_tuple!(A, B);
print_tuple!(A, B, C);
print_tuple!(A, B, C, D);
print_tuple!(A, B, C, D, E);
print_tuple!(A, B, C, D, E, F);
print_tuple!(A, B, C, D, E, F, G);
print_tuple!(A, B, C, D, E, F, G, H);

/// Prints `values` on the host after the launch: one line per element of the tiles
/// (one line when all are scalars), each
/// `file:line: pid (x, y, z) idx (i, j) prefix v0, v1, ...`, in the order the
/// programs reached the print (a program's lines in its own order, programs
/// interleaved as GPU `printf` output is). Floats print as Rust's `{:?}`
/// (`1.0`, `NaN`), integers in decimal, booleans as `true`/`false`. Lines go to
/// standard output, or to `tessera::debug::capture_output` in tests.
///
/// Every program instance that runs the call prints: guard it with a runtime `if` on
/// `program_id` to see one. Output that does not fit the launch's buffer (a few MiB)
/// is dropped and counted in a last line. Tiles in one call must have one shape.
///
/// ```text
/// let offs = program_id(0) * 8 + arange::<8>();
/// let x = input.load(offs, offs < n);
/// device_print("x =", (offs, x));   // ...: pid (0, 0, 0) idx (3) x = 3, 0.25
/// ```
#[track_caller]
pub fn device_print(prefix: &str, values: impl PrintArgs) {
    let v = values.values();
    emit0(
        OpKind::Print {
            prefix: prefix.to_string(),
        },
        &v,
        Span::caller(),
    );
}

/// Checks `cond` on every element: when one is false, the launch returns an error
/// after the kernel completes, naming this call's file:line:col, `message`, the
/// first program that failed (in the order they reported), its first failing
/// element, how many of its elements failed, and how many other failure records
/// the launch wrote. The program does not stop at a failed assertion (guard what
/// must not run). Costs a reduction and a branch per call when nothing fails.
///
/// ```text
/// device_assert(offs < n, "offset out of range");
/// ```
#[track_caller]
pub fn device_assert<S: Shape>(cond: Tile<bool, S>, message: &str) {
    emit0(
        OpKind::Assert {
            message: message.to_string(),
        },
        &[cond.id()],
        Span::caller(),
    );
}
