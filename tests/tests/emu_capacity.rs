//! Capacity and scheduling of the SIMT emulator (GPU threads as coroutines):
//!
//! - a kernel that waits for every other block of every rank (`barrier_all`, then a
//!   signal ring across ranks) with 8 ranks x 128 blocks x 256 threads, all live at
//!   once (262,144 GPU threads), on both flavors (`emu-nv`: 8 warps of 32; `emu-amd`:
//!   4 waves of 64); the old emulator, one OS thread per GPU thread, refused more than
//!   8,192 threads per launch;
//! - a grid too large for the machine's memory is an error naming the kernel, before
//!   anything runs;
//! - blocks that spin in a runtime loop on a flag the last block sets make progress
//!   (threads yield at loop back edges), as on a GPU where the whole grid is resident.

use std::sync::Arc;

use tessera::codegen::CompileOptions;
use tessera::codegen::emu::{self, EmuError};
use tessera::codegen::target::EmuFlavor;
use tessera::ir::interp::{HostBuffer, KernelArg};
use tessera::prelude::*;
use tessera_tests::emu_world::ring_world;

const FLAVORS: [EmuFlavor; 2] = [EmuFlavor::Nv, EmuFlavor::Amd];

#[test]
fn a_waiting_kernel_of_8_ranks_x_128_blocks_x_256_threads_runs() {
    for flavor in FLAVORS {
        let t = ring_world(flavor, 8, 128).unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "{flavor:?}: 8 ranks x 128 blocks x 256 threads in {:.2} s",
            t.as_secs_f64()
        );
    }
}

/// Every program waits for every other (`barrier_all`), then spins until the last
/// program has set `flag`, and writes what it saw.
#[kernel]
fn spin_until_last_block(flag: &mut Global<i32>, out: &mut Global<i32>) {
    barrier_all();
    let pid = program_id(0);
    let yes = pid.ge(0);
    let at = pid * 0;
    if pid.eq(num_programs(0) - 1) {
        flag.atomic_rmw(
            AtomicOp::Xchg,
            at,
            at + 1,
            yes,
            MemOrder::Release,
            MemScope::Device,
        );
    }
    let mut seen = flag.atomic_rmw(
        AtomicOp::Add,
        at,
        at,
        yes,
        MemOrder::Acquire,
        MemScope::Device,
    );
    while seen.eq(0) {
        seen = flag.atomic_rmw(
            AtomicOp::Add,
            at,
            at,
            yes,
            MemOrder::Acquire,
            MemScope::Device,
        );
    }
    out.store_unmasked(pid, seen);
}

#[test]
fn blocks_spinning_on_another_block_make_progress() {
    let f = tessera::kernel_ir::<spin_until_last_block>(&()).expect("builds");
    let blocks = 9;
    for flavor in FLAVORS {
        let flag = Arc::new(HostBuffer::from_slice(&[0i32]));
        let out = Arc::new(HostBuffer::from_slice(&vec![-7i32; blocks]));
        let args = [KernelArg::Buffer(flag), KernelArg::Buffer(out.clone())];
        emu::launch(
            &f,
            flavor,
            &CompileOptions::default(),
            [blocks as u32, 1, 1],
            &args,
        )
        .unwrap_or_else(|e| panic!("{flavor:?}: {e}"));
        assert_eq!(
            out.to_vec::<i32>().expect("i32"),
            vec![1; blocks],
            "{flavor:?}"
        );
    }
}

#[test]
fn a_grid_too_large_for_memory_is_an_error_before_the_launch() {
    let f = tessera::kernel_ir::<spin_until_last_block>(&()).expect("builds");
    // 2^26 blocks of 128 threads, all live at once: far beyond any machine's memory.
    let blocks = 1u32 << 26;
    let flag = Arc::new(HostBuffer::from_slice(&[0i32]));
    let out = Arc::new(HostBuffer::from_slice(&[0i32; 4]));
    let args = [KernelArg::Buffer(flag), KernelArg::Buffer(out)];
    let err = emu::launch(
        &f,
        EmuFlavor::Nv,
        &CompileOptions::default(),
        [blocks, 1, 1],
        &args,
    )
    .expect_err("too large");
    assert!(
        matches!(&err, EmuError::OutOfMemory { kernel, blocks: b, threads: 128, .. } if kernel == "spin_until_last_block" && *b == blocks as u64),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("tests/tests/emu_capacity.rs"), "{msg}");
    assert!(msg.contains("MiB are available"), "{msg}");
}

/// A waiting kernel whose blocks would fit in memory for one rank but not for the
/// eight ranks of its world (which launch it at the same time) is refused before any
/// rank starts, naming the kernel and the world.
#[test]
fn the_memory_check_counts_every_rank_of_the_world() {
    let info = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    let avail_kib: u64 = info
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .expect("MemAvailable");
    // 256 threads per block at the check's 16 KiB of stack each (plus a little):
    // blocks for half the memory on one rank, so four times the memory on eight.
    let per_block_kib = 256 * 16;
    let blocks = (avail_kib / 2 / per_block_kib).max(1) as usize;
    let err = ring_world(EmuFlavor::Nv, 8, blocks).expect_err("too large for the world");
    assert!(err.contains("8 rank(s)"), "{err}");
    assert!(err.contains("ring_after_barrier"), "{err}");
    assert!(err.contains("MiB are available"), "{err}");
}
