//! The bootstrap of a world of processes (see the [`procs`](super) docs,
//! **Bootstrap.**): rank 0 listens on the bootstrap socket and checks every
//! connection (its user, then the secret) on a thread of its own; every other rank
//! connects, checks that the listener is a process of its own user, and sends its
//! configuration and contribution (a heap's `memfd`, or an IPC handle); rank 0 answers
//! each with the team segment and every rank's contribution.
//!
//! Contract: [`bootstrap`] returns, on every rank, the same team segment, every rank's
//! contribution by rank and the open connections (rank 0 to every other rank, the
//! others to rank 0), or an error on every rank that joined: nothing is sent to a
//! process of another user or one without the secret, a silent or slow connection
//! holds up nobody, ranks configured differently are refused with a reason, and the
//! whole exchange is bounded by the caller's timeout.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::env::{
    LaunchEnv, MAX_SECRET_BYTES, SECRET_VAR, ensure_private_dir, env_var, my_uid, runtime_dir,
};
use super::segment::{memfd, os_err};
use super::socket::{
    left, peer_cred, read_until, read_words, recv_fds, send_all, send_fds, socket_addr, write_u64s,
};
use crate::world::team::{MAGIC, TEAM_BYTES};

const HELLO: u64 = 0x7465_7373_6865_6c6f; // "tesshelo"
const PROTOCOL: u64 = 2;
/// How long rank 0 gives one connection to present itself.
const CONN_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections rank 0 checks at once; more are closed at once.
const MAX_PENDING: usize = 64;

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

/// Compares secrets in time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
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
    let team_fd = memfd("tessera-team", TEAM_BYTES)?;
    // Stamp it before anyone maps it.
    let magic = MAGIC.to_ne_bytes();
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

#[cfg(test)]
mod tests {
    use super::*;

    use std::io::Read;
    use std::sync::atomic::Ordering;

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
