//! File access for the kernel cache and the artifact store, where whoever can write a
//! file can make this process run code (a kernel binary is loaded and launched as it
//! is, as with Triton's cache): folders are created private (`0700`) and must not be
//! writable by other users; entries are written through a temporary file created
//! exclusively with a random name (`tempfile`: `O_EXCL`, mode `0600`) and renamed over
//! the entry (a rename replaces a planted symbolic link, it never writes through it);
//! entries are read only when they are regular files (opened without following a
//! link and without blocking, so a FIFO is refused, not waited on) of a bounded size,
//! not writable by other users.

use std::fs;
use std::io::{self, Read, Write as _};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// The largest entry read (a kernel binary is a few MiB at most).
pub(crate) const MAX_ENTRY_BYTES: u64 = 256 << 20;

/// Mode bits that let the group or others write.
const SHARED_WRITE: u32 = 0o022;

fn refuse(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, what)
}

/// Creates `dir` (and missing parents) with mode `0700`; an existing folder keeps its
/// mode (the caller checks it, [`check_dir`] or [`check_own_dir`]).
pub(crate) fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Refuses a folder that other users could plant files in through its permissions:
/// one writable by the group or others (an artifact folder shipped read-only and
/// owned by its installer passes).
pub(crate) fn check_dir(dir: &Path) -> io::Result<()> {
    let m = fs::metadata(dir)?;
    if !m.is_dir() {
        return Err(refuse(format!("{} is not a folder", dir.display())));
    }
    if m.mode() & SHARED_WRITE != 0 {
        return Err(refuse(format!(
            "{} is writable by other users (mode {:o}): whoever writes it can run code \
             here (`chmod go-w` it, or choose another folder)",
            dir.display(),
            m.mode() & 0o777
        )));
    }
    Ok(())
}

/// [`check_dir`], and the folder must be this user's (or root's): the per-user kernel
/// cache, which another user's folder must not stand in for.
pub(crate) fn check_own_dir(dir: &Path) -> io::Result<()> {
    check_dir(dir)?;
    let uid = fs::metadata(dir)?.uid();
    let me = rustix::process::geteuid().as_raw();
    if uid != me && uid != 0 {
        return Err(refuse(format!(
            "{} belongs to another user (uid {uid}), who could plant kernels in it",
            dir.display()
        )));
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically: a new temporary file in `path`'s folder
/// (exclusive, random name, mode `0600`), flushed to disk, then renamed over `path`.
pub(crate) fn atomic_write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| refuse(format!("{} has no folder", path.display())))?;
    let mut tmp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map(drop).map_err(|e| e.error)
}

/// The bytes of `path` if it is a regular file of at most [`MAX_ENTRY_BYTES`] that
/// other users cannot write; a symbolic link, a FIFO, a device, a folder, an
/// oversized or a shared-writable file is an error (`NotFound` when it is missing).
pub(crate) fn read_entry(path: &Path) -> io::Result<Vec<u8>> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refuse(format!("{} is a symbolic link", path.display())),
            _ => e,
        })?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(refuse(format!("{} is not a regular file", path.display())));
    }
    if m.len() > MAX_ENTRY_BYTES {
        return Err(refuse(format!(
            "{} has {} bytes, more than the {} an entry may have",
            path.display(),
            m.len(),
            MAX_ENTRY_BYTES
        )));
    }
    if m.mode() & SHARED_WRITE != 0 {
        return Err(refuse(format!(
            "{} is writable by other users (mode {:o})",
            path.display(),
            m.mode() & 0o777
        )));
    }
    let mut bytes = Vec::with_capacity(m.len() as usize);
    Read::by_ref(&mut f)
        .take(MAX_ENTRY_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_ENTRY_BYTES {
        return Err(refuse(format!("{} grew while it was read", path.display())));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::mpsc;
    use std::time::Duration;

    fn dir(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("tessera-secure-fs-{name}-"))
            .tempdir()
            .expect("a temporary folder")
    }

    #[test]
    fn folders_are_private_and_shared_ones_refused() {
        let d = dir("mode");
        let sub = d.path().join("a/b");
        create_private_dir(&sub).expect("creates");
        assert_eq!(fs::metadata(&sub).unwrap().mode() & 0o777, 0o700);
        fs::set_permissions(&sub, fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_dir(&sub).unwrap_err().to_string();
        assert!(e.contains("writable by other users"), "{e}");
    }

    #[test]
    fn a_planted_link_is_replaced_not_followed() {
        let d = dir("link");
        let victim = d.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let entry = d.path().join("entry.bin");
        std::os::unix::fs::symlink(&victim, &entry).unwrap();
        let e = read_entry(&entry).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        atomic_write(&entry, b"kernel").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert!(!fs::symlink_metadata(&entry).unwrap().is_symlink());
        assert_eq!(read_entry(&entry).unwrap(), b"kernel");
        let m = fs::metadata(&entry).unwrap();
        assert_eq!(m.mode() & 0o077, 0, "entries are private");
    }

    #[test]
    fn fifos_oversized_and_shared_entries_are_refused_at_once() {
        let d = dir("kinds");
        let fifo = d.path().join("fifo.bin");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let (tx, rx) = mpsc::channel();
        let f = fifo.clone();
        std::thread::spawn(move || tx.send(read_entry(&f).map_err(|e| e.to_string())));
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("reading a FIFO entry returns at once");
        assert!(got.unwrap_err().contains("not a regular file"));

        let big = d.path().join("big.bin");
        let f = fs::File::create(&big).unwrap();
        f.set_len(MAX_ENTRY_BYTES + 1).unwrap();
        let e = read_entry(&big).unwrap_err().to_string();
        assert!(e.contains("more than"), "{e}");

        let shared = d.path().join("shared.bin");
        fs::write(&shared, b"x").unwrap();
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o666)).unwrap();
        let e = read_entry(&shared).unwrap_err().to_string();
        assert!(e.contains("writable by other users"), "{e}");
        assert_eq!(
            read_entry(&d.path().join("missing")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
