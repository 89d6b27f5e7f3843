//! Thread ranks' heaps are anonymous mappings, zero pages until touched: a world's
//! resident memory follows what its ranks use, not the size of their heaps. (Eight
//! ranks of 256 MiB heaps used to write 2 GiB before the first kernel ran.) The only
//! test in its binary, so that no other test's memory shows in the process's.

use tessera::World;
use tessera::prelude::*;

/// The process's resident memory in bytes (Linux `/proc/self/statm`).
fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}

#[test]
fn eight_ranks_with_256_mib_heaps_stay_small() {
    const HEAP: usize = 256 << 20;
    let before = resident_bytes();
    let out = World::local(8)
        .heap_bytes(HEAP)
        .run(|r| {
            let x: Vec<f32> = (0..1024)
                .map(|i| (i * 8 + r.rank() as usize) as f32)
                .collect();
            let mut buf = r.upload(&x)?;
            r.all_reduce(&mut buf, ReduceOp::Sum)?;
            r.barrier()?;
            Ok((buf.download()?, resident_bytes()))
        })
        .expect("the world runs");
    for (got, _) in &out {
        for (i, v) in got.iter().enumerate() {
            let want: f32 = (0..8).map(|r| (i * 8 + r) as f32).sum();
            assert_eq!(*v, want, "element {i}");
        }
    }
    let peak = out.iter().map(|(_, rss)| *rss).max().expect("8 ranks");
    let grew = peak.saturating_sub(before);
    // Under one heap's worth for all eight (each rank touches its control words,
    // signals and a 4 KiB buffer plus the collective's workspace).
    assert!(
        grew < HEAP,
        "resident memory grew by {} MiB for 8 heaps of {} MiB",
        grew >> 20,
        HEAP >> 20
    );
}
