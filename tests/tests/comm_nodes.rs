//! Ranks on several nodes through NVSHMEM (`CommEngine::Nvshmem`, issue 19):
//!
//! - **The emulator** runs worlds whose ranks are placed on emulated nodes
//!   (`World::ranks_per_node`): kernels compile with the NVSHMEM engine, off-node
//!   peers are reached only through the emulator's NVSHMEM device functions (puts
//!   delivered at the next quiet, not before). Every collective, the ping-pong and
//!   the fused all-gather + GEMM must give bit for bit what the same world gives on
//!   one node, and the off-node path must have been taken (the engine's call count).
//! - **NVIDIA targets**: the communicating kernels compile with NVSHMEM's device
//!   bitcode linked in (`TESSERA_NVSHMEM_HOME`, installed by `scripts/setup.sh`) and
//!   assemble with `ptxas` for sm_80, sm_90 and sm_90a, with no call left unresolved.
//! - What cannot work fails cleanly: NVSHMEM on AMD, rocSHMEM (absent), a missing or
//!   unreadable device library, a GPU world placed on several nodes.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::aot::CommEngine;
use tessera::aot::{AmdArch, CompileOptions, Target, compile_kernel};
use tessera::codegen::tools;
use tessera::prelude::*;
use tessera::{EmuKind, Error};
use tessera_tests::kernels::ping_pong;

fn emu_world(n: usize, per_node: Option<usize>) -> World {
    let d = Device::emu(EmuKind::Nv).expect("the emulator is always available");
    let w = World::local(n)
        .on(&d)
        .heap_bytes(4 << 20)
        .signal_bytes(64 << 10)
        .wait_timeout(Duration::from_secs(30));
    match per_node {
        Some(k) => w.ranks_per_node(k),
        None => w,
    }
}

/// Taken by every test that counts or makes off-node engine calls: the count is
/// per process, and the tests of this file run at once.
fn engine_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn random_f32(seed: u64, n: usize) -> Vec<f32> {
    let mut r = StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-8.0f32..8.0)).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// What one rank computes in [`collectives_on`]: every all-reduce algorithm, an
/// all-gather, a reduce-scatter and a broadcast, on random data (poisoned outputs).
fn rank_results(r: &Rank) -> Result<Vec<Vec<u32>>, Error> {
    let me = r.rank() as u64;
    let ws = r.size() as usize;
    let mut out = Vec::new();
    for (i, algo) in [
        AllReduceAlgo::OneShot,
        AllReduceAlgo::TwoShot,
        AllReduceAlgo::LowLatency,
    ]
    .into_iter()
    .enumerate()
    {
        let mut b = r.upload(&random_f32(100 + 10 * i as u64 + me, 300))?;
        r.all_reduce_with(&mut b, ReduceOp::Sum, algo)?;
        out.push(bits(&b.download()?));
    }
    let input = r.upload(&random_f32(200 + me, 77))?;
    let mut g = r.upload(&vec![f32::NAN; 77 * ws])?;
    r.all_gather(&input, &mut g)?;
    out.push(bits(&g.download()?));
    let input = r.upload(&random_f32(300 + me, 50 * ws))?;
    let mut s = r.upload(&[f32::NAN; 50])?;
    r.reduce_scatter(&input, &mut s, ReduceOp::Max)?;
    out.push(bits(&s.download()?));
    let mut b = r.upload(&if me == 1 {
        random_f32(400, 64)
    } else {
        vec![f32::NAN; 64]
    })?;
    r.broadcast(&mut b, 1)?;
    out.push(bits(&b.download()?));
    Ok(out)
}

fn collectives_on(per_node: Option<usize>) -> Vec<Vec<Vec<u32>>> {
    emu_world(4, per_node)
        .run(rank_results)
        .unwrap_or_else(|e| panic!("{per_node:?} ranks per node: {e}"))
}

#[test]
fn collectives_across_emulated_nodes_match_one_node() {
    let _engine = engine_lock();
    let one = collectives_on(None);
    let before = tessera::codegen::emu::engine_ops_total();
    let two = collectives_on(Some(2));
    let mid = tessera::codegen::emu::engine_ops_total();
    let four = collectives_on(Some(1));
    let after = tessera::codegen::emu::engine_ops_total();
    assert!(
        mid > before,
        "2 nodes: no off-node operation took the engine"
    );
    assert!(
        after > mid,
        "4 nodes: no off-node operation took the engine"
    );
    for (name, got) in [("2 nodes", &two), ("4 nodes", &four)] {
        for (r, (g, w)) in got.iter().zip(&one).enumerate() {
            assert_eq!(g, w, "{name}, rank {r}: differs from one node");
        }
    }
    // The one-node all-reduce is the f32 rank-order sum (the collectives' own suite
    // checks every case; this guards the comparison against a shared failure).
    for i in [0usize, 151, 299] {
        let sum = (0..4u64).fold(None, |acc: Option<f32>, q| {
            let x = random_f32(100 + q, 300)[i];
            Some(acc.map_or(x, |a| a + x))
        });
        assert_eq!(one[0][0][i], sum.expect("4 ranks").to_bits(), "element {i}");
    }
}

/// Every program of every rank: `barrier_all`, a remote atomic add on rank 0's
/// counter, a put of its tile to the next rank with a signal, a wait, and a second
/// `barrier_all` before reading the counter (every add is in).
#[kernel]
fn ring_count<const B: usize>(
    src: &Symmetric<f32>,
    dst: &mut Symmetric<f32>,
    sig: &mut Symmetric<u64>,
    counter: &mut Symmetric<u32>,
    out: &mut Global<f32>,
) {
    barrier_all();
    let me = rank();
    let right = (me + 1) % world_size();
    let pid = program_id(0);
    let offs = pid * B as i32 + arange::<B>();
    let all = offs.ge(0);
    let mut c = counter.on(0);
    c.atomic_add(pid, zeros::<u32, ()>() + 1u32, me.ge(0));
    let v = src.load(offs, all);
    dst.put_signal(right, offs, v, all, sig, pid, 1u64, SignalOp::Set);
    sig.wait_until(pid, CmpPred::Ge, 1u64);
    barrier_all();
    let n = counter.on(0).load(pid, me.ge(0));
    let got = dst.load(offs, all);
    out.store(offs, got + n.cast::<f32>(), all);
}

#[test]
fn barrier_atomics_and_puts_across_emulated_nodes() {
    let _engine = engine_lock();
    const B: usize = 64;
    const P: u32 = 3;
    let run = |per_node: Option<usize>| {
        emu_world(4, per_node)
            .run(|r| {
                let me = r.rank() as u64;
                let src = r.upload(&random_f32(700 + me, B * P as usize))?;
                let mut dst = r.upload(&vec![f32::NAN; B * P as usize])?;
                let mut sig = r.alloc_signals(P as usize)?;
                let mut counter = r.upload(&vec![0u32; P as usize])?;
                let mut out = r.device().upload(&vec![f32::NAN; B * P as usize])?;
                r.barrier()?;
                ring_count::<B>::launch(
                    r.device(),
                    P,
                    (&src, &mut dst, &mut sig, &mut counter, &mut out),
                )?;
                out.download()
            })
            .unwrap_or_else(|e| panic!("{per_node:?}: {e}"))
    };
    let one = run(None);
    for (r, got) in one.iter().enumerate() {
        let left = (r + 3) % 4;
        let want: Vec<f32> = random_f32(700 + left as u64, B * P as usize)
            .iter()
            .map(|x| x + 4.0)
            .collect();
        assert_eq!(bits(got), bits(&want), "one node, rank {r}");
    }
    let before = tessera::codegen::emu::engine_ops_total();
    let split = run(Some(2));
    assert!(tessera::codegen::emu::engine_ops_total() > before);
    assert_eq!(one, split, "2 nodes differ from one");
}

#[test]
fn ping_pong_across_emulated_nodes() {
    let _engine = engine_lock();
    const B: usize = 64;
    let init = random_f32(9, B);
    let out = emu_world(2, Some(1))
        .run(|r| {
            let mut data = r.upload(&if r.rank() == 0 {
                init.clone()
            } else {
                vec![f32::NAN; B]
            })?;
            let mut sig = r.alloc_signals(2)?;
            ping_pong::<B>::launch(r.device(), 1u32, (&mut data, &mut sig, 5))?;
            data.download()
        })
        .expect("ping-pong across two emulated nodes");
    let want: Vec<f32> = init.iter().map(|x| x + 5.0).collect();
    assert_eq!(out[0], want);
    let last: Vec<f32> = init.iter().map(|x| x + 4.0).collect();
    assert_eq!(out[1], last);
}

#[test]
fn fused_all_gather_gemm_across_emulated_nodes() {
    let _engine = engine_lock();
    let (ms, n, k) = (64, 64, 64);
    let run = |per_node: Option<usize>| {
        emu_world(2, per_node)
            .run(|r| {
                let me = r.rank() as u64;
                let a: Vec<f32> = random_f32(500 + me, ms * k);
                let b: Vec<f32> = random_f32(600, k * n);
                let mut plan = tessera::fused::AgGemm::<f32>::new(r, ms, n, k)?;
                let a = r.device().upload(&a)?;
                let b = r.device().upload(&b)?;
                let mut c = r.device().upload(&vec![f32::NAN; 2 * ms * n])?;
                plan.run(r, &a, &b, &mut c)?;
                Ok(bits(&c.download()?))
            })
            .unwrap_or_else(|e| panic!("{per_node:?}: {e}"))
    };
    let one = run(None);
    let two = run(Some(1));
    assert_eq!(
        one, two,
        "the fused AG-GEMM across nodes differs from one node"
    );
    assert!(
        one[0].iter().all(|&x| !f32::from_bits(x).is_nan()),
        "unwritten output"
    );
}

/// One all-reduce (Sum) and one all-gather of `n` elements with the given
/// algorithms; every rank's results as bits.
fn hier_calls(
    r: &Rank,
    n: usize,
    ar: AllReduceAlgo,
    ag: AllGatherAlgo,
) -> Result<Vec<Vec<u32>>, Error> {
    let me = r.rank() as u64;
    let ws = r.size() as usize;
    let mut b = r.upload(&random_f32(800 + me, n))?;
    r.all_reduce_with(&mut b, ReduceOp::Sum, ar)?;
    let input = r.upload(&random_f32(900 + me, n))?;
    let mut g = r.upload(&vec![f32::NAN; n * ws])?;
    r.all_gather_with(&input, &mut g, ag)?;
    Ok(vec![bits(&b.download()?), bits(&g.download()?)])
}

/// The hierarchical collectives against the flat ones on 2 emulated nodes of 2, at a
/// ragged size (masks keep every access scalar: one `nvshmem_uintN_p`/`_g` per
/// element) and a multiple of 16 (a thread's run of 4 contiguous f32 is one
/// `nvshmem_putmem`/`_getmem`).
fn hier_against_flat(n: usize) -> (u64, u64) {
    let emu = |ar, ag| {
        let before = tessera::codegen::emu::engine_ops_total();
        let out = emu_world(4, Some(2))
            .run(|r| hier_calls(r, n, ar, ag))
            .unwrap_or_else(|e| panic!("n={n}, {ar:?} {ag:?}: {e}"));
        (out, tessera::codegen::emu::engine_ops_total() - before)
    };
    let (hier, hier_ops) = emu(AllReduceAlgo::Hierarchical, AllGatherAlgo::Hierarchical);
    let (flat, flat_ops) = emu(AllReduceAlgo::TwoShot, AllGatherAlgo::Flat);
    // The reference interpreter on CPU ranks placed the same way: same order, same bits.
    let cpu = World::local(4)
        .ranks_per_node(2)
        .heap_bytes(4 << 20)
        .run(|r| {
            hier_calls(
                r,
                n,
                AllReduceAlgo::Hierarchical,
                AllGatherAlgo::Hierarchical,
            )
        })
        .expect("CPU ranks");
    assert_eq!(
        hier, cpu,
        "n={n}: the emulator's hierarchical collectives differ from the interpreter's"
    );
    for (r, (h, f)) in hier.iter().zip(&flat).enumerate() {
        assert_eq!(
            h[1], f[1],
            "n={n}, rank {r}: the hierarchical all-gather differs from the flat one"
        );
        assert!(
            h[1].iter().all(|&x| !f32::from_bits(x).is_nan()),
            "n={n}, rank {r}: unwritten output"
        );
    }
    eprintln!("n={n}: engine calls: hierarchical {hier_ops}, flat {flat_ops}");
    (hier_ops, flat_ops)
}

#[test]
fn hierarchical_collectives_cross_nodes_once_per_node() {
    let _engine = engine_lock();
    // Off-node element transfers per rank: the flat two-shot reads and pushes a
    // quarter of the buffer to each of 2 off-node ranks (N), the flat all-gather
    // pushes the input to both (2N); the hierarchical ones read one node's partial of
    // half the buffer (N/2) and push the input to one rank (N).
    let (hier, flat) = hier_against_flat(2500);
    assert!(
        hier * 10 < flat * 6,
        "n=2500: hierarchical: {hier} off-node engine calls, flat: {flat}"
    );
    let (hier_v, flat_v) = hier_against_flat(2560);
    assert!(
        hier_v * 10 < flat_v * 6,
        "n=2560: hierarchical: {hier_v} off-node engine calls, flat: {flat_v}"
    );
    // Contiguous runs travel whole: a quarter of the calls, or nearly.
    assert!(
        hier_v * 3 < hier && flat_v * 3 < flat,
        "contiguous runs did not travel as one call each: {hier_v} and {flat_v} calls for 2560 elements, {hier} and {flat} for 2500"
    );
}

#[test]
fn a_world_on_several_nodes_needs_an_engine_the_target_has() {
    // emu-amd: rocSHMEM is not there; the error says what is missing.
    let d = Device::emu(EmuKind::Amd).expect("emulator");
    let e = World::local(2)
        .on(&d)
        .ranks_per_node(1)
        .run(|r| {
            let mut sig = r.alloc_signals(2)?;
            let mut data = r.upload(&vec![1.0f32; 64])?;
            ping_pong::<64>::launch(r.device(), 1u32, (&mut data, &mut sig, 1))?;
            Ok(())
        })
        .expect_err("rocSHMEM is absent");
    assert!(e.to_string().contains("rocSHMEM"), "{e}");
    // A node of no ranks.
    let e = emu_world(2, Some(0))
        .run(|_| Ok(()))
        .expect_err("0 ranks per node");
    assert!(e.to_string().contains("ranks_per_node(0)"), "{e}");
}

/// The communicating kernels of `tests/tests/codegen_offline.rs`, compiled with the
/// NVSHMEM engine: the device library is linked (its state global is in the PTX, no
/// NVSHMEM function is left external) and ptxas assembles the result.
#[test]
fn nvshmem_linked_kernels_assemble() {
    type F = fn(Target, &CompileOptions) -> Result<tessera::aot::Artifact, Error>;
    fn c<K: Kernel<Comptime = ()>>(
        t: Target,
        o: &CompileOptions,
    ) -> Result<tessera::aot::Artifact, Error> {
        compile_kernel::<K>(&(), t, o)
    }
    // Specialized as a launch with aligned buffers and sizes that are multiples of
    // 16: threads hold contiguous runs, which travel as `nvshmem_putmem`/`_getmem`.
    fn c16<K: Kernel<Comptime = ()>>(
        t: Target,
        o: &CompileOptions,
    ) -> Result<tessera::aot::Artifact, Error> {
        let spec = tessera::aot::Specialization::AllDivisible;
        tessera::aot::compile_kernel_specialized::<K>(&(), &spec, t, o)
    }
    let kernels: [(&str, F); 4] = [
        ("ping_pong", c::<ping_pong<64>>),
        (
            "ag_gemm_f16",
            c::<
                tessera::fused::ag_gemm_kernel<
                    f16,
                    { tessera::fused::BM },
                    { tessera::fused::BN },
                    { tessera::fused::BK },
                >,
            >,
        ),
        (
            "ag_gemm_f16 (aligned)",
            c16::<
                tessera::fused::ag_gemm_kernel<
                    f16,
                    { tessera::fused::BM },
                    { tessera::fused::BN },
                    { tessera::fused::BK },
                >,
            >,
        ),
        (
            "gemm_rs_f16",
            c::<
                tessera::fused::gemm_rs_kernel<
                    f16,
                    { tessera::fused::BM },
                    { tessera::fused::BN },
                    { tessera::fused::BK },
                >,
            >,
        ),
    ];
    let nv = CompileOptions {
        engine: CommEngine::Nvshmem,
        ..CompileOptions::default()
    };
    if let Err(e) = tessera::codegen::nvshmem::device_bitcode(90) {
        panic!(
            "{e}\n(scripts/setup.sh installs NVSHMEM's device library and scripts/test.sh sets TESSERA_NVSHMEM_HOME)"
        );
    }
    let mut failures = Vec::new();
    for (name, f) in kernels {
        for t in [Target::nvptx(80), Target::nvptx(90), Target::SM90A] {
            let t0 = std::time::Instant::now();
            let direct = f(t, &CompileOptions::default()).expect("direct");
            let direct_s = t0.elapsed().as_secs_f64();
            let t0 = std::time::Instant::now();
            let art = match f(t, &nv) {
                Ok(a) => a,
                Err(e) => {
                    failures.push(format!("{name} {t}: {e}"));
                    continue;
                }
            };
            println!(
                "{name} {t}: linked and compiled in {:.2} s (without NVSHMEM: {direct_s:.2} s), PTX {} KiB (without: {} KiB)",
                t0.elapsed().as_secs_f64(),
                art.asm.len() / 1024,
                direct.asm.len() / 1024
            );
            // What the CUDA backend tests to initialize the module for NVSHMEM.
            if !tessera::world::nvshmem::links_device_library(&art.asm) {
                failures.push(format!(
                    "{name} {t}: NVSHMEM's device state is not in the PTX"
                ));
            }
            if tessera::world::nvshmem::links_device_library(&direct.asm)
                || direct.asm.contains("nvshmem")
            {
                failures.push(format!("{name} {t}: the direct kernel mentions NVSHMEM"));
            }
            if art
                .asm
                .lines()
                .any(|l| l.contains(".extern") && l.contains("nvshmem"))
            {
                failures.push(format!(
                    "{name} {t}: an NVSHMEM function is left unresolved"
                ));
            }
            if let Err(e) = tools::ptxas(&art.asm, &t.to_string()) {
                failures.push(format!("{name} {t}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A kernel precompiled for NVSHMEM is stored under the key a launch on a world
/// across nodes looks up (`KernelOptions::off_node`), and only there; the runtime
/// recognizes its PTX as needing NVSHMEM's module initialization.
#[test]
fn off_node_artifacts_have_keys_of_their_own() {
    use tessera::{ArtifactStore, KernelOptions, aot::Specialization};
    let dir = tempfile::tempdir().unwrap();
    let store = ArtifactStore::new(dir.path());
    let nv = CompileOptions {
        engine: CommEngine::Nvshmem,
        ..CompileOptions::default()
    };
    let spec = Specialization::None;
    tessera::aot::precompile::<ping_pong<64>>(&(), &spec, Target::nvptx(90), &nv, &store).unwrap();
    let off = KernelOptions {
        off_node: true,
        ..KernelOptions::default()
    };
    let bin = store
        .find::<ping_pong<64>>(&(), &spec, "sm_90", &off)
        .expect("found under the off-node key");
    let ptx = String::from_utf8(bin.binary).unwrap();
    assert!(tessera::world::nvshmem::links_device_library(&ptx));
    assert!(
        store
            .find::<ping_pong<64>>(&(), &spec, "sm_90", &KernelOptions::default())
            .is_err(),
        "a one-node launch must not find the NVSHMEM kernel"
    );
}

#[test]
fn engines_a_target_lacks_fail_cleanly() {
    let opts = |engine| CompileOptions {
        engine,
        ..CompileOptions::default()
    };
    let amd = Target::Amdgpu(AmdArch::Gfx942);
    let e = compile_kernel::<ping_pong<64>>(&(), amd, &opts(CommEngine::Nvshmem))
        .expect_err("NVSHMEM on AMD");
    assert!(e.to_string().contains("NVIDIA GPUs only"), "{e}");
    let e = compile_kernel::<ping_pong<64>>(&(), amd, &opts(CommEngine::Rocshmem))
        .expect_err("rocSHMEM is absent");
    assert!(e.to_string().contains("rocSHMEM"), "{e}");
    let e = compile_kernel::<ping_pong<64>>(&(), Target::nvptx(90), &opts(CommEngine::Rocshmem))
        .expect_err("rocSHMEM on NVIDIA");
    assert!(e.to_string().contains("AMD GPUs only"), "{e}");
    // Kernels that do not communicate compile with any engine, unchanged.
    type Mm = tessera_tests::kernels::matmul_residual<64, 64, 32>;
    let plain = compile_kernel::<Mm>(&(), amd, &CompileOptions::default()).expect("direct");
    let with = compile_kernel::<Mm>(&(), amd, &opts(CommEngine::Rocshmem)).expect("no comm");
    assert_eq!(plain.asm, with.asm);
}

/// NVSHMEM's host library (installed with the device bitcode by `scripts/setup.sh`):
/// it loads, rank 0 draws a unique id, and the TCP rendezvous hands it to every rank
/// of a 4-rank job on loopback; initializing without a GPU is a clean error, before
/// NVSHMEM is called; a folder without the library is named in the error.
#[test]
fn nvshmem_host_library_bootstraps_a_unique_id() {
    use tessera::world::nvshmem::{self, NvshmemHost, UniqueId};
    let host = NvshmemHost::load().unwrap_or_else(|e| panic!("{e} (run scripts/setup.sh)"));
    assert!(host.path().ends_with(nvshmem::HOST_LIBRARY), "{host:?}");
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = free.local_addr().expect("its address").to_string();
    drop(free);
    let ids: Vec<UniqueId> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4u32)
            .map(|r| {
                let (host, addr) = (&host, &addr);
                s.spawn(move || {
                    nvshmem::bootstrap_unique_id(
                        host,
                        addr,
                        r,
                        4,
                        b"job secret",
                        Duration::from_secs(20),
                    )
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .expect("no panic")
                    .expect("the unique id's rendezvous")
            })
            .collect()
    });
    assert_eq!(ids[0].version(), UniqueId::VERSION, "{:?}", ids[0]);
    assert!(ids[0].0[4..].iter().any(|&b| b != 0), "an empty unique id");
    assert!(
        ids.iter().all(|id| *id == ids[0]),
        "the ranks got different ids"
    );
    // A second draw is another id (it names a fresh bootstrap endpoint).
    let again = host.unique_id().expect("a second id");
    assert_ne!(again, ids[0]);
    // No GPU here: a clean error, NVSHMEM not called.
    let cpu = Device::cpu();
    let e = host.init(0, 1, &ids[0], &cpu).expect_err("no CUDA device");
    assert!(e.to_string().contains("NVSHMEM"), "{e}");
    // A folder without the library.
    let empty = tempfile::tempdir().expect("a temporary folder");
    let e = NvshmemHost::load_from(empty.path()).expect_err("no library there");
    let msg = e.to_string();
    assert!(
        msg.contains(nvshmem::HOST_LIBRARY) && msg.contains(&empty.path().display().to_string()),
        "{msg}"
    );
}
