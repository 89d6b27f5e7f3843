//! A TCP rendezvous: the ranks of a job, on any number of nodes, exchange small
//! byte strings through rank 0 at `MASTER_ADDR:MASTER_PORT` (as `torchrun` sets
//! them), authenticated by the job's secret.
//!
//! This is what a world spanning nodes needs before any engine runs: which ranks
//! share a node (so those reach each other through memory), and an engine's own
//! bootstrap token (NVSHMEM's unique id, which rank 0 creates and every rank needs
//! before `nvshmemx_init_attr`). [`exchange`] is an all-gather: every rank gives
//! bytes and gets every rank's, in rank order.
//!
//! **Protocol** (every integer little-endian, every byte string length-prefixed by
//! a `u32`, at most [`MAX_PAYLOAD`] bytes). Rank 0 listens; every other rank connects
//! (retrying until the timeout):
//!
//! 1. rank 0 sends a magic and a fresh 32-byte nonce `n0`;
//! 2. the rank sends the magic, its rank, the world size, a fresh nonce `n1` and
//!    `HMAC-SHA256(secret, "client" | n0 | n1 | rank | size)`;
//! 3. rank 0 checks the MAC (constant time) and closes the connection without a word
//!    when it is wrong, then accepting goes on; it refuses (with a reason) a rank
//!    outside the world, a second connection for one rank, or another world size;
//!    else it answers `HMAC-SHA256(secret, "server" | n1 | n0 | rank)`, which the rank
//!    checks, so neither side gives its payload to a party without the secret;
//! 4. the rank sends its payload; once every rank has, rank 0 sends each of them all
//!    the payloads (their number, then each); if the world does not form in time,
//!    it sends the ranks that joined `u32::MAX` and its reason instead, so every rank
//!    fails with the same cause.
//!
//! Each connection's handshake has its own deadline (a silent connection cannot stall
//! the others), and the whole exchange is bounded by the caller's timeout: a rank
//! that never comes makes every rank fail with an error naming the missing ranks (on
//! rank 0) or the unreachable address (on the others). Payloads travel in the clear
//! (they are tokens and host names, not data): the MACs keep out parties without the
//! secret, on a network where they can connect but not listen.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::Error;

const MAGIC: &[u8; 8] = b"tessrdv1";

/// How long past its own deadline a rank waits for rank 0's answer.
const ANSWER_GRACE: Duration = Duration::from_secs(2);

/// In place of the number of payloads: rank 0 failed, and a reason follows.
const FAILED: u32 = u32::MAX;

/// The largest payload a rank may contribute.
pub const MAX_PAYLOAD: usize = 1 << 20;

/// How long one connection's handshake may take before rank 0 drops it.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

type HmacSha256 = Hmac<Sha256>;

fn err(rank: u32, message: String) -> Error {
    Error::Comm { rank, message }
}

fn mac(secret: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC takes keys of any length.
    let mut m = <HmacSha256 as Mac>::new_from_slice(secret).expect("HMAC accepts any key length");
    for p in parts {
        m.update(p);
    }
    m
}

fn nonce() -> Result<[u8; 32], String> {
    let mut n = [0u8; 32];
    getrandom::fill(&mut n).map_err(|e| format!("no random nonce: {e}"))?;
    Ok(n)
}

/// Fills `buf` from `s` by `deadline`: each read waits only for what is left of it,
/// so a peer that drips a byte at a time cannot stretch the wait (a socket timeout
/// set once bounds each `read`, not the whole).
fn read_exact(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `buf` to `s` by `deadline` (a peer that does not read cannot hold us).
fn write_all(s: &mut TcpStream, buf: &[u8], deadline: Instant) -> std::io::Result<()> {
    let mut sent = 0;
    while sent < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        s.set_write_timeout(Some(left))?;
        match s.write(&buf[sent..]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn read_u32(s: &mut TcpStream, deadline: Instant) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    read_exact(s, &mut b, deadline)?;
    Ok(u32::from_le_bytes(b))
}

fn read_bytes(s: &mut TcpStream, deadline: Instant) -> std::io::Result<Vec<u8>> {
    let n = read_u32(s, deadline)? as usize;
    if n > MAX_PAYLOAD {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a payload of {n} bytes (at most {MAX_PAYLOAD})"),
        ));
    }
    let mut v = vec![0u8; n];
    read_exact(s, &mut v, deadline)?;
    Ok(v)
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// Rank 0's side: a bound listener ([`Server::bind`]) that serves one exchange.
pub struct Server {
    listener: TcpListener,
}

impl Server {
    /// Binds `addr` (`host:port`; port 0 picks a free one, see [`Server::port`]).
    pub fn bind(addr: &str) -> Result<Server, Error> {
        let listener = TcpListener::bind(addr).map_err(|e| {
            err(
                0,
                format!(
                    "the rendezvous cannot listen on {addr}: {e} (another job on that MASTER_PORT?)"
                ),
            )
        })?;
        Ok(Server { listener })
    }

    /// The port it listens on.
    pub fn port(&self) -> Result<u16, Error> {
        self.listener
            .local_addr()
            .map(|a| a.port())
            .map_err(|e| err(0, format!("the rendezvous's address: {e}")))
    }

    /// Serves the exchange of a world of `size` ranks, contributing `payload` as rank
    /// 0: every rank's payload, in rank order, once all have come; an error naming
    /// the missing ranks after `timeout`.
    pub fn serve(
        self,
        size: u32,
        secret: &[u8],
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, Error> {
        if payload.len() > MAX_PAYLOAD {
            return Err(err(
                0,
                format!(
                    "a payload of {} bytes (at most {MAX_PAYLOAD})",
                    payload.len()
                ),
            ));
        }
        let deadline = Instant::now() + timeout;
        let mut slots: Vec<Option<(TcpStream, Vec<u8>)>> = (0..size).map(|_| None).collect();
        let mut have = 1;
        let (tx, rx) = mpsc::channel::<(u32, TcpStream, Vec<u8>)>();
        self.listener
            .set_nonblocking(true)
            .map_err(|e| err(0, format!("the rendezvous listener: {e}")))?;
        let secret: std::sync::Arc<[u8]> = secret.into();
        // Each connection is checked on a thread of its own, with its own deadline,
        // while accepting goes on; the world forms as soon as its ranks have joined,
        // without waiting for those threads (a slow stranger's ends by its deadline,
        // and what it finds then goes nowhere).
        while have < size {
            while let Ok((r, s, p)) = rx.try_recv() {
                if slots[r as usize].is_none() {
                    slots[r as usize] = Some((s, p));
                    have += 1;
                }
            }
            if have >= size {
                break;
            }
            if Instant::now() >= deadline {
                let missing: Vec<String> = (1..size)
                    .filter(|&r| slots[r as usize].is_none())
                    .map(|r| r.to_string())
                    .collect();
                let why = format!(
                    "the rendezvous timed out after {timeout:?}: rank(s) {} never joined",
                    missing.join(", ")
                );
                // The ranks that joined hear the same cause (not a closed connection).
                let mut out = FAILED.to_le_bytes().to_vec();
                put_bytes(&mut out, why.as_bytes());
                for (stream, _) in slots.iter_mut().flatten() {
                    let _ = write_all(stream, &out, Instant::now() + Duration::from_secs(1));
                }
                return Err(err(0, why));
            }
            match self.listener.accept() {
                Ok((s, _)) => {
                    let tx = tx.clone();
                    let secret = secret.clone();
                    let claimed: Vec<bool> = slots.iter().map(Option::is_some).collect();
                    let limit = (Instant::now() + HANDSHAKE_LIMIT).min(deadline);
                    std::thread::Builder::new()
                        .name("tessera-rendezvous".into())
                        .spawn(move || {
                            if let Ok(Some((r, s, p))) = admit(s, size, &secret, &claimed, limit) {
                                let _ = tx.send((r, s, p));
                            }
                        })
                        .map_err(|e| err(0, format!("the rendezvous's thread: {e}")))?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(err(0, format!("the rendezvous accept failed: {e}"))),
            }
        }
        let mut all = Vec::with_capacity(size as usize);
        all.push(payload.to_vec());
        for s in slots.iter().skip(1) {
            all.push(s.as_ref().map(|(_, p)| p.clone()).unwrap_or_default());
        }
        let mut reply = Vec::new();
        reply.extend_from_slice(&size.to_le_bytes());
        for p in &all {
            put_bytes(&mut reply, p);
        }
        for (r, s) in slots.iter_mut().enumerate().skip(1) {
            if let Some((stream, _)) = s {
                write_all(
                    stream,
                    &reply,
                    deadline.max(Instant::now() + HANDSHAKE_LIMIT),
                )
                .map_err(|e| err(0, format!("the rendezvous could not answer rank {r}: {e}")))?;
            }
        }
        Ok(all)
    }
}

/// One connection on rank 0: the handshake and the payload, or `None` (dropped).
fn admit(
    mut s: TcpStream,
    size: u32,
    secret: &[u8],
    claimed: &[bool],
    deadline: Instant,
) -> std::io::Result<Option<(u32, TcpStream, Vec<u8>)>> {
    s.set_nonblocking(false)?;
    let n0 = nonce().map_err(std::io::Error::other)?;
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&n0);
    write_all(&mut s, &hello, deadline)?;
    let mut m = [0u8; 8];
    read_exact(&mut s, &mut m, deadline)?;
    if &m != MAGIC {
        return Ok(None);
    }
    let rank = read_u32(&mut s, deadline)?;
    let their_size = read_u32(&mut s, deadline)?;
    let mut n1 = [0u8; 32];
    read_exact(&mut s, &mut n1, deadline)?;
    let mut tag = [0u8; 32];
    read_exact(&mut s, &mut tag, deadline)?;
    let check = mac(
        secret,
        &[
            b"client",
            &n0,
            &n1,
            &rank.to_le_bytes(),
            &their_size.to_le_bytes(),
        ],
    );
    if check.verify_slice(&tag).is_err() {
        // No word to a party without the secret.
        return Ok(None);
    }
    let refuse =
        |s: &mut TcpStream, why: String| -> std::io::Result<Option<(u32, TcpStream, Vec<u8>)>> {
            let mut out = vec![1u8];
            put_bytes(&mut out, why.as_bytes());
            write_all(s, &out, deadline)?;
            Ok(None)
        };
    if their_size != size {
        return refuse(
            &mut s,
            format!("rank 0 runs a world of {size} ranks, this rank one of {their_size}"),
        );
    }
    if rank == 0 || rank >= size {
        return refuse(
            &mut s,
            format!("rank {rank} is not a peer of rank 0 in a world of {size}"),
        );
    }
    if claimed[rank as usize] {
        return refuse(&mut s, format!("rank {rank} has already joined"));
    }
    let proof = mac(secret, &[b"server", &n1, &n0, &rank.to_le_bytes()])
        .finalize()
        .into_bytes();
    let mut out = vec![0u8];
    out.extend_from_slice(&proof);
    write_all(&mut s, &out, deadline)?;
    let payload = read_bytes(&mut s, deadline)?;
    Ok(Some((rank, s, payload)))
}

/// A rank other than 0: connects to rank 0 at `addr` (`host:port`), retrying until
/// `timeout`, and returns every rank's payload.
pub fn join(
    addr: &str,
    rank: u32,
    size: u32,
    secret: &[u8],
    payload: &[u8],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>, Error> {
    let e = |m: String| err(rank, m);
    if payload.len() > MAX_PAYLOAD {
        return Err(e(format!(
            "a payload of {} bytes (at most {MAX_PAYLOAD})",
            payload.len()
        )));
    }
    let deadline = Instant::now() + timeout;
    let targets: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|x| e(format!("the rendezvous address {addr}: {x}")))?
        .collect();
    let mut last = String::from("no address");
    let mut s = loop {
        let mut got = None;
        for t in &targets {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            match TcpStream::connect_timeout(t, left.min(Duration::from_secs(1))) {
                Ok(s) => {
                    got = Some(s);
                    break;
                }
                Err(x) => last = x.to_string(),
            }
        }
        if let Some(s) = got {
            break s;
        }
        if Instant::now() >= deadline {
            return Err(e(format!(
                "could not reach rank 0's rendezvous at {addr} within {timeout:?}: {last}"
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Rank 0 closes the connection of a rank whose MAC fails, without a word: that
    // (and only that) is what a closed connection right after our MAC means. A
    // connection that stays silent is rank 0 still waiting (for other ranks) or gone.
    let io = |x: std::io::Error| e(format!("the rendezvous at {addr} failed: {x}"));
    let io_after_mac = |x: std::io::Error| {
        use std::io::ErrorKind as K;
        e(match x.kind() {
            K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => {
                format!(
                    "rank 0's rendezvous at {addr} closed the connection after this rank's proof: a different TESSERA_BOOTSTRAP_SECRET on this rank or rank 0 ({x})"
                )
            }
            K::TimedOut | K::WouldBlock => format!(
                "rank 0's rendezvous at {addr} did not answer within {timeout:?} (rank 0 busy or stopped)"
            ),
            _ => format!("the rendezvous at {addr} failed: {x}"),
        })
    };
    let io_waiting = |x: std::io::Error| {
        use std::io::ErrorKind as K;
        e(match x.kind() {
            K::TimedOut | K::WouldBlock => format!(
                "rank 0's rendezvous at {addr} admitted this rank, but the world did not form within {timeout:?}: other ranks never joined (rank 0's error names them)"
            ),
            _ => format!("the rendezvous at {addr} failed while the world formed: {x}"),
        })
    };
    let _ = s.set_nodelay(true);
    let mut hello = [0u8; 40];
    read_exact(&mut s, &mut hello, deadline).map_err(io)?;
    if &hello[..8] != MAGIC {
        return Err(e(format!(
            "{addr} is not a Tessera rendezvous (another service on that port?)"
        )));
    }
    let n0 = &hello[8..];
    let n1 = nonce().map_err(e)?;
    let tag = mac(
        secret,
        &[b"client", n0, &n1, &rank.to_le_bytes(), &size.to_le_bytes()],
    )
    .finalize()
    .into_bytes();
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&rank.to_le_bytes());
    out.extend_from_slice(&size.to_le_bytes());
    out.extend_from_slice(&n1);
    out.extend_from_slice(&tag);
    write_all(&mut s, &out, deadline).map_err(io)?;
    let mut status = [0u8; 1];
    read_exact(&mut s, &mut status, deadline).map_err(io_after_mac)?;
    if status[0] != 0 {
        let why = read_bytes(&mut s, deadline).map_err(io)?;
        return Err(e(format!(
            "rank 0 refused this rank: {}",
            String::from_utf8_lossy(&why)
        )));
    }
    let mut proof = [0u8; 32];
    read_exact(&mut s, &mut proof, deadline).map_err(io_after_mac)?;
    if mac(secret, &[b"server", &n1, n0, &rank.to_le_bytes()])
        .verify_slice(&proof)
        .is_err()
    {
        return Err(e(format!(
            "the rendezvous at {addr} did not prove it knows this job's secret: not this job's rank 0"
        )));
    }
    let mut msg = Vec::new();
    put_bytes(&mut msg, payload);
    write_all(&mut s, &msg, deadline).map_err(io)?;
    // Rank 0 decides whether the world forms: its answer (the payloads, or why it
    // gave up at its own deadline) gets a grace period past ours, so both sides of
    // one timeout agree on its cause.
    let answer_by = deadline + ANSWER_GRACE;
    let n = read_u32(&mut s, answer_by).map_err(io_waiting)?;
    if n == FAILED {
        let why = read_bytes(&mut s, answer_by).map_err(io)?;
        return Err(e(format!(
            "rank 0's rendezvous at {addr} failed: {}",
            String::from_utf8_lossy(&why)
        )));
    }
    if n != size {
        return Err(e(format!(
            "the rendezvous answered {n} payloads for {size} ranks"
        )));
    }
    (0..n)
        .map(|_| read_bytes(&mut s, answer_by).map_err(io))
        .collect()
}

/// The whole exchange for rank `rank` of `size`: rank 0 binds `addr` and serves,
/// the others join it.
pub fn exchange(
    addr: &str,
    rank: u32,
    size: u32,
    secret: &[u8],
    payload: &[u8],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>, Error> {
    if size == 0 || rank >= size {
        return Err(err(rank, format!("rank {rank} of a world of {size}")));
    }
    if rank == 0 {
        if size == 1 {
            return Ok(vec![payload.to_vec()]);
        }
        Server::bind(addr)?.serve(size, secret, payload, timeout)
    } else {
        join(addr, rank, size, secret, payload, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(20);

    fn run(size: u32, secrets: &[&[u8]]) -> Vec<Result<Vec<Vec<u8>>, Error>> {
        let server = Server::bind("127.0.0.1:0").expect("bind");
        let addr = format!("127.0.0.1:{}", server.port().expect("port"));
        std::thread::scope(|s| {
            let hs: Vec<_> = (1..size)
                .map(|r| {
                    let addr = addr.clone();
                    let secret = secrets[r as usize];
                    s.spawn(move || {
                        let p = format!("payload of rank {r}").into_bytes();
                        join(&addr, r, size, secret, &p, Duration::from_secs(3))
                    })
                })
                .collect();
            let mine = server.serve(size, secrets[0], b"rank 0's", Duration::from_secs(3));
            let mut out = vec![mine];
            out.extend(hs.into_iter().map(|h| h.join().expect("no panic")));
            out
        })
    }

    #[test]
    fn every_rank_gets_every_payload_in_rank_order() {
        let out = run(4, &[b"s3cret".as_slice(); 4]);
        let want: Vec<Vec<u8>> = std::iter::once(b"rank 0's".to_vec())
            .chain((1..4).map(|r| format!("payload of rank {r}").into_bytes()))
            .collect();
        for (r, o) in out.into_iter().enumerate() {
            assert_eq!(o.expect("exchange"), want, "rank {r}");
        }
    }

    #[test]
    fn a_rank_without_the_secret_is_refused_and_rank_0_names_it() {
        let t0 = Instant::now();
        let out = run(3, &[b"right".as_slice(), b"right", b"wrong"]);
        assert!(t0.elapsed() < T);
        let e0 = out[0].as_ref().expect_err("rank 2 never joins").to_string();
        assert!(e0.contains("rank(s) 2 never joined"), "{e0}");
        let e2 = out[2].as_ref().expect_err("refused").to_string();
        assert!(e2.contains("TESSERA_BOOTSTRAP_SECRET"), "{e2}");
        // Rank 1 (right secret) hears the real cause: the world did not form.
        let e1 = out[1].as_ref().expect_err("no world").to_string();
        assert!(
            e1.contains("rank(s) 2 never joined") && !e1.contains("SECRET"),
            "{e1}"
        );
    }

    /// A stranger that connects and sends `bytes` one every `every`, for as long as
    /// the connection takes them (at most 20 s).
    fn dripper(addr: String, bytes: Vec<u8>, every: Duration) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let Ok(mut s) = TcpStream::connect(&addr) else {
                return;
            };
            let t0 = Instant::now();
            for b in bytes.iter().cycle() {
                if t0.elapsed() > Duration::from_secs(20) || s.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(every);
            }
        })
    }

    /// What a client sends after rank 0's hello, MAC garbage: rank 1 of 2.
    fn plausible_start() -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&2u32.to_le_bytes());
        v.extend_from_slice(&[7u8; 64]);
        v
    }

    #[test]
    fn a_handshake_ends_by_its_deadline_however_slowly_the_peer_drips() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = format!("127.0.0.1:{}", l.local_addr().expect("addr").port());
        let d = dripper(addr, plausible_start(), Duration::from_millis(100));
        let (s, _) = l.accept().expect("accept");
        let t0 = Instant::now();
        // The deadline falls inside the 32-byte nonce (bytes 16..48: 1.6 s to 4.8 s).
        let got = admit(s, 2, b"k", &[false, false], t0 + Duration::from_secs(2));
        let took = t0.elapsed();
        assert!(
            matches!(&got, Err(e) if e.kind() == std::io::ErrorKind::TimedOut),
            "{:?}",
            got.map(|o| o.map(|(r, _, _)| r))
        );
        // (Each byte used to restart the wait inside one read: the nonce's 32 bytes
        // ran to 4.8 s.)
        assert!(took < Duration::from_millis(2600), "took {took:?}");
        drop(l);
        d.join().expect("dripper");
    }

    #[test]
    fn a_dripping_stranger_neither_holds_rank_0_nor_fails_the_world() {
        let server = Server::bind("127.0.0.1:0").expect("bind");
        let addr = format!("127.0.0.1:{}", server.port().expect("port"));
        // The stranger connects first (it waits in the backlog until rank 0
        // serves) and drips for up to 20 s.
        let d = dripper(addr.clone(), plausible_start(), Duration::from_millis(200));
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        let out = std::thread::scope(|sc| {
            let hs: Vec<_> = (1..3u32)
                .map(|r| {
                    let addr = addr.clone();
                    sc.spawn(move || join(&addr, r, 3, b"k", &[r as u8], Duration::from_secs(8)))
                })
                .collect();
            let mine = server.serve(3, b"k", &[0], Duration::from_secs(8));
            let mut out = vec![mine];
            out.extend(hs.into_iter().map(|h| h.join().expect("no panic")));
            out
        });
        let took = t0.elapsed();
        for (r, o) in out.into_iter().enumerate() {
            assert_eq!(
                o.unwrap_or_else(|e| panic!("rank {r}: {e}")),
                vec![vec![0u8], vec![1], vec![2]],
                "rank {r}"
            );
        }
        // The world formed once its ranks had joined, not when the stranger's
        // handshake ended (it used to be joined first: 20 s).
        assert!(took < Duration::from_secs(4), "took {took:?}");
        d.join().expect("dripper");
    }

    #[test]
    fn a_rank_0_without_the_secret_gets_no_payload() {
        // Rank 0 has the wrong secret: rank 1 must not accept it (it drops the
        // connection, since rank 1's MAC fails there first).
        let out = run(2, &[b"impostor".as_slice(), b"right"]);
        assert!(out[0].is_err() && out[1].is_err());
    }

    #[test]
    fn mismatched_sizes_and_ranks_outside_the_world_are_refused_with_reasons() {
        let server = Server::bind("127.0.0.1:0").expect("bind");
        let addr = format!("127.0.0.1:{}", server.port().expect("port"));
        std::thread::scope(|s| {
            let a = addr.clone();
            let bad = s.spawn(move || join(&a, 1, 5, b"k", b"x", Duration::from_secs(3)));
            let a = addr.clone();
            let out_of_world = s.spawn(move || join(&a, 7, 2, b"k", b"x", Duration::from_secs(3)));
            let served = server.serve(2, b"k", b"0", Duration::from_secs(2));
            let e = bad.join().expect("no panic").expect_err("size").to_string();
            assert!(e.contains("world of 2 ranks, this rank one of 5"), "{e}");
            let e = out_of_world
                .join()
                .expect("no panic")
                .expect_err("rank")
                .to_string();
            assert!(e.contains("rank 7 is not a peer"), "{e}");
            assert!(served.is_err());
        });
    }

    #[test]
    fn nobody_listening_fails_in_bounded_time() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let t0 = Instant::now();
        let e = join(
            &format!("127.0.0.1:{port}"),
            1,
            2,
            b"k",
            b"x",
            Duration::from_millis(500),
        )
        .expect_err("no rank 0");
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(e.to_string().contains("could not reach rank 0"), "{e}");
    }

    #[test]
    fn a_world_of_one_needs_no_network() {
        let out = exchange("256.0.0.1:1", 0, 1, b"k", b"only", T).expect("alone");
        assert_eq!(out, vec![b"only".to_vec()]);
    }
}
