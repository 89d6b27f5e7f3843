//! Liveness of a world of processes (see the [`procs`](super) docs, **Liveness.**):
//! after the bootstrap each rank keeps its connections ([`Link`]: rank 0 to every
//! other rank, the others to rank 0), watched by a thread of their own.
//!
//! Contract: a connection that closes without the goodbye (`B`) means its process
//! died, and the watchdog calls the world's `died(rank)` once for it, within one poll
//! period (50 ms); [`Link::leave`] says goodbye on every connection, rank 0 first
//! waiting (up to the patience given) for its peers to leave or die, and answers the
//! peers that had not left by then.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

use super::socket::send_all;
use crate::world::rank::PeerLink;

/// The open connections of a process rank and their watchdog thread (see the module
/// docs). [`Link::leave`] (or dropping it) leaves the world.
pub(crate) struct Link {
    rank: u32,
    streams: Vec<(u32, UnixStream)>,
    leaving: Arc<AtomicBool>,
    /// The peers whose connections are still open (their process neither left nor
    /// died), as the watchdog sees them.
    open: Arc<Mutex<Vec<u32>>>,
    thread: Option<JoinHandle<()>>,
}

impl Link {
    /// Starts watching `peers`; `died(rank)` is called once when a peer's process
    /// dies (its connection closes without a goodbye).
    pub(crate) fn start(
        rank: u32,
        peers: Vec<(u32, UnixStream)>,
        died: Arc<dyn Fn(u32) + Send + Sync>,
    ) -> Result<Link, String> {
        let leaving = Arc::new(AtomicBool::new(false));
        let mut watched = Vec::with_capacity(peers.len());
        for (r, s) in &peers {
            watched.push((
                *r,
                s.try_clone()
                    .map_err(|e| format!("watching rank {r}: {e}"))?,
            ));
        }
        let open = Arc::new(Mutex::new(peers.iter().map(|(r, _)| *r).collect()));
        let (flag, still) = (leaving.clone(), open.clone());
        let thread = std::thread::Builder::new()
            .name(format!("tessera-rank{rank}-watchdog"))
            .spawn(move || watch(watched, &flag, &still, &*died))
            .map_err(|e| format!("starting the watchdog thread: {e}"))?;
        Ok(Link {
            rank,
            streams: peers,
            leaving,
            open,
            thread: Some(thread),
        })
    }

    /// Leaves the world: says goodbye and closes the connections. Rank 0 first waits,
    /// up to `patience`, for every peer to leave or die (while it is there, its
    /// watchdog sees any peer's death and fails the world for the others); it answers
    /// the peers that had not left by then (still working, stopped or hung).
    pub(crate) fn leave(mut self, patience: Duration) -> Vec<u32> {
        self.close(patience)
    }

    fn close(&mut self, patience: Duration) -> Vec<u32> {
        let Some(thread) = self.thread.take() else {
            return Vec::new();
        };
        let mut stuck = Vec::new();
        if self.rank == 0 {
            let until = Instant::now() + patience;
            while !thread.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            if !thread.is_finished() {
                stuck = self.open.lock().map(|o| o.clone()).unwrap_or_default();
            }
        }
        self.leaving.store(true, Ordering::Release);
        for (_, s) in &mut self.streams {
            // A goodbye from every rank, rank 0 included: its peers see it leave, not
            // die (its team-segment record fails their barriers that need it).
            let _ = send_all(s, b"B");
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        // The watchdog sees `leaving` within one poll period.
        let _ = thread.join();
        stuck
    }
}

/// Reads the peers' goodbyes until every connection is closed (or this rank leaves).
fn watch(
    mut peers: Vec<(u32, UnixStream)>,
    leaving: &AtomicBool,
    open: &Mutex<Vec<u32>>,
    died: &(dyn Fn(u32) + Sync),
) {
    while !peers.is_empty() && !leaving.load(Ordering::Acquire) {
        let mut polls: Vec<PollFd<'_>> = peers
            .iter()
            .map(|(_, s)| PollFd::new(s, PollFlags::IN))
            .collect();
        let period = Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        match rustix::event::poll(&mut polls, Some(&period)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => return,
        }
        let ready: Vec<bool> = polls.iter().map(|p| !p.revents().is_empty()).collect();
        drop(polls);
        let mut gone = Vec::new();
        for (i, &r) in ready.iter().enumerate() {
            if !r {
                continue;
            }
            let (r, s) = &mut peers[i];
            let mut b = [0u8];
            match s.read(&mut b) {
                Ok(1) if b[0] == b'B' => gone.push(i),
                Ok(1) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                _ => {
                    // Closed without a goodbye: dead, unless we are the ones leaving
                    // (our own shutdown closes the connection too).
                    if !leaving.load(Ordering::Acquire) {
                        died(*r);
                    }
                    gone.push(i);
                }
            }
        }
        for i in gone.into_iter().rev() {
            let (r, _) = peers.swap_remove(i);
            if let Ok(mut o) = open.lock() {
                o.retain(|&x| x != r);
            }
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.close(Duration::ZERO);
    }
}

impl PeerLink for Link {
    fn leave(self: Box<Self>, patience: Duration) -> Vec<u32> {
        Link::leave(*self, patience)
    }
}
