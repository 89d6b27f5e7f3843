//! Block-local memory (`Local<T, N>`, IR `local_alloc`): GPU shared memory that the
//! threads of one program instance exchange data through, with explicit `barrier()`s
//! and block-scope atomics. On the CPU (per-program semantics), emu-nv and emu-amd
//! (the real lowering, the emulator's race checker watching every access) against
//! plain-Rust references on random inputs, outputs poisoned first; then the errors a
//! user gets (a missing barrier, an index past the end, a device-scope atomic), arrays
//! allocated in a loop, and the instructions every GPU target compiles it to.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::prelude::*;
use tessera_tests::{cpu_and_emulators, line_of};

/// One histogram of `BINS` bins per program over its `BLOCK` elements (atomics on
/// local memory, colliding lanes included), a float sum through a local atomic, and
/// the tile reversed through local memory (each thread reads what others wrote).
#[kernel]
#[allow(clippy::too_many_arguments)]
fn block_local<const BLOCK: usize, const BINS: usize>(
    x: &Global<i32>,
    w: &Global<f32>,
    hist: &mut Global<i32>,
    sums: &mut Global<f32>,
    rev: &mut Global<f32>,
    n: i32,
) {
    let pid = program_id(0);
    let offs = pid * BLOCK + arange::<BLOCK>();
    let m = offs.lt(n);
    let mut h = Local::<i32, BINS>::new();
    let mut s = Local::<f32, 1>::new();
    let mut t = Local::<f32, BLOCK>::new();
    let bins = arange::<BINS>();
    h.store_unmasked(bins, 0);
    s.store_unmasked(0, 0.0f32);
    barrier();
    let v = w.load(offs, m);
    h.atomic_add(x.load(offs, m), 1, m);
    s.atomic_add(arange::<BLOCK>() * 0, v, m);
    t.store_unmasked(arange::<BLOCK>(), v);
    barrier();
    hist.store_unmasked(pid * BINS + bins, h.load_unmasked(bins));
    sums.store_unmasked(pid, s.load_unmasked(0));
    let back = (BLOCK - 1) as i32 - arange::<BLOCK>();
    rev.store(offs, t.load_unmasked(back), m);
}

#[test]
fn histograms_sums_and_exchanges_through_local_memory() {
    const BLOCK: usize = 256;
    const BINS: usize = 32;
    let n = 1000usize; // the last program has 232 elements
    let progs = n.div_ceil(BLOCK);
    let mut r = StdRng::seed_from_u64(5);
    let x: Vec<i32> = (0..n).map(|_| r.gen_range(0..BINS as i32)).collect();
    // Small integers, so that every order of the float atomic adds is exact.
    let w: Vec<f32> = (0..n).map(|_| r.gen_range(-8..8) as f32).collect();
    for dev in cpu_and_emulators() {
        let mut hist = dev.upload(&vec![-99i32; progs * BINS]).unwrap();
        let mut sums = dev.upload(&vec![f32::NAN; progs]).unwrap();
        let mut rev = dev.upload(&vec![f32::NAN; n]).unwrap();
        block_local::<BLOCK, BINS>::launch(
            &dev,
            progs as u32,
            (
                &dev.upload(&x).unwrap(),
                &dev.upload(&w).unwrap(),
                &mut hist,
                &mut sums,
                &mut rev,
                n as i32,
            ),
        )
        .unwrap_or_else(|e| panic!("{dev}: {e}"));
        let (hist, sums, rev) = (
            hist.download().unwrap(),
            sums.download().unwrap(),
            rev.download().unwrap(),
        );
        for p in 0..progs {
            let part = p * BLOCK..((p + 1) * BLOCK).min(n);
            let mut want = [0i32; BINS];
            for &b in &x[part.clone()] {
                want[b as usize] += 1;
            }
            assert_eq!(
                hist[p * BINS..(p + 1) * BINS],
                want[..],
                "{dev}: program {p}"
            );
            let s: f32 = w[part.clone()].iter().sum();
            assert_eq!(sums[p], s, "{dev}: sum of program {p}");
            for i in part {
                // Element i comes from lane BLOCK-1-lane of its program (masked-off
                // lanes loaded 0).
                let lane = i - p * BLOCK;
                let src = p * BLOCK + BLOCK - 1 - lane;
                let want = if src < n { w[src] } else { 0.0 };
                assert_eq!(rev[i], want, "{dev}: reversed element {i}");
            }
        }
    }
}

/// The exchange above without its second barrier.
#[kernel]
fn racy_exchange<const BLOCK: usize>(w: &Global<f32>, rev: &mut Global<f32>) {
    let mut t = Local::<f32, BLOCK>::new();
    t.store_unmasked(arange::<BLOCK>(), w.load_unmasked(arange::<BLOCK>())); // RACE-STORE
    let back = (BLOCK - 1) as i32 - arange::<BLOCK>();
    rev.store_unmasked(arange::<BLOCK>(), t.load_unmasked(back)); // RACE-LOAD
}

/// A missing barrier is a race the emulator reports with both lines, in both
/// flavors; the CPU devices (compiled and interpreted) run it.
#[test]
fn a_missing_barrier_is_a_race_with_both_lines() {
    let src = include_str!("local_memory.rs");
    let (store, load) = (line_of(src, "RACE-STORE"), line_of(src, "RACE-LOAD"));
    let w: Vec<f32> = (0..256).map(|i| i as f32).collect();
    for dev in cpu_and_emulators() {
        let mut rev = dev.upload(&vec![f32::NAN; 256]).unwrap();
        let r = racy_exchange::<256>::launch(&dev, 1u32, (&dev.upload(&w).unwrap(), &mut rev));
        if matches!(dev.id().as_str(), "cpu" | "interp") {
            r.unwrap();
            let want: Vec<f32> = (0..256).rev().map(|i| i as f32).collect();
            assert_eq!(rev.download().unwrap(), want);
            continue;
        }
        let e = r.expect_err("a race").to_string();
        assert!(e.contains("shared-memory race"), "{dev}: {e}");
        assert!(
            e.contains(&format!("local_memory.rs:{load}:")),
            "{dev}: the load's line {load}: {e}"
        );
        assert!(
            e.contains(&format!("local_memory.rs:{store}:")),
            "{dev}: the store's line {store}: {e}"
        );
    }
}

#[kernel]
fn reads<const N: usize>(out: &mut Global<f32>, i: i32) {
    let t = Local::<f32, N>::new();
    out.store_unmasked(0, t.load_unmasked(i)); // LOCAL-READ
}

/// On the CPU, local memory starts as poison (NaN), and an index past the end is an
/// error naming the array and the line.
#[test]
fn the_cpu_poisons_and_bounds_checks_local_memory() {
    let dev = Device::cpu();
    let mut out = dev.upload(&[1.0f32]).unwrap();
    reads::<64>::launch(&dev, 1u32, (&mut out, 63)).unwrap();
    assert!(out.download().unwrap()[0].is_nan());
    let e = reads::<64>::launch(&dev, 1u32, (&mut out, 64))
        .expect_err("out of bounds")
        .to_string();
    let line = line_of(include_str!("local_memory.rs"), "LOCAL-READ");
    assert!(e.contains("block-local memory"), "{e}");
    assert!(e.contains(&format!("local_memory.rs:{line}:")), "{e}");
}

#[kernel]
fn alloc_in_loop(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
    for i in 0..n {
        let mut t = Local::<f32, 16>::new();
        t.store_unmasked(arange::<16>(), x.load_unmasked(i * 16 + arange::<16>()));
        barrier();
        let back = 15 - arange::<16>();
        out.store_unmasked(i * 16 + arange::<16>(), t.load_unmasked(back));
        barrier();
    }
}

/// An array allocated in a runtime loop: the same memory each iteration on a GPU,
/// poisoned again each iteration on the CPU; written before it is read, it gives the
/// same results everywhere.
#[test]
fn local_memory_in_a_runtime_loop() {
    let n = 5;
    let x: Vec<f32> = (0..16 * n).map(|i| i as f32 * 0.5).collect();
    for dev in cpu_and_emulators() {
        let mut out = dev.upload(&vec![f32::NAN; 16 * n]).unwrap();
        alloc_in_loop::launch(&dev, 1u32, (&dev.upload(&x).unwrap(), &mut out, n as i32))
            .unwrap_or_else(|e| panic!("{dev}: {e}"));
        let want: Vec<f32> = (0..16 * n).map(|i| x[i / 16 * 16 + 15 - i % 16]).collect();
        assert_eq!(out.download().unwrap(), want, "{dev}");
    }
}

/// Histograms: of a ragged 1-D range (out-of-range values and the masked tail not
/// counted), of a 2-D tile of `u8` into 256 bins (no upper bound to check), and
/// accumulated over the chunks of a runtime loop (the array reused each iteration).
#[kernel]
#[allow(clippy::too_many_arguments)]
fn histograms<const B: usize>(
    x: &Global<i32>,
    q: &Global<u8>,
    h1: &mut Global<i32>,
    h2: &mut Global<i32>,
    h3: &mut Global<i32>,
    n: i32,
    chunks: i32,
) {
    let offs = arange::<B>();
    let m = offs.lt(n);
    let v = x.load_or(offs, m, -1);
    h1.store_unmasked(arange::<64>(), v.histogram_where::<64>(m));
    let r = arange::<16>().expand_dims::<1>();
    let c = arange::<64>().expand_dims::<0>();
    let t = q.load_unmasked(r * 64 + c);
    h2.store_unmasked(arange::<256>(), t.histogram::<256>());
    let mut acc = zeros::<i32, S1<32>>();
    for k in 0..chunks {
        let part = x.load_unmasked(k * B as i32 + arange::<B>()) & 31;
        acc = acc + part.histogram::<32>();
    }
    h3.store_unmasked(arange::<32>(), acc);
}

#[test]
fn histograms_count_every_bin() {
    const B: usize = 1024;
    let (n, chunks) = (1000usize, 3usize);
    let mut r = StdRng::seed_from_u64(8);
    let x: Vec<i32> = (0..B * chunks).map(|_| r.gen_range(-5..70)).collect();
    let q: Vec<u8> = (0..1024).map(|_| r.r#gen()).collect();
    let count = |vals: &mut dyn Iterator<Item = i64>, bins: usize| {
        let mut h = vec![0i32; bins];
        for v in vals {
            if (0..bins as i64).contains(&v) {
                h[v as usize] += 1;
            }
        }
        h
    };
    let want1 = count(&mut x[..n].iter().map(|&v| v as i64), 64);
    let want2 = count(&mut q.iter().map(|&v| v as i64), 256);
    let want3 = count(&mut x.iter().map(|&v| (v & 31) as i64), 32);
    assert!(
        x[..n].iter().any(|&v| !(0..64).contains(&v)),
        "some values out of range"
    );
    for dev in cpu_and_emulators() {
        let p = |len: usize| dev.upload(&vec![-99i32; len]).unwrap();
        let (mut h1, mut h2, mut h3) = (p(64), p(256), p(32));
        histograms::<B>::launch(
            &dev,
            1u32,
            (
                &dev.upload(&x).unwrap(),
                &dev.upload(&q).unwrap(),
                &mut h1,
                &mut h2,
                &mut h3,
                n as i32,
                chunks as i32,
            ),
        )
        .unwrap_or_else(|e| panic!("{dev}: {e}"));
        assert_eq!(h1.download().unwrap(), want1, "{dev}: masked 1-D histogram");
        assert_eq!(h2.download().unwrap(), want2, "{dev}: 2-D u8 histogram");
        assert_eq!(h3.download().unwrap(), want3, "{dev}: histograms in a loop");
    }
}

/// Device-scope atomics on local memory are rejected in the IR: nothing outside the
/// program instance can see it.
#[test]
fn local_atomics_have_block_scope() {
    let text = r#"kernel @k(%o: ptr<i32>) {
  %0 = local_alloc 16 : ptr<i32, shared>
  %1 = const 1 : i32
  %2 = atomic_rmw add acq_rel device %0, %1 : i32
}"#;
    let e = match tessera::ir::parser::parse_function(text) {
        Err(e) => e.to_string(),
        Ok(f) => tessera::ir::verify::verify(&f)
            .expect_err("rejected")
            .to_string(),
    };
    assert!(e.contains("block"), "{e}");
}

/// Every GPU target compiles it to its shared-memory instructions, and ptxas
/// assembles it without spills.
#[test]
fn local_memory_compiles_for_every_gpu_target() {
    use tessera::aot::{AmdArch, CompileOptions, Target, compile_kernel};
    use tessera::codegen::tools;
    let o = CompileOptions::default();
    for t in [Target::nvptx(80), Target::SM90A] {
        let art = compile_kernel::<block_local<256, 32>>(&(), t, &o).expect("compiles");
        for i in [
            "atom.shared.add.u32",
            "atom.shared.add.f32",
            "st.shared",
            "ld.shared",
            "bar.sync",
        ] {
            assert!(art.asm.contains(i), "{t}: no {i}:\n{}", art.asm);
        }
        let h = compile_kernel::<histograms<1024>>(&(), t, &o).expect("compiles");
        for a in [&art, &h] {
            let r = tools::ptxas(&a.asm, &t.to_string()).expect("ptxas");
            assert_eq!((r.spill_stores_bytes, r.spill_loads_bytes), (0, 0), "{t}");
        }
    }
    for a in [AmdArch::Gfx90a, AmdArch::Gfx942] {
        let t = Target::Amdgpu(a);
        let art = compile_kernel::<block_local<256, 32>>(&(), t, &o).expect("compiles");
        for i in [
            "ds_add_u32",
            "ds_add_f32",
            "ds_write",
            "ds_read",
            "s_barrier",
        ] {
            assert!(art.asm.contains(i), "{t}: no {i}:\n{}", art.asm);
        }
        compile_kernel::<histograms<1024>>(&(), t, &o).expect("histograms compile");
    }
}

#[kernel]
fn too_big(out: &mut Global<f32>) {
    let t = Local::<f32, 65536>::new(); // TOO-BIG
    out.store_unmasked(arange::<16>(), t.load_unmasked(arange::<16>()));
}

/// More block-local memory than the target has is a compile error naming the
/// allocation's line and the limit.
#[test]
fn too_much_local_memory_is_an_error_at_its_line() {
    use tessera::aot::{CompileOptions, Target, compile_kernel};
    let e = compile_kernel::<too_big>(&(), Target::nvptx(80), &CompileOptions::default())
        .expect_err("256 KiB of shared memory")
        .to_string();
    let line = line_of(include_str!("local_memory.rs"), "TOO-BIG");
    assert!(e.contains("shared memory"), "{e}");
    assert!(e.contains(&format!("local_memory.rs:{line}:")), "{e}");
}
