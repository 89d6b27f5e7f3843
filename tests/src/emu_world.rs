//! A world of emulated ranks driven directly through the emulator's world launch,
//! on heaps laid out as `tessera::World` lays them out (control words, then the
//! symmetric buffers), so that the number of warps can be chosen: the capacity test
//! and the emulator benchmark use it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera::codegen::CompileOptions;
use tessera::codegen::emu::{self, EmuWorld};
use tessera::codegen::target::{EmuFlavor, Target};
use tessera::ir::ScalarType;
use tessera::ir::interp::{HostBuffer, HostMemory, KernelArg, ctrl};
use tessera::prelude::*;

const B: usize = 64;

/// Every program of every rank meets at `barrier_all`, then sends its tile to the
/// same program of the next rank (signal word `pid`), waits for the previous rank's,
/// and writes it (plus its own rank) to `out`.
#[kernel]
fn ring_after_barrier<const B: usize>(
    src: &Symmetric<f32>,
    dst: &mut Symmetric<f32>,
    sig: &mut Symmetric<u64>,
    out: &mut Global<f32>,
) {
    barrier_all();
    let me = rank();
    let right = (me + 1) % world_size();
    let pid = program_id(0);
    let offs = pid * B as i32 + arange::<B>();
    let all = offs.ge(0);
    let v = src.load(offs, all);
    dst.put_signal(right, offs, v, all, sig, pid, 1u64, SignalOp::Set);
    sig.wait_until(pid, CmpPred::Ge, 1u64);
    let got = dst.load(offs, all);
    out.store(offs, got + me.cast::<f32>(), all);
}

/// 256-byte aligned, zeroed host memory for one rank's heap.
struct Heap {
    mem: Box<[Chunk]>,
}

#[repr(C, align(256))]
struct Chunk([u64; 32]);

impl Heap {
    fn new(bytes: usize) -> Arc<Heap> {
        Arc::new(Heap {
            mem: (0..bytes.div_ceil(256)).map(|_| Chunk([0; 32])).collect(),
        })
    }
}

// SAFETY: `base()..base() + len()` is the boxed slice, owned by the heap for its
// whole life and never moved (boxed); every access to it goes through `HostBuffer`
// views and the emulator's atomic or checked accesses.
unsafe impl HostMemory for Heap {
    fn base(&self) -> *mut u8 {
        self.mem.as_ptr() as *mut u8
    }
    fn len(&self) -> usize {
        self.mem.len() * 256
    }
}

/// Runs the kernel `ring_after_barrier` on `ranks` ranks (OS threads) of `blocks` blocks of
/// 256 threads each (8 warps of 32 on `Nv`, 4 waves of 64 on `Amd`), all live at
/// once, and checks every rank's output. Returns the wall time of the launches.
pub fn ring_world(flavor: EmuFlavor, ranks: usize, blocks: usize) -> Result<Duration, String> {
    if ranks == 0 || blocks == 0 {
        return Err(format!("{ranks} ranks x {blocks} blocks"));
    }
    let num_warps = 256 / Target::Emu(flavor).warp_size();
    let f = tessera::kernel_ir::<ring_after_barrier<B>>(&()).map_err(|e| e.to_string())?;
    let elems = blocks * B;
    let ctrl_bytes = ctrl::WORDS * 8;
    let data_bytes = elems * 4;
    let sig_off = ctrl_bytes;
    let src_off = sig_off + (blocks * 8).next_multiple_of(256);
    let dst_off = src_off + data_bytes;
    let heaps: Vec<Arc<Heap>> = (0..ranks)
        .map(|_| Heap::new(dst_off + data_bytes))
        .collect();
    let sym = |off: usize, ty: ScalarType, len: usize| -> KernelArg {
        let copies: Vec<Arc<HostBuffer>> = heaps
            .iter()
            .map(|h| {
                Arc::new(HostBuffer::view(h.clone(), off, ty, len).expect("a view inside the heap"))
            })
            .collect();
        KernelArg::Symmetric(copies.into())
    };
    let src = sym(src_off, ScalarType::F32, elems);
    let dst = sym(dst_off, ScalarType::F32, elems);
    let sig = sym(sig_off, ScalarType::U64, blocks);
    let KernelArg::Symmetric(srcs) = &src else {
        unreachable!()
    };
    for (r, b) in srcs.iter().enumerate() {
        let v: Vec<f32> = (0..elems).map(|i| (r * 100_000 + i) as f32).collect();
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        b.write_bytes(0, &bytes).expect("fits");
    }
    let outs: Vec<Arc<HostBuffer>> = (0..ranks)
        .map(|_| Arc::new(HostBuffer::from_slice(&vec![f32::NAN; elems])))
        .collect();
    let bases: Vec<u64> = heaps.iter().map(|h| h.base() as u64).collect();
    let opts = CompileOptions::warps(num_warps);
    let t = Instant::now();
    let res = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|r| {
                // SAFETY: `heaps` (aligned, zeroed control words first) outlive the
                // scope every launch runs in.
                let world =
                    unsafe { EmuWorld::new(r as u32, bases.clone(), Duration::from_secs(120)) };
                let args = [
                    src.clone(),
                    dst.clone(),
                    sig.clone(),
                    KernelArg::Buffer(outs[r].clone()),
                ];
                let (f, opts) = (&f, &opts);
                s.spawn(move || {
                    let launch = emu::EmuLaunch {
                        grid: [blocks as u32, 1, 1],
                        args: &args,
                        world: Some(&world),
                        ..Default::default()
                    };
                    emu::launch_with(&emu::EmuKernel::new(f, flavor, opts), &launch)
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        let mut first = Ok(());
        for (r, h) in handles.into_iter().enumerate() {
            let res = h
                .join()
                .unwrap_or_else(|_| Err("the rank thread panicked".into()));
            if let (Ok(()), Err(e)) = (&first, res) {
                first = Err(format!("{flavor:?} rank {r}: {e}"));
            }
        }
        first
    });
    let elapsed = t.elapsed();
    res?;
    for (r, o) in outs.iter().enumerate() {
        let left = (r + ranks - 1) % ranks;
        let got: Vec<f32> = o.to_vec().map_err(|e| e.to_string())?;
        for (i, g) in got.iter().enumerate() {
            let want = (left * 100_000 + i) as f32 + r as f32;
            if g.to_bits() != want.to_bits() {
                return Err(format!(
                    "{flavor:?} rank {r} element {i}: got {g}, want {want}"
                ));
            }
        }
    }
    Ok(elapsed)
}
