//! Regions and control flow: `for` and `if` as Tile IR's, carrying the tokens when
//! their regions touch memory.

use super::*;

impl Lowerer<'_> {
    /// Lowers the ops of `r` into the current block; returns the values its
    /// terminator (`yield`) passes on.
    pub(super) fn region_ops(&mut self, r: &Region) -> Result<Vec<Value>, CodegenError> {
        for op in &r.ops {
            if op.kind == OpKind::Yield {
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
                    | OpKind::DescLoad { .. }
                    | OpKind::DescStore { .. }
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
            let w = self.read_token();
            let reads = std::mem::take(&mut self.reads);
            let r = self.join(reads, w);
            operands.extend([w, r]);
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
        let mut yielded = self.region_ops(body)?;
        if memory {
            let w = self.read_token();
            let reads = std::mem::take(&mut self.reads);
            let r = self.join(reads, w);
            yielded.extend([w, r]);
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
                let w = self.read_token();
                let reads = std::mem::take(&mut self.reads);
                let r = self.join(reads, w);
                yielded.extend([w, r]);
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
}
