//! Tensor descriptors in kernels: [`TensorDesc`].

use std::marker::PhantomData;

use super::{DType, KernelParams, Operand, Scalar, Shape, Tile, emit0, emit1, with_builder};
use crate::ir::{OpKind, ParamAttrs, Span, ValueId};
use crate::types::{ScalarType, Type};

/// A kernel parameter describing a tensor in global memory (its base, extents and
/// strides, built on the host as `tessera::TensorDesc`) that the kernel reads and
/// writes in blocks of shape `S`: `desc.load([i, j])` is the block whose first element
/// is `(i, j)`, with elements outside the tensor read as zero; `desc.store([i, j],
/// block)` writes the block's elements that lie inside the tensor. Kernel signatures
/// take `&TensorDesc<T, S>` (loads) or `&mut TensorDesc<T, S>` (loads and stores).
///
/// On sm_90a the loads that feed `dot`s become TMA copies (`cp.async.bulk.tensor`
/// through a tensor map the launch builds) completing on mbarriers, pipelined
/// `num_stages` deep, and stores are TMA stores; every other access (other targets,
/// the CPU, loads that do not feed a `dot`) is the masked load or store with the same
/// semantics (see `tessera_ir::tensor_desc`). The innermost stride is 1; extents, strides and
/// coordinates are `i32`.
pub struct TensorDesc<T: DType, S: Shape> {
    base: ValueId,
    tmap: ValueId,
    shape: Vec<ValueId>,
    strides: Vec<ValueId>,
    _t: PhantomData<fn() -> (T, S)>,
}

impl<T: DType, S: Shape> std::fmt::Debug for TensorDesc<T, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorDesc<{}, {:?}>({})", T::TY, S::dims(), self.base)
    }
}

impl KernelParams {
    /// A tensor-descriptor parameter: the kernel parameters `name` (the base
    /// pointer), `name_tmap` (`u64`, the tensor map's address where TMA is used),
    /// `name_shape{d}` and `name_stride{d}` (`i32`; the innermost stride is 1).
    pub fn tensor_desc<T: DType, S: Shape>(
        &mut self,
        name: &str,
        readonly: bool,
    ) -> TensorDesc<T, S> {
        let base = self.buffer::<T>(name, readonly).id();
        let scalar = |n: String, t: ScalarType| {
            with_builder(|b| b.param(&n, Type::scalar(t), ParamAttrs::default()))
        };
        let tmap = scalar(format!("{name}_tmap"), ScalarType::U64);
        let shape = (0..S::RANK)
            .map(|d| scalar(format!("{name}_shape{d}"), ScalarType::I32))
            .collect();
        let strides = (0..S::RANK.saturating_sub(1))
            .map(|d| scalar(format!("{name}_stride{d}"), ScalarType::I32))
            .collect();
        TensorDesc {
            base,
            tmap,
            shape,
            strides,
            _t: PhantomData,
        }
    }
}

/// Block coordinates of a rank-`S::RANK` descriptor: an array of `i32` operands
/// (`[i, j]`), or a tuple when they mix tiles and Rust integers (`(pid * 64, 0)`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as the block coordinates of a descriptor with blocks of shape `{S}`",
    label = "give one `i32` scalar (or Rust integer) per dimension of the block: `[i, j]` or `(i, 0)`"
)]
pub trait Coords<S: Shape> {
    /// The coordinates' IR values, outermost first.
    fn values(self, span: &Span) -> Vec<ValueId>;
}

impl<A: super::Dim, X: Operand<i32, Shape = ()>> Coords<(A,)> for [X; 1] {
    fn values(self, span: &Span) -> Vec<ValueId> {
        self.into_iter().map(|x| x.value(span)).collect()
    }
}
impl<A: super::Dim, B: super::Dim, X: Operand<i32, Shape = ()>> Coords<(A, B)> for [X; 2] {
    fn values(self, span: &Span) -> Vec<ValueId> {
        self.into_iter().map(|x| x.value(span)).collect()
    }
}
impl<A: super::Dim, B: super::Dim, C: super::Dim, X: Operand<i32, Shape = ()>> Coords<(A, B, C)>
    for [X; 3]
{
    fn values(self, span: &Span) -> Vec<ValueId> {
        self.into_iter().map(|x| x.value(span)).collect()
    }
}
impl<A: super::Dim, X: Operand<i32, Shape = ()>> Coords<(A,)> for (X,) {
    fn values(self, span: &Span) -> Vec<ValueId> {
        vec![self.0.value(span)]
    }
}
impl<A: super::Dim, B: super::Dim, X: Operand<i32, Shape = ()>, Y: Operand<i32, Shape = ()>>
    Coords<(A, B)> for (X, Y)
{
    fn values(self, span: &Span) -> Vec<ValueId> {
        vec![self.0.value(span), self.1.value(span)]
    }
}
impl<
    A: super::Dim,
    B: super::Dim,
    C: super::Dim,
    X: Operand<i32, Shape = ()>,
    Y: Operand<i32, Shape = ()>,
    Z: Operand<i32, Shape = ()>,
> Coords<(A, B, C)> for (X, Y, Z)
{
    fn values(self, span: &Span) -> Vec<ValueId> {
        vec![self.0.value(span), self.1.value(span), self.2.value(span)]
    }
}

impl<T: DType, S: Shape> TensorDesc<T, S> {
    fn operands(&self, coords: Vec<ValueId>) -> Vec<ValueId> {
        let mut v = vec![self.base, self.tmap];
        v.extend(&self.shape);
        v.extend(&self.strides);
        v.extend(coords);
        v
    }

    /// The block whose first element is at `coords`; elements outside the tensor
    /// read as zero (and are not accessed).
    #[track_caller]
    pub fn load<C: Coords<S>>(&self, coords: C) -> Tile<T, S> {
        let span = Span::caller();
        let ops = self.operands(coords.values(&span));
        let ty = Tile::<T, S>::ir_type();
        Tile::from_id(emit1(
            OpKind::DescLoad {
                rank: S::RANK as u8,
                has_pred: false,
            },
            &ops,
            Some(&ty),
            ty.clone(),
            span,
        ))
    }

    /// Writes `block` at `coords`; its elements outside the tensor are not written.
    #[track_caller]
    pub fn store<C: Coords<S>>(&mut self, coords: C, block: Tile<T, S>) {
        let span = Span::caller();
        let mut ops = self.operands(coords.values(&span));
        ops.push(block.id());
        emit0(
            OpKind::DescStore {
                rank: S::RANK as u8,
            },
            &ops,
            span,
        );
    }

    /// Extent `d` of the tensor (outermost first).
    #[track_caller]
    pub fn extent(&self, d: usize) -> Scalar<i32> {
        match self.shape.get(d) {
            Some(&v) => Tile::from_id(v),
            None => {
                let span = Span::caller();
                super::record_error(crate::BuildError::new(
                    span.clone(),
                    format!("extent {d} of a rank-{} descriptor", S::RANK),
                ));
                super::literal_tile::<i32>(super::LitValue::Int(0), span)
            }
        }
    }
}
