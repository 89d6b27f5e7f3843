//! The emulator's matrix instructions: `ldmatrix`, the vendors' `mma` (NVIDIA's
//! `m16n8k16`/`m16n8k32`, AMD's MFMA) and Hopper's `wgmma` from shared memory or
//! registers, computed once per warp (or warpgroup) by the last lane to arrive,
//! with the independent models of [`crate::emu::mma`] and `crate::emu::wgmma`.
//!
//! Contract: as every runtime call (the parent module's docs), these never panic; an
//! instruction used against its rules (`wgmma` without its fence, accumulators read
//! while in flight, an operand layout the emulator does not model) is recorded as
//! an [`crate::emu::EmuError::Instruction`] of the calling thread, and its results read as
//! poison.

use super::{ThreadCtx, misaligned_shared, note_shared, wg_fail, with};
use crate::emu::mma::{self, Half};
use crate::emu::wgmma::{self as wg, POISON, WgOp, WgType};

/// `ldmatrix.sync.aligned.m8n8.x{num}{.trans}.shared.b16`, from the PTX ISA's
/// description (not from the lowering's fragment tables): lane `8 * i + j` holds the
/// address of row `j` of 8x8 matrix `i` (eight 16-bit elements, 16 bytes, 16-byte
/// aligned); afterwards lane `t` holds, for each matrix, elements `(t / 4, 2 * (t % 4))`
/// and `(t / 4, 2 * (t % 4) + 1)` (row, column) packed low to high, or with `.trans`
/// `(2 * (t % 4), t / 4)` and `(2 * (t % 4) + 1, t / 4)`. Computed once per warp.
pub(super) extern "C" fn tessera_emu_ldmatrix(
    p: *const u8,
    num: i32,
    trans: i32,
    out: *mut u32,
    site: i32,
) {
    with((), |c| {
        let num = num.clamp(1, 4) as usize;
        let lane = (c.tid % 32) as usize;
        // The row this lane addresses is read by the instruction (when it is used).
        let mut ok = true;
        if lane < 8 * num {
            if !(p as usize).is_multiple_of(16) {
                misaligned_shared(c, p, 16, site);
                ok = false;
            }
            ok &= note_shared(c, p, 16, false, site);
        }
        let addr = if ok { p as u64 } else { 0 };
        let (shared, len) = (c.blk.shared as usize, c.blk.shared_bytes);
        let r = c.blk.team.warp_collective(
            c.tid,
            site as u32,
            &[addr],
            |p| c.park(p),
            |w| {
                let row = |i: usize| -> [u16; 8] {
                    let a = w.read(i as u32, 0) as usize;
                    let inside = a >= shared && a + 16 <= shared + len && a.is_multiple_of(16);
                    if !inside {
                        return [0; 8];
                    }
                    // SAFETY: 16 bytes inside the block's shared memory, 16-byte
                    // aligned (checked above); the warp's threads are parked here.
                    let bytes = unsafe { *(a as *const [u8; 16]) };
                    std::array::from_fn(|e| u16::from_le_bytes([bytes[2 * e], bytes[2 * e + 1]]))
                };
                let rows: Vec<[u16; 8]> = (0..8 * num).map(row).collect();
                for t in 0..w.lanes() as usize {
                    for m in 0..num {
                        let (r0, c0, r1, c1) = if trans != 0 {
                            (2 * (t % 4), t / 4, 2 * (t % 4) + 1, t / 4)
                        } else {
                            (t / 4, 2 * (t % 4), t / 4, 2 * (t % 4) + 1)
                        };
                        let lo = rows[8 * m + r0][c0] as u64;
                        let hi = rows[8 * m + r1][c1] as u64;
                        w.write(t as u32, m, lo | hi << 16);
                    }
                }
            },
        );
        for (m, v) in r.iter().take(num).enumerate() {
            // SAFETY: the kernel passes a pointer to its `[4 x i32]` stack slot.
            unsafe { out.add(m).write(*v as u32) };
        }
    })
}

/// `fence.proxy.async.shared::cta` (this thread's shared writes are visible to its
/// later `wgmma` operand reads).
pub(super) extern "C" fn tessera_emu_fence_proxy_async() {
    with((), |c| c.wg_dirty.set(None))
}

/// `wgmma.fence.sync.aligned`.
pub(super) extern "C" fn tessera_emu_wgmma_fence(_site: i32) {
    with((), |c| c.wg.borrow_mut().fenced = true)
}

/// `wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{f16,bf16}` (see `crate::emu::wgmma`):
/// `acc` holds this thread's `n / 2` accumulators, which read as [`POISON`] until a
/// wait completes the instruction. `ty` is 0 for f16, 1 for bf16; `flags` bit 0 is
/// `imm-trans-b`, bit 1 `scale-d` (clear: `D = A·B`, the registers are not read).
#[allow(clippy::too_many_arguments)]
pub(super) extern "C" fn tessera_emu_wgmma(
    ty: i32,
    n: i32,
    desc_a: i64,
    desc_b: i64,
    flags: i32,
    acc: *mut u32,
    slot: i32,
    site: i32,
) {
    with((), |c| {
        wg_issue(c, (ty, n), (desc_a, None), desc_b, flags, acc, slot, site)
    })
}

/// `wgmma.mma_async` with A from registers: `a0..a3` are this thread's A fragment
/// registers (see `crate::emu::wgmma`); the warp's lanes exchange them here (the
/// instruction is warp-synchronous), each keeping its quad's, and the rest is
/// [`tessera_emu_wgmma`].
#[allow(clippy::too_many_arguments)]
pub(super) extern "C" fn tessera_emu_wgmma_rs(
    ty: i32,
    n: i32,
    a0: i32,
    a1: i32,
    a2: i32,
    a3: i32,
    desc_b: i64,
    flags: i32,
    acc: *mut u32,
    slot: i32,
    site: i32,
) {
    with((), |c| {
        let dep = [a0, a1, a2, a3].map(|x| x as u32 as u64);
        let r = c.blk.team.warp_collective(
            c.tid,
            site as u32,
            &dep,
            |p| c.park(p),
            |w| {
                for l in 0..w.lanes() {
                    let quad = l & !3;
                    for q in 0..4 {
                        for j in 0..4 {
                            w.write(l, (4 * q + j) as usize, w.read(quad + q, j as usize));
                        }
                    }
                }
            },
        );
        let quad: [u32; 16] = std::array::from_fn(|i| r[i] as u32);
        wg_issue(c, (ty, n), (0, Some(quad)), desc_b, flags, acc, slot, site)
    })
}

/// Issues one `wgmma.mma_async` for thread `c` (see [`tessera_emu_wgmma`]).
#[allow(clippy::too_many_arguments)]
fn wg_issue(
    c: &ThreadCtx<'_>,
    (ty, n): (i32, i32),
    (desc_a, a_quad): (i64, Option<[u32; 16]>),
    desc_b: i64,
    flags: i32,
    acc: *mut u32,
    slot: i32,
    site: i32,
) {
    let (trans_b, scale_d) = (flags & 1 != 0, flags & 2 != 0);
    {
        if !(8..=256).contains(&n) || n % 8 != 0 {
            return wg_fail(c, site, format!("N = {n} (8 to 256, a multiple of 8)"));
        }
        let regs = n as usize / 2;
        // SAFETY: the kernel passes its `[n / 2 x i32]` stack slot.
        let acc = unsafe { std::slice::from_raw_parts_mut(acc, regs) };
        let slot = slot as u32;
        let op = WgOp {
            ty: match ty {
                0 => WgType::F16,
                1 => WgType::Bf16,
                2 => WgType::S8,
                3 => WgType::E4M3,
                _ => WgType::E5M2,
            },
            n: n as u32,
            desc_a: desc_a as u64,
            desc_b: desc_b as u64,
            trans_b,
            scale_d,
            a_quad,
            slot,
            site,
        };
        // Generic-proxy writes reach the operand reads (async proxy) only through
        // a fence: this thread's unfenced writes must miss every operand byte the
        // warpgroup reads (PTX ISA, "proxies").
        if let Some((lo, hi)) = c.wg_dirty.get() {
            match wg::reads_any(&op, lo as u32, hi as u32) {
                Ok(false) => {}
                Ok(true) => {
                    return wg_fail(
                        c,
                        site,
                        format!(
                            "the thread wrote shared memory the wgmma reads (in bytes {lo:#x}..{hi:#x}) since its last fence.proxy.async: the operand reads may not see it"
                        ),
                    );
                }
                Err(m) => return wg_fail(c, site, m),
            }
        }
        let mut st = c.wg.borrow_mut();
        if st.pending(slot) {
            // Chained onto an in-flight wgmma: the registers must be untouched.
            if acc.iter().any(|&v| v != POISON) {
                drop(st);
                return wg_fail(
                    c,
                    site,
                    "accumulator registers of an in-flight wgmma were modified".into(),
                );
            }
        } else {
            if !st.fenced {
                drop(st);
                return wg_fail(
                    c,
                    site,
                    "no wgmma.fence between writing the accumulator registers and the wgmma".into(),
                );
            }
            st.regs.insert(slot, acc.to_vec());
        }
        st.open.push(op);
        acc.fill(POISON);
    }
}

/// `wgmma.commit_group.sync.aligned`.
pub(super) extern "C" fn tessera_emu_wgmma_commit(_site: i32) {
    with((), |c| {
        let mut st = c.wg.borrow_mut();
        let g = std::mem::take(&mut st.open);
        st.committed.push_back(g);
    })
}

/// `wgmma.wait_group.sync.aligned pending`: completes every committed group but the
/// newest `pending` (reading their operands from shared memory now), then writes
/// `slot`'s `regs` accumulators to `acc` if none of its wgmmas is still in flight
/// (else [`POISON`]).
pub(super) extern "C" fn tessera_emu_wgmma_wait(
    pending: i32,
    acc: *mut u32,
    regs: i32,
    slot: i32,
    site: i32,
) {
    with((), |c| {
        let keep = pending.max(0) as usize;
        loop {
            let g = {
                let mut st = c.wg.borrow_mut();
                if st.committed.len() <= keep {
                    break;
                }
                st.committed.pop_front()
            };
            for op in g.into_iter().flatten() {
                let mut regs = c.wg.borrow_mut().regs.remove(&op.slot).unwrap_or_default();
                regs.resize((op.n / 2) as usize, 0);
                let (shared, len) = (c.blk.shared, c.blk.shared_bytes);
                let eb = op.ty.bytes() as usize;
                let r = wg::execute(&op, c.tid, &mut regs, |addr| {
                    let a = addr as usize;
                    if a + eb > len {
                        return Err(format!(
                            "an operand element at shared address {a:#x} is outside the block's {len} bytes"
                        ));
                    }
                    // SAFETY: `eb` bytes inside the block's shared memory (checked).
                    let p = unsafe { shared.add(a) };
                    note_shared(c, p, eb as i32, false, op.site);
                    // SAFETY: as above; unaligned reads of a u8 / u16 are fine.
                    Ok(unsafe {
                        if eb == 1 {
                            p.read() as u16
                        } else {
                            (p as *const u16).read_unaligned()
                        }
                    })
                });
                if let Err(m) = r {
                    wg_fail(c, op.site, m);
                }
                c.wg.borrow_mut().regs.insert(op.slot, regs);
            }
        }
        let regs = regs.max(0) as usize;
        // SAFETY: the kernel passes its `[regs x i32]` stack slot.
        let out = unsafe { std::slice::from_raw_parts_mut(acc, regs) };
        let mut st = c.wg.borrow_mut();
        let slot = slot as u32;
        if st.pending(slot) {
            out.fill(POISON);
            return;
        }
        // The accumulators are ordinary registers again: the next wgmma on them
        // needs a new wgmma.fence.
        st.fenced = false;
        let v = st.regs.remove(&slot);
        drop(st);
        match v {
            Some(v) if v.len() == regs => out.copy_from_slice(&v),
            Some(_) => wg_fail(
                c,
                site,
                "wait for an accumulator tile of another size".into(),
            ),
            // Nothing in flight: the registers stay as they are.
            None => {}
        }
    })
}

fn nv_mma(ty: Half, a: [u32; 4], b: [u32; 2], cf: [f32; 4], d: *mut f32, site: i32) {
    with((), |c| {
        let mut dep = [0u64; 10];
        for i in 0..4 {
            dep[i] = a[i] as u64;
            dep[6 + i] = cf[i].to_bits() as u64;
        }
        dep[4] = b[0] as u64;
        dep[5] = b[1] as u64;
        let r = c.blk.team.warp_collective(
            c.tid,
            site as u32,
            &dep,
            |p| c.park(p),
            |w| {
                // Once per warp: gather every lane's fragments, multiply, scatter D.
                let av: Vec<[u32; 4]> = gather(w, 0, |x| x as u32);
                let bv: Vec<[u32; 2]> = gather(w, 4, |x| x as u32);
                let cv: Vec<[f32; 4]> = gather(w, 6, as_f32);
                scatter_d(w, &mma::nv_m16n8k16(ty, &av, &bv, &cv));
            },
        );
        write_d(r, d);
    })
}

/// Every lane's `N` deposit words from word `first` on, each converted by `f`.
fn gather<const N: usize, T>(
    w: &crate::emu::team::WarpView<'_>,
    first: usize,
    f: impl Fn(u64) -> T,
) -> Vec<[T; N]> {
    (0..w.lanes())
        .map(|l| std::array::from_fn(|i| f(w.read(l, first + i))))
        .collect()
}

/// An f32 from the low half of a deposit word.
fn as_f32(x: u64) -> f32 {
    f32::from_bits(x as u32)
}

/// Writes every lane's D fragment to its result slots.
fn scatter_d<const N: usize>(w: &crate::emu::team::WarpView<'_>, d: &[[f32; N]]) {
    for (l, frag) in d.iter().enumerate().take(w.lanes() as usize) {
        for (i, v) in frag.iter().enumerate() {
            w.write(l as u32, i, v.to_bits() as u64);
        }
    }
}

/// Writes a lane's D fragment (zeros after a team error) to the kernel's
/// `[4 x float]` stack slot `d`.
fn write_d(r: [u64; crate::emu::team::SLOT_WORDS], d: *mut f32) {
    for (i, v) in r.iter().take(4).enumerate() {
        // SAFETY: the kernel passes a pointer to its `[4 x float]` stack slot.
        unsafe { d.add(i).write(f32::from_bits(*v as u32)) };
    }
}

fn amd_mma(ty: Half, ab: [u32; 8], cf: [f32; 4], d: *mut f32, site: i32) {
    with((), |c| {
        let mut dep = [0u64; 12];
        for i in 0..8 {
            dep[i] = ab[i] as u64;
        }
        for i in 0..4 {
            dep[8 + i] = cf[i].to_bits() as u64;
        }
        let r = c.blk.team.warp_collective(
            c.tid,
            site as u32,
            &dep,
            |p| c.park(p),
            |w| {
                let av: Vec<[u16; 4]> = gather(w, 0, |x| x as u16);
                let bv: Vec<[u16; 4]> = gather(w, 4, |x| x as u16);
                let cv: Vec<[f32; 4]> = gather(w, 8, as_f32);
                scatter_d(w, &mma::amd_16x16x16(ty, &av, &bv, &cv));
            },
        );
        write_d(r, d);
    })
}

macro_rules! nv_entry {
    ($name:ident, $ty:expr) => {
        #[allow(clippy::too_many_arguments)]
        pub(super) extern "C" fn $name(
            a0: u32,
            a1: u32,
            a2: u32,
            a3: u32,
            b0: u32,
            b1: u32,
            c0: f32,
            c1: f32,
            c2: f32,
            c3: f32,
            d: *mut f32,
            site: i32,
        ) {
            nv_mma($ty, [a0, a1, a2, a3], [b0, b1], [c0, c1, c2, c3], d, site)
        }
    };
}

macro_rules! amd_entry {
    ($name:ident, $ty:expr) => {
        #[allow(clippy::too_many_arguments)]
        pub(super) extern "C" fn $name(
            a0: u32,
            a1: u32,
            a2: u32,
            a3: u32,
            b0: u32,
            b1: u32,
            b2: u32,
            b3: u32,
            c0: f32,
            c1: f32,
            c2: f32,
            c3: f32,
            d: *mut f32,
            site: i32,
        ) {
            amd_mma(
                $ty,
                [a0, a1, a2, a3, b0, b1, b2, b3],
                [c0, c1, c2, c3],
                d,
                site,
            )
        }
    };
}

fn amd_mma32(ty: Half, ab: *const u32, cd: *mut f32, site: i32) {
    with((), |c| {
        let mut dep = [0u64; crate::emu::team::SLOT_WORDS];
        for (i, d) in dep.iter_mut().enumerate().take(8) {
            // SAFETY: the kernel passes its `[8 x i32]` slot.
            *d = unsafe { ab.add(i).read() } as u64;
        }
        for i in 0..16 {
            // SAFETY: the kernel passes its `[16 x float]` slot.
            dep[8 + i] = unsafe { cd.add(i).read() }.to_bits() as u64;
        }
        let r = c.blk.team.warp_collective(
            c.tid,
            site as u32,
            &dep,
            |p| c.park(p),
            |w| {
                let av: Vec<[u16; 4]> = gather(w, 0, |x| x as u16);
                let bv: Vec<[u16; 4]> = gather(w, 4, |x| x as u16);
                let cv: Vec<[f32; 16]> = gather(w, 8, as_f32);
                scatter_d(w, &mma::amd_32x32x8(ty, &av, &bv, &cv));
            },
        );
        for (i, v) in r.iter().take(16).enumerate() {
            // SAFETY: as above.
            unsafe { cd.add(i).write(f32::from_bits(*v as u32)) };
        }
    })
}

/// `tessera_emu_mma_words(kind, ab, a_words, cd, c_regs, site)`: see
/// `lower::arch::emu::emit_mma_words`. The instruction's shape follows from `kind`; a
/// slot of another size is an emulator error, not a guess.
pub(super) extern "C" fn tessera_emu_mma_words(
    kind: i32,
    ab: *const u32,
    a_words: i32,
    cd: *mut i32,
    c_regs: i32,
    site: i32,
) {
    let amd = mma::AmdMma::from_kind(kind);
    // (A words, B words, C registers) of each instruction.
    let want: (usize, usize, usize) = match (kind, amd) {
        (_, Some((ins, e))) => (ins.words(e), ins.words(e), ins.c_regs()),
        (0 | 3 | 4, _) => (4, 2, 4),
        (1, _) => (2, 2, 4),
        (2, _) => (2, 2, 16),
        _ => {
            with((), |c| {
                wg_fail(c, site, format!("no matrix instruction of kind {kind}"))
            });
            return;
        }
    };
    let (na, nc) = (a_words.max(0) as usize, c_regs.max(0) as usize);
    if (na, nc) != (want.0, want.2) {
        with((), |c| {
            wg_fail(
                c,
                site,
                format!("matrix instruction {kind} with {na} A registers and {nc} accumulators"),
            )
        });
        return;
    }
    // A block-scaled instruction's slot holds the lane's scale of A and of B after B.
    let scaled = amd.is_some_and(|(ins, _)| ins.scaled());
    let nab = want.0 + want.1 + if scaled { 2 } else { 0 };
    with((), |c| {
        // An instruction given undefined input (the computing lane reports it).
        let mut failed: Option<String> = None;
        let mut dep = [0u64; crate::emu::team::SLOT_WORDS];
        for (i, d) in dep.iter_mut().enumerate().take(nab) {
            // SAFETY: the kernel passes its `[a_words + b_words x i32]` slot.
            *d = unsafe { ab.add(i).read() } as u64;
        }
        for i in 0..nc {
            // SAFETY: the kernel passes its `[c_regs x i32]` slot.
            dep[nab + i] = unsafe { cd.add(i).read() } as u32 as u64;
        }
        let r = c.blk.team.warp_collective(
            c.tid,
            site as u32,
            &dep[..nab + nc],
            |p| c.park(p),
            |w| {
                let as_i32 = |x: u64| x as u32 as i32;
                let scatter = |d: &[Vec<i32>]| {
                    for (l, frag) in d.iter().enumerate().take(w.lanes() as usize) {
                        for (i, v) in frag.iter().enumerate() {
                            w.write(l as u32, i, *v as u32 as u64);
                        }
                    }
                };
                let d: Vec<Vec<i32>> = match (kind, amd) {
                    (_, Some((ins, e))) => {
                        let words = |first: usize, n: usize| -> Vec<Vec<u32>> {
                            (0..w.lanes())
                                .map(|l| (0..n).map(|i| w.read(l, first + i) as u32).collect())
                                .collect()
                        };
                        let (na, nc) = (want.0, want.2);
                        let cs: Vec<Vec<f32>> = words(nab, nc)
                            .into_iter()
                            .map(|v| v.into_iter().map(f32::from_bits).collect())
                            .collect();
                        let lane_scales = |at: usize| -> Vec<u32> {
                            (0..w.lanes()).map(|l| w.read(l, at) as u32).collect()
                        };
                        let (sa, sb) = (lane_scales(2 * na), lane_scales(2 * na + 1));
                        let scales = scaled.then_some((&sa[..], &sb[..]));
                        match mma::amd_mma(ins, e, &words(0, na), &words(na, na), &cs, scales) {
                            Ok(d) => d
                                .iter()
                                .map(|x| x.iter().map(|f| f.to_bits() as i32).collect())
                                .collect(),
                            Err(e) => {
                                failed = Some(e);
                                return;
                            }
                        }
                    }
                    (3 | 4, _) => mma::nv_m16n8k32_f8(
                        if kind == 3 {
                            mma::Fp8::E4M3
                        } else {
                            mma::Fp8::E5M2
                        },
                        &gather::<4, _>(w, 0, |x| x as u32),
                        &gather::<2, _>(w, 4, |x| x as u32),
                        &gather::<4, _>(w, 6, |x| f32::from_bits(x as u32)),
                    )
                    .iter()
                    .map(|x| x.iter().map(|f| f.to_bits() as i32).collect())
                    .collect(),
                    (0, _) => mma::nv_m16n8k32_s8(
                        &gather::<4, _>(w, 0, |x| x as u32),
                        &gather::<2, _>(w, 4, |x| x as u32),
                        &gather::<4, _>(w, 6, as_i32),
                    )
                    .iter()
                    .map(|x| x.to_vec())
                    .collect(),
                    (1, _) => mma::amd_i8::<4>(
                        16,
                        &gather::<2, _>(w, 0, |x| x as u32),
                        &gather::<2, _>(w, 2, |x| x as u32),
                        &gather::<4, _>(w, 4, as_i32),
                    )
                    .iter()
                    .map(|x| x.to_vec())
                    .collect(),
                    _ => mma::amd_i8::<16>(
                        32,
                        &gather::<2, _>(w, 0, |x| x as u32),
                        &gather::<2, _>(w, 2, |x| x as u32),
                        &gather::<16, _>(w, 4, as_i32),
                    )
                    .iter()
                    .map(|x| x.to_vec())
                    .collect(),
                };
                scatter(&d);
            },
        );
        if let Some(e) = failed {
            wg_fail(c, site, e);
            return;
        }
        for (i, v) in r.iter().take(nc).enumerate() {
            // SAFETY: as above.
            unsafe { cd.add(i).write(*v as u32 as i32) };
        }
    })
}

pub(super) extern "C" fn tessera_emu_mma_amd32_f16(ab: *const u32, cd: *mut f32, site: i32) {
    amd_mma32(Half::F16, ab, cd, site)
}

pub(super) extern "C" fn tessera_emu_mma_amd32_bf16(ab: *const u32, cd: *mut f32, site: i32) {
    amd_mma32(Half::Bf16, ab, cd, site)
}

nv_entry!(tessera_emu_mma_nv_f16, Half::F16);
nv_entry!(tessera_emu_mma_nv_bf16, Half::Bf16);
amd_entry!(tessera_emu_mma_amd_f16, Half::F16);
amd_entry!(tessera_emu_mma_amd_bf16, Half::Bf16);
