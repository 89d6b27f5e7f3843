//! Memory accesses of a program instance: loads, stores, atomics and tensor
//! descriptors, each lane checked against its buffer, and block-local arrays.

use super::InterpError;
use super::buffer::{Element, HostBuffer, std_order};
use super::prog::{LOCAL_SLOT, Prog, R, Stop};
use super::tiles::{all_true, contiguous, unravel};
use super::value::{Data, Elt, PtrTile, Slots};
use crate::ir::{DescOperands, Op, OpKind};
use crate::types::{Elem, ScalarType};

impl Prog<'_, '_> {
    pub(super) fn pointee(&self, op: &Op) -> R<(ScalarType, Vec<u32>)> {
        let t = self.operand_ty(op, 0)?;
        match t.elem {
            Elem::Ptr { pointee, .. } => Ok((pointee, t.shape.clone())),
            Elem::Scalar(_) => Err(self.invalid(op, "memory op needs pointers")),
        }
    }

    pub(super) fn ptrs<'s>(&'s self, op: &Op, k: usize) -> R<&'s PtrTile> {
        match self.val(op, k)? {
            Data::Ptr(p) => Ok(p),
            _ => Err(self.invalid(op, "memory op needs pointers")),
        }
    }

    pub(super) fn mask<'s>(&'s self, op: &Op, k: Option<usize>, n: usize) -> R<Option<&'s [bool]>> {
        let Some(k) = k else { return Ok(None) };
        match self.val(op, k)? {
            Data::I1(m) if m.len() == n => Ok(Some(m)),
            _ => Err(self.invalid(op, "mask must be an i1 tile of the pointers' shape")),
        }
    }

    pub(super) fn typed<'s, T: Elt>(&'s self, op: &Op, k: usize, n: usize) -> R<&'s [T]> {
        match T::view(self.val(op, k)?) {
            Some(v) if v.len() == n => Ok(v),
            _ => Err(self.invalid(op, format!("operand {k} must be a {} tile", T::TY))),
        }
    }

    /// The buffer of `slot`, checked to hold `T`.
    pub(super) fn buffer<T: Element>(
        &self,
        op: &Op,
        slot: u32,
        lane: usize,
        shape: &[u32],
    ) -> R<&HostBuffer> {
        match self.slot_buffer(slot) {
            Some(b) if b.elem() == T::TY => Ok(b),
            Some(b) => Err(self.bad_ptr(
                op,
                lane,
                shape,
                format!(
                    "a pointer to {} points into a buffer of {}",
                    T::TY,
                    b.elem()
                ),
            )),
            None => Err(self.bad_ptr(
                op,
                lane,
                shape,
                "the pointer does not point into a buffer".into(),
            )),
        }
    }

    /// The buffer of a slot: a launch buffer or one of this program's local arrays.
    pub(super) fn slot_buffer(&self, slot: u32) -> Option<&HostBuffer> {
        match slot.checked_sub(LOCAL_SLOT) {
            Some(i) => self.locals.get(i as usize).map(|(b, _)| b),
            None => self.ex.bufs.get(slot as usize).copied().flatten(),
        }
    }

    /// `local_alloc len`: this op's array of this program instance (made on its first
    /// run), every byte set to 0xFF at each run (NaN for floats, -1 for integers: the
    /// contents of GPU shared memory are undefined at the allocation, so a kernel that
    /// reads before writing reads poison).
    pub(super) fn local_alloc(&mut self, op: &Op, len: u32) -> R<Data> {
        let Elem::Ptr { pointee, .. } = self.result_ty(op)?.elem else {
            return Err(self.invalid(op, "local_alloc must give a pointer"));
        };
        let i = match self.local_of.get(&(op as *const Op)) {
            Some(&i) => i,
            None => {
                let b = HostBuffer::new(pointee, len as usize);
                let name = format!("block-local memory ({}:{})", op.span.line, op.span.col);
                self.locals.push((b, name));
                let i = self.locals.len() as u32 - 1;
                self.local_of.insert(op as *const Op, i);
                i
            }
        };
        let b = &self.locals[i as usize].0;
        b.write_bytes(0, &vec![0xFF; b.size_bytes()])
            .map_err(|e| self.invalid(op, e.to_string()))?;
        Ok(Data::Ptr(PtrTile {
            slots: Slots::Uniform(LOCAL_SLOT + i),
            offs: vec![0],
        }))
    }

    pub(super) fn bad_ptr(&self, op: &Op, lane: usize, shape: &[u32], message: String) -> Stop {
        InterpError::InvalidPointer {
            kernel: self.kernel(),
            op: op.kind.mnemonic(),
            span: op.span.clone(),
            program_id: self.pid,
            lane: unravel(shape, lane),
            message,
        }
        .into()
    }

    /// The name of a buffer slot: its parameter, or a rank's copy of it.
    pub(super) fn slot_name(&self, slot: u32) -> String {
        if let Some(i) = slot.checked_sub(LOCAL_SLOT) {
            return self
                .locals
                .get(i as usize)
                .map_or_else(|| format!("#{slot}"), |(_, n)| n.clone());
        }
        self.ex
            .slot_names
            .get(slot as usize)
            .map_or_else(|| format!("#{slot}"), Clone::clone)
    }

    pub(super) fn oob(
        &self,
        op: &Op,
        lane: usize,
        shape: &[u32],
        slot: u32,
        index: i64,
        len: usize,
    ) -> Stop {
        let buffer = self.slot_name(slot);
        InterpError::OutOfBounds {
            kernel: self.kernel(),
            op: op.kind.mnemonic(),
            span: op.span.clone(),
            program_id: self.pid,
            index,
            lane: unravel(shape, lane),
            buffer,
            len,
        }
        .into()
    }

    /// The buffer and in-bounds element index of lane `i`, or the sanitizer's error.
    #[inline]
    pub(super) fn locate<T: Element>(
        &self,
        op: &Op,
        p: &PtrTile,
        i: usize,
        shape: &[u32],
    ) -> R<(&HostBuffer, usize)> {
        let slot = p.slots.get(i);
        let b = self.buffer::<T>(op, slot, i, shape)?;
        let off = p.offs[i];
        if off < 0 || off as u64 >= b.len() as u64 {
            return Err(self.oob(op, i, shape, slot, off, b.len()));
        }
        Ok((b, off as usize))
    }

    /// For a uniform, contiguous pointer tile whose active lanes (all, without a mask)
    /// lie inside its buffer: the buffer, the lanes `lo..hi` from the first active
    /// lane to the last, and the element index of lane `lo`. `None` for a tile with
    /// no active lane, or one that must go lane by lane (which also reports an
    /// out-of-bounds lane). The range is what a transfer to another rank moves in
    /// one piece: the ragged last tile of a buffer included, whose masked-off lanes
    /// lie past its end.
    pub(super) fn dense_range<T: Element>(
        &self,
        p: &PtrTile,
        mask: Option<&[bool]>,
    ) -> Option<(&HostBuffer, usize, usize, usize)> {
        let Slots::Uniform(s) = p.slots else {
            return None;
        };
        let b = self.slot_buffer(s)?;
        if b.elem() != T::TY || !contiguous(&p.offs) {
            return None;
        }
        let n = p.offs.len();
        let (lo, hi) = match mask {
            Some(m) => (
                m.iter().position(|&x| x)?,
                n - m.iter().rev().position(|&x| x)?,
            ),
            None => (0, n),
        };
        let start = p.offs[0] as i128 + lo as i128;
        let end = p.offs[0] as i128 + hi as i128;
        (start >= 0 && end <= b.len() as i128).then_some((b, lo, hi, start as usize))
    }

    pub(super) fn load(&mut self, op: &Op, has_mask: bool, has_other: bool) -> R<Data> {
        let (pointee, shape) = self.pointee(op)?;
        with_type!(pointee, T => Ok(T::wrap(self.load_t::<T>(op, has_mask, has_other, &shape)?)))
    }

    pub(super) fn load_t<T: Elt>(
        &self,
        op: &Op,
        has_mask: bool,
        has_other: bool,
        shape: &[u32],
    ) -> R<Vec<T>> {
        let p = self.ptrs(op, 0)?;
        let n = p.offs.len();
        let mask = self.mask(op, has_mask.then_some(1), n)?;
        let other = if has_other {
            Some(self.typed::<T>(op, 2, n)?)
        } else {
            None
        };
        self.load_from(op, p, mask, other, shape)
    }

    /// Reads `p` where `mask` holds (all lanes without one), `other` (or zero)
    /// elsewhere.
    pub(super) fn load_from<T: Elt>(
        &self,
        op: &Op,
        p: &PtrTile,
        mask: Option<&[bool]>,
        other: Option<&[T]>,
        shape: &[u32],
    ) -> R<Vec<T>> {
        let n = p.offs.len();
        let fill = |i: usize| other.map_or_else(T::default, |o| o[i]);
        if let Some((b, lo, hi, start)) = self.dense_range::<T>(p, mask) {
            // Masked-off lanes between the first and the last active one are read
            // (they are in bounds) but their values discarded.
            let got = b
                .load_range::<T>(start, hi - lo)
                .map_err(|e| self.transport(op, e))?;
            let mut v: Vec<T> = (0..lo).map(fill).collect();
            v.extend(got);
            v.extend((hi..n).map(fill));
            if let Some(m) = mask.filter(|m| !all_true(m)) {
                for (i, (x, &m)) in v.iter_mut().zip(m).enumerate() {
                    if !m {
                        *x = fill(i);
                    }
                }
            }
            return Ok(v);
        }
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if mask.is_some_and(|m| !m[i]) {
                out.push(fill(i));
                continue;
            }
            let (b, idx) = self.locate::<T>(op, p, i, shape)?;
            // `idx < b.len()` was checked by `locate`.
            out.push(b.load::<T>(idx).map_err(|e| self.transport(op, e))?);
        }
        Ok(out)
    }

    pub(super) fn store(&mut self, op: &Op, has_mask: bool) -> R<()> {
        let (pointee, shape) = self.pointee(op)?;
        with_type!(pointee, T => self.store_t::<T>(op, has_mask, &shape))
    }

    pub(super) fn store_t<T: Elt>(&self, op: &Op, has_mask: bool, shape: &[u32]) -> R<()> {
        let p = self.ptrs(op, 0)?;
        let n = p.offs.len();
        let vals = self.typed::<T>(op, 1, n)?;
        let mask = self.mask(op, has_mask.then_some(2), n)?;
        self.store_to(op, p, vals, mask, shape)
    }

    /// Writes `vals` through `p` where `mask` holds (all lanes without one).
    pub(super) fn store_to<T: Elt>(
        &self,
        op: &Op,
        p: &PtrTile,
        vals: &[T],
        mask: Option<&[bool]>,
        shape: &[u32],
    ) -> R<()> {
        if let Some((b, lo, hi, start)) = self.dense_range::<T>(p, mask) {
            let mask = mask.map(|m| &m[lo..hi]).filter(|m| !all_true(m));
            return b
                .store_range(start, &vals[lo..hi], mask)
                .map_err(|e| self.transport(op, e));
        }
        for (i, &v) in vals.iter().enumerate() {
            if mask.is_some_and(|m| !m[i]) {
                continue;
            }
            let (b, idx) = self.locate::<T>(op, p, i, shape)?;
            // `idx < b.len()` was checked by `locate`.
            b.store(idx, v).map_err(|e| self.transport(op, e))?;
        }
        Ok(())
    }

    /// The element pointers of a `desc_load`/`desc_store` block (row-major) and which
    /// of them lie inside the tensor; with a false predicate, none does.
    pub(super) fn desc_block(&self, op: &Op, rank: u8, block: &[u32]) -> R<(PtrTile, Vec<bool>)> {
        let d = DescOperands::new(rank).map_err(|e| self.invalid(op, e))?;
        let base = self.ptrs(op, DescOperands::BASE)?;
        if base.offs.len() != 1 {
            return Err(self.invalid(op, "a tensor descriptor's base is a scalar pointer"));
        }
        let dim = |k: usize| self.int_scalar(op, k);
        let shape = (0..d.rank)
            .map(|i| dim(d.shape(i)))
            .collect::<R<Vec<_>>>()?;
        let coord = (0..d.rank)
            .map(|i| dim(d.coord(i)))
            .collect::<R<Vec<_>>>()?;
        // The innermost stride is 1.
        let stride = (0..d.rank)
            .map(|i| {
                if i + 1 < d.rank {
                    dim(d.stride(i))
                } else {
                    Ok(1)
                }
            })
            .collect::<R<Vec<_>>>()?;
        let live = match op.kind {
            OpKind::DescLoad { has_pred: true, .. } => self.bool_scalar(op, d.extra())?,
            _ => true,
        };
        let n: usize = block.iter().map(|&b| b as usize).product();
        let mut offs = Vec::with_capacity(n);
        let mut inside = Vec::with_capacity(n);
        let mut idx = vec![0u32; d.rank];
        for _ in 0..n {
            let mut off = base.offs[0] as i128;
            let mut ok = live;
            for (((&c, &i), &n), &s) in coord.iter().zip(&idx).zip(&shape).zip(&stride) {
                let x = c + i as i128;
                ok &= 0 <= x && x < n;
                off += x * s;
            }
            inside.push(ok);
            offs.push(if ok { off as i64 } else { 0 });
            for i in (0..d.rank).rev() {
                idx[i] += 1;
                if idx[i] < block[i] {
                    break;
                }
                idx[i] = 0;
            }
        }
        let slots = Slots::Uniform(base.slots.get(0));
        Ok((PtrTile { slots, offs }, inside))
    }

    pub(super) fn desc_load(&self, op: &Op, rank: u8) -> R<Data> {
        let t = self.result_ty(op)?;
        let (Some(elem), block) = (t.scalar_type(), t.shape.clone()) else {
            return Err(self.invalid(op, "desc_load yields a tile"));
        };
        let (p, inside) = self.desc_block(op, rank, &block)?;
        with_type!(elem, T => Ok(T::wrap(self.load_from::<T>(op, &p, Some(&inside), None, &block)?)))
    }

    pub(super) fn desc_store(&self, op: &Op, rank: u8) -> R<()> {
        let d = DescOperands::new(rank).map_err(|e| self.invalid(op, e))?;
        let t = self.operand_ty(op, d.extra())?.clone();
        let Some(elem) = t.scalar_type() else {
            return Err(self.invalid(op, "desc_store stores a tile"));
        };
        let (p, inside) = self.desc_block(op, rank, &t.shape)?;
        let n = inside.len();
        with_type!(elem, T => {
            let vals = self.typed::<T>(op, d.extra(), n)?;
            self.store_to::<T>(op, &p, vals, Some(&inside), &t.shape)
        })
    }

    pub(super) fn atomic(&mut self, op: &Op) -> R<Data> {
        let (pointee, shape) = self.pointee(op)?;
        with_type!(pointee, T => Ok(T::wrap(self.atomic_t::<T>(op, &shape)?)))
    }

    pub(super) fn atomic_t<T: Elt>(&self, op: &Op, shape: &[u32]) -> R<Vec<T>> {
        let p = self.ptrs(op, 0)?;
        let n = p.offs.len();
        let (order, mask_k) = match op.kind {
            OpKind::AtomicRmw {
                order, has_mask, ..
            } => (order, has_mask.then_some(2)),
            OpKind::AtomicCas {
                order, has_mask, ..
            } => (order, has_mask.then_some(3)),
            _ => return Err(self.invalid(op, "not an atomic")),
        };
        let ord = std_order(order);
        let mask = self.mask(op, mask_k, n)?;
        let v1 = self.typed::<T>(op, 1, n)?;
        let v2 = match op.kind {
            OpKind::AtomicCas { .. } => Some(self.typed::<T>(op, 2, n)?),
            _ => None,
        };
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if mask.is_some_and(|m| !m[i]) {
                out.push(T::default());
                continue;
            }
            let (b, idx) = self.locate::<T>(op, p, i, shape)?;
            // `idx < b.len()` was checked by `locate`.
            let old = match (&op.kind, v2) {
                (OpKind::AtomicRmw { op: aop, .. }, _) => b.rmw(idx, *aop, v1[i], ord),
                (_, Some(des)) => b.cas(idx, v1[i], des[i], ord),
                _ => Ok(None),
            }
            .map_err(|e| self.transport(op, e))?;
            match old {
                Some(o) => out.push(o),
                None => {
                    return Err(self.unsupported(
                        op,
                        format!("this atomic operation is not supported on {}", T::TY),
                    ));
                }
            }
        }
        Ok(out)
    }
}
