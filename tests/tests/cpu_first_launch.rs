//! A kernel's first launch on the compiled CPU device: compiled code kept in the disk
//! cache and linked by a later process without compiling (a damaged entry compiled
//! again), and a launch whose code is not ready run in turns by the interpreter and
//! the compiled code (`TESSERA_CPU_JIT=background`), each program once.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::codegen::cpu::{self, Checks, CpuError, CpuLaunch, ObjectStore};
use tessera::ir::interp::{self, HostBuffer, InterpError, KernelArg, Scalar};
use tessera::prelude::*;

/// `out[i] += x[i] * S + i` over tiles of `B`: each program reads the elements it
/// writes, so a program run twice (or not at all) shows in every one of them.
#[kernel]
fn accumulate<const B: usize, const S: i32>(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
    let offs = program_id(0) * B + arange::<B>();
    let mask = offs.lt(n);
    let v = x.load(offs, mask) * (S as f32) + offs.cast::<f32>();
    out.store(offs, out.load(offs, mask) + v, mask);
}

/// `y[r] = sum(x[r, :])` for rows of `n` (at most `B`) columns.
#[kernel]
fn row_sums<const B: usize>(x: &Global<f32>, y: &mut Global<f32>, n: i32) {
    let r = program_id(0);
    let c = arange::<B>();
    let v = x.load_or(r * n + c, c.lt(n), 0.0);
    y.store_unmasked(r, v.sum::<0>());
}

/// The environment variable that makes a test run as a child process of another.
const CHILD: &str = "TESSERA_FIRST_LAUNCH_CHILD";

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-3.0f32..3.0)).collect()
}

/// `accumulate` and `row_sums` launched on `Device::cpu()`, each checked in full
/// against the host (outputs poisoned or random first). Prints this process's LLVM
/// compilations.
fn launch_and_check() {
    let dev = Device::cpu();
    let n = 5000usize;
    let xs = random(n, 1);
    let init = random(n, 2);
    let x = dev.upload(&xs).unwrap();
    let mut out = dev.upload(&init).unwrap();
    accumulate::<256, 3>::launch(&dev, n.div_ceil(256), (&x, &mut out, n as i32)).unwrap();
    let got = out.download().unwrap();
    for i in 0..n {
        let want = init[i] + (xs[i] * 3.0 + i as f32);
        assert_eq!(got[i], want, "accumulate [{i}]");
    }
    let (rows, cols) = (300usize, 200usize);
    let m = random(rows * cols, 3);
    let x = dev.upload(&m).unwrap();
    let mut y = dev.upload(&vec![f32::NAN; rows]).unwrap();
    row_sums::<256>::launch(&dev, rows, (&x, &mut y, cols as i32)).unwrap();
    let got = y.download().unwrap();
    for r in 0..rows {
        let want: f64 = m[r * cols..(r + 1) * cols].iter().map(|&v| v as f64).sum();
        assert!(
            (got[r] as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
            "row_sums [{r}] = {}, want {want}",
            got[r]
        );
    }
    println!("compilations={}", cpu::compilations());
}

/// The body run by the child processes (a no-op when run directly).
#[test]
fn child_body() {
    if std::env::var_os(CHILD).is_some() {
        launch_and_check();
    }
}

/// Runs `child_body` in a process of its own with the disk cache at `dir` and
/// `TESSERA_CPU_JIT=jit`; returns its LLVM compilations.
fn child(dir: &std::path::Path, jit: &str) -> u64 {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_body",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, "1")
        .env("TESSERA_CACHE_DIR", dir)
        .env("TESSERA_CPU_JIT", jit)
        .env_remove("TESSERA_SANITIZE")
        .output()
        .expect("spawn the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.split("compilations=").nth(1))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no count in the child's output:\n{stdout}"))
}

fn entries(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[test]
fn a_second_process_links_the_cached_kernels_and_compiles_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    assert_eq!(
        child(&dir, "wait"),
        2,
        "the first process compiles both kernels"
    );
    assert_eq!(entries(&dir).len(), 2, "{:?}", entries(&dir));
    assert_eq!(child(&dir, "wait"), 0, "the second compiles nothing");
    // In the background mode too (the code is ready: nothing is interpreted).
    assert_eq!(child(&dir, "background"), 0);
    // A damaged entry (the cache's checksum fails) is compiled again and replaced.
    for e in entries(&dir) {
        let mut b = std::fs::read(&e).unwrap();
        let last = b.len() - 1;
        b[last] ^= 0x55;
        std::fs::write(&e, b).unwrap();
    }
    assert_eq!(child(&dir, "wait"), 2);
    assert_eq!(child(&dir, "wait"), 0);
}

#[test]
fn a_first_process_in_the_background_mode_leaves_its_kernels_cached() {
    // The launches may end on the interpreter before LLVM is done (so the count the
    // child prints is whatever had finished by then); the process waits for its
    // compilations at exit, so the next one finds both.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    assert!(child(&dir, "background") <= 2);
    assert_eq!(entries(&dir).len(), 2, "{:?}", entries(&dir));
    assert_eq!(child(&dir, "background"), 0);
}

/// A store holding given bytes for every key, recording what it is told.
#[derive(Default)]
struct Store {
    give: Option<Vec<u8>>,
    put: Mutex<Vec<Vec<u8>>>,
    removed: AtomicU64,
}

impl ObjectStore for Store {
    fn get(&self, _: &str, _: &str) -> Option<Vec<u8>> {
        self.give.clone()
    }
    fn put(&self, _: &str, _: &str, bytes: &[u8]) {
        self.put.lock().unwrap().push(bytes.to_vec());
    }
    fn remove(&self, _: &str, _: &str) {
        self.removed.fetch_add(1, Ordering::Relaxed);
    }
}

fn run_accumulate(k: &cpu::CpuKernel, n: usize, scale: f32) {
    let xs = random(n, 9);
    let init = random(n, 10);
    let out = Arc::new(HostBuffer::from_slice(&init));
    let args = [
        KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&xs))),
        KernelArg::Buffer(Arc::clone(&out)),
        KernelArg::Scalar(Scalar::I32(n as i32)),
    ];
    let grid = [n.div_ceil(64) as u32, 1, 1];
    cpu::launch_with(
        k,
        &CpuLaunch {
            grid,
            args: &args,
            ..Default::default()
        },
    )
    .unwrap();
    let got = out.to_vec::<f32>().unwrap();
    for i in 0..n {
        assert_eq!(got[i], init[i] + (xs[i] * scale + i as f32), "[{i}]");
    }
}

#[test]
fn an_unusable_stored_kernel_is_removed_and_compiled_again() {
    // Each case its own kernel (the process keeps what it compiled by IR).
    let garbage = Store {
        give: Some(b"TSRCPUO1 and then nothing a kernel needs".to_vec()),
        ..Store::default()
    };
    let f = tessera::kernel_ir::<accumulate<64, 5>>(&()).unwrap();
    let before = cpu::compilations();
    let k = cpu::compile_with(&f, Checks::BOUNDS, Some(&garbage)).unwrap();
    assert_eq!(cpu::compilations(), before + 1);
    assert_eq!(garbage.removed.load(Ordering::Relaxed), 1);
    assert_eq!(
        garbage.put.lock().unwrap().len(),
        1,
        "the new code is stored"
    );
    run_accumulate(&k, 1000, 5.0);

    // A well-formed entry whose object is cut short: linking fails, so it is
    // compiled again.
    let mut bytes = garbage.put.lock().unwrap()[0].clone();
    bytes.truncate(bytes.len() - 200);
    let cut = Store {
        give: Some(bytes),
        ..Store::default()
    };
    let f = tessera::kernel_ir::<accumulate<64, 6>>(&()).unwrap();
    let before = cpu::compilations();
    let k = cpu::compile_with(&f, Checks::BOUNDS, Some(&cut)).unwrap();
    assert_eq!(cpu::compilations(), before + 1);
    assert_eq!(cut.removed.load(Ordering::Relaxed), 1);
    run_accumulate(&k, 1000, 6.0);
}

/// Runs `accumulate<64, 7>` over `total` programs: the first `split` on the
/// interpreter ([`interp::run_claimed`]), the rest compiled
/// ([`cpu::launch_with`] with a [`CpuLaunch::claim`]), as a background-mode launch does.
fn in_turns(
    n: usize,
    split: u64,
    out_len: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>, Result<(), String>) {
    let f = tessera::kernel_ir::<accumulate<64, 7>>(&()).unwrap();
    let k = cpu::compile(&f, Checks::BOUNDS).unwrap();
    let xs = random(n, 11);
    let init = random(out_len, 12);
    let out = Arc::new(HostBuffer::from_slice(&init));
    let args = [
        KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&xs))),
        KernelArg::Buffer(Arc::clone(&out)),
        KernelArg::Scalar(Scalar::I32(n as i32)),
    ];
    let total = n.div_ceil(64) as u64;
    let grid = [total as u32, 1, 1];
    let next = AtomicU64::new(0);
    let take = |limit: u64| {
        let next = &next;
        move || {
            // As the launch's claim does: fetch first, then test (ids past the end
            // are dropped by the drivers).
            let lin = next.fetch_add(1, Ordering::Relaxed);
            (lin < limit).then_some(lin)
        }
    };
    let first = interp::run_claimed(&f, grid, &args, None, &take(split)).map_err(|e| e.to_string());
    // The interpreter's loop took one id past its limit before it stopped.
    let at = next.load(Ordering::Relaxed).min(split);
    next.store(at, Ordering::Relaxed);
    let r = first.and_then(|()| {
        let claim = take(total);
        let launch = CpuLaunch {
            grid,
            args: &args,
            claim: Some(&claim),
            ..Default::default()
        };
        cpu::launch_with(&k, &launch).map_err(|e| e.to_string())
    });
    (xs, init, out.to_vec::<f32>().unwrap(), r)
}

#[test]
fn programs_run_in_turns_run_each_once() {
    let n: usize = 64 * 40 + 17;
    let total = n.div_ceil(64) as u64;
    for split in [0, 1, 13, total - 1, total] {
        let (xs, init, got, r) = in_turns(n, split, n);
        r.unwrap_or_else(|e| panic!("split {split}: {e}"));
        for i in 0..n {
            assert_eq!(
                got[i],
                init[i] + (xs[i] * 7.0 + i as f32),
                "split {split}: [{i}] (program {})",
                i / 64
            );
        }
    }
}

#[test]
fn a_failure_in_either_turn_is_reported_as_the_interpreter_reports_it() {
    // `out` is one element short: the last program reads and stores past its end,
    // whether the interpreter (split 10) or the compiled code (split 3) runs it.
    let n = 64 * 10;
    for split in [3, 10] {
        let (_, _, _, r) = in_turns(n, split, n - 1);
        let e = r.expect_err("out of bounds");
        assert!(
            e.contains("out-of-bounds") && e.contains("`out` (len 639) at program_id (9, 0, 0)"),
            "split {split}: {e}"
        );
    }
    // The same kernel and buffers on the interpreter alone say the same.
    let f = tessera::kernel_ir::<accumulate<64, 7>>(&()).unwrap();
    let args = [
        KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&vec![0f32; n]))),
        KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&vec![0f32; n - 1]))),
        KernelArg::Scalar(Scalar::I32(n as i32)),
    ];
    let e = interp::run(&f, [10, 1, 1], &args).unwrap_err();
    assert!(matches!(e, InterpError::OutOfBounds { .. }), "{e}");
}

/// A kernel whose programs wait for each other cannot be split.
#[kernel]
fn waits(sig: &mut Symmetric<u64>) {
    sig.wait_until(0, CmpPred::Ge, 1u64);
}

#[test]
fn a_kernel_that_waits_is_not_run_in_turns() {
    let f = tessera::kernel_ir::<waits>(&()).unwrap();
    let args = [KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&[0u64])))];
    let e = interp::run_claimed(&f, [2, 1, 1], &args, None, &|| None).unwrap_err();
    assert!(e.to_string().contains("cannot be run in turns"), "{e}");
    let k = cpu::compile(&f, Checks::BOUNDS).expect("a kernel that waits compiles");
    let launch = CpuLaunch {
        grid: [2, 1, 1],
        args: &args,
        claim: Some(&|| None),
        ..Default::default()
    };
    let e = cpu::launch_with(&k, &launch).unwrap_err();
    assert!(matches!(e, CpuError::Unsupported { .. }), "{e}");
}
