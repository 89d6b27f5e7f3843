//! The launch environment of a rank that is a process of one node ([`LaunchEnv`]:
//! what `torchrun` or [`spawn_local`](super::spawn_local) sets), and the per-user
//! folder its default bootstrap socket lives in.
//!
//! Contract: [`LaunchEnv::from_vars`] reads `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, the bootstrap socket (`TESSERA_BOOTSTRAP`, else a name derived
//! from `MASTER_ADDR`/`MASTER_PORT`/`TORCHELASTIC_RUN_ID`) and the secret
//! ([`SECRET_VAR`]), and refuses what is inconsistent with an error naming the
//! variable; without `WORLD_SIZE` the process is a world of one. The socket folder
//! ([`runtime_dir`]) is a private (`0700`) folder of this user's, and
//! [`ensure_private_dir`] refuses one that another user could have planted.

use std::path::{Path, PathBuf};

use crate::Error;

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
    /// (set by [`spawn_local`](super::spawn_local); `None`: the user check alone).
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
pub(super) const MAX_SECRET_BYTES: usize = 1024;

/// A launch variable: set and not blank.
pub(super) fn env_var(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.trim().is_empty())
}

/// The per-user folder of default bootstrap sockets: `$XDG_RUNTIME_DIR/tessera`
/// (systemd's private per-user folder) when set, else `/tmp/tessera-<uid>`.
///
/// `$XDG_RUNTIME_DIR` counts only when it is an existing private (`0700`) folder of
/// this user's: under `su`, `sudo -E`, a batch system or a container it may be unset,
/// missing or another user's. Every rank of a job sees the same environment and
/// folders, so every rank makes the same choice.
pub(super) fn runtime_dir(get: &dyn Fn(&str) -> Option<String>) -> PathBuf {
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
pub(super) fn ensure_private_dir(dir: &Path) -> Result<(), String> {
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
    /// Reads the launch environment (see the [`procs`](super) docs).
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

/// The effective user id of this process.
pub(super) fn my_uid() -> u32 {
    rustix::process::geteuid().as_raw()
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
}
