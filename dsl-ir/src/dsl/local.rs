//! Block-local memory ([`Local`]): an array in GPU shared memory (LDS on AMD) that the
//! threads of one program instance share, allocated in the kernel.

use std::marker::PhantomData;

use super::net::Net;
use super::ops::broadcast_value;
use super::ops::{Offsets, Operand, StoreValue};
use super::{BroadcastTo, DType, Global, LitValue, Tile, emit1, literal_tile};
use crate::ir::{AtomicOp, CmpPred, MemOrder, MemScope, OpKind, Span};
use crate::types::{AddrSpace, Elem, ScalarType, Type};

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
/// Each `Local::new()` is its own array. Created inside a runtime loop, it is the same
/// memory in every iteration on a GPU, but its contents are undefined again at each
/// allocation (the CPU poisons it each time): keep data that must outlive an
/// iteration in an array allocated before the loop.
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

impl<I: super::Int, S: super::Shape> Tile<I, S> {
    /// The histogram of this tile's values into `BINS` bins of width 1 starting at 0
    /// (Triton's `tl.histogram`): element `b` of the result counts the elements equal
    /// to `b`; values outside `0..BINS` are not counted. Counted with block-scope
    /// atomics in block-local memory (three barriers), so it costs about one shared
    /// atomic per element.
    ///
    /// ```text
    /// let counts = bucket_ids.histogram::<64>();      // Tile<i32, S1<64>>
    /// ```
    #[track_caller]
    pub fn histogram<const BINS: usize>(self) -> Tile<i32, super::S1<BINS>>
    where
        super::Const<BINS>: super::Pow2,
    {
        let all = super::full::<bool, S>(true);
        self.histogram_where::<BINS>(all)
    }

    /// [`Tile::histogram`] of the elements where `mask` is true.
    #[track_caller]
    pub fn histogram_where<const BINS: usize>(
        self,
        mask: Tile<bool, S>,
    ) -> Tile<i32, super::S1<BINS>>
    where
        super::Const<BINS>: super::Pow2,
    {
        let span = Span::caller();
        let mut h = Local::<i32, BINS>::new();
        let bins = super::arange::<BINS>();
        h.store_unmasked(bins, 0);
        super::barrier();
        // Counted: masked in and in 0..BINS (an upper bound past the type's largest
        // value excludes nothing).
        let net = Net {
            dims: S::dims(),
            span: &span,
        };
        let lit = |v: i128| {
            let c = literal_tile::<I>(LitValue::Int(v), span.clone()).id();
            broadcast_value(c, &net.dims, &span)
        };
        let mut counted = net.and(mask.id(), net.cmp(CmpPred::Ge, self.id(), lit(0)));
        let max = if I::TY.is_signed_int() {
            (1i128 << (I::TY.bits() - 1)) - 1
        } else {
            (1i128 << I::TY.bits()) - 1
        };
        if (BINS as i128) <= max {
            let below = net.cmp(CmpPred::Lt, self.id(), lit(BINS as i128));
            counted = net.and(counted, below);
        }
        let ptrs = net.ptrs(h.mem.id(), self.id());
        let ones = net.i32(1);
        emit1(
            OpKind::AtomicRmw {
                op: AtomicOp::Add,
                order: MemOrder::Relaxed,
                scope: MemScope::Block,
                has_mask: true,
            },
            &[ptrs, ones, counted],
            None,
            net.ty(ScalarType::I32),
            span.clone(),
        );
        super::barrier();
        let counts = h.load_unmasked(bins);
        // The array may be reused (a histogram in a loop): everyone has read it first.
        super::barrier();
        counts
    }
}
