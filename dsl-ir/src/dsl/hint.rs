//! Hints: promises about integer values that the compiler cannot prove (Triton's
//! `tl.multiple_of`, `tl.max_contiguous`, `tl.max_constancy`).
//!
//! Each returns its operand unchanged, with the promise attached ([`OpKind::Hint`]);
//! codegen's axis analysis uses it to choose wide (16-byte) loads and stores. A
//! promise that is false makes the accesses that rely on it read or write the wrong
//! elements, so only promise what holds for every launch. The interpreter (the CPU
//! device) ignores hints.
//!
//! ```text
//! // Tutorial-style row offsets wrapped with `% m`: each program's BM rows are
//! // consecutive and start at a multiple of BM, which `%` hides from the analysis.
//! let rm = ((program_id(0) * BM + arange::<BM>()) % m)
//!     .multiple_of(BM as u32)
//!     .max_contiguous(BM as u32);
//! ```

use crate::ir::Span;
use crate::ir::{HintKind, OpKind};

use super::{Int, Shape, Tile, emit1};

/// The values of a hint, one per dimension: a `u32` for a scalar or a 1-D tile, an
/// array `[u32; R]` for a tile of rank `R`.
pub trait HintValues {
    /// The values, in dimension order.
    fn values(self) -> Vec<u32>;
}

impl HintValues for u32 {
    fn values(self) -> Vec<u32> {
        vec![self]
    }
}

impl<const R: usize> HintValues for [u32; R] {
    fn values(self) -> Vec<u32> {
        self.to_vec()
    }
}

impl<T: Int, S: Shape> Tile<T, S> {
    fn hint(self, kind: HintKind, values: Vec<u32>, span: Span) -> Tile<T, S> {
        Tile::from_id(emit1(
            OpKind::Hint { kind, values },
            &[self.id()],
            None,
            Self::ir_type(),
            span,
        ))
    }

    /// Promises that along each dimension the first element of every run of
    /// consecutive values (every element, where there are none) is a multiple of the
    /// given value (Triton's `tl.multiple_of`).
    ///
    /// ```text
    /// let n = n.multiple_of(16); // a size the caller always pads to 16
    /// ```
    #[track_caller]
    pub fn multiple_of(self, values: impl HintValues) -> Tile<T, S> {
        self.hint(HintKind::MultipleOf, values.values(), Span::caller())
    }

    /// Promises that along each dimension the elements form runs of the given
    /// number of values increasing by one, starting at indices that are multiples
    /// of it (Triton's `tl.max_contiguous`).
    ///
    /// ```text
    /// let cols = (k0 + arange::<64>()).max_contiguous(64);
    /// ```
    #[track_caller]
    pub fn max_contiguous(self, values: impl HintValues) -> Tile<T, S> {
        self.hint(HintKind::MaxContiguous, values.values(), Span::caller())
    }

    /// Promises that along each dimension the elements form runs of the given
    /// number of equal values, starting at indices that are multiples of it
    /// (Triton's `tl.max_constancy`).
    ///
    /// ```text
    /// let row = (offs / 64).max_constancy(64);
    /// ```
    #[track_caller]
    pub fn max_constancy(self, values: impl HintValues) -> Tile<T, S> {
        self.hint(HintKind::MaxConstancy, values.values(), Span::caller())
    }
}
