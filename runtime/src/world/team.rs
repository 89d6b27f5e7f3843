//! The host side of a world's team: a small segment of host memory shared by every
//! rank (a plain allocation for ranks as threads, a `memfd` mapped by every process
//! for ranks as processes) holding the host barrier's arrival counter, the failure
//! word and the table of symmetric allocations that checks every rank allocates the
//! same buffers in the same order.
//!
//! Everything is a lock-free protocol on `u64` words, so it works the same whether the
//! ranks are threads of one process or separate processes.
//!
//! | word | what |
//! |---|---|
//! | 0 | magic ([`MAGIC`]), written by the creator |
//! | 1 | failed: `1 + rank` of the first rank that failed, else 0 |
//! | 2 | died: `1 + rank` of a process that exited without leaving the world |
//! | 3 | host barrier arrivals (monotonic) |
//! | 4 | ranks that have left the world |
//! | 5 | `1 + rank` of a rank whose leaving failed the world (others needed it) |
//! | `8 + 4k ..` | allocation record `k` (`RECORDS` of them) |
//! | then `4k ..` | collective call record `k` (`CALL_RECORDS` of them) |
//! | then `r` | host barriers rank `r` has arrived at ([`MAX_RANKS`] words) |
//! | then `r` | `1 +` the host barriers rank `r` passed before it left, else 0 |
//!
//! The per-rank words name the root cause when a barrier cannot complete: the ranks
//! that never arrived (stopped or hung) on a timeout, and a rank that left the world
//! before arriving at once (it never will).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tessera_ir::interp::{HostMemory, RemoteMemory};
use tessera_ir::types::ScalarType;

/// Identifies a team segment (and its layout version).
pub(crate) const MAGIC: u64 = 0x7465_7373_7465_616d; // "tessteam"
const W_MAGIC: usize = 0;
const W_FAILED: usize = 1;
const W_DIED: usize = 2;
const W_BARRIER: usize = 3;
const W_LEFT: usize = 4;
const W_LEFT_CAUSE: usize = 5;
/// `(waiter + 1) << 32 | (missing + 1)`: the world failed because rank `waiter` timed
/// out waiting for rank `missing`.
const W_STALL_CAUSE: usize = 6;
const HEADER_WORDS: usize = 8;
/// The most ranks a world has.
pub(crate) const MAX_RANKS: usize = 1024;
/// Allocations checked across ranks; later ones are not checked (documented).
pub(crate) const RECORDS: usize = 8192;
const RECORD_WORDS: usize = 4;
/// Collective calls checked across ranks; later ones are not checked (documented).
pub(crate) const CALL_RECORDS: usize = 4096;
const CALLS_BASE: usize = HEADER_WORDS + RECORDS * RECORD_WORDS;
const ARRIVED_BASE: usize = CALLS_BASE + CALL_RECORDS * RECORD_WORDS;
const LEFT_BASE: usize = ARRIVED_BASE + MAX_RANKS;
/// Bytes of a team segment.
pub(crate) const TEAM_BYTES: usize = ((LEFT_BASE + MAX_RANKS) * 8).next_multiple_of(4096);

const EMPTY: u64 = 0;
const WRITING: u64 = 1;
const READY: u64 = 2;

/// What one symmetric allocation was, for the same-order check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AllocRecord {
    pub(crate) signals: bool,
    pub(crate) offset: usize,
    pub(crate) bytes: usize,
    pub(crate) elem: ScalarType,
}

impl AllocRecord {
    fn pack(&self) -> [u64; 3] {
        let code = ScalarType::ALL
            .iter()
            .position(|t| *t == self.elem)
            .unwrap_or(0) as u64;
        [
            self.offset as u64,
            self.bytes as u64,
            u64::from(self.signals) | (code << 8),
        ]
    }

    fn unpack(w: [u64; 3]) -> AllocRecord {
        AllocRecord {
            offset: w[0] as usize,
            bytes: w[1] as usize,
            signals: w[2] & 1 == 1,
            elem: ScalarType::ALL
                .get((w[2] >> 8) as usize)
                .copied()
                .unwrap_or(ScalarType::U8),
        }
    }
}

/// A team segment (see the module docs).
pub(crate) struct Team {
    mem: TeamMem,
    /// The first error of the team's engine, if any (then the segment is unreachable:
    /// the waits stop with it).
    engine_error: std::sync::OnceLock<String>,
}

/// Where a team segment lives.
enum TeamMem {
    /// Host memory this process maps (ranks as threads or processes of one node).
    Local(Arc<dyn HostMemory>),
    /// Memory reached through a communication engine (rank 0's team window of an
    /// MPI world): every access is the engine's, atomics included.
    Engine(Arc<dyn RemoteMemory>),
}

/// One word of a team segment, with the part of `AtomicU64`'s interface the team
/// protocol uses. Through an engine, a store completes before it returns and a read
/// that the engine cannot carry out reads 0 (the team's waits then stop with the
/// engine's error).
struct TeamWord<'a> {
    team: &'a Team,
    i: usize,
}

impl TeamWord<'_> {
    fn local(&self) -> Option<&AtomicU64> {
        match &self.team.mem {
            TeamMem::Local(mem) => {
                debug_assert!((self.i + 1) * 8 <= mem.len());
                // SAFETY: in bounds (checked in `Team::new` for every index used here),
                // 8-aligned, and the segment is only ever accessed atomically.
                Some(unsafe { &*(mem.base().add(self.i * 8) as *const AtomicU64) })
            }
            TeamMem::Engine(_) => None,
        }
    }

    fn engine(&self) -> Option<&dyn RemoteMemory> {
        match &self.team.mem {
            TeamMem::Engine(e) => Some(&**e),
            TeamMem::Local(_) => None,
        }
    }

    /// Records an engine's failure (a peer that stopped answering, say); logs the
    /// first.
    fn failed<T: Default>(&self, r: Result<T, String>) -> T {
        r.unwrap_or_else(|e| {
            if self.team.engine_error.set(e.clone()).is_ok() {
                log::error!("team word {}: {e}", self.i);
            }
            T::default()
        })
    }

    fn load(&self, o: Ordering) -> u64 {
        match (self.local(), self.engine()) {
            (Some(w), _) => w.load(o),
            (None, Some(e)) => self.failed(e.load_u64(self.i * 8)),
            (None, None) => 0,
        }
    }

    fn store(&self, v: u64, o: Ordering) {
        match (self.local(), self.engine()) {
            (Some(w), _) => w.store(v, o),
            // An atomic write (a compare-and-swap loop), complete before returning.
            // Not a put: other ranks poll these words with atomics, and MPI leaves a
            // put that meets an atomic on the same word undefined (an atomic read that
            // is a fetch-and-add of 0 writes the old value back over it: a lost
            // store, seen as a host barrier or allocation check waiting forever).
            (None, Some(e)) => self.failed((|| {
                let off = self.i * 8;
                let mut cur = e.load_u64(off)?;
                loop {
                    let seen = e.compare_and_swap(off, 8, cur, v)?;
                    if seen == cur {
                        return Ok(());
                    }
                    cur = seen;
                }
            })()),
            (None, None) => {}
        }
    }

    fn fetch_add(&self, v: u64, o: Ordering) -> u64 {
        match (self.local(), self.engine()) {
            (Some(w), _) => w.fetch_add(v, o),
            (None, Some(e)) => self.failed(e.fetch_add_u64(self.i * 8, v)),
            (None, None) => 0,
        }
    }

    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        o: Ordering,
        f: Ordering,
    ) -> Result<u64, u64> {
        if let Some(w) = self.local() {
            return w.compare_exchange(current, new, o, f);
        }
        let seen = match self.engine() {
            Some(e) => self.failed(e.compare_and_swap(self.i * 8, 8, current, new).map(Some)),
            None => None,
        };
        match seen {
            Some(seen) if seen == current => Ok(seen),
            Some(seen) => Err(seen),
            None => Err(0),
        }
    }
}

/// Why a host-side wait stopped.
pub(crate) enum Stop {
    /// A rank failed (`died`: its process exited without leaving the world).
    Failed { rank: u32, died: bool },
    /// A rank left the world (dropped its `Rank`) before arriving.
    Left { rank: u32 },
    /// The timeout passed; the ranks that had not arrived, where known.
    Timeout { missing: Vec<u32> },
    /// The team segment's engine failed (its error names the rank that stopped
    /// answering).
    Unreachable { message: String },
}

impl Team {
    /// Wraps `mem` (at least [`TEAM_BYTES`], zeroed or already initialized by the
    /// creator); `create` writes the magic word.
    pub(crate) fn new(mem: Arc<dyn HostMemory>, create: bool) -> Result<Team, String> {
        if mem.len() < TEAM_BYTES || !(mem.base() as usize).is_multiple_of(8) {
            return Err(format!(
                "the team segment has {} bytes, needs {TEAM_BYTES}",
                mem.len()
            ));
        }
        Team::init(TeamMem::Local(mem), create)
    }

    /// A team segment reached through a communication engine (at least
    /// [`TEAM_BYTES`]): as [`Team::new`].
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn remote(mem: Arc<dyn RemoteMemory>, create: bool) -> Result<Team, String> {
        if mem.len() < TEAM_BYTES {
            return Err(format!(
                "the team segment has {} bytes, needs {TEAM_BYTES}",
                mem.len()
            ));
        }
        Team::init(TeamMem::Engine(mem), create)
    }

    fn init(mem: TeamMem, create: bool) -> Result<Team, String> {
        let t = Team {
            mem,
            engine_error: std::sync::OnceLock::new(),
        };
        let magic = if create {
            t.word(W_MAGIC).store(MAGIC, Ordering::Release);
            MAGIC
        } else {
            t.word(W_MAGIC).load(Ordering::Acquire)
        };
        if let Some(e) = t.engine_error.get() {
            return Err(e.clone());
        }
        if magic != MAGIC {
            return Err("the team segment is not a Tessera team (bad magic word)".into());
        }
        Ok(t)
    }

    fn word(&self, i: usize) -> TeamWord<'_> {
        TeamWord { team: self, i }
    }

    /// Lets the team's engine (if any) make progress between polls.
    pub(crate) fn progress(&self) {
        if let TeamMem::Engine(e) = &self.mem {
            e.progress();
        }
    }

    /// The first failed rank, if any (and whether its process died).
    pub(crate) fn failed(&self) -> Option<(u32, bool)> {
        match self.word(W_FAILED).load(Ordering::Acquire) {
            0 => None,
            v => {
                let died = self.word(W_DIED).load(Ordering::Acquire) == v;
                Some(((v - 1) as u32, died))
            }
        }
    }

    /// Records that `rank` failed the world by leaving it while others still needed
    /// it (as [`Team::fail`], remembering why).
    pub(crate) fn fail_by_leaving(&self, rank: u32) {
        let _ = self.word(W_LEFT_CAUSE).compare_exchange(
            0,
            u64::from(rank) + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        self.fail(rank, false);
    }

    /// Whether the world failed because `rank` left it (see [`Team::fail_by_leaving`]).
    pub(crate) fn failed_by_leaving(&self, rank: u32) -> bool {
        self.word(W_LEFT_CAUSE).load(Ordering::Acquire) == u64::from(rank) + 1
            && self.word(W_FAILED).load(Ordering::Acquire) == u64::from(rank) + 1
    }

    /// Records that `rank` failed the world because it timed out waiting for rank
    /// `missing` (as [`Team::fail`], remembering why: the others then name
    /// `missing`, the root cause, not the rank that gave up first).
    pub(crate) fn fail_waiting_for(&self, rank: u32, missing: u32) {
        let v = ((u64::from(rank) + 1) << 32) | (u64::from(missing) + 1);
        let _ =
            self.word(W_STALL_CAUSE)
                .compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire);
        self.fail(rank, false);
    }

    /// The rank that `rank` timed out waiting for, when that is how the world failed
    /// (see [`Team::fail_waiting_for`]).
    pub(crate) fn stalled_on(&self, rank: u32) -> Option<u32> {
        let v = self.word(W_STALL_CAUSE).load(Ordering::Acquire);
        let failed = self.word(W_FAILED).load(Ordering::Acquire);
        (v != 0 && v >> 32 == u64::from(rank) + 1 && failed == u64::from(rank) + 1)
            .then(|| ((v & 0xffff_ffff) - 1) as u32)
    }

    /// Records `rank` as failed (the first failure wins); `died`: its process exited.
    pub(crate) fn fail(&self, rank: u32, died: bool) {
        let v = u64::from(rank) + 1;
        if died {
            let _ = self
                .word(W_DIED)
                .compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire);
        }
        let _ = self
            .word(W_FAILED)
            .compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire);
    }

    /// Polls `done` with backoff until it holds, a rank fails (also reported by
    /// `other_failed`) or `timeout` passes.
    fn wait(
        &self,
        timeout: Duration,
        other_failed: &dyn Fn() -> Option<u32>,
        mut done: impl FnMut() -> bool,
    ) -> Result<(), Stop> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if done() {
                return Ok(());
            }
            if let Some(message) = self.engine_error.get() {
                return Err(Stop::Unreachable {
                    message: message.clone(),
                });
            }
            if let Some((rank, died)) = self.failed() {
                return Err(Stop::Failed { rank, died });
            }
            if let Some(rank) = other_failed() {
                return Err(Stop::Failed { rank, died: false });
            }
            if start.elapsed() >= timeout {
                return Err(Stop::Timeout {
                    missing: Vec::new(),
                });
            }
            self.progress();
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 256 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(u64::from(spins - 256).clamp(5, 200)));
            }
        }
    }

    /// Arrives at host barrier number `generation` (0, 1, ... on each rank) of a team
    /// of `size` as `rank` and waits for the others. A rank that left the world
    /// before this barrier stops the wait at once; a timeout names the ranks that
    /// never arrived. On failure, answers the number of ranks that had arrived.
    pub(crate) fn barrier(
        &self,
        rank: u32,
        generation: u64,
        size: u32,
        timeout: Duration,
        other_failed: &dyn Fn() -> Option<u32>,
    ) -> Result<(), (Stop, u64)> {
        let size_us = (size as usize).min(MAX_RANKS);
        let w = self.word(W_BARRIER);
        let target = (generation + 1) * u64::from(size);
        if (rank as usize) < MAX_RANKS {
            self.word(ARRIVED_BASE + rank as usize)
                .store(generation + 1, Ordering::Release);
        }
        w.fetch_add(1, Ordering::AcqRel);
        let mut gone = None;
        let waited = self.wait(timeout, other_failed, || {
            if w.load(Ordering::Acquire) >= target {
                return true;
            }
            // A failure is the root cause (a rank that fails then leaves): `wait`
            // reports it.
            if self.failed().is_some() {
                return false;
            }
            gone = self.left_before(generation, size_us);
            gone.is_some()
        });
        let waited = match (waited, gone) {
            (Ok(()), Some(rank)) => Err(Stop::Left { rank }),
            (w, _) => w,
        };
        waited.map_err(|s| {
            let s = match s {
                Stop::Timeout { .. } => Stop::Timeout {
                    missing: (0..size_us)
                        .filter(|&r| {
                            self.word(ARRIVED_BASE + r).load(Ordering::Acquire) <= generation
                        })
                        .map(|r| r as u32)
                        .collect(),
                },
                s => s,
            };
            // (An engine that cannot read reads 0.)
            let arrived = w
                .load(Ordering::Acquire)
                .saturating_sub(generation * u64::from(size));
            (s, arrived.min(u64::from(size)))
        })
    }

    /// A rank that left the world before arriving at barrier `generation`.
    fn left_before(&self, generation: u64, size: usize) -> Option<u32> {
        if self.word(W_LEFT).load(Ordering::Acquire) == 0 {
            return None;
        }
        (0..size)
            .find(|&r| {
                let passed = self.word(LEFT_BASE + r).load(Ordering::Acquire);
                passed != 0 && passed - 1 <= generation
            })
            .map(|r| r as u32)
    }

    /// Records that `rank` leaves the world after passing `barriers` host barriers:
    /// the others' barriers it will not arrive at stop at once.
    pub(crate) fn leave(&self, rank: u32, barriers: u64) {
        let i = rank as usize;
        if i >= MAX_RANKS {
            return;
        }
        self.word(LEFT_BASE + i)
            .store(barriers + 1, Ordering::Release);
        self.word(W_LEFT).fetch_add(1, Ordering::AcqRel);
    }

    /// Checks allocation number `index` against the other ranks': the first rank to
    /// get there records it, the others compare. Answers the other rank's record on a
    /// mismatch. Allocations past [`RECORDS`] are not checked.
    pub(crate) fn check_alloc(
        &self,
        index: usize,
        rec: AllocRecord,
        timeout: Duration,
        other_failed: &dyn Fn() -> Option<u32>,
    ) -> Result<Result<(), AllocRecord>, Stop> {
        if index >= RECORDS {
            return Ok(Ok(()));
        }
        let packed = rec.pack();
        Ok(self
            .check_record(
                HEADER_WORDS + index * RECORD_WORDS,
                packed,
                timeout,
                other_failed,
            )?
            .map_err(AllocRecord::unpack))
    }

    /// Checks collective call number `index` (three words describing it) against the
    /// other ranks', as [`Team::check_alloc`] does; answers the other rank's words on a
    /// mismatch. Calls past [`CALL_RECORDS`] are not checked.
    pub(crate) fn check_call(
        &self,
        index: usize,
        call: [u64; 3],
        timeout: Duration,
        other_failed: &dyn Fn() -> Option<u32>,
    ) -> Result<Result<(), [u64; 3]>, Stop> {
        if index >= CALL_RECORDS {
            return Ok(Ok(()));
        }
        self.check_record(
            CALLS_BASE + index * RECORD_WORDS,
            call,
            timeout,
            other_failed,
        )
    }

    /// The record at word `base` (a state word, then three): the first rank to get
    /// there writes `packed`, the others compare theirs with it.
    fn check_record(
        &self,
        base: usize,
        packed: [u64; 3],
        timeout: Duration,
        other_failed: &dyn Fn() -> Option<u32>,
    ) -> Result<Result<(), [u64; 3]>, Stop> {
        let state = self.word(base);
        match state.compare_exchange(EMPTY, WRITING, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                for (k, v) in packed.iter().enumerate() {
                    self.word(base + 1 + k).store(*v, Ordering::Relaxed);
                }
                state.store(READY, Ordering::Release);
                Ok(Ok(()))
            }
            Err(_) => {
                // Another rank is writing it: a few instructions away.
                self.wait(timeout, other_failed, || {
                    state.load(Ordering::Acquire) == READY
                })?;
                let theirs = [1, 2, 3].map(|k| self.word(base + k).load(Ordering::Relaxed));
                Ok(if theirs == packed {
                    Ok(())
                } else {
                    Err(theirs)
                })
            }
        }
    }
}
