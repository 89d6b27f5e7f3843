//! Tile IR: a second NVIDIA backend, through NVIDIA's own tile compiler.
//!
//! Tessera's tile IR is lowered to NVIDIA's CUDA Tile IR (the `cuda_tile` dialect),
//! written as its versioned bytecode (through the `cutile-ir` crate) and compiled by
//! `tileiras` into a cubin for sm_80 to sm_121, Blackwell included, where NVIDIA's
//! compiler chooses the tensor cores, TMA and the pipelining. No GPU is needed to
//! compile; `tileirdisasm` reads the bytecode back ([`crate::tools::tileirdisasm`]).
//!
//! **What is lowered (this first slice):** program ids and counts, constants,
//! `arange`, `splat`, `expand_dims`, `reshape`, `broadcast`, integer and float
//! `add`/`sub`/`mul`, float `div`, bitwise `and`/`or`/`xor`, `min`/`max`, comparisons,
//! `select`, `addptr`, loads and stores through pointer tiles with their masks and
//! `other` values, `for` loops with carried values, `dot` (f16, bf16 and the 8-bit
//! floats into f32, f32 and f64; i8 into i32), `fma`, casts (float to integer
//! saturating with NaN to 0, to `i1` as "nonzero", to the 8-bit floats saturating),
//! the float math functions but `erf` (f16 and bf16 computed in f32), reductions and
//! scans of 32- and 64-bit elements, bitcasts, atomics (`atomic_rmw` with its ordering
//! and scope), `if`, and tensor descriptors (as partition views of tensor views). Every other op is a [`CodegenError::TileIr`] naming the op and
//! its place in the user's source: nothing is dropped or approximated.
//!
//! **Facts.** A parameter's divisibility (16-byte aligned pointers and integers that
//! are multiples of 16, what a launch's specialization finds) becomes an `assume
//! div_by<16>`, which is what lets `tileiras` take vector loads and TMA.
//!
//! **Semantics kept:** float arithmetic rounds to nearest even (as IEEE and the
//! interpreter do); integer arithmetic wraps (no overflow assumption); unsigned types
//! compare unsigned; a float comparison is ordered except `ne`, which is true when an
//! operand is NaN, as in Rust.
//! A NaN converted to `f8e5m2` keeps its NaN-ness but not necessarily the
//! interpreter's sign and payload bits (the saturating clamp makes it canonical).
//!
//! **Memory order.** Tile IR orders memory operations by tokens, not by program order:
//! an access whose token nothing uses may be reordered or even deleted. Every access
//! here is ordered against every earlier access it could conflict with, with no alias
//! analysis: a load waits for the last store's token, and a store for the join of the
//! last store's and every load's since (`join_tokens`). So reads after writes, writes
//! after reads and writes after writes keep program order; loads are free among
//! themselves. (Atomics, waits and signals are not lowered yet; they will need
//! acquire/release tokens of their own.)
//!
//! **Launch convention:** one tile block per program (the grid is the tile-block
//! grid), a block of (1, 1, 1); the kernel's parameters in order, pointers as
//! `tile<ptr<T>>` and scalars as 0-d tiles.

use std::collections::HashMap;

use cutile_ir::builder::{OpBuilder, append_op, build_single_block_region};
use cutile_ir::bytecode::{BytecodeVersion, Opcode, write_bytecode_version};
use cutile_ir::ir::{
    Attribute, BlockId, DenseElements, FuncType, Location, Module, PointerType,
    ScalarType as TScalar, TileElementType, TileType, Type, Value,
};
use tessera_ir::ir::{
    AtomicOp, BinaryOp, CmpPred, ConstValue, MemOrder, MemScope, Op, OpKind, ReduceOp, Region,
    UnaryOp,
};
use tessera_ir::{AddrSpace, Elem, Function, ScalarType, ValueId};

use crate::CodegenError;

/// A kernel in Tile IR bytecode.
#[derive(Clone, Debug)]
pub struct TileIrKernel {
    /// The kernel's entry name (as in the bytecode and the cubin).
    pub name: String,
    /// The bytecode, as `tileiras` reads it.
    pub bytecode: Vec<u8>,
    /// The bytecode version it was written in.
    pub version: String,
}

/// The bytecode version this backend writes by default: the newest that `cutile-ir`
/// writes and `tileiras` 13.5 reads.
pub const DEFAULT_VERSION: BytecodeVersion = BytecodeVersion::V13_3;

/// Lowers `func` to Tile IR bytecode of `version` ([`DEFAULT_VERSION`] is what
/// `tileiras` 13.5 takes).
pub fn lower(func: &Function, version: BytecodeVersion) -> Result<TileIrKernel, CodegenError> {
    let mut l = Lowerer::new(func);
    l.run()?;
    let name = crate::lower::kernel_symbol(&func.name);
    let module = l.finish(&name);
    let bytecode = write_bytecode_version(&module, version).map_err(|e| CodegenError::TileIr {
        kernel: func.name.clone(),
        span: func.span.clone(),
        message: format!("the Tile IR bytecode writer refused the kernel: {e}"),
    })?;
    Ok(TileIrKernel {
        name,
        bytecode,
        version: version.to_string(),
    })
}

/// A cubin compiled from Tile IR by `tileiras`.
#[derive(Clone, Debug)]
pub struct TileIrArtifact {
    /// The kernel's bytecode.
    pub kernel: TileIrKernel,
    /// The GPU it was compiled for (`sm_100`, ...).
    pub gpu: String,
    /// The cubin.
    pub cubin: Vec<u8>,
}

/// Lowers `func` and compiles it with `tileiras` for `gpu` (`sm_80` .. `sm_121`).
pub fn compile(func: &Function, gpu: &str) -> Result<TileIrArtifact, CodegenError> {
    let kernel = lower(func, DEFAULT_VERSION)?;
    let cubin = crate::tools::tileiras(&kernel.bytecode, gpu).map_err(|e| match e {
        CodegenError::Tool { tool, message } => CodegenError::Tool {
            tool,
            message: format!("kernel `{}` for {gpu}: {message}", func.name),
        },
        e => e,
    })?;
    Ok(TileIrArtifact {
        kernel,
        gpu: gpu.to_string(),
        cubin,
    })
}

struct Lowerer<'a> {
    f: &'a Function,
    m: Module,
    /// The block being filled.
    blk: BlockId,
    /// The kernel's own block (the grid's ids are made there, before any loop).
    entry: BlockId,
    region: cutile_ir::ir::RegionId,
    params: Vec<Type>,
    vals: HashMap<ValueId, Value>,
    /// `get_tile_block_id`'s three results, made on first use.
    block_ids: Option<[Value; 3]>,
    num_blocks: Option<[Value; 3]>,
    /// The divisibility facts ([`crate::axis`]), computed when first needed.
    axis: Option<crate::axis::AxisAnalysis>,
    /// The token of the last store (see the module docs on memory order).
    last_write: Option<Value>,
    /// The tokens of the loads since the last store.
    reads: Vec<Value>,
}

fn scalar(s: ScalarType) -> TScalar {
    match s {
        ScalarType::I1 => TScalar::I1,
        ScalarType::I8 | ScalarType::U8 => TScalar::I8,
        ScalarType::I16 | ScalarType::U16 => TScalar::I16,
        ScalarType::I32 | ScalarType::U32 => TScalar::I32,
        ScalarType::I64 | ScalarType::U64 => TScalar::I64,
        ScalarType::F16 => TScalar::F16,
        ScalarType::BF16 => TScalar::BF16,
        ScalarType::F32 => TScalar::F32,
        ScalarType::F64 => TScalar::F64,
        ScalarType::F8E4M3 => TScalar::F8E4M3FN,
        ScalarType::F8E5M2 => TScalar::F8E5M2,
    }
}

/// Tile IR's memory ordering semantics (`relaxed` 1, `acquire` 2, `release` 3,
/// `acq_rel` 4; `weak`, 0, is for plain accesses).
fn ordering(o: MemOrder) -> i64 {
    match o {
        MemOrder::Relaxed => 1,
        MemOrder::Acquire => 2,
        MemOrder::Release => 3,
        MemOrder::AcqRel => 4,
    }
}

/// Tile IR's memory scope: a program instance is a tile block (`tl_blk` 0), then
/// `device` 1 and `sys` 2.
fn memory_scope(s: MemScope) -> i64 {
    match s {
        MemScope::Block => 0,
        MemScope::Device => 1,
        MemScope::System => 2,
    }
}

fn tile(shape: &[u32], e: TileElementType) -> Type {
    Type::Tile(TileType {
        shape: shape.iter().map(|&d| d as i64).collect(),
        element_type: e,
    })
}

impl<'a> Lowerer<'a> {
    fn new(f: &'a Function) -> Self {
        let mut m = Module::new(&f.name);
        let params: Vec<Type> = f
            .params
            .iter()
            .map(|p| {
                let t = f.ty(p.value);
                match t.elem {
                    Elem::Scalar(s) => tile(&[], TileElementType::Scalar(scalar(s))),
                    Elem::Ptr { pointee, .. } => tile(
                        &[],
                        TileElementType::Pointer(Box::new(PointerType {
                            pointee: scalar(pointee),
                        })),
                    ),
                }
            })
            .collect();
        let (region, blk, args) = build_single_block_region(&mut m, &params);
        let vals = f
            .params
            .iter()
            .zip(args)
            .map(|(p, a)| (p.value, a))
            .collect();
        Lowerer {
            f,
            m,
            blk,
            entry: blk,
            region,
            params,
            vals,
            block_ids: None,
            num_blocks: None,
            axis: None,
            last_write: None,
            reads: Vec::new(),
        }
    }

    fn finish(mut self, name: &str) -> Module {
        let (op, _) = OpBuilder::new(Opcode::Return, Location::Unknown).build(&mut self.m);
        append_op(&mut self.m, self.blk, op);
        let (entry, _) = OpBuilder::new(Opcode::Entry, Location::Unknown)
            .attr("sym_name", Attribute::String(name.to_string()))
            .attr(
                "function_type",
                Attribute::Type(Type::Func(FuncType {
                    inputs: self.params.clone(),
                    results: vec![],
                })),
            )
            .region(self.region)
            .build(&mut self.m);
        self.m.functions.push(entry);
        self.m
    }

    fn unsupported(&self, op: &Op, what: &str) -> CodegenError {
        CodegenError::TileIr {
            kernel: self.f.name.clone(),
            span: op.span.clone(),
            message: format!("`{}` {what}", op.kind.mnemonic()),
        }
    }

    /// The Tile IR type of value `v`.
    fn ty(&self, v: ValueId) -> Type {
        let t = self.f.ty(v);
        let e = match t.elem {
            Elem::Scalar(s) => TileElementType::Scalar(scalar(s)),
            Elem::Ptr { pointee, .. } => TileElementType::Pointer(Box::new(PointerType {
                pointee: scalar(pointee),
            })),
        };
        tile(&t.shape, e)
    }

    fn val(&self, v: ValueId) -> Value {
        self.vals[&v]
    }

    fn emit(&mut self, b: OpBuilder) -> Vec<Value> {
        let (op, r) = b.build(&mut self.m);
        append_op(&mut self.m, self.blk, op);
        r
    }

    /// An op whose operands come in optional groups of one (pointer, value, mask,
    /// `other`, token: `operandSegmentSizes` says which are present), with `results`
    /// and `attrs`.
    fn grouped(
        &mut self,
        code: Opcode,
        groups: &[Option<Value>],
        results: Vec<Type>,
        attrs: &[(&str, Attribute)],
    ) -> Vec<Value> {
        let seg = groups
            .iter()
            .map(|g| Attribute::i32(i64::from(g.is_some())))
            .collect();
        let mut b = OpBuilder::new(code, Location::Unknown)
            .operands(groups.iter().flatten().copied())
            .results(results)
            .attr("operandSegmentSizes", Attribute::Array(seg));
        for (n, a) in attrs {
            b = b.attr(*n, a.clone());
        }
        self.emit(b)
    }

    /// One op with `operands` and one result of type `ty`, plus `attrs`.
    fn op1(
        &mut self,
        code: Opcode,
        operands: &[Value],
        ty: Type,
        attrs: &[(&str, Attribute)],
    ) -> Value {
        let mut b = OpBuilder::new(code, Location::Unknown)
            .operands(operands.iter().copied())
            .result(ty);
        for (n, a) in attrs {
            b = b.attr(*n, a.clone());
        }
        self.emit(b)[0]
    }

    /// The token a load waits for: the last store's (loads are not ordered among
    /// themselves).
    fn read_token(&mut self) -> Value {
        if let Some(t) = self.last_write {
            return t;
        }
        let t =
            self.emit(OpBuilder::new(Opcode::MakeToken, Location::Unknown).result(Type::Token))[0];
        self.last_write = Some(t);
        t
    }

    /// The token a store waits for: the last store's and every load's since.
    fn write_token(&mut self) -> Value {
        let w = self.read_token();
        let mut all = vec![w];
        all.append(&mut self.reads);
        self.join(all, w)
    }

    fn block_id(&mut self, axis: u32, count: bool) -> Value {
        let i32t = tile(&[], TileElementType::Scalar(TScalar::I32));
        let slot = if count {
            &mut self.num_blocks
        } else {
            &mut self.block_ids
        };
        if let Some(v) = slot {
            return v[axis as usize];
        }
        let code = if count {
            Opcode::GetNumTileBlocks
        } else {
            Opcode::GetTileBlockId
        };
        // In the kernel's block, so that every later use, in a loop or not, sees it.
        let (op, r) = OpBuilder::new(code, Location::Unknown)
            .result(i32t.clone())
            .result(i32t.clone())
            .result(i32t)
            .build(&mut self.m);
        append_op(&mut self.m, self.entry, op);
        let v = [r[0], r[1], r[2]];
        if count {
            self.num_blocks = Some(v);
        } else {
            self.block_ids = Some(v);
        }
        v[axis as usize]
    }

    /// A 0-d constant of scalar type `s`.
    fn scalar_const(&mut self, s: ScalarType, c: ConstValue) -> Option<Value> {
        let data = match (s, c) {
            (ScalarType::I1, ConstValue::Bool(b)) => vec![b as u8],
            (s, ConstValue::Int(i)) if s.is_int() => {
                let bytes = (s.bits() as usize).div_ceil(8);
                i.to_le_bytes()[..bytes].to_vec()
            }
            (ScalarType::F32, ConstValue::Float(x)) => (x as f32).to_le_bytes().to_vec(),
            (ScalarType::F64, ConstValue::Float(x)) => x.to_le_bytes().to_vec(),
            (ScalarType::F16, ConstValue::Float(x)) => {
                half::f16::from_f64(x).to_bits().to_le_bytes().to_vec()
            }
            (ScalarType::BF16, ConstValue::Float(x)) => {
                half::bf16::from_f64(x).to_bits().to_le_bytes().to_vec()
            }
            _ => return None,
        };
        let ty = tile(&[], TileElementType::Scalar(scalar(s)));
        Some(self.op1(
            Opcode::Constant,
            &[],
            ty.clone(),
            &[(
                "value",
                Attribute::DenseElements(DenseElements {
                    element_type: ty,
                    shape: vec![],
                    data,
                }),
            )],
        ))
    }

    /// `v` (a 0-d tile of element `e`) broadcast to `shape`.
    fn splat(&mut self, v: Value, e: TileElementType, shape: &[u32]) -> Value {
        if shape.is_empty() {
            return v;
        }
        let ones = vec![1; shape.len()];
        let r = self.op1(Opcode::Reshape, &[v], tile(&ones, e.clone()), &[]);
        self.op1(Opcode::Broadcast, &[r], tile(shape, e), &[])
    }

    fn element(&self, v: ValueId) -> TileElementType {
        match &self.ty(v) {
            Type::Tile(t) => t.element_type.clone(),
            _ => unreachable!("values are tiles"),
        }
    }

    fn run(&mut self) -> Result<(), CodegenError> {
        let f = self.f;
        self.assume_facts();
        self.region_ops(&f.body)?;
        Ok(())
    }

    /// The launch's facts about the parameters (what specialization found: a pointer
    /// aligned to 16 bytes, an integer that is a multiple of 16) become Tile IR
    /// assumptions, which let `tileiras` take vector accesses and TMA. They hold by
    /// construction: a specialized kernel only runs on arguments that have them.
    fn assume_facts(&mut self) {
        let f = self.f;
        for p in &f.params {
            let Some(d) = p
                .attrs
                .divisibility
                .filter(|d| d.is_power_of_two() && *d > 1)
            else {
                continue;
            };
            let v = self.val(p.value);
            let ty = self.ty(p.value);
            let assumed = self.op1(
                Opcode::Assume,
                &[v],
                ty,
                &[(
                    "predicate",
                    Attribute::DivBy(cutile_ir::ir::DivBy {
                        divisor: u64::from(d),
                        every: None,
                        along: None,
                    }),
                )],
            );
            self.vals.insert(p.value, assumed);
        }
    }

    /// Lowers the ops of `r` into the current block; returns the values its
    /// terminator (`yield`) passes on.
    fn region_ops(&mut self, r: &Region) -> Result<Vec<Value>, CodegenError> {
        for op in &r.ops {
            if op.kind == OpKind::Yield {
                return Ok(op.operands.iter().map(|&v| self.val(v)).collect());
            }
            self.op(op)?;
        }
        Ok(Vec::new())
    }

    /// Whether `r` (or a region nested in it) accesses memory.
    fn touches_memory(r: &Region) -> bool {
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
    fn for_op(&mut self, op: &Op) -> Result<(), CodegenError> {
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
            let r = self.write_token_of_reads(w);
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

    /// `u` of `x`; f16 and bf16 math runs in f32 and rounds once, as the interpreter's.
    fn unary(
        &mut self,
        op: &Op,
        u: UnaryOp,
        s: ScalarType,
        x: Value,
        r: ValueId,
    ) -> Result<Value, CodegenError> {
        let shape = self.f.ty(r).shape.clone();
        let ty = self.ty(r);
        let nearest = ("rounding_mode", Attribute::i32(0));
        if s.is_int() {
            let wrap = ("overflow", Attribute::i32(0));
            return Ok(match u {
                UnaryOp::Neg => self.op1(Opcode::NegI, &[x], ty, &[wrap]),
                UnaryOp::Not => {
                    let ones = if s == ScalarType::I1 {
                        ConstValue::Bool(true)
                    } else {
                        ConstValue::Int(-1)
                    };
                    let m = self.const_splat(s, ones, &shape);
                    self.op1(Opcode::XOrI, &[x, m], ty, &[])
                }
                UnaryOp::Abs => self.op1(Opcode::AbsI, &[x], ty, &[]),
                _ => {
                    return Err(
                        self.unsupported(op, &format!("on {s} is not lowered to Tile IR yet"))
                    );
                }
            });
        }
        let half = matches!(s, ScalarType::F16 | ScalarType::BF16);
        let work = if half { ScalarType::F32 } else { s };
        let wty = tile(&shape, TileElementType::Scalar(scalar(work)));
        let x = if half {
            self.op1(
                Opcode::FToF,
                &[x],
                wty.clone(),
                std::slice::from_ref(&nearest),
            )
        } else {
            x
        };
        let (code, attrs): (Opcode, Vec<(&str, Attribute)>) = match u {
            UnaryOp::Neg => (Opcode::NegF, vec![]),
            UnaryOp::Abs => (Opcode::AbsF, vec![]),
            UnaryOp::Exp => (Opcode::Exp, vec![]),
            UnaryOp::Exp2 => (Opcode::Exp2, vec![]),
            UnaryOp::Log => (Opcode::Log, vec![]),
            UnaryOp::Log2 => (Opcode::Log2, vec![]),
            UnaryOp::Sqrt => (Opcode::Sqrt, vec![nearest.clone()]),
            UnaryOp::Rsqrt => (Opcode::Rsqrt, vec![]),
            UnaryOp::Sin => (Opcode::Sin, vec![]),
            UnaryOp::Cos => (Opcode::Cos, vec![]),
            UnaryOp::Tanh => (Opcode::TanH, vec![]),
            UnaryOp::Floor => (Opcode::Floor, vec![]),
            UnaryOp::Ceil => (Opcode::Ceil, vec![]),
            _ => {
                return Err(
                    self.unsupported(op, &format!("`{u:?}` on {s} is not lowered to Tile IR yet"))
                );
            }
        };
        let y = self.op1(code, &[x], wty, &attrs);
        Ok(if half {
            self.op1(Opcode::FToF, &[y], ty, &[nearest])
        } else {
            y
        })
    }

    /// `reduce` (`scan: None`) or `scan` (`Some(reverse)`) along `axis`: Tile IR's
    /// op with the combining op in its region and the op's identity. Tile IR fixes no
    /// combining order (as on the SIMT path, float sums may round differently from
    /// the interpreter's sequential order; integer results are exact).
    fn combine(
        &mut self,
        op: &Op,
        axis: u32,
        rop: ReduceOp,
        scan: Option<bool>,
        r: ValueId,
    ) -> Result<Value, CodegenError> {
        let s = self
            .f
            .ty(r)
            .scalar_type()
            .ok_or_else(|| self.unsupported(op, "of pointers"))?;
        if matches!(
            s,
            ScalarType::F16 | ScalarType::BF16 | ScalarType::F8E4M3 | ScalarType::F8E5M2
        ) || s == ScalarType::I1
        {
            return Err(self.unsupported(op, &format!("of {s} is not lowered to Tile IR yet")));
        }
        let ts = scalar(s);
        let bits = s.bits();
        let identity = if s.is_float() {
            let v = match rop {
                ReduceOp::Sum => 0.0,
                ReduceOp::Prod => 1.0,
                ReduceOp::Max => f64::NEG_INFINITY,
                ReduceOp::Min => f64::INFINITY,
                _ => return Err(self.unsupported(op, &format!("`{rop:?}` on {s}"))),
            };
            Attribute::float(v, ts)
        } else {
            let signed = s.is_signed_int();
            let v: i64 = match rop {
                ReduceOp::Sum | ReduceOp::Or | ReduceOp::Xor => 0,
                ReduceOp::Prod => 1,
                ReduceOp::And => -1,
                ReduceOp::Max if signed => -(1i64 << (bits - 1).min(63)),
                ReduceOp::Max => 0,
                ReduceOp::Min if signed => ((1u64 << (bits - 1).min(63)) - 1) as i64,
                ReduceOp::Min => -1,
            };
            // Integer attributes are the value's bits at the element's width.
            let bits = if bits >= 64 {
                v
            } else {
                ((v as u64) & ((1u64 << bits) - 1)) as i64
            };
            Attribute::int(bits, ts)
        };
        let elem = tile(&[], TileElementType::Scalar(ts));
        let (region, blk, args) =
            build_single_block_region(&mut self.m, &[elem.clone(), elem.clone()]);
        let outer = std::mem::replace(&mut self.blk, blk);
        let sign = ("signedness", Attribute::i32(i64::from(s.is_signed_int())));
        let nan = ("propagate_nan", Attribute::Bool(true));
        let wrap = ("overflow", Attribute::i32(0));
        let nearest = ("rounding_mode", Attribute::i32(0));
        let (code, attrs): (Opcode, Vec<(&str, Attribute)>) = match (rop, s.is_float()) {
            (ReduceOp::Sum, true) => (Opcode::AddF, vec![nearest]),
            (ReduceOp::Prod, true) => (Opcode::MulF, vec![nearest]),
            (ReduceOp::Max, true) => (Opcode::MaxF, vec![nan]),
            (ReduceOp::Min, true) => (Opcode::MinF, vec![nan]),
            (ReduceOp::Sum, false) => (Opcode::AddI, vec![wrap]),
            (ReduceOp::Prod, false) => (Opcode::MulI, vec![wrap]),
            (ReduceOp::Max, false) => (Opcode::MaxI, vec![sign]),
            (ReduceOp::Min, false) => (Opcode::MinI, vec![sign]),
            (ReduceOp::And, false) => (Opcode::AndI, vec![]),
            (ReduceOp::Or, false) => (Opcode::OrI, vec![]),
            (ReduceOp::Xor, false) => (Opcode::XOrI, vec![]),
            _ => unreachable!("float bitwise reductions were refused above"),
        };
        let c = self.op1(code, &[args[0], args[1]], elem, &attrs);
        self.emit(OpBuilder::new(Opcode::Yield, Location::Unknown).operand(c));
        self.blk = outer;
        let x = self.val(op.operands[0]);
        let ty = self.ty(r);
        let mut b = OpBuilder::new(
            if scan.is_some() {
                Opcode::Scan
            } else {
                Opcode::Reduce
            },
            Location::Unknown,
        )
        .operand(x)
        .result(ty)
        .attr("dim", Attribute::i32(i64::from(axis)));
        if let Some(reverse) = scan {
            b = b.attr("reverse", Attribute::Bool(reverse));
        }
        Ok(self.emit(
            b.attr("identities", Attribute::Array(vec![identity]))
                .region(region),
        )[0])
    }

    /// Float `x` to integer type `to` as Rust's `as` (the interpreter's cast):
    /// truncation towards zero, saturating at the type's bounds, NaN to 0. Tile IR's
    /// `ftoi` only ever sees values in range.
    fn float_to_int(
        &mut self,
        x: Value,
        from: ScalarType,
        to: ScalarType,
        shape: &[u32],
        ty: Type,
    ) -> Value {
        let bits = to.bits();
        let signed = to.is_signed_int();
        // Powers of two: exact in every float type (or infinite, which still orders).
        let (lo, hi) = if signed {
            (-(2f64.powi(bits as i32 - 1)), 2f64.powi(bits as i32 - 1))
        } else {
            (0.0, 2f64.powi(bits as i32))
        };
        let (min, max): (i64, i64) = if signed {
            (i64::MIN >> (64 - bits), i64::MAX >> (64 - bits))
        } else {
            (
                0,
                if bits >= 64 {
                    -1
                } else {
                    ((1u64 << bits) - 1) as i64
                },
            )
        };
        let bty = tile(shape, TileElementType::Scalar(TScalar::I1));
        let fty = self.ty_of(from, shape);
        let cmp = |l: &mut Self, a: Value, b: Value, pred: i64, ordered: i64| {
            l.op1(
                Opcode::CmpF,
                &[a, b],
                bty.clone(),
                &[
                    ("comparison_predicate", Attribute::i32(pred)),
                    ("comparison_ordering", Attribute::i32(ordered)),
                ],
            )
        };
        let hi_v = self.const_splat(from, ConstValue::Float(hi), shape);
        let lo_v = self.const_splat(from, ConstValue::Float(lo), shape);
        let zero_f = self.const_splat(from, ConstValue::Float(0.0), shape);
        let too_big = cmp(self, x, hi_v, 5, 1);
        let too_small = cmp(self, x, lo_v, 3, 1);
        let nan = cmp(self, x, x, 1, 0);
        let out = self.op1(Opcode::OrI, &[too_big, too_small], bty.clone(), &[]);
        let out = self.op1(Opcode::OrI, &[out, nan], bty, &[]);
        let safe = self.op1(Opcode::Select, &[out, zero_f, x], fty, &[]);
        let t = self.op1(
            Opcode::FToI,
            &[safe],
            ty.clone(),
            &[
                ("signedness", Attribute::i32(i64::from(signed))),
                // `nearest_int_to_zero`, the only mode `ftoi` has: truncation.
                ("rounding_mode", Attribute::i32(6)),
            ],
        );
        let min_v = self.const_splat(to, ConstValue::Int(min), shape);
        let max_v = self.const_splat(to, ConstValue::Int(max), shape);
        let zero = self.const_splat(to, ConstValue::Int(0), shape);
        let v = self.op1(Opcode::Select, &[too_small, min_v, t], ty.clone(), &[]);
        let v = self.op1(Opcode::Select, &[too_big, max_v, v], ty.clone(), &[]);
        self.op1(Opcode::Select, &[nan, zero, v], ty, &[])
    }

    /// The Tile IR type of a tile of `s` with `shape`.
    fn ty_of(&self, s: ScalarType, shape: &[u32]) -> Type {
        tile(shape, TileElementType::Scalar(scalar(s)))
    }

    /// A constant of scalar type `s` splat to `shape`.
    fn const_splat(&mut self, s: ScalarType, c: ConstValue, shape: &[u32]) -> Value {
        let v = self
            .scalar_const(s, c)
            .expect("constants of integer and float element types are representable");
        self.splat(v, TileElementType::Scalar(scalar(s)), shape)
    }

    /// Integer `a / c` or `a % c` as the SIMT lowering computes them: division by zero
    /// gives 0 (the interpreter reports it; GPUs cannot), `MIN / -1` wraps and
    /// `MIN % -1` is 0, so Tile IR never sees a divisor it leaves undefined.
    fn int_div(
        &mut self,
        b: BinaryOp,
        s: ScalarType,
        a: Value,
        c: Value,
        shape: &[u32],
        ty: Type,
    ) -> Value {
        let signed = s.is_signed_int();
        let bty = tile(shape, TileElementType::Scalar(TScalar::I1));
        let zero = self.const_splat(s, ConstValue::Int(0), shape);
        let one = self.const_splat(s, ConstValue::Int(1), shape);
        let cmp = |l: &mut Self, x: Value, y: Value| {
            l.op1(
                Opcode::CmpI,
                &[x, y],
                bty.clone(),
                &[
                    ("comparison_predicate", Attribute::i32(0)),
                    ("signedness", Attribute::i32(i64::from(signed))),
                ],
            )
        };
        let is0 = cmp(self, c, zero);
        let m1 = if signed {
            let all = self.const_splat(s, ConstValue::Int(-1), shape);
            Some(cmp(self, c, all))
        } else {
            None
        };
        let bad = match m1 {
            Some(m1) => self.op1(Opcode::OrI, &[is0, m1], bty.clone(), &[]),
            None => is0,
        };
        let safe = self.op1(Opcode::Select, &[bad, one, c], ty.clone(), &[]);
        let sign = ("signedness", Attribute::i32(i64::from(signed)));
        let q = if b == BinaryOp::Div {
            // Rounding towards zero, as Rust's and the hardware's.
            self.op1(
                Opcode::DivI,
                &[a, safe],
                ty.clone(),
                &[sign, ("rounding", Attribute::i32(1))],
            )
        } else {
            self.op1(Opcode::RemI, &[a, safe], ty.clone(), &[sign])
        };
        let q = match m1 {
            Some(m1) => {
                let alt = if b == BinaryOp::Div {
                    self.op1(
                        Opcode::SubI,
                        &[zero, a],
                        ty.clone(),
                        &[("overflow", Attribute::i32(0))],
                    )
                } else {
                    zero
                };
                self.op1(Opcode::Select, &[m1, alt, q], ty.clone(), &[])
            }
            None => q,
        };
        self.op1(Opcode::Select, &[is0, zero, q], ty, &[])
    }

    /// `if cond`: Tile IR's `if`, each region ending in `yield`. When a region accesses
    /// memory, both yield the two tokens too (each starting from the state before
    /// the `if`), so accesses after the `if` wait for the branch that ran.
    fn if_op(&mut self, op: &Op) -> Result<(), CodegenError> {
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

    /// `desc_load` (`result` given) or `desc_store` as an access to a partition view of
    /// a tensor view, which is what lets `tileiras` choose TMA. A partition view
    /// indexes whole blocks, so each block coordinate must be provably a multiple of
    /// the block's extent (the axis analysis's divisibility); and its indices must
    /// lie inside the tensor, so the access is guarded by `0 <= coord < extent` in
    /// every dimension: outside, a load gives zeros and a store writes nothing, as
    /// the descriptor's semantics say. Elements of a block past the tensor's end read
    /// zero (the view's padding) and are not written.
    fn desc_access(
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
                let w = self.read_token();
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
                self.reads.push(out[1]);
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
    fn join(&mut self, tokens: Vec<Value>, w: Value) -> Value {
        match tokens[..] {
            [] => w,
            [t] => t,
            _ => self.op1(Opcode::JoinTokens, &tokens, Type::Token, &[]),
        }
    }

    /// The join of the loads since the last store (`w`, that store's token, when
    /// there are none).
    fn write_token_of_reads(&mut self, w: Value) -> Value {
        let reads = std::mem::take(&mut self.reads);
        self.join(reads, w)
    }

    fn op(&mut self, op: &Op) -> Result<(), CodegenError> {
        let res = op.results.first().copied();
        let v = match &op.kind {
            OpKind::ProgramId { axis } => self.block_id(u32::from(*axis), false),
            OpKind::NumPrograms { axis } => self.block_id(u32::from(*axis), true),
            OpKind::Const(c) => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let t = self.f.ty(r);
                let Elem::Scalar(s) = t.elem else {
                    return Err(self.unsupported(op, "of a pointer"));
                };
                let c0 = self
                    .scalar_const(s, *c)
                    .ok_or_else(|| self.unsupported(op, &format!("of {s} value {c:?}")))?;
                let shape = t.shape.clone();
                self.splat(c0, TileElementType::Scalar(scalar(s)), &shape)
            }
            OpKind::Arange { start, end } => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let n = end - start;
                let ty = self.ty(r);
                let iota = self.op1(Opcode::Iota, &[], ty.clone(), &[]);
                if *start == 0 {
                    iota
                } else {
                    let s = self
                        .scalar_const(ScalarType::I32, ConstValue::Int(*start))
                        .ok_or_else(|| self.unsupported(op, "with this start"))?;
                    let s = self.splat(s, TileElementType::Scalar(TScalar::I32), &[n as u32]);
                    self.op1(
                        Opcode::AddI,
                        &[iota, s],
                        ty,
                        &[("overflow", Attribute::i32(0))],
                    )
                }
            }
            OpKind::Splat => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let e = self.element(r);
                let shape = self.f.ty(r).shape.clone();
                let x = self.val(op.operands[0]);
                self.splat(x, e, &shape)
            }
            OpKind::ExpandDims { .. } | OpKind::Reshape => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let ty = self.ty(r);
                let x = self.val(op.operands[0]);
                self.op1(Opcode::Reshape, &[x], ty, &[])
            }
            OpKind::Broadcast => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let ty = self.ty(r);
                let x = self.val(op.operands[0]);
                if self.f.ty(op.operands[0]).shape == self.f.ty(r).shape {
                    x
                } else {
                    self.op1(Opcode::Broadcast, &[x], ty, &[])
                }
            }
            OpKind::Binary(b) => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let ty = self.ty(r);
                let s = self
                    .f
                    .ty(op.operands[0])
                    .scalar_type()
                    .ok_or_else(|| self.unsupported(op, "on pointers"))?;
                let (a, c) = (self.val(op.operands[0]), self.val(op.operands[1]));
                let wrap = ("overflow", Attribute::i32(0));
                let nearest = ("rounding_mode", Attribute::i32(0));
                let sign = ("signedness", Attribute::i32(i64::from(s.is_signed_int())));
                let shape = self.f.ty(r).shape.clone();
                if !s.is_float() && matches!(b, BinaryOp::Div | BinaryOp::Rem) {
                    let v = self.int_div(*b, s, a, c, &shape, ty);
                    self.vals.insert(r, v);
                    return Ok(());
                }
                if !s.is_float() && matches!(b, BinaryOp::Shl | BinaryOp::Shr) {
                    // The amount wraps at the width, as Rust's `wrapping_shl` does.
                    let mask =
                        self.const_splat(s, ConstValue::Int(i64::from(s.bits()) - 1), &shape);
                    let amt = self.op1(Opcode::AndI, &[c, mask], ty.clone(), &[]);
                    let v = if *b == BinaryOp::Shl {
                        self.op1(Opcode::ShLI, &[a, amt], ty, &[wrap])
                    } else {
                        self.op1(Opcode::ShRI, &[a, amt], ty, &[sign])
                    };
                    self.vals.insert(r, v);
                    return Ok(());
                }
                let (code, attrs): (Opcode, Vec<(&str, Attribute)>) = match (b, s.is_float()) {
                    (BinaryOp::Add, false) => (Opcode::AddI, vec![wrap]),
                    (BinaryOp::Sub, false) => (Opcode::SubI, vec![wrap]),
                    (BinaryOp::Mul, false) => (Opcode::MulI, vec![wrap]),
                    (BinaryOp::Add, true) => (Opcode::AddF, vec![nearest]),
                    (BinaryOp::Sub, true) => (Opcode::SubF, vec![nearest]),
                    (BinaryOp::Mul, true) => (Opcode::MulF, vec![nearest]),
                    (BinaryOp::Div, true) => (Opcode::DivF, vec![nearest]),
                    (BinaryOp::And, false) => (Opcode::AndI, vec![]),
                    (BinaryOp::Or, false) => (Opcode::OrI, vec![]),
                    (BinaryOp::Xor, false) => (Opcode::XOrI, vec![]),
                    (BinaryOp::Max, false) => (Opcode::MaxI, vec![sign]),
                    (BinaryOp::Min, false) => (Opcode::MinI, vec![sign]),
                    // NaN-propagating, as the interpreter's.
                    (BinaryOp::Max, true) => {
                        (Opcode::MaxF, vec![("propagate_nan", Attribute::Bool(true))])
                    }
                    (BinaryOp::Min, true) => {
                        (Opcode::MinF, vec![("propagate_nan", Attribute::Bool(true))])
                    }
                    _ => {
                        return Err(
                            self.unsupported(op, &format!("on {s} is not lowered to Tile IR yet"))
                        );
                    }
                };
                self.op1(code, &[a, c], ty, &attrs)
            }
            OpKind::Cmp(p) => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let ty = self.ty(r);
                let s = self
                    .f
                    .ty(op.operands[0])
                    .scalar_type()
                    .ok_or_else(|| self.unsupported(op, "of pointers"))?;
                let pred = match p {
                    CmpPred::Eq => 0,
                    CmpPred::Ne => 1,
                    CmpPred::Lt => 2,
                    CmpPred::Le => 3,
                    CmpPred::Gt => 4,
                    CmpPred::Ge => 5,
                };
                let (a, c) = (self.val(op.operands[0]), self.val(op.operands[1]));
                let pred = ("comparison_predicate", Attribute::i32(pred));
                if s.is_float() {
                    // Ordered except `ne`: NaN compares unequal to everything.
                    let ordering = i64::from(*p != CmpPred::Ne);
                    self.op1(
                        Opcode::CmpF,
                        &[a, c],
                        ty,
                        &[pred, ("comparison_ordering", Attribute::i32(ordering))],
                    )
                } else {
                    // i1 compares as unsigned (true > false).
                    let signed = s.is_signed_int() && s != ScalarType::I1;
                    self.op1(
                        Opcode::CmpI,
                        &[a, c],
                        ty,
                        &[pred, ("signedness", Attribute::i32(i64::from(signed)))],
                    )
                }
            }
            OpKind::Select => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let ty = self.ty(r);
                let ops: Vec<Value> = op.operands.iter().map(|&o| self.val(o)).collect();
                self.op1(Opcode::Select, &ops, ty, &[])
            }
            OpKind::AddPtr => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let ty = self.ty(r);
                let (p, o) = (self.val(op.operands[0]), self.val(op.operands[1]));
                self.op1(Opcode::Offset, &[p, o], ty, &[])
            }
            OpKind::Load {
                has_mask,
                has_other,
                ..
            } => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                if let Elem::Ptr {
                    space: AddrSpace::Shared,
                    ..
                } = self.f.ty(op.operands[0]).elem
                {
                    return Err(self.unsupported(op, "from block-local memory"));
                }
                let ty = self.ty(r);
                let ptr = self.val(op.operands[0]);
                let mask = has_mask.then(|| self.val(op.operands[1]));
                let other = has_other.then(|| self.val(op.operands[2]));
                let tok = self.read_token();
                let out = self.grouped(
                    Opcode::LoadPtrTko,
                    &[Some(ptr), mask, other, Some(tok)],
                    vec![ty, Type::Token],
                    &[("memory_ordering_semantics", Attribute::i32(0))],
                );
                self.reads.push(out[1]);
                out[0]
            }
            OpKind::Store { has_mask, .. } => {
                if let Elem::Ptr {
                    space: AddrSpace::Shared,
                    ..
                } = self.f.ty(op.operands[0]).elem
                {
                    return Err(self.unsupported(op, "to block-local memory"));
                }
                let ptr = self.val(op.operands[0]);
                let value = self.val(op.operands[1]);
                let mask = has_mask.then(|| self.val(op.operands[2]));
                let tok = self.write_token();
                let out = self.grouped(
                    Opcode::StorePtrTko,
                    &[Some(ptr), Some(value), mask, Some(tok)],
                    vec![Type::Token],
                    &[("memory_ordering_semantics", Attribute::i32(0))],
                );
                self.last_write = Some(out[0]);
                return Ok(());
            }
            OpKind::AtomicRmw {
                op: aop,
                order,
                scope,
                has_mask,
            } => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let s = self
                    .f
                    .ty(r)
                    .scalar_type()
                    .ok_or_else(|| self.unsupported(op, "of pointers"))?;
                let mode = match (aop, s.is_float(), s.is_signed_int()) {
                    (AtomicOp::And, false, _) => 0,
                    (AtomicOp::Or, false, _) => 1,
                    (AtomicOp::Xor, false, _) => 2,
                    (AtomicOp::Add, false, _) => 3,
                    (AtomicOp::Add, true, _) if s == ScalarType::F32 || s == ScalarType::F64 => 4,
                    (AtomicOp::Max, false, true) => 5,
                    (AtomicOp::Min, false, true) => 6,
                    (AtomicOp::Max, false, false) => 7,
                    (AtomicOp::Min, false, false) => 8,
                    (AtomicOp::Xchg, _, _) => 9,
                    _ => {
                        return Err(self.unsupported(
                            op,
                            &format!("`{}` on {s} is not lowered to Tile IR yet", aop.name()),
                        ));
                    }
                };
                let ty = self.ty(r);
                let ptr = self.val(op.operands[0]);
                let value = self.val(op.operands[1]);
                let mask = has_mask.then(|| self.val(op.operands[2]));
                // An atomic reads and writes: it waits for every earlier access.
                let tok = self.write_token();
                let out = self.grouped(
                    Opcode::AtomicRMW,
                    &[Some(ptr), Some(value), mask, Some(tok)],
                    vec![ty, Type::Token],
                    &[
                        (
                            "memory_ordering_semantics",
                            Attribute::i32(ordering(*order)),
                        ),
                        ("memory_scope", Attribute::i32(memory_scope(*scope))),
                        ("mode", Attribute::i32(mode)),
                    ],
                );
                self.last_write = Some(out[1]);
                out[0]
            }
            OpKind::DescLoad { rank, has_pred } => {
                if *has_pred {
                    return Err(self.unsupported(op, "with a predicate (from the SIMT pipeliner)"));
                }
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                return self.desc_access(op, usize::from(*rank), Some(r));
            }
            OpKind::DescStore { rank } => {
                return self.desc_access(op, usize::from(*rank), None);
            }
            OpKind::Fma => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let s = self
                    .f
                    .ty(r)
                    .scalar_type()
                    .ok_or_else(|| self.unsupported(op, "on pointers"))?;
                if !s.is_float() {
                    return Err(
                        self.unsupported(op, &format!("on {s} is not lowered to Tile IR yet"))
                    );
                }
                let ty = self.ty(r);
                let ops: Vec<Value> = op.operands.iter().map(|&o| self.val(o)).collect();
                // One rounding, to nearest even: a fused multiply-add.
                self.op1(
                    Opcode::Fma,
                    &ops,
                    ty,
                    &[("rounding_mode", Attribute::i32(0))],
                )
            }
            OpKind::For => return self.for_op(op),
            OpKind::If => return self.if_op(op),
            OpKind::Unary(u) => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let s = self
                    .f
                    .ty(r)
                    .scalar_type()
                    .ok_or_else(|| self.unsupported(op, "on pointers"))?;
                let x = self.val(op.operands[0]);
                self.unary(op, *u, s, x, r)?
            }
            OpKind::Reduce { axis, op: rop } => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                self.combine(op, u32::from(*axis), *rop, None, r)?
            }
            OpKind::Scan {
                axis,
                op: rop,
                reverse,
            } => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                self.combine(op, u32::from(*axis), *rop, Some(*reverse), r)?
            }
            OpKind::Bitcast => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let ty = self.ty(r);
                let x = self.val(op.operands[0]);
                self.op1(Opcode::Bitcast, &[x], ty, &[])
            }
            OpKind::Dot => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let ty = self.ty(r);
                let (a, b, c) = (
                    self.val(op.operands[0]),
                    self.val(op.operands[1]),
                    self.val(op.operands[2]),
                );
                let input = self.f.ty(op.operands[0]).scalar_type();
                let acc = self.f.ty(r).scalar_type();
                match (input, acc) {
                    (
                        Some(
                            ScalarType::F16
                            | ScalarType::BF16
                            | ScalarType::F8E4M3
                            | ScalarType::F8E5M2,
                        ),
                        Some(ScalarType::F32),
                    ) => self.op1(Opcode::MmaF, &[a, b, c], ty, &[]),
                    // f32 and f64 products are full precision (Tile IR's `tf32` is a type
                    // of its own); like the SIMT matrix path, the accumulation order
                    // is the hardware's, not the interpreter's increasing `k`.
                    (Some(ScalarType::F32), Some(ScalarType::F32))
                    | (Some(ScalarType::F64), Some(ScalarType::F64)) => {
                        self.op1(Opcode::MmaF, &[a, b, c], ty, &[])
                    }
                    (Some(i @ (ScalarType::I8 | ScalarType::U8)), Some(ScalarType::I32)) => {
                        let sign = Attribute::i32(i64::from(i == ScalarType::I8));
                        self.op1(
                            Opcode::MmaI,
                            &[a, b, c],
                            ty,
                            &[("signedness_lhs", sign.clone()), ("signedness_rhs", sign)],
                        )
                    }
                    (i, a) => {
                        let name =
                            |t: Option<ScalarType>| t.map_or("pointers".into(), |t| t.to_string());
                        return Err(self.unsupported(
                            op,
                            &format!(
                                "of {} into {} is not lowered to Tile IR yet",
                                name(i),
                                name(a)
                            ),
                        ));
                    }
                }
            }
            OpKind::Cast => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let ty = self.ty(r);
                let x = self.val(op.operands[0]);
                let (Some(from), Some(to)) = (
                    self.f.ty(op.operands[0]).scalar_type(),
                    self.f.ty(r).scalar_type(),
                ) else {
                    return Err(self.unsupported(op, "of pointers"));
                };
                let nearest = ("rounding_mode", Attribute::i32(0));
                let signed = (
                    "signedness",
                    Attribute::i32(i64::from(from.is_signed_int())),
                );
                let fp8 = |t: ScalarType| matches!(t, ScalarType::F8E4M3 | ScalarType::F8E5M2);
                if from == to {
                    x
                } else if fp8(to) && from.is_float() && !fp8(from) {
                    // Round to nearest even, saturating to the largest finite value
                    // and NaN to NaN (`satfinite`, the interpreter's conversion): the
                    // clamp first (NaN-propagating), so the conversion never overflows.
                    let max = if to == ScalarType::F8E4M3 {
                        448.0
                    } else {
                        57344.0
                    };
                    let shape = self.f.ty(r).shape.clone();
                    let src = self.ty(op.operands[0]);
                    let hi = self.const_splat(from, ConstValue::Float(max), &shape);
                    let lo = self.const_splat(from, ConstValue::Float(-max), &shape);
                    let nan = ("propagate_nan", Attribute::Bool(true));
                    let c = self.op1(
                        Opcode::MinF,
                        &[x, hi],
                        src.clone(),
                        std::slice::from_ref(&nan),
                    );
                    let c = self.op1(Opcode::MaxF, &[c, lo], src, &[nan]);
                    self.op1(Opcode::FToF, &[c], ty, &[nearest])
                } else if to == ScalarType::I1 && (from.is_int() || from.is_float()) {
                    // Nonzero (NaN included) is true.
                    let shape = self.f.ty(r).shape.clone();
                    if from.is_float() {
                        let z = self.const_splat(from, ConstValue::Float(0.0), &shape);
                        self.op1(
                            Opcode::CmpF,
                            &[x, z],
                            ty,
                            &[
                                ("comparison_predicate", Attribute::i32(1)),
                                ("comparison_ordering", Attribute::i32(0)),
                            ],
                        )
                    } else {
                        let z = self.const_splat(from, ConstValue::Int(0), &shape);
                        self.op1(
                            Opcode::CmpI,
                            &[x, z],
                            ty,
                            &[
                                ("comparison_predicate", Attribute::i32(1)),
                                ("signedness", Attribute::i32(0)),
                            ],
                        )
                    }
                } else if from.is_float() && to.is_int() {
                    let shape = self.f.ty(r).shape.clone();
                    self.float_to_int(x, from, to, &shape, ty)
                } else if (from.is_float() || fp8(from)) && (to.is_float() || fp8(to)) {
                    self.op1(Opcode::FToF, &[x], ty, &[nearest])
                } else if from.is_int() && to.is_float() {
                    // (`i1` is unsigned: true is 1.)
                    self.op1(Opcode::IToF, &[x], ty, &[signed, nearest])
                } else if from.is_int() && to.is_int() {
                    if to.bits() > from.bits() {
                        self.op1(Opcode::ExtI, &[x], ty, &[signed])
                    } else if to.bits() < from.bits() {
                        self.op1(Opcode::TruncI, &[x], ty, &[("overflow", Attribute::i32(0))])
                    } else {
                        x
                    }
                } else {
                    return Err(self.unsupported(
                        op,
                        &format!("from {from} to {to} is not lowered to Tile IR yet"),
                    ));
                }
            }
            _ => return Err(self.unsupported(op, "is not lowered to Tile IR yet")),
        };
        if let Some(r) = res {
            self.vals.insert(r, v);
        }
        Ok(())
    }
}
