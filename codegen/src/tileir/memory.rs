//! Memory order and views: the tokens that order every access that may conflict
//! with an earlier one (see the module docs), and tensor descriptors as partition
//! views of tensor views.

use super::*;

impl Lowerer<'_> {
    /// The token a load waits for: the last store's (loads are not ordered among
    /// themselves).
    pub(super) fn read_token(&mut self) -> Value {
        if let Some(t) = self.last_write {
            return t;
        }
        let t =
            self.emit(OpBuilder::new(Opcode::MakeToken, Location::Unknown).result(Type::Token))[0];
        self.last_write = Some(t);
        t
    }

    /// A token no access produced: an access that takes it is ordered after nothing.
    pub(super) fn fresh_token(&mut self) -> Value {
        self.emit(OpBuilder::new(Opcode::MakeToken, Location::Unknown).result(Type::Token))[0]
    }

    /// Whether an access through pointer `p` reads memory no access of this kernel
    /// writes: `p` derives only from `readonly` parameters (`&Global` in the DSL: the
    /// kernel never writes through them, and Rust's borrows keep a launch from passing
    /// the same buffer as a `&mut` argument too), and the kernel does not communicate
    /// (another rank could write a symmetric buffer). Such a load needs no token
    /// order: it waits for no store, and no store waits for it (the SIMT path reads
    /// these through the non-coherent cache for the same reason).
    pub(super) fn reads_read_only(&mut self, p: ValueId) -> bool {
        if self.read_only.is_none() {
            let f = self.f;
            let flags = if f.uses_comm() {
                vec![false; f.values.len()]
            } else {
                crate::lower::prov::analyze(f)
                    .iter()
                    .map(|pv| {
                        pv.as_ref().is_some_and(|pv| {
                            !pv.remote
                                && pv
                                    .params
                                    .iter()
                                    .all(|&k| f.params[k as usize].attrs.readonly)
                        })
                    })
                    .collect()
            };
            self.read_only = Some(flags);
        }
        self.read_only
            .as_ref()
            .is_some_and(|v| v.get(p.index()).copied().unwrap_or(false))
    }

    /// The token a store waits for: the last store's and every load's since.
    pub(super) fn write_token(&mut self) -> Value {
        let w = self.read_token();
        let mut all = vec![w];
        all.append(&mut self.reads);
        self.join(all, w)
    }

    /// `desc_load` (`result` given) or `desc_store` as an access to a partition view of
    /// a tensor view, which is what lets `tileiras` choose TMA. A partition view
    /// indexes whole blocks, so each block coordinate must be provably a multiple of
    /// the block's extent (the axis analysis's divisibility); and its indices must
    /// lie inside the tensor, so the access is guarded by `0 <= coord < extent` in
    /// every dimension: outside, a load gives zeros and a store writes nothing, as
    /// the descriptor's semantics say. Elements of a block past the tensor's end read
    /// zero (the view's padding) and are not written.
    pub(super) fn desc_access(
        &mut self,
        op: &Op,
        rank: usize,
        result: Option<ValueId>,
    ) -> Result<(), CodegenError> {
        let d =
            tessera_ir::ir::DescOperands::new(rank as u8).map_err(|e| self.unsupported(op, &e))?;
        let block: Vec<u32> = match result {
            Some(r) => self.f.ty(r).shape.clone(),
            None => self.f.ty(op.operands[d.extra()]).shape.clone(),
        };
        let Elem::Ptr { pointee, .. } = self
            .f
            .ty(op.operands[tessera_ir::ir::DescOperands::BASE])
            .elem
        else {
            return Err(self.unsupported(op, "without a base pointer"));
        };
        let axis = self
            .axis
            .get_or_insert_with(|| crate::axis::AxisAnalysis::run(self.f));
        for (k, &b) in block.iter().enumerate() {
            let c = op.operands[d.coord(k)];
            let div = axis.get(self.f, c).divisibility[0];
            if !div.is_multiple_of(u64::from(b)) {
                return Err(self.unsupported(
                    op,
                    &format!(
                        "whose coordinate {k} is not provably a multiple of the block's {b} \
                         (Tile IR views index whole blocks)"
                    ),
                ));
            }
        }
        let i32t = tile(&[], TileElementType::Scalar(TScalar::I32));
        let i1t = tile(&[], TileElementType::Scalar(TScalar::I1));
        let base = self.val(op.operands[tessera_ir::ir::DescOperands::BASE]);
        let shape: Vec<Value> = (0..rank)
            .map(|k| self.val(op.operands[d.shape(k)]))
            .collect();
        let strides: Vec<Value> = (0..rank - 1)
            .map(|k| self.val(op.operands[d.stride(k)]))
            .collect();
        let tv_ty = cutile_ir::ir::TensorViewType {
            element_type: scalar(pointee),
            shape: vec![cutile_ir::ir::DYNAMIC; rank],
            strides: (0..rank)
                .map(|k| {
                    if k + 1 == rank {
                        1
                    } else {
                        cutile_ir::ir::DYNAMIC
                    }
                })
                .collect(),
        };
        let tv = self.emit(
            OpBuilder::new(Opcode::MakeTensorView, Location::Unknown)
                .operand(base)
                .operands(shape.iter().copied())
                .operands(strides.iter().copied())
                .attr(
                    "operandSegmentSizes",
                    Attribute::Array(vec![
                        Attribute::i32(1),
                        Attribute::i32(rank as i64),
                        Attribute::i32(rank as i64 - 1),
                    ]),
                )
                .result(Type::TensorView(tv_ty.clone())),
        )[0];
        let pv_ty = Type::PartitionView(cutile_ir::ir::PartitionViewType {
            tile_shape: block.iter().map(|&b| b as i32).collect(),
            tensor_view: tv_ty,
            dim_map: (0..rank as i32).collect(),
            padding_value: result.map(|_| cutile_ir::ir::PaddingValue::Zero),
        });
        let pv = self.op1(Opcode::MakePartitionView, &[tv], pv_ty, &[]);
        // The block indices, and whether every coordinate is inside the tensor.
        let mut idx = Vec::new();
        let mut inside: Option<Value> = None;
        let zero = self.const_splat(ScalarType::I32, ConstValue::Int(0), &[]);
        for (k, &b) in block.iter().enumerate() {
            let c = self.val(op.operands[d.coord(k)]);
            let bk = self.const_splat(ScalarType::I32, ConstValue::Int(i64::from(b)), &[]);
            idx.push(self.op1(
                Opcode::DivI,
                &[c, bk],
                i32t.clone(),
                &[
                    ("signedness", Attribute::i32(1)),
                    ("rounding", Attribute::i32(1)),
                ],
            ));
            let pred = |p: i64| {
                [
                    ("comparison_predicate", Attribute::i32(p)),
                    ("signedness", Attribute::i32(1)),
                ]
            };
            let ge = self.op1(Opcode::CmpI, &[c, zero], i1t.clone(), &pred(5));
            let lt = self.op1(Opcode::CmpI, &[c, shape[k]], i1t.clone(), &pred(2));
            let both = self.op1(Opcode::AndI, &[ge, lt], i1t.clone(), &[]);
            inside = Some(match inside {
                Some(i) => self.op1(Opcode::AndI, &[i, both], i1t.clone(), &[]),
                None => both,
            });
        }
        let inside = inside.expect("a descriptor has rank 1 to 3");
        let seg = |rest: Vec<i64>| Attribute::Array(rest.into_iter().map(Attribute::i32).collect());
        match result {
            Some(r) => {
                let ty = self.ty(r);
                let base = op.operands[tessera_ir::ir::DescOperands::BASE];
                let read_only = self.reads_read_only(base);
                let w = if read_only {
                    self.fresh_token()
                } else {
                    self.read_token()
                };
                let (then_r, then_b, _) = build_single_block_region(&mut self.m, &[]);
                let (else_r, else_b, _) = build_single_block_region(&mut self.m, &[]);
                let outer = std::mem::replace(&mut self.blk, then_b);
                let loaded = self.emit(
                    OpBuilder::new(Opcode::LoadViewTko, Location::Unknown)
                        .operand(pv)
                        .operands(idx.iter().copied())
                        .operand(w)
                        .attr("memory_ordering_semantics", Attribute::i32(0))
                        .attr("operandSegmentSizes", seg(vec![1, rank as i64, 1]))
                        .result(ty.clone())
                        .result(Type::Token),
                );
                self.emit(OpBuilder::new(Opcode::Yield, Location::Unknown).operands(loaded));
                self.blk = else_b;
                let z = match self.f.ty(r).scalar_type() {
                    Some(s) if s.is_float() => ConstValue::Float(0.0),
                    Some(ScalarType::I1) => ConstValue::Bool(false),
                    _ => ConstValue::Int(0),
                };
                let s = self
                    .f
                    .ty(r)
                    .scalar_type()
                    .expect("a descriptor block is of scalars");
                let zeros = self.const_splat(s, z, &block);
                self.emit(
                    OpBuilder::new(Opcode::Yield, Location::Unknown)
                        .operand(zeros)
                        .operand(w),
                );
                self.blk = outer;
                let out = self.emit(
                    OpBuilder::new(Opcode::If, Location::Unknown)
                        .operand(inside)
                        .result(ty)
                        .result(Type::Token)
                        .regions([then_r, else_r]),
                );
                if !read_only {
                    self.reads.push(out[1]);
                }
                self.vals.insert(r, out[0]);
            }
            None => {
                let value = self.val(op.operands[d.extra()]);
                let w = self.write_token();
                let (then_r, then_b, _) = build_single_block_region(&mut self.m, &[]);
                let (else_r, else_b, _) = build_single_block_region(&mut self.m, &[]);
                let outer = std::mem::replace(&mut self.blk, then_b);
                let stored = self.emit(
                    OpBuilder::new(Opcode::StoreViewTko, Location::Unknown)
                        .operand(value)
                        .operand(pv)
                        .operands(idx.iter().copied())
                        .operand(w)
                        .attr("memory_ordering_semantics", Attribute::i32(0))
                        .attr("operandSegmentSizes", seg(vec![1, 1, rank as i64, 1]))
                        .result(Type::Token),
                );
                self.emit(OpBuilder::new(Opcode::Yield, Location::Unknown).operands(stored));
                self.blk = else_b;
                self.emit(OpBuilder::new(Opcode::Yield, Location::Unknown).operand(w));
                self.blk = outer;
                let out = self.emit(
                    OpBuilder::new(Opcode::If, Location::Unknown)
                        .operand(inside)
                        .result(Type::Token)
                        .regions([then_r, else_r]),
                );
                self.last_write = Some(out[0]);
            }
        }
        Ok(())
    }

    /// One token standing for `tokens` (`w` when there are none).
    pub(super) fn join(&mut self, tokens: Vec<Value>, w: Value) -> Value {
        match tokens[..] {
            [] => w,
            [t] => t,
            _ => self.op1(Opcode::JoinTokens, &tokens, Type::Token, &[]),
        }
    }
}

impl Lowerer<'_> {
    /// A float atomic `max`/`min` (IEEE 754-2019 `maximum`/`minimum`, as the
    /// interpreter's): Tile IR's atomics have no float max, so a compare-and-swap loop
    /// on the bits. Each lane reads its word, swaps in `maxf(word, value)` if the word
    /// is still what it read, and retries with the word it found otherwise; the loop
    /// ends when no lane (of those the mask enables) is left. The old values are the
    /// words each lane's successful swap replaced.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn atomic_fminmax(
        &mut self,
        s: ScalarType,
        shape: &[u32],
        [ptr, value]: [Value; 2],
        mask: Option<Value>,
        is_max: bool,
        order: MemOrder,
        scope: MemScope,
    ) -> Value {
        let (bits_s, fs) = if s == ScalarType::F64 {
            (TScalar::I64, TScalar::F64)
        } else {
            (TScalar::I32, TScalar::F32)
        };
        let ity = tile(shape, TileElementType::Scalar(bits_s));
        let fty = tile(shape, TileElementType::Scalar(fs));
        let i1t = tile(shape, TileElementType::Scalar(TScalar::I1));
        let iptr = self.op1(
            Opcode::PtrToPtr,
            &[ptr],
            tile(
                shape,
                TileElementType::Pointer(Box::new(PointerType { pointee: bits_s })),
            ),
            &[],
        );
        let scope_a = ("memory_scope", Attribute::i32(memory_scope(scope)));
        let tok = self.write_token();
        let first = self.grouped(
            Opcode::LoadPtrTko,
            &[Some(iptr), mask, None, Some(tok)],
            vec![ity.clone(), Type::Token],
            &[
                ("memory_ordering_semantics", Attribute::i32(1)),
                scope_a.clone(),
            ],
        );
        let all = self.const_splat(ScalarType::I1, ConstValue::Bool(true), shape);
        let pending0 = mask.unwrap_or(all);
        let tys = vec![ity.clone(), i1t.clone(), ity.clone(), Type::Token];
        let (region, blk, args) = build_single_block_region(&mut self.m, &tys);
        let outer = std::mem::replace(&mut self.blk, blk);
        let (expected, pending, old, t) = (args[0], args[1], args[2], args[3]);
        let ef = self.op1(Opcode::Bitcast, &[expected], fty.clone(), &[]);
        let code = if is_max { Opcode::MaxF } else { Opcode::MinF };
        let nf = self.op1(
            code,
            &[ef, value],
            fty,
            &[("propagate_nan", Attribute::Bool(true))],
        );
        let new = self.op1(Opcode::Bitcast, &[nf], ity.clone(), &[]);
        let cas = self.grouped(
            Opcode::AtomicCAS,
            &[
                Some(iptr),
                Some(expected),
                Some(new),
                Some(pending),
                Some(t),
            ],
            vec![ity.clone(), Type::Token],
            &[
                ("memory_ordering_semantics", Attribute::i32(ordering(order))),
                scope_a,
            ],
        );
        let (prev, t2) = (cas[0], cas[1]);
        let ok = self.op1(
            Opcode::CmpI,
            &[prev, expected],
            i1t.clone(),
            &[
                ("comparison_predicate", Attribute::i32(0)),
                ("signedness", Attribute::i32(0)),
            ],
        );
        let won = self.op1(Opcode::AndI, &[pending, ok], i1t.clone(), &[]);
        let old2 = self.op1(Opcode::Select, &[won, expected, old], ity.clone(), &[]);
        let ones = self.const_splat(ScalarType::I1, ConstValue::Bool(true), shape);
        let lost = self.op1(Opcode::XOrI, &[ok, ones], i1t.clone(), &[]);
        let pending2 = self.op1(Opcode::AndI, &[pending, lost], i1t.clone(), &[]);
        let expected2 = self.op1(Opcode::Select, &[ok, expected, prev], ity.clone(), &[]);
        // Any lane left?
        let any = if shape.is_empty() {
            pending2
        } else {
            let n = shape.iter().product::<u32>();
            let flat = self.op1(
                Opcode::Reshape,
                &[pending2],
                tile(&[n], TileElementType::Scalar(TScalar::I1)),
                &[],
            );
            let b = tile(&[], TileElementType::Scalar(TScalar::I1));
            let (rregion, rblk, rargs) =
                build_single_block_region(&mut self.m, &[b.clone(), b.clone()]);
            let back = std::mem::replace(&mut self.blk, rblk);
            let c = self.op1(Opcode::OrI, &[rargs[0], rargs[1]], b.clone(), &[]);
            self.emit(OpBuilder::new(Opcode::Yield, Location::Unknown).operand(c));
            self.blk = back;
            self.emit(
                OpBuilder::new(Opcode::Reduce, Location::Unknown)
                    .operand(flat)
                    .result(b)
                    .attr("dim", Attribute::i32(0))
                    .attr(
                        "identities",
                        Attribute::Array(vec![Attribute::int(0, TScalar::I1)]),
                    )
                    .region(rregion),
            )[0]
        };
        let (then, tblk, _) = build_single_block_region(&mut self.m, &[]);
        let here = std::mem::replace(&mut self.blk, tblk);
        self.emit(
            OpBuilder::new(Opcode::Continue, Location::Unknown)
                .operands([expected2, pending2, old2, t2]),
        );
        self.blk = here;
        self.if_then(any, then);
        self.emit(
            OpBuilder::new(Opcode::Break, Location::Unknown)
                .operands([expected2, pending2, old2, t2]),
        );
        self.blk = outer;
        let out = self.emit(
            OpBuilder::new(Opcode::Loop, Location::Unknown)
                .operands([first[0], pending0, first[0], first[1]])
                .results(tys)
                .region(region),
        );
        self.last_write = Some(out[3]);
        let fty = tile(shape, TileElementType::Scalar(fs));
        self.op1(Opcode::Bitcast, &[out[2]], fty, &[])
    }
}

/// Tile IR's memory ordering semantics (`relaxed` 1, `acquire` 2, `release` 3,
/// `acq_rel` 4; `weak`, 0, is for plain accesses).
pub(super) fn ordering(o: MemOrder) -> i64 {
    match o {
        MemOrder::Relaxed => 1,
        MemOrder::Acquire => 2,
        MemOrder::Release => 3,
        MemOrder::AcqRel => 4,
    }
}

/// Tile IR's memory scope: a program instance is a tile block (`tl_blk` 0), then
/// `device` 1 and `sys` 2.
pub(super) fn memory_scope(s: MemScope) -> i64 {
    match s {
        MemScope::Block => 0,
        MemScope::Device => 1,
        MemScope::System => 2,
    }
}
