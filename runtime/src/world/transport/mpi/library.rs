//! The process's MPI library ([`Mpi`]): initialized once per process
//! (`MPI_THREAD_SERIALIZED`), finalized when the last world of the process is gone,
//! and the collectives the transport needs on `MPI_COMM_WORLD`, each polled against
//! the wait timeout.
//!
//! Contract: [`Mpi::get`] answers the live library, or initializes MPI (an error if
//! it was finalized, is initialized by other code, or offers less than
//! `MPI_THREAD_SERIALIZED`); [`Mpi::agree`] is a barrier that fails on every rank
//! when any rank failed; dropping the last [`Mpi`] finalizes MPI unless a rank
//! stopped answering (then it is left to the process's exit). Whether the heaps of
//! a node's processes are shared follows [`SHARED_VAR`] and the library's one-sided
//! components ([`shared_heaps_off`]).

use std::ffi::c_int;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use mpi::ffi;

use super::calls::{
    Guard, break_transport, cannot_free, check, collective_late, deadline, lock, null_request, poll,
};

/// The process's MPI library, initialized (finalized when dropped).
pub(super) struct Mpi {
    universe: Mutex<Option<mpi::environment::Universe>>,
    /// This process's rank in `MPI_COMM_WORLD`.
    pub(super) rank: u32,
    /// `MPI_COMM_WORLD`'s size.
    pub(super) size: u32,
}

/// The live library, if any.
static LIB: Mutex<Weak<Mpi>> = Mutex::new(Weak::new());

impl Mpi {
    /// The process's MPI library, initialized on first use.
    pub(super) fn get() -> Result<Arc<Mpi>, String> {
        let mut live = LIB.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = live.upgrade() {
            return Ok(m);
        }
        let _g = lock()?;
        let mut finalized: c_int = 0;
        // SAFETY: MPI_Finalized may be called at any time.
        check("MPI_Finalized", unsafe {
            ffi::MPI_Finalized(&mut finalized)
        })?;
        if finalized != 0 {
            return Err(
                "MPI was finalized when this process's last MPI world ended; it cannot be initialized again (keep a world alive for the process's lifetime)"
                    .into(),
            );
        }
        let (universe, threading) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| {
                "MPI is already initialized by other code of this process".to_string()
            })?;
        if !matches!(
            threading,
            mpi::Threading::Serialized | mpi::Threading::Multiple
        ) {
            return Err(format!(
                "the MPI library offers thread support {threading:?}; Tessera needs MPI_THREAD_SERIALIZED"
            ));
        }
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: MPI is initialized; the out-pointers are valid.
        unsafe {
            check(
                "MPI_Comm_rank",
                ffi::MPI_Comm_rank(ffi::RSMPI_COMM_WORLD, &mut rank),
            )?;
            check(
                "MPI_Comm_size",
                ffi::MPI_Comm_size(ffi::RSMPI_COMM_WORLD, &mut size),
            )?;
        }
        warn_about_known_bugs(rank);
        let m = Arc::new(Mpi {
            universe: Mutex::new(Some(universe)),
            rank: rank as u32,
            size: size as u32,
        });
        *live = Arc::downgrade(&m);
        Ok(m)
    }

    /// Every rank's `mine` (all of the same length), by rank: `MPI_Iallgather` on
    /// `MPI_COMM_WORLD`, polled against `timeout`.
    pub(super) fn allgather_u64(
        &self,
        mine: &[u64],
        timeout: Duration,
    ) -> Result<Vec<Vec<u64>>, String> {
        let n = mine.len();
        let g = lock()?;
        // SAFETY: reading MPI's predefined handle.
        let world = unsafe { ffi::RSMPI_COMM_WORLD };
        let (_g, all) = iallgather_u64(g, world, mine, self.size as usize, timeout)?;
        Ok(all.chunks(n.max(1)).map(<[u64]>::to_vec).collect())
    }

    /// `MPI_Iallreduce` of one int over `MPI_COMM_WORLD`, polled against `timeout`:
    /// the smallest (`min`) or the largest of the ranks' `mine`.
    pub(super) fn allreduce_int(
        &self,
        mine: c_int,
        min: bool,
        timeout: Duration,
    ) -> Result<c_int, String> {
        let g = lock()?;
        // Owned: leaked if the collective does not complete (MPI keeps them).
        let bufs = Box::into_raw(Box::new([mine, 0]));
        let mut req = null_request();
        // SAFETY: one int each way (`bufs` lives until the request completes, or
        // forever); the operations are MPI's predefined ones.
        let done = unsafe {
            check(
                "MPI_Iallreduce",
                ffi::MPI_Iallreduce(
                    bufs.cast::<c_int>().cast(),
                    bufs.cast::<c_int>().add(1).cast(),
                    1,
                    ffi::RSMPI_INT32_T,
                    if min { ffi::RSMPI_MIN } else { ffi::RSMPI_MAX },
                    ffi::RSMPI_COMM_WORLD,
                    &mut req,
                ),
            )
        }
        .and_then(|()| {
            let late = deadline(timeout);
            poll(
                g,
                std::slice::from_mut(&mut req),
                || late.is_some_and(|d| Instant::now() >= d),
                |_| break_transport(collective_late("MPI_Allreduce", timeout)),
            )
        });
        match done {
            // SAFETY: the collective completed: MPI is done with `bufs`.
            Ok(_g) => Ok(unsafe { Box::from_raw(bufs) }[1]),
            Err(e) => Err(e),
        }
    }

    /// A barrier that also tells every rank whether every rank succeeded: `problem`
    /// is this rank's failure at `what`, if any; an error on every rank when any
    /// rank had one (its own, or one naming the first rank that failed). Bounded by
    /// `timeout`.
    pub(super) fn agree(
        &self,
        problem: Option<String>,
        what: &str,
        timeout: Duration,
    ) -> Result<(), String> {
        let mine = if problem.is_some() {
            self.rank as c_int
        } else {
            c_int::MAX
        };
        let first = self.allreduce_int(mine, true, timeout)?;
        match problem {
            Some(p) => Err(p),
            None if first != c_int::MAX => Err(format!(
                "rank {first} could not {what} (its own error says why)"
            )),
            None => Ok(()),
        }
    }
}

/// Every rank of `comm`'s `mine` (all of the same length), by rank (`size` of
/// them): `MPI_Iallgather`, polled against `timeout` (`g`: the MPI lock, handed
/// back).
pub(super) fn iallgather_u64(
    g: Guard,
    comm: ffi::MPI_Comm,
    mine: &[u64],
    size: usize,
    timeout: Duration,
) -> Result<(Guard, Vec<u64>), String> {
    let n = mine.len();
    // Owned: leaked if the collective does not complete (MPI keeps them).
    let send: *mut [u64] = Box::into_raw(mine.to_vec().into_boxed_slice());
    let all: *mut [u64] = Box::into_raw(vec![0u64; n * size].into_boxed_slice());
    let mut req = null_request();
    // SAFETY: `n` u64s sent, `n` per rank received into `all`; both live until the
    // request completes (or forever).
    let done = unsafe {
        check(
            "MPI_Iallgather",
            ffi::MPI_Iallgather(
                send.cast::<u64>().cast(),
                n as c_int,
                ffi::RSMPI_UINT64_T,
                all.cast::<u64>().cast(),
                n as c_int,
                ffi::RSMPI_UINT64_T,
                comm,
                &mut req,
            ),
        )
    }
    .and_then(|()| {
        let late = deadline(timeout);
        poll(
            g,
            std::slice::from_mut(&mut req),
            || late.is_some_and(|d| Instant::now() >= d),
            |_| break_transport(collective_late("MPI_Allgather", timeout)),
        )
    });
    match done {
        Ok(g) => {
            // SAFETY: the collective completed: MPI is done with both buffers.
            let (send, all) = unsafe { (Box::from_raw(send), Box::from_raw(all)) };
            drop(send);
            Ok((g, all.into_vec()))
        }
        Err(e) => Err(e),
    }
}

/// Open MPI 3 and 4 crash in `MPI_Compare_and_swap` when their `osc/rdma` one-sided
/// component runs over the `vader` shared-memory transport (open-mpi/ompi#7967,
/// #11349), which is what they pick on one node unless told otherwise; Tessera's
/// atomics are compare-and-swaps. Says so (rank 0, once) unless the run chose its
/// one-sided component (`OMPI_MCA_osc`).
fn warn_about_known_bugs(rank: c_int) {
    let mut buf = vec![0u8; 8192];
    let mut len: c_int = 0;
    // SAFETY: `buf` has room for MPI_MAX_LIBRARY_VERSION_STRING characters.
    if rank != 0 || unsafe { ffi::MPI_Get_library_version(buf.as_mut_ptr().cast(), &mut len) } != 0
    {
        return;
    }
    let version = String::from_utf8_lossy(&buf[..len.clamp(0, 8192) as usize]).into_owned();
    let old_ompi = ["Open MPI v3.", "Open MPI v4."]
        .iter()
        .any(|v| version.starts_with(v));
    if old_ompi && std::env::var_os("OMPI_MCA_osc").is_none() {
        log::warn!(
            "{}: its osc/rdma component crashes in MPI_Compare_and_swap over shared memory (open-mpi/ompi#11349); if this job dies with a segmentation fault in mca_btl_vader, run mpirun with `--mca osc ^rdma` (or export OMPI_MCA_osc=^rdma)",
            version.lines().next().unwrap_or("Open MPI").trim()
        );
    }
}

/// The variable that turns the sharing of a node's heaps off (`0`) or on (`1`, the
/// default where the library allows it).
pub(crate) const SHARED_VAR: &str = "TESSERA_MPI_SHARED";

/// Why the heaps of a node's processes must not be allocated together, if they must
/// not: [`SHARED_VAR`]` = 0`, or an Open MPI run whose one-sided components exclude
/// `osc/sm` (`OMPI_MCA_osc`, e.g. `pt2pt` or `^sm`), which cannot allocate shared
/// windows. `get` reads one environment variable.
pub(super) fn shared_heaps_off(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    match get(SHARED_VAR).as_deref().map(str::trim) {
        Some("0") => return Some(format!("{SHARED_VAR}=0")),
        Some("1") => return None,
        _ => {}
    }
    let osc = get("OMPI_MCA_osc")?;
    let list = osc.trim();
    let (excluding, names) = match list.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, list),
    };
    let has_sm = names.split(',').any(|n| n.trim() == "sm");
    (excluding == has_sm)
        .then(|| format!("Open MPI's one-sided components are `{list}`, without `sm`"))
}

impl Drop for Mpi {
    fn drop(&mut self) {
        let universe = self
            .universe
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match cannot_free().map_or_else(lock, Err) {
            // Finalizes MPI (every window of this library is gone: they hold an
            // `Arc`). It waits for every process of the job: the job's end.
            Ok(_g) => drop(universe),
            // Finalizing would wait for a rank that stopped answering: the
            // process's exit cleans up (`mpirun` then ends the job).
            Err(why) => {
                log::warn!("MPI is left unfinalized: {why}");
                std::mem::forget(universe);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::world::transport::test_env as env;

    #[test]
    fn shared_heaps_follow_the_variable_then_open_mpi_components() {
        assert_eq!(shared_heaps_off(env(&[])), None);
        let off = shared_heaps_off(env(&[(SHARED_VAR, "0")]));
        assert_eq!(off.as_deref(), Some("TESSERA_MPI_SHARED=0"));
        // The variable wins over the components.
        let on = [(SHARED_VAR, "1"), ("OMPI_MCA_osc", "pt2pt")];
        assert_eq!(shared_heaps_off(env(&on)), None);
        for (osc, off) in [
            ("pt2pt", true),
            ("^sm", true),
            ("^rdma,sm", true),
            ("^rdma", false),
            ("sm,pt2pt", false),
            (" sm ", false),
        ] {
            let got = shared_heaps_off(env(&[("OMPI_MCA_osc", osc)]));
            assert_eq!(got.is_some(), off, "OMPI_MCA_osc={osc}: {got:?}");
        }
        // Anything else in the variable (`World::mpi` refuses it): the components decide.
        let junk = [(SHARED_VAR, "maybe"), ("OMPI_MCA_osc", "pt2pt")];
        assert!(shared_heaps_off(env(&junk)).is_some());
    }
}
