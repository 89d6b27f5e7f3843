//! Regions and control flow: `for`, `if` and `while` as Tile IR's `for`, `if` and
//! `loop`, carrying the tokens when their regions touch memory.

use super::*;

impl Lowerer<'_> {
    /// Lowers the ops of `r` into the current block; returns the values its
    /// terminator (`yield`) passes on.
    pub(super) fn region_ops(&mut self, r: &Region) -> Result<Vec<Value>, CodegenError> {
        for op in &r.ops {
            if op.kind == OpKind::Yield || op.kind == OpKind::Condition {
                return Ok(op.operands.iter().map(|&v| self.val(v)).collect());
            }
            self.op(op)?;
        }
        Ok(Vec::new())
    }

    /// Whether `r` (or a region nested in it) accesses memory.
    pub(super) fn touches_memory(r: &Region) -> bool {
        r.ops.iter().any(|o| {
            matches!(
                o.kind,
                OpKind::Load { .. }
                    | OpKind::Store { .. }
                    | OpKind::AtomicRmw { .. }
                    | OpKind::AtomicCas { .. }
                    | OpKind::DescLoad { .. }
                    | OpKind::DescStore { .. }
                    | OpKind::RemotePtr
                    | OpKind::Signal { .. }
                    | OpKind::WaitUntil { .. }
                    | OpKind::Fence { .. }
                    | OpKind::BarrierAll
            ) || o.regions.iter().any(Self::touches_memory)
        })
    }

    /// `for lb, ub, step iter(inits)`: Tile IR's `for`, its body ending in `continue`.
    /// When the body accesses memory, two tokens are carried too (the last store's
    /// and the join of the loads since), so that accesses keep their order across
    /// iterations and with what surrounds the loop (see the module docs); loads wait
    /// only for stores, so a loop that only loads is not serialized.
    pub(super) fn for_op(&mut self, op: &Op) -> Result<(), CodegenError> {
        let body = &op.regions[0];
        let s = self
            .f
            .ty(op.operands[0])
            .scalar_type()
            .ok_or_else(|| self.unsupported(op, "with pointer bounds"))?;
        if s != ScalarType::I32 && s != ScalarType::I64 {
            return Err(self.unsupported(op, &format!("with {s} bounds")));
        }
        let memory = Self::touches_memory(body);
        let mut operands: Vec<Value> = op.operands.iter().map(|&v| self.val(v)).collect();
        let mut arg_tys: Vec<Type> = body.args.iter().map(|&a| self.ty(a)).collect();
        let mut result_tys: Vec<Type> = op.results.iter().map(|&r| self.ty(r)).collect();
        if memory {
            operands.extend(self.state_tokens());
            arg_tys.extend([Type::Token, Type::Token]);
            result_tys.extend([Type::Token, Type::Token]);
        }
        let (region, blk, args) = build_single_block_region(&mut self.m, &arg_tys);
        for (&a, &v) in body.args.iter().zip(&args) {
            self.vals.insert(a, v);
        }
        let outer = std::mem::replace(&mut self.blk, blk);
        let saved = (self.last_write, std::mem::take(&mut self.reads));
        if memory {
            let n = body.args.len();
            self.last_write = Some(args[n]);
            self.reads = vec![args[n + 1]];
        }
        self.loop_depth += 1;
        let yielded = self.region_ops(body);
        self.loop_depth -= 1;
        let mut yielded = yielded?;
        if memory {
            yielded.extend(self.state_tokens());
        }
        self.emit(OpBuilder::new(Opcode::Continue, Location::Unknown).operands(yielded));
        self.blk = outer;
        (self.last_write, self.reads) = saved;
        let results = self.emit(
            OpBuilder::new(Opcode::For, Location::Unknown)
                .operands(operands)
                .results(result_tys)
                .region(region),
        );
        for (&r, &v) in op.results.iter().zip(&results) {
            self.vals.insert(r, v);
        }
        if memory {
            let n = op.results.len();
            self.last_write = Some(results[n]);
            self.reads = vec![results[n + 1]];
        }
        Ok(())
    }

    /// `if cond`: Tile IR's `if`, each region ending in `yield`. When a region accesses
    /// memory, both yield the two tokens too (each starting from the state before
    /// the `if`), so accesses after the `if` wait for the branch that ran.
    pub(super) fn if_op(&mut self, op: &Op) -> Result<(), CodegenError> {
        let memory = op.regions.iter().any(Self::touches_memory);
        let mut result_tys: Vec<Type> = op.results.iter().map(|&r| self.ty(r)).collect();
        let before = if memory {
            let w = self.read_token();
            result_tys.extend([Type::Token, Type::Token]);
            Some((w, self.reads.clone()))
        } else {
            None
        };
        let cond = self.val(op.operands[0]);
        let mut regions = Vec::new();
        for r in &op.regions {
            let (region, blk, _) = build_single_block_region(&mut self.m, &[]);
            let outer = std::mem::replace(&mut self.blk, blk);
            let saved = (self.last_write, self.reads.clone());
            let mut yielded = self.region_ops(r)?;
            if before.is_some() {
                yielded.extend(self.state_tokens());
            }
            self.emit(OpBuilder::new(Opcode::Yield, Location::Unknown).operands(yielded));
            self.blk = outer;
            (self.last_write, self.reads) = saved;
            regions.push(region);
        }
        let results = self.emit(
            OpBuilder::new(Opcode::If, Location::Unknown)
                .operand(cond)
                .results(result_tys)
                .regions(regions),
        );
        for (&r, &v) in op.results.iter().zip(&results) {
            self.vals.insert(r, v);
        }
        if before.is_some() {
            let n = op.results.len();
            self.last_write = Some(results[n]);
            self.reads = vec![results[n + 1]];
        }
        Ok(())
    }

    /// `while inits`: Tile IR's `loop`. Its carried values are the `while`'s, then one
    /// slot per forwarded value (initially zero) and the two tokens when a region
    /// touches memory; the body runs the `before` region, then `if cond` runs the
    /// `after` region and `continue`s with what it yields and the forwarded values,
    /// else `break`s with the forwarded values, which are the loop's results.
    pub(super) fn while_op(&mut self, op: &Op) -> Result<(), CodegenError> {
        let (before, after) = (&op.regions[0], &op.regions[1]);
        let memory = Self::touches_memory(before) || Self::touches_memory(after);
        let nc = before.args.len();
        let nf = op.results.len();
        let mut operands: Vec<Value> = op.operands.iter().map(|&v| self.val(v)).collect();
        let mut tys: Vec<Type> = before.args.iter().map(|&a| self.ty(a)).collect();
        for &r in &op.results {
            let z = self.zero(r);
            operands.push(z);
            tys.push(self.ty(r));
        }
        if memory {
            operands.extend(self.state_tokens());
            tys.extend([Type::Token, Type::Token]);
        }
        let (region, blk, args) = build_single_block_region(&mut self.m, &tys);
        for (&a, &v) in before.args.iter().zip(&args) {
            self.vals.insert(a, v);
        }
        let outer = std::mem::replace(&mut self.blk, blk);
        let saved = (self.last_write, std::mem::take(&mut self.reads));
        if memory {
            self.last_write = Some(args[nc + nf]);
            self.reads = vec![args[nc + nf + 1]];
        }
        self.loop_depth += 1;
        let lowered = self.while_body(op, before, after, &args, nc, memory);
        self.loop_depth -= 1;
        lowered?;
        self.blk = outer;
        (self.last_write, self.reads) = saved;
        let results = self.emit(
            OpBuilder::new(Opcode::Loop, Location::Unknown)
                .operands(operands)
                .results(tys)
                .region(region),
        );
        for (&r, &v) in op.results.iter().zip(&results[nc..]) {
            self.vals.insert(r, v);
        }
        if memory {
            self.last_write = Some(results[nc + nf]);
            self.reads = vec![results[nc + nf + 1]];
        }
        Ok(())
    }

    /// The body of [`Self::while_op`]'s `loop` (its block current, its arguments
    /// `args`: `nc` carried values, the forwarded slots, the tokens).
    fn while_body(
        &mut self,
        op: &Op,
        before: &Region,
        after: &Region,
        args: &[Value],
        nc: usize,
        memory: bool,
    ) -> Result<(), CodegenError> {
        let cond = self.region_ops(before)?;
        let (cond, forwarded) = cond
            .split_first()
            .map(|(c, f)| (*c, f.to_vec()))
            .ok_or_else(|| self.unsupported(op, "whose `before` region has no condition"))?;
        // The `after` region, in an `if` that `continue`s.
        let (then, then_blk, _) = build_single_block_region(&mut self.m, &[]);
        let loop_blk = std::mem::replace(&mut self.blk, then_blk);
        let at_cond = (self.last_write, self.reads.clone());
        for (&a, &v) in after.args.iter().zip(&forwarded) {
            self.vals.insert(a, v);
        }
        let mut next = self.region_ops(after)?;
        next.extend(forwarded.iter().copied());
        if memory {
            next.extend(self.state_tokens());
        }
        self.emit(OpBuilder::new(Opcode::Continue, Location::Unknown).operands(next));
        self.blk = loop_blk;
        (self.last_write, self.reads) = at_cond;
        self.if_then(cond, then);
        let mut done: Vec<Value> = args[..nc].to_vec();
        done.extend(forwarded.iter().copied());
        if memory {
            done.extend(self.state_tokens());
        }
        self.emit(OpBuilder::new(Opcode::Break, Location::Unknown).operands(done));
        Ok(())
    }

    /// The two tokens a region carries out (see the module docs on memory order): the
    /// last store's, and the join of the loads since (which are then taken).
    pub(super) fn state_tokens(&mut self) -> [Value; 2] {
        let w = self.read_token();
        let reads = std::mem::take(&mut self.reads);
        [w, self.join(reads, w)]
    }

    /// `if cond` with the region `then` (ending in `continue`, `break` or `return`)
    /// and an empty `else` (Tile IR's `if` has two regions).
    pub(super) fn if_then(&mut self, cond: Value, then: cutile_ir::ir::RegionId) {
        let (els, blk, _) = build_single_block_region(&mut self.m, &[]);
        let outer = std::mem::replace(&mut self.blk, blk);
        self.emit(OpBuilder::new(Opcode::Yield, Location::Unknown));
        self.blk = outer;
        self.emit(
            OpBuilder::new(Opcode::If, Location::Unknown)
                .operand(cond)
                .regions(vec![then, els]),
        );
    }

    /// A zero of `v`'s type (a null pointer for pointers): the initial value of a
    /// loop slot that is always written before it is read.
    pub(super) fn zero(&mut self, v: ValueId) -> Value {
        let t = self.f.ty(v).clone();
        match t.elem {
            Elem::Scalar(ScalarType::I1) => {
                self.const_splat(ScalarType::I1, ConstValue::Bool(false), &t.shape)
            }
            Elem::Scalar(s) if s.is_float() => {
                self.const_splat(s, ConstValue::Float(0.0), &t.shape)
            }
            Elem::Scalar(s) if s.is_fp8() => {
                let z = self.const_splat(ScalarType::U8, ConstValue::Int(0), &t.shape);
                let ty = self.ty(v);
                self.op1(Opcode::Bitcast, &[z], ty, &[])
            }
            Elem::Scalar(s) => self.const_splat(s, ConstValue::Int(0), &t.shape),
            Elem::Ptr { .. } => {
                let z = self.const_splat(ScalarType::I64, ConstValue::Int(0), &t.shape);
                let ty = self.ty(v);
                self.op1(Opcode::IntToPtr, &[z], ty, &[])
            }
        }
    }
}
