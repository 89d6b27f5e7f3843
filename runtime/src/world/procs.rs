//! Ranks as processes on one node: shared-memory segments, the bootstrap socket, the
//! liveness watchdog and a local launcher.
//!
//! **Launch environment** (what `torchrun` sets, and [`spawn_local`]): `RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, optionally `LOCAL_WORLD_SIZE` (must equal `WORLD_SIZE`:
//! a world lives on one node), the bootstrap socket and its secret:
//!
//! - `TESSERA_BOOTSTRAP`: a Unix socket path, or `@name` for a Linux abstract socket.
//! - else `MASTER_ADDR`/`MASTER_PORT` (and `TORCHELASTIC_RUN_ID` when set): a socket
//!   named after them in the per-user folder (`$XDG_RUNTIME_DIR/tessera`, else
//!   `/tmp/tessera-<uid>`, created `0700`), so `torchrun` needs nothing more. (Only
//!   the names are used: no TCP connection is made.) [`spawn_local`] also uses a
//!   socket in that folder.
//! - `TESSERA_BOOTSTRAP_SECRET` (optional; [`spawn_local`] sets a random one): what
//!   every rank presents to rank 0.
//!
//! Without `WORLD_SIZE` the process is a world of one rank.
//!
//! **Bootstrap.** Rank 0 listens; every other rank connects (retrying until the wait
//! timeout), checks with `SO_PEERCRED` that the listener is a process of its own user,
//! and sends the secret, its rank, the world's configuration (size, heap and signal
//! bytes, kind) and its contribution: the file descriptor of its heap (a sealed
//! `memfd`, passed with `SCM_RIGHTS`) for host worlds, an IPC handle of its device heap
//! for GPU worlds. Rank 0 checks each connection on a thread of its own within a
//! per-connection limit: the peer's user (`SO_PEERCRED`), then the secret, before it
//! sends anything; a connection that fails either, or says nothing in time, is dropped
//! while accepting goes on. Rank 0 then checks that everybody agrees and answers each
//! rank with the team segment's descriptor and every rank's contribution; each process
//! maps every heap (`mmap(MAP_SHARED)`, refusing a segment not sealed against
//! shrinking) or opens every IPC handle. The connections stay open.
//!
//! **Liveness.** After the bootstrap the connections carry one message: `B`, "this
//! rank leaves" (sent when its [`crate::Rank`] is dropped). A connection that closes
//! without it means the process died: rank 0 sees its peers die, the others see rank
//! 0 die, and the watchdog thread marks the world as failed in the team segment and
//! in every rank's control words, so every rank's waits and host barriers stop with
//! an error naming the dead rank. A rank that leaves records it in the team segment
//! first, so the others' host barriers that need it fail at once. Rank 0, the hub
//! that sees every peer's death, waits for every peer to leave (or die) before it
//! says goodbye, but for at most the wait timeout (a stopped peer must not keep it
//! alive; after it the others see deaths by timeouts only). On GPUs leaving
//! is collective (a host barrier when the `Rank` is dropped), since a process's
//! device heap, opened by the others through IPC, is freed when it goes; host heaps
//! are shared files whose mappings outlive their creator.
//!
//! **Why a local socket**: one node is all shared memory (and CUDA/HIP IPC) can
//! reach, and a Unix socket is the one channel that can carry file descriptors and
//! tell who is at the other end; it needs no port. Multi-node worlds would use the
//! vendors' device libraries (NVSHMEM, rocSHMEM), see the design notes.

use std::ffi::OsStr;
use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use tessera_ir::interp::HostMemory;

use crate::Error;

const HELLO: u64 = 0x7465_7373_6865_6c6f; // "tesshelo"
const PROTOCOL: u64 = 2;
const FDS_PER_MSG: usize = 200;

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

fn os_err(what: &str, e: impl std::fmt::Display) -> String {
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

/// Where this process is in a launched world.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaunchEnv {
    /// `RANK`.
    pub rank: u32,
    /// `WORLD_SIZE`.
    pub size: u32,
    /// `LOCAL_RANK` (defaults to `RANK`): which GPU of the node this rank should use.
    pub local_rank: u32,
    /// The bootstrap socket (`@name`: abstract), `None` for a world of one.
    pub bootstrap: Option<String>,
    /// `TESSERA_BOOTSTRAP_SECRET`: what every rank must present to rank 0 to join
    /// (set by [`spawn_local`]; `None`: the user check alone).
    pub secret: Option<String>,
}

impl std::fmt::Debug for LaunchEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchEnv")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("local_rank", &self.local_rank)
            .field("bootstrap", &self.bootstrap)
            .field("secret", &self.secret.as_ref().map(|_| "(hidden)"))
            .finish()
    }
}

/// The variable holding the bootstrap secret (see [`LaunchEnv::secret`]).
pub const SECRET_VAR: &str = "TESSERA_BOOTSTRAP_SECRET";
/// The longest secret accepted.
const MAX_SECRET_BYTES: usize = 1024;
/// How long rank 0 gives one connection to present itself.
const CONN_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections rank 0 checks at once; more are closed at once.
const MAX_PENDING: usize = 64;

/// A launch variable: set and not blank.
fn env_var(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

/// The per-user folder of default bootstrap sockets: `$XDG_RUNTIME_DIR/tessera`
/// (systemd's private per-user folder) when set, else `/tmp/tessera-<uid>`.
///
/// `$XDG_RUNTIME_DIR` counts only when it is an existing private (`0700`) folder of
/// this user's: under `su`, `sudo -E`, a batch system or a container it may be unset,
/// missing or another user's. Every rank of a job sees the same environment and
/// folders, so every rank makes the same choice.
fn runtime_dir(get: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let private = |d: &str| {
        std::fs::symlink_metadata(d)
            .is_ok_and(|m| m.is_dir() && m.uid() == my_uid() && m.mode() & 0o077 == 0)
    };
    match get("XDG_RUNTIME_DIR").filter(|d| d.starts_with('/') && private(d)) {
        Some(d) => Path::new(&d).join("tessera"),
        None => PathBuf::from(format!("/tmp/tessera-{}", my_uid())),
    }
}

/// Creates the per-user socket folder `0700` if missing, and refuses one that is not
/// a plain folder of this user's that nobody else can enter.
fn ensure_private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    crate::secure_fs::create_private_dir(dir)
        .map_err(|e| format!("creating the bootstrap folder {}: {e}", dir.display()))?;
    let m = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("bootstrap folder {}: {e}", dir.display()))?;
    let me = my_uid();
    if !m.is_dir() || m.uid() != me || m.mode() & 0o077 != 0 {
        return Err(format!(
            "the bootstrap folder {} is not a private folder of this user's (uid {me}) but {} of uid {} with mode {:o}: another user may have planted it; remove it, or set XDG_RUNTIME_DIR or TESSERA_BOOTSTRAP",
            dir.display(),
            if m.is_dir() {
                "a folder"
            } else {
                "a link or file"
            },
            m.uid(),
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// A short stable tag for a string (FNV-1a): names a socket after a launcher's
/// variables whatever their length or characters.
fn tag(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl LaunchEnv {
    /// Reads the launch environment (see the module docs).
    pub fn from_env() -> Result<LaunchEnv, Error> {
        Self::from_vars(env_var)
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
                secret: None,
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
                "LOCAL_WORLD_SIZE={local} but WORLD_SIZE={size}: a world of the shared-memory transport lives on one node; across nodes, start the ranks with mpirun or srun and the MPI transport (feature `mpi`, TESSERA_TRANSPORT=mpi)"
            )));
        }
        let local_rank = num("LOCAL_RANK")?.unwrap_or(rank);
        let bootstrap = if size == 1 {
            None
        } else if let Some(p) = get("TESSERA_BOOTSTRAP") {
            Some(p)
        } else if let (Some(addr), Some(port)) = (get("MASTER_ADDR"), get("MASTER_PORT")) {
            let run = get("TORCHELASTIC_RUN_ID").unwrap_or_default();
            let file = format!(
                "torchrun-{:016x}.sock",
                tag(&format!("{addr}\n{port}\n{run}"))
            );
            Some(runtime_dir(&get).join(file).to_string_lossy().into_owned())
        } else {
            return Err(bad(format!(
                "RANK={rank} WORLD_SIZE={size} but no bootstrap socket: set TESSERA_BOOTSTRAP (a Unix socket path, or @name) or MASTER_ADDR and MASTER_PORT"
            )));
        };
        let secret = get(SECRET_VAR);
        if let Some(sec) = &secret
            && sec.len() > MAX_SECRET_BYTES
        {
            return Err(bad(format!(
                "{SECRET_VAR} has {} bytes, at most {MAX_SECRET_BYTES} are accepted",
                sec.len()
            )));
        }
        Ok(LaunchEnv {
            rank,
            size,
            local_rank,
            bootstrap,
            secret,
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
        match rustix::net::send(s, bytes, SendFlags::NOSIGNAL) {
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn write_u64s(s: &mut UnixStream, words: &[u64]) -> std::io::Result<()> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    send_all(s, &bytes)
}

/// Sends descriptors, [`FDS_PER_MSG`] per one-byte message.
fn send_fds(s: &UnixStream, fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
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
fn recv_fds(s: &UnixStream, n: usize) -> std::io::Result<Vec<OwnedFd>> {
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

/// The world's configuration every rank must agree on.
pub(crate) type Config = [u64; CONFIG_WORDS];
const CONFIG_WORDS: usize = 4;

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
    let secret = env.secret.as_deref().unwrap_or("").as_bytes();
    if env.rank == 0 {
        bootstrap_root(env, name, &addr, config, mine, secret, deadline)
    } else {
        bootstrap_peer(env, name, &addr, config, mine, secret, deadline)
    }
}

fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// The user and process at the other end of a connected socket (`SO_PEERCRED`).
/// (`rustix::net::sockopt::socket_peercred` is not used: its `UCred` holds a
/// non-zero pid, and the kernel reports pid 0 for a peer outside this process's pid
/// namespace, e.g. a container.)
fn peer_cred(s: &UnixStream) -> std::io::Result<(u32, i32)> {
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

fn my_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Compares secrets in time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Reads exactly `buf.len()` bytes before `until` (each read gets what time is left,
/// so a peer that sends a byte at a time cannot stretch it).
fn read_until(s: &mut UnixStream, buf: &mut [u8], until: Instant) -> std::io::Result<()> {
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

fn read_words(s: &mut UnixStream, n: usize, until: Instant) -> std::io::Result<Vec<u64>> {
    let mut bytes = vec![0u8; n * 8];
    read_until(s, &mut bytes, until)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect())
}

/// The most bytes of a contribution's blob (an IPC handle is 64 to 128 bytes).
const MAX_BLOB_BYTES: u64 = 1 << 20;

fn bootstrap_peer(
    env: &LaunchEnv,
    name: &str,
    addr: &SocketAddr,
    config: Config,
    mine: Contribution,
    secret: &[u8],
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
    // Nothing goes to a listener of another user (who could have taken the name
    // first): the heap descriptor would give them this rank's memory.
    let (uid, pid) = peer_cred(&s).map_err(io)?;
    if uid != my_uid() {
        return Err(format!(
            "the bootstrap socket {name:?} is held by a process of another user (uid {uid}, pid {pid}), not this job's rank 0: refusing to join through it"
        ));
    }
    // Rank 0 closes the connection of a rank it refuses (a reset when our hello was
    // still unread).
    let answer = |e: std::io::Error| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
        ) {
            format!(
                "rank 0 at {name:?} closed the connection without answering: it refused this rank (a {SECRET_VAR} that differs between the ranks, or the socket of another job) or it failed"
            )
        } else {
            io(e)
        }
    };
    s.set_write_timeout(Some(left(deadline))).map_err(io)?;
    let mut hello = vec![HELLO, PROTOCOL, secret.len() as u64];
    write_u64s(&mut s, &hello).map_err(answer)?;
    send_all(&s, secret).map_err(answer)?;
    hello = vec![
        u64::from(env.rank),
        std::process::id().into(),
        u64::from(mine.heap_fd.is_some()),
        mine.blob.len() as u64,
    ];
    hello.extend_from_slice(&config);
    write_u64s(&mut s, &hello).map_err(answer)?;
    send_all(&s, &mine.blob).map_err(answer)?;
    if let Some(fd) = &mine.heap_fd {
        send_fds(&s, &[fd.as_fd()]).map_err(answer)?;
    }
    // The answer: status, then (on success) every rank's contribution.
    let head = read_words(&mut s, 3, deadline).map_err(answer)?;
    if head[0] != HELLO {
        return Err(format!("{name:?} is not a Tessera bootstrap socket"));
    }
    if head[1] != 0 {
        let mut msg = vec![0u8; head[2].min(1 << 16) as usize];
        read_until(&mut s, &mut msg, deadline).map_err(io)?;
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
        let w = read_words(&mut s, 2, deadline).map_err(io)?;
        if w[1] > MAX_BLOB_BYTES {
            return Err(format!("rank 0 sent a contribution of {} bytes", w[1]));
        }
        let mut blob = vec![0u8; w[1] as usize];
        read_until(&mut s, &mut blob, deadline).map_err(io)?;
        with_fd.push(w[0] == 1);
        all.push(Contribution {
            heap_fd: None,
            blob,
        });
    }
    s.set_read_timeout(Some(left(deadline))).map_err(io)?;
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
    secret: &[u8],
    deadline: Instant,
) -> Result<Joined, String> {
    if !name.starts_with('@') {
        let path = Path::new(name);
        // The default folder is made private (and checked) before anything is in it.
        let dir = runtime_dir(&env_var);
        if path.parent() == Some(dir.as_path()) {
            ensure_private_dir(&dir)?;
        }
        // A socket file left by an earlier job is removed; one that a live job
        // listens on is not taken over.
        match UnixStream::connect_addr(addr) {
            Ok(_) => {
                return Err(format!(
                    "the bootstrap socket {name:?} is in use by another job: give this one its own (TESSERA_BOOTSTRAP, or another MASTER_PORT or TORCHELASTIC_RUN_ID)"
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                let _ = std::fs::remove_file(path);
            }
            Err(_) => {}
        }
    }
    let listener = UnixListener::bind_addr(addr)
        .map_err(|e| format!("rank 0 cannot listen on bootstrap socket {name:?}: {e}"))?;
    // The socket file this listener made (removed at the end only if it is still
    // that one, not a later job's).
    let made = socket_file_id(name);
    let result = accept_all(env, name, &listener, config, mine, secret, deadline);
    drop(listener);
    if made.is_some() && socket_file_id(name) == made {
        let _ = std::fs::remove_file(name);
    }
    result
}

/// Device and inode of a path socket's file (`None` for an abstract name).
fn socket_file_id(name: &str) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    if name.starts_with('@') {
        return None;
    }
    std::fs::symlink_metadata(name)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// A rank that presented itself to rank 0.
struct Arrival {
    stream: UnixStream,
    rank: usize,
    pid: u64,
    config: Config,
    contribution: Contribution,
}

/// Checks one connection (its user, then its secret, before anything is sent to it)
/// and reads its rank's hello, within [`CONN_TIMEOUT`]; `Err`: why it was dropped.
fn handshake(mut s: UnixStream, secret: &[u8], deadline: Instant) -> Result<Arrival, String> {
    let until = deadline.min(Instant::now() + CONN_TIMEOUT);
    let io = |e: std::io::Error| e.to_string();
    s.set_nonblocking(false).map_err(io)?;
    s.set_write_timeout(Some(left(until))).map_err(io)?;
    let (uid, pid) = peer_cred(&s).map_err(io)?;
    let who = format!("pid {pid} (uid {uid})");
    if uid != my_uid() {
        return Err(format!("{who}: another user's process"));
    }
    let io = |e: std::io::Error| format!("{who}: {e}");
    let h = read_words(&mut s, 3, until).map_err(io)?;
    if h[0] != HELLO || h[1] != PROTOCOL {
        return Err(format!(
            "{who}: not a Tessera rank of this version (bootstrap protocol {PROTOCOL})"
        ));
    }
    if h[2] > MAX_SECRET_BYTES as u64 {
        return Err(format!("{who}: a secret of {} bytes", h[2]));
    }
    let mut theirs = vec![0u8; h[2] as usize];
    read_until(&mut s, &mut theirs, until).map_err(io)?;
    if !same_secret(&theirs, secret) {
        return Err(format!("{who}: a wrong {SECRET_VAR}"));
    }
    let h = read_words(&mut s, 4 + CONFIG_WORDS, until).map_err(io)?;
    let (rank, pid, has_fd, blob_len) = (h[0], h[1], h[2] == 1, h[3]);
    if blob_len > MAX_BLOB_BYTES {
        return Err(format!("{who}: a contribution of {blob_len} bytes"));
    }
    let mut blob = vec![0u8; blob_len as usize];
    read_until(&mut s, &mut blob, until).map_err(io)?;
    s.set_read_timeout(Some(left(until))).map_err(io)?;
    let heap_fd = if has_fd {
        recv_fds(&s, 1).map_err(io)?.pop()
    } else {
        None
    };
    let mut config = [0; CONFIG_WORDS];
    config.copy_from_slice(&h[4..]);
    Ok(Arrival {
        stream: s,
        rank: usize::try_from(rank).unwrap_or(usize::MAX),
        pid,
        config,
        contribution: Contribution { heap_fd, blob },
    })
}

fn accept_all(
    env: &LaunchEnv,
    name: &str,
    listener: &UnixListener,
    config: Config,
    mine: Contribution,
    secret: &[u8],
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
    // Every connection is checked on a thread of its own, so a slow or silent one
    // holds up nobody; `checking` keeps a handle on each to close it if the world
    // forms without it.
    let (tx, rx) = std::sync::mpsc::channel::<(u64, Result<Arrival, String>)>();
    let mut checking: std::collections::HashMap<u64, UnixStream> = Default::default();
    let mut next_id = 0u64;
    let mut dropped: Vec<String> = Vec::new();
    let secret: Arc<[u8]> = Arc::from(secret);
    let me = my_uid();
    // Why connections were dropped (distinct reasons, a bounded list).
    fn note(dropped: &mut Vec<String>, why: String) {
        if dropped.len() < 64 && !dropped.contains(&why) {
            dropped.push(why);
        }
    }
    while joined < size {
        let mut busy = false;
        // At capacity, connections wait in the listen backlog (not closed: a real
        // rank among them is checked once a slot frees).
        let accepted = if checking.len() < MAX_PENDING {
            listener.accept()
        } else {
            Err(std::io::ErrorKind::WouldBlock.into())
        };
        match accepted {
            Ok((s, _)) => {
                busy = true;
                // Another user's connection is dropped here, before it costs a thread.
                match peer_cred(&s) {
                    Ok((uid, _)) if uid == me => {}
                    Ok((uid, pid)) => {
                        note(
                            &mut dropped,
                            format!(
                                "pid {pid} (uid {uid}): another user's process, refused on connecting"
                            ),
                        );
                        continue;
                    }
                    Err(e) => {
                        note(
                            &mut dropped,
                            format!("a connection without credentials: {e}"),
                        );
                        continue;
                    }
                }
                let id = next_id;
                next_id += 1;
                let spawned = s.try_clone().ok().and_then(|handle| {
                    let (tx, secret) = (tx.clone(), secret.clone());
                    std::thread::Builder::new()
                        .name("tessera-bootstrap".into())
                        .spawn(move || {
                            let _ = tx.send((id, handshake(s, &secret, deadline)));
                        })
                        .ok()
                        .map(|_| handle)
                });
                match spawned {
                    Some(handle) => {
                        checking.insert(id, handle);
                    }
                    None => note(&mut dropped, "a connection no thread could check".into()),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            // Anything else (EINTR, ECONNABORTED, EMFILE, ENOBUFS, ...) may pass:
            // retry until the deadline, which reports it.
            Err(e) => note(&mut dropped, format!("accepting failed: {e}")),
        }
        while let Ok((id, outcome)) = rx.try_recv() {
            busy = true;
            checking.remove(&id);
            let a = match outcome {
                Ok(a) => a,
                Err(why) => {
                    note(&mut dropped, why);
                    continue;
                }
            };
            let (rank, pid) = (a.rank, a.pid);
            let why = if rank >= size {
                Some(format!(
                    "rank {rank} (pid {pid}) is outside a world of {size}"
                ))
            } else if slots[rank].is_some() {
                Some(format!(
                    "two processes claim rank {rank} (the second: pid {pid})"
                ))
            } else if a.config != config {
                Some(format!(
                    "rank {rank} (pid {pid}) has another configuration than rank 0 (world size, heap bytes, signal bytes, kind: {:?} vs {config:?}); every rank must build the same World",
                    a.config
                ))
            } else {
                None
            };
            match why {
                Some(w) => {
                    problem.get_or_insert(w);
                    refused.push(a.stream);
                }
                None => slots[rank] = Some((a.contribution, Some(a.stream))),
            }
            joined += 1;
            if joined == size {
                break;
            }
        }
        if joined < size && Instant::now() >= deadline {
            let missing: Vec<String> = (0..size)
                .filter(|&r| slots[r].is_none())
                .map(|r| r.to_string())
                .collect();
            let also = if dropped.is_empty() {
                String::new()
            } else {
                format!(
                    "; connections dropped: {}",
                    dropped
                        .iter()
                        .take(8)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            };
            // The ranks that joined hear why (they would otherwise see a closed
            // connection).
            problem = Some(format!(
                "bootstrap timed out: rank(s) {} never joined through {name:?}{also}",
                missing.join(", ")
            ));
            break;
        }
        if !busy {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // Connections still being checked are not part of this world.
    for s in checking.values() {
        let _ = s.shutdown(std::net::Shutdown::Both);
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
    match rustix::io::pwrite(&team_fd, &magic, 0) {
        Ok(8) => {}
        Ok(n) => {
            return Err(format!(
                "initializing the team segment: wrote {n} of 8 bytes"
            ));
        }
        Err(e) => return Err(os_err("initializing the team segment", e)),
    }
    let mut fds = vec![team_fd.as_fd()];
    fds.extend(
        all.iter()
            .filter_map(|c| c.heap_fd.as_ref().map(|f| f.as_fd())),
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

static SPAWNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Runs `program` with `args` as `n` ranks of one world, the way `torchrun
/// --nproc-per-node n` would: each process gets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`,
/// `LOCAL_WORLD_SIZE`, a fresh `TESSERA_BOOTSTRAP` (a socket in the per-user private
/// folder) and a fresh random `TESSERA_BOOTSTRAP_SECRET`, and the rest of this
/// process's environment. Waits for all of them and returns their
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
    let dir = runtime_dir(&env_var);
    ensure_private_dir(&dir).map_err(err)?;
    let name = dir
        .join(format!(
            "spawn-{}-{}.sock",
            std::process::id(),
            SPAWNS.fetch_add(1, Ordering::Relaxed)
        ))
        .to_string_lossy()
        .into_owned();
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| err(format!("no random secret: {e}")))?;
    let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut children = Vec::with_capacity(n);
    for r in 0..n {
        let mut cmd = command(r);
        let child = cmd
            .env("RANK", r.to_string())
            .env("LOCAL_RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_WORLD_SIZE", n.to_string())
            .env("TESSERA_BOOTSTRAP", &name)
            .env(SECRET_VAR, &secret)
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
        let sock = e.bootstrap.clone().unwrap();
        assert_eq!(
            e,
            LaunchEnv {
                rank: 2,
                size: 4,
                local_rank: 2,
                bootstrap: Some(sock.clone()),
                secret: None,
            }
        );
        // A path socket in the per-user folder, named after the launcher's variables.
        let none = |_: &str| None;
        assert!(
            Path::new(&sock).parent() == Some(runtime_dir(&none).as_path())
                && sock.ends_with(".sock")
                && sock.len() < 100,
            "{sock}"
        );
        let other = env(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29501"),
        ])
        .unwrap();
        assert_ne!(other.bootstrap, e.bootstrap);
        // $XDG_RUNTIME_DIR when it is a private folder of this user's, else /tmp.
        let private = tempfile::tempdir().unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::Permissions::from_mode(0o700);
            std::fs::set_permissions(private.path(), mode).unwrap();
        }
        let xdg_dir = private.path().to_str().unwrap().to_string();
        let with_xdg = |dir: &str| {
            env(&[
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "h"),
                ("MASTER_PORT", "1"),
                ("XDG_RUNTIME_DIR", dir),
                (SECRET_VAR, "s3cret"),
            ])
            .unwrap()
        };
        let xdg = with_xdg(&xdg_dir);
        assert!(
            xdg.bootstrap
                .as_deref()
                .unwrap()
                .starts_with(&format!("{xdg_dir}/tessera/torchrun-")),
            "{xdg:?}"
        );
        let fallback = format!("/tmp/tessera-{}/torchrun-", my_uid());
        for bad in ["/nonexistent/run/user/7", "/tmp"] {
            let e = with_xdg(bad);
            assert!(
                e.bootstrap.as_deref().unwrap().starts_with(&fallback),
                "{e:?}"
            );
        }
        assert_eq!(xdg.secret.as_deref(), Some("s3cret"));
        assert!(!format!("{xdg:?}").contains("s3cret"));
        let long = "x".repeat(MAX_SECRET_BYTES + 1);
        let e = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("TESSERA_BOOTSTRAP", "@x"),
            (SECRET_VAR, &long),
        ])
        .unwrap_err();
        assert!(e.to_string().contains(SECRET_VAR), "{e}");
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

    #[test]
    fn the_socket_folder_is_private_and_a_planted_one_refused() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("tessera");
        ensure_private_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let e = ensure_private_dir(&dir).unwrap_err();
        assert!(e.contains("not a private folder"), "{e}");
        let link = root.path().join("link");
        std::os::unix::fs::symlink(root.path(), &link).unwrap();
        assert!(ensure_private_dir(&link).is_err());
    }

    static NAMES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

    /// A fresh abstract socket name (abstract: any user can reach it, so the user
    /// check itself is tested, not the folder's permissions).
    fn fresh_name() -> String {
        format!(
            "@tessera-test-{}-{}",
            std::process::id(),
            NAMES.fetch_add(1, Ordering::Relaxed)
        )
    }

    fn rank_env(rank: u32, name: &str, secret: &str) -> LaunchEnv {
        LaunchEnv {
            rank,
            size: 2,
            local_rank: rank,
            bootstrap: Some(name.into()),
            secret: Some(secret.into()),
        }
    }

    const CONFIG: Config = [2, 8192, 0, 0];

    fn contribution() -> Contribution {
        Contribution {
            heap_fd: Some(memfd("heap", 8192).unwrap()),
            blob: vec![7; 5],
        }
    }

    /// Rank 0 of a world of two on `name`, bootstrapping on a thread of its own.
    fn start_rank0(
        name: &str,
        secret: &str,
        timeout: Duration,
    ) -> std::thread::JoinHandle<Result<Joined, String>> {
        let e = rank_env(0, name, secret);
        std::thread::spawn(move || bootstrap(&e, CONFIG, contribution(), timeout))
    }

    /// Rank 1 joins the world on `name` (with the right secret), which must succeed.
    fn join_rank1(name: &str, timeout: Duration) -> Joined {
        bootstrap(&rank_env(1, name, "right"), CONFIG, contribution(), timeout)
            .unwrap_or_else(|e| panic!("rank 1 could not join: {e}"))
    }

    /// Connects to `name` as soon as rank 0 listens.
    fn connect(name: &str) -> UnixStream {
        let addr = socket_addr(name).unwrap();
        let start = Instant::now();
        loop {
            match UnixStream::connect_addr(&addr) {
                Ok(s) => return s,
                Err(e) if start.elapsed() > Duration::from_secs(20) => panic!("{e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }

    /// The bytes a rank 1 (without a heap) sends: hello, secret, rank and config.
    fn hello_bytes(secret: &[u8]) -> Vec<u8> {
        let mut words = vec![HELLO, PROTOCOL, secret.len() as u64];
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend_from_slice(secret);
        words = vec![1, 4242, 0, 0];
        words.extend_from_slice(&CONFIG);
        bytes.extend(words.iter().flat_map(|w| w.to_le_bytes()));
        bytes
    }

    #[test]
    fn wrong_secrets_and_silent_connections_are_dropped_while_the_world_forms() {
        let name = fresh_name();
        let start = Instant::now();
        let timeout = Duration::from_secs(60);
        let root = start_rank0(&name, "right", timeout);
        // A connection that never says anything, one with a wrong secret that claims
        // rank 1, and one that sends garbage.
        let mut silent = connect(&name);
        let mut wrong = connect(&name);
        send_all(&wrong, &hello_bytes(b"wrong")).unwrap();
        // And one that sends garbage.
        let mut garbage = connect(&name);
        let noise: Vec<u8> = (0..200u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        send_all(&garbage, &noise).unwrap();
        let peer = {
            let e = rank_env(1, &name, "right");
            std::thread::spawn(move || bootstrap(&e, CONFIG, contribution(), timeout))
        };
        let j0 = root.join().unwrap().unwrap();
        let j1 = peer.join().unwrap().unwrap();
        // The world formed without waiting for the silent connection to time out.
        assert!(start.elapsed() < CONN_TIMEOUT, "{:?}", start.elapsed());
        assert_eq!(j0.peers.len(), 1);
        assert_eq!(j0.all[1].blob, vec![7; 5]);
        assert_eq!(j1.all[0].blob, vec![7; 5]);
        assert!(j1.all.iter().all(|c| c.heap_fd.is_some()));
        // No intruder got a byte: their connections were closed.
        for s in [&mut silent, &mut wrong, &mut garbage] {
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut b = [0u8; 8];
            match s.read(&mut b) {
                Ok(0) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                other => panic!("an intruder got {other:?}"),
            }
        }
    }

    #[test]
    fn a_rank_with_a_wrong_secret_is_refused() {
        let name = fresh_name();
        let timeout = Duration::from_secs(3);
        let root = start_rank0(&name, "right", timeout);
        let e = bootstrap(
            &rank_env(1, &name, "wrong"),
            CONFIG,
            contribution(),
            timeout,
        )
        .err()
        .unwrap();
        assert!(e.contains(SECRET_VAR), "{e}");
        let e = root.join().unwrap().err().unwrap();
        assert!(
            e.contains("rank(s) 1 never joined") && e.contains("wrong"),
            "{e}"
        );
    }

    /// Forks a child that switches to user `nobody` and runs `child` (which may make
    /// only async-signal-safe calls: raw system calls on prepared buffers), then
    /// exits with what it returns. `None` when this process cannot switch users.
    fn as_nobody(child: impl FnOnce() -> i32) -> Option<libc::pid_t> {
        if my_uid() != 0 {
            eprintln!("skipped: switching to another user needs root (CI runs as root)");
            return None;
        }
        // SAFETY: the child makes only async-signal-safe calls (setgid, setuid, the
        // socket calls of `child`, _exit) on memory prepared before the fork.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let code = if libc::setgid(65534) == 0 && libc::setuid(65534) == 0 {
                    child()
                } else {
                    100
                };
                libc::_exit(code);
            }
            Some(pid)
        }
    }

    fn wait_child(pid: libc::pid_t) -> i32 {
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            -1
        }
    }

    /// `sockaddr_un` for an abstract name (`@` dropped).
    fn raw_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
        // SAFETY: a zeroed `sockaddr_un` is valid.
        let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        a.sun_family = libc::AF_UNIX as libc::sa_family_t;
        let bytes = name.strip_prefix('@').unwrap().as_bytes();
        for (i, b) in bytes.iter().enumerate() {
            a.sun_path[1 + i] = *b as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sa_family_t>() + 1 + bytes.len();
        (a, len as libc::socklen_t)
    }

    #[test]
    fn another_user_cannot_join_even_with_the_secret() {
        let name = fresh_name();
        let timeout = Duration::from_secs(60);
        let root = start_rank0(&name, "right", timeout);
        drop(connect(&name)); // rank 0 listens (a closed connection is dropped)
        let (addr, len) = raw_addr(&name);
        let msg = hello_bytes(b"right");
        let Some(pid) = as_nobody(|| {
            // SAFETY: raw system calls on prepared buffers (see `as_nobody`).
            unsafe {
                let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let tv = libc::timeval {
                    tv_sec: 20,
                    tv_usec: 0,
                };
                libc::setsockopt(
                    s,
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&raw const tv).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                );
                if libc::connect(s, (&raw const addr).cast(), len) != 0 {
                    return 2;
                }
                libc::write(s, msg.as_ptr().cast(), msg.len());
                let mut b = [0u8; 8];
                match libc::read(s, b.as_mut_ptr().cast(), 8) {
                    // Refused: closed without a word (a reset: our hello unread).
                    0 => 0,
                    n if n < 0 && *libc::__errno_location() == libc::ECONNRESET => 0,
                    // Answered as rank 1.
                    n if n > 0 => 1,
                    _ => 3,
                }
            }
        }) else {
            // Not root: let rank 0 time out quietly.
            let _ = bootstrap(
                &rank_env(1, &name, "right"),
                CONFIG,
                contribution(),
                timeout,
            );
            let _ = root.join();
            return;
        };
        assert_eq!(
            wait_child(pid),
            0,
            "the other user's connection was not refused"
        );
        // The world still forms with the real rank 1.
        join_rank1(&name, timeout);
        assert!(root.join().unwrap().is_ok());
    }

    /// Connects to abstract socket `name` as user `nobody` and sends a whole hello
    /// with secret `right` (rank 1's), then waits for the socket to close; `None`
    /// when this process cannot switch users.
    fn nobody_says_hello(name: &str) -> Option<libc::pid_t> {
        let (addr, len) = raw_addr(name);
        let msg = hello_bytes(b"right");
        as_nobody(|| {
            // SAFETY: raw system calls on prepared buffers (see `as_nobody`).
            unsafe {
                let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                let tv = libc::timeval {
                    tv_sec: 20,
                    tv_usec: 0,
                };
                libc::setsockopt(
                    s,
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&raw const tv).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                );
                if libc::connect(s, (&raw const addr).cast(), len) != 0 {
                    return 2;
                }
                libc::write(s, msg.as_ptr().cast(), msg.len());
                let mut b = [0u8; 8];
                libc::read(s, b.as_mut_ptr().cast(), 8);
                0
            }
        })
    }

    /// The handshake's own check (each connection's thread), with the accepting
    /// loop's first check out of the way: another user's hello, right secret and
    /// all, is refused.
    #[test]
    fn the_handshake_refuses_another_users_process() {
        let name = fresh_name();
        let listener = UnixListener::bind_addr(&socket_addr(&name).unwrap()).unwrap();
        let Some(pid) = nobody_says_hello(&name) else {
            return;
        };
        let (s, _) = listener.accept().unwrap();
        let got = handshake(s, b"right", Instant::now() + Duration::from_secs(5));
        // SAFETY: kills and reaps our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        wait_child(pid);
        match got {
            Ok(a) => panic!("another user's process joined as rank {}", a.rank),
            Err(e) => assert!(
                e.contains("(uid 65534): another user's process") && !e.contains("connecting"),
                "{e}"
            ),
        }
    }

    /// The accepting loop's check: another user's connection is dropped before it
    /// gets a handshake thread, and rank 0's error says so.
    #[test]
    fn another_users_connection_is_refused_on_connecting() {
        let name = fresh_name();
        let root = start_rank0(&name, "right", Duration::from_secs(3));
        drop(connect(&name)); // rank 0 listens (a closed connection is dropped)
        let Some(pid) = nobody_says_hello(&name) else {
            let _ = root.join();
            return;
        };
        let e = root.join().unwrap().err().expect("no rank 1 joined");
        // SAFETY: kills and reaps our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        wait_child(pid);
        assert!(
            e.contains("rank(s) 1 never joined")
                && e.contains("(uid 65534): another user's process, refused on connecting"),
            "{e}"
        );
    }

    #[test]
    fn a_rank_does_not_join_through_another_users_socket() {
        let name = fresh_name();
        let (addr, len) = raw_addr(&name);
        let mut ready = [0 as libc::c_int; 2];
        // SAFETY: a pipe into a two-element array.
        assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
        let Some(pid) = as_nobody(|| {
            // SAFETY: raw system calls on prepared buffers (see `as_nobody`).
            unsafe {
                let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                if libc::bind(s, (&raw const addr).cast(), len) != 0 || libc::listen(s, 8) != 0 {
                    return 2;
                }
                libc::write(ready[1], b"r".as_ptr().cast(), 1);
                // Squat until killed.
                loop {
                    libc::pause();
                }
            }
        }) else {
            return;
        };
        let mut b = [0u8];
        // SAFETY: reads one byte from our pipe.
        unsafe { libc::read(ready[0], b.as_mut_ptr().cast(), 1) };
        let e = bootstrap(
            &rank_env(1, &name, "right"),
            CONFIG,
            contribution(),
            Duration::from_secs(10),
        )
        .err();
        // SAFETY: kills and reaps our own child; closes our pipe.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::close(ready[0]);
            libc::close(ready[1]);
        }
        wait_child(pid);
        let e = e.expect("joined through a squatter's socket");
        assert!(e.contains("another user (uid 65534"), "{e}");
    }

    #[test]
    fn a_live_socket_is_not_taken_over_and_its_file_is_cleaned_up() {
        let dir = tempfile::tempdir().unwrap();
        let name = dir.path().join("boot.sock").to_str().unwrap().to_string();
        let timeout = Duration::from_secs(60);
        let first = start_rank0(&name, "right", timeout);
        drop(connect(&name)); // the first job listens
        let e = bootstrap(
            &rank_env(0, &name, "right"),
            CONFIG,
            contribution(),
            timeout,
        )
        .err()
        .expect("a second rank 0 took over a live socket");
        assert!(e.contains("in use by another job"), "{e}");
        join_rank1(&name, timeout);
        assert!(first.join().unwrap().is_ok());
        assert!(
            !Path::new(&name).exists(),
            "the socket file was left behind"
        );
        // A stale file (no listener) is replaced.
        let stale = std::os::unix::net::UnixListener::bind(&name).unwrap();
        drop(stale);
        let again = start_rank0(&name, "right", timeout);
        join_rank1(&name, timeout);
        assert!(again.join().unwrap().is_ok());
    }

    #[test]
    fn a_rank_joins_behind_more_silent_connections_than_are_checked_at_once() {
        let name = fresh_name();
        let timeout = Duration::from_secs(60);
        let root = start_rank0(&name, "right", timeout);
        let silent: Vec<UnixStream> = (0..MAX_PENDING + 6).map(|_| connect(&name)).collect();
        let start = Instant::now();
        join_rank1(&name, timeout);
        assert!(root.join().unwrap().is_ok());
        // It waited in the backlog for checked connections to time out, no longer.
        assert!(start.elapsed() < timeout / 2, "{:?}", start.elapsed());
        drop(silent);
    }
}
