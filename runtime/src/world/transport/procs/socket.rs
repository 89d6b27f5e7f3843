//! The socket I/O of a world of processes' bootstrap and watchdog: naming the
//! bootstrap socket (a path, or `@name` for a Linux abstract socket), writing without
//! `SIGPIPE`, passing file descriptors (`SCM_RIGHTS`), reading against a deadline,
//! and asking who is at the other end (`SO_PEERCRED`).
//!
//! Contract: every write uses `MSG_NOSIGNAL` (a peer that died is an error, never a
//! signal that kills the host program); every read for the bootstrap is bounded by a
//! deadline that a peer sending a byte at a time cannot stretch; descriptors arrive
//! close-on-exec, and a truncated or malformed descriptor message is an error.

use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{SocketAddr, UnixStream};
use std::time::{Duration, Instant};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

const FDS_PER_MSG: usize = 200;

/// The address of the bootstrap socket `name` (`@name`: an abstract socket).
pub(super) fn socket_addr(name: &str) -> Result<SocketAddr, String> {
    match name.strip_prefix('@') {
        Some(abs) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(abs.as_bytes())
        }
        None => SocketAddr::from_pathname(name),
    }
    .map_err(|e| format!("bootstrap socket {name:?}: {e}"))
}

/// Writes all of `bytes` with `MSG_NOSIGNAL`: a peer that died is an error, not a
/// `SIGPIPE` (which would kill a host program that does not ignore it, e.g. Python).
pub(super) fn send_all(s: &UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match rustix::net::send(s, bytes, SendFlags::NOSIGNAL) {
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

pub(super) fn write_u64s(s: &mut UnixStream, words: &[u64]) -> std::io::Result<()> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    send_all(s, &bytes)
}

/// Sends descriptors, [`FDS_PER_MSG`] per one-byte message.
pub(super) fn send_fds(s: &UnixStream, fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    for chunk in fds.chunks(FDS_PER_MSG) {
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(chunk.len()))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(chunk)) {
            return Err(std::io::Error::other("descriptor message too large"));
        }
        let sent =
            rustix::net::sendmsg(s, &[IoSlice::new(b"F")], &mut control, SendFlags::NOSIGNAL)?;
        if sent != 1 {
            return Err(std::io::Error::other("descriptor message not sent"));
        }
    }
    Ok(())
}

/// Receives `n` descriptors sent by [`send_fds`].
pub(super) fn recv_fds(s: &UnixStream, n: usize) -> std::io::Result<Vec<OwnedFd>> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let want = (n - out.len()).min(FDS_PER_MSG);
        let mut byte = [0u8];
        let mut space = vec![MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(want))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let r = loop {
            match rustix::net::recvmsg(
                s,
                &mut [IoSliceMut::new(&mut byte)],
                &mut control,
                RecvFlags::CMSG_CLOEXEC,
            ) {
                Err(rustix::io::Errno::INTR) => {}
                other => break other?,
            }
        };
        if r.bytes == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let before = out.len();
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = m {
                out.extend(fds);
            }
        }
        if r.flags.contains(ReturnFlags::CTRUNC)
            || byte[0] != b'F'
            || out.len() == before
            || out.len() > n
        {
            return Err(std::io::Error::other("malformed descriptor message"));
        }
    }
    Ok(out)
}

/// The time left until `deadline`, at least 1 ms (a zero socket timeout means none).
pub(super) fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// The user and process at the other end of a connected socket (`SO_PEERCRED`).
/// (`rustix::net::sockopt::socket_peercred` is not used: its `UCred` holds a
/// non-zero pid, and the kernel reports pid 0 for a peer outside this process's pid
/// namespace, e.g. a container.)
pub(super) fn peer_cred(s: &UnixStream) -> std::io::Result<(u32, i32)> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the out-pointer and its length describe `c`, a plain C struct.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut c).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((c.uid, c.pid))
}

/// Reads exactly `buf.len()` bytes before `until` (each read gets what time is left,
/// so a peer that sends a byte at a time cannot stretch it).
pub(super) fn read_until(
    s: &mut UnixStream,
    buf: &mut [u8],
    until: Instant,
) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        if Instant::now() >= until {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left(until)))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

pub(super) fn read_words(
    s: &mut UnixStream,
    n: usize,
    until: Instant,
) -> std::io::Result<Vec<u64>> {
    let mut bytes = vec![0u8; n * 8];
    read_until(s, &mut bytes, until)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::os::fd::AsFd;

    use tessera_ir::interp::HostMemory;

    use super::super::segment::{map, memfd};

    #[test]
    fn descriptors_and_mappings_cross_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let fds: Vec<OwnedFd> = (0..3)
            .map(|i| memfd(&format!("t{i}"), 8192).unwrap())
            .collect();
        let raw: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        send_fds(&a, &raw).unwrap();
        let got = recv_fds(&b, 3).unwrap();
        // Writes through one mapping are visible through the received descriptor's.
        for (i, (mine, theirs)) in fds.iter().zip(&got).enumerate() {
            let m1 = map(mine.as_fd(), 8192).unwrap();
            let m2 = map(theirs.as_fd(), 8192).unwrap();
            // SAFETY: both map 8192 bytes.
            unsafe {
                m1.base().add(4000 + i).write_volatile(0x5a + i as u8);
                assert_eq!(m2.base().add(4000 + i).read_volatile(), 0x5a + i as u8);
                assert_eq!(m2.base().add(17).read_volatile(), 0);
            }
        }
        assert!(map(fds[0].as_fd(), 1 << 20).is_err());
    }
}
