//! Capacity of the SIMT emulator: a kernel that waits for every other block of every
//! rank (`barrier_all`, then a signal ring across ranks) with 8 ranks x 128 blocks x
//! 256 threads, all live at once as coroutines (262,144 GPU threads), on both flavors
//! (`emu-nv`: 8 warps of 32; `emu-amd`: 4 waves of 64). The old emulator, with one OS
//! thread per GPU thread, refused more than 8,192 threads per launch.

use tessera::codegen::target::EmuFlavor;
use tessera_tests::emu_world::ring_world;

#[test]
fn a_waiting_kernel_of_8_ranks_x_128_blocks_x_256_threads_runs() {
    for flavor in [EmuFlavor::Nv, EmuFlavor::Amd] {
        let t = ring_world(flavor, 8, 128).unwrap_or_else(|e| panic!("{e}"));
        eprintln!(
            "{flavor:?}: 8 ranks x 128 blocks x 256 threads in {:.2} s",
            t.as_secs_f64()
        );
    }
}
