//! The emulator's asynchronous copies (see `crate::emu::tma` for the model):
//! `cp.async` groups, mbarriers, and TMA box loads and stores through registered
//! tensor maps.
//!
//! Contract: as every runtime call (the parent module's docs), these never panic;
//! misuse (a misaligned or out-of-range address, an mbarrier never initialized, a
//! race with the async proxy) is recorded as an [`EmuError`] of the calling thread.
//! Copies land lazily: a `cp.async` group when a `cp.async.wait_group` covers it, a
//! TMA load when a thread waits for its mbarrier's phase, a TMA store when its
//! thread waits for its bulk group.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use super::{
    ThreadCtx, misaligned_shared, note_shared, read_global, tessera_emu_check_global, wg_fail,
    with, write_global,
};
use crate::emu::EmuError;
use crate::emu::team::Park;
use crate::emu::tma::{EmuTensorMap, Landing, Mbar, lookup};

/// A TMA store: it reads its box from shared memory and writes global memory when
/// the issuing thread waits for its bulk group.
pub(crate) struct TmaStore {
    src_off: usize,
    map: EmuTensorMap,
    coords: [i32; 3],
    site: i32,
}

/// One `cp.async`: the bytes read from global memory when it was issued, to land at
/// `dst` in shared memory when a `cp.async.wait_group` covers its group.
pub(crate) struct AsyncCopy {
    dst: usize,
    bytes: [u8; 16],
    len: usize,
    site: i32,
}

/// A thread's `cp.async` groups (PTX ISA, "cp.async.commit_group" and
/// "cp.async.wait_group"): the copies issued since the last commit, and the committed
/// groups, oldest first.
#[derive(Default)]
pub(crate) struct AsyncCopies {
    open: Vec<AsyncCopy>,
    committed: VecDeque<Vec<AsyncCopy>>,
}

/// `cp.async.cg.shared.global [dst], [src], bytes, src_bytes` (PTX ISA, "cp.async"):
/// copies `bytes` (4, 8 or 16, both addresses aligned to it) from global `src` to
/// shared `dst`, the bytes past `src_bytes` zero (`src_bytes = 0` reads nothing).
/// The copy is asynchronous: here the source is read now and the destination written
/// only when a `cp.async.wait_group` covers the copy's group, so a kernel that reads
/// the destination without waiting reads stale data, as it may on a GPU.
pub(super) extern "C" fn tessera_emu_cp_async(
    dst: *mut u8,
    src: *const u8,
    bytes: i32,
    src_bytes: i32,
    site: i32,
) {
    with((), |c| {
        let len = bytes.clamp(1, 16) as usize;
        let n = (src_bytes.max(0) as usize).min(len);
        if !(dst as usize).is_multiple_of(len) {
            misaligned_shared(c, dst, len as u32, site);
            return;
        }
        let mut data = [0u8; 16];
        if n > 0 {
            let p = tessera_emu_check_global(src as *mut u8, len as i32, site);
            // SAFETY: `check_global` returned `src` after checking that `len >= n`
            // bytes there lie in a buffer of the launch, or a scratch area as large.
            unsafe { read_global(p, &mut data[..n]) };
        }
        c.copies.borrow_mut().open.push(AsyncCopy {
            dst: dst as usize,
            bytes: data,
            len,
            site,
        });
    })
}

/// `cp.async.commit_group`: the copies issued since the last commit form a group.
pub(super) extern "C" fn tessera_emu_cp_async_commit() {
    with((), |c| {
        let mut q = c.copies.borrow_mut();
        let g = std::mem::take(&mut q.open);
        q.committed.push_back(g);
    })
}

/// `cp.async.wait_group n`: every committed group but the newest `n` lands in shared
/// memory (checked and recorded as this thread's writes).
pub(super) extern "C" fn tessera_emu_cp_async_wait(n: i32) {
    with((), |c| {
        let keep = n.max(0) as usize;
        loop {
            let g = {
                let mut q = c.copies.borrow_mut();
                if q.committed.len() <= keep {
                    break;
                }
                q.committed.pop_front()
            };
            for cp in g.into_iter().flatten() {
                if note_shared(c, cp.dst as *const u8, cp.len as i32, true, cp.site) {
                    // SAFETY: `note_shared` checked that the `len` bytes at `dst` lie
                    // in this block's shared memory.
                    unsafe {
                        std::ptr::copy_nonoverlapping(cp.bytes.as_ptr(), cp.dst as *mut u8, cp.len)
                    };
                }
            }
        }
    })
}

/// The mbarrier at shared `bar` of thread `c`'s block: its offset, or `None` (with
/// the error recorded) when `bar` is not an 8-byte aligned place in shared memory.
fn mbar_offset(c: &ThreadCtx<'_>, bar: *const u8, site: i32) -> Option<usize> {
    if !(bar as usize).is_multiple_of(8) {
        misaligned_shared(c, bar, 8, site);
        return None;
    }
    let off = (bar as usize).wrapping_sub(c.blk.shared as usize);
    if off.checked_add(8).is_none_or(|e| e > c.blk.shared_bytes) {
        wg_fail(
            c,
            site,
            format!(
                "an mbarrier at shared offset {off:#x}, outside the block's {} bytes",
                c.blk.shared_bytes
            ),
        );
        return None;
    }
    Some(off)
}

/// `mbarrier.init.shared::cta.b64 [bar], count` (see `crate::emu::tma`).
pub(super) extern "C" fn tessera_emu_mbar_init(bar: *mut u8, count: i32, site: i32) {
    with((), |c| {
        let Some(off) = mbar_offset(c, bar, site) else {
            return;
        };
        let mut m = c.blk.mbars.borrow_mut();
        if m.get(&off)
            .is_some_and(|b| !b.landings.is_empty() || b.tx != 0)
        {
            drop(m);
            wg_fail(
                c,
                site,
                "mbarrier.init of an mbarrier with copies in flight".into(),
            );
            return;
        }
        m.insert(off, Mbar::new(count.max(1) as u32));
    })
}

/// `mbarrier.inval.shared::cta.b64 [bar]`: the mbarrier is gone (a later use other
/// than `mbarrier.init` is an error); invalidating one with copies in flight, or no
/// mbarrier at all, is an error.
pub(super) extern "C" fn tessera_emu_mbar_inval(bar: *mut u8, site: i32) {
    with((), |c| {
        let Some(off) = mbar_offset(c, bar, site) else {
            return;
        };
        let mut m = c.blk.mbars.borrow_mut();
        let why = match m.get(&off) {
            None => "mbarrier.inval of an mbarrier never initialized",
            Some(b) if !b.landings.is_empty() || b.tx != 0 => {
                "mbarrier.inval of an mbarrier with copies in flight"
            }
            Some(_) => {
                m.remove(&off);
                return;
            }
        };
        drop(m);
        wg_fail(c, site, why.into());
    })
}

/// `mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes`.
pub(super) extern "C" fn tessera_emu_mbar_expect_tx(bar: *mut u8, bytes: i32, site: i32) {
    with((), |c| {
        arrive(c, bar, i64::from(bytes), "mbarrier.arrive.expect_tx", site)
    })
}

/// `mbarrier.arrive.shared::cta.b64 _, [bar]`: one arrival, which releases this
/// thread's earlier shared reads to a wait that sees the phase complete.
pub(super) extern "C" fn tessera_emu_mbar_arrive(bar: *mut u8, site: i32) {
    with((), |c| arrive(c, bar, 0, "mbarrier.arrive", site))
}

/// Thread `c` arrives on the mbarrier at `bar` after raising its transaction count
/// by `tx` bytes (`what` names the instruction in errors).
fn arrive(c: &ThreadCtx<'_>, bar: *mut u8, tx: i64, what: &str, site: i32) {
    let Some(off) = mbar_offset(c, bar, site) else {
        return;
    };
    arrive_at(c, c.blk, off, tx, what, site);
}

/// `mapa.shared::cluster` + `mbarrier.arrive.release.cluster.shared::cluster.b64 _,
/// [remote]`: one arrival of thread `c` on the mbarrier at `bar`'s offset in the
/// block of cluster rank `cta` (a rank outside the cluster is an error).
pub(super) extern "C" fn tessera_emu_mbar_arrive_cluster(bar: *mut u8, cta: i32, site: i32) {
    with((), |c| {
        let Some(off) = mbar_offset(c, bar, site) else {
            return;
        };
        let Some(dest) = usize::try_from(cta).ok().and_then(|r| c.cluster.get(r)) else {
            wg_fail(
                c,
                site,
                format!(
                    "mapa to cluster rank {cta}, outside the cluster of {} blocks",
                    c.cluster.len()
                ),
            );
            return;
        };
        arrive_at(c, dest, off, 0, "mbarrier.arrive (cluster)", site);
    })
}

/// Thread `c` arrives on the mbarrier at offset `off` of block `dest` (its own or,
/// through `mapa`, another of its cluster) after raising its transaction count by
/// `tx` bytes.
fn arrive_at(c: &ThreadCtx<'_>, dest: &super::Block, off: usize, tx: i64, what: &str, site: i32) {
    if exited_peer(c, dest, what, site) {
        return;
    }
    let mut m = dest.mbars.borrow_mut();
    let Some(b) = m.get_mut(&off) else {
        drop(m);
        let whose = if std::ptr::eq(dest, c.blk) {
            String::new()
        } else {
            format!(" (in the block of cluster rank {})", dest.rank)
        };
        wg_fail(
            c,
            site,
            format!("{what} on an mbarrier never initialized{whose}"),
        );
        return;
    };
    if b.pending == 0 {
        drop(m);
        wg_fail(
            c,
            site,
            "an arrival on an mbarrier phase with none pending".into(),
        );
        return;
    }
    let n = c.warp_arrivals().get() + 1;
    c.warp_arrivals().set(n);
    b.arrived.push((c.cluster_warp() as u32, n));
    b.tx += tx;
    b.pending -= 1;
    b.try_complete();
}

/// Thread `c` acquires `arrivals` (warp across the cluster, arrival count): what
/// those warps did before arriving is behind whatever `c` does next.
fn acquire(c: &ThreadCtx<'_>, arrivals: &[(u32, u32)]) {
    let mut a = c.acquired.borrow_mut();
    for &(t, n) in arrivals {
        let t = t as usize;
        if a.len() <= t {
            a.resize(t + 1, 0);
        }
        a[t] = a[t].max(n);
    }
}

/// Whether the async proxy's access to the shared byte whose other-kind shadow word is
/// `other` (`shadow_read` for a TMA write, `shadow_write` for a TMA read) races with
/// another thread's access since thread `c`'s last block barrier; records the race.
fn async_proxy_race(c: &ThreadCtx<'_>, other: u64, is_write: bool, site: i32) -> bool {
    let owner = ((other >> 16) & 0xffff) as u32;
    if other == 0
        || (other >> 32) as u32 != c.epoch.get()
        || owner == c.tid + 1
        || c.launch.failed.load(Ordering::Relaxed)
    {
        return false;
    }
    let (span, op) = c.launch.site(site as u32);
    let (other_span, _) = c.launch.site((other & 0xffff) as u32);
    let (writer, reader, kind) = if is_write {
        (c.tid, owner - 1, "write after read")
    } else {
        (owner - 1, c.tid, "read after write")
    };
    c.fail(EmuError::SharedRace {
        kernel: c.launch.kernel.to_string(),
        op,
        span,
        other_span,
        block: c.block.get(),
        writer,
        reader,
        kind,
    });
    true
}

/// `len` bytes of global memory at `addr` a TMA box row reads or writes: the run
/// must lie in the buffer the descriptor's base pointer derives from (TMA needs no
/// alignment); else `None`, the error recorded.
fn box_row(c: &ThreadCtx<'_>, addr: u64, len: usize, site: i32) -> Option<*mut u8> {
    let a = addr as usize;
    if c.launch
        .access_buffers(site as u32)
        .any(|b| b.holds(a, len))
    {
        return Some(a as *mut u8);
    }
    // Reports the access (out of bounds) as a plain access would.
    tessera_emu_check_global(a as *mut u8, 1, site);
    if !c.launch.failed.load(Ordering::Relaxed) {
        wg_fail(
            c,
            site,
            format!("a TMA box row of {len} bytes at {addr:#x} outside its buffer"),
        );
    }
    None
}

/// The registered tensor map a rank-`rank` TMA `what` at `site` goes through, or
/// `None` (the error recorded).
fn tensor_map(
    c: &ThreadCtx<'_>,
    tmap: i64,
    rank: i32,
    what: &str,
    site: i32,
) -> Option<EmuTensorMap> {
    let Some(m) = lookup(tmap as u64) else {
        wg_fail(
            c,
            site,
            format!("a TMA {what} through tensor map {tmap:#x}, which the launch did not build"),
        );
        return None;
    };
    if m.rank as i32 != rank {
        wg_fail(
            c,
            site,
            format!(
                "a rank-{rank} TMA {what} through a tensor map of rank {}",
                m.rank
            ),
        );
        return None;
    }
    Some(m)
}

/// The shared offset of a TMA box of `n` bytes at `p` (128-byte aligned, inside the
/// block's shared memory), or `None` (the error recorded).
fn box_offset(c: &ThreadCtx<'_>, p: *const u8, n: usize, what: &str, site: i32) -> Option<usize> {
    let off = (p as usize).wrapping_sub(c.blk.shared as usize);
    if !off.is_multiple_of(128) || off.checked_add(n).is_none_or(|e| e > c.blk.shared_bytes) {
        wg_fail(
            c,
            site,
            format!(
                "a TMA {what} of a {n}-byte box at shared offset {off:#x} (it must be 128-byte aligned, inside the block's {} bytes)",
                c.blk.shared_bytes
            ),
        );
        return None;
    }
    Some(off)
}

/// `cp.async.bulk.tensor.{rank}d...mbarrier::complete_tx::bytes [dst], [tmap, {c0,
/// c1, c2}], [bar]` (see `crate::emu::tma`): the box is read from global memory now and
/// lands in shared memory when a thread waits for `bar`'s phase. Writing over bytes
/// another thread read since the last block barrier is a race.
#[allow(clippy::too_many_arguments)]
pub(super) extern "C" fn tessera_emu_tma_load(
    dst: *mut u8,
    tmap: i64,
    rank: i32,
    c0: i32,
    c1: i32,
    c2: i32,
    bar: *mut u8,
    site: i32,
) {
    with((), |c| {
        tma_load(c, dst, tmap, rank, [c0, c1, c2], bar, None, site);
    })
}

/// `cp.async.bulk.tensor.{rank}d...mbarrier::complete_tx::bytes.multicast::cluster
/// [dst], [tmap, {c0, c1, c2}], [bar], mask`: the copy of [`tessera_emu_tma_load`]
/// landing at `dst`'s and `bar`'s offsets in every block of the cluster whose rank
/// is a bit of `mask` (each such block's race shadow checked; a rank outside the
/// cluster, or an empty mask, is an error).
#[allow(clippy::too_many_arguments)]
pub(super) extern "C" fn tessera_emu_tma_load_multicast(
    dst: *mut u8,
    tmap: i64,
    rank: i32,
    c0: i32,
    c1: i32,
    c2: i32,
    bar: *mut u8,
    mask: i32,
    site: i32,
) {
    with((), |c| {
        let n = c.cluster.len();
        if mask <= 0 || mask >= 1 << 16 || (mask as u32) >> n != 0 {
            wg_fail(
                c,
                site,
                format!("a TMA multicast to CTA mask {mask:#x} in a cluster of {n} blocks"),
            );
            return;
        }
        tma_load(
            c,
            dst,
            tmap,
            rank,
            [c0, c1, c2],
            bar,
            Some(mask as u32),
            site,
        );
    })
}

/// Thread `c`'s TMA box copy (see [`tessera_emu_tma_load`]) into its own block, or
/// into the blocks of its cluster whose ranks are the bits of `mask`.
#[allow(clippy::too_many_arguments)]
fn tma_load(
    c: &ThreadCtx<'_>,
    dst: *mut u8,
    tmap: i64,
    rank: i32,
    coords: [i32; 3],
    bar: *mut u8,
    mask: Option<u32>,
    site: i32,
) {
    let Some(boff) = mbar_offset(c, bar, site) else {
        return;
    };
    let Some(m) = tensor_map(c, tmap, rank, "copy", site) else {
        return;
    };
    let n = m.box_bytes();
    let Some(off) = box_offset(c, dst, n, "copy", site) else {
        return;
    };
    let mut image = vec![0u8; n];
    let row_bytes = (m.box_dims[0] * m.elem_bytes) as usize;
    for (lin, run) in m.rows(coords) {
        if let Some((addr, at, len)) = run {
            let Some(src) = box_row(c, addr, len, site) else {
                return;
            };
            // SAFETY: the `len` bytes at `src` lie in a buffer of the launch
            // (`box_row`); `lin + at + len <= lin + row_bytes <= n`.
            unsafe { read_global(src, &mut image[lin + at..lin + at + len]) };
        }
        debug_assert!(lin + row_bytes <= n);
    }
    let chunks: Vec<(usize, [u8; 16])> = (0..n)
        .step_by(16)
        .map(|lin| {
            let mut ch = [0u8; 16];
            ch.copy_from_slice(&image[lin..lin + 16]);
            (off + m.swizzled(off, lin), ch)
        })
        .collect();
    let dests: Vec<&super::Block> = match mask {
        None => vec![c.blk],
        Some(mask) => c
            .cluster
            .iter()
            .filter(|b| mask >> b.rank & 1 == 1)
            .collect(),
    };
    let warp_size = c.blk.team.warp_size() as usize;
    for dest in dests {
        // The write must not overtake reads of other threads since the last
        // barrier. (Reads whose thread arrived on an mbarrier after them, an
        // arrival this thread acquired, are behind it.)
        let acquired = c.acquired.borrow();
        let released = |b: usize| {
            let other = dest.shadow_read[b].get();
            let reader = ((other >> 16) & 0xffff) as usize;
            reader > 0
                && acquired
                    .get(dest.rank as usize * 32 + (reader - 1) / warp_size)
                    .is_some_and(|&a| a > dest.shadow_read_arrivals[b].get())
        };
        let remote = !std::ptr::eq(dest, c.blk);
        if exited_peer(c, dest, "a TMA multicast", site) {
            return;
        }
        if (off..off + n).any(|b| {
            let other = dest.shadow_read[b].get();
            !released(b)
                && (if remote {
                    remote_race(c, dest, other, site)
                } else {
                    async_proxy_race(c, other, true, site)
                })
        }) {
            return;
        }
        drop(acquired);
        let mut bars = dest.mbars.borrow_mut();
        let Some(b) = bars.get_mut(&boff) else {
            drop(bars);
            let whose = if remote {
                format!(" in the block of cluster rank {}", dest.rank)
            } else {
                String::new()
            };
            wg_fail(
                c,
                site,
                format!("a TMA copy completing on an mbarrier never initialized{whose}"),
            );
            return;
        };
        b.landings.push(Landing {
            chunks: chunks.clone(),
            bytes: n as i64,
        });
    }
}

/// Whether `dest`, another block of `c`'s cluster, has ended (every thread
/// exited): its shared memory is gone, and `what` reaching it is an error, recorded.
/// (A block must outlive the cluster's accesses to it: a multicasting producer
/// waits for its slots' last releases before it exits.)
fn exited_peer(c: &ThreadCtx<'_>, dest: &super::Block, what: &str, site: i32) -> bool {
    if std::ptr::eq(dest, c.blk) || !dest.team.done() {
        return false;
    }
    wg_fail(
        c,
        site,
        format!(
            "{what} reaching the shared memory of cluster rank {}, whose block has exited",
            dest.rank
        ),
    );
    true
}

/// Whether a multicast copy into block `dest` (another block of `c`'s cluster) over
/// a byte whose last read is `other` (its `shadow_read` word) races: a read there
/// that no arrival `c` acquired orders before the copy (the reading thread's own
/// barriers do not order another block's copies); records the race.
fn remote_race(c: &ThreadCtx<'_>, dest: &super::Block, other: u64, site: i32) -> bool {
    let owner = ((other >> 16) & 0xffff) as u32;
    if other == 0 || c.launch.failed.load(Ordering::Relaxed) {
        return false;
    }
    let (span, op) = c.launch.site(site as u32);
    let (other_span, _) = c.launch.site((other & 0xffff) as u32);
    c.fail(EmuError::SharedRace {
        kernel: c.launch.kernel.to_string(),
        op,
        span,
        other_span,
        block: c.block.get(),
        writer: c.tid,
        reader: owner - 1,
        kind: if dest.rank == c.blk.rank {
            "write after read"
        } else {
            "write after read (a multicast copy into another block of the cluster)"
        },
    });
    true
}

/// `cp.async.bulk.tensor.{rank}d.global.shared::cta.tile.bulk_group [tmap, {c0, c1,
/// c2}], [src]` (see `crate::emu::tma`): recorded; the box is read from shared memory
/// and written to the tensor (its elements inside the tensor only) when the thread
/// waits for its bulk group, so a kernel that overwrites the box before waiting
/// stores the overwritten data. Shared memory this thread wrote since its last
/// `fence.proxy.async` is an error (the async proxy may not see it).
#[allow(clippy::too_many_arguments)]
pub(super) extern "C" fn tessera_emu_tma_store(
    src: *mut u8,
    tmap: i64,
    rank: i32,
    c0: i32,
    c1: i32,
    c2: i32,
    site: i32,
) {
    with((), |c| {
        let Some(m) = tensor_map(c, tmap, rank, "store", site) else {
            return;
        };
        let n = m.box_bytes();
        let Some(off) = box_offset(c, src, n, "store", site) else {
            return;
        };
        if c.wg_dirty
            .get()
            .is_some_and(|(lo, hi)| lo < off + n && off < hi)
        {
            wg_fail(
                c,
                site,
                "a TMA store of shared memory written without a fence.proxy.async after the writes"
                    .into(),
            );
            return;
        }
        c.tma_stores.borrow_mut().push(TmaStore {
            src_off: off,
            map: m,
            coords: [c0, c1, c2],
            site,
        });
    })
}

/// `cp.async.bulk.commit_group; cp.async.bulk.wait_group.read 0`: the thread's TMA
/// stores read their boxes (a byte another thread wrote since the last block
/// barrier is a race) and write the tensor.
pub(super) extern "C" fn tessera_emu_tma_store_wait(_site: i32) {
    with((), |c| {
        let stores = std::mem::take(&mut *c.tma_stores.borrow_mut());
        for st in stores {
            let (m, off, site) = (st.map, st.src_off, st.site);
            let n = m.box_bytes();
            let mut image = vec![0u8; n];
            for lin in (0..n).step_by(16) {
                let at = off + m.swizzled(off, lin);
                if (at..at + 16)
                    .any(|b| async_proxy_race(c, c.blk.shadow_write[b].get(), false, site))
                {
                    return;
                }
                // SAFETY: `tma_store` checked that the box lies in shared memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        c.blk.shared.add(at),
                        image.as_mut_ptr().add(lin),
                        16,
                    )
                };
            }
            for (lin, run) in m.rows(st.coords) {
                let Some((addr, at, len)) = run else { continue };
                let Some(dst) = box_row(c, addr, len, site) else {
                    return;
                };
                // SAFETY: the `len` bytes at `dst` lie in a buffer of the launch.
                unsafe { write_global(dst, &image[lin + at..lin + at + len]) };
            }
        }
    })
}

/// Waits for the phase of parity `parity` of the mbarrier at `bar` (the
/// `mbarrier.try_wait.parity` loop): lands the copies that complete on it, then
/// polls until its arrivals are in; a phase that cannot complete is an error after a
/// few seconds.
pub(super) extern "C" fn tessera_emu_mbar_wait(bar: *mut u8, parity: i32, site: i32) {
    with((), |c| {
        let Some(off) = mbar_offset(c, bar, site) else {
            return;
        };
        let start = std::time::Instant::now();
        loop {
            let mut bars = c.blk.mbars.borrow_mut();
            let Some(b) = bars.get_mut(&off) else {
                drop(bars);
                wg_fail(
                    c,
                    site,
                    "mbarrier wait on an mbarrier never initialized".into(),
                );
                return;
            };
            if (b.phase & 1) as i32 != parity & 1 {
                acquire(c, &b.released);
                return;
            }
            for l in std::mem::take(&mut b.landings) {
                for (o, ch) in l.chunks {
                    // SAFETY: `tma_load` checked that the box lies in shared memory.
                    unsafe { std::ptr::copy_nonoverlapping(ch.as_ptr(), c.blk.shared.add(o), 16) };
                    // Written by the async proxy: visible to every thread after the wait.
                    for w in &c.blk.shadow_write[o..o + 16] {
                        w.set(0);
                    }
                }
                b.tx -= l.bytes;
            }
            // (Once the launch failed, waits return early: what follows is no
            // news.)
            // (Before the last arrival, a negative count is the bytes of copies that
            // landed before their `expect_tx`: a peer's multicast may.)
            if b.tx < 0 && b.pending == 0 && !c.launch.failed.load(Ordering::Relaxed) {
                let tx = b.tx;
                drop(bars);
                wg_fail(
                    c,
                    site,
                    format!(
                        "TMA copies delivered {} bytes more than mbarrier.arrive.expect_tx announced",
                        -tx
                    ),
                );
                return;
            }
            b.try_complete();
            if (b.phase & 1) as i32 != parity & 1 {
                acquire(c, &b.released);
                return;
            }
            let (pending, tx) = (b.pending, b.tx);
            drop(bars);
            if start.elapsed() > std::time::Duration::from_secs(5)
                || c.launch.failed.load(Ordering::Relaxed)
            {
                if !c.launch.failed.load(Ordering::Relaxed) {
                    wg_fail(
                        c,
                        site,
                        format!(
                            "an mbarrier phase of parity {parity} never completed: {pending} arrivals and {tx} transaction bytes outstanding"
                        ),
                    );
                }
                return;
            }
            c.park(Park::Poll);
        }
    })
}
