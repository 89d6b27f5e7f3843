//! Off-node peers through a vendor engine ([`crate::CommEngine`]).
//!
//! With [`CommEngine::Nvshmem`] the kernel still reaches every peer of its node by
//! loads, stores and atomics through mapped memory; the launcher marks each off-node
//! peer's entry of the heap-base table with a tag ([`crate::comm::OFF_NODE_SHIFT`]),
//! so a pointer `remote_ptr` makes for such a peer is this rank's symmetric address
//! with `peer + 1` in its top byte. The lowering then:
//!
//! - **loads, stores and atomics** through a pointer that may be remote (one not
//!   derived from a parameter by address arithmetic alone) test the tag per access (per vector for wide
//!   accesses: a vector never straddles a tag). Untagged: the access as before.
//!   Tagged: `nvshmem_uintN_g`/`_p` per element (the element's bits) and
//!   `nvshmem_{uint32,uint64}_atomic_*` for atomics (NVSHMEM has no remote
//!   floating-point add, min or max: such an atomic through a pointer that may be
//!   remote is a compile error). Such loads never become asynchronous copies.
//! - **`signal`**: every thread calls `nvshmem_quiet()` (its own off-node puts are
//!   delivered) before the block barrier; thread 0's update of a tagged word is
//!   `nvshmemx_signal_op` (`NVSHMEM_SIGNAL_SET`/`_ADD`).
//! - **`fence` with release at system scope** (`quiet()`), **`barrier_all`** (before
//!   arriving) and **the kernel's end**: every thread calls `nvshmem_quiet()`.
//!   `barrier_all`'s and the abort path's atomics on a tagged rank-0 (or peer)
//!   control word go through `nvshmem_uint64_atomic_*`.
//! - `wait_until` polls this rank's own memory, as before (the engine delivers
//!   signals into it).
//!
//! On NVIDIA targets [`crate::emit`] links NVSHMEM's device bitcode
//! (`libnvshmem_device_sm_XX.bc`) into the module before optimizing it
//! ([`crate::nvshmem`]). The emulator implements those device functions itself, from
//! NVSHMEM's and OpenSHMEM's documented semantics (puts are delivered at the calling
//! thread's next `quiet`, not before), so the same lowering runs in CI.
//!
//! [`CommEngine::Rocshmem`] is the same hook for AMD (rocSHMEM's `rocshmem_*` device
//! functions); no rocSHMEM device library is found yet, so compiling with it fails
//! with [`crate::CodegenError::Tool`] naming what is missing.

use inkwell::AddressSpace;
use inkwell::IntPredicate;
use inkwell::module::Linkage;
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum};
use inkwell::values::{BasicMetadataValueEnum, BasicValueEnum, IntValue, PointerValue};
use tessera_ir::ir::{AtomicOp, SignalOp};
use tessera_ir::{ScalarType, Span, ValueId};

use super::{LResult, LowerError, Lowerer};
use crate::comm::OFF_NODE_SHIFT;
use crate::{CodegenError, CommEngine, EmuFlavor, Target, Vendor};

/// NVSHMEM's `NVSHMEM_SIGNAL_SET` (`nvshmemx_signal_op_t`).
pub const NVSHMEM_SIGNAL_SET: u64 = 9;
/// NVSHMEM's `NVSHMEM_SIGNAL_ADD`.
pub const NVSHMEM_SIGNAL_ADD: u64 = 10;

/// The engine's device functions this lowering may call, as `(name, what)`; the
/// emulator implements each of them (a test checks the two lists agree).
pub const NVSHMEM_FUNCTIONS: &[&str] = &[
    "nvshmem_quiet",
    "nvshmemx_signal_op",
    "nvshmem_uint8_p",
    "nvshmem_uint16_p",
    "nvshmem_uint32_p",
    "nvshmem_uint64_p",
    "nvshmem_uint8_g",
    "nvshmem_uint16_g",
    "nvshmem_uint32_g",
    "nvshmem_uint64_g",
    "nvshmem_uint32_atomic_fetch_add",
    "nvshmem_uint32_atomic_fetch_and",
    "nvshmem_uint32_atomic_fetch_or",
    "nvshmem_uint32_atomic_fetch_xor",
    "nvshmem_uint32_atomic_swap",
    "nvshmem_uint32_atomic_compare_swap",
    "nvshmem_uint64_atomic_fetch_add",
    "nvshmem_uint64_atomic_fetch_and",
    "nvshmem_uint64_atomic_fetch_or",
    "nvshmem_uint64_atomic_fetch_xor",
    "nvshmem_uint64_atomic_swap",
    "nvshmem_uint64_atomic_compare_swap",
    "nvshmem_uint64_atomic_fetch",
    "nvshmem_uint64_atomic_set",
    "nvshmem_putmem",
    "nvshmem_getmem",
];

/// Where rocSHMEM's device library would be named (see [`check`]).
pub const ROCSHMEM_BITCODE_VAR: &str = "TESSERA_ROCSHMEM_BITCODE";

/// Whether a communicating kernel can be compiled for `target` with `engine`.
pub fn check(target: Target, engine: CommEngine) -> Result<(), CodegenError> {
    match (engine, target) {
        (CommEngine::Direct, _) => Ok(()),
        (CommEngine::Nvshmem, Target::Emu(EmuFlavor::Nv | EmuFlavor::Sm90a)) => Ok(()),
        (CommEngine::Nvshmem, t) if t.vendor() == Vendor::Nvidia && !t.is_emu() => Ok(()),
        (CommEngine::Nvshmem, t) => Err(CodegenError::Options(format!(
            "NVSHMEM reaches off-node peers from NVIDIA GPUs only, not from {t} (AMD's engine is rocSHMEM: CommEngine::Rocshmem)"
        ))),
        (CommEngine::Rocshmem, t) if t.vendor() != Vendor::Amd || t.is_emu() => {
            Err(CodegenError::Options(format!(
                "rocSHMEM reaches off-node peers from AMD GPUs only, not from {t}"
            )))
        }
        (CommEngine::Rocshmem, _) => Err(CodegenError::Tool {
            tool: "rocSHMEM".into(),
            message: match std::env::var_os(ROCSHMEM_BITCODE_VAR) {
                None => format!(
                    "off-node peers on AMD GPUs need rocSHMEM's device library as LLVM bitcode, and none was found ({ROCSHMEM_BITCODE_VAR} is not set); build rocSHMEM with ROCm (its device code compiled with `-fgpu-rdc -emit-llvm`) and name the bitcode there. Until then AMD worlds reach peers on their own node only (CommEngine::Direct)"
                ),
                Some(p) => format!(
                    "{ROCSHMEM_BITCODE_VAR}={} is set, but linking rocSHMEM is not finished: the lowering's off-node calls are NVSHMEM's names, and the rocshmem_* mapping and its tests need a ROCm machine (see the design notes)",
                    p.to_string_lossy()
                ),
            },
        }),
    }
}

impl<'a, 'ctx> Lowerer<'a, 'ctx> {
    /// Whether off-node peers go through an engine in this kernel.
    pub(super) fn engine_on(&self) -> bool {
        self.engine != CommEngine::Direct && self.comm.is_some()
    }

    /// Whether the pointer value `ptr` may point into an off-node peer's heap: with an
    /// engine on, unless it is a parameter plus offsets (`addptr`, splats and shape
    /// ops only). A pointer from `remote_ptr`, a loaded or loop-carried one may be.
    pub(super) fn maybe_remote(&self, ptr: ValueId) -> bool {
        if !self.engine_on() {
            return false;
        }
        match self.pointer_base(ptr) {
            Some(b) => !self.f.params.iter().any(|p| p.value == b),
            None => true,
        }
    }

    /// Calls the engine's device function `name` (declared on first use).
    fn engine_call(
        &self,
        name: &str,
        ret: Option<BasicTypeEnum<'ctx>>,
        args: &[BasicMetadataValueEnum<'ctx>],
    ) -> LResult<Option<BasicValueEnum<'ctx>>> {
        let f = match self.cx.module.get_function(name) {
            Some(f) => f,
            None => {
                let params: Vec<BasicMetadataTypeEnum> = args
                    .iter()
                    .map(|a| match a {
                        BasicMetadataValueEnum::IntValue(v) => v.get_type().into(),
                        BasicMetadataValueEnum::PointerValue(v) => v.get_type().into(),
                        other => BasicMetadataTypeEnum::from(
                            BasicValueEnum::try_from(*other)
                                .map(|v| v.get_type())
                                .unwrap_or_else(|_| self.cx.ctx.i64_type().into()),
                        ),
                    })
                    .collect();
                let fty = match ret {
                    Some(t) => t.fn_type(&params, false),
                    None => self.cx.ctx.void_type().fn_type(&params, false),
                };
                self.cx
                    .module
                    .add_function(name, fty, Some(Linkage::External))
            }
        };
        let site = self.new_site("off-node access");
        self.arch.engine_site(&self.cx, site)?;
        let call = self.cx.b.build_call(f, args, "")?;
        Ok(call.try_as_basic_value().basic())
    }

    /// `nvshmem_quiet()` in every thread that runs it (nothing without an engine).
    pub(super) fn engine_quiet(&self) -> LResult<()> {
        if self.engine_on() {
            self.engine_call("nvshmem_quiet", None, &[])?;
        }
        Ok(())
    }

    /// Branches on `p`'s off-node tag: `near(p)` for an untagged pointer, `far(addr,
    /// pe)` for a tagged one (`addr`: this rank's symmetric address, generic address
    /// space; `pe`: `i32`). Returns the value both produce (phi), if any.
    pub(super) fn split_remote(
        &self,
        p: PointerValue<'ctx>,
        near: impl FnOnce(PointerValue<'ctx>) -> LResult<Option<BasicValueEnum<'ctx>>>,
        far: impl FnOnce(PointerValue<'ctx>, IntValue<'ctx>) -> LResult<Option<BasicValueEnum<'ctx>>>,
    ) -> LResult<Option<BasicValueEnum<'ctx>>> {
        let b = &self.cx.b;
        let i64t = self.cx.ctx.i64_type();
        let bits = b.build_ptr_to_int(p, i64t, "")?;
        let tag = b.build_right_shift(
            bits,
            i64t.const_int(OFF_NODE_SHIFT as u64, false),
            false,
            "tag",
        )?;
        let is_far = b.build_int_compare(IntPredicate::NE, tag, i64t.const_zero(), "off_node")?;
        let bn = self.cx.ctx.append_basic_block(self.kernel, "near");
        let bf = self.cx.ctx.append_basic_block(self.kernel, "far");
        let bj = self.cx.ctx.append_basic_block(self.kernel, "far.join");
        b.build_conditional_branch(is_far, bf, bn)?;
        b.position_at_end(bn);
        let vn = near(p)?;
        let end_n = self.cx.cur_block();
        self.cx.b.build_unconditional_branch(bj)?;
        self.cx.b.position_at_end(bf);
        let b = &self.cx.b;
        let pe = b.build_int_sub(tag, i64t.const_int(1, false), "")?;
        let pe = b.build_int_truncate(pe, self.cx.ctx.i32_type(), "pe")?;
        let mask = i64t.const_int((1u64 << OFF_NODE_SHIFT) - 1, false);
        let a = b.build_and(bits, mask, "")?;
        let addr = b.build_int_to_ptr(a, self.cx.ctx.ptr_type(AddressSpace::default()), "sym")?;
        let vf = far(addr, pe)?;
        let end_f = self.cx.cur_block();
        self.cx.b.build_unconditional_branch(bj)?;
        self.cx.b.position_at_end(bj);
        match (vn, vf) {
            (Some(x), Some(y)) => {
                let phi = self.cx.b.build_phi(x.get_type(), "")?;
                phi.add_incoming(&[(&x, end_n), (&y, end_f)]);
                Ok(Some(phi.as_basic_value()))
            }
            _ => Ok(None),
        }
    }

    /// Reads a value of memory type `ty` (a scalar or a vector of scalars) at the
    /// symmetric address `addr` of rank `pe` through the engine: a scalar with
    /// `nvshmem_uintN_g`, a vector (the thread's contiguous run) with one
    /// `nvshmem_getmem` into a stack slot.
    pub(super) fn engine_get(
        &self,
        ty: BasicTypeEnum<'ctx>,
        addr: PointerValue<'ctx>,
        pe: IntValue<'ctx>,
    ) -> LResult<BasicValueEnum<'ctx>> {
        if let BasicTypeEnum::VectorType(vt) = ty {
            let bytes = self.bit_width(vt.get_element_type())? as u64 / 8 * vt.get_size() as u64;
            let slot = super::entry_alloca(&self.cx, ty, "engine.get")?;
            self.engine_call(
                "nvshmem_getmem",
                None,
                &[
                    slot.into(),
                    addr.into(),
                    self.cx.ctx.i64_type().const_int(bytes, false).into(),
                    pe.into(),
                ],
            )?;
            return Ok(self.cx.b.build_load(ty, slot, "")?);
        }
        let width = self.bit_width(ty)?;
        let it = self.int_of(width);
        let name = format!("nvshmem_uint{width}_g");
        let v = self
            .engine_call(&name, Some(it.into()), &[addr.into(), pe.into()])?
            .ok_or_else(|| LowerError::Llvm(format!("{name} returned nothing")))?;
        Ok(self.cx.b.build_bit_cast(v, ty, "")?)
    }

    /// Writes `v` (a scalar or a vector) at the symmetric address `addr` of rank `pe`
    /// through the engine (delivered by the next quiet): a scalar with
    /// `nvshmem_uintN_p`, a vector (the thread's contiguous run) with one
    /// `nvshmem_putmem` from a stack slot (which may be reused once it returns).
    pub(super) fn engine_put(
        &self,
        v: BasicValueEnum<'ctx>,
        addr: PointerValue<'ctx>,
        pe: IntValue<'ctx>,
    ) -> LResult<()> {
        if let BasicValueEnum::VectorValue(vv) = v {
            let vt = vv.get_type();
            let bytes = self.bit_width(vt.get_element_type())? as u64 / 8 * vt.get_size() as u64;
            let slot = super::entry_alloca(&self.cx, vt.into(), "engine.put")?;
            self.cx.b.build_store(slot, vv)?;
            self.engine_call(
                "nvshmem_putmem",
                None,
                &[
                    addr.into(),
                    slot.into(),
                    self.cx.ctx.i64_type().const_int(bytes, false).into(),
                    pe.into(),
                ],
            )?;
            return Ok(());
        }
        let width = self.bit_width(v.get_type())?;
        let it = self.int_of(width);
        let bits = self.cx.b.build_bit_cast(v, it, "")?;
        self.engine_call(
            &format!("nvshmem_uint{width}_p"),
            None,
            &[addr.into(), bits.into(), pe.into()],
        )?;
        Ok(())
    }

    /// The integer type of `width` bits (8, 16, 32 or 64).
    fn int_of(&self, width: u32) -> inkwell::types::IntType<'ctx> {
        let c = self.cx.ctx;
        match width {
            8 => c.i8_type(),
            16 => c.i16_type(),
            32 => c.i32_type(),
            _ => c.i64_type(),
        }
    }

    fn bit_width(&self, t: BasicTypeEnum<'ctx>) -> LResult<u32> {
        let w = match t {
            BasicTypeEnum::IntType(i) => i.get_bit_width(),
            BasicTypeEnum::FloatType(f) => {
                let ctx = self.cx.ctx;
                if f == ctx.f16_type() || f == ctx.bf16_type() {
                    16
                } else if f == ctx.f32_type() {
                    32
                } else {
                    64
                }
            }
            _ => 0,
        };
        if matches!(w, 8 | 16 | 32 | 64) {
            Ok(w)
        } else {
            Err(LowerError::Llvm(format!(
                "an off-node access of a {w}-bit value"
            )))
        }
    }

    /// A read-modify-write (`op`; `None`: compare-and-swap of `v0` for `v1`) on
    /// `pointee` at the symmetric address `addr` of rank `pe`, returning the old value.
    /// A release `order` quiets first (this thread's earlier puts land before it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn engine_atomic(
        &self,
        span: &Span,
        op: Option<AtomicOp>,
        pointee: ScalarType,
        release: bool,
        addr: PointerValue<'ctx>,
        pe: IntValue<'ctx>,
        v0: BasicValueEnum<'ctx>,
        v1: Option<BasicValueEnum<'ctx>>,
    ) -> LResult<BasicValueEnum<'ctx>> {
        let unsupported = |what: &str| {
            Err(LowerError::Unsupported {
                span: span.clone(),
                message: format!(
                    "{what} through a pointer that may reach another node: NVSHMEM's remote atomics are bitwise and integer-add operations on 32- and 64-bit words (keep this atomic on this node's peers, or use an integer type)"
                ),
            })
        };
        let width = match pointee.size_bytes() {
            4 => 32,
            8 => 64,
            n => return unsupported(&format!("a {}-byte atomic", n)),
        };
        let name = match op {
            Some(AtomicOp::Add) if pointee.is_float() => {
                return unsupported("a floating-point atomic add");
            }
            Some(AtomicOp::Min | AtomicOp::Max) => return unsupported("an atomic min/max"),
            Some(AtomicOp::Add) => "fetch_add",
            Some(AtomicOp::And) => "fetch_and",
            Some(AtomicOp::Or) => "fetch_or",
            Some(AtomicOp::Xor) => "fetch_xor",
            Some(AtomicOp::Xchg) => "swap",
            None if pointee.is_float() => return unsupported("a floating-point compare-and-swap"),
            None => "compare_swap",
        };
        if release {
            self.engine_quiet()?;
        }
        let it = self.int_of(width);
        let bits = |v: BasicValueEnum<'ctx>| self.cx.b.build_bit_cast(v, it, "");
        let mut args: Vec<BasicMetadataValueEnum> = vec![addr.into()];
        if op.is_none() {
            // `compare_swap(dest, cond, value, pe)`.
            args.push(bits(v0)?.into());
            let v1 = v1.ok_or_else(|| LowerError::Llvm("cas has two values".into()))?;
            args.push(bits(v1)?.into());
        } else {
            args.push(bits(v0)?.into());
        }
        args.push(pe.into());
        let f = format!("nvshmem_uint{width}_atomic_{name}");
        let old = self
            .engine_call(&f, Some(it.into()), &args)?
            .ok_or_else(|| LowerError::Llvm(format!("{f} returned nothing")))?;
        Ok(self.cx.b.build_bit_cast(old, v0.get_type(), "")?)
    }

    /// `nvshmemx_signal_op(addr, v, code, pe)`.
    pub(super) fn engine_signal(
        &self,
        addr: PointerValue<'ctx>,
        v: IntValue<'ctx>,
        code: IntValue<'ctx>,
        pe: IntValue<'ctx>,
    ) -> LResult<()> {
        self.engine_call(
            "nvshmemx_signal_op",
            None,
            &[addr.into(), v.into(), code.into(), pe.into()],
        )?;
        Ok(())
    }

    /// `nvshmem_uint64_atomic_compare_swap(addr, 0, new, pe)`.
    pub(super) fn engine_cas_zero(
        &self,
        addr: PointerValue<'ctx>,
        new: IntValue<'ctx>,
        pe: IntValue<'ctx>,
    ) -> LResult<()> {
        let i64t = self.cx.ctx.i64_type();
        self.engine_call(
            "nvshmem_uint64_atomic_compare_swap",
            Some(i64t.into()),
            &[addr.into(), i64t.const_zero().into(), new.into(), pe.into()],
        )?;
        Ok(())
    }

    /// A 64-bit atomic `op` (`Set`: store, `Add`: add) or, with `op = None`, a load,
    /// on a control or signal word that may be tagged; `order` applies near.
    pub(super) fn word_atomic(
        &self,
        p: PointerValue<'ctx>,
        op: Option<SignalOp>,
        v: IntValue<'ctx>,
        near: impl FnOnce(PointerValue<'ctx>) -> LResult<Option<BasicValueEnum<'ctx>>>,
    ) -> LResult<Option<BasicValueEnum<'ctx>>> {
        if !self.engine_on() {
            return near(p);
        }
        let i64t = self.cx.ctx.i64_type();
        self.split_remote(p, near, |addr, pe| {
            let (f, args): (&str, Vec<BasicMetadataValueEnum>) = match op {
                None => ("nvshmem_uint64_atomic_fetch", vec![addr.into(), pe.into()]),
                Some(SignalOp::Set) => (
                    "nvshmem_uint64_atomic_set",
                    vec![addr.into(), v.into(), pe.into()],
                ),
                Some(SignalOp::Add) => (
                    "nvshmem_uint64_atomic_fetch_add",
                    vec![addr.into(), v.into(), pe.into()],
                ),
            };
            let ret = (f != "nvshmem_uint64_atomic_set").then_some(i64t.into());
            let r = self.engine_call(f, ret, &args)?;
            Ok(Some(r.unwrap_or_else(|| i64t.const_zero().into())))
        })
    }
}
