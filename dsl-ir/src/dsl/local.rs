//! Block-local memory ([`Local`]): an array in GPU shared memory (LDS on AMD) that the
//! threads of one program instance share, allocated in the kernel.

use std::marker::PhantomData;

use super::ops::{Offsets, Operand, StoreValue};
use super::{BroadcastTo, DType, Global, Tile, emit1, record_error, with_builder};
use crate::builder::BuildError;
use crate::ir::{AtomicOp, MemOrder, MemScope, OpKind, Span};
use crate::types::{AddrSpace, Elem, Type};

/// `N` elements of `T` in block-local memory: one array per program instance for the
/// whole kernel (GPU shared memory, AMD LDS), which every thread of the program reads
/// and writes. Its contents start undefined (the CPU interpreter fills them with
/// all-ones bytes, so a read before any write gives NaN or -1).
///
/// The threads of a program are not in lockstep: between a store by some threads and
/// a load of the same elements by others, call [`barrier`](super::barrier) (the
/// emulator reports the missing barrier as a race, with both lines). Atomics on it
/// have block scope and need no barrier between each other. On the CPU each program
/// instance is one thread, so its array behaves as plain memory. Indices are checked:
/// outside `0..N` is an error naming the line on the CPU; the emulator checks the
/// block's shared memory as a whole.
///
/// Create it at the top level of the kernel body (not inside `for`/`if`/`while`).
///
/// ```text
/// // A block histogram: every thread adds its elements' bins, then one copy out.
/// let mut hist = Local::<i32, 256>::new();
/// let bins = arange::<256>();
/// hist.store_unmasked(bins, 0);
/// barrier();
/// hist.atomic_add(x.load(offs, m), 1, m);
/// barrier();
/// out.store_unmasked(program_id(0) * 256 + bins, hist.load_unmasked(bins));
/// ```
pub struct Local<T: DType, const N: usize> {
    mem: Global<T>,
    _t: PhantomData<fn() -> T>,
}

impl<T: DType, const N: usize> Local<T, N> {
    /// Allocates the array (`local_alloc N`).
    #[track_caller]
    pub fn new() -> Local<T, N> {
        let ty = Type {
            elem: Elem::Ptr {
                pointee: T::TY,
                space: AddrSpace::Shared,
            },
            shape: vec![],
        };
        let len = u32::try_from(N).unwrap_or(u32::MAX);
        let span = Span::caller();
        if with_builder(|b| b.depth()) > 0 {
            record_error(BuildError::new(
                span.clone(),
                "`Local::new()` inside a runtime `for`, `while` or `if`: block-local \
                 memory lives for the whole kernel, so allocate it at the top level of the \
                 kernel body and reuse it in the loop",
            ));
        }
        let p = emit1(OpKind::LocalAlloc { len }, &[], Some(&ty), ty.clone(), span);
        Local {
            mem: Global::from_ptr(p),
            _t: PhantomData,
        }
    }

    /// The number of elements, `N`.
    pub const fn len(&self) -> usize {
        N
    }

    /// Whether `N` is 0 (never: a zero-length array is an error).
    pub const fn is_empty(&self) -> bool {
        N == 0
    }

    /// Loads `self[offs]` where `mask` is true (zero elsewhere).
    #[track_caller]
    pub fn load<O: Offsets, M: BroadcastTo<O::Shape>>(
        &self,
        offs: O,
        mask: Tile<bool, M>,
    ) -> Tile<T, O::Shape> {
        self.mem.load(offs, mask)
    }

    /// Loads `self[offs]` where `mask` is true and `other` elsewhere.
    #[track_caller]
    pub fn load_or<O: Offsets, M: BroadcastTo<O::Shape>, X: Operand<T>>(
        &self,
        offs: O,
        mask: Tile<bool, M>,
        other: X,
    ) -> Tile<T, O::Shape>
    where
        X::Shape: BroadcastTo<O::Shape>,
    {
        self.mem.load_or(offs, mask, other)
    }

    /// Loads `self[offs]` for every lane.
    #[track_caller]
    pub fn load_unmasked<O: Offsets>(&self, offs: O) -> Tile<T, O::Shape> {
        self.mem.load_unmasked(offs)
    }

    /// Stores `value` to `self[offs]` where `mask` is true.
    #[track_caller]
    pub fn store<O: Offsets, M: BroadcastTo<O::Shape>, V: StoreValue<T, O::Shape>>(
        &mut self,
        offs: O,
        value: V,
        mask: Tile<bool, M>,
    ) {
        self.mem.store(offs, value, mask)
    }

    /// Stores `value` to `self[offs]` for every lane.
    #[track_caller]
    pub fn store_unmasked<O: Offsets, V: StoreValue<T, O::Shape>>(&mut self, offs: O, value: V) {
        self.mem.store_unmasked(offs, value)
    }

    /// Atomic read-modify-write (block scope) of `self[offs]` with `value` where
    /// `mask` is true; returns the old values.
    #[track_caller]
    pub fn atomic_rmw<O: Offsets, M: BroadcastTo<O::Shape>, V: StoreValue<T, O::Shape>>(
        &mut self,
        op: AtomicOp,
        offs: O,
        value: V,
        mask: Tile<bool, M>,
        order: MemOrder,
    ) -> Tile<T, O::Shape> {
        self.mem
            .atomic_rmw(op, offs, value, mask, order, MemScope::Block)
    }

    /// Atomic add (relaxed, block scope) where `mask` is true; returns the old values.
    /// Lanes with the same offset all add (a histogram's collisions).
    #[track_caller]
    pub fn atomic_add<O: Offsets, M: BroadcastTo<O::Shape>, V: StoreValue<T, O::Shape>>(
        &mut self,
        offs: O,
        value: V,
        mask: Tile<bool, M>,
    ) -> Tile<T, O::Shape> {
        self.atomic_rmw(AtomicOp::Add, offs, value, mask, MemOrder::Relaxed)
    }

    /// Atomic max (relaxed, block scope); returns the old values.
    #[track_caller]
    pub fn atomic_max<O: Offsets, M: BroadcastTo<O::Shape>, V: StoreValue<T, O::Shape>>(
        &mut self,
        offs: O,
        value: V,
        mask: Tile<bool, M>,
    ) -> Tile<T, O::Shape> {
        self.atomic_rmw(AtomicOp::Max, offs, value, mask, MemOrder::Relaxed)
    }

    /// Atomic min (relaxed, block scope); returns the old values.
    #[track_caller]
    pub fn atomic_min<O: Offsets, M: BroadcastTo<O::Shape>, V: StoreValue<T, O::Shape>>(
        &mut self,
        offs: O,
        value: V,
        mask: Tile<bool, M>,
    ) -> Tile<T, O::Shape> {
        self.atomic_rmw(AtomicOp::Min, offs, value, mask, MemOrder::Relaxed)
    }

    /// Atomic compare-and-swap (acquire-release, block scope): where `mask` is true and
    /// `self[offs] == expected`, writes `desired`; returns the old values.
    #[track_caller]
    pub fn atomic_cas<O: Offsets, M: BroadcastTo<O::Shape>>(
        &mut self,
        offs: O,
        expected: Tile<T, O::Shape>,
        desired: Tile<T, O::Shape>,
        mask: Tile<bool, M>,
    ) -> Tile<T, O::Shape> {
        self.mem
            .atomic_cas_scoped(offs, expected, desired, mask, MemScope::Block)
    }
}

impl<T: DType, const N: usize> Default for Local<T, N> {
    #[track_caller]
    fn default() -> Self {
        Self::new()
    }
}

impl<T: DType, const N: usize> std::fmt::Debug for Local<T, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Local<{}, {N}>({})", T::TY, self.mem.id())
    }
}
