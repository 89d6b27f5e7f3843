//! Shared-memory segments of a world of processes: the heaps of host ranks and the
//! team segment are anonymous shared-memory files (`memfd`), sealed against resizing,
//! that every process maps.
//!
//! Contract: [`memfd`] makes a zeroed segment sealed so that no process holding it can
//! shrink or grow it; [`map`] maps a segment received from a peer only if it carries
//! that seal and holds the bytes expected, so a hostile or buggy peer cannot crash
//! this process with `SIGBUS` by truncating it.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use rustix::fs::{MemfdFlags, SealFlags};
use tessera_ir::interp::HostMemory;

/// A `MAP_SHARED` read-write mapping of a shared-memory file (`memmap2`), unmapped
/// on drop.
pub(crate) struct Mapping(memmap2::MmapRaw);

// SAFETY: the mapping is valid for `len` bytes until drop, and it is accessed only
// atomically or through raw pointers by the world's protocols.
unsafe impl HostMemory for Mapping {
    fn base(&self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

pub(super) fn os_err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// The seals every shared segment carries: its size is fixed, so no process that holds
/// it can shrink it under another's mapping (which would crash that one with
/// `SIGBUS`).
const SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// A zeroed anonymous shared-memory file of `len` bytes (`memfd_create`), sealed
/// against resizing ([`SEALS`]).
pub(crate) fn memfd(name: &str, len: usize) -> Result<OwnedFd, String> {
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(|e| os_err("memfd_create", e))?;
    rustix::fs::ftruncate(&fd, len as u64)
        .map_err(|e| os_err(&format!("sizing a shared segment to {len} bytes"), e))?;
    rustix::fs::fcntl_add_seals(&fd, SEALS).map_err(|e| os_err("sealing a shared segment", e))?;
    Ok(fd)
}

/// Refuses a segment whose size a peer could still change.
fn check_sealed(fd: BorrowedFd<'_>) -> Result<(), String> {
    match rustix::fs::fcntl_get_seals(fd) {
        Ok(seals) if seals.contains(SealFlags::SHRINK) => Ok(()),
        _ => Err(
            "a shared segment is not sealed against shrinking: whoever sent it could truncate it and crash this process (SIGBUS)"
                .into(),
        ),
    }
}

/// Maps all of `fd` (which must hold at least `len` bytes and be sealed against
/// shrinking) shared, read-write.
pub(crate) fn map(fd: BorrowedFd<'_>, len: usize) -> Result<Mapping, String> {
    check_sealed(fd)?;
    let st = rustix::fs::fstat(fd).map_err(|e| os_err("fstat of a shared segment", e))?;
    if (st.st_size as u64) < len as u64 || len == 0 {
        return Err(format!(
            "a shared segment holds {} bytes, {len} expected",
            st.st_size
        ));
    }
    memmap2::MmapOptions::new()
        .len(len)
        .map_raw(fd.as_raw_fd())
        .map(Mapping)
        .map_err(|e| os_err(&format!("mapping a shared segment of {len} bytes"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::os::fd::AsFd;

    #[test]
    fn segments_are_sealed_and_unsealed_ones_refused() {
        let fd = memfd("sealed", 8192).unwrap();
        assert!(
            rustix::fs::ftruncate(&fd, 4096).is_err(),
            "shrinking must fail"
        );
        assert!(
            rustix::fs::ftruncate(&fd, 1 << 20).is_err(),
            "growing must fail"
        );
        assert!(map(fd.as_fd(), 8192).is_ok());
        // An unsealed shared file, as a hostile peer could send.
        let plain = rustix::fs::memfd_create("plain", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&plain, 8192).unwrap();
        let e = map(plain.as_fd(), 8192).err().unwrap();
        assert!(e.contains("not sealed"), "{e}");
    }
}
