//! A peer's part of a window, reached through MPI ([`Peer`]: loads are `MPI_Rget`,
//! stores `MPI_Put`, atomics `MPI_Compare_and_swap` and `MPI_Fetch_and_op`), and a
//! part mapped in this process ([`Part`]: a rank's own, or a peer's on its node).
//!
//! Contract ([`RemoteMemory`]'s ordering): a put completes at the next get, atomic or
//! quiet of this process (until then its data is a copy of its own); each get and
//! atomic completes before it returns, bounded by the wait timeout (an atomic is
//! followed by a probe of its location, see the transport's docs); a peer that
//! stopped answering fails every operation on it at once; accesses are checked
//! against the part's bounds. A mapped part's atomics go through the window, since
//! MPI's atomics are only atomic with one another.

use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::Arc;

use mpi::ffi;
use tessera_ir::interp::{HostMemory, RemoteMemory};

use super::calls::{Guard, check, lock, null_request, stopped, watched};
use super::window::{Pending, Window};

/// The largest count one MPI call moves (its counts are `int`s).
const CHUNK: usize = 1 << 30;
/// Puts tracked before a flush (past it, the next put flushes first).
const MAX_PENDING: usize = 1024;

/// Rank `target`'s part of a window (`len` bytes), reached through MPI.
pub(super) struct Peer {
    pub(super) win: Arc<Window>,
    pub(super) target: u32,
    pub(super) len: usize,
}

impl Peer {
    /// Runs `call`, MPI calls on the target (see [`watched`]): most start requests
    /// and return, but some one-sided components complete operations inside the
    /// call (`osc/ucx`'s atomics, for one).
    fn watched<T>(&self, what: &'static str, call: impl FnOnce() -> T) -> T {
        watched(
            self.win.me,
            Some(self.target),
            what,
            self.win.fate.timeout,
            call,
        )
    }

    /// Starts the probe that follows an atomic (`MPI_Compare_and_swap`,
    /// `MPI_Fetch_and_op`: neither has a request form) on the same location: an
    /// `MPI_Rget` of one `ty` at `disp` into `out`, whose request `req` completes
    /// once the target answered it, after the atomic in practice (see the module
    /// docs). The lock held.
    ///
    /// # Safety
    /// `out` holds one `ty` and outlives the request; `disp` is inside the
    /// target's part.
    unsafe fn probe(
        &self,
        out: *mut u8,
        ty: ffi::MPI_Datatype,
        disp: ffi::MPI_Aint,
        req: &mut ffi::MPI_Request,
    ) -> Result<(), String> {
        // SAFETY: as the caller promised; the window is in a passive epoch.
        check("MPI_Rget", unsafe {
            ffi::MPI_Rget(
                out.cast(),
                1,
                ty,
                self.target as c_int,
                disp,
                1,
                ty,
                self.win.win,
                req,
            )
        })
    }

    /// Completes at the origin the atomic whose probe came back (the lock held): its
    /// result buffer is then its own. `MPI_Win_flush_local` waits for nothing the
    /// target has not sent already, except in `osc/pt2pt`, where it waits for
    /// every request and put of the window, to any rank: unless this process has
    /// none ([`Window::alone`]), a flush of the target completes it instead (one
    /// more answer of a rank that just answered). Watched.
    fn complete_at_origin(&self) -> Result<(), String> {
        let (what, flush): (_, unsafe extern "C" fn(c_int, ffi::MPI_Win) -> c_int) =
            if self.win.alone() {
                ("MPI_Win_flush_local", ffi::MPI_Win_flush_local)
            } else {
                ("MPI_Win_flush", ffi::MPI_Win_flush)
            };
        self.watched(what, || {
            // SAFETY: a live window in a passive-target epoch.
            check(what, unsafe { flush(self.target as c_int, self.win.win) })
        })
    }

    /// The MPI lock for an operation on the target, unless it stopped answering.
    fn lock(&self) -> Result<Guard, String> {
        match stopped(self.target) {
            Some(why) => Err(why),
            None => lock(),
        }
    }

    fn range(&self, offset: usize, n: usize) -> Result<ffi::MPI_Aint, String> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => ffi::MPI_Aint::try_from(offset)
                .map_err(|_| format!("offset {offset} is too large for MPI")),
            _ => Err(format!(
                "{n} bytes at offset {offset} are outside rank {}'s {} bytes",
                self.target, self.len
            )),
        }
    }

    fn uint(width: usize) -> Result<ffi::MPI_Datatype, String> {
        // SAFETY: reading MPI's predefined datatype handles.
        Ok(unsafe {
            match width {
                1 => ffi::RSMPI_UINT8_T,
                2 => ffi::RSMPI_UINT16_T,
                4 => ffi::RSMPI_UINT32_T,
                8 => ffi::RSMPI_UINT64_T,
                w => return Err(format!("no {w}-byte atomic")),
            }
        })
    }
}

impl RemoteMemory for Peer {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, offset: usize, out: &mut [u8]) -> Result<(), String> {
        self.range(offset, out.len())?;
        let g = self.lock()?;
        let g = self.win.complete_puts(g)?;
        // Owned: leaked if the get does not complete (MPI keeps it).
        let buf: *mut [u8] = Box::into_raw(vec![0u8; out.len()].into_boxed_slice());
        let mut reqs = Vec::with_capacity(out.len().div_ceil(CHUNK));
        self.watched("MPI_Rget", || {
            for k in 0..out.len().div_ceil(CHUNK) {
                let n = CHUNK.min(out.len() - k * CHUNK);
                let disp = self.range(offset + k * CHUNK, n)?;
                let mut req = null_request();
                // SAFETY: `n` bytes of `buf`, which outlives the request; the target
                // range is inside the target's part (checked); the window is in a
                // passive epoch.
                check("MPI_Rget", unsafe {
                    ffi::MPI_Rget(
                        buf.cast::<u8>().add(k * CHUNK).cast(),
                        n as c_int,
                        ffi::RSMPI_UINT8_T,
                        self.target as c_int,
                        disp,
                        n as c_int,
                        ffi::RSMPI_UINT8_T,
                        self.win.win,
                        &mut req,
                    )
                })?;
                reqs.push(req);
            }
            Ok::<(), String>(())
        })?;
        let g = self
            .win
            .poll(g, &mut reqs, |_| self.target, "a get from its heap")?;
        drop(g);
        // SAFETY: the get completed: MPI is done with the buffer.
        let buf = unsafe { Box::from_raw(buf) };
        out.copy_from_slice(&buf);
        Ok(())
    }

    fn put(&self, offset: usize, data: &[u8]) -> Result<(), String> {
        self.range(offset, data.len())?;
        let mut g = self.lock()?;
        let end = offset + data.len();
        let overlaps = {
            let p = self.win.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.len() >= MAX_PENDING
                || p.iter()
                    .any(|q| q.target == self.target && q.start < end && offset < q.end)
        };
        if overlaps {
            g = self.win.complete_puts(g)?;
        }
        if data.is_empty() {
            return Ok(());
        }
        // A copy, kept until the put completed at its target (`data` may be reused
        // when this returns): nothing to wait for here.
        let copy = Box::<[u8]>::from(data);
        let issued = self.watched("MPI_Put", || {
            for k in 0..data.len().div_ceil(CHUNK) {
                let n = CHUNK.min(data.len() - k * CHUNK);
                let disp = self.range(offset + k * CHUNK, n)?;
                // SAFETY: `n` bytes of the copy, which lives until the put completed
                // (or forever); the target range is inside the target's part
                // (checked); the window is in a passive epoch.
                check("MPI_Put", unsafe {
                    ffi::MPI_Put(
                        copy.as_ptr().add(k * CHUNK).cast(),
                        n as c_int,
                        ffi::RSMPI_UINT8_T,
                        self.target as c_int,
                        disp,
                        n as c_int,
                        ffi::RSMPI_UINT8_T,
                        self.win.win,
                    )
                })?;
            }
            Ok::<(), String>(())
        });
        if let Err(e) = issued {
            // MPI may read the copy still.
            std::mem::forget(copy);
            return Err(e);
        }
        // Completed at its target by the next get, atomic or quiet (of any thread).
        self.win
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Pending {
                target: self.target,
                start: offset,
                end,
                _data: copy,
            });
        drop(g);
        Ok(())
    }

    fn compare_and_swap(
        &self,
        offset: usize,
        width: usize,
        expected: u64,
        desired: u64,
    ) -> Result<u64, String> {
        let disp = self.range(offset, width)?;
        if !offset.is_multiple_of(width) {
            return Err(format!(
                "a {width}-byte atomic at unaligned offset {offset}"
            ));
        }
        let ty = Peer::uint(width)?;
        // The operands as `width`-byte integers in memory (native byte order).
        let bytes = |v: u64| -> [u8; 8] {
            let mut b = [0u8; 8];
            match width {
                1 => b[0] = v as u8,
                2 => b[..2].copy_from_slice(&(v as u16).to_ne_bytes()),
                4 => b[..4].copy_from_slice(&(v as u32).to_ne_bytes()),
                _ => b = v.to_ne_bytes(),
            }
            b
        };
        // New, expected, seen, and the probe's. Owned: leaked if the operation does
        // not complete (MPI keeps them).
        let bufs: *mut [[u8; 8]; 4] =
            Box::into_raw(Box::new([bytes(desired), bytes(expected), [0; 8], [0; 8]]));
        let at = |i: usize| -> *mut u8 {
            // SAFETY: `i < 4`: inside the live allocation.
            unsafe { bufs.cast::<[u8; 8]>().add(i).cast::<u8>() }
        };
        let g = self.lock()?;
        let g = self.win.complete_puts(g)?;
        let mut probe = null_request();
        // SAFETY: the buffers hold `width` bytes each and outlive the operations;
        // the target range was checked.
        self.watched("MPI_Compare_and_swap", || unsafe {
            check(
                "MPI_Compare_and_swap",
                ffi::MPI_Compare_and_swap(
                    at(0).cast(),
                    at(1).cast(),
                    at(2).cast(),
                    ty,
                    self.target as c_int,
                    disp,
                    self.win.win,
                ),
            )?;
            self.probe(at(3), ty, disp, &mut probe)
        })?;
        let g = self.win.poll(
            g,
            std::slice::from_mut(&mut probe),
            |_| self.target,
            "a compare-and-swap on its heap",
        )?;
        self.complete_at_origin()?;
        drop(g);
        // SAFETY: both operations completed: MPI is done with the buffers.
        let seen = unsafe { Box::from_raw(bufs) }[2];
        Ok(match width {
            1 => u64::from(seen[0]),
            2 => u64::from(u16::from_ne_bytes([seen[0], seen[1]])),
            4 => u64::from(u32::from_ne_bytes([seen[0], seen[1], seen[2], seen[3]])),
            _ => u64::from_ne_bytes(seen),
        })
    }

    fn fetch_add_u64(&self, offset: usize, v: u64) -> Result<u64, String> {
        let disp = self.range(offset, 8)?;
        if !offset.is_multiple_of(8) {
            return Err(format!("an 8-byte atomic at unaligned offset {offset}"));
        }
        let g = self.lock()?;
        let g = self.win.complete_puts(g)?;
        // The operand, the result and the probe's. Owned: leaked if the operation
        // does not complete (MPI keeps them).
        let bufs: *mut [u64; 3] = Box::into_raw(Box::new([v, 0, 0]));
        let at = |i: usize| -> *mut u64 {
            // SAFETY: `i < 3`: inside the live allocation.
            unsafe { bufs.cast::<u64>().add(i) }
        };
        let mut probe = null_request();
        // SAFETY: 8-byte operands that outlive the operations; the target range was
        // checked.
        self.watched("MPI_Fetch_and_op", || unsafe {
            check(
                "MPI_Fetch_and_op",
                ffi::MPI_Fetch_and_op(
                    at(0).cast(),
                    at(1).cast(),
                    ffi::RSMPI_UINT64_T,
                    self.target as c_int,
                    disp,
                    ffi::RSMPI_SUM,
                    self.win.win,
                ),
            )?;
            self.probe(at(2).cast(), ffi::RSMPI_UINT64_T, disp, &mut probe)
        })?;
        let g = self.win.poll(
            g,
            std::slice::from_mut(&mut probe),
            |_| self.target,
            "an atomic on its heap",
        )?;
        self.complete_at_origin()?;
        drop(g);
        // SAFETY: both operations completed: MPI is done with the buffers.
        Ok(unsafe { Box::from_raw(bufs) }[1])
    }

    fn load_u64(&self, offset: usize) -> Result<u64, String> {
        // An atomic read (a get racing with other ranks' atomics is undefined in MPI).
        self.fetch_add_u64(offset, 0)
    }

    fn quiet(&self) -> Result<(), String> {
        let g = lock()?;
        self.win.complete_puts(g).map(drop)
    }

    fn progress(&self) {
        // A broken transport makes no MPI call.
        let Ok(_g) = lock() else {
            return;
        };
        let mut flag: c_int = 0;
        // SAFETY: MPI is initialized; probing does not receive anything (the
        // window's own traffic runs on its own communicator), it lets MPI progress.
        // MPI_Win_sync makes the peers' updates of local window memory visible to
        // this process's loads (MPI's separate memory model).
        unsafe {
            let _ = ffi::MPI_Iprobe(
                ffi::RSMPI_ANY_SOURCE,
                ffi::RSMPI_ANY_TAG,
                ffi::RSMPI_COMM_WORLD,
                &mut flag,
                ffi::RSMPI_STATUS_IGNORE,
            );
            let _ = ffi::MPI_Win_sync(self.win.win);
        }
    }
}

/// A rank's part of a window mapped in this process (this rank's own, or a peer's on
/// the same node) as plain host memory; its atomics go through the window
/// ([`HostMemory::engine`]).
pub(super) struct Part {
    win: Arc<Window>,
    target: u32,
    base: NonNull<u8>,
}

impl Part {
    /// Rank `target`'s part, if it is mapped here ([`Window::mapped`]).
    pub(super) fn mapped(win: &Arc<Window>, target: u32) -> Option<Part> {
        Some(Part {
            base: win.mapped(target)?,
            win: win.clone(),
            target,
        })
    }
}

// SAFETY: the memory is accessed only atomically or through raw pointers, like
// every heap; the window keeps it alive.
unsafe impl Send for Part {}
// SAFETY: as above.
unsafe impl Sync for Part {}

// SAFETY: mapped parts hold at least the window's `len` bytes (checked when the node's
// parts were queried), 8-byte aligned (MPI aligns allocations; this rank's is
// checked), until the window and the node's allocation are freed, which `win` delays
// past this value.
unsafe impl HostMemory for Part {
    fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }
    fn len(&self) -> usize {
        self.win.len
    }
    fn engine(&self) -> Option<Arc<dyn RemoteMemory>> {
        Some(Arc::new(Peer {
            win: self.win.clone(),
            target: self.target,
            len: self.win.len,
        }))
    }
}
