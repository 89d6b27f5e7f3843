//! Several processes writing and reading one kernel-cache entry at once: every read
//! sees a whole entry, and the final entry is valid.

use std::process::Command;

use tessera::disk_cache::{CacheKey, DiskCache};

const CHILD_ENV: &str = "TESSERA_CACHE_TEST_CHILD_DIR";

fn payload() -> Vec<u8> {
    (0..300_000u32)
        .map(|i| (i.wrapping_mul(31) % 251) as u8)
        .collect()
}

fn key() -> CacheKey {
    CacheKey::new("kernel @k() {}", "sm_90", "test", "num_warps=4")
}

/// The body run by each child process (a no-op when run directly).
#[test]
fn child_process_body() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let cache = DiskCache::new(dir);
    let want = payload();
    for i in 0..30 {
        if i % 3 == 0 {
            cache.put(&key(), &want).expect("put");
        }
        if let Some(got) = cache.get(&key()) {
            assert!(got == want, "a reader saw a partial or foreign entry");
        }
    }
}

#[test]
fn processes_share_the_cache_safely() {
    let dir = std::env::temp_dir().join(format!("tessera-cache-procs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let exe = std::env::current_exe().expect("test binary path");
    let children: Vec<_> = (0..6)
        .map(|_| {
            Command::new(&exe)
                .args(["--exact", "child_process_body", "--test-threads", "1"])
                .env(CHILD_ENV, &dir)
                .spawn()
                .expect("spawn child")
        })
        .collect();
    for mut c in children {
        let status = c.wait().expect("child");
        assert!(status.success(), "a child process failed: {status}");
    }
    assert_eq!(DiskCache::new(&dir).get(&key()), Some(payload()));
    std::fs::remove_dir_all(&dir).unwrap();
}
