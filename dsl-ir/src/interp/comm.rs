//! The interpreter's communication world: ranks, control words, limits (the ops
//! themselves run in `comm_ops`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::InterpError;
use super::buffer::{Element, HostBuffer};

/// The most program instances (per rank) of a kernel that waits (`wait_until`,
/// `barrier_all`): each runs on its own OS thread.
pub const MAX_RESIDENT: u64 = 1024;

/// Layout of a rank's control words: `u64`s at the start of its symmetric heap,
/// zeroed when the world is created, never handed out to users.
pub mod ctrl {
    /// Arrival counter of `barrier_all` (used in rank 0's words only). Monotonic: a
    /// barrier completes when it reaches the next multiple of the participant count.
    pub const BARRIER: usize = 0;
    /// Generation of `barrier_all` (rank 0's words only): the last program to arrive
    /// resets [`BARRIER`] to 0 and then increments this word; the others wait for it
    /// to change. Each barrier thus counts its own participants, so kernels with
    /// different grids can share one world.
    pub const BARRIER_GEN: usize = 8;
    /// Nonzero once a rank failed: `1 + the failed rank`. Waits on every rank stop.
    pub const ABORT: usize = 1;
    /// Number of control words (the region is 256 bytes so data stays aligned).
    pub const WORDS: usize = 32;
}

/// How long a wait may take when the world does not say (the runtime's
/// `TESSERA_WAIT_TIMEOUT` default).
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(30);

/// The world one launch runs in: this rank, the number of ranks, every rank's control
/// words, and how long a wait may take.
#[derive(Clone, Debug)]
pub struct CommWorld {
    /// This rank, `0..size`.
    pub rank: u32,
    /// Number of ranks.
    pub size: u32,
    /// Every rank's control words (index: rank), `u64` buffers of at least
    /// [`ctrl::WORDS`] elements.
    pub ctrl: Arc<[Arc<HostBuffer>]>,
    /// How long a `wait_until` or `barrier_all` waits before failing.
    pub timeout: Duration,
}

impl CommWorld {
    /// A world of one rank with its own control words.
    pub fn single() -> CommWorld {
        CommWorld {
            rank: 0,
            size: 1,
            ctrl: Arc::from(vec![Arc::new(HostBuffer::new(
                crate::types::ScalarType::U64,
                ctrl::WORDS,
            ))]),
            timeout: DEFAULT_WAIT_TIMEOUT,
        }
    }

    pub(super) fn word(&self, rank: usize, w: usize) -> Option<&HostBuffer> {
        self.ctrl
            .get(rank)
            .map(|b| &**b)
            .filter(|b| b.elem() == u64::TY && b.len() > w)
    }

    /// Reads control word `w` of `rank` (0 when absent).
    pub fn read(&self, rank: usize, w: usize) -> u64 {
        // An engine that cannot read reads as 0 (no failure, no arrival): the wait
        // that polls it then times out with its own message.
        self.word(rank, w)
            .map_or(0, |b| b.load_word(w).unwrap_or(0))
    }

    /// Lets this rank's communication engine (if any) make progress.
    pub fn progress(&self) {
        if let Some(b) = self.ctrl.get(self.rank as usize) {
            b.progress();
        }
    }

    /// Completes this rank's writes through its communication engine (if any).
    pub fn quiet(&self) -> Result<(), InterpError> {
        match self.ctrl.get(self.rank as usize) {
            Some(b) => b.quiet(),
            None => Ok(()),
        }
    }

    /// The rank that failed first, if any.
    pub fn failed_rank(&self) -> Option<u32> {
        match self.read(self.rank as usize, ctrl::ABORT) {
            0 => None,
            v => Some((v - 1) as u32),
        }
    }

    /// Marks this rank as failed on every rank, releasing their waits (the first
    /// failure wins).
    pub fn abort(&self) {
        for r in 0..self.ctrl.len() {
            if let Some(b) = self.word(r, ctrl::ABORT) {
                // Best effort: the world is failing already.
                let _ = b.cas::<u64>(ctrl::ABORT, 0, self.rank as u64 + 1, Ordering::AcqRel);
            }
        }
    }
}
