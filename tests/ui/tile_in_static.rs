use std::sync::Mutex;

use tessera::prelude::*;

// A tile is a handle to a value of the kernel being built: it cannot outlive the
// kernel. Tiles are neither `Send` nor `Sync`, so a `static` cannot hold one (a
// thread-local can, and the kernel that uses it fails to build: tests/ergonomics.rs).
static KEPT: Mutex<Option<Tile<f32, S1<16>>>> = Mutex::new(None);

#[kernel]
fn keep(x: &Global<f32>) {
    let t = x.load_unmasked(arange::<16>());
    *KEPT.lock().unwrap() = Some(t);
}

fn main() {}
