//! Shared memory of the block: one array sized at the end of the lowering.
//!
//! Laid out as [`plan`](super::plan) decided (local arrays, then each `dot`'s
//! arrays or ring), followed by the scratch that layout conversions, reductions and
//! the FMA `dot` reserve as they are lowered ([`Lowerer::scratch`]: the largest
//! single need, since scratch is dead between ops). Every access that the emulator
//! must see goes through [`Lowerer::smem_load`], [`Lowerer::smem_store`] or
//! [`Lowerer::access_ptr`].

use inkwell::module::Linkage;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{BasicValueEnum, IntValue, PointerValue};
use tessera_ir::ir::Op;
use tessera_ir::{AddrSpace, Span};

use super::{AsyncDot, AsyncSlot, LResult, LowerError, Lowerer, arch, dot, type_size, unsupported};

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// Replaces the placeholder shared global with one of the final size.
    pub(super) fn finish_shared(&mut self) -> LResult<u32> {
        let mut bytes = self.plan.pipe_bytes + self.smem_bytes;
        if let Some(g) = self.group.take() {
            // Ping-pong groups: each its own copy of what follows the ring (the
            // store staging box and the scratch), a stride apart.
            let private = self.plan.store_staging.unwrap_or(self.plan.pipe_bytes);
            let stride = (bytes - private).next_multiple_of(self.smem_align());
            bytes = private + stride * self.spec_groups();
            let ld = g.stride;
            ld.replace_all_uses_with(self.cx.i32(stride as i64));
            if let Some(i) = inkwell::values::BasicValue::as_instruction_value(&ld) {
                i.erase_from_basic_block();
            }
            if let Some(g) = self.cx.module.get_global(super::spec::GROUP_STRIDE) {
                // SAFETY: its only use, the load, is gone.
                unsafe { g.delete() };
            }
        }
        let limit = self.target().shared_memory_limit();
        if bytes > limit {
            let span = self
                .smem_span
                .clone()
                .unwrap_or_else(|| self.f.span.clone());
            return unsupported(
                &span,
                format!("{bytes} bytes of shared memory (the limit is {limit})"),
            );
        }
        let old = self.smem;
        if bytes > 0 && self.smem_base.is_none() {
            let dynamic = self.target().dynamic_shared(bytes);
            // Dynamic shared memory is an unsized external array the launch sizes.
            let ty = self
                .cx
                .ctx
                .i8_type()
                .array_type(if dynamic { 0 } else { bytes });
            let g = self.cx.module.add_global(
                ty,
                Some(arch::shared_space(self.target())),
                "__tessera_smem",
            );
            if dynamic {
                g.set_linkage(Linkage::External);
            } else {
                g.set_linkage(Linkage::Internal);
                g.set_initializer(&ty.get_undef());
            }
            g.set_alignment(self.smem_align());
            old.as_pointer_value()
                .replace_all_uses_with(g.as_pointer_value());
        }
        unsafe { old.delete() };
        Ok(bytes)
    }

    /// The alignment of every array in shared memory: 16 bytes, or on targets with
    /// `wgmma` the 1024 bytes its 128-byte swizzle repeats over (offsets stay
    /// multiples of it, and so does the block's shared memory).
    pub(crate) fn smem_align(&self) -> u32 {
        if self.target().has_wgmma() {
            dot::wgmma::ARRAY_ALIGN
        } else {
            16
        }
    }

    /// Reserves `bytes` of scratch for the op at `span`; returns the base pointer
    /// (a ping-pong group's own).
    pub fn scratch(&mut self, bytes: u32, span: &Span) -> PointerValue<'ctx> {
        let bytes = bytes.div_ceil(16) * 16;
        if bytes > self.smem_bytes {
            self.smem_bytes = bytes;
            self.smem_span = Some(span.clone());
        }
        self.private_at(self.plan.pipe_bytes)
    }

    /// The start of shared memory plus `offset` bytes in the memory past the rings
    /// (the store staging box, the scratch): in a ping-pong consumer group, its own
    /// copy of it.
    pub(super) fn private_at(&self, offset: u32) -> PointerValue<'ctx> {
        let p = self.smem_at(offset);
        match &self.group {
            // SAFETY: inside the block's shared memory, which `finish_shared` sizes
            // to hold every group's copy.
            Some(g) => unsafe {
                self.cx
                    .b
                    .build_in_bounds_gep(self.cx.ctx.i8_type(), p, &[g.offset], "")
                    .unwrap_or(p)
            },
            None => p,
        }
    }

    /// The start of shared memory plus `offset` bytes.
    pub(super) fn smem_at(&self, offset: u32) -> PointerValue<'ctx> {
        let base = self
            .smem_base
            .unwrap_or_else(|| self.smem.as_pointer_value());
        if offset == 0 {
            return base;
        }
        let i8t = self.cx.ctx.i8_type();
        // SAFETY: an offset inside the block's shared memory, which `finish_shared`
        // sizes to hold the staged arrays and the scratch after them.
        unsafe {
            self.cx
                .b
                .build_in_bounds_gep(i8t, base, &[self.cx.i32(offset as i64)], "")
                .unwrap_or(base)
        }
    }

    /// The shared arrays of `dot` `op` when a loop stages an operand of it there.
    pub fn pipe_base(&self, op: &Op) -> Option<PointerValue<'ctx>> {
        self.pipe_copy(op, false)
    }

    /// [`Self::pipe_base`] of the copy a double-buffered `dot` reads this iteration
    /// (`next`: the other one, which the next iteration reads); the first copy
    /// before its loop and for any other `dot`.
    pub fn pipe_copy(&self, op: &Op, next: bool) -> Option<PointerValue<'ctx>> {
        let key = op as *const Op;
        let first = *self.plan.pipe_dots.get(&key)?;
        let off = match (self.plan.double.get(&key), self.reads_second.get(&key)) {
            (Some(&second), Some(&reads)) if reads != next => second,
            _ => first,
        };
        Some(self.smem_at(off))
    }

    /// Whether operand `which` of `dot` `op` is already in the `dot`'s shared arrays:
    /// a loop-carried operand kept there, or a loop-invariant one written there
    /// before the loop.
    pub fn is_staged(&self, op: &Op, which: usize) -> bool {
        self.plan.staged.contains_key(&op.operands[which])
            || self.plan.invariant.contains(&(op as *const Op, which))
    }

    /// The asynchronous-copy ring of `dot` `op`, if it has one.
    pub(crate) fn async_dot(&self, op: &Op) -> Option<AsyncDot> {
        self.plan.async_dots.get(&(op as *const Op)).copied()
    }

    /// The array base of slot `slot` of `op`'s ring (the read slot for `None`... see
    /// [`AsyncSlot`]): `Fixed` slots are constant, `Next` and the read slot come from
    /// the loop being lowered.
    pub(crate) fn async_base(
        &self,
        op: &Op,
        slot: Option<AsyncSlot>,
    ) -> LResult<PointerValue<'ctx>> {
        let a = self
            .async_dot(op)
            .ok_or_else(|| LowerError::Llvm("no ring for this dot".into()))?;
        let base = self.smem_at(a.offset);
        let off = match slot {
            Some(AsyncSlot::Fixed(s)) => return Ok(self.smem_at(a.offset + s * a.slot_bytes)),
            Some(AsyncSlot::Next) => self
                .async_slots
                .borrow()
                .get(&(op as *const Op))
                .map(|s| s.1),
            None => self
                .async_slots
                .borrow()
                .get(&(op as *const Op))
                .map(|s| s.0),
        }
        .ok_or_else(|| LowerError::Llvm("a ring slot outside its loop".into()))?;
        // SAFETY: a byte offset inside the ring, which `finish_shared` sizes.
        Ok(unsafe {
            self.cx
                .b
                .build_in_bounds_gep(self.cx.ctx.i8_type(), base, &[off], "")?
        })
    }

    /// Counts an asynchronous copy of operand `which` for `dot` `op` into `slot`;
    /// commits the group once both operands' copies are issued.
    pub(crate) fn async_issued(&self, op: &Op, slot: AsyncSlot) -> LResult<()> {
        let key = (
            op as *const Op,
            match slot {
                AsyncSlot::Fixed(s) => Some(s),
                AsyncSlot::Next => None,
            },
        );
        let n = {
            let mut m = self.async_issued.borrow_mut();
            let n = m.entry(key).or_insert(0);
            *n += 1;
            *n
        };
        // (A ring whose operands both come by TMA has no cp.async group.)
        if n == 2 && self.async_dot(op).is_some_and(|r| r.tma < 2) {
            self.arch.cp_async_commit(&self.cx)?;
        }
        Ok(())
    }

    /// Loads `ty` from shared memory at `p` (telling the arch, see [`Arch::note_shared`]).
    pub fn smem_load(
        &self,
        ty: BasicTypeEnum<'ctx>,
        p: PointerValue<'ctx>,
    ) -> LResult<BasicValueEnum<'ctx>> {
        let site = self.new_site("shared load");
        self.arch
            .note_shared(&self.cx, p, type_size(ty), false, site)?;
        Ok(self.cx.b.build_load(ty, p, "")?)
    }

    /// Stores `v` to shared memory at `p` (telling the arch, see [`Arch::note_shared`]).
    pub fn smem_store(
        &self,
        p: PointerValue<'ctx>,
        v: BasicValueEnum<'ctx>,
    ) -> LResult<inkwell::values::InstructionValue<'ctx>> {
        let site = self.new_site("shared store");
        self.arch
            .note_shared(&self.cx, p, type_size(v.get_type()), true, site)?;
        Ok(self.cx.b.build_store(p, v)?)
    }

    /// The pointer through which to access `bytes` bytes at `p`, a pointer of the IR
    /// address space `space` ([`Arch::check_global`] / [`Arch::note_shared`]).
    pub fn access_ptr(
        &self,
        space: AddrSpace,
        p: PointerValue<'ctx>,
        bytes: u32,
        is_write: bool,
        what: &'static str,
    ) -> LResult<PointerValue<'ctx>> {
        let site = self.new_site(what);
        match space {
            AddrSpace::Global => self.arch.check_global(&self.cx, p, bytes, site),
            AddrSpace::Shared => {
                self.arch.note_shared(&self.cx, p, bytes, is_write, site)?;
                Ok(p)
            }
        }
    }

    pub fn smem_ptr(
        &self,
        base: PointerValue<'ctx>,
        ty: BasicTypeEnum<'ctx>,
        idx: IntValue<'ctx>,
    ) -> LResult<PointerValue<'ctx>> {
        Ok(unsafe { self.cx.b.build_in_bounds_gep(ty, base, &[idx], "")? })
    }
}
