//! The on-disk kernel cache: compiled artifacts keyed by everything that determines
//! them, safe to share between concurrent processes.
//!
//! - **Location**: `TESSERA_CACHE_DIR` if set, else `$XDG_CACHE_HOME/tessera`, else
//!   `~/.cache/tessera` (the platform cache directory elsewhere).
//! - **Key**: SHA-256 over the IR text, the target, the compiler version and the
//!   options ([`CacheKey`]); an entry is a file named by the key's hex digest.
//! - **Integrity**: an entry is `MAGIC`, the payload length (u64 LE), the payload's
//!   SHA-256, then the payload. A read that finds a short, oversized or corrupt entry
//!   deletes it and reports a miss, so the caller recompiles.
//! - **Atomicity**: a write goes to a uniquely named temporary file in the same folder,
//!   is flushed, then renamed over the entry. Readers see either no entry or a complete
//!   one; two processes writing the same key both succeed (the entries are equal).
//! - **Trust**: the folder is created `0700` and refused when other users could write
//!   it; entries are read only as regular, bounded, private files (see the README's trust model).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// First bytes of every entry (format version 1).
const MAGIC: &[u8; 8] = b"TSRCACH1";
const HEADER: usize = 8 + 8 + 32;

/// What determines a compiled artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheKey {
    digest: [u8; 32],
}

impl CacheKey {
    /// The key of compiling `ir_text` for `target` with `options` (any stable
    /// description of them) by compiler `version`.
    pub fn new(ir_text: &str, target: &str, version: &str, options: &str) -> CacheKey {
        let mut h = Sha256::new();
        for part in [ir_text, target, version, options] {
            // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        CacheKey {
            digest: h.finalize().into(),
        }
    }

    /// The lower-case hex digest (the entry's file name).
    pub fn hex(&self) -> String {
        self.digest.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// A folder of cache entries.
#[derive(Clone, Debug)]
pub struct DiskCache {
    dir: PathBuf,
}

/// Why the cache could not be used (reads never fail: a bad entry is a miss).
#[derive(Debug, thiserror::Error)]
#[error("kernel cache at {path}: {source}")]
pub struct CacheError {
    /// The file or folder involved.
    pub path: String,
    /// The I/O error.
    #[source]
    pub source: io::Error,
}

impl DiskCache {
    /// A cache in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> DiskCache {
        DiskCache { dir: dir.into() }
    }

    /// The cache `TESSERA_CACHE_DIR` names ([`crate::config`]), else `tessera` in the
    /// user's cache folder (`$XDG_CACHE_HOME`, `~/.cache` on Linux; the `dirs`
    /// crate's answer); `None` when it is `off` or no folder can be determined.
    pub fn from_env() -> Result<Option<DiskCache>, crate::Error> {
        Ok(match &crate::config::get()?.cache_dir {
            crate::config::CacheDir::Off => None,
            crate::config::CacheDir::At(d) => Some(DiskCache::new(d.clone())),
            crate::config::CacheDir::Default => {
                dirs::cache_dir().map(|d| DiskCache::new(d.join("tessera")))
            }
        })
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn entry_path(&self, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{}.bin", key.hex()))
    }

    /// The payload stored under `key`, or `None` on a miss. A truncated or corrupt
    /// entry is deleted and counts as a miss.
    pub fn get(&self, key: &CacheKey) -> Option<Vec<u8>> {
        let path = self.entry_path(key);
        let refused = |e: io::Error| {
            if e.kind() != io::ErrorKind::NotFound {
                log::warn!("not using kernel cache entry {}: {e}", path.display());
            }
        };
        if let Err(e) = crate::secure_fs::check_own_dir(&self.dir) {
            refused(e);
            return None;
        }
        let bytes = crate::secure_fs::read_entry(&path).map_err(refused).ok()?;
        match decode(&bytes) {
            Some(payload) => Some(payload.to_vec()),
            None => {
                log::warn!("discarding corrupt kernel cache entry {}", path.display());
                // Another process may have replaced it with a good entry meanwhile;
                // removing that one only costs a recompilation.
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    /// Deletes the entry under `key`, if any (e.g. a payload its user found invalid).
    pub fn remove(&self, key: &CacheKey) {
        let _ = fs::remove_file(self.entry_path(key));
    }

    /// Stores `payload` under `key`, atomically (a private
    /// folder, an exclusive temporary file renamed over the entry).
    pub fn put(&self, key: &CacheKey, payload: &[u8]) -> Result<(), CacheError> {
        let err = |path: &Path| {
            let path = path.display().to_string();
            move |source| CacheError { path, source }
        };
        crate::secure_fs::create_private_dir(&self.dir)
            .and_then(|()| crate::secure_fs::check_own_dir(&self.dir))
            .map_err(err(&self.dir))?;
        let path = self.entry_path(key);
        crate::secure_fs::atomic_write(&path, &encode(payload)).map_err(err(&path))
    }
}

fn encode(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(payload));
    out.extend_from_slice(payload);
    out
}

fn decode(bytes: &[u8]) -> Option<&[u8]> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().ok()?);
    let payload = &bytes[HEADER..];
    if payload.len() as u64 != len || Sha256::digest(payload).as_slice() != &bytes[16..48] {
        return None;
    }
    Some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_util::temp_dir;

    #[test]
    fn keys_separate_every_input() {
        let k = CacheKey::new("ir", "sm_90", "0.1.0", "num_warps=4");
        assert_eq!(k, CacheKey::new("ir", "sm_90", "0.1.0", "num_warps=4"));
        assert_ne!(k, CacheKey::new("ir2", "sm_90", "0.1.0", "num_warps=4"));
        assert_ne!(k, CacheKey::new("ir", "sm_80", "0.1.0", "num_warps=4"));
        assert_ne!(k, CacheKey::new("ir", "sm_90", "0.1.1", "num_warps=4"));
        assert_ne!(k, CacheKey::new("ir", "sm_90", "0.1.0", "num_warps=8"));
        assert_ne!(
            CacheKey::new("ab", "c", "", ""),
            CacheKey::new("a", "bc", "", "")
        );
        assert_eq!(k.hex().len(), 64);
    }

    /// An attacker's link at an entry's name is not followed (the victim keeps its
    /// bytes, the read is a miss), a put replaces it; a cache folder others can write
    /// is refused for reads and writes; the folder is created `0700`.
    #[test]
    fn planted_links_and_shared_folders_are_refused() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let (_tmp, d) = temp_dir("planted");
        let cache = DiskCache::new(d.join("c"));
        let k = CacheKey::new("ir", "sm_90", "v", "o");
        cache
            .put(&CacheKey::new("x", "", "", ""), b"first")
            .unwrap();
        assert_eq!(fs::metadata(cache.dir()).unwrap().mode() & 0o777, 0o700);
        let victim = d.join("victim");
        fs::write(&victim, encode(b"planted kernel")).unwrap();
        std::os::unix::fs::symlink(&victim, cache.entry_path(&k)).unwrap();
        assert_eq!(cache.get(&k), None);
        cache.put(&k, b"compiled").unwrap();
        assert_eq!(
            decode(&fs::read(&victim).unwrap()),
            Some(&b"planted kernel"[..])
        );
        assert_eq!(cache.get(&k).as_deref(), Some(&b"compiled"[..]));
        fs::set_permissions(cache.dir(), fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(cache.get(&k), None);
        let e = cache.put(&k, b"again").unwrap_err().to_string();
        assert!(e.contains("writable by other users"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn round_trip_and_miss() {
        let (_tmp, d) = temp_dir("rt");
        let c = DiskCache::new(d);
        let k = CacheKey::new("kernel", "gfx942", "v", "o");
        assert_eq!(c.get(&k), None);
        c.put(&k, b"payload bytes").unwrap();
        assert_eq!(c.get(&k).as_deref(), Some(&b"payload bytes"[..]));
        c.put(&k, b"").unwrap();
        assert_eq!(c.get(&k).as_deref(), Some(&b""[..]));
        fs::remove_dir_all(c.dir()).unwrap();
    }

    #[test]
    fn corrupt_entries_are_discarded() {
        let (_tmp, d) = temp_dir("corrupt");
        let c = DiskCache::new(d);
        let k = CacheKey::new("kernel", "sm_80", "v", "o");
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let path = c.entry_path(&k);
        let full = encode(&payload);
        let damage: Vec<(&str, Vec<u8>)> = vec![
            ("truncated payload", full[..full.len() - 1].to_vec()),
            ("truncated header", full[..20].to_vec()),
            ("empty", Vec::new()),
            ("flipped payload byte", {
                let mut b = full.clone();
                b[HEADER + 500] ^= 0x40;
                b
            }),
            ("flipped checksum", {
                let mut b = full.clone();
                b[20] ^= 1;
                b
            }),
            ("wrong magic", {
                let mut b = full.clone();
                b[0] = b'X';
                b
            }),
            ("trailing garbage", {
                let mut b = full.clone();
                b.push(0);
                b
            }),
        ];
        for (what, bytes) in damage {
            c.put(&k, &payload).unwrap();
            fs::write(&path, &bytes).unwrap();
            assert_eq!(c.get(&k), None, "{what} must be a miss");
            assert!(!path.exists(), "{what}: the entry must be deleted");
            c.put(&k, &payload).unwrap();
            assert_eq!(c.get(&k), Some(payload.clone()), "{what}: recompiled entry");
        }
        fs::remove_dir_all(c.dir()).unwrap();
    }

    #[test]
    fn concurrent_writers_and_readers_see_whole_entries() {
        let (_tmp, dir) = temp_dir("concurrent");
        let k = CacheKey::new("kernel", "sm_90", "v", "o");
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        std::thread::scope(|s| {
            for t in 0..8 {
                let (dir, k, payload) = (dir.clone(), k.clone(), payload.clone());
                s.spawn(move || {
                    let c = DiskCache::new(dir);
                    for i in 0..20 {
                        if (t + i) % 2 == 0 {
                            c.put(&k, &payload).unwrap();
                        } else if let Some(got) = c.get(&k) {
                            assert_eq!(got, payload, "a reader saw a partial entry");
                        }
                    }
                });
            }
        });
        let c = DiskCache::new(&dir);
        assert_eq!(c.get(&k), Some(payload));
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
