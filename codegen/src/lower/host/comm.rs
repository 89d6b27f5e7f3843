//! Communication on the host: `rank`, `world_size`, `remote_ptr`, `signal`,
//! `fence`, and the runtime calls for `wait_until` and `barrier_all` (see the
//! module docs of [`super`]).

use super::*;

impl<'a, 'ctx> H<'a, 'ctx> {
    /// The runtime function `name` (declared on first use).
    pub(super) fn runtime_fn(
        &self,
        name: &str,
        ret: BasicTypeEnum<'ctx>,
        params: &[BasicMetadataTypeEnum<'ctx>],
    ) -> LResult<FunctionValue<'ctx>> {
        Ok(self.cx.module.get_function(name).unwrap_or_else(|| {
            self.cx.module.add_function(
                name,
                ret.fn_type(params, false),
                Some(inkwell::module::Linkage::External),
            )
        }))
    }

    /// `comm[i]`.
    pub(super) fn comm_word(&self, i: IntValue<'ctx>) -> LResult<IntValue<'ctx>> {
        let i64t = self.cx.ctx.i64_type();
        let a = self.gep(i64t.into(), self.comm, i)?;
        Ok(self.cx.b.build_load(i64t, a, "")?.into_int_value())
    }

    /// A scalar operand (a 0-d value, or a tile equal in every element).
    pub(super) fn scalar_operand(&mut self, op: &Op, k: usize) -> LResult<BasicValueEnum<'ctx>> {
        match self.val(op.operands[k])? {
            V::U(x) => Ok(x),
            _ if self.numel(op.operands[k]) == 1 => {
                let e = self.elem(op.operands[k]);
                let t = self.mat(op.operands[k])?;
                self.get(t, e, self.i64(0))
            }
            _ => unsupported(op, "with a tile where a scalar is expected"),
        }
    }

    /// `rank`, `world_size`, `remote_ptr`, `signal`, `wait_until`, `fence`,
    /// `barrier_all` (see the module docs).
    pub(super) fn comm_op(&mut self, op: &Op) -> LResult<()> {
        let i64t = self.cx.ctx.i64_type();
        let i32t = self.cx.ctx.i32_type();
        let ptr = self.cx.ctx.ptr_type(AddressSpace::default());
        match &op.kind {
            OpKind::Rank | OpKind::WorldSize => {
                let w = self.comm_word(self.i64((op.kind == OpKind::WorldSize) as u64))?;
                let v = self.cx.b.build_int_truncate(w, i32t, "")?;
                self.set(op, V::U(v.into()));
            }
            OpKind::RemotePtr => {
                let Some(k) = param_of(self.prov[op.operands[0].index()]) else {
                    return unsupported(op, "of pointers into several buffers");
                };
                let peer = self.scalar_operand(op, 1)?.into_int_value();
                let peer = self.cx.b.build_int_s_extend(peer, i64t, "")?;
                let size = self.comm_word(self.i64(1))?;
                let site = self.site(op, SiteKind::Peer, Vec::new());
                let ok = self
                    .cx
                    .b
                    .build_int_compare(IntPredicate::ULT, peer, size, "")?;
                self.check(ok, site, self.i64(0), peer)?;
                let b = &self.cx.b;
                let at = b.build_int_mul(self.i64(k as u64), size, "")?;
                let at = b.build_int_add(at, peer, "")?;
                let at = b.build_int_add(at, self.i64(2), "")?;
                let delta = self.comm_word(at)?;
                let i8t: BasicTypeEnum = self.cx.ctx.i8_type().into();
                let pe = self.elem(op.operands[0]);
                let v = match self.val(op.operands[0])? {
                    V::U(p) => V::U(self.gep(i8t, p.into_pointer_value(), delta)?.into()),
                    V::A(a) => {
                        let base = self.gep(i8t, self.aff[a].base.into_pointer_value(), delta)?;
                        let strides = self.aff[a].strides.clone();
                        self.affine(base.into(), strides)
                    }
                    v => {
                        let v = self.mat_v(v, op.operands[0])?;
                        let n = self.numel(op.results[0]);
                        let out = self.slot(pe, n)?;
                        self.counted(n, &mut |h, i| {
                            let p = h.get(v, pe, i)?.into_pointer_value();
                            let q = h.gep(i8t, p, delta)?;
                            h.put(out, pe, i, q.into())
                        })?;
                        V::T(out)
                    }
                };
                self.set(op, v);
            }
            OpKind::Signal { op: sop, order, .. } => {
                let p = self.scalar_operand(op, 0)?.into_pointer_value();
                let v = self.scalar_operand(op, 1)?.into_int_value();
                self.check_word(op, p)?;
                let bop = match sop {
                    SignalOp::Set => AtomicRMWBinOp::Xchg,
                    SignalOp::Add => AtomicRMWBinOp::Add,
                };
                self.cx.b.build_atomicrmw(bop, p, v, llvm_order(*order))?;
            }
            OpKind::WaitUntil { pred, .. } => {
                let p = self.scalar_operand(op, 0)?.into_pointer_value();
                let v = self.scalar_operand(op, 1)?.into_int_value();
                self.check_word(op, p)?;
                // The runtime receives the comparison as its index in `CmpPred::ALL`.
                let code = CmpPred::ALL.iter().position(|q| q == pred).unwrap_or(0);
                let f = self.runtime_fn(
                    WAIT,
                    i32t.into(),
                    &[ptr.into(), i32t.into(), i64t.into(), ptr.into()],
                )?;
                let args = [
                    p.into(),
                    i32t.const_int(code as u64, false).into(),
                    v.into(),
                    self.err.into(),
                ];
                let site = self.site(op, SiteKind::Wait(Some(*pred)), Vec::new());
                self.wait_call(f, &args, site)?;
                let seen = self.gep(i64t.into(), self.err, self.i64(5))?;
                let x = self.cx.b.build_load(i64t, seen, "seen")?;
                self.set(op, V::U(x));
            }
            OpKind::Fence { order, .. } => {
                if *order != MemOrder::Relaxed {
                    self.cx.b.build_fence(llvm_order(*order), false, "")?;
                }
            }
            OpKind::BarrierAll => {
                let f = self.runtime_fn(BARRIER, i32t.into(), &[ptr.into()])?;
                let site = self.site(op, SiteKind::Wait(None), Vec::new());
                self.wait_call(f, &[self.err.into()], site)?;
            }
            _ => return unsupported(op, "is not a communication op"),
        }
        Ok(())
    }

    /// With checks on: the signal word at `p` lies inside its buffer.
    pub(super) fn check_word(&mut self, op: &Op, p: PointerValue<'ctx>) -> LResult<()> {
        if !self.checked {
            return Ok(());
        }
        let prov = self.prov[op.operands[0].index()];
        let site = self.site(
            op,
            SiteKind::Access {
                param: param_of(prov),
                remote: self.reaches_peers(prov),
            },
            Vec::new(),
        );
        self.check_access(site, prov, p, 8, self.i64(0))
    }

    /// Calls a runtime wait; a nonzero status fails the kernel at `site` (the
    /// status as the lane).
    pub(super) fn wait_call(
        &self,
        f: FunctionValue<'ctx>,
        args: &[BasicMetadataValueEnum<'ctx>],
        site: usize,
    ) -> LResult<()> {
        let i64t = self.cx.ctx.i64_type();
        let rc = self
            .cx
            .b
            .build_call(f, args, "")?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| LowerError::Llvm("wait returns nothing".into()))?
            .into_int_value();
        let ok = self.cx.b.build_int_compare(
            IntPredicate::EQ,
            rc,
            self.cx.ctx.i32_type().const_zero(),
            "",
        )?;
        let status = self.cx.b.build_int_z_extend(rc, i64t, "")?;
        self.check(ok, site, status, self.i64(0))
    }
}
