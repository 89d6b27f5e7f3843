//! The compiled CPU device against the interpreter, against itself without its
//! bounds checks (`Device::unchecked`: what the checks cost), and against what a
//! user would run instead, all measured in the same run: vector_add (f32, 4M), softmax and layernorm
//! (f32, 4096 x 1024), matmul (f32, 512³). Prints a table; run with
//! `cargo bench -p tessera --bench cpu`.
//!
//! The peers come from `scripts/cpu_peers.py` (numpy, and torch on the CPU when it is
//! installed), run with `TESSERA_BENCH_PYTHON` (default `python3`); without numpy the
//! table has the Rust baselines only (a plain loop, `matrixmultiply::sgemm` on one
//! thread). Every Tessera result is checked against a plain Rust reference first.

// Each example is included as a module; they share `examples/common`.
#![allow(clippy::duplicate_mod)]

#[path = "../../examples/layernorm.rs"]
#[allow(dead_code)]
mod layernorm;
#[path = "../../examples/matmul.rs"]
#[allow(dead_code)]
mod matmul;
#[path = "../../examples/softmax.rs"]
#[allow(dead_code)]
mod softmax;
#[path = "../../examples/vector_add.rs"]
#[allow(dead_code)]
mod vector_add;

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Duration;

use tessera::bench::Bench;
use tessera::prelude::*;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn lcg(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + ((s >> 40) as f32 / (1u64 << 24) as f32) * (hi - lo)
        })
        .collect()
}

/// The peers' medians: (case, implementation) -> seconds.
fn peers() -> HashMap<(String, String), f64> {
    let py = std::env::var("TESSERA_BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/cpu_peers.py");
    let out = match std::process::Command::new(&py).arg(script).output() {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            eprintln!(
                "# {py} {script} failed (no numpy?): {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            );
            return HashMap::new();
        }
        Err(e) => {
            eprintln!("# {py} not run: {e}");
            return HashMap::new();
        }
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ' ');
            let (name, t, imp) = (it.next()?, it.next()?, it.next()?);
            Some(((name.to_string(), imp.to_string()), t.parse().ok()?))
        })
        .collect()
}

/// Median seconds of `f` on each device, the devices taking turns run by run, in
/// alternating order (so a machine that slows down or speeds up during the
/// measurement, and the caches one leaves the other, affect them alike):
/// the checked compiled device against its unchecked self.
fn interleaved(
    reps: usize,
    devs: &[&Device],
    mut f: impl FnMut(&Device) -> Result<(), tessera::Error>,
) -> Res<Vec<f64>> {
    for d in devs {
        f(d)?;
    }
    let mut samples = vec![Vec::with_capacity(reps); devs.len()];
    for r in 0..reps {
        // Each order in turn: what runs first in a round meets its caches as the
        // other left them.
        let order: Vec<usize> = if r % 2 == 0 {
            (0..devs.len()).collect()
        } else {
            (0..devs.len()).rev().collect()
        };
        for i in order {
            let t0 = std::time::Instant::now();
            f(devs[i])?;
            samples[i].push(t0.elapsed().as_secs_f64());
        }
    }
    Ok(samples
        .into_iter()
        .map(|mut v| {
            v.sort_by(f64::total_cmp);
            v[(v.len() - 1) / 2]
        })
        .collect())
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

struct Table {
    rows: Vec<(String, String, f64, f64)>,
}

impl Table {
    fn add(&mut self, case: &str, imp: &str, t: f64, work: f64) {
        self.rows.push((case.into(), imp.into(), t, work));
    }
}

fn main() -> Res<()> {
    // Compiled code in its steady state: with a cold kernel cache, the default
    // (`CpuJit::Background`) starts each kernel on the interpreter while LLVM compiles,
    // and the first timed launches measured that (matmul 24.8 ms instead of 0.93 ms
    // with a stale cache); first launches have their own benchmark
    // (`scripts/first-launch.sh`).
    let cpu = Device::cpu().with_cpu_jit(tessera::config::CpuJit::Wait);
    let interp = Device::interp();
    // What the compiled device's bounds checks cost: the same launches without them.
    // SAFETY: every kernel below indexes inside its buffers (the same launches run
    // checked on `cpu`, and every result is compared with a reference).
    let unchecked = unsafe { cpu.unchecked() };
    const UNCHECKED: &str = "tessera compiled CPU, unchecked (unsafe)";
    let time = |reps| Bench::new().warmup(1).reps(reps);
    let secs = |d: Duration| d.as_secs_f64();
    let mut tab = Table { rows: Vec::new() };

    // vector_add, 4M f32: bytes moved.
    let n = 1 << 22;
    let (xs, ys) = (lcg(n, 1, -1.0, 1.0), lcg(n, 2, -1.0, 1.0));
    let mut plain = vec![0.0f32; n];
    let t = time(21).run(&cpu, || {
        let (a, b) = (black_box(&xs), black_box(&ys));
        for i in 0..n {
            plain[i] = a[i] + b[i];
        }
        black_box(&plain);
        Ok(())
    })?;
    tab.add(
        "vector_add",
        "plain Rust loop (1 thread)",
        secs(t.median()),
        12.0 * n as f64,
    );
    let (x, y) = (cpu.upload(&xs)?, cpu.upload(&ys)?);
    let mut out = cpu.alloc::<f32>(n)?;
    let add = |dev: &Device, out: &mut Buffer<f32>| {
        vector_add::vector_add::<1024>::launch(dev, n.div_ceil(1024), (&x, &y, out, n as i32))
    };
    let ts = interleaved(41, &[&cpu, &unchecked], |d| add(d, &mut out))?;
    tab.add("vector_add", "tessera compiled CPU", ts[0], 12.0 * n as f64);
    tab.add("vector_add", UNCHECKED, ts[1], 12.0 * n as f64);
    let t = time(5).run(&interp, || add(&interp, &mut out))?;
    tab.add(
        "vector_add",
        "tessera interpreter",
        secs(t.median()),
        12.0 * n as f64,
    );
    for dev in [&cpu, &unchecked, &interp] {
        out.fill(f32::NAN)?;
        add(dev, &mut out)?;
        assert_eq!(out.download()?, plain, "vector_add on {dev:?}");
    }

    // softmax and layernorm, 4096 x 1024 f32: bytes read and written.
    let (rows, cols) = (4096usize, 1024usize);
    let ss = lcg(rows * cols, 3, -3.0, 5.0);
    let ws = lcg(cols, 4, 0.5, 1.5);
    let bs = lcg(cols, 5, -1.0, 1.0);
    let want_sm: Vec<f32> = softmax::reference(&ss, rows, cols)
        .into_iter()
        .map(|v| v as f32)
        .collect();
    let s = cpu.upload(&ss)?;
    let (w, b) = (cpu.upload(&ws)?, cpu.upload(&bs)?);
    let mut so = cpu.alloc::<f32>(rows * cols)?;
    let (mut yo, mut mo, mut ro) = (
        cpu.alloc::<f32>(rows * cols)?,
        cpu.alloc::<f32>(rows)?,
        cpu.alloc::<f32>(rows)?,
    );
    // The layernorm reference, in f64.
    let mut want_ln = vec![0.0f32; rows * cols];
    for r in 0..rows {
        let row = &ss[r * cols..(r + 1) * cols];
        let mu = row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
        let var = row.iter().map(|&v| (v as f64 - mu).powi(2)).sum::<f64>() / cols as f64;
        let rstd = 1.0 / (var + 1e-5).sqrt();
        for c in 0..cols {
            want_ln[r * cols + c] =
                ((row[c] as f64 - mu) * rstd * ws[c] as f64 + bs[c] as f64) as f32;
        }
    }
    let sm = |dev: &Device, so: &mut Buffer<f32>| {
        softmax::softmax::<f32, 4, 1024>::launch(
            dev,
            rows.div_ceil(4),
            (&s, so, rows as i32, cols as i32),
        )
    };
    let ts = interleaved(15, &[&cpu, &unchecked], |d| sm(d, &mut so))?;
    let work = 8.0 * (rows * cols) as f64;
    tab.add("softmax", "tessera compiled CPU", ts[0], work);
    tab.add("softmax", UNCHECKED, ts[1], work);
    let t = time(3).run(&interp, || sm(&interp, &mut so))?;
    tab.add("softmax", "tessera interpreter", secs(t.median()), work);
    for dev in [&cpu, &unchecked, &interp] {
        so.fill(f32::NAN)?;
        sm(dev, &mut so)?;
        let d = max_diff(&so.download()?, &want_sm);
        assert!(d < 1e-5, "softmax on {dev:?} differs by {d}");
    }
    let mut ln = |dev: &Device, yo: &mut Buffer<f32>| {
        layernorm::layernorm::<f32, 1024>::launch(
            dev,
            rows,
            (&s, &w, &b, yo, &mut mo, &mut ro, cols as i32, 1e-5f32),
        )
    };
    let ts = interleaved(15, &[&cpu, &unchecked], |d| ln(d, &mut yo))?;
    tab.add("layernorm", "tessera compiled CPU", ts[0], work);
    tab.add("layernorm", UNCHECKED, ts[1], work);
    let t = time(3).run(&interp, || ln(&interp, &mut yo))?;
    tab.add("layernorm", "tessera interpreter", secs(t.median()), work);
    for dev in [&cpu, &unchecked, &interp] {
        yo.fill(f32::NAN)?;
        ln(dev, &mut yo)?;
        let d = max_diff(&yo.download()?, &want_ln);
        assert!(d < 1e-4, "layernorm on {dev:?} differs by {d}");
    }

    // matmul 512³ f32: FLOPs.
    let m = 512usize;
    let (a, bm) = (lcg(m * m, 6, -1.0, 1.0), lcg(m * m, 7, -1.0, 1.0));
    let flops = 2.0 * (m * m * m) as f64;
    let mut c_mm = vec![0.0f32; m * m];
    let t = time(11).run(&cpu, || {
        // SAFETY: the pointers and strides describe the row-major a, b and c
        // (512 x 512 each) above, which outlive the call.
        unsafe {
            matrixmultiply::sgemm(
                m,
                m,
                m,
                1.0,
                a.as_ptr(),
                m as isize,
                1,
                bm.as_ptr(),
                m as isize,
                1,
                0.0,
                c_mm.as_mut_ptr(),
                m as isize,
                1,
            );
        }
        Ok(())
    })?;
    tab.add(
        "matmul",
        "matrixmultiply::sgemm (1 thread)",
        secs(t.median()),
        flops,
    );
    let (da, db) = (cpu.upload(&a)?, cpu.upload(&bm)?);
    let mut dc = cpu.alloc::<f32>(m * m)?;
    let mm = |dev: &Device, dc: &mut Buffer<f32>| {
        matmul::matmul::<f32, 64, 64, 32>::launch(
            dev,
            (m.div_ceil(64), m.div_ceil(64)),
            (&da, &db, dc, m as i32, m as i32, m as i32),
        )
    };
    let ts = interleaved(21, &[&cpu, &unchecked], |d| mm(d, &mut dc))?;
    tab.add("matmul", "tessera compiled CPU", ts[0], flops);
    tab.add("matmul", UNCHECKED, ts[1], flops);
    let t = time(3).run(&interp, || mm(&interp, &mut dc))?;
    tab.add("matmul", "tessera interpreter", secs(t.median()), flops);
    for dev in [&cpu, &unchecked, &interp] {
        dc.fill(f32::NAN)?;
        mm(dev, &mut dc)?;
        let d = max_diff(&dc.download()?, &c_mm);
        assert!(d < 1e-3, "matmul on {dev:?} differs by {d}");
    }

    for ((case, imp), t) in peers() {
        let work = tab.rows.iter().find(|r| r.0 == case).map_or(0.0, |r| r.3);
        tab.add(&case, &imp, t, work);
    }

    println!("# the compiled CPU device on {cpu}");
    println!();
    println!("| case | implementation | time | rate | compiled CPU's speed vs this |");
    println!("|---|---|---|---|---|");
    for case in ["vector_add", "softmax", "layernorm", "matmul"] {
        let ours = tab
            .rows
            .iter()
            .find(|r| r.0 == case && r.1 == "tessera compiled CPU")
            .map_or(f64::NAN, |r| r.2);
        for (c, imp, t, work) in tab.rows.iter().filter(|r| r.0 == case) {
            let rate = if c == "matmul" {
                format!("{:.1} GFLOP/s", work / t / 1e9)
            } else {
                format!("{:.1} GB/s", work / t / 1e9)
            };
            println!(
                "| {c} | {imp} | {:.3} ms | {rate} | {:.2}x |",
                t * 1e3,
                t / ours
            );
        }
    }
    Ok(())
}
