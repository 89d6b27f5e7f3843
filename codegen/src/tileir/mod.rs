//! Tile IR: a second NVIDIA backend, through NVIDIA's own tile compiler.
//!
//! Tessera's tile IR is lowered to NVIDIA's CUDA Tile IR (the `cuda_tile` dialect),
//! written as its versioned bytecode (through the `cutile-ir` crate) and compiled by
//! `tileiras` into a cubin for sm_80 to sm_121, Blackwell included, where NVIDIA's
//! compiler chooses the tensor cores, TMA and the pipelining. No GPU is needed to
//! compile; `tileirdisasm` reads the bytecode back ([`crate::tools::tileirdisasm`]).
//!
//! **What is lowered:** every op of the tile IR but f16/bf16 atomic `max`/`min` and
//! the SIMT pipeliner's predicated descriptor loads (never in a user's kernel):
//! program ids and counts, constants, `arange`, `splat`, `expand_dims`, `reshape`,
//! `permute`, `broadcast`, hints (as the value), integer and float arithmetic,
//! comparisons, `select`, `addptr`, loads and stores through pointer tiles with their
//! masks and `other` values, `for`, `if` and `while` (a `loop`), `dot` (f16, bf16 and
//! the 8-bit floats into f32, f32 and f64; i8 into i32), `dot_scaled` (`mmaf_scaled`,
//! sm_100 and later), `fma`, casts (float to integer saturating with NaN to 0, to `i1`
//! as "nonzero", to the 8-bit floats saturating), the float math functions (f16 and
//! bf16 computed in f32; `erf` by the SIMT path's formula), `popc` and `clz` (spelled
//! out in shifts), reductions and scans, bitcasts, atomics (f32/f64 `max`/`min` as a
//! compare-and-swap loop) and compare-and-swap with their ordering and scope,
//! block-local memory (`alloca`: a program is one tile thread, so `barrier` orders
//! nothing the tokens do not), tensor descriptors (as partition views of tensor views)
//! and communication (`comm.rs`). `device_print` and `device_assert` reach every
//! backend as stores ([`tessera_ir::debug`]). Every other op, and an op `tileiras`
//! refuses for the GPU asked (`dot_scaled` before sm_100, bf16 atomic adds before
//! sm_90), is a [`CodegenError::TileIr`] naming the op and its place in the user's
//! source: nothing is dropped or approximated.
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
//! here is ordered against every earlier access it could conflict with: a load waits
//! for the last store's token, and a store for the join of the last store's and every
//! load's since (`join_tokens`). So reads after writes, writes after reads and writes
//! after writes keep program order; loads are free among themselves. The one alias
//! fact used: a load from `readonly` parameters' buffers only (`&Global`), in a
//! kernel that does not communicate, reads memory nothing in the kernel writes, so
//! it is ordered against nothing (a fresh token, not joined into a store's). Atomics
//! are ordered like stores, with their own memory ordering and scope; a wait's
//! acquire orders every later access, reads included (`comm.rs`).
//!
//! **Files.** This file holds the entry points, the lowerer and the op dispatch;
//! `memory.rs` the tokens and the descriptor views; `control.rs` regions, `for`, `if`
//! and `while`; `comm.rs` communication; `arith.rs` the element semantics that need
//! spelling out (half-float math, reductions and scans, float-to-integer casts,
//! integer division, `popc`, `clz`, `erf`, `dot_scaled`'s operands).
//!
//! **Versions.** [`compile`] writes the newest bytecode version that both this backend
//! ([`versions`]: `cutile-ir`'s from 13.3 on) and the `tileiras` found
//! (`--list-versions`) know ([`negotiate`]); the cubin then runs on any driver from
//! CUDA 13.0 (r580, [`MIN_DRIVER`]).
//!
//! **Launch convention:** one tile block per program (the grid is the tile-block
//! grid), a block of (1, 1, 1); the kernel's parameters in order, pointers as
//! `tile<ptr<T>>` and scalars as 0-d tiles, then for a communicating kernel the
//! hidden parameters of [`crate::comm`] (as the SIMT path's).

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
use tessera_ir::{Elem, Function, ScalarType, Span, ValueId};

use crate::CodegenError;
use memory::{memory_scope, ordering};

mod arith;
mod comm;
mod control;
mod memory;

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

/// The bytecode version this backend writes when no `tileiras` is asked: 13.3, the
/// oldest with every op the lowering emits, read by `tileiras` 13.3 and later.
pub const DEFAULT_VERSION: BytecodeVersion = BytecodeVersion::V13_3;

/// The bytecode versions this backend writes, oldest first: those `cutile-ir` writes
/// from [`DEFAULT_VERSION`] on.
pub fn versions() -> impl Iterator<Item = BytecodeVersion> {
    BytecodeVersion::SUPPORTED
        .into_iter()
        .filter(|v| (v.major, v.minor) >= (DEFAULT_VERSION.major, DEFAULT_VERSION.minor))
}

/// The version to write for a `tileiras` that reads `listed` (its `--list-versions`):
/// the newest this backend writes that it reads; `None` when there is none (a
/// `tileiras` older than 13.3).
///
/// The driver is not part of the choice: it loads the cubin `tileiras` makes, never
/// the bytecode, and runs a cubin of any 13.x `tileiras` from CUDA 13.0 (r580) on
/// ([`MIN_DRIVER`]).
pub fn negotiate(listed: &[(u32, u32)]) -> Option<BytecodeVersion> {
    versions()
        .filter(|v| listed.contains(&(u32::from(v.major), u32::from(v.minor))))
        .last()
}

/// The oldest CUDA driver (its API version, major and minor, as `cuDriverGetVersion`
/// reports it) that loads the cubins of `tileiras` 13.x: CUDA 13.0, driver r580.
pub const MIN_DRIVER: (u32, u32) = (13, 0);

/// The GPU names `tileiras` compiles for, by compute capability.
pub const GPUS: [&str; 12] = [
    "sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100", "sm_103", "sm_107", "sm_110",
    "sm_120", "sm_121",
];

/// The `tileiras` GPU name of compute capability `major.minor` (`sm_90` for 9.0,
/// `sm_100` for 10.0), if `tileiras` compiles for it.
pub fn gpu_name(major: u32, minor: u32) -> Option<&'static str> {
    let name = format!("sm_{major}{minor}");
    GPUS.into_iter().find(|g| *g == name)
}

/// Lowers `func` to Tile IR bytecode of `version` ([`DEFAULT_VERSION`] or what
/// [`negotiate`] chose).
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

/// The bytecode version for the `tileiras` that [`crate::tools::find_tileiras`] finds
/// ([`negotiate`] with its `--list-versions`), asked once per `tileiras` path.
pub fn bytecode_version() -> Result<BytecodeVersion, CodegenError> {
    use std::sync::Mutex;
    static CHOSEN: Mutex<Vec<(std::path::PathBuf, BytecodeVersion)>> = Mutex::new(Vec::new());
    let tool = crate::tools::find_tileiras()?;
    if let Some((_, v)) = CHOSEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(p, _)| *p == tool)
    {
        return Ok(*v);
    }
    let listed = crate::tools::tileiras_versions()?;
    let v = negotiate(&listed).ok_or_else(|| CodegenError::Tool {
        tool: "tileiras".into(),
        message: format!(
            "{} reads Tile IR bytecode {}, Tessera writes {}: install tileiras 13.3 or newer (`bash scripts/setup.sh`)",
            tool.display(),
            listed.iter().map(|(a, b)| format!("{a}.{b}")).collect::<Vec<_>>().join(", "),
            versions().map(|v| v.to_string()).collect::<Vec<_>>().join(", "),
        ),
    })?;
    CHOSEN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((tool, v));
    Ok(v)
}

/// Lowers `func` and compiles it with `tileiras` for `gpu` (`sm_80` .. `sm_121`), in
/// the bytecode version [`bytecode_version`] negotiates.
pub fn compile(func: &Function, gpu: &str) -> Result<TileIrArtifact, CodegenError> {
    compile_version(func, gpu, bytecode_version()?)
}

/// [`compile`] in bytecode `version`.
pub fn compile_version(
    func: &Function,
    gpu: &str,
    version: BytecodeVersion,
) -> Result<TileIrArtifact, CodegenError> {
    if !GPUS.contains(&gpu) {
        return Err(CodegenError::TileIr {
            kernel: func.name.clone(),
            span: func.span.clone(),
            message: format!(
                "`{gpu}` is not a Tile IR target (expected one of {})",
                GPUS.join(", ")
            ),
        });
    }
    // What `tileiras` refuses for older GPUs, as an error at the op: block-scaled
    // products need Blackwell's instructions (and its 4-bit and E8M0 types), bf16
    // atomic adds Hopper's.
    let sm: u32 = gpu.trim_start_matches("sm_").parse().unwrap_or(0);
    let mut refused: Option<(Span, &str)> = None;
    func.walk(&mut |op| {
        if refused.is_some() {
            return;
        }
        let bf16 = op
            .results
            .first()
            .is_some_and(|&r| func.ty(r).scalar_type() == Some(ScalarType::BF16));
        refused = match op.kind {
            OpKind::DotScaled { .. } if sm < 100 => Some((
                op.span.clone(),
                "`dot_scaled` needs sm_100 or later on the Tile IR backend (the LLVM backend computes it on every target, by conversion to f32)",
            )),
            OpKind::AtomicRmw {
                op: AtomicOp::Add, ..
            } if bf16 && sm < 90 => Some((
                op.span.clone(),
                "a bf16 atomic `add` needs sm_90 or later on the Tile IR backend",
            )),
            _ => None,
        };
    });
    if let Some((span, why)) = refused {
        return Err(CodegenError::TileIr {
            kernel: func.name.clone(),
            span,
            message: format!("{why}, not {gpu}"),
        });
    }
    let kernel = lower(func, version)?;
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
    /// Per value: a pointer into `readonly` parameters' buffers only, in a kernel that
    /// does not communicate ([`Lowerer::reads_read_only`]); computed when first needed.
    read_only: Option<Vec<bool>>,
    /// The hidden parameters of a communicating kernel (rank, world size, heap-base
    /// table, timeout in ns: [`crate::comm`]'s ABI).
    comm: Option<[Value; 4]>,
    /// Comm ops lowered so far (the next one's index in [`crate::comm::comm_sites`]).
    comm_sites: usize,
    /// How many `for`/`while` bodies enclose the op being lowered (Tile IR cannot
    /// `return` from inside a loop).
    loop_depth: u32,
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

/// Tile IR's `comparison_predicate` of `p`.
fn cmp_predicate(p: CmpPred) -> i64 {
    match p {
        CmpPred::Eq => 0,
        CmpPred::Ne => 1,
        CmpPred::Lt => 2,
        CmpPred::Le => 3,
        CmpPred::Gt => 4,
        CmpPred::Ge => 5,
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
        let mut params = params;
        let comm = f.uses_comm();
        if comm {
            // The hidden parameters, after the user's ([`crate::comm`]).
            let s = |t| tile(&[], TileElementType::Scalar(t));
            params.extend([
                s(TScalar::I32),
                s(TScalar::I32),
                tile(
                    &[],
                    TileElementType::Pointer(Box::new(PointerType {
                        pointee: TScalar::I64,
                    })),
                ),
                s(TScalar::I64),
            ]);
        }
        let (region, blk, args) = build_single_block_region(&mut m, &params);
        let n = f.params.len();
        let comm = comm.then(|| [args[n], args[n + 1], args[n + 2], args[n + 3]]);
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
            comm,
            comm_sites: 0,
            loop_depth: 0,
            read_only: None,
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
                let (a, c) = (self.val(op.operands[0]), self.val(op.operands[1]));
                let pred = ("comparison_predicate", Attribute::i32(cmp_predicate(*p)));
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
                let ty = self.ty(r);
                let ptr = self.val(op.operands[0]);
                let mask = has_mask.then(|| self.val(op.operands[1]));
                let other = has_other.then(|| self.val(op.operands[2]));
                let read_only = self.reads_read_only(op.operands[0]);
                let tok = if read_only {
                    self.fresh_token()
                } else {
                    self.read_token()
                };
                let out = self.grouped(
                    Opcode::LoadPtrTko,
                    &[Some(ptr), mask, other, Some(tok)],
                    vec![ty, Type::Token],
                    &[("memory_ordering_semantics", Attribute::i32(0))],
                );
                if !read_only {
                    self.reads.push(out[1]);
                }
                out[0]
            }
            OpKind::Store { has_mask, .. } => {
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
                if matches!(aop, AtomicOp::Max | AtomicOp::Min)
                    && matches!(s, ScalarType::F32 | ScalarType::F64)
                {
                    let ptr = self.val(op.operands[0]);
                    let value = self.val(op.operands[1]);
                    let mask = has_mask.then(|| self.val(op.operands[2]));
                    let shape = self.f.ty(r).shape.clone();
                    let is_max = *aop == AtomicOp::Max;
                    let v =
                        self.atomic_fminmax(s, &shape, [ptr, value], mask, is_max, *order, *scope);
                    self.vals.insert(r, v);
                    return Ok(());
                }
                let mode = match (aop, s.is_float(), s.is_signed_int()) {
                    (AtomicOp::And, false, _) => 0,
                    (AtomicOp::Or, false, _) => 1,
                    (AtomicOp::Xor, false, _) => 2,
                    (AtomicOp::Add, false, _) => 3,
                    (AtomicOp::Add, true, _) => 4,
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
                } else if from == ScalarType::I1 && (to.is_int() || to.is_float()) {
                    // True is 1: `i1` converts unsigned (zero-extension).
                    let unsigned = ("signedness", Attribute::i32(0));
                    if to.is_int() {
                        self.op1(Opcode::ExtI, &[x], ty, &[unsigned])
                    } else {
                        self.op1(Opcode::IToF, &[x], ty, &[unsigned, nearest])
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
            // A promise about the values, for the SIMT path's axis analysis: the value.
            OpKind::Hint { .. } => self.val(op.operands[0]),
            OpKind::Permute { order } => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let ty = self.ty(r);
                let x = self.val(op.operands[0]);
                let perm = order.iter().map(|&d| i32::from(d)).collect();
                self.op1(
                    Opcode::Permute,
                    &[x],
                    ty,
                    &[("permutation", Attribute::DenseI32Array(perm))],
                )
            }
            // A program is one tile thread: its accesses are ordered by their tokens,
            // there are no threads to synchronize.
            OpKind::Barrier => return Ok(()),
            OpKind::LocalAlloc { len } => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let Elem::Ptr { pointee, .. } = self.f.ty(r).elem else {
                    return Err(self.unsupported(op, "without a pointer result"));
                };
                let ty = self.ty(r);
                // The program's own memory (`alloca` without `global`), aligned for
                // 16-byte accesses.
                let align = (pointee.size_bytes() as i64).max(16);
                self.emit(
                    OpBuilder::new(Opcode::Alloca, Location::Unknown)
                        .result(ty)
                        .attr("num_elem", Attribute::int(i64::from(*len), TScalar::I64))
                        .attr("alignment", Attribute::int(align, TScalar::I64)),
                )[0]
            }
            OpKind::AtomicCas {
                order,
                scope,
                has_mask,
            } => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                let ty = self.ty(r);
                let ptr = self.val(op.operands[0]);
                let (cmp, new) = (self.val(op.operands[1]), self.val(op.operands[2]));
                let mask = has_mask.then(|| self.val(op.operands[3]));
                let tok = self.write_token();
                let out = self.grouped(
                    Opcode::AtomicCAS,
                    &[Some(ptr), Some(cmp), Some(new), mask, Some(tok)],
                    vec![ty, Type::Token],
                    &[
                        (
                            "memory_ordering_semantics",
                            Attribute::i32(ordering(*order)),
                        ),
                        ("memory_scope", Attribute::i32(memory_scope(*scope))),
                    ],
                );
                self.last_write = Some(out[1]);
                out[0]
            }
            OpKind::While => return self.while_op(op),
            OpKind::DotScaled { format } => {
                let r = res.ok_or_else(|| self.unsupported(op, "without a result"))?;
                self.dot_scaled(op, *format, r)?
            }
            k if k.is_comm() => {
                let site = self.comm_sites;
                self.comm_sites += 1;
                return self.comm_op(op, site);
            }
            _ => return Err(self.unsupported(op, "is not lowered to Tile IR yet")),
        };
        if let Some(r) = res {
            self.vals.insert(r, v);
        }
        Ok(())
    }
}
