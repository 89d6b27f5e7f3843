//! Device-side communication: ranks, symmetric buffers, remote access, signals, waits
//! and barriers (see [`crate::ir::OpKind`] for the exact semantics of each op).
//!
//! A kernel runs as one rank of a world. A `&Symmetric<T>` / `&mut Symmetric<T>`
//! parameter is a buffer allocated at the same place of every rank's symmetric heap;
//! it is used like a [`Global<T>`] for the local copy, and [`Symmetric::on`] gives the
//! copy of another rank, which loads, stores and atomics then access remotely.
//!
//! All ops are **block-cooperative**: like every tile op, they are executed by the
//! program instance (GPU block) as a whole, and the tile's shape chooses how many
//! threads move data: a tile `put`/`get` spreads its elements over the block's
//! threads (16-byte accesses where contiguous), a tile of one warp's size is a warp's
//! access, a scalar is one thread's. `signal`, `wait_until`, `fence` and `barrier_all`
//! act once per program instance and order the accesses of *all* its threads.
//!
//! | op | ordering | default scope |
//! |---|---|---|
//! | remote load/store, `put_nbi`, `get`, `get_nbi` | relaxed, like local ones | - |
//! | `put` | relaxed store, then acq_rel fence (visible on return) | system |
//! | `signal` / `put_signal` | release (all earlier accesses of the program) | system |
//! | `wait_until` | acquire (all later accesses of the program) | system |
//! | `fence` | as given | as given |
//! | `quiet` | acq_rel fence: earlier puts are complete (visible) | system |
//! | `barrier_all` | acq_rel across every program of every rank | system |
//! | remote atomics (`on(p).atomic_*`) | as given | as given |

use std::ops::{Deref, DerefMut};

use super::{BroadcastTo, DType, Offsets};
use super::{Global, Operand, Scalar, StoreValue, Tile, emit0, emit1, type_of};
use crate::ir::{CmpPred, MemOrder, MemScope, OpKind, SignalOp, Span, ValueId};
use crate::types::{ScalarType, Type};

/// A symmetric buffer parameter: one copy per rank, at the same heap offset on every
/// rank. Dereferences to the local copy (a [`Global<T>`]); [`Symmetric::on`] reaches a
/// peer's copy.
pub struct Symmetric<T: DType> {
    pub(super) local: Global<T>,
}

impl<T: DType> std::fmt::Debug for Symmetric<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Symmetric<{}>({})", T::TY, self.local.id())
    }
}

impl<T: DType> Deref for Symmetric<T> {
    type Target = Global<T>;
    fn deref(&self) -> &Global<T> {
        &self.local
    }
}

impl<T: DType> DerefMut for Symmetric<T> {
    fn deref_mut(&mut self) -> &mut Global<T> {
        &mut self.local
    }
}

/// A rank index: a runtime `Scalar<i32>` or a Rust integer.
pub trait Peer {
    /// The `i32` scalar IR value.
    fn value(self, span: &Span) -> ValueId;
}

impl<P: Operand<i32, Shape = ()>> Peer for P {
    fn value(self, span: &Span) -> ValueId {
        Operand::<i32>::value(self, span)
    }
}

/// The value a [`Symmetric::wait_until`] observed. Loads of data the signaller
/// published are issued after it; the IR keeps every memory op in program order
/// around a wait (no pass moves loads, stores or atomics across `wait_until`, and the
/// lowering orders them with an acquire and a block barrier), so holding the token is
/// what documents the dependency. Its value is the signal word that satisfied the wait.
#[derive(Clone, Copy, Debug)]
pub struct Token {
    observed: Scalar<u64>,
}

impl Token {
    /// The observed signal value.
    pub fn value(self) -> Scalar<u64> {
        self.observed
    }
}

fn scalar_u64<V: Operand<u64, Shape = ()>>(v: V, span: &Span) -> ValueId {
    v.value(span)
}

impl<T: DType> Symmetric<T> {
    /// The copy of this buffer on rank `peer` (`0..world_size()`): loads, stores and
    /// atomics through it are remote accesses. A peer outside the world is an error on
    /// the CPU and the emulator, and traps on a GPU.
    #[track_caller]
    pub fn on<P: Peer>(&self, peer: P) -> Global<T> {
        let span = Span::caller();
        let p = peer.value(&span);
        let ty = type_of(self.local.id());
        Global::from_ptr(emit1(
            OpKind::RemotePtr,
            &[self.local.id(), p],
            None,
            ty,
            span,
        ))
    }

    /// Writes `value` into `peer`'s copy at `offs` where `mask` is true, and returns
    /// once the data is visible to every rank (a remote store, then [`quiet`]).
    #[track_caller]
    pub fn put<P: Peer, O: Offsets, M: BroadcastTo<O::Shape>, V: StoreValue<T, O::Shape>>(
        &mut self,
        peer: P,
        offs: O,
        value: V,
        mask: Tile<bool, M>,
    ) {
        self.put_nbi(peer, offs, value, mask);
        quiet();
    }

    /// Non-blocking [`put`](Self::put): the remote store is posted and completes (is
    /// visible to `peer`) at this program's next `quiet`, `signal` or `barrier_all`.
    #[track_caller]
    pub fn put_nbi<P: Peer, O: Offsets, M: BroadcastTo<O::Shape>, V: StoreValue<T, O::Shape>>(
        &mut self,
        peer: P,
        offs: O,
        value: V,
        mask: Tile<bool, M>,
    ) {
        self.on(peer).store(offs, value, mask);
    }

    /// Non-blocking get into a local buffer: copies `peer`'s elements at `offs` to
    /// `dst[dst_offs]` where `mask` is true; `dst` holds them at the next `quiet` (or
    /// block barrier, for other threads of this program).
    #[track_caller]
    pub fn get_nbi<P: Peer, O: Offsets, M: BroadcastTo<O::Shape>, D: Offsets<Shape = O::Shape>>(
        &self,
        peer: P,
        offs: O,
        mask: Tile<bool, M>,
        dst: &mut Global<T>,
        dst_offs: D,
    ) {
        let v = self.on(peer).load(offs, mask);
        dst.store(dst_offs, v, mask);
    }

    /// Reads `peer`'s copy at `offs` where `mask` is true (zero elsewhere): a blocking
    /// get, the values are in hand when it returns.
    #[track_caller]
    pub fn get<P: Peer, O: Offsets, M: BroadcastTo<O::Shape>>(
        &self,
        peer: P,
        offs: O,
        mask: Tile<bool, M>,
    ) -> Tile<T, O::Shape> {
        self.on(peer).load(offs, mask)
    }

    /// [`put_nbi`](Self::put_nbi), then `signal` (release, system scope) of
    /// `sig[sig_index]` on the same peer: the peer that sees the signal sees the data.
    #[track_caller]
    #[allow(clippy::too_many_arguments)]
    pub fn put_signal<P, O, M, V, I, S>(
        &mut self,
        peer: P,
        offs: O,
        value: V,
        mask: Tile<bool, M>,
        sig: &mut Symmetric<u64>,
        sig_index: I,
        sig_value: S,
        op: SignalOp,
    ) where
        P: Peer + Copy,
        O: Offsets,
        M: BroadcastTo<O::Shape>,
        V: StoreValue<T, O::Shape>,
        I: Offsets<Shape = ()>,
        S: Operand<u64, Shape = ()>,
    {
        self.put_nbi(peer, offs, value, mask);
        sig.signal(peer, sig_index, sig_value, op);
    }
}

impl Symmetric<u64> {
    /// Updates `peer`'s signal word `index` (set or add `value`) after every earlier
    /// access of this program instance: release, system scope.
    #[track_caller]
    pub fn signal<P: Peer, I: Offsets<Shape = ()>, S: Operand<u64, Shape = ()>>(
        &mut self,
        peer: P,
        index: I,
        value: S,
        op: SignalOp,
    ) {
        self.signal_with(peer, index, value, op, MemOrder::Release, MemScope::System);
    }

    /// [`signal`](Self::signal) with an explicit ordering and scope.
    #[track_caller]
    pub fn signal_with<P: Peer, I: Offsets<Shape = ()>, S: Operand<u64, Shape = ()>>(
        &mut self,
        peer: P,
        index: I,
        value: S,
        op: SignalOp,
        order: MemOrder,
        scope: MemScope,
    ) {
        let span = Span::caller();
        let remote = self.on(peer);
        let p = remote.ptrs(index, &span);
        let v = scalar_u64(value, &span);
        emit0(OpKind::Signal { op, order, scope }, &[p, v], span);
    }

    /// Blocks this program instance until its own signal word `index` compares `pred`
    /// to `value` (unsigned), then acquires (system scope): what the signaller
    /// published is visible to every thread of the program afterwards. Times out with
    /// an error naming this line (`TESSERA_WAIT_TIMEOUT`).
    #[track_caller]
    pub fn wait_until<I: Offsets<Shape = ()>, S: Operand<u64, Shape = ()>>(
        &self,
        index: I,
        pred: CmpPred,
        value: S,
    ) -> Token {
        self.wait_until_with(index, pred, value, MemScope::System)
    }

    /// [`wait_until`](Self::wait_until) with an explicit scope.
    #[track_caller]
    pub fn wait_until_with<I: Offsets<Shape = ()>, S: Operand<u64, Shape = ()>>(
        &self,
        index: I,
        pred: CmpPred,
        value: S,
        scope: MemScope,
    ) -> Token {
        let span = Span::caller();
        let p = self.local.ptrs(index, &span);
        let v = scalar_u64(value, &span);
        let ty = Type::scalar(ScalarType::U64);
        Token {
            observed: Tile::from_id(emit1(
                OpKind::WaitUntil { pred, scope },
                &[p, v],
                Some(&ty),
                ty.clone(),
                span,
            )),
        }
    }
}

/// This rank's index, `0..world_size()`.
#[track_caller]
pub fn rank() -> Scalar<i32> {
    let ty = Type::scalar(ScalarType::I32);
    Tile::from_id(emit1(OpKind::Rank, &[], None, ty, Span::caller()))
}

/// The number of ranks in the world.
#[track_caller]
pub fn world_size() -> Scalar<i32> {
    let ty = Type::scalar(ScalarType::I32);
    Tile::from_id(emit1(OpKind::WorldSize, &[], None, ty, Span::caller()))
}

/// Orders this program instance's memory accesses before the fence against those
/// after it, with `order` at `scope`.
#[track_caller]
pub fn fence(order: MemOrder, scope: MemScope) {
    emit0(OpKind::Fence { order, scope }, &[], Span::caller());
}

/// Completes this program instance's earlier puts: once `quiet` returns they are
/// visible to every rank (an acq_rel fence at system scope).
#[track_caller]
pub fn quiet() {
    emit0(
        OpKind::Fence {
            order: MemOrder::AcqRel,
            scope: MemScope::System,
        },
        &[],
        Span::caller(),
    );
}

/// Waits until every program instance of every rank has arrived; every access made
/// before it (on any rank) is visible after it. Every rank must launch the same grid.
#[track_caller]
pub fn barrier_all() {
    emit0(OpKind::BarrierAll, &[], Span::caller());
}
