//! Worlds of ranks: symmetric heaps, symmetric buffers and host-side team operations.
//!
//! Tessera programs that communicate are SPMD, as with `torchrun`, NVSHMEM or MPI:
//! every rank runs the same code on its own device and calls the same collective
//! operations in the same order. [`World::local`] runs `n` ranks as threads of this
//! process, each with its own [`Rank`] handle.
//!
//! **Symmetric heap.** Each rank owns one heap (`heap_bytes`, 256 MiB by default or
//! `TESSERA_HEAP_BYTES`), laid out identically on every rank:
//!
//! | bytes | what |
//! |---|---|
//! | `0..256` | control words ([`tessera_ir::interp::ctrl`]): barrier counter, abort flag |
//! | `256..256+signal_bytes` | signal pads ([`Rank::alloc_signals`]), zeroed |
//! | the rest | data ([`Rank::alloc`]) |
//!
//! Both regions are bump allocators with 256-byte alignment, so the k-th allocation
//! lands at the same offset on every rank; each allocation is checked against the
//! other ranks' (a rank allocating a different size or kind is an [`Error::Comm`],
//! not silent corruption). Memory is released when the world ends.
//!
//! **Failure.** A rank whose closure fails marks the world as failed: every rank's
//! device-side waits and host barriers stop with an error instead of hanging, and
//! [`World::run`] returns the first root-cause error (not the consequences).

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tessera_ir::interp::{CommWorld, HostBuffer, HostMemory, InterpError, ctrl};
use tessera_ir::types::ScalarType;

use crate::buffer::{Buffer, Element, Storage};
use crate::device::Backend;
use crate::{Device, Error};

/// Bytes of control words at the start of every heap.
pub const CTRL_BYTES: usize = ctrl::WORDS * 8;
/// Alignment of every symmetric allocation.
pub const SYM_ALIGN: usize = 256;

/// A rank's heap in host memory: zeroed, 4096-byte aligned.
struct HostHeap {
    ptr: NonNull<u8>,
    len: usize,
}

impl HostHeap {
    fn new(len: usize) -> Result<HostHeap, String> {
        let layout = std::alloc::Layout::from_size_align(len.max(CTRL_BYTES), 4096)
            .map_err(|e| format!("heap of {len} bytes: {e}"))?;
        // SAFETY: the layout has a nonzero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        NonNull::new(ptr)
            .map(|ptr| HostHeap {
                ptr,
                len: layout.size(),
            })
            .ok_or_else(|| format!("cannot allocate a heap of {len} bytes"))
    }
}

impl Drop for HostHeap {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).expect("checked in new");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

// SAFETY: the heap is plain memory accessed only atomically or through raw pointers.
unsafe impl Send for HostHeap {}
// SAFETY: as above.
unsafe impl Sync for HostHeap {}

// SAFETY: `ptr` is valid for `len` bytes, 4096-aligned, until drop.
unsafe impl HostMemory for HostHeap {
    fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// What one symmetric allocation was, for the same-order check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AllocRecord {
    signals: bool,
    offset: usize,
    bytes: usize,
    elem: ScalarType,
}

/// State shared by the ranks of one world.
pub(crate) struct Shared {
    size: u32,
    /// Every rank's heap.
    pub(crate) heaps: Arc<[Arc<dyn HostMemory>]>,
    /// Every rank's control words (views of the heaps' first bytes).
    ctrl: Arc<[Arc<HostBuffer>]>,
    allocs: Mutex<Vec<AllocRecord>>,
    barrier: Mutex<(u64, u64)>,
    barrier_cv: Condvar,
    timeout: Duration,
    signal_bytes: usize,
}

impl Shared {
    fn interp_world(&self, rank: u32) -> CommWorld {
        CommWorld {
            rank,
            size: self.size,
            ctrl: self.ctrl.clone(),
            timeout: self.timeout,
        }
    }

    /// The rank that failed first, if any.
    fn failed(&self) -> Option<u32> {
        self.interp_world(0).failed_rank()
    }

    fn abort(&self, rank: u32) {
        self.interp_world(rank).abort();
        let _g = self.barrier.lock().unwrap_or_else(|e| e.into_inner());
        self.barrier_cv.notify_all();
    }
}

/// A rank's part in a world, attached to its [`Device`] handle so that launches of
/// communicating kernels know their rank, world and heaps.
pub(crate) struct RankComm {
    pub(crate) rank: u32,
    pub(crate) shared: Arc<Shared>,
}

impl RankComm {
    /// The interpreter's view of this rank's world.
    pub(crate) fn interp_world(&self) -> CommWorld {
        self.shared.interp_world(self.rank)
    }

    /// Number of ranks.
    pub(crate) fn size(&self) -> u32 {
        self.shared.size
    }
}

/// A world of ranks to run SPMD code on: build it, then [`World::run`].
#[derive(Clone, Debug)]
pub struct World {
    size: usize,
    device: Device,
    heap_bytes: usize,
    signal_bytes: usize,
    timeout: Duration,
}

impl World {
    /// `size` ranks as threads of this process, each on the CPU device (change with
    /// [`World::on`]).
    pub fn local(size: usize) -> World {
        let heap_bytes = std::env::var("TESSERA_HEAP_BYTES")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(256 << 20);
        World {
            size,
            device: Device::cpu(),
            heap_bytes,
            signal_bytes: 1 << 20,
            timeout: tessera_ir::interp::default_wait_timeout(),
        }
    }

    /// Runs every rank on (a handle of) `device`: the CPU or a SIMT emulator.
    pub fn on(mut self, device: &Device) -> World {
        self.device = device.clone();
        self
    }

    /// Bytes of each rank's symmetric heap (control words and signals included).
    pub fn heap_bytes(mut self, bytes: usize) -> World {
        self.heap_bytes = bytes;
        self
    }

    /// Bytes of each heap reserved for signal pads (1 MiB by default).
    pub fn signal_bytes(mut self, bytes: usize) -> World {
        self.signal_bytes = bytes;
        self
    }

    /// How long a device-side wait or host barrier waits before failing (default:
    /// `TESSERA_WAIT_TIMEOUT` seconds, else 30 s).
    pub fn wait_timeout(mut self, timeout: Duration) -> World {
        self.timeout = timeout;
        self
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Runs `f` once per rank, concurrently, and returns the ranks' results in rank
    /// order. When a rank fails, the others are released (their waits and barriers
    /// fail) and the first root-cause error is returned.
    pub fn run<R: Send>(
        &self,
        f: impl Fn(&Rank) -> Result<R, Error> + Sync,
    ) -> Result<Vec<R>, Error> {
        let comm = |message: String| Error::Comm { rank: 0, message };
        if self.size == 0 || self.size > 1024 {
            return Err(comm(format!(
                "a world needs 1 to 1024 ranks, got {}",
                self.size
            )));
        }
        match self.device.backend {
            Backend::Cpu | Backend::Emu(_) => {}
            _ => {
                return Err(comm(format!(
                    "World::local runs ranks on the CPU or the emulator, not on {}",
                    self.device.id()
                )));
            }
        }
        let min = CTRL_BYTES + self.signal_bytes;
        if self.heap_bytes < min {
            return Err(comm(format!(
                "a heap of {} bytes cannot hold the control words and {} bytes of signals",
                self.heap_bytes, self.signal_bytes
            )));
        }
        let mut heaps: Vec<Arc<dyn HostMemory>> = Vec::with_capacity(self.size);
        let mut ctrls = Vec::with_capacity(self.size);
        for _ in 0..self.size {
            let h: Arc<dyn HostMemory> = Arc::new(HostHeap::new(self.heap_bytes).map_err(comm)?);
            ctrls.push(Arc::new(HostBuffer::view(
                h.clone(),
                0,
                ScalarType::U64,
                ctrl::WORDS,
            )?));
            heaps.push(h);
        }
        let shared = Arc::new(Shared {
            size: self.size as u32,
            heaps: heaps.into(),
            ctrl: ctrls.into(),
            allocs: Mutex::new(Vec::new()),
            barrier: Mutex::new((0, 0)),
            barrier_cv: Condvar::new(),
            timeout: self.timeout,
            signal_bytes: self.signal_bytes,
        });
        let results: Vec<Result<R, Error>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.size as u32)
                .map(|r| {
                    let shared = shared.clone();
                    let f = &f;
                    let base = &self.device;
                    s.spawn(move || {
                        let rank = Rank::new(r, shared.clone(), base, self.heap_bytes);
                        let out = f(&rank);
                        if out.is_err() {
                            shared.abort(r);
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .enumerate()
                .map(|(r, h)| {
                    h.join().unwrap_or_else(|_| {
                        shared.abort(r as u32);
                        Err(Error::Comm {
                            rank: r as u32,
                            message: "the rank's closure panicked".into(),
                        })
                    })
                })
                .collect()
        });
        let mut first_consequence = None;
        let mut out = Vec::with_capacity(results.len());
        for r in results {
            match r {
                Ok(v) => out.push(v),
                Err(e) if is_consequence(&e) => {
                    first_consequence.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        match first_consequence {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

/// True for errors that only report another rank's failure.
fn is_consequence(e: &Error) -> bool {
    match e {
        Error::Exec(ie) => matches!(**ie, InterpError::Aborted { .. }),
        Error::Comm { message, .. } => message.starts_with("abandoned"),
        _ => false,
    }
}

/// Bump cursors of one rank's heap regions.
#[derive(Debug)]
struct Cursor {
    signal_next: usize,
    data_next: usize,
    count: usize,
}

/// One rank of a world: its index, its device, its heap.
pub struct Rank {
    rank: u32,
    shared: Arc<Shared>,
    device: Device,
    heap_bytes: usize,
    cursor: Mutex<Cursor>,
    /// The collectives' workspace (signal pads, staging buffers, call counter),
    /// allocated collectively on the first collective call.
    pub(crate) coll: Mutex<Option<crate::collectives::Workspace>>,
}

impl std::fmt::Debug for Rank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rank({} of {})", self.rank, self.shared.size)
    }
}

impl Rank {
    fn new(rank: u32, shared: Arc<Shared>, base: &Device, heap_bytes: usize) -> Rank {
        let mut device = base.clone();
        device.comm = Some(Arc::new(RankComm {
            rank,
            shared: shared.clone(),
        }));
        Rank {
            rank,
            device,
            heap_bytes,
            cursor: Mutex::new(Cursor {
                signal_next: CTRL_BYTES,
                data_next: CTRL_BYTES + shared.signal_bytes,
                count: 0,
            }),
            coll: Mutex::new(None),
            shared,
        }
    }

    /// This rank's index, `0..size()`.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> u32 {
        self.shared.size
    }

    /// This rank's device: launches on it run as this rank (kernels see `rank()`,
    /// `world_size()` and the symmetric heaps).
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn err(&self, message: String) -> Error {
        Error::Comm {
            rank: self.rank,
            message,
        }
    }

    /// A zeroed symmetric buffer of `len` elements (collective: every rank allocates
    /// the same buffers in the same order).
    pub fn alloc<T: Element>(&self, len: usize) -> Result<SymBuffer<T>, Error> {
        self.alloc_in::<T>(len, false)
    }

    /// A symmetric buffer holding `data` on this rank (collective, like
    /// [`Rank::alloc`]; each rank passes its own data of the same length).
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<SymBuffer<T>, Error> {
        let mut b = self.alloc::<T>(data.len())?;
        b.copy_from(data)?;
        Ok(b)
    }

    /// `n` zeroed `u64` signal words in the signal region (collective).
    pub fn alloc_signals(&self, n: usize) -> Result<SymBuffer<u64>, Error> {
        self.alloc_in::<u64>(n, true)
    }

    fn alloc_in<T: Element>(&self, len: usize, signals: bool) -> Result<SymBuffer<T>, Error> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| self.err(format!("{len} elements overflow the heap")))?;
        let mut cur = self.cursor.lock().unwrap_or_else(|e| e.into_inner());
        let (next, end) = if signals {
            (cur.signal_next, CTRL_BYTES + self.shared.signal_bytes)
        } else {
            (cur.data_next, self.heap_bytes)
        };
        let offset = next;
        let new_next = offset
            .checked_add(bytes.max(1).next_multiple_of(SYM_ALIGN))
            .filter(|&n| n <= end)
            .ok_or_else(|| {
                self.err(format!(
                    "symmetric {} region full: {bytes} bytes asked, {} of {} left (raise World::{})",
                    if signals { "signal" } else { "data" },
                    end.saturating_sub(offset),
                    end - if signals { CTRL_BYTES } else { CTRL_BYTES + self.shared.signal_bytes },
                    if signals { "signal_bytes" } else { "heap_bytes" },
                ))
            })?;
        let rec = AllocRecord {
            signals,
            offset,
            bytes,
            elem: T::TY,
        };
        {
            let mut log = self.shared.allocs.lock().unwrap_or_else(|e| e.into_inner());
            match log.get(cur.count) {
                Some(other) if *other != rec => {
                    return Err(self.err(format!(
                        "symmetric allocation #{} differs between ranks: this rank asked for {} x {} ({} bytes, {}), another rank for {} x {} ({} bytes, {}); every rank must allocate the same buffers in the same order",
                        cur.count,
                        len,
                        T::TY,
                        bytes,
                        if signals { "signals" } else { "data" },
                        other.bytes / other.elem.size_bytes().max(1),
                        other.elem,
                        other.bytes,
                        if other.signals { "signals" } else { "data" },
                    )));
                }
                Some(_) => {}
                None => log.push(rec),
            }
        }
        let mut copies = Vec::with_capacity(self.shared.heaps.len());
        for h in self.shared.heaps.iter() {
            copies.push(Arc::new(HostBuffer::view(h.clone(), offset, T::TY, len)?));
        }
        if signals {
            cur.signal_next = new_next;
        } else {
            cur.data_next = new_next;
        }
        cur.count += 1;
        drop(cur);
        let copies: Arc<[Arc<HostBuffer>]> = copies.into();
        let local = self
            .device
            .buffer::<T>(Storage::Host(copies[self.rank as usize].clone()), len);
        let mut b = SymBuffer {
            local,
            copies,
            offset,
        };
        // Heaps are zeroed once and never reused, but a user may have written past a
        // region before; make the contract hold.
        b.local.fill(T::zeroed())?;
        Ok(b)
    }

    /// Host barrier: returns once every rank has called it (the same number of times),
    /// after this rank's device work is done. Fails when another rank failed or when
    /// the wait timeout passes.
    pub fn barrier(&self) -> Result<(), Error> {
        self.device.synchronize()?;
        let size = self.shared.size as u64;
        let mut g = self
            .shared
            .barrier
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let gen_ = g.1;
        g.0 += 1;
        if g.0 == size {
            g.0 = 0;
            g.1 += 1;
            self.shared.barrier_cv.notify_all();
            return Ok(());
        }
        let start = Instant::now();
        while g.1 == gen_ {
            if let Some(r) = self.shared.failed() {
                return Err(self.err(format!("abandoned a host barrier: rank {r} failed")));
            }
            let left = self.shared.timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                let arrived = g.0;
                drop(g);
                self.shared.abort(self.rank);
                return Err(self.err(format!(
                    "host barrier timed out after {:.3} s: {arrived} of {size} ranks arrived",
                    self.shared.timeout.as_secs_f64()
                )));
            }
            g = self
                .shared
                .barrier_cv
                .wait_timeout(g, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    /// A view of `len` elements of `U` at byte `heap_offset` of every rank's heap (the
    /// same memory as an existing symmetric allocation, seen as another type): used by
    /// the collectives for workspaces and bit-level aliases. Not collective, not zeroed.
    pub(crate) fn sym_view<U: Element>(
        &self,
        heap_offset: usize,
        len: usize,
    ) -> Result<SymBuffer<U>, Error> {
        let mut copies = Vec::with_capacity(self.shared.heaps.len());
        for h in self.shared.heaps.iter() {
            copies.push(Arc::new(HostBuffer::view(
                h.clone(),
                heap_offset,
                U::TY,
                len,
            )?));
        }
        let copies: Arc<[Arc<HostBuffer>]> = copies.into();
        let local = self
            .device
            .buffer::<U>(Storage::Host(copies[self.rank as usize].clone()), len);
        Ok(SymBuffer {
            local,
            copies,
            offset: heap_offset,
        })
    }

    /// Whether `buf` was allocated in this world's heaps (not another world's).
    pub(crate) fn owns<T: Element>(&self, buf: &SymBuffer<T>) -> bool {
        buf.copies.len() == self.shared.heaps.len()
            && buf
                .copies
                .iter()
                .zip(self.shared.heaps.iter())
                .all(|(c, h)| c.as_mut_ptr() as usize == h.base() as usize + buf.offset)
    }

    /// How long device-side waits and host barriers wait before failing.
    pub fn wait_timeout(&self) -> Duration {
        self.shared.timeout
    }
}

/// A symmetric buffer: the same allocation on every rank of a world. Dereferences to
/// this rank's copy (a [`Buffer`], for upload/download), and is passed to kernels for
/// `&Symmetric<T>` / `&mut Symmetric<T>` parameters.
pub struct SymBuffer<T: Element> {
    local: Buffer<T>,
    /// Every rank's copy (host worlds).
    pub(crate) copies: Arc<[Arc<HostBuffer>]>,
    offset: usize,
}

impl<T: Element> std::fmt::Debug for SymBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SymBuffer<{}>[{}] at heap offset {}",
            T::TY,
            self.local.len(),
            self.offset
        )
    }
}

impl<T: Element> SymBuffer<T> {
    /// Byte offset of the allocation in every rank's heap.
    pub fn heap_offset(&self) -> usize {
        self.offset
    }

    /// This rank's copy.
    pub fn local(&self) -> &Buffer<T> {
        &self.local
    }

    /// Reads rank `peer`'s copy from the host (for checks and debugging).
    pub fn download_peer(&self, peer: u32) -> Result<Vec<T>, Error> {
        let b = self.copies.get(peer as usize).ok_or_else(|| Error::Comm {
            rank: 0,
            message: format!(
                "peer {peer} is outside a world of {} rank(s)",
                self.copies.len()
            ),
        })?;
        let bytes = b.read_bytes();
        let mut out = vec![T::zeroed(); b.len()];
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes);
        Ok(out)
    }
}

impl<T: Element> Deref for SymBuffer<T> {
    type Target = Buffer<T>;
    fn deref(&self) -> &Buffer<T> {
        &self.local
    }
}

impl<T: Element> DerefMut for SymBuffer<T> {
    fn deref_mut(&mut self) -> &mut Buffer<T> {
        &mut self.local
    }
}
