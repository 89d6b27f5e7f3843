//! Ranks as processes on one node: shared-memory segments, the bootstrap socket, the
//! liveness watchdog and a local launcher.
//!
//! **Launch environment** (what `torchrun` sets, and [`spawn_local`]): `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, optionally `LOCAL_WORLD_SIZE` (must equal `WORLD_SIZE`:
//! a world lives on one node), and the bootstrap socket:
//!
//! - `TESSERA_BOOTSTRAP`: a Unix socket path, or `@name` for a Linux abstract socket
//!   (no file, nothing to clean up). [`spawn_local`] sets a unique abstract name.
//! - else `MASTER_ADDR`/`MASTER_PORT` (and `TORCHELASTIC_RUN_ID` when set): the
//!   abstract socket `@tessera-<addr>-<port>-<run id>`, so `torchrun` needs nothing
//!   more. (Only the names are used: no TCP connection is made.)
//!
//! Without `WORLD_SIZE` the process is a world of one rank.
//!
//! **Bootstrap.** Rank 0 listens; every other rank connects (retrying until the wait
//! timeout), sends its rank, the world's configuration (size, heap and signal bytes,
//! kind) and its contribution: the file descriptor of its heap (a `memfd`, passed with
//! `SCM_RIGHTS`) for host worlds, an IPC handle of its device heap for GPU worlds.
//! Rank 0 checks that everybody agrees and answers each rank with the team segment's
//! descriptor and every rank's contribution; each process then maps every heap
//! (`mmap(MAP_SHARED)`) or opens every IPC handle. The connections stay open.
//!
//! **Liveness.** After the bootstrap the connections carry one message: `B`, "this
//! rank leaves" (sent when its [`crate::Rank`] is dropped). A connection that closes
//! without it means the process died: rank 0 sees its peers die, the others see rank
//! 0 die, and the watchdog thread marks the world as failed in the team segment and
//! in every rank's control words, so every rank's waits and host barriers stop with
//! an error naming the dead rank. Rank 0, when dropped, waits for every peer to leave
//! (or die) before closing, since closing would look like its death. On GPUs leaving
//! is collective (a host barrier when the `Rank` is dropped), since a process's
//! device heap, opened by the others through IPC, is freed when it goes; host heaps
//! are shared files whose mappings outlive their creator.
//!
//! **Why a local socket**: one node is all shared memory (and CUDA/HIP IPC) can
//! reach, and a Unix socket is the one channel that can carry file descriptors; it
//! needs no port, and an abstract name leaves nothing behind. Multi-node worlds
//! would use the vendors' device libraries (NVSHMEM, rocSHMEM), see the design notes.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::process::{Command, Output, Stdio};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tessera_ir::interp::HostMemory;

use crate::Error;

const HELLO: u64 = 0x7465_7373_6865_6c6f; // "tesshelo"
const PROTOCOL: u64 = 1;
const FDS_PER_MSG: usize = 200;

/// A `MAP_SHARED` mapping of a shared-memory file, unmapped on drop.
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain shared memory, accessed atomically or through raw pointers.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

// SAFETY: `ptr` is valid for `len` bytes (page-aligned) until drop.
unsafe impl HostMemory for Mapping {
    fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this length, unmapped once.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// A zeroed anonymous shared-memory file of `len` bytes (`memfd_create`).
pub(crate) fn memfd(name: &str, len: usize) -> Result<OwnedFd, String> {
    let cname = std::ffi::CString::new(name).map_err(|_| "NUL in a segment name".to_string())?;
    // SAFETY: a NUL-terminated name; returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(os_err("memfd_create"));
    }
    // SAFETY: `fd` is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain call on an owned descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(os_err(&format!("sizing a shared segment to {len} bytes")));
    }
    Ok(fd)
}

/// Maps all of `fd` (which must hold at least `len` bytes) shared, read-write.
pub(crate) fn map(fd: BorrowedFd<'_>, len: usize) -> Result<Mapping, String> {
    // SAFETY: zeroed `stat` is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor and out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(os_err("fstat of a shared segment"));
    }
    if (st.st_size as u64) < len as u64 || len == 0 {
        return Err(format!(
            "a shared segment holds {} bytes, {len} expected",
            st.st_size
        ));
    }
    // SAFETY: maps a file we hold a descriptor of; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_err(&format!("mapping a shared segment of {len} bytes")));
    }
    NonNull::new(p.cast::<u8>())
        .map(|ptr| Mapping { ptr, len })
        .ok_or_else(|| "mmap returned null".to_string())
}

/// Where this process is in a launched world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    /// `RANK`.
    pub rank: u32,
    /// `WORLD_SIZE`.
    pub size: u32,
    /// `LOCAL_RANK` (defaults to `RANK`): which GPU of the node this rank should use.
    pub local_rank: u32,
    /// The bootstrap socket (`@name`: abstract), `None` for a world of one.
    pub bootstrap: Option<String>,
}

impl LaunchEnv {
    /// Reads the launch environment (see the module docs).
    pub fn from_env() -> Result<LaunchEnv, Error> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Self::from_vars(get)
    }

    pub(crate) fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv, Error> {
        let bad = |message: String| Error::Comm { rank: 0, message };
        let num = |k: &str| -> Result<Option<u32>, Error> {
            get(k)
                .map(|v| {
                    v.trim()
                        .parse::<u32>()
                        .map_err(|_| bad(format!("{k}={v:?} is not a rank count or index")))
                })
                .transpose()
        };
        let Some(size) = num("WORLD_SIZE")? else {
            return Ok(LaunchEnv {
                rank: 0,
                size: 1,
                local_rank: 0,
                bootstrap: None,
            });
        };
        let rank = num("RANK")?.ok_or_else(|| bad("WORLD_SIZE is set but RANK is not".into()))?;
        if size == 0 || size > 1024 || rank >= size {
            return Err(bad(format!(
                "RANK={rank} WORLD_SIZE={size}: a world needs 1 to 1024 ranks and 0 <= RANK < WORLD_SIZE"
            )));
        }
        if let Some(local) = num("LOCAL_WORLD_SIZE")?
            && local != size
        {
            return Err(bad(format!(
                "LOCAL_WORLD_SIZE={local} but WORLD_SIZE={size}: Tessera worlds live on one node (peers are reached through shared memory)"
            )));
        }
        let local_rank = num("LOCAL_RANK")?.unwrap_or(rank);
        let bootstrap = if size == 1 {
            None
        } else if let Some(p) = get("TESSERA_BOOTSTRAP") {
            Some(p)
        } else if let (Some(addr), Some(port)) = (get("MASTER_ADDR"), get("MASTER_PORT")) {
            let run = get("TORCHELASTIC_RUN_ID").unwrap_or_default();
            Some(format!("@tessera-{addr}-{port}-{run}"))
        } else {
            return Err(bad(format!(
                "RANK={rank} WORLD_SIZE={size} but no bootstrap socket: set TESSERA_BOOTSTRAP (a Unix socket path, or @name) or MASTER_ADDR and MASTER_PORT"
            )));
        };
        Ok(LaunchEnv {
            rank,
            size,
            local_rank,
            bootstrap,
        })
    }
}

fn socket_addr(name: &str) -> Result<SocketAddr, String> {
    match name.strip_prefix('@') {
        Some(abs) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(abs.as_bytes())
        }
        None => SocketAddr::from_pathname(name),
    }
    .map_err(|e| format!("bootstrap socket {name:?}: {e}"))
}

/// What a rank brings to the bootstrap.
pub(crate) struct Contribution {
    /// Its heap's shared-memory file (host worlds).
    pub(crate) heap_fd: Option<OwnedFd>,
    /// Opaque bytes (GPU worlds: the heap's IPC handle).
    pub(crate) blob: Vec<u8>,
}

/// What the bootstrap gives every rank.
pub(crate) struct Joined {
    /// The team segment.
    pub(crate) team_fd: OwnedFd,
    /// Every rank's contribution, by rank (this rank's own included).
    pub(crate) all: Vec<Contribution>,
    /// Open connections: rank 0 to every other rank, the others to rank 0.
    pub(crate) peers: Vec<(u32, UnixStream)>,
}

/// Writes all of `bytes` with `MSG_NOSIGNAL`: a peer that died is an error, not a
/// `SIGPIPE` (which would kill a host program that does not ignore it, e.g. Python).
fn send_all(s: &UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: sends from a live buffer on a connected socket.
        let n = unsafe {
            libc::send(
                s.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

fn write_u64s(s: &mut UnixStream, words: &[u64]) -> std::io::Result<()> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    send_all(s, &bytes)
}

fn read_u64s(s: &mut UnixStream, n: usize) -> std::io::Result<Vec<u64>> {
    let mut bytes = vec![0u8; n * 8];
    s.read_exact(&mut bytes)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

/// Sends descriptors, [`FDS_PER_MSG`] per one-byte message.
fn send_fds(s: &UnixStream, fds: &[RawFd]) -> std::io::Result<()> {
    for chunk in fds.chunks(FDS_PER_MSG) {
        let byte = [b'F'];
        let mut iov = libc::iovec {
            iov_base: byte.as_ptr() as *mut libc::c_void,
            iov_len: 1,
        };
        let data_len = std::mem::size_of_val(chunk) as u32;
        // SAFETY: pure arithmetic.
        let space = unsafe { libc::CMSG_SPACE(data_len) } as usize;
        let mut cbuf = vec![0u64; space.div_ceil(8)];
        // SAFETY: zeroed msghdr is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds CMSG_SPACE(data_len) aligned bytes, so the
        // first header and its data fit.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(data_len) as _;
            std::ptr::copy_nonoverlapping(
                chunk.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(c),
                data_len as usize,
            );
        }
        // SAFETY: a valid message on a connected socket.
        let r = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receives `n` descriptors sent by [`send_fds`].
fn recv_fds(s: &UnixStream, n: usize) -> std::io::Result<Vec<OwnedFd>> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let want = (n - out.len()).min(FDS_PER_MSG);
        let mut byte = [0u8];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        // SAFETY: pure arithmetic.
        let space = unsafe { libc::CMSG_SPACE((want * std::mem::size_of::<RawFd>()) as u32) };
        let mut cbuf = vec![0u64; (space as usize).div_ceil(8)];
        // SAFETY: zeroed msghdr is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: buffers live for the call.
        let r = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if r == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let before = out.len();
        // SAFETY: walks the control messages the kernel wrote into `cbuf`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    let data = libc::CMSG_DATA(c).cast::<RawFd>();
                    for i in 0..bytes / std::mem::size_of::<RawFd>() {
                        out.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 || byte[0] != b'F' || out.len() == before {
            return Err(std::io::Error::other("malformed descriptor message"));
        }
    }
    Ok(out)
}

/// The world's configuration every rank must agree on.
pub(crate) type Config = [u64; 4];

/// Runs the bootstrap (see the module docs) as `env.rank`.
pub(crate) fn bootstrap(
    env: &LaunchEnv,
    config: Config,
    mine: Contribution,
    timeout: Duration,
) -> Result<Joined, String> {
    let Some(name) = &env.bootstrap else {
        return Err("no bootstrap socket".into());
    };
    let addr = socket_addr(name)?;
    let deadline = Instant::now() + timeout;
    if env.rank == 0 {
        bootstrap_root(env, name, &addr, config, mine, deadline)
    } else {
        bootstrap_peer(env, name, &addr, config, mine, deadline)
    }
}

fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn bootstrap_peer(
    env: &LaunchEnv,
    name: &str,
    addr: &SocketAddr,
    config: Config,
    mine: Contribution,
    deadline: Instant,
) -> Result<Joined, String> {
    let mut s = loop {
        match UnixStream::connect_addr(addr) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "cannot reach rank 0 at bootstrap socket {name:?} before the timeout: {e}"
                ));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let io = |e: std::io::Error| format!("bootstrap with rank 0 over {name:?}: {e}");
    s.set_read_timeout(Some(left(deadline))).map_err(io)?;
    s.set_write_timeout(Some(left(deadline))).map_err(io)?;
    let mut hello = vec![
        HELLO,
        PROTOCOL,
        u64::from(env.rank),
        std::process::id().into(),
        u64::from(mine.heap_fd.is_some()),
        mine.blob.len() as u64,
    ];
    hello.extend_from_slice(&config);
    write_u64s(&mut s, &hello).map_err(io)?;
    send_all(&s, &mine.blob).map_err(io)?;
    if let Some(fd) = &mine.heap_fd {
        send_fds(&s, &[fd.as_raw_fd()]).map_err(io)?;
    }
    // The answer: status, then (on success) every rank's contribution.
    let head = read_u64s(&mut s, 3).map_err(io)?;
    if head[0] != HELLO {
        return Err(format!("{name:?} is not a Tessera bootstrap socket"));
    }
    if head[1] != 0 {
        let mut msg = vec![0u8; head[2].min(1 << 16) as usize];
        s.read_exact(&mut msg).map_err(io)?;
        return Err(format!(
            "rank 0 refused this rank: {}",
            String::from_utf8_lossy(&msg)
        ));
    }
    let size = head[2] as usize;
    if size != env.size as usize {
        return Err(format!("rank 0 answered for {size} ranks"));
    }
    let mut all = Vec::with_capacity(size);
    let mut with_fd = Vec::with_capacity(size);
    for _ in 0..size {
        let w = read_u64s(&mut s, 2).map_err(io)?;
        let mut blob = vec![0u8; w[1].min(1 << 20) as usize];
        s.read_exact(&mut blob).map_err(io)?;
        with_fd.push(w[0] == 1);
        all.push(Contribution {
            heap_fd: None,
            blob,
        });
    }
    let nfds = 1 + with_fd.iter().filter(|&&b| b).count();
    let mut fds = recv_fds(&s, nfds).map_err(io)?.into_iter();
    let team_fd = fds.next().ok_or("no team segment received")?;
    for (c, has) in all.iter_mut().zip(with_fd) {
        if has {
            c.heap_fd = Some(fds.next().ok_or("missing heap descriptor")?);
        }
    }
    s.set_read_timeout(None).map_err(io)?;
    s.set_write_timeout(None).map_err(io)?;
    Ok(Joined {
        team_fd,
        all,
        peers: vec![(0, s)],
    })
}

fn bootstrap_root(
    env: &LaunchEnv,
    name: &str,
    addr: &SocketAddr,
    config: Config,
    mine: Contribution,
    deadline: Instant,
) -> Result<Joined, String> {
    if !name.starts_with('@') {
        // A socket file left by an earlier job.
        let _ = std::fs::remove_file(name);
    }
    let listener = UnixListener::bind_addr(addr)
        .map_err(|e| format!("rank 0 cannot listen on bootstrap socket {name:?}: {e}"))?;
    let result = accept_all(env, name, &listener, config, mine, deadline);
    drop(listener);
    if !name.starts_with('@') {
        let _ = std::fs::remove_file(name);
    }
    result
}

fn accept_all(
    env: &LaunchEnv,
    name: &str,
    listener: &UnixListener,
    config: Config,
    mine: Contribution,
    deadline: Instant,
) -> Result<Joined, String> {
    let size = env.size as usize;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("bootstrap socket {name:?}: {e}"))?;
    let mut slots: Vec<Option<(Contribution, Option<UnixStream>)>> =
        (0..size).map(|_| None).collect();
    slots[0] = Some((mine, None));
    let mut joined = 1;
    let mut problem: Option<String> = None;
    let mut refused: Vec<UnixStream> = Vec::new();
    while joined < size {
        let (mut s, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<String> = (0..size)
                        .filter(|&r| slots[r].is_none())
                        .map(|r| r.to_string())
                        .collect();
                    return Err(format!(
                        "bootstrap timed out: rank(s) {} never connected to {name:?}",
                        missing.join(", ")
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => return Err(format!("accepting on {name:?}: {e}")),
        };
        let io = |e: std::io::Error| format!("bootstrap over {name:?}: {e}");
        s.set_nonblocking(false).map_err(io)?;
        s.set_read_timeout(Some(left(deadline))).map_err(io)?;
        s.set_write_timeout(Some(left(deadline))).map_err(io)?;
        let h = read_u64s(&mut s, 6 + config.len()).map_err(io)?;
        if h[0] != HELLO || h[1] != PROTOCOL {
            // Not one of ours (or another version): ignore the connection.
            continue;
        }
        let (rank, pid, has_fd, blob_len) = (h[2] as usize, h[3], h[4] == 1, h[5]);
        let mut blob = vec![0u8; blob_len.min(1 << 20) as usize];
        s.read_exact(&mut blob).map_err(io)?;
        let heap_fd = if has_fd {
            recv_fds(&s, 1).map_err(io)?.pop()
        } else {
            None
        };
        let their: Config = [h[6], h[7], h[8], h[9]];
        let why = if rank >= size {
            Some(format!(
                "rank {rank} (pid {pid}) is outside a world of {size}"
            ))
        } else if slots[rank].is_some() {
            Some(format!(
                "two processes claim rank {rank} (the second: pid {pid})"
            ))
        } else if their != config {
            Some(format!(
                "rank {rank} (pid {pid}) has another configuration than rank 0 (world size, heap bytes, signal bytes, kind: {their:?} vs {config:?}); every rank must build the same World"
            ))
        } else {
            None
        };
        match why {
            Some(w) => {
                problem.get_or_insert(w);
                refused.push(s);
                joined += 1;
            }
            None => {
                slots[rank] = Some((Contribution { heap_fd, blob }, Some(s)));
                joined += 1;
            }
        }
    }
    let mut all = Vec::with_capacity(size);
    let mut peers = Vec::with_capacity(size - 1);
    for (r, slot) in slots.into_iter().enumerate() {
        match slot {
            Some((c, s)) => {
                all.push(c);
                if let Some(s) = s {
                    peers.push((r as u32, s));
                }
            }
            None => {
                problem.get_or_insert(format!("rank {r} is missing"));
                all.push(Contribution {
                    heap_fd: None,
                    blob: Vec::new(),
                });
            }
        }
    }
    if let Some(p) = problem {
        let bytes = p.as_bytes();
        for s in peers.iter_mut().map(|(_, s)| s).chain(refused.iter_mut()) {
            let _ = write_u64s(s, &[HELLO, 1, bytes.len() as u64]);
            let _ = send_all(s, bytes);
        }
        return Err(p);
    }
    let team_fd = memfd("tessera-team", super::team::TEAM_BYTES)?;
    // Stamp it before anyone maps it.
    let magic = super::team::MAGIC.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live buffer into our own file.
    if unsafe { libc::pwrite(team_fd.as_raw_fd(), magic.as_ptr().cast(), 8, 0) } != 8 {
        return Err(os_err("initializing the team segment"));
    }
    let mut fds = vec![team_fd.as_raw_fd()];
    fds.extend(
        all.iter()
            .filter_map(|c| c.heap_fd.as_ref().map(|f| f.as_raw_fd())),
    );
    for (r, s) in &mut peers {
        let io = |e: std::io::Error| format!("bootstrap answer to rank {r} over {name:?}: {e}");
        let mut words = vec![HELLO, 0, size as u64];
        for c in &all {
            words.push(u64::from(c.heap_fd.is_some()));
            words.push(c.blob.len() as u64);
            write_u64s(s, &std::mem::take(&mut words)).map_err(io)?;
            send_all(s, &c.blob).map_err(io)?;
        }
        send_fds(s, &fds).map_err(io)?;
        s.set_read_timeout(None).map_err(io)?;
        s.set_write_timeout(None).map_err(io)?;
    }
    Ok(Joined {
        team_fd,
        all,
        peers,
    })
}

/// The open connections of a process rank and their watchdog thread (see the module
/// docs). Dropping it leaves the world.
pub(crate) struct Link {
    rank: u32,
    streams: Vec<(u32, UnixStream)>,
    leaving: Arc<AtomicBool>,
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
        let flag = leaving.clone();
        let thread = std::thread::Builder::new()
            .name(format!("tessera-rank{rank}-watchdog"))
            .spawn(move || watch(watched, &flag, &*died))
            .map_err(|e| format!("starting the watchdog thread: {e}"))?;
        Ok(Link {
            rank,
            streams: peers,
            leaving,
            thread: Some(thread),
        })
    }
}

/// Reads the peers' goodbyes until every connection is closed.
fn watch(mut peers: Vec<(u32, UnixStream)>, leaving: &AtomicBool, died: &(dyn Fn(u32) + Sync)) {
    while !peers.is_empty() {
        let mut polls: Vec<libc::pollfd> = peers
            .iter()
            .map(|(_, s)| libc::pollfd {
                fd: s.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `polls` describes live descriptors.
        let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 200) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        let mut gone = Vec::new();
        for (i, p) in polls.iter().enumerate() {
            if p.revents == 0 {
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
            peers.swap_remove(i);
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if self.rank == 0 {
            // Closing now would look like rank 0's death: wait for every peer to
            // leave (or die).
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
            self.leaving.store(true, Ordering::Release);
        } else {
            self.leaving.store(true, Ordering::Release);
            for (_, s) in &mut self.streams {
                let _ = send_all(s, b"B");
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}

static SPAWNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Runs `program` with `args` as `n` ranks of one world, the way `torchrun
/// --nproc-per-node n` would: each process gets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
/// `LOCAL_WORLD_SIZE` and a fresh `TESSERA_BOOTSTRAP` (an abstract socket), and the
/// rest of this process's environment. Waits for all of them and returns their
/// outputs (exit status, stdout, stderr) by rank.
pub fn spawn_local(
    n: usize,
    program: impl AsRef<OsStr>,
    args: &[impl AsRef<OsStr>],
) -> Result<Vec<Output>, Error> {
    spawn_local_with(n, |_| {
        let mut c = Command::new(program.as_ref());
        c.args(args);
        c
    })
}

/// Like [`spawn_local`], with the command of rank `r` built by `command(r)` (for
/// extra arguments or environment variables); the launch variables are added to it
/// and its standard streams are captured.
pub fn spawn_local_with(
    n: usize,
    mut command: impl FnMut(usize) -> Command,
) -> Result<Vec<Output>, Error> {
    let err = |message: String| Error::Comm { rank: 0, message };
    if n == 0 || n > 1024 {
        return Err(err(format!("a world needs 1 to 1024 ranks, got {n}")));
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = format!(
        "@tessera-{}-{}-{nanos}",
        std::process::id(),
        SPAWNS.fetch_add(1, Ordering::Relaxed)
    );
    let mut children = Vec::with_capacity(n);
    for r in 0..n {
        let mut cmd = command(r);
        let child = cmd
            .env("RANK", r.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("TESSERA_BOOTSTRAP", &name)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match child {
            Ok(c) => children.push(c),
            Err(e) => {
                // The ones started would wait for this rank until their timeout.
                for mut c in children {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(err(format!(
                    "cannot start rank {r}: {}: {e}",
                    cmd.get_program().to_string_lossy()
                )));
            }
        }
    }
    // Collect every child's output concurrently (a full pipe would block it).
    let waiters: Vec<_> = children
        .into_iter()
        .map(|c| std::thread::spawn(move || c.wait_with_output()))
        .collect();
    waiters
        .into_iter()
        .enumerate()
        .map(|(r, w)| {
            w.join()
                .map_err(|_| err(format!("waiting for rank {r} panicked")))?
                .map_err(|e| err(format!("waiting for rank {r}: {e}")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Result<LaunchEnv, Error> {
        LaunchEnv::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn launch_environment() {
        assert_eq!(env(&[]).unwrap().size, 1);
        let e = env(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!(
            e,
            LaunchEnv {
                rank: 2,
                size: 4,
                local_rank: 2,
                bootstrap: Some("@tessera-127.0.0.1-29500-".into())
            }
        );
        let e = env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("TESSERA_BOOTSTRAP", "/tmp/x.sock"),
        ])
        .unwrap();
        assert_eq!(e.bootstrap.as_deref(), Some("/tmp/x.sock"));
        assert_eq!(e.local_rank, 1);
        for bad in [
            &[
                ("RANK", "2"),
                ("WORLD_SIZE", "2"),
                ("TESSERA_BOOTSTRAP", "@x"),
            ][..],
            &[("WORLD_SIZE", "2"), ("TESSERA_BOOTSTRAP", "@x")],
            &[("RANK", "0"), ("WORLD_SIZE", "2")],
            &[
                ("RANK", "x"),
                ("WORLD_SIZE", "2"),
                ("TESSERA_BOOTSTRAP", "@x"),
            ],
            &[
                ("RANK", "0"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_WORLD_SIZE", "2"),
                ("TESSERA_BOOTSTRAP", "@x"),
            ],
        ] {
            let e = env(bad).unwrap_err().to_string();
            assert!(e.contains("RANK") || e.contains("WORLD_SIZE"), "{e}");
        }
    }

    #[test]
    fn descriptors_and_mappings_cross_a_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let fds: Vec<OwnedFd> = (0..3)
            .map(|i| memfd(&format!("t{i}"), 8192).unwrap())
            .collect();
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
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
