//! The thread team of the SIMT emulator: the threads of one block as stackful
//! coroutines ([`corosensei`]) driven by one OS thread, with the GPU's meaning for
//! barriers and warp collectives, and every misuse reported instead of hung.
//!
//! A thread runs until it *parks*: at a block barrier, at a warp collective its warp
//! has not completed, in a polling loop ([`Park::Poll`], the timer call of
//! `wait_until`/`barrier_all`) or at a loop's back edge ([`Park::Yield`]).
//! [`Team::step`] resumes the runnable threads in thread order until every thread has
//! ended ([`Step::Done`]) or only threads that yielded can move ([`Step::Yielded`]:
//! the caller runs other blocks, then steps this one again).
//!
//! - A **block barrier** releases when every thread of the block waits at it (at one
//!   site). When no thread can move and they are not all at one barrier (some have
//!   exited, or wait at another barrier or collective), the barrier diverged: the
//!   error is reported and the team is *poisoned*: barriers and collectives return at
//!   once from then on (with zeros), so every thread runs to its end.
//! - A **named barrier** (`bar.sync id, count`, ids 1 to 15) releases when `count`
//!   threads wait at it: the last to arrive releases the others at once, whatever
//!   the rest of the block does (a warp-specialized kernel's consumers meet there
//!   while its producer runs on or has left). Waiters that can never be joined are
//!   reported as a block barrier's are.
//! - A **warp collective** (shuffle, matrix instruction) is completed by the last
//!   lane of the warp to arrive, which computes the result for every lane at once
//!   from the deposits (an `mma.sync`/MFMA product is computed once per warp) and
//!   writes each lane's share to its result slots; the other lanes wait parked.
//!
//! The team is touched by one OS thread only (the one driving the block), so its
//! state is plain cells.

use std::cell::Cell;

/// What went wrong in a team; the launcher adds the kernel and block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TeamError {
    /// Some threads waited at a barrier or collective that others never reached.
    BarrierDivergence {
        /// Site id (the op that emitted the barrier) of the waiting threads.
        site: u32,
        /// Threads waiting there.
        waiting: u32,
        /// Threads that had already left the kernel.
        exited: u32,
        /// Threads at a different barrier site, if any (site, count).
        elsewhere: Option<(u32, u32)>,
    },
    /// A barrier was not completed within the timeout (its threads waited on a
    /// thread that kept polling).
    Timeout {
        /// Barrier site id.
        site: u32,
        /// Threads waiting.
        waiting: u32,
        /// Threads in the team.
        threads: u32,
    },
}

/// Why a thread gave the OS thread back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Park {
    /// At the block barrier of this site.
    Barrier(u32),
    /// At a warp collective of this site, waiting for the rest of the warp.
    Warp(u32),
    /// In a polling loop: runnable again at once, after other work had a turn.
    Poll,
    /// At the back edge of a loop: runnable again at once (the other threads get a
    /// turn, as GPU threads of a warp that spin on each other do).
    Yield,
}

/// A thread's state in the team.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Runnable,
    AtBarrier(u32),
    /// At named barrier `.0` (site `.1`).
    AtNamed(u32, u32),
    AtWarp(u32),
    Exited,
}

/// Named barrier ids (0 is the block barrier).
pub const NAMED_BARRIERS: usize = 16;

/// Words of exchange space per thread (gfx950's block-scaled
/// `v_mfma_scale_f32_32x32x64_f8f6f4` deposits 34: 8 registers of A, 8 of B, the two
/// scales and 16 of C).
pub const SLOT_WORDS: usize = 34;

/// The state of one block's threads.
pub struct Team {
    threads: u32,
    warp_size: u32,
    st: Vec<Cell<St>>,
    /// Per warp: lanes arrived at the pending collective, its site, lanes exited.
    warp_arrived: Vec<Cell<u32>>,
    warp_site: Vec<Cell<u32>>,
    warp_exited: Vec<Cell<u32>>,
    exited: Cell<u32>,
    /// Per named barrier id: threads waiting at it.
    named: [Cell<u32>; NAMED_BARRIERS],
    /// `deposits[thread * SLOT_WORDS + i]`: a lane's contribution to a collective.
    deposits: Vec<Cell<u64>>,
    /// `results[thread * SLOT_WORDS + i]`: a lane's share of the result.
    results: Vec<Cell<u64>>,
    poison: Cell<bool>,
    /// Barrier releases, completed collectives and exits so far.
    progress: Cell<u64>,
    /// Some thread yielded at a loop back edge in the last step (it computes).
    computing: Cell<bool>,
    /// The team timed out: threads still looping are ended at their next park.
    cancelled: Cell<bool>,
    /// The first error found by the team itself (divergence), with the thread it is
    /// reported for; taken by the driver.
    error: Cell<Option<(u32, TeamError)>>,
}

/// One warp's deposits and results, for the lane that completes a collective.
pub struct WarpView<'a> {
    team: &'a Team,
    first: usize,
    lanes: u32,
}

impl WarpView<'_> {
    /// Lanes in the warp.
    pub fn lanes(&self) -> u32 {
        self.lanes
    }

    /// Word `i` of lane `lane`'s deposit.
    pub fn read(&self, lane: u32, i: usize) -> u64 {
        self.team.deposits[(self.first + lane as usize) * SLOT_WORDS + i].get()
    }

    /// Sets word `i` of lane `lane`'s result.
    pub fn write(&self, lane: u32, i: usize, v: u64) {
        self.team.results[(self.first + lane as usize) * SLOT_WORDS + i].set(v)
    }
}

/// What [`Team::step`] ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Every thread has ended.
    Done,
    /// Only threads that yielded (polling loops, loop back edges) can move.
    Yielded,
}

impl Team {
    /// A team of `threads` threads in warps of `warp_size`.
    pub fn new(threads: u32, warp_size: u32) -> Team {
        let warps = threads.div_ceil(warp_size) as usize;
        let cells = |n: usize| (0..n).map(|_| Cell::new(0)).collect::<Vec<_>>();
        Team {
            threads,
            warp_size,
            st: (0..threads).map(|_| Cell::new(St::Runnable)).collect(),
            warp_arrived: (0..warps).map(|_| Cell::new(0)).collect(),
            warp_site: (0..warps).map(|_| Cell::new(0)).collect(),
            warp_exited: (0..warps).map(|_| Cell::new(0)).collect(),
            exited: Cell::new(0),
            named: std::array::from_fn(|_| Cell::new(0)),
            deposits: cells(threads as usize * SLOT_WORDS),
            results: cells(threads as usize * SLOT_WORDS),
            poison: Cell::new(false),
            progress: Cell::new(0),
            computing: Cell::new(false),
            cancelled: Cell::new(false),
            error: Cell::new(None),
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
    /// (with zeros), so every thread runs to its end.
    pub fn poisoned(&self) -> bool {
        self.poison.get()
    }

    /// Counts barrier releases, completed warp collectives and exits: a block whose
    /// count does not change while some of its threads wait at a barrier is waiting
    /// on the threads that loop or poll.
    pub fn progress(&self) -> u64 {
        self.progress.get()
    }

    /// Whether a thread yielded at a loop back edge in the last [`Team::step`] (the
    /// block computes rather than waits on someone else).
    pub fn computing(&self) -> bool {
        self.computing.get()
    }

    /// True once the team timed out: a thread that parks in a loop from then on is
    /// ended by its driver (it would spin forever).
    pub fn cancelled(&self) -> bool {
        self.cancelled.get()
    }

    /// Prepares the team for the next block.
    pub fn reset(&self) {
        for s in &self.st {
            s.set(St::Runnable);
        }
        for w in self.warp_arrived.iter().chain(&self.warp_exited) {
            w.set(0);
        }
        self.exited.set(0);
        for n in &self.named {
            n.set(0);
        }
        self.poison.set(false);
        self.cancelled.set(false);
        self.error.set(None);
    }

    /// The first error the team found, if any (taken).
    pub fn take_error(&self) -> Option<(u32, TeamError)> {
        self.error.take()
    }

    fn fail(&self, tid: u32, e: TeamError) {
        self.poison.set(true);
        if let Some(old) = self.error.take() {
            self.error.set(Some(old));
        } else {
            self.error.set(Some((tid, e)));
        }
        // Everyone parked runs on (to the end).
        for s in &self.st {
            if s.get() != St::Exited {
                s.set(St::Runnable);
            }
        }
    }

    fn warp_of(&self, tid: u32) -> usize {
        (tid / self.warp_size) as usize
    }

    fn warp_lanes(&self, w: usize) -> u32 {
        self.warp_size.min(self.threads - w as u32 * self.warp_size)
    }

    /// Thread `tid` waits at the block barrier `site`; `park` suspends it.
    pub fn barrier(&self, tid: u32, site: u32, park: impl FnOnce(Park)) {
        if self.poisoned() {
            return;
        }
        self.st[tid as usize].set(St::AtBarrier(site));
        park(Park::Barrier(site));
    }

    /// Thread `tid` arrives at named barrier `id` (1 to 15), which completes once
    /// `count` threads arrived (`bar.sync` and `bar.arrive` alike); with `wait` it
    /// waits for that (`park` suspends it), else it goes on (`bar.arrive`). The
    /// caller checks `id` and `count`.
    pub fn named_barrier(
        &self,
        tid: u32,
        id: u32,
        count: u32,
        site: u32,
        wait: bool,
        park: impl FnOnce(Park),
    ) {
        if self.poisoned() {
            return;
        }
        let slot = &self.named[id as usize % NAMED_BARRIERS];
        let waiting = slot.get() + 1;
        if waiting >= count {
            slot.set(0);
            self.progress.set(self.progress.get() + 1);
            for s in &self.st {
                if matches!(s.get(), St::AtNamed(i, _) if i == id) {
                    s.set(St::Runnable);
                }
            }
            return;
        }
        slot.set(waiting);
        if wait {
            self.st[tid as usize].set(St::AtNamed(id, site));
            park(Park::Barrier(site));
        }
    }

    /// Every lane of `tid`'s warp deposits `data` (at most [`SLOT_WORDS`] words);
    /// the last to arrive runs `compute` once for the whole warp, which writes every
    /// lane's result. Returns this lane's result words (zeros once poisoned). All
    /// lanes of the warp must call this at the same site; `park` suspends the caller.
    pub fn warp_collective(
        &self,
        tid: u32,
        site: u32,
        data: &[u64],
        park: impl FnOnce(Park),
        compute: impl FnOnce(&WarpView<'_>),
    ) -> [u64; SLOT_WORDS] {
        debug_assert!(data.len() <= SLOT_WORDS, "collective deposit too large");
        let zero = [0; SLOT_WORDS];
        if self.poisoned() {
            return zero;
        }
        let base = tid as usize * SLOT_WORDS;
        for (i, &d) in data.iter().enumerate().take(SLOT_WORDS) {
            self.deposits[base + i].set(d);
        }
        let w = self.warp_of(tid);
        let lanes = self.warp_lanes(w);
        let arrived = self.warp_arrived[w].get();
        if arrived > 0 && self.warp_site[w].get() != site {
            let other = self.warp_site[w].get();
            self.fail(
                tid,
                TeamError::BarrierDivergence {
                    site: other,
                    waiting: arrived,
                    exited: self.warp_exited[w].get(),
                    elsewhere: Some((site, 1)),
                },
            );
            return zero;
        }
        self.warp_site[w].set(site);
        let arrived = arrived + 1;
        let exited = self.warp_exited[w].get();
        if arrived + exited == lanes && exited > 0 {
            self.fail(
                tid,
                TeamError::BarrierDivergence {
                    site,
                    waiting: arrived,
                    exited,
                    elsewhere: None,
                },
            );
            return zero;
        }
        if arrived == lanes {
            let first = w * self.warp_size as usize;
            compute(&WarpView {
                team: self,
                first,
                lanes,
            });
            self.warp_arrived[w].set(0);
            self.progress.set(self.progress.get() + 1);
            for l in first..first + lanes as usize {
                if self.st[l].get() == St::AtWarp(site) {
                    self.st[l].set(St::Runnable);
                }
            }
        } else {
            self.warp_arrived[w].set(arrived);
            self.st[tid as usize].set(St::AtWarp(site));
            park(Park::Warp(site));
            if self.poisoned() {
                return zero;
            }
        }
        std::array::from_fn(|i| self.results[base + i].get())
    }

    /// The value of lane `lane ^ mask` in this warp (all lanes participate).
    pub fn shuffle_xor(
        &self,
        tid: u32,
        site: u32,
        v: u32,
        mask: u32,
        park: impl FnOnce(Park),
    ) -> u32 {
        self.warp_collective(tid, site, &[v as u64], park, |w| {
            for l in 0..w.lanes() {
                w.write(l, 0, w.read((l ^ mask) % w.lanes(), 0));
            }
        })[0] as u32
    }

    /// Thread `tid` left the kernel.
    pub fn exit(&self, tid: u32) {
        self.st[tid as usize].set(St::Exited);
        self.exited.set(self.exited.get() + 1);
        self.progress.set(self.progress.get() + 1);
        let w = self.warp_of(tid);
        self.warp_exited[w].set(self.warp_exited[w].get() + 1);
        let arrived = self.warp_arrived[w].get();
        if !self.poisoned()
            && arrived > 0
            && arrived + self.warp_exited[w].get() == self.warp_lanes(w)
        {
            self.fail(
                tid,
                TeamError::BarrierDivergence {
                    site: self.warp_site[w].get(),
                    waiting: arrived,
                    exited: self.warp_exited[w].get(),
                    elsewhere: None,
                },
            );
        }
    }

    /// Whether thread `tid` can be resumed.
    pub fn runnable(&self, tid: u32) -> bool {
        self.st[tid as usize].get() == St::Runnable
    }

    /// Whether every thread has ended.
    pub fn done(&self) -> bool {
        self.exited.get() == self.threads
    }

    /// Called when no thread is runnable and none polls: releases a complete barrier,
    /// or reports why the block can never go on (and poisons the team so it runs to
    /// its end).
    fn settle(&self) {
        let mut sites: Vec<(u32, u32)> = Vec::new();
        let mut first_waiter = None;
        for (t, s) in self.st.iter().enumerate() {
            let site = match s.get() {
                St::AtBarrier(site) => site,
                // Named barriers release as they fill; told apart by another bit.
                St::AtNamed(_, site) => site | 1 << 30,
                // Warp collectives are told apart from barriers by a high bit.
                St::AtWarp(site) => site | 1 << 31,
                _ => continue,
            };
            first_waiter.get_or_insert(t as u32);
            match sites.iter_mut().find(|x| x.0 == site) {
                Some(x) => x.1 += 1,
                None => sites.push((site, 1)),
            }
        }
        let exited = self.exited.get();
        if let [(site, n)] = sites[..]
            && n == self.threads
            && site & (3 << 30) == 0
        {
            for s in &self.st {
                s.set(St::Runnable);
            }
            self.progress.set(self.progress.get() + 1);
            return;
        }
        let Some((site, at)) = sites.iter().copied().max_by_key(|s| s.1) else {
            return;
        };
        let elsewhere = sites
            .iter()
            .copied()
            .find(|s| s.0 != site)
            .map(|(s, n)| (s & !(3 << 30), n));
        self.fail(
            first_waiter.unwrap_or(0),
            TeamError::BarrierDivergence {
                site: site & !(3 << 30),
                waiting: at,
                exited,
                elsewhere,
            },
        );
    }

    /// The first thread parked at a barrier or collective, its site, and how many
    /// threads wait at that site; `None` when nobody waits.
    pub fn waiting(&self) -> Option<(u32, u32, u32)> {
        let first = self
            .st
            .iter()
            .position(|s| matches!(s.get(), St::AtBarrier(_) | St::AtNamed(..) | St::AtWarp(_)))?;
        let at = self.st[first].get();
        let n = self.st.iter().filter(|s| s.get() == at).count() as u32;
        let (St::AtBarrier(site) | St::AtNamed(_, site) | St::AtWarp(site)) = at else {
            return None;
        };
        Some((first as u32, site, n))
    }

    /// Reports a timeout: threads waited too long at a barrier for threads that loop
    /// or poll; the team is poisoned and cancelled (looping threads are ended).
    pub fn time_out(&self) {
        let Some((tid, site, waiting)) = self.waiting() else {
            return;
        };
        self.cancelled.set(true);
        self.fail(
            tid,
            TeamError::Timeout {
                site,
                waiting,
                threads: self.threads,
            },
        );
    }

    /// Resumes runnable threads in thread order (`resume(tid)` runs thread `tid`
    /// until it parks, returning how, or `None` when it ended) until every thread has
    /// ended or only polling threads can move.
    pub fn step(&self, mut resume: impl FnMut(u32) -> Option<Park>) -> Step {
        self.computing.set(false);
        loop {
            let mut polled = false;
            let mut ran = false;
            for tid in 0..self.threads {
                if !self.runnable(tid) {
                    continue;
                }
                ran = true;
                match resume(tid) {
                    None => self.exit(tid),
                    Some(Park::Poll) => polled = true,
                    Some(Park::Yield) => {
                        polled = true;
                        self.computing.set(true);
                    }
                    Some(Park::Barrier(_) | Park::Warp(_)) => {}
                }
            }
            if self.done() {
                return Step::Done;
            }
            if polled {
                return Step::Yielded;
            }
            if !ran || !(0..self.threads).any(|t| self.runnable(t)) {
                self.settle();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corosensei::{Coroutine, CoroutineResult, Yielder};
    use std::rc::Rc;

    type Co = Coroutine<(), Park, ()>;

    /// Runs `body(tid, team, park)` for every thread of `team` as coroutines.
    fn run(
        team: &Rc<Team>,
        body: impl Fn(u32, &Team, &dyn Fn(Park)) + Clone + 'static,
    ) -> Option<(u32, TeamError)> {
        let mut cos: Vec<Co> = (0..team.threads())
            .map(|tid| {
                let (team, body) = (team.clone(), body.clone());
                Coroutine::new(move |y: &Yielder<(), Park>, ()| {
                    body(tid, &team, &|p| y.suspend(p));
                })
            })
            .collect();
        while team.step(|tid| match cos[tid as usize].resume(()) {
            CoroutineResult::Yield(p) => Some(p),
            CoroutineResult::Return(()) => None,
        }) != Step::Done
        {}
        team.take_error()
    }

    #[test]
    fn a_named_barrier_releases_its_count_while_the_others_leave() {
        // Threads 0..64 meet at named barrier 1 (64 of them) in rounds; threads
        // 64..96 (a producer warp) leave at once.
        let team = Rc::new(Team::new(96, 32));
        let cells: Rc<Vec<Cell<u64>>> = Rc::new((0..64).map(|_| Cell::new(0)).collect());
        let err = run(&team, move |tid, team, park| {
            if tid >= 64 {
                return;
            }
            for round in 1..=10u64 {
                cells[tid as usize].set(round);
                team.named_barrier(tid, 1, 64, 7, true, park);
                assert_eq!(cells[((tid + 33) % 64) as usize].get(), round);
                team.named_barrier(tid, 1, 64, 8, true, park);
            }
        });
        assert!(err.is_none(), "{err:?}");
    }

    #[test]
    fn bar_arrive_counts_without_waiting() {
        // Warp 0 writes, then arrives at named barrier 3 (64: both warps) and goes
        // on; warp 1 waits there, then sees every write. In rounds, warp 0 also
        // waits at barrier 4 for warp 1's arrival (ping-pong turns).
        let team = Rc::new(Team::new(64, 32));
        let cells: Rc<Vec<Cell<u64>>> = Rc::new((0..32).map(|_| Cell::new(0)).collect());
        let err = run(&team, move |tid, team, park| {
            for round in 1..=5u64 {
                if tid < 32 {
                    if round > 1 {
                        team.named_barrier(tid, 4, 64, 1, true, park);
                    }
                    cells[tid as usize].set(round);
                    team.named_barrier(tid, 3, 64, 2, false, park);
                } else {
                    team.named_barrier(tid, 3, 64, 3, true, park);
                    assert_eq!(cells[((tid + 5) % 32) as usize].get(), round);
                    if round < 5 {
                        team.named_barrier(tid, 4, 64, 4, false, park);
                    }
                }
            }
        });
        assert!(err.is_none(), "{err:?}");
    }

    #[test]
    fn a_named_barrier_nobody_completes_is_divergence() {
        // 64 threads wait at a barrier of 96: the rest have left.
        let team = Rc::new(Team::new(96, 32));
        let err = run(&team, |tid, team, park| {
            if tid < 64 {
                team.named_barrier(tid, 2, 96, 5, true, park);
            }
        });
        match err {
            Some((
                _,
                TeamError::BarrierDivergence {
                    site: 5,
                    waiting: 64,
                    exited: 32,
                    ..
                },
            )) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn barriers_order_phases() {
        let team = Rc::new(Team::new(64, 32));
        let cells: Rc<Vec<Cell<u64>>> = Rc::new((0..64).map(|_| Cell::new(0)).collect());
        let err = run(&team, move |tid, team, park| {
            for round in 1..=20u64 {
                cells[tid as usize].set(round);
                team.barrier(tid, 1, park);
                // Everybody's write of this round is visible after the barrier.
                assert_eq!(cells[((tid + 17) % 64) as usize].get(), round);
                team.barrier(tid, 2, park);
            }
        });
        assert!(err.is_none(), "{err:?}");
    }

    #[test]
    fn shuffles_exchange_within_the_warp() {
        let team = Rc::new(Team::new(128, 64));
        let err = run(&team, |tid, team, park| {
            for mask in [1, 2, 4, 8, 16, 32] {
                let got = team.shuffle_xor(tid, 7, tid * 10, mask, park);
                let lane = tid % 64;
                assert_eq!(
                    got,
                    (tid - lane + (lane ^ mask)) * 10,
                    "tid {tid} mask {mask}"
                );
            }
        });
        assert!(err.is_none(), "{err:?}");
    }

    #[test]
    fn a_collective_is_computed_once_per_warp() {
        let team = Rc::new(Team::new(96, 32));
        let calls = Rc::new(Cell::new(0));
        let c = calls.clone();
        let err = run(&team, move |tid, team, park| {
            let r = team.warp_collective(tid, 3, &[tid as u64], park, |w| {
                c.set(c.get() + 1);
                let sum: u64 = (0..w.lanes()).map(|l| w.read(l, 0)).sum();
                for l in 0..w.lanes() {
                    w.write(l, 0, sum + l as u64);
                }
            });
            let warp = tid / 32;
            let sum: u64 = (warp * 32..warp * 32 + 32).map(u64::from).sum();
            assert_eq!(r[0], sum + (tid % 32) as u64);
        });
        assert!(err.is_none(), "{err:?}");
        assert_eq!(calls.get(), 3);
    }

    #[test]
    fn a_barrier_skipped_by_some_threads_is_reported() {
        let team = Rc::new(Team::new(32, 32));
        let err = run(&team, |tid, team, park| {
            if tid >= 8 {
                team.barrier(tid, 5, park)
            }
        });
        assert!(
            matches!(
                err,
                Some((
                    _,
                    TeamError::BarrierDivergence {
                        site: 5,
                        waiting: 24,
                        exited: 8,
                        ..
                    }
                ))
            ),
            "{err:?}"
        );
        assert!(team.poisoned());
    }

    #[test]
    fn threads_at_different_barriers_are_reported() {
        let team = Rc::new(Team::new(16, 16));
        let err = run(&team, |tid, team, park| {
            team.barrier(tid, 1 + tid % 2, park)
        });
        assert!(
            matches!(
                err,
                Some((
                    _,
                    TeamError::BarrierDivergence {
                        elsewhere: Some(_),
                        ..
                    }
                ))
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_lane_missing_from_a_collective_is_reported() {
        let team = Rc::new(Team::new(32, 32));
        let err = run(&team, |tid, team, park| {
            if tid != 31 {
                team.shuffle_xor(tid, 9, tid, 1, park);
            }
        });
        assert!(
            matches!(
                err,
                Some((
                    _,
                    TeamError::BarrierDivergence {
                        site: 9,
                        waiting: 31,
                        exited: 1,
                        ..
                    }
                ))
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_barrier_waiting_on_a_polling_thread_times_out_and_cancels() {
        let team = Rc::new(Team::new(8, 8));
        let mut cos: Vec<Co> = (0..8u32)
            .map(|tid| {
                let team = team.clone();
                Coroutine::new(move |y: &Yielder<(), Park>, ()| {
                    if tid == 3 {
                        // Polls for something that never comes.
                        loop {
                            y.suspend(Park::Poll);
                        }
                    }
                    team.barrier(tid, 4, |p| {
                        y.suspend(p);
                    });
                })
            })
            .collect();
        let mut steps = 0;
        loop {
            let step = team.step(|tid| {
                let t = tid as usize;
                match cos[t].resume(()) {
                    CoroutineResult::Yield(Park::Poll) if team.cancelled() => {
                        // SAFETY: suspended in the loop above: nothing to drop.
                        unsafe { cos[t].force_reset() };
                        None
                    }
                    CoroutineResult::Yield(p) => Some(p),
                    CoroutineResult::Return(()) => None,
                }
            });
            if step == Step::Done {
                break;
            }
            steps += 1;
            assert!(!team.computing(), "polling is not computing");
            if steps == 10 {
                assert_eq!(team.waiting(), Some((0, 4, 7)));
                team.time_out();
            }
            assert!(steps < 100, "the cancelled thread did not end");
        }
        assert!(matches!(
            team.take_error(),
            Some((
                0,
                TeamError::Timeout {
                    site: 4,
                    waiting: 7,
                    threads: 8
                }
            ))
        ));
    }

    #[test]
    fn reset_allows_the_next_block() {
        let team = Rc::new(Team::new(8, 8));
        for _ in 0..3 {
            team.reset();
            let err = run(&team, |tid, team, park| team.barrier(tid, 0, park));
            assert!(err.is_none(), "{err:?}");
        }
    }
}
