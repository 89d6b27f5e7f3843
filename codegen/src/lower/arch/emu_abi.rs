//! The emulator's device ABI, declared once.
//!
//! Every runtime function that the emulator's lowering ([`super::Emu`]) calls, with
//! its C signature in Rust types, is one row of [`emu_abi!`]. Two expansions read the
//! table: [`signature`] gives the LLVM declaration the lowering emits for a name, and
//! `crate::emu`'s symbol list resolves each name to the runtime's function, whose
//! Rust type must be the row's (a runtime function that drifts from its row does not
//! compile). What each function does is in `lower/arch/emu.rs`'s docs and at the
//! function.

use inkwell::context::Context;
use inkwell::types::{BasicMetadataTypeEnum, BasicType, BasicTypeEnum, FunctionType};

/// Expands `$m!` over the ABI table: one `fn name(params) [-> result];` per runtime
/// function, in Rust types (pointers are host pointers, address space 0).
macro_rules! emu_abi {
    ($m:ident) => {
        $m! {
            fn tessera_emu_tid() -> i32;
            fn tessera_emu_program_id(axis: i32) -> i32;
            fn tessera_emu_num_programs(axis: i32) -> i32;
            fn tessera_emu_barrier(site: i32);
            fn tessera_emu_shuffle_xor(v: i32, mask: i32, site: i32) -> i32;
            fn tessera_emu_shared_base() -> *mut u8;
            fn tessera_emu_check_global(p: *mut u8, bytes: i32, site: i32) -> *mut u8;
            fn tessera_emu_note_shared(p: *mut u8, bytes: i32, is_write: i32, site: i32);
            fn tessera_emu_timer_ns() -> i64;
            fn tessera_emu_check_divisor(is_zero: i32, site: i32);
            fn tessera_emu_yield();
            fn tessera_emu_loop_ok(site: i32) -> i32;
            fn tessera_emu_bad_peer(peer: i32, world: i32, site: i32);
            fn tessera_emu_engine_site(site: i32);
            fn tessera_emu_cp_async(dst: *mut u8, src: *const u8, bytes: i32, src_bytes: i32, site: i32);
            fn tessera_emu_cp_async_commit();
            fn tessera_emu_cp_async_wait(n: i32);
            fn tessera_emu_mbar_init(bar: *mut u8, count: i32, site: i32);
            fn tessera_emu_mbar_inval(bar: *mut u8, site: i32);
            fn tessera_emu_mbar_expect_tx(bar: *mut u8, bytes: i32, site: i32);
            fn tessera_emu_mbar_wait(bar: *mut u8, parity: i32, site: i32);
            fn tessera_emu_mbar_arrive(bar: *mut u8, site: i32);
            fn tessera_emu_named_barrier(id: i32, threads: i32, site: i32);
            fn tessera_emu_named_barrier_arrive(id: i32, threads: i32, site: i32);
            fn tessera_emu_warp_sync(site: i32);
            fn tessera_emu_setmaxnreg(inc: i32, regs: i32, site: i32);
            fn tessera_emu_tma_load(dst: *mut u8, tmap: i64, rank: i32, c0: i32, c1: i32, c2: i32, bar: *mut u8, site: i32);
            fn tessera_emu_cluster_ctarank() -> i32;
            fn tessera_emu_cluster_sync(site: i32);
            fn tessera_emu_mbar_arrive_cluster(bar: *mut u8, cta: i32, site: i32);
            fn tessera_emu_tma_load_multicast(dst: *mut u8, tmap: i64, rank: i32, c0: i32, c1: i32, c2: i32, bar: *mut u8, mask: i32, site: i32);
            fn tessera_emu_tma_store(src: *mut u8, tmap: i64, rank: i32, c0: i32, c1: i32, c2: i32, site: i32);
            fn tessera_emu_tma_store_wait(site: i32);
            fn tessera_emu_ldmatrix(p: *const u8, num: i32, trans: i32, out: *mut u32, site: i32);
            fn tessera_emu_mma_nv_f16(a0: u32, a1: u32, a2: u32, a3: u32, b0: u32, b1: u32, c0: f32, c1: f32, c2: f32, c3: f32, d: *mut f32, site: i32);
            fn tessera_emu_mma_nv_bf16(a0: u32, a1: u32, a2: u32, a3: u32, b0: u32, b1: u32, c0: f32, c1: f32, c2: f32, c3: f32, d: *mut f32, site: i32);
            fn tessera_emu_mma_amd_f16(a0: u32, a1: u32, a2: u32, a3: u32, b0: u32, b1: u32, b2: u32, b3: u32, c0: f32, c1: f32, c2: f32, c3: f32, d: *mut f32, site: i32);
            fn tessera_emu_mma_amd_bf16(a0: u32, a1: u32, a2: u32, a3: u32, b0: u32, b1: u32, b2: u32, b3: u32, c0: f32, c1: f32, c2: f32, c3: f32, d: *mut f32, site: i32);
            fn tessera_emu_mma_amd32_f16(ab: *const u32, cd: *mut f32, site: i32);
            fn tessera_emu_mma_amd32_bf16(ab: *const u32, cd: *mut f32, site: i32);
            fn tessera_emu_mma_words(kind: i32, ab: *const u32, a_words: i32, cd: *mut i32, c_regs: i32, site: i32);
            fn tessera_emu_fence_proxy_async();
            fn tessera_emu_wgmma_fence(site: i32);
            fn tessera_emu_wgmma(ty: i32, n: i32, desc_a: i64, desc_b: i64, flags: i32, acc: *mut u32, slot: i32, site: i32);
            fn tessera_emu_wgmma_rs(ty: i32, n: i32, a0: i32, a1: i32, a2: i32, a3: i32, desc_b: i64, flags: i32, acc: *mut u32, slot: i32, site: i32);
            fn tessera_emu_wgmma_commit(site: i32);
            fn tessera_emu_wgmma_wait(pending: i32, acc: *mut u32, regs: i32, slot: i32, site: i32);
        }
    };
}
pub(crate) use emu_abi;

/// A Rust type of the ABI and the LLVM type it is passed as.
pub(crate) trait AbiType {
    /// The LLVM type.
    fn llvm(ctx: &Context) -> BasicTypeEnum<'_>;
}

impl AbiType for i32 {
    fn llvm(ctx: &Context) -> BasicTypeEnum<'_> {
        ctx.i32_type().into()
    }
}

impl AbiType for u32 {
    fn llvm(ctx: &Context) -> BasicTypeEnum<'_> {
        ctx.i32_type().into()
    }
}

impl AbiType for i64 {
    fn llvm(ctx: &Context) -> BasicTypeEnum<'_> {
        ctx.i64_type().into()
    }
}

impl AbiType for f32 {
    fn llvm(ctx: &Context) -> BasicTypeEnum<'_> {
        ctx.f32_type().into()
    }
}

impl<T> AbiType for *mut T {
    fn llvm(ctx: &Context) -> BasicTypeEnum<'_> {
        ctx.ptr_type(inkwell::AddressSpace::default()).into()
    }
}

impl<T> AbiType for *const T {
    fn llvm(ctx: &Context) -> BasicTypeEnum<'_> {
        ctx.ptr_type(inkwell::AddressSpace::default()).into()
    }
}

macro_rules! fn_type {
    ($ctx:ident, $params:ident) => {
        $ctx.void_type().fn_type($params, false)
    };
    ($ctx:ident, $params:ident, $r:ty) => {
        <$r as AbiType>::llvm($ctx).fn_type($params, false)
    };
}

macro_rules! signatures {
    ($(fn $name:ident($($p:ident: $t:ty),* $(,)?) $(-> $r:ty)?;)*) => {
        /// The LLVM type of runtime function `name`, if the table has it.
        pub(crate) fn signature<'ctx>(ctx: &'ctx Context, name: &str) -> Option<FunctionType<'ctx>> {
            match name {
                $(stringify!($name) => {
                    let params: &[BasicMetadataTypeEnum<'ctx>] = &[$(<$t as AbiType>::llvm(ctx).into()),*];
                    Some(fn_type!(ctx, params $(, $r)?))
                })*
                _ => None,
            }
        }

        /// Every function's name, in the table's order.
        #[cfg(test)]
        pub(crate) const NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}

emu_abi!(signatures);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row resolves to exactly one emulator symbol, and every runtime function
    /// the lowering names is a row (a call outside the table fails only when that
    /// path is lowered, so the source is read here).
    #[test]
    fn the_table_the_lowering_and_the_emulator_agree() {
        let ctx = Context::create();
        let symbols = crate::emu::symbols();
        for name in NAMES {
            assert!(signature(&ctx, name).is_some(), "{name}");
            let n = symbols.iter().filter(|(s, _)| s == name).count();
            assert_eq!(n, 1, "{name} resolves {n} times");
        }
        let src = include_str!("emu.rs");
        let mut called = 0;
        for piece in src.split('"').skip(1).step_by(2) {
            if piece.starts_with("tessera_emu_") {
                assert!(
                    NAMES.contains(&piece),
                    "the lowering calls {piece}, not in the table"
                );
                called += 1;
            }
        }
        assert!(called >= 30, "{called} calls found: the scan is broken");
        assert_eq!(signature(&ctx, "tessera_emu_nothing"), None);
    }
}
