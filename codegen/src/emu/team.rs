//! The thread team of the SIMT emulator: the threads of one block run as OS threads
//! that meet at barriers, exchange values within a warp, and execute warp-collective
//! matrix instructions, with the GPU's meaning, and with every misuse reported instead
//! of hung: a barrier that some threads of the block never reach (they exited, or sit
//! at another barrier) and a barrier that times out are errors.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What went wrong in a team; the launcher adds the kernel and block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TeamError {
    /// Some threads waited at a barrier that others never reached.
    BarrierDivergence {
        /// Barrier site id (the op that emitted it) of the waiting threads.
        site: u32,
        /// Threads waiting there.
        waiting: u32,
        /// Threads that had already left the kernel.
        exited: u32,
        /// Threads at a different barrier site, if any (site, count).
        elsewhere: Option<(u32, u32)>,
    },
    /// A barrier was not completed within the timeout.
    Timeout {
        /// Barrier site id.
        site: u32,
        /// Threads waiting.
        waiting: u32,
        /// Threads in the team.
        threads: u32,
    },
}

/// A reusable barrier over `n` participants that knows who has left.
struct Gate {
    n: u32,
    state: Mutex<GateState>,
    cv: Condvar,
}

#[derive(Default)]
struct GateState {
    /// Arrivals per site in the current round: (site, count).
    sites: Vec<(u32, u32)>,
    waiting: u32,
    exited: u32,
    generation: u64,
}

impl Gate {
    fn new(n: u32) -> Gate {
        Gate {
            n,
            state: Mutex::new(GateState::default()),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        // Only this module touches the state, and it never panics while holding the
        // lock; recover from poisoning all the same.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks whether the waiting threads can never be released: everyone still in
    /// the kernel is waiting, but not all at one site, or some have exited.
    fn divergence(st: &GateState, n: u32) -> Option<TeamError> {
        if st.waiting == 0 || st.waiting + st.exited < n {
            return None;
        }
        let (site, at) = st.sites.iter().copied().max_by_key(|s| s.1)?;
        let elsewhere = st.sites.iter().copied().find(|s| s.0 != site);
        if st.exited > 0 || elsewhere.is_some() {
            return Some(TeamError::BarrierDivergence {
                site,
                waiting: at,
                exited: st.exited,
                elsewhere,
            });
        }
        None
    }

    /// Waits at barrier `site`. Returns an error (and releases everyone) when the
    /// barrier can never complete.
    fn arrive(&self, site: u32, poison: &AtomicBool, timeout: Duration) -> Result<(), TeamError> {
        let mut st = self.lock();
        if poison.load(Ordering::Acquire) {
            return Ok(());
        }
        st.waiting += 1;
        match st.sites.iter_mut().find(|s| s.0 == site) {
            Some(s) => s.1 += 1,
            None => st.sites.push((site, 1)),
        }
        if st.waiting == self.n && st.sites.len() == 1 {
            st.waiting = 0;
            st.sites.clear();
            st.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        if let Some(e) = Gate::divergence(&st, self.n) {
            poison.store(true, Ordering::Release);
            self.cv.notify_all();
            return Err(e);
        }
        let generation = st.generation;
        let deadline = Instant::now() + timeout;
        while st.generation == generation && !poison.load(Ordering::Acquire) {
            let now = Instant::now();
            if now >= deadline {
                poison.store(true, Ordering::Release);
                self.cv.notify_all();
                return Err(TeamError::Timeout {
                    site,
                    waiting: st.waiting,
                    threads: self.n,
                });
            }
            st = self
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    /// A participant leaves (its kernel returned).
    fn exit(&self, poison: &AtomicBool) -> Result<(), TeamError> {
        let mut st = self.lock();
        st.exited += 1;
        if let Some(e) = Gate::divergence(&st, self.n) {
            poison.store(true, Ordering::Release);
            self.cv.notify_all();
            return Err(e);
        }
        Ok(())
    }

    /// Starts a new block: nobody waiting, nobody exited.
    fn reset(&self) {
        let mut st = self.lock();
        *st = GateState {
            generation: st.generation + 1,
            ..GateState::default()
        };
    }
}

/// The threads of one block: a block-wide gate, one gate per warp, and per-lane
/// exchange slots for warp-collective operations.
pub struct Team {
    threads: u32,
    warp_size: u32,
    block: Gate,
    warps: Vec<Gate>,
    /// `slots[thread * SLOT_WORDS + i]`: a lane's contribution to a collective.
    slots: Vec<AtomicU64>,
    poison: AtomicBool,
    timeout: Duration,
}

/// Words of exchange space per thread (an MMA deposits at most 16).
const SLOT_WORDS: usize = 16;

impl Team {
    /// A team of `threads` threads in warps of `warp_size`; a barrier waiting longer
    /// than `timeout` is reported.
    pub fn new(threads: u32, warp_size: u32, timeout: Duration) -> Team {
        let warps = threads.div_ceil(warp_size);
        Team {
            threads,
            warp_size,
            block: Gate::new(threads),
            warps: (0..warps)
                .map(|w| Gate::new(warp_size.min(threads - w * warp_size)))
                .collect(),
            slots: (0..threads as usize * SLOT_WORDS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            poison: AtomicBool::new(false),
            timeout,
        }
    }

    /// Threads in the team.
    pub fn threads(&self) -> u32 {
        self.threads
    }

    /// Threads per warp.
    pub fn warp_size(&self) -> u32 {
        self.warp_size
    }

    /// True once an error released the team: barriers and collectives return at once
    /// (with garbage), so every thread runs to its end.
    pub fn poisoned(&self) -> bool {
        self.poison.load(Ordering::Acquire)
    }

    /// Prepares the team for the next block.
    pub fn reset(&self) {
        self.block.reset();
        for w in &self.warps {
            w.reset();
        }
    }

    /// Block-wide barrier at `site`.
    pub fn barrier(&self, site: u32) -> Result<(), TeamError> {
        self.block.arrive(site, &self.poison, self.timeout)
    }

    /// Thread `tid` left the kernel.
    pub fn exit(&self, tid: u32) -> Result<(), TeamError> {
        let warp = &self.warps[(tid / self.warp_size) as usize];
        let w = warp.exit(&self.poison);
        let b = self.block.exit(&self.poison);
        w.and(b)
    }

    fn warp_sync(&self, tid: u32, site: u32) -> Result<(), TeamError> {
        self.warps[(tid / self.warp_size) as usize].arrive(site, &self.poison, self.timeout)
    }

    /// Every lane of `tid`'s warp deposits `data` (at most 16 words); `f` then reads
    /// any lane's deposit by lane index. All lanes of the warp must call this.
    pub fn warp_collective<R>(
        &self,
        tid: u32,
        site: u32,
        data: &[u64],
        f: impl FnOnce(&dyn Fn(u32, usize) -> u64) -> R,
    ) -> Result<R, TeamError> {
        assert!(data.len() <= SLOT_WORDS, "collective deposit too large");
        let base = tid as usize * SLOT_WORDS;
        for (i, &d) in data.iter().enumerate() {
            self.slots[base + i].store(d, Ordering::Relaxed);
        }
        self.warp_sync(tid, site)?;
        let warp_base = (tid / self.warp_size * self.warp_size) as usize;
        let read = |lane: u32, i: usize| {
            self.slots[(warp_base + lane as usize) * SLOT_WORDS + i].load(Ordering::Relaxed)
        };
        let r = f(&read);
        self.warp_sync(tid, site)?;
        Ok(r)
    }

    /// The value of lane `lane ^ mask` in this warp (all lanes participate).
    pub fn shuffle_xor(&self, tid: u32, site: u32, v: u32, mask: u32) -> Result<u32, TeamError> {
        let lane = tid % self.warp_size;
        let partner = (lane ^ mask) % self.warp_size;
        self.warp_collective(tid, site, &[v as u64], |read| read(partner, 0) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn run(team: &Arc<Team>, body: impl Fn(u32) -> Result<(), TeamError> + Sync) -> Vec<TeamError> {
        let errors = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for tid in 0..team.threads() {
                let (team, body, errors) = (team.clone(), &body, &errors);
                s.spawn(move || {
                    let mut errs = Vec::new();
                    if let Err(e) = body(tid) {
                        errs.push(e);
                    }
                    if let Err(e) = team.exit(tid) {
                        errs.push(e);
                    }
                    errors.lock().unwrap().extend(errs);
                });
            }
        });
        errors.into_inner().unwrap()
    }

    #[test]
    fn barriers_order_phases() {
        let team = Arc::new(Team::new(64, 32, Duration::from_secs(10)));
        let cells: Vec<AtomicU64> = (0..64).map(|_| AtomicU64::new(0)).collect();
        let errs = run(&team, |tid| {
            for round in 1..=20u64 {
                cells[tid as usize].store(round, Ordering::Relaxed);
                team.barrier(1)?;
                // Everybody's write of this round is visible after the barrier.
                let other = cells[((tid + 17) % 64) as usize].load(Ordering::Relaxed);
                assert_eq!(other, round);
                team.barrier(2)?;
            }
            Ok(())
        });
        assert!(errs.is_empty(), "{errs:?}");
    }

    #[test]
    fn shuffles_exchange_within_the_warp() {
        let team = Arc::new(Team::new(128, 64, Duration::from_secs(10)));
        let errs = run(&team, |tid| {
            for mask in [1, 2, 4, 8, 16, 32] {
                let got = team.shuffle_xor(tid, 7, tid * 10, mask)?;
                let lane = tid % 64;
                assert_eq!(
                    got,
                    (tid - lane + (lane ^ mask)) * 10,
                    "tid {tid} mask {mask}"
                );
            }
            Ok(())
        });
        assert!(errs.is_empty(), "{errs:?}");
    }

    #[test]
    fn a_barrier_skipped_by_some_threads_is_reported() {
        let team = Arc::new(Team::new(32, 32, Duration::from_secs(10)));
        let errs = run(&team, |tid| if tid < 8 { Ok(()) } else { team.barrier(5) });
        assert!(
            errs.iter().any(|e| matches!(
                e,
                TeamError::BarrierDivergence {
                    site: 5,
                    waiting: 24,
                    exited: 8,
                    ..
                }
            )),
            "{errs:?}"
        );
        assert!(team.poisoned());
    }

    #[test]
    fn threads_at_different_barriers_are_reported() {
        let team = Arc::new(Team::new(16, 16, Duration::from_secs(10)));
        let errs = run(&team, |tid| {
            if tid % 2 == 0 {
                team.barrier(1)
            } else {
                team.barrier(2)
            }
        });
        assert!(
            errs.iter().any(|e| matches!(
                e,
                TeamError::BarrierDivergence {
                    elsewhere: Some(_),
                    ..
                }
            )),
            "{errs:?}"
        );
    }

    #[test]
    fn reset_allows_the_next_block() {
        let team = Arc::new(Team::new(8, 8, Duration::from_secs(10)));
        for _ in 0..3 {
            team.reset();
            let errs = run(&team, |_| team.barrier(0));
            assert!(errs.is_empty(), "{errs:?}");
        }
    }
}
