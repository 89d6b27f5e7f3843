//! A local launcher: [`spawn_local`] starts a program as the `n` ranks of one world of
//! processes on this node, the way `torchrun --nproc-per-node n` would.
//!
//! Contract: every rank gets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, a
//! fresh bootstrap socket in the per-user private folder and a fresh random secret,
//! plus the rest of this process's environment; the launcher waits for every rank and
//! returns their outputs by rank. A rank that cannot be started kills the ones
//! started before it (they would wait for it until their timeout).

use std::ffi::OsStr;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::Ordering;

use super::env::{SECRET_VAR, ensure_private_dir, env_var, runtime_dir};
use crate::Error;

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
