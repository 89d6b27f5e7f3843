//! The transports between the ranks of a launched world, each with its own `join`
//! (the part of [`World::join`](super::World::join) that is the transport's):
//!
//! - [`procs`]: processes of one node sharing memory (`memfd` heaps or CUDA/HIP IPC),
//!   started by `torchrun` or [`spawn_local`](procs::spawn_local), met through a
//!   Unix-socket bootstrap and watched for deaths;
//! - `mpi` (feature `mpi`): the processes of an MPI job, heaps in MPI windows, peers
//!   reached through MPI one-sided communication;
//! - [`nvshmem`]: GPU ranks on NVSHMEM, one process per GPU on any number of nodes,
//!   its host library loaded at run time;
//! - [`rendezvous`]: the TCP rendezvous at which the ranks of a world across nodes
//!   meet (used by `nvshmem`).
//!
//! Contract: [`chosen`] is the transport a launched process joins through
//! ([`World::launched`](super::World::launched)): `TESSERA_TRANSPORT` when set, else
//! MPI for a process an MPI launcher started (and no `WORLD_SIZE`) in a build with
//! the `mpi` feature, else processes of one node. The transports build on the
//! world's abstraction (heaps, team segment, ranks), not on each other: `nvshmem`
//! only meets at the [`rendezvous`] and reads the job's secret from the variable
//! [`procs`] names ([`procs::SECRET_VAR`]), and nothing imports `nvshmem` or `mpi`.

#[cfg(feature = "mpi")]
pub(super) mod mpi;
pub mod nvshmem;
pub mod procs;
pub mod rendezvous;

use crate::error::Error;

/// Variables that MPI launchers (`mpirun` of Open MPI or MPICH, `srun`) set in the
/// processes they start.
const MPI_LAUNCHER_VARS: &[&str] = &["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"];

/// The transport a launched process joins its world through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Transport {
    /// Processes of one node sharing memory.
    Shm,
    /// An MPI job.
    Mpi,
    /// GPU ranks on NVSHMEM.
    Nvshmem,
}

/// The transport of a launched process (see
/// [`World::launched`](super::World::launched)), from the variables `get` reads.
pub(super) fn chosen(get: impl Fn(&str) -> Option<String>) -> Result<Transport, Error> {
    let var = |k: &str| get(k).filter(|v| !v.trim().is_empty());
    match var("TESSERA_TRANSPORT").as_deref().map(str::trim) {
        Some("mpi") => Ok(Transport::Mpi),
        Some("shm") => Ok(Transport::Shm),
        Some("nvshmem") => Ok(Transport::Nvshmem),
        Some(other) => Err(Error::Config(format!(
            "TESSERA_TRANSPORT=`{other}`: expected `shm`, `mpi` or `nvshmem`"
        ))),
        None => {
            let launcher =
                var("WORLD_SIZE").is_none() && MPI_LAUNCHER_VARS.iter().any(|k| var(k).is_some());
            if launcher && !cfg!(feature = "mpi") {
                // A build without MPI under `srun` stays what it was: a world of one.
                log::warn!(
                    "started by an MPI launcher but built without Tessera's `mpi` feature: this process is a world of one (rebuild with --features mpi to join the MPI job's world)"
                );
            }
            Ok(if launcher && cfg!(feature = "mpi") {
                Transport::Mpi
            } else {
                Transport::Shm
            })
        }
    }
}

/// The variables `vars` as a lookup, as the launch-parsing functions take them (tests).
#[cfg(test)]
fn test_env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let vars: Vec<(String, String)> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transport_follows_the_launcher_and_the_variable() {
        fn transport_of(vars: &[(&str, &str)]) -> Result<Transport, Error> {
            chosen(test_env(vars))
        }
        fn with(vars: &[(&str, &str)]) -> Result<bool, Error> {
            transport_of(vars).map(|t| t == Transport::Mpi)
        }
        assert_eq!(
            transport_of(&[("WORLD_SIZE", "2"), ("TESSERA_TRANSPORT", "nvshmem")]).unwrap(),
            Transport::Nvshmem
        );
        assert!(!with(&[]).unwrap());
        assert!(!with(&[("WORLD_SIZE", "4"), ("RANK", "1")]).unwrap());
        for launcher in MPI_LAUNCHER_VARS {
            // (Without the `mpi` feature a launched process stays a world of one.)
            assert_eq!(
                with(&[(launcher, "4")]).unwrap(),
                cfg!(feature = "mpi"),
                "{launcher}"
            );
        }
        // torchrun's variables win over an MPI launcher's; the variable over both.
        assert!(!with(&[("WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_SIZE", "2")]).unwrap());
        assert!(with(&[("WORLD_SIZE", "2"), ("TESSERA_TRANSPORT", " mpi ")]).unwrap());
        assert!(!with(&[("PMI_SIZE", "2"), ("TESSERA_TRANSPORT", "shm")]).unwrap());
        let e = with(&[("TESSERA_TRANSPORT", "ib")])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("TESSERA_TRANSPORT=`ib`") && e.contains("`shm`, `mpi` or `nvshmem`"),
            "{e}"
        );
    }
}
