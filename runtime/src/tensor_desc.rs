//! Host-side tensor descriptors: [`TensorDescriptor`], the argument of a kernel's
//! `&TensorDesc<T, S>` parameter.

use crate::buffer::{Buffer, Element};
use crate::error::Error;

/// A tensor in a [`Buffer`]: its extents and strides (in elements, outermost first,
/// the innermost stride 1) and the block shape the kernel reads and writes it in.
/// Passed to a kernel parameter `&TensorDesc<T, S>` (built with [`Self::new`]) or
/// `&mut TensorDesc<T, S>` (built with [`Self::new_mut`]); the launch checks the
/// block against the kernel's `S`. On sm_90a the launch also builds the tensor map
/// that TMA copies read (through the CUDA driver); elsewhere the kernel reads the
/// extents and strides directly.
///
/// ```
/// # use tessera::prelude::*;
/// # fn main() -> Result<(), tessera::Error> {
/// let dev = Device::cpu();
/// let a = dev.upload(&vec![1.0f32; 100 * 60])?;
/// // A 100 x 60 row-major matrix read in 64 x 32 blocks.
/// let d = tessera::TensorDescriptor::new(&a, &[100, 60], &[60, 1], &[64, 32])?;
/// assert_eq!(d.shape(), &[100, 60]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct TensorDescriptor<'a, T: Element> {
    pub(crate) buf: &'a Buffer<T>,
    shape: Vec<i32>,
    strides: Vec<i32>,
    block: Vec<u32>,
    writable: bool,
}

impl<'a, T: Element> TensorDescriptor<'a, T> {
    /// A descriptor of `buf` for loads: `shape` and `strides` (the last 1) of rank
    /// 1 to 3, every element inside the buffer and offsets within `i32`, `block` the
    /// kernel's block shape.
    pub fn new(
        buf: &'a Buffer<T>,
        shape: &[usize],
        strides: &[usize],
        block: &[usize],
    ) -> Result<Self, Error> {
        Self::build(buf, shape, strides, block, false)
    }

    /// A descriptor of `buf` for loads and stores (a `&mut TensorDesc` parameter).
    pub fn new_mut(
        buf: &'a mut Buffer<T>,
        shape: &[usize],
        strides: &[usize],
        block: &[usize],
    ) -> Result<Self, Error> {
        Self::build(buf, shape, strides, block, true)
    }

    fn build(
        buf: &'a Buffer<T>,
        shape: &[usize],
        strides: &[usize],
        block: &[usize],
        writable: bool,
    ) -> Result<Self, Error> {
        let bad = |m: String| Err(Error::Descriptor(m));
        let r = shape.len();
        if !(1..=3).contains(&r) || strides.len() != r || block.len() != r {
            return bad(format!(
                "shape {shape:?}, strides {strides:?} and block {block:?} must have one rank of 1 to 3"
            ));
        }
        if strides[r - 1] != 1 {
            return bad(format!(
                "the innermost stride must be 1 (strides {strides:?}): copy the tensor, or describe its transpose"
            ));
        }
        if let Some(&b) = block.iter().find(|&&b| b == 0 || !b.is_power_of_two()) {
            return bad(format!(
                "block {block:?}: dimension {b} is not a power of two"
            ));
        }
        if shape.contains(&0) {
            return bad(format!("shape {shape:?} has an empty dimension"));
        }
        let fits = |v: usize| i32::try_from(v).is_ok();
        let last = shape.iter().zip(strides).try_fold(0usize, |acc, (&n, &s)| {
            acc.checked_add((n - 1).checked_mul(s)?)
        });
        match last {
            Some(l) if fits(l) && shape.iter().chain(strides).all(|&v| fits(v)) => {
                if l >= buf.len() {
                    return bad(format!(
                        "shape {shape:?} with strides {strides:?} reaches element {l}, past the buffer's {}",
                        buf.len()
                    ));
                }
            }
            _ => {
                return bad(format!(
                    "shape {shape:?} with strides {strides:?}: offsets past i32"
                ));
            }
        }
        Ok(TensorDescriptor {
            buf,
            shape: shape.iter().map(|&v| v as i32).collect(),
            strides: strides.iter().map(|&v| v as i32).collect(),
            block: block.iter().map(|&v| v as u32).collect(),
            writable,
        })
    }

    /// The extents, outermost first.
    pub fn shape(&self) -> &[i32] {
        &self.shape
    }

    /// The strides in elements, outermost first (the last is 1).
    pub fn strides(&self) -> &[i32] {
        &self.strides
    }

    /// The block shape.
    pub fn block(&self) -> &[u32] {
        &self.block
    }

    /// Whether the descriptor may be stored through ([`Self::new_mut`]).
    pub fn writable(&self) -> bool {
        self.writable
    }
}
