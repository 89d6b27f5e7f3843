//! The GPU check: every example kernel on a GPU against the CPU interpreter, then
//! communication as 2 processes on the GPU (heaps shared through the driver's IPC:
//! `ping_pong`, every all-reduce algorithm, the fused all-gather + GEMM) and, where
//! the machine has several GPUs, as one process per GPU; then benchmarks. Built
//! WITHOUT LLVM (`--no-default-features`): the kernels come precompiled from an
//! artifact store (`scripts/gpu-check.sh` packs both); a build with `jit` compiles
//! them at launch instead (the tests run it so on the emulators).
//!
//! ```sh
//! gpu_check --kernels <dir> [--device cuda:0] [--json out.json] [--no-bench] [--no-comm]
//! gpu_check --device emu-nv --no-bench --case bf16 --case f64   # some cases only
//! gpu_check --device cpu --no-bench --comm-devices cpu,cpu,cpu  # 3 ranks, one per device
//! gpu_check --kernels <dir> --no-bench --threads 4  # 4 ranks as threads on parts of
//!                               # the one device, and the litmus tests on 2 of them
//! gpu_check --kernels <dir> --target sm_90 --check-artifacts   # no GPU needed
//! gpu_check --nvshmem 2        # NVSHMEM's host side: 2 processes, one PE each
//! gpu_check --kernels k --nvshmem-world 2  # an NVSHMEM world of 2 processes, every
//!                               # peer through NVSHMEM: ping-pong and all-reduces
//! ```
//!
//! Exit status: 0 when every case passed, 1 on a mismatch or error, 2 when the device
//! is not available.

// The example kernels are included as modules; each also has its own `main`.
#![allow(clippy::duplicate_mod)]

#[path = "argmax.rs"]
#[allow(dead_code)]
mod ex_argmax;
#[path = "checked_gather.rs"]
#[allow(dead_code)]
mod ex_checked_gather;
#[path = "dropout.rs"]
#[allow(dead_code)]
mod ex_dropout;
#[path = "layernorm.rs"]
#[allow(dead_code)]
mod ex_layernorm;
#[path = "litmus.rs"]
#[allow(dead_code)]
mod ex_litmus;
#[path = "matmul.rs"]
#[allow(dead_code)]
mod ex_matmul;
#[path = "matmul_desc.rs"]
#[allow(dead_code)]
mod ex_matmul_desc;
#[path = "matmul_fp8.rs"]
#[allow(dead_code)]
mod ex_matmul_fp8;
#[path = "matmul_i8.rs"]
#[allow(dead_code)]
mod ex_matmul_i8;
#[path = "ping_pong.rs"]
#[allow(dead_code)]
mod ex_ping_pong;
#[path = "softmax.rs"]
#[allow(dead_code)]
mod ex_softmax;
#[path = "topk.rs"]
#[allow(dead_code)]
mod ex_topk;
#[path = "vector_add.rs"]
#[allow(dead_code)]
mod ex_vector_add;
#[path = "gpu_cases.rs"]
mod gpu_cases;

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::artifact::KernelOptions;
use tessera::bench::Bench;
use tessera::prelude::*;
use tessera::{ArtifactStore, DeviceKind, Specialization};

use ex_argmax::row_argmax;
use ex_checked_gather::checked_gather;
use ex_dropout::seeded_dropout;
use ex_layernorm::layernorm;
use ex_matmul::matmul;
use ex_matmul_desc::{
    matmul_desc, matmul_desc_persistent, matmul_desc_split_k, split_k_matmul, split_k_sum,
};
use ex_matmul_fp8::{matmul_fp8_bt, quantize};
use ex_matmul_i8::{matmul_i8, matmul_i8_bt};
use ex_ping_pong::ring_pass;
use ex_softmax::softmax;
use ex_topk::route;
use ex_vector_add::vector_add;
use gpu_cases::{bf16_axpb, f64_poly, histogram_system, row_cumsum};

const USAGE: &str = "usage: gpu_check --kernels <dir> [--device <cuda:N|hip:N|cpu>] \
                     [--json <file>] [--no-bench] [--no-comm] [--no-suite] [--case <name>]... \
                     [--comm-devices <d0,d1,...>] [--threads <ranks>]... [--threads-bench] [--litmus-iters <n>] \
                     [--target <t> --check-artifacts] [--nvshmem <ranks>] [--nvshmem-world <ranks>]";

struct Args {
    kernels: Option<PathBuf>,
    device: Option<String>,
    json: Option<PathBuf>,
    bench: bool,
    /// Runs the communication check (processes on the GPU).
    comm: bool,
    /// Runs the suite's cases (`--no-suite`: none).
    suite: bool,
    /// Runs only the suite's cases whose names contain one of these (all if empty).
    cases: Vec<String>,
    /// This process is one rank of the communication check (started by it).
    comm_rank: bool,
    /// The communication check on these devices only, one rank each.
    comm_devices: Vec<String>,
    /// The communication check as this many ranks (threads) on parts of the one
    /// device, once per entry, then the litmus tests ([`threads_check`]).
    threads: Vec<usize>,
    /// Iterations per launch of each litmus test.
    litmus_iters: usize,
    /// Times the one-device worlds of `threads` ([`threads_bench`]).
    threads_bench: bool,
    check_target: Option<String>,
    /// The NVSHMEM check with this many processes ([`nvshmem_check`]).
    nvshmem: Option<u32>,
    /// This process is rank `r` of `n` of the NVSHMEM check, meeting at `addr`.
    nvshmem_rank: Option<(u32, u32, String)>,
    /// The NVSHMEM world check with this many processes ([`nvshmem_world_check`]).
    nvshmem_world: Option<u32>,
    /// This process is one rank of the NVSHMEM world check (with `comm_rank`).
    comm_nvshmem: bool,
}

/// The value of the option just read, as a string.
fn value_of(p: &mut lexopt::Parser) -> Result<String, String> {
    use lexopt::ValueExt;
    p.value()
        .and_then(|v| v.string())
        .map_err(|e| format!("{e}\n{USAGE}"))
}

fn parse_args(
    args: impl IntoIterator<Item = impl Into<std::ffi::OsString>>,
) -> Result<Args, String> {
    use lexopt::prelude::*;
    let mut a = Args {
        kernels: None,
        device: None,
        json: None,
        bench: true,
        comm: true,
        suite: true,
        cases: Vec::new(),
        comm_rank: false,
        comm_devices: Vec::new(),
        threads: Vec::new(),
        litmus_iters: 20_000,
        threads_bench: false,
        check_target: None,
        nvshmem: None,
        nvshmem_rank: None,
        nvshmem_world: None,
        comm_nvshmem: false,
    };
    let mut check = false;
    let mut target = None;
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next().map_err(|e| format!("{e}\n{USAGE}"))? {
        match arg {
            Long("kernels") => a.kernels = Some(PathBuf::from(value_of(&mut p)?)),
            Long("device") => a.device = Some(value_of(&mut p)?),
            Long("json") => a.json = Some(PathBuf::from(value_of(&mut p)?)),
            Long("target") => target = Some(value_of(&mut p)?),
            Long("no-bench") => a.bench = false,
            Long("no-comm") => a.comm = false,
            Long("no-suite") => a.suite = false,
            Long("case") => a.cases.push(value_of(&mut p)?),
            Long("comm-devices") => {
                a.comm_devices = value_of(&mut p)?.split(',').map(str::to_string).collect();
            }
            Long("comm-rank") => a.comm_rank = true,
            Long("threads") => {
                let v = value_of(&mut p)?;
                let n = v.parse().map_err(|e| format!("--threads {v}: {e}"))?;
                if !(2..=64).contains(&n) {
                    return Err(format!("--threads {v}: 2 to 64 ranks"));
                }
                a.threads.push(n);
            }
            Long("threads-bench") => a.threads_bench = true,
            Long("litmus-iters") => {
                let v = value_of(&mut p)?;
                a.litmus_iters = v.parse().map_err(|e| format!("--litmus-iters {v}: {e}"))?;
            }
            Long("nvshmem-world") => {
                let v = value_of(&mut p)?;
                a.nvshmem_world = Some(v.parse().map_err(|e| format!("--nvshmem-world {v}: {e}"))?);
            }
            Long("nvshmem-world-rank") => {
                a.comm_rank = true;
                a.comm_nvshmem = true;
            }
            Long("check-artifacts") => check = true,
            Long("nvshmem") => {
                let v = value_of(&mut p)?;
                a.nvshmem = Some(v.parse().map_err(|e| format!("--nvshmem {v}: {e}"))?);
            }
            Long("nvshmem-rank") => {
                // r/n@addr
                let v = value_of(&mut p)?;
                let bad = || format!("--nvshmem-rank {v}: expected RANK/SIZE@HOST:PORT");
                let (rn, addr) = v.split_once('@').ok_or_else(bad)?;
                let (r, n) = rn.split_once('/').ok_or_else(bad)?;
                a.nvshmem_rank = Some((
                    r.parse().map_err(|_| bad())?,
                    n.parse().map_err(|_| bad())?,
                    addr.to_string(),
                ));
            }
            Short('h') | Long("help") => return Err(USAGE.into()),
            other => return Err(format!("{}\n{USAGE}", other.unexpected())),
        }
    }
    if check {
        a.check_target = Some(target.ok_or("--check-artifacts needs --target")?);
    }
    Ok(a)
}

/// One line of the final table.
struct Row {
    what: String,
    status: String,
    detail: String,
}

fn random(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

/// Compares two result vectors: `|a - b| <= atol + rtol * |b|` everywhere (NaN fails).
fn compare(got: &[f64], want: &[f64], atol: f64, rtol: f64) -> Result<String, String> {
    if got.len() != want.len() {
        return Err(format!("{} elements, expected {}", got.len(), want.len()));
    }
    let (mut bad, mut max_err, mut first) = (0usize, 0f64, String::new());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs();
        if err <= atol + rtol * w.abs() {
            max_err = max_err.max(err);
        } else {
            if bad == 0 {
                first = format!("first at [{i}]: {g} vs {w}");
            }
            bad += 1;
        }
    }
    if bad > 0 {
        Err(format!("{bad} of {} differ, {first}", got.len()))
    } else {
        Ok(format!("{} elements, max abs err {max_err:.2e}", got.len()))
    }
}

fn f64s<T: Copy>(v: Vec<T>, f: impl Fn(T) -> f64) -> Vec<f64> {
    v.into_iter().map(f).collect()
}

type Case = fn(&Device, &Device, &mut StdRng) -> Result<Result<String, String>, Error>;

/// Runs one kernel on `gpu` and on `cpu` with the same inputs; the inner result is
/// the comparison.
const CASES: [(&str, Case); 20] = [
    ("vector_add", |gpu, cpu, rng| {
        let n = 1_000_003usize;
        let (xs, ys) = (random(rng, n, -10.0, 10.0), random(rng, n, -10.0, 10.0));
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let (x, y) = (d.upload(&xs)?, d.upload(&ys)?);
            let mut out = d.upload(&vec![f32::NAN; n])?;
            vector_add::<1024>::launch(d, n.div_ceil(1024), (&x, &y, &mut out, n as i32))?;
            Ok(f64s(out.download()?, f64::from))
        };
        Ok(compare(&run(gpu)?, &run(cpu)?, 0.0, 1e-7))
    }),
    ("softmax_f32", |gpu, cpu, rng| {
        let (r, c) = (1000usize, 781usize);
        let xs = random(rng, r * c, -8.0, 8.0);
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let x = d.upload(&xs)?;
            let mut out = d.upload(&vec![f32::NAN; r * c])?;
            softmax::<f32, 4, 1024>::launch(d, r.div_ceil(4), (&x, &mut out, r as i32, c as i32))?;
            Ok(f64s(out.download()?, f64::from))
        };
        Ok(compare(&run(gpu)?, &run(cpu)?, 1e-7, 1e-5))
    }),
    ("softmax_f16", |gpu, cpu, rng| {
        let (r, c) = (1000usize, 781usize);
        let xs: Vec<f16> = random(rng, r * c, -8.0, 8.0)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let x = d.upload(&xs)?;
            let mut out = d.upload(&vec![f16::NAN; r * c])?;
            softmax::<f16, 4, 1024>::launch(d, r.div_ceil(4), (&x, &mut out, r as i32, c as i32))?;
            Ok(f64s(out.download()?, |v| v.to_f64()))
        };
        Ok(compare(&run(gpu)?, &run(cpu)?, 1e-6, 2.0 / 2048.0))
    }),
    ("matmul_f32", |gpu, cpu, rng| {
        let (m, n, k) = (300usize, 200usize, 150usize);
        let (a, b) = (random(rng, m * k, -1.0, 1.0), random(rng, k * n, -1.0, 1.0));
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let (da, db) = (d.upload(&a)?, d.upload(&b)?);
            let mut dc = d.upload(&vec![f32::NAN; m * n])?;
            let args = (&da, &db, &mut dc, m as i32, n as i32, k as i32);
            matmul::<f32, 64, 64, 32>::launch(d, (m.div_ceil(64), n.div_ceil(64)), args)?;
            Ok(f64s(dc.download()?, f64::from))
        };
        // tf32 or another summation order: bounded by k * |a||b| * 2^-10.
        Ok(compare(
            &run(gpu)?,
            &run(cpu)?,
            1e-3 * k as f64 / 10.0,
            1e-3,
        ))
    }),
    ("matmul_f16", |gpu, cpu, rng| {
        let (m, n, k) = (300usize, 200usize, 150usize);
        let h = |v: Vec<f32>| v.into_iter().map(f16::from_f32).collect::<Vec<_>>();
        let (a, b) = (
            h(random(rng, m * k, -1.0, 1.0)),
            h(random(rng, k * n, -1.0, 1.0)),
        );
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let (da, db) = (d.upload(&a)?, d.upload(&b)?);
            let mut dc = d.upload(&vec![f16::NAN; m * n])?;
            let args = (&da, &db, &mut dc, m as i32, n as i32, k as i32);
            matmul::<f16, 64, 64, 32>::launch(d, (m.div_ceil(64), n.div_ceil(64)), args)?;
            Ok(f64s(dc.download()?, |v| v.to_f64()))
        };
        Ok(compare(&run(gpu)?, &run(cpu)?, 1e-2, 2.0 / 2048.0))
    }),
    ("matmul_f16_128x128x64_8warps", |gpu, cpu, rng| {
        // The tile of the Triton comparison, 8 warps (a launch option: the artifact
        // precompiled with 8 warps).
        let (m, n, k) = (300usize, 260usize, 200usize);
        let h = |v: Vec<f32>| v.into_iter().map(f16::from_f32).collect::<Vec<_>>();
        let (a, b) = (
            h(random(rng, m * k, -1.0, 1.0)),
            h(random(rng, k * n, -1.0, 1.0)),
        );
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let (da, db) = (d.upload(&a)?, d.upload(&b)?);
            let mut dc = d.upload(&vec![f16::NAN; m * n])?;
            let args = (&da, &db, &mut dc, m as i32, n as i32, k as i32);
            let opts = LaunchOptions::new().num_warps(8);
            matmul::<f16, 128, 128, 64>::launch_with(
                d,
                (m.div_ceil(128), n.div_ceil(128)),
                &opts,
                args,
            )?;
            Ok(f64s(dc.download()?, |v| v.to_f64()))
        };
        Ok(compare(&run(gpu)?, &run(cpu)?, 1e-2, 2.0 / 2048.0))
    }),
    ("matmul_i8", |gpu, cpu, rng| {
        let (m, n, k) = (300usize, 200usize, 176usize);
        let mut bytes =
            |len: usize| -> Vec<i8> { (0..len).map(|_| rng.gen_range(-128..=127)).collect() };
        let (a, b) = (bytes(m * k), bytes(k * n));
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let (da, db) = (d.upload(&a)?, d.upload(&b)?);
            let mut dc = d.upload(&vec![i32::MIN + 7; m * n])?;
            let args = (&da, &db, &mut dc, m as i32, n as i32, k as i32);
            matmul_i8::<64, 64, 64>::launch(d, (m.div_ceil(64), n.div_ceil(64)), args)?;
            Ok(f64s(dc.download()?, f64::from))
        };
        // Exact.
        Ok(compare(&run(gpu)?, &run(cpu)?, 0.0, 0.0))
    }),
    ("matmul_i8_bt", |gpu, cpu, rng| {
        let (m, n, k) = (300usize, 200usize, 176usize);
        let mut bytes =
            |len: usize| -> Vec<i8> { (0..len).map(|_| rng.gen_range(-128..=127)).collect() };
        let (a, bt) = (bytes(m * k), bytes(n * k));
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let (da, db) = (d.upload(&a)?, d.upload(&bt)?);
            let mut dc = d.upload(&vec![i32::MIN + 7; m * n])?;
            let args = (&da, &db, &mut dc, m as i32, n as i32, k as i32);
            matmul_i8_bt::<64, 64, 64>::launch(d, (m.div_ceil(64), n.div_ceil(64)), args)?;
            Ok(f64s(dc.download()?, f64::from))
        };
        Ok(compare(&run(gpu)?, &run(cpu)?, 0.0, 0.0))
    }),
    ("matmul_fp8_e4m3", |gpu, cpu, rng| {
        // Quantized on each device (bit-exact conversions), then multiplied.
        let (m, n, k) = (300usize, 200usize, 176usize);
        let (a32, b32) = (random(rng, m * k, -8.0, 8.0), random(rng, n * k, -8.0, 8.0));
        type Run = (Vec<F8E4M3>, Vec<F8E4M3>, Vec<f64>);
        let run = |d: &Device| -> Result<Run, Error> {
            let q = |x: &[f32]| -> Result<tessera::Buffer<F8E4M3>, Error> {
                let dx = d.upload(x)?;
                let mut dy = d.upload(&vec![F8E4M3::from_bits(0x7f); x.len()])?;
                quantize::<F8E4M3, 1024>::launch(
                    d,
                    x.len().div_ceil(1024),
                    (&dx, &mut dy, x.len() as i32),
                )?;
                Ok(dy)
            };
            let (da, db) = (q(&a32)?, q(&b32)?);
            let mut dc = d.upload(&vec![f32::NAN; m * n])?;
            let args = (&da, &db, &mut dc, m as i32, n as i32, k as i32);
            matmul_fp8_bt::<F8E4M3, 64, 64, 64>::launch(d, (m.div_ceil(64), n.div_ceil(64)), args)?;
            Ok((
                da.download()?,
                db.download()?,
                f64s(dc.download()?, f64::from),
            ))
        };
        let ((ga, gb, gc), (ca, cb, cc)) = (run(gpu)?, run(cpu)?);
        let bits = |v: &[F8E4M3]| v.iter().map(|x| f64::from(x.to_bits())).collect::<Vec<_>>();
        for (what, g, c) in [("A", &ga, &ca), ("B", &gb, &cb)] {
            if let Err(e) = compare(&bits(g), &bits(c), 0.0, 0.0) {
                return Ok(Err(format!("quantized {what}: {e}")));
            }
        }
        // The products are exact, but Hopper's FP8 tensor cores do not add them in
        // full f32: DeepSeek-V3's report (arXiv 2412.19437, section 3.3.2) measured
        // about 14 bits kept in the accumulation on H800. The bound is therefore
        // relative to the sum of the products' magnitudes, not to the result:
        // |got - want| <= 2^-12 * sum_k |a_ik * b_jk|. Reported: the largest error
        // in units of that sum, as bits (a full f32 sum of 176 terms keeps >= 16).
        let (mut bad, mut worst, mut first) = (0usize, 0f64, String::new());
        for i in 0..m {
            for j in 0..n {
                let mag: f64 = (0..k)
                    .map(|l| (ca[i * k + l].to_f64() * cb[j * k + l].to_f64()).abs())
                    .sum();
                let (g, w) = (gc[i * n + j], cc[i * n + j]);
                let err = (g - w).abs();
                if err.is_nan() || err > mag / 4096.0 + 1e-6 {
                    if bad == 0 {
                        first =
                            format!("first at [{i}, {j}]: {g} vs {w} (sum of |products| {mag})");
                    }
                    bad += 1;
                } else if mag > 0.0 {
                    worst = worst.max(err / mag);
                }
            }
        }
        Ok(if bad > 0 {
            Err(format!("{bad} of {} differ, {first}", m * n))
        } else {
            let err = if worst > 0.0 {
                format!(
                    "largest error 2^{:.1} of the sum of |products|",
                    worst.log2()
                )
            } else {
                "every sum exact".into()
            };
            Ok(format!("{} elements; quantization bit-exact; {err}", m * n))
        })
    }),
    ("matmul_desc_tma", |gpu, cpu, rng| {
        // Tensor descriptors: on sm_90a the driver's tensor maps and TMA copies into
        // the wgmma ring (mbarriers); ragged tiles (zero fill, clipped stores). The
        // sizes are multiples of 16: a kernel with more than 4 integer parameters is
        // precompiled for all-divisible and none-divisible launches only
        // (`Specialization::for_launches`), and a descriptor's sizes are such
        // parameters.
        let (m, n, k) = (304usize, 208usize, 176usize);
        let h = |v: Vec<f32>| v.into_iter().map(f16::from_f32).collect::<Vec<_>>();
        let (a, b) = (
            h(random(rng, m * k, -1.0, 1.0)),
            h(random(rng, k * n, -1.0, 1.0)),
        );
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let (da, db) = (d.upload(&a)?, d.upload(&b)?);
            let mut dc = d.upload(&vec![f32::NAN; m * n])?;
            let ad = tessera::TensorDescriptor::new(&da, &[m, k], &[k, 1], &[128, 64])?;
            let bd = tessera::TensorDescriptor::new(&db, &[k, n], &[n, 1], &[64, 128])?;
            let mut cd =
                tessera::TensorDescriptor::new_mut(&mut dc, &[m, n], &[n, 1], &[128, 128])?;
            // Precompiled with 8 warps (two warpgroups), as `examples/aot.rs` lists it.
            matmul_desc::<128, 128, 64>::launch_with(
                d,
                (m.div_ceil(128), n.div_ceil(128)),
                &LaunchOptions::new().num_warps(8),
                (&ad, &bd, &mut cd),
            )?;
            drop(cd);
            Ok(f64s(dc.download()?, f64::from))
        };
        Ok(compare(
            &run(gpu)?,
            &run(cpu)?,
            1e-3 * k as f64 / 10.0,
            1e-3,
        ))
    }),
    ("layernorm", |gpu, cpu, rng| {
        let (r, c) = (512usize, 1000usize);
        let xs = random(rng, r * c, -3.0, 5.0);
        let (ws, bs) = (random(rng, c, 0.5, 1.5), random(rng, c, -1.0, 1.0));
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let (x, w, b) = (d.upload(&xs)?, d.upload(&ws)?, d.upload(&bs)?);
            let mut y = d.upload(&vec![f32::NAN; r * c])?;
            let mut mean = d.upload(&vec![f32::NAN; r])?;
            let mut rstd = d.upload(&vec![f32::NAN; r])?;
            let args = (&x, &w, &b, &mut y, &mut mean, &mut rstd, c as i32, 1e-5f32);
            layernorm::<f32, 256>::launch(d, r, args)?;
            let mut out = f64s(y.download()?, f64::from);
            out.extend(f64s(mean.download()?, f64::from));
            out.extend(f64s(rstd.download()?, f64::from));
            Ok(out)
        };
        Ok(compare(&run(gpu)?, &run(cpu)?, 1e-4, 1e-4))
    }),
    ("dropout", |gpu, cpu, rng| {
        // The mask comes from rand(seed, offset): the same bits on every device.
        let n = 1_000_003usize;
        let xs = random(rng, n, -1.0, 1.0);
        let seed: i32 = rng.gen_range(0..1 << 30);
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let x = d.upload(&xs)?;
            let mut out = d.upload(&vec![f32::NAN; n])?;
            seeded_dropout::<1024>::launch(
                d,
                n.div_ceil(1024),
                (&x, &mut out, n as i32, 0.3, seed),
            )?;
            Ok(f64s(out.download()?, f64::from))
        };
        Ok(compare(&run(gpu)?, &run(cpu)?, 0.0, 1e-6))
    }),
    ("argmax", |gpu, cpu, rng| {
        // Coarse values: ties, which go to the lowest index everywhere.
        let (rows, cols) = (777usize, 1000usize);
        let xs: Vec<f32> = (0..rows * cols)
            .map(|_| rng.gen_range(-50..50) as f32 * 0.25)
            .collect();
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let x = d.upload(&xs)?;
            let mut idx = d.upload(&vec![-1i32; rows])?;
            let mut val = d.upload(&vec![f32::NAN; rows])?;
            row_argmax::<1024>::launch(d, rows, (&x, &mut idx, &mut val, cols as i32))?;
            let mut out = f64s(idx.download()?, f64::from);
            out.extend(f64s(val.download()?, f64::from));
            Ok(out)
        };
        Ok(compare(&run(gpu)?, &run(cpu)?, 0.0, 0.0))
    }),
    ("topk", |gpu, cpu, rng| {
        // MoE routing: top 4 of 64 experts with gates, and a full row sort (scan and
        // sort network); coarse logits, so ties are resolved the same way.
        let (n, e, k) = (1000usize, 64usize, 4usize);
        let xs: Vec<f32> = (0..n * e)
            .map(|_| rng.gen_range(-40..40) as f32 * 0.125)
            .collect();
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let x = d.upload(&xs)?;
            let mut ids = d.upload(&vec![-1i32; n * k])?;
            let mut gates = d.upload(&vec![f32::NAN; n * k])?;
            let mut sorted = d.upload(&vec![f32::NAN; n * e])?;
            route::<16, 64, 4>::launch(
                d,
                n.div_ceil(16),
                (&x, &mut ids, &mut gates, &mut sorted, n as i32),
            )?;
            let mut out = f64s(ids.download()?, f64::from);
            out.extend(f64s(gates.download()?, f64::from));
            out.extend(f64s(sorted.download()?, f64::from));
            Ok(out)
        };
        Ok(compare(&run(gpu)?, &run(cpu)?, 1e-6, 1e-5))
    }),
    ("attention_f16_128x64", |gpu, cpu, rng| {
        // FlashAttention-2 forward, causal, 2 heads, ragged sequence.
        let (heads, seq) = (2usize, 300usize);
        let h = |v: Vec<f32>| v.into_iter().map(f16::from_f32).collect::<Vec<_>>();
        let len = heads * seq * 64;
        let (q, k, v) = (
            h(random(rng, len, -1.0, 1.0)),
            h(random(rng, len, -1.0, 1.0)),
            h(random(rng, len, -1.0, 1.0)),
        );
        let scale_log2 = (1.0 / 8.0f32) * std::f32::consts::LOG2_E;
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let (dq, dk, dv) = (d.upload(&q)?, d.upload(&k)?, d.upload(&v)?);
            let mut o = d.upload(&vec![f16::NAN; len])?;
            tessera::attention::attention_fwd::<f16, 128, 64, 64>::launch(
                d,
                (seq.div_ceil(128), heads),
                (&dq, &dk, &dv, &mut o, seq as i32, seq as i32, scale_log2, 1),
            )?;
            Ok(f64s(o.download()?, |x| x.to_f64()))
        };
        Ok(compare(&run(gpu)?, &run(cpu)?, 2e-3, 4.0 / 2048.0))
    }),
    ("bf16_axpb", |gpu, cpu, rng| {
        let n = 100_003usize;
        let xs: Vec<bf16> = random(rng, n, -50.0, 50.0)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let x = d.upload(&xs)?;
            let mut out = d.upload(&vec![bf16::NAN; n])?;
            let args = (&x, &mut out, 0.37f32, -1.5f32, n as i32);
            bf16_axpb::<1024>::launch(d, n.div_ceil(1024), args)?;
            Ok(f64s(out.download()?, |v| v.to_f64()))
        };
        // One rounding to bf16 of the same f32 value: bit-exact.
        Ok(compare(&run(gpu)?, &run(cpu)?, 0.0, 0.0))
    }),
    ("f64_poly", |gpu, cpu, rng| {
        let n = 100_003usize;
        let xs: Vec<f64> = random(rng, n, -1e3, 1e3)
            .into_iter()
            .map(|v| f64::from(v) * 1.000_000_1)
            .collect();
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let x = d.upload(&xs)?;
            let mut out = d.upload(&vec![f64::NAN; n])?;
            f64_poly::<256>::launch(d, n.div_ceil(256), (&x, &mut out, n as i32))?;
            out.download()
        };
        // Correctly rounded operations on both; a fused multiply-add may round once
        // where the interpreter rounds twice.
        Ok(compare(&run(gpu)?, &run(cpu)?, 0.0, 1e-15))
    }),
    ("histogram_system", |gpu, cpu, rng| {
        // 1M keys into 1000 bins, skewed (half into 10 bins) so that atomics collide.
        let (n, bins) = (1_000_003usize, 1000i32);
        let keys: Vec<i32> = (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    rng.gen_range(0..10)
                } else {
                    rng.gen_range(0..bins)
                }
            })
            .collect();
        let run = |d: &Device| -> Result<Vec<f64>, Error> {
            let k = d.upload(&keys)?;
            let mut counts = d.upload(&vec![0u32; bins as usize])?;
            histogram_system::<1024>::launch(d, n.div_ceil(1024), (&k, &mut counts, n as i32))?;
            Ok(f64s(counts.download()?, f64::from))
        };
        let got = run(gpu)?;
        let total: f64 = got.iter().sum();
        Ok(compare(&got, &run(cpu)?, 0.0, 0.0).map(|d| format!("{d}, {total} counted")))
    }),
    ("row_cumsum", |gpu, cpu, rng| {
        // f32 (the GPU's scan adds in another order: a tolerance) and i32 (exact), rows
        // of 1000 in a 1024-wide tile.
        let (rows, cols) = (300usize, 1000usize);
        let xs = random(rng, rows * cols, -1.0, 1.0);
        let xi: Vec<i32> = (0..rows * cols)
            .map(|_| rng.gen_range(-1000..1000))
            .collect();
        let run = |d: &Device| -> Result<(Vec<f64>, Vec<f64>), Error> {
            let (x, y) = (d.upload(&xs)?, d.upload(&xi)?);
            let mut out = d.upload(&vec![f32::NAN; rows * cols])?;
            let mut outi = d.upload(&vec![i32::MIN; rows * cols])?;
            row_cumsum::<f32, 1024>::launch(d, rows, (&x, &mut out, cols as i32))?;
            row_cumsum::<i32, 1024>::launch(d, rows, (&y, &mut outi, cols as i32))?;
            Ok((
                f64s(out.download()?, f64::from),
                f64s(outi.download()?, f64::from),
            ))
        };
        let ((gf, gi), (cf, ci)) = (run(gpu)?, run(cpu)?);
        if let Err(e) = compare(&gi, &ci, 0.0, 0.0) {
            return Ok(Err(format!("i32: {e}")));
        }
        Ok(compare(&gf, &cf, 1e-4, 1e-5).map(|d| format!("{d}; i32 exact")))
    }),
    // device_print and device_assert: the output buffer read back after the launch.
    ("checked_gather", |gpu, cpu, rng| {
        let (n, len) = (10_000usize, 3000usize);
        let xs = random(rng, len, -1.0, 1.0);
        let mut ids: Vec<i32> = (0..n).map(|_| rng.gen_range(0..len as i32)).collect();
        ids[3 * 256 + 40] = -2;
        let run = |d: &Device| -> Result<(Vec<f64>, Vec<String>, String), Error> {
            let (x, idx) = (d.upload(&xs)?, d.upload(&ids)?);
            let mut out = d.upload(&vec![f32::NAN; n])?;
            let args = (&x, &idx, &mut out, n as i32, len as i32);
            let (r, mut lines) = tessera::debug::capture_output(|| {
                checked_gather::<256>::launch(d, n.div_ceil(256), args)
            });
            lines.sort();
            let failed = match r {
                Err(Error::DeviceAssert(f)) => {
                    format!("{:?} {:?} {}", f.program, f.index, f.failing)
                }
                other => format!("{other:?}"),
            };
            Ok((f64s(out.download()?, f64::from), lines, failed))
        };
        let (g, c) = (run(gpu)?, run(cpu)?);
        if (&g.1, &g.2) != (&c.1, &c.2) {
            return Ok(Err(format!(
                "lines {:?} / failure {} vs {:?} / {}",
                g.1, g.2, c.1, c.2
            )));
        }
        Ok(compare(&g.0, &c.0, 0.0, 0.0)
            .map(|d| format!("{d}, {} lines, assertion {}", g.1.len(), g.2)))
    }),
];

/// (name, metric, value) of every benchmark; shapes match `scripts/gpu_bench.py`.
/// GB/s (x read and y written once) of `layernorm::<f32, BLOCK>` on 4096 rows of 8192.
fn layernorm_gbs<const BLOCK: usize>(dev: &Device, bench: Bench) -> Result<f64, Error>
where
    Const<BLOCK>: Pow2,
{
    let (r, c) = (4096usize, 8192usize);
    let x = dev.upload(&vec![0.5f32; r * c])?;
    let w = dev.upload(&vec![1.0f32; c])?;
    let b = dev.alloc::<f32>(c)?;
    let mut y = dev.alloc::<f32>(r * c)?;
    let mut mean = dev.alloc::<f32>(r)?;
    let mut rstd = dev.alloc::<f32>(r)?;
    let t = bench
        .run(dev, || {
            let args = (&x, &w, &b, &mut y, &mut mean, &mut rstd, c as i32, 1e-5f32);
            layernorm::<f32, BLOCK>::launch(dev, r, args)
        })?
        .median()
        .as_secs_f64();
    Ok(2.0 * 4.0 * (r * c) as f64 / t / 1e9)
}

/// `n` random f16 values in [-2, 2) (seeded).
fn random_f16(n: usize, seed: u64) -> Vec<f16> {
    let mut rng = StdRng::seed_from_u64(seed);
    random(&mut rng, n, -2.0, 2.0)
        .into_iter()
        .map(f16::from_f32)
        .collect()
}

fn benchmarks(dev: &Device, rows: &mut Vec<Row>) -> Vec<(String, String, f64)> {
    let mut out = Vec::new();
    let mut record = |name: &str, unit: &str, r: Result<f64, Error>| match r {
        Ok(v) => {
            rows.push(Row {
                what: format!("bench {name}"),
                status: format!("{v:.1} {unit}"),
                detail: String::new(),
            });
            out.push((name.to_string(), unit.to_string(), v));
        }
        Err(e) => rows.push(Row {
            what: format!("bench {name}"),
            status: "ERROR".into(),
            detail: e.to_string(),
        }),
    };
    // Each figure: the median device time of the measured runs after two warm-up runs.
    let bench = |reps| Bench::new().warmup(2).reps(reps);
    let n = 1usize << 26;
    record(
        "vector_add",
        "GB/s",
        (|| {
            let x = dev.alloc::<f32>(n)?;
            let y = dev.alloc::<f32>(n)?;
            let mut o = dev.alloc::<f32>(n)?;
            let t = bench(20)
                .run(dev, || {
                    vector_add::<1024>::launch(dev, n.div_ceil(1024), (&x, &y, &mut o, n as i32))
                })?
                .median()
                .as_secs_f64();
            Ok(3.0 * 4.0 * n as f64 / t / 1e9)
        })(),
    );
    let (r, c) = (4096usize * 4, 1024usize);
    record(
        "softmax_f32",
        "GB/s",
        (|| {
            let x = dev.upload(&vec![0.5f32; r * c])?;
            let mut o = dev.alloc::<f32>(r * c)?;
            let t = bench(20)
                .run(dev, || {
                    softmax::<f32, 4, 1024>::launch(
                        dev,
                        r.div_ceil(4),
                        (&x, &mut o, r as i32, c as i32),
                    )
                })?
                .median()
                .as_secs_f64();
            Ok(2.0 * 4.0 * (r * c) as f64 / t / 1e9)
        })(),
    );
    // The example's tile (256 columns a step) and a wider one (2048: 16 columns per
    // thread a step), to tell the kernel's shape from the code generated for it.
    record("layernorm", "GB/s", layernorm_gbs::<256>(dev, bench(20)));
    record(
        "layernorm_b2048",
        "GB/s",
        layernorm_gbs::<2048>(dev, bench(20)),
    );
    // The matmul example's kernel at its own 64x64x32 tile (4 warps), at 128x128x64
    // and at the Triton baseline's 128x256x64 (8 warps each): how much of the gap to
    // the baselines is the example's small tile.
    let s = 4096usize;
    type Launch<'a> = &'a dyn Fn(&Buffer<f16>, &Buffer<f16>, &mut Buffer<f16>) -> Result<(), Error>;
    let matmul_tflops = |launch: Launch| -> Result<f64, Error> {
        // Random (normal-ish) data like the torch baseline's `randn`: constant data
        // draws less power and runs faster on tensor cores.
        let a = dev.upload(&random_f16(s * s, 1))?;
        let b = dev.upload(&random_f16(s * s, 2))?;
        let mut c = dev.alloc::<f16>(s * s)?;
        let t = bench(10)
            .run(dev, || launch(&a, &b, &mut c))?
            .median()
            .as_secs_f64();
        Ok(2.0 * (s as f64).powi(3) / t / 1e12)
    };
    let (si, eight) = (s as i32, LaunchOptions::new().num_warps(8));
    record(
        "matmul_f16",
        "TFLOP/s",
        matmul_tflops(&|a, b, c| {
            let grid = (s.div_ceil(64), s.div_ceil(64));
            matmul::<f16, 64, 64, 32>::launch(dev, grid, (a, b, c, si, si, si))
        }),
    );
    record(
        "matmul_f16_128x128x64",
        "TFLOP/s",
        matmul_tflops(&|a, b, c| {
            let grid = (s.div_ceil(128), s.div_ceil(128));
            matmul::<f16, 128, 128, 64>::launch_with(dev, grid, &eight, (a, b, c, si, si, si))
        }),
    );
    record(
        "matmul_f16_128x256x64",
        "TFLOP/s",
        matmul_tflops(&|a, b, c| {
            let grid = (s.div_ceil(128), s.div_ceil(256));
            matmul::<f16, 128, 256, 64>::launch_with(dev, grid, &eight, (a, b, c, si, si, si))
        }),
    );
    // FlashAttention-2 forward (tessera::attention, 128 query rows x 64 keys per step,
    // head dim 64), not causal: 32 heads (say batch 4 x 8 heads) of 4096 tokens.
    let (heads, seq) = (32usize, 4096usize);
    record(
        "attention_f16",
        "TFLOP/s",
        (|| {
            let len = heads * seq * 64;
            let q = dev.upload(&random_f16(len, 3))?;
            let k = dev.upload(&random_f16(len, 4))?;
            let v = dev.upload(&random_f16(len, 5))?;
            let mut o = dev.alloc::<f16>(len)?;
            let scale_log2 = (1.0 / 8.0f32) * std::f32::consts::LOG2_E;
            let (sq, grid) = (seq as i32, (seq.div_ceil(128), heads));
            let t = bench(10)
                .run(dev, || {
                    tessera::attention::attention_fwd::<f16, 128, 64, 64>::launch(
                        dev,
                        grid,
                        (&q, &k, &v, &mut o, sq, sq, scale_log2, 0),
                    )
                })?
                .median()
                .as_secs_f64();
            // QK^T and PV: 2 * 2 * seq * seq * 64 per head.
            Ok(4.0 * heads as f64 * (seq as f64).powi(2) * 64.0 / t / 1e12)
        })(),
    );
    // The same product through tensor descriptors (TMA into the wgmma ring on sm_90a,
    // warp-specialized), then without warp specialization.
    // `persistent`: `matmul_desc_persistent` on `Grid::persistent` (a program per
    // tile the GPU holds at once, grouped order; the next tile's loads overlap this
    // one's epilogue).
    let desc = |opts: &LaunchOptions, persistent: bool| -> Result<f64, Error> {
        // Random (normal-ish) data like the torch baseline's `randn`: constant data
        // draws less power and runs faster on tensor cores.
        let a = dev.upload(&random_f16(s * s, 1))?;
        let b = dev.upload(&random_f16(s * s, 2))?;
        let mut c = dev.alloc::<f32>(s * s)?;
        let ad = tessera::TensorDescriptor::new(&a, &[s, s], &[s, 1], &[128, 64])?;
        let bd = tessera::TensorDescriptor::new(&b, &[s, s], &[s, 1], &[64, 128])?;
        let mut cd = tessera::TensorDescriptor::new_mut(&mut c, &[s, s], &[s, 1], &[128, 128])?;
        let tiles = s.div_ceil(128);
        let t = bench(10)
            .run(dev, || {
                let args = (&ad, &bd, &mut cd);
                if persistent {
                    let grid = tessera::Grid::persistent((tiles * tiles) as u64);
                    matmul_desc_persistent::<128, 128, 64>::launch_with(dev, grid, opts, args)
                } else {
                    matmul_desc::<128, 128, 64>::launch_with(dev, (tiles, tiles), opts, args)
                }
            })?
            .median()
            .as_secs_f64();
        Ok(2.0 * (s as f64).powi(3) / t / 1e12)
    };
    record("matmul_desc_f16", "TFLOP/s", desc(&eight, false));
    record(
        "matmul_desc_f16_no_ws",
        "TFLOP/s",
        desc(&eight.clone().warp_specialize(false), false),
    );
    // In clusters of 2 along M (B multicast to both blocks of a cluster).
    record(
        "matmul_desc_f16_cluster2x1",
        "TFLOP/s",
        desc(&eight.clone().cluster(2, 1, 1), false),
    );
    record("matmul_desc_persistent_f16", "TFLOP/s", desc(&eight, true));
    // Persistent with two consumer warpgroups in ping-pong (4 warps per tile, 2
    // stages so that each group's staging box fits).
    let ping_pong = LaunchOptions::new()
        .num_warps(4)
        .num_stages(2)
        .consumer_groups(2);
    record(
        "matmul_desc_pingpong_f16",
        "TFLOP/s",
        desc(&ping_pong, true),
    );
    // Few tiles, long K (1024 x 1024 x 16384: 64 output tiles): persistent (one
    // part), and split-K in 4 parts (both passes timed).
    let few = |splits: i32| -> Result<f64, Error> {
        let (m, k) = (1024usize, 16384usize);
        let a = dev.upload(&random_f16(m * k, 3))?;
        let b = dev.upload(&random_f16(k * m, 4))?;
        let mut partial = dev.alloc::<f32>(splits as usize * m * m)?;
        let mut c = dev.alloc::<f32>(m * m)?;
        let ad = tessera::TensorDescriptor::new(&a, &[m, k], &[k, 1], &[128, 64])?;
        let bd = tessera::TensorDescriptor::new(&b, &[k, m], &[m, 1], &[64, 128])?;
        let t = bench(10)
            .run(dev, || {
                split_k_matmul(
                    dev,
                    &eight,
                    (&ad, &bd),
                    &mut partial,
                    &mut c,
                    (m, m, splits),
                )
            })?
            .median()
            .as_secs_f64();
        Ok(2.0 * (m * m * k) as f64 / t / 1e12)
    };
    record("matmul_desc_few_tiles_persistent_f16", "TFLOP/s", few(1));
    record("matmul_desc_few_tiles_split_k4_f16", "TFLOP/s", few(4));
    out
}

/// Finds every specialization a launch of `K` can look up (aligned buffers; each
/// integer argument a multiple of 16 or not); returns the last one found.
fn find_all<K: Kernel<Comptime = ()>>(
    store: &ArtifactStore,
    target: &str,
    opts: &KernelOptions,
) -> Result<tessera::KernelBinary, Error> {
    let ir = tessera::kernel_ir::<K>(&())?;
    let mut found = None;
    for spec in Specialization::for_launches(&ir) {
        found = Some(store.find::<K>(&(), &spec, target, opts)?);
    }
    // `for_launches` lists at least one specialization (no integer parameters: one).
    found.ok_or_else(|| Error::Launch {
        kernel: K::NAME.into(),
        reason: "no specialization to look up".into(),
    })
}

/// Checks that the store has every kernel for `target` (no GPU needed).
fn check_artifacts(store: &ArtifactStore, target: &str) -> Vec<Row> {
    let opts = KernelOptions::default();
    let mut rows = Vec::new();
    let mut one = |name: &str, r: Result<tessera::KernelBinary, Error>| {
        rows.push(match r {
            Ok(b) => Row {
                what: format!("artifact {name}"),
                status: "found".into(),
                detail: format!("{} bytes, {} threads", b.binary.len(), b.num_threads),
            },
            Err(e) => Row {
                what: format!("artifact {name}"),
                status: "MISSING".into(),
                detail: e.to_string(),
            },
        });
    };
    let (t, o) = (target, &opts);
    one("vector_add", find_all::<vector_add<1024>>(store, t, o));
    one(
        "softmax_f32",
        find_all::<softmax<f32, 4, 1024>>(store, t, o),
    );
    one(
        "softmax_f16",
        find_all::<softmax<f16, 4, 1024>>(store, t, o),
    );
    one(
        "matmul_f32",
        find_all::<matmul<f32, 64, 64, 32>>(store, t, o),
    );
    one(
        "matmul_f16",
        find_all::<matmul<f16, 64, 64, 32>>(store, t, o),
    );
    one("matmul_i8", find_all::<matmul_i8<64, 64, 64>>(store, t, o));
    one(
        "matmul_i8_bt",
        find_all::<matmul_i8_bt<64, 64, 64>>(store, t, o),
    );
    one(
        "quantize_e4m3",
        find_all::<quantize<F8E4M3, 1024>>(store, t, o),
    );
    one(
        "matmul_fp8_e4m3",
        find_all::<matmul_fp8_bt<F8E4M3, 64, 64, 64>>(store, t, o),
    );
    one("layernorm", find_all::<layernorm<f32, 256>>(store, t, o));
    one(
        "layernorm_2048",
        find_all::<layernorm<f32, 2048>>(store, t, o),
    );
    one(
        "checked_gather",
        find_all::<checked_gather<256>>(store, t, o),
    );
    one("dropout", find_all::<seeded_dropout<1024>>(store, t, o));
    one("argmax", find_all::<row_argmax<1024>>(store, t, o));
    one("topk", find_all::<route<16, 64, 4>>(store, t, o));
    one(
        "attention_f16_128x64",
        find_all::<tessera::attention::attention_fwd<f16, 128, 64, 64>>(store, t, o),
    );
    // Launched with 8 warps (`LaunchOptions::num_warps`): precompiled with 8.
    let eight = KernelOptions {
        num_warps: 8,
        ..KernelOptions::default()
    };
    one(
        "matmul_f16_128x128x64_8warps",
        find_all::<matmul<f16, 128, 128, 64>>(store, t, &eight),
    );
    one(
        "matmul_f16_128x256x64_8warps",
        find_all::<matmul<f16, 128, 256, 64>>(store, t, &eight),
    );
    one("ring_pass", find_all::<ring_pass<1024>>(store, t, o));
    one("bf16_axpb", find_all::<bf16_axpb<1024>>(store, t, o));
    one("f64_poly", find_all::<f64_poly<256>>(store, t, o));
    one(
        "histogram_system",
        find_all::<histogram_system<1024>>(store, t, o),
    );
    one(
        "row_cumsum_f32",
        find_all::<row_cumsum<f32, 1024>>(store, t, o),
    );
    one(
        "row_cumsum_i32",
        find_all::<row_cumsum<i32, 1024>>(store, t, o),
    );
    one(
        "matmul_desc_128x128x64_8warps",
        find_all::<matmul_desc<128, 128, 64>>(store, t, &eight),
    );
    let no_ws = KernelOptions {
        warp_specialize: Some(false),
        ..eight.clone()
    };
    one(
        "matmul_desc_128x128x64_8warps_no_ws",
        find_all::<matmul_desc<128, 128, 64>>(store, t, &no_ws),
    );
    one(
        "matmul_desc_persistent_128x128x64_8warps",
        find_all::<matmul_desc_persistent<128, 128, 64>>(store, t, &eight),
    );
    // (sm_90a's; elsewhere the job is the 8-warp persistent kernel.)
    one(
        "matmul_desc_split_k_128x128x64_8warps",
        find_all::<matmul_desc_split_k<128, 128, 64>>(store, t, &eight),
    );
    one(
        "split_k_sum_1024",
        find_all::<split_k_sum<1024>>(store, t, o),
    );
    let ping_pong = if t == "sm_90a" {
        KernelOptions {
            num_warps: 4,
            num_stages: Some(2),
            consumer_groups: Some(2),
            ..eight.clone()
        }
    } else {
        eight.clone()
    };
    one(
        "matmul_desc_pingpong_128x128x64",
        find_all::<matmul_desc_persistent<128, 128, 64>>(store, t, &ping_pong),
    );
    // Clusters exist from sm_90 on (elsewhere a launch drops them).
    if t.starts_with("sm_9") || t.starts_with("sm_1") {
        let clustered = KernelOptions {
            cluster: [2, 1, 1],
            ..eight.clone()
        };
        one(
            "matmul_desc_128x128x64_8warps_cluster2x1",
            find_all::<matmul_desc<128, 128, 64>>(store, t, &clustered),
        );
    }
    rows
}

fn print_table(rows: &[Row]) {
    let w = rows.iter().map(|r| r.what.len()).max().unwrap_or(0);
    let s = rows.iter().map(|r| r.status.len()).max().unwrap_or(0);
    println!("\n{:<w$}  {:<s$}  detail", "case", "result");
    for r in rows {
        println!("{:<w$}  {:<s$}  {}", r.what, r.status, r.detail);
    }
}

/// Ranks of the communication check: processes sharing the one GPU (several GPUs:
/// still all on the first, the case every machine can run).
const COMM_RANKS: usize = 2;
/// Laps of the tile around the ring, and its live elements (of `ring_pass`'s 1024).
const COMM_LAPS: usize = 50;
const COMM_ELEMS: usize = 1000;

/// `x + 1.0` applied `k` times in `f32`, as the ranks do hop by hop.
fn add_ones(x: f32, k: usize) -> f32 {
    (0..k).fold(x, |v, _| v + 1.0)
}

/// One rank of the communication check (this process was started by
/// [`comm_check`]): joins the launched world on `dev` (heaps exported and opened
/// through the driver's IPC), passes a tile around the ring of processes with
/// `put_signal` / `wait_until` (`examples/ping_pong.rs`) and checks every element it
/// ends with, the masked-off ones untouched; then all-reduces with each algorithm of
/// the stock collectives, and runs the fused all-gather + GEMM.
fn comm_rank(dev: &Device, nvshmem_world: bool) -> Result<Result<String, String>, Error> {
    let world = if nvshmem_world {
        // Every peer on a node of its own: every access to a peer takes NVSHMEM's
        // functions, on one machine too.
        World::nvshmem()?.ranks_per_node(1)
    } else {
        World::launched()?
    };
    let r = world
        .on(dev)
        .heap_bytes(64 << 20)
        .signal_bytes(4096)
        .wait_timeout(Duration::from_secs(30))
        .join()?;
    comm_body(&r, nvshmem_world)
}

/// What every rank of a communication check does (see [`comm_rank`]), whatever the
/// world: processes, or threads on parts of one device ([`threads_check`]).
fn comm_body(r: &Rank, nvshmem_world: bool) -> Result<Result<String, String>, Error> {
    let (me, ws) = (r.rank() as usize, r.size() as usize);
    // Every rank derives the same start; rank 0 holds it, the others are poisoned.
    let mut init = random(&mut StdRng::seed_from_u64(0xc0ffee), 1024, -100.0, 100.0);
    init[COMM_ELEMS..].fill(f32::NAN);
    let start = if me == 0 {
        init.clone()
    } else {
        vec![f32::NAN; 1024]
    };
    let mut ball = r.upload(&start)?;
    let mut sig = r.alloc_signals(1)?;
    r.barrier()?;
    let t = Instant::now();
    let args = (&mut ball, &mut sig, 0, COMM_LAPS as i32, COMM_ELEMS as i32);
    ring_pass::<1024>::launch(r.device(), 1u32, args)?;
    r.device().synchronize()?;
    let elapsed = t.elapsed();
    r.barrier()?;
    let got = ball.download()?;
    // Rank k last saw the tile after COMM_LAPS - 1 full laps and k more hops; rank 0
    // after every lap.
    let hops = if me == 0 {
        COMM_LAPS * ws
    } else {
        (COMM_LAPS - 1) * ws + me
    };
    let want: Vec<f64> = init[..COMM_ELEMS]
        .iter()
        .map(|&x| f64::from(add_ones(x, hops)))
        .collect();
    let live: Vec<f64> = got[..COMM_ELEMS].iter().map(|&v| f64::from(v)).collect();
    if let Err(e) = compare(&live, &want, 0.0, 0.0) {
        return Ok(Err(format!("rank {me}: {e}")));
    }
    if let Some(i) = got[COMM_ELEMS..].iter().position(|v| !v.is_nan()) {
        return Ok(Err(format!(
            "rank {me}: masked-off element {} was written",
            COMM_ELEMS + i
        )));
    }
    let mut line = format!(
        "rank {me}: ping_pong {COMM_ELEMS} elements exact after {hops} hops, {:.1} us per hop",
        elapsed.as_secs_f64() * 1e6 / (COMM_LAPS * ws) as f64
    );
    // The stock all-reduce (f32 sum, every algorithm), against the sums in rank order
    // (bit-exact: the collectives add in rank order too). Odd sizes: ragged tiles.
    for (algo, n) in [
        (AllReduceAlgo::LowLatency, 1000usize),
        (AllReduceAlgo::OneShot, 100_003),
        (AllReduceAlgo::TwoShot, 1_000_003),
    ] {
        let input = |p: usize| random(&mut StdRng::seed_from_u64(p as u64 + 17), n, -1.0, 1.0);
        let mut want = input(0);
        for p in 1..ws {
            for (w, x) in want.iter_mut().zip(input(p)) {
                *w += x;
            }
        }
        let mut buf = r.upload(&input(me))?;
        let t = Instant::now();
        r.all_reduce_with(&mut buf, ReduceOp::Sum, algo)?;
        let got = buf.download()?;
        let elapsed = t.elapsed();
        if let Err(e) = compare(&f64s(got, f64::from), &f64s(want, f64::from), 0.0, 0.0) {
            return Ok(Err(format!("rank {me}: all_reduce {algo:?} of {n}: {e}")));
        }
        line += &format!(
            ", all_reduce {algo:?} of {n} exact ({:.2} ms)",
            elapsed.as_secs_f64() * 1e3
        );
    }
    if nvshmem_world {
        // (The fused plans' kernels are not precompiled for a world across nodes.)
        r.barrier()?;
        return Ok(Ok(line + " (NVSHMEM world, every peer through NVSHMEM)"));
    }
    // Fused all-gather + GEMM (`tessera::fused::AgGemm`, f16 in and out, f32 sums):
    // C = gather(A) . B, each rank pushing its shard while the tiles are computed.
    let (ms, n, k) = (200usize, 192usize, 256usize);
    let h = |v: Vec<f32>| v.into_iter().map(f16::from_f32).collect::<Vec<_>>();
    let shard = |p: usize| {
        h(random(
            &mut StdRng::seed_from_u64(p as u64 + 100),
            ms * k,
            -1.0,
            1.0,
        ))
    };
    let bh = h(random(&mut StdRng::seed_from_u64(99), k * n, -1.0, 1.0));
    let a = r.device().upload(&shard(me))?;
    let b = r.device().upload(&bh)?;
    let mut c = r.device().upload(&vec![f16::NAN; ws * ms * n])?;
    let mut plan = tessera::fused::AgGemm::<f16>::new(r, ms, n, k)?;
    let t = Instant::now();
    plan.run(r, &a, &b, &mut c)?;
    let got = f64s(c.download()?, |v| v.to_f64());
    let elapsed = t.elapsed();
    let full: Vec<f16> = (0..ws).flat_map(shard).collect();
    let want: Vec<f64> = (0..ws * ms)
        .flat_map(|i| {
            let (full, bh) = (&full, &bh);
            (0..n).map(move |j| {
                (0..k)
                    .map(|l| full[i * k + l].to_f64() * bh[l * n + j].to_f64())
                    .sum::<f64>()
            })
        })
        .collect();
    // f32 sums of 256 products, then one rounding to f16 (2^-11 relative).
    if let Err(e) = compare(&got, &want, 1e-3, 1.0 / 1024.0) {
        return Ok(Err(format!("rank {me}: AgGemm: {e}")));
    }
    line += &format!(
        ", AgGemm f16 {}x{n}x{k} within f16 rounding ({:.2} ms)",
        ws * ms,
        elapsed.as_secs_f64() * 1e3
    );
    r.barrier()?;
    Ok(Ok(line))
}

/// The communication check as `n` ranks, threads of this process, on parts of `dev`
/// (`World::local(n).on(dev)`: each rank its own stream and share of the SMs), each
/// running [`comm_body`]: the same ping-pong, all-reduces and fused all-gather + GEMM
/// as the processes, every rank's kernels running at once.
fn threads_check(n: usize, dev: &Device) -> Result<Result<String, String>, Error> {
    let lines = World::local(n)
        .on(dev)
        .heap_bytes(64 << 20)
        .signal_bytes(4096)
        .wait_timeout(Duration::from_secs(30))
        .run(|r| {
            let part = r.device().name();
            Ok(comm_body(r, false)?.map(|l| format!("{l} [{part}]")))
        })?;
    let bad: Vec<String> = lines.iter().filter_map(|l| l.clone().err()).collect();
    Ok(if bad.is_empty() {
        Ok(lines.into_iter().flatten().collect::<Vec<_>>().join("; "))
    } else {
        Err(bad.join("; "))
    })
}

/// All-reduce sizes timed for latency (bytes).
const LATENCY_BYTES: [usize; 3] = [4 << 10, 64 << 10, 1 << 20];
/// All-reduce sizes timed for bandwidth (bytes).
const BANDWIDTH_BYTES: [usize; 3] = [16 << 20, 64 << 20, 256 << 20];

/// Device-to-device copy bandwidth of `dev` (GB/s: bytes copied per second) for each of
/// [`BANDWIDTH_BYTES`] (1024 times smaller off a GPU), the all-reduces' baseline.
fn copy_gbs(dev: &Device) -> Result<Vec<f64>, Error> {
    let gpu = matches!(dev.kind(), DeviceKind::Cuda | DeviceKind::Hip);
    BANDWIDTH_BYTES
        .iter()
        .map(|&bytes| if gpu { bytes } else { bytes / 1024 })
        .map(|bytes| {
            let src = dev.upload(&vec![1.0f32; bytes / 4])?;
            let t = Bench::new()
                .warmup(1)
                .reps(5)
                .run(dev, || src.copy_to_device(dev).map(drop))?;
            Ok(bytes as f64 / t.median().as_secs_f64() / 1e9)
        })
        .collect()
}

/// Times the communication of `n` ranks on parts of `dev`: the f32 all-reduce's
/// latency at [`LATENCY_BYTES`] (us) and bus bandwidth at [`BANDWIDTH_BYTES`] (GB/s,
/// `bytes / t * 2 (n - 1) / n`, beside `copy`, the device's own copy bandwidth) with
/// each algorithm that takes that size; and each fused plan (f16) against its unfused
/// sequence (ms, and the unfused over the fused time). Every figure is the slowest
/// rank's best of 3 rounds, each round ending at a host barrier.
///
/// Off a GPU (the emulators and the CPU, where CI runs it to check that it works)
/// every size is 1024 times and every GEMM dimension 16 times smaller.
fn threads_bench(
    n: usize,
    dev: &Device,
    copy: &[f64],
) -> Result<Vec<(String, String, f64)>, Error> {
    use tessera::collectives::LL_MAX_ELEMS;
    use tessera::fused::unfused::{AgThenGemm, AllReduceThenRmsNorm, GemmThenReduceScatter};
    use tessera::fused::{AgGemm, AllReduceRmsNorm, GemmReduceScatter};
    let gpu = matches!(dev.kind(), DeviceKind::Cuda | DeviceKind::Hip);
    let (bdiv, gdiv) = if gpu { (1, 1) } else { (1024, 16) };
    let largest = BANDWIDTH_BYTES[BANDWIDTH_BYTES.len() - 1] / bdiv;
    let per_rank = World::local(n)
        .on(dev)
        .heap_bytes(3 * largest + (256 << 20))
        .signal_bytes(1 << 20)
        .wait_timeout(Duration::from_secs(60))
        .run(|r| {
            let mut out: Vec<(String, String, f64)> = Vec::new();
            // Seconds per call of `call`, the best of 3 rounds of `iters` calls.
            let time = |iters: usize, call: &mut dyn FnMut() -> Result<(), Error>| {
                call()?;
                r.barrier()?;
                let t = Bench::new().warmup(0).reps(3).run(r.device(), || {
                    for _ in 0..iters {
                        call()?;
                    }
                    r.barrier()
                })?;
                Ok::<f64, Error>(t.min().as_secs_f64() / iters as f64)
            };
            let algos = [
                (AllReduceAlgo::LowLatency, "ll"),
                (AllReduceAlgo::OneShot, "one_shot"),
                (AllReduceAlgo::TwoShot, "two_shot"),
            ];
            // LL takes up to LL_MAX_ELEMS elements; the others any size.
            let fits = |algo: AllReduceAlgo, bytes: usize| {
                algo != AllReduceAlgo::LowLatency || bytes / 4 <= LL_MAX_ELEMS
            };
            for (i, &bytes) in LATENCY_BYTES.iter().chain(&BANDWIDTH_BYTES).enumerate() {
                let bytes = (bytes / bdiv).max(4);
                let mut buf = r.upload(&vec![1.0f32; bytes / 4])?;
                let latency = i < LATENCY_BYTES.len();
                for (algo, name) in algos {
                    if !fits(algo, bytes) {
                        continue;
                    }
                    let iters = if latency { 50 } else { 3 };
                    let t = time(iters, &mut || {
                        r.all_reduce_with(&mut buf, ReduceOp::Sum, algo)
                    })?;
                    let what = format!("all_reduce_{n}r_{name}_{bytes}B");
                    out.push(if latency {
                        (what, "us".into(), t * 1e6)
                    } else {
                        let bus = bytes as f64 / t * 2.0 * (n - 1) as f64 / n as f64 / 1e9;
                        (what, "GB/s".into(), bus)
                    });
                }
            }
            // The fused plans against their unfused sequences, f16.
            let h = |len: usize, seed: u64| -> Vec<f16> {
                let mut g = StdRng::seed_from_u64(seed);
                (0..len)
                    .map(|_| f16::from_f32(g.gen_range(-1.0..1.0)))
                    .collect()
            };
            let d = r.device();
            let me = r.rank() as u64;
            let (ms, nn, k) = (4096 / n / gdiv, 2048 / gdiv, 2048 / gdiv);
            let a = d.upload(&h(ms * k, me))?;
            let b = d.upload(&h(k * nn, 99))?;
            let mut c = d.alloc::<f16>(n * ms * nn)?;
            let mut fused = AgGemm::<f16>::new(r, ms, nn, k)?;
            let tf = time(5, &mut || fused.run(r, &a, &b, &mut c))?;
            let mut plain = AgThenGemm::<f16>::new(r, ms, nn, k)?;
            let tu = time(5, &mut || plain.run(r, &a, &b, &mut c))?;
            let shape = format!("{}x{nn}x{k}", n * ms);
            out.push((format!("ag_gemm_{n}r_{shape}"), "ms".into(), tf * 1e3));
            out.push((format!("ag_then_gemm_{n}r_{shape}"), "ms".into(), tu * 1e3));
            let (m, kr) = (4096 / gdiv / n * n, 4096 / n / gdiv);
            let a = d.upload(&h(m * kr, me + 10))?;
            let b = d.upload(&h(kr * nn, me + 20))?;
            let mut o = d.alloc::<f16>(m / n * nn)?;
            let mut fused = GemmReduceScatter::<f16>::new(r, m, nn, kr)?;
            let tf = time(5, &mut || fused.run(r, &a, &b, &mut o))?;
            let mut plain = GemmThenReduceScatter::<f16>::new(r, m, nn, kr)?;
            let tu = time(5, &mut || plain.run(r, &a, &b, &mut o))?;
            let shape = format!("{m}x{nn}x{}", n * kr);
            out.push((format!("gemm_rs_{n}r_{shape}"), "ms".into(), tf * 1e3));
            out.push((format!("gemm_then_rs_{n}r_{shape}"), "ms".into(), tu * 1e3));
            let (rows, hidden) = (1024 / gdiv, 4096 / gdiv);
            let x = r.upload(&h(rows * hidden, me + 30))?;
            let w = d.upload(&h(hidden, 7))?;
            let mut res = d.upload(&h(rows * hidden, me + 40))?;
            let mut o = d.alloc::<f16>(rows * hidden)?;
            let mut fused = AllReduceRmsNorm::<f16>::new(r, rows, hidden, 1e-5)?;
            let tf = time(10, &mut || fused.run(r, &x, &mut res, &w, &mut o))?;
            let mut plain = AllReduceThenRmsNorm::<f16>::new(r, rows, hidden, 1e-5)?;
            let tu = time(10, &mut || plain.run(r, &x, &mut res, &w, &mut o))?;
            let shape = format!("{rows}x{hidden}");
            out.push((format!("ar_rmsnorm_{n}r_{shape}"), "ms".into(), tf * 1e3));
            out.push((
                format!("ar_then_rmsnorm_{n}r_{shape}"),
                "ms".into(),
                tu * 1e3,
            ));
            Ok(out)
        })?;
    // The slowest rank's figure (the lowest bandwidth, the longest time).
    let mut out = per_rank[0].clone();
    for rank in &per_rank[1..] {
        for (o, v) in out.iter_mut().zip(rank) {
            o.2 = if o.1 == "GB/s" {
                o.2.min(v.2)
            } else {
                o.2.max(v.2)
            };
        }
    }
    for (bytes, gbs) in BANDWIDTH_BYTES.iter().zip(copy) {
        out.push((format!("copy_{}B", bytes / bdiv), "GB/s".into(), *gbs));
    }
    Ok(out)
}

/// The litmus tests (`examples/litmus.rs`) on 2 ranks on parts of `dev`: one row per
/// test and variant; a strong variant with a forbidden outcome fails.
fn litmus_rows(dev: &Device, iters: usize, rows: &mut Vec<Row>, ok: &mut bool) {
    for (name, what) in ex_litmus::TESTS {
        for strong in [true, false] {
            let label = format!(
                "litmus {what} ({})",
                if strong {
                    "release/acquire"
                } else {
                    "weakened"
                }
            );
            let (status, detail) = match ex_litmus::run_test(dev, name, strong, iters, 4) {
                Ok(o) => {
                    let d = format!(
                        "{} forbidden of {} ({:.2e})",
                        o.forbidden,
                        o.trials,
                        o.forbidden as f64 / o.trials.max(1) as f64
                    );
                    match (strong, o.forbidden) {
                        (true, 0) => ("PASS", d),
                        (true, _) => ("FAIL", d),
                        // How often the hardware shows what the strong variant
                        // forbids (NONE: never, in these trials).
                        (false, 0) => ("NONE", d),
                        (false, _) => ("SEEN", d),
                    }
                }
                Err(e) => ("ERROR", e.to_string()),
            };
            *ok &= matches!(status, "PASS" | "SEEN" | "NONE");
            println!("{label:<48} {status:<5} {detail}");
            rows.push(Row {
                what: label,
                status: status.into(),
                detail,
            });
        }
    }
}

/// The communication check: one process of this program per entry of `devices` (rank
/// `r` on `devices[r]`; `spawn_local`, as `torchrun` would start them), each running
/// [`comm_rank`] with
/// the precompiled `kernels` (without: compiled at launch, which needs `jit`). The
/// inner result is the verdict, with every rank's line.
fn comm_check(
    devices: &[String],
    kernels: Option<&std::path::Path>,
) -> Result<Result<String, String>, Error> {
    let exe = std::env::current_exe().map_err(|e| Error::Comm {
        rank: 0,
        message: format!("cannot find this program to start its ranks: {e}"),
    })?;
    let outs = tessera::world::spawn_local_with(devices.len(), |r| {
        let mut c = Command::new(&exe);
        c.arg("--comm-rank").arg("--device").arg(&devices[r]);
        if let Some(dir) = kernels {
            c.arg("--kernels").arg(dir);
        }
        c
    })?;
    let mut lines = Vec::new();
    let mut ok = true;
    for (r, o) in outs.iter().enumerate() {
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        let last = out
            .lines()
            .chain(err.lines())
            .last()
            .unwrap_or("(no output)");
        ok &= o.status.success();
        lines.push(if o.status.success() {
            last.to_string()
        } else {
            format!("rank {r} failed ({}): {}", o.status, err.trim())
        });
    }
    Ok(if ok {
        Ok(lines.join("; "))
    } else {
        Err(lines.join("; "))
    })
}

/// Runs [`comm_check`] on `devices` and records its row.
fn comm_row(
    name: &str,
    devices: &[String],
    kernels: Option<&std::path::Path>,
    rows: &mut Vec<Row>,
    ok: &mut bool,
) {
    let (status, detail) = match comm_check(devices, kernels) {
        Ok(Ok(d)) => ("PASS", d),
        Ok(Err(d)) => ("FAIL", d),
        Err(e) => ("ERROR", e.to_string()),
    };
    *ok &= status == "PASS";
    println!("{name:<12} {status:<5} {detail}");
    rows.push(Row {
        what: format!("comm {name}"),
        status: status.into(),
        detail,
    });
}

/// The secret of the NVSHMEM check's rendezvous (set by the check for its ranks).
const NVSHMEM_SECRET_VAR: &str = "TESSERA_GPU_CHECK_SECRET";

/// One rank of the NVSHMEM check: NVSHMEM's host library loaded, the unique id
/// drawn by rank 0 and handed out by the TCP rendezvous, NVSHMEM initialized on
/// `cuda:(rank % GPUs)`, a symmetric allocation, which peers map it, a barrier,
/// freed, finalized. Answers the rank's line.
fn nvshmem_rank(rank: u32, size: u32, addr: &str) -> Result<String, Error> {
    use tessera::world::nvshmem::{NvshmemHost, bootstrap_unique_id};
    let secret = std::env::var(NVSHMEM_SECRET_VAR).unwrap_or_default();
    let host = NvshmemHost::load()?;
    let id = bootstrap_unique_id(
        &host,
        addr,
        rank,
        size,
        secret.as_bytes(),
        Duration::from_secs(60),
    )?;
    let gpus = Device::all()
        .iter()
        .filter(|d| d.kind() == DeviceKind::Cuda)
        .count()
        .max(1);
    let dev = Device::cuda(rank as usize % gpus)?;
    let s = host.init(rank, size, &id, &dev)?;
    let (pe, pes) = (s.my_pe(), s.n_pes());
    let bytes = 1 << 20;
    let heap = s.malloc(bytes)?;
    let mapped: Vec<bool> = (0..pes).map(|p| s.ptr(heap, p).is_some()).collect();
    let own = s.ptr(heap, pe);
    s.barrier_all();
    // SAFETY: allocated above by this session, freed once, no kernel uses it.
    unsafe { s.free(heap) };
    let ok = pe == rank && pes == size && own == Some(heap);
    drop(s);
    let line = format!(
        "rank {rank}/{size} on {dev}: PE {pe} of {pes}, {bytes} symmetric bytes at {heap:#x}, own copy {own:x?}, peers mapped {mapped:?} ({})",
        host.path().display()
    );
    if ok {
        Ok(line)
    } else {
        Err(Error::Comm {
            rank,
            message: format!("unexpected: {line}"),
        })
    }
}

/// The NVSHMEM check: `n` processes of this program, one PE each (started here, as
/// `torchrun` would), each running [`nvshmem_rank`]. Answers whether all passed.
fn nvshmem_check(n: u32) -> Result<bool, Error> {
    let exe = std::env::current_exe().map_err(|e| Error::Usage(format!("this program: {e}")))?;
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| Error::Usage(format!("a free port for the rendezvous: {e}")))?;
    let addr = free.to_string();
    let secret = fresh_secret();
    let mut children = Vec::new();
    for r in 0..n {
        let child = Command::new(&exe)
            .arg("--nvshmem-rank")
            .arg(format!("{r}/{n}@{addr}"))
            .env(NVSHMEM_SECRET_VAR, &secret)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| Error::Usage(format!("starting NVSHMEM rank {r}: {e}")))?;
        children.push(child);
    }
    wait_ranks(children, "nvshmem")
}

/// A random hex secret for a check's rendezvous.
fn fresh_secret() -> String {
    let mut g = StdRng::from_entropy();
    (0..32)
        .map(|_| format!("{:02x}", g.r#gen::<u8>()))
        .collect()
}

/// Waits for a check's rank processes, printing a `label PASS|FAIL` line with each
/// one's output; answers whether all passed.
fn wait_ranks(children: Vec<std::process::Child>, label: &str) -> Result<bool, Error> {
    let mut ok = true;
    for (r, c) in children.into_iter().enumerate() {
        let o = c
            .wait_with_output()
            .map_err(|e| Error::Usage(format!("{label} rank {r}: {e}")))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        ok &= o.status.success();
        let verdict = if o.status.success() { "PASS" } else { "FAIL" };
        println!("{label} {verdict} ({}): {}", o.status, text.trim());
    }
    Ok(ok)
}

/// The NVSHMEM world check: `n` processes of this program, rank `r` on
/// `cuda:(r % GPUs)`, started as `torchrun` would (its variables, a TCP rendezvous on
/// loopback, `TESSERA_TRANSPORT=nvshmem`), each running [`comm_rank`] in an NVSHMEM
/// world whose every peer is off-node. Answers whether all passed.
fn nvshmem_world_check(n: u32, kernels: Option<&std::path::Path>) -> Result<bool, Error> {
    let exe = std::env::current_exe().map_err(|e| Error::Usage(format!("this program: {e}")))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| Error::Usage(format!("a free port for the rendezvous: {e}")))?
        .port();
    let secret = fresh_secret();
    let gpus = Device::all()
        .iter()
        .filter(|d| d.kind() == DeviceKind::Cuda)
        .count()
        .max(1) as u32;
    let mut children = Vec::new();
    for r in 0..n {
        let mut c = Command::new(&exe);
        c.arg("--nvshmem-world-rank")
            .arg("--device")
            .arg(format!("cuda:{}", r % gpus));
        if let Some(dir) = kernels {
            c.arg("--kernels").arg(dir);
        }
        let child = c
            .env("RANK", r.to_string())
            .env("WORLD_SIZE", n.to_string())
            .env("LOCAL_RANK", (r % gpus).to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("TESSERA_RENDEZVOUS_PORT", port.to_string())
            .env("TESSERA_BOOTSTRAP_SECRET", &secret)
            .env("TESSERA_TRANSPORT", "nvshmem")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| Error::Usage(format!("starting NVSHMEM world rank {r}: {e}")))?;
        children.push(child);
    }
    wait_ranks(children, "nvshmem_world")
}

fn run(args: Args) -> Result<bool, (u8, String)> {
    let fail = |e: Error| (1u8, e.to_string());
    if let Some((r, n, addr)) = &args.nvshmem_rank {
        return match nvshmem_rank(*r, *n, addr) {
            Ok(line) => {
                println!("{line}");
                Ok(true)
            }
            Err(e) => {
                eprintln!("rank {r}: {e}");
                Ok(false)
            }
        };
    }
    if let Some(n) = args.nvshmem {
        return nvshmem_check(n).map_err(fail);
    }
    if let Some(n) = args.nvshmem_world {
        return nvshmem_world_check(n, args.kernels.as_deref()).map_err(fail);
    }
    if let Some(target) = &args.check_target {
        let dir = args
            .kernels
            .clone()
            .ok_or((1, "--kernels is required".to_string()))?;
        let rows = check_artifacts(&ArtifactStore::new(dir), target);
        print_table(&rows);
        return Ok(rows.iter().all(|r| r.status == "found"));
    }
    let dev = match &args.device {
        Some(name) => Device::by_name(name),
        None => Device::best(),
    }
    .map_err(|e| (2u8, e.to_string()))?;
    let dev = match &args.kernels {
        Some(dir) => dev.with_artifacts(dir),
        None => dev,
    };
    if args.comm_rank {
        return match comm_rank(&dev, args.comm_nvshmem) {
            Ok(Ok(line)) => {
                println!("{line}");
                Ok(true)
            }
            Ok(Err(line)) => {
                eprintln!("{line}");
                Ok(false)
            }
            Err(e) => Err(fail(e)),
        };
    }
    let p = dev.properties();
    println!(
        "gpu_check on {dev}: {} MiB, shared/block {} B (opt-in {} B), cc {:?}",
        p.total_memory >> 20,
        p.shared_per_block,
        p.shared_per_block_optin,
        p.compute_capability
    );
    if dev.kind() == DeviceKind::Cpu {
        println!("(no GPU: comparing the CPU with itself)");
    }
    let cpu = Device::cpu();
    let mut rows = Vec::new();
    let mut ok = true;
    for (i, (name, case)) in CASES.iter().enumerate() {
        if !args.suite
            || !args.cases.is_empty() && !args.cases.iter().any(|c| name.contains(c.as_str()))
        {
            continue;
        }
        // Each case's own inputs, whichever cases run.
        let mut rng = StdRng::seed_from_u64(0x7e55e7a + i as u64);
        let (status, detail) = match case(&dev, &cpu, &mut rng) {
            Ok(Ok(d)) => ("PASS", d),
            Ok(Err(d)) => ("FAIL", d),
            Err(e) => ("ERROR", e.to_string()),
        };
        ok &= status == "PASS";
        println!("{name:<12} {status:<5} {detail}");
        rows.push(Row {
            what: format!("suite {name}"),
            status: status.into(),
            detail,
        });
    }
    if args.comm {
        // COMM_RANKS processes on this device; and, where the machine has several
        // devices of its kind, one process per device (NVLink or PCIe between them).
        let mut worlds = vec![(format!("comm_{COMM_RANKS}proc"), vec![dev.id(); COMM_RANKS])];
        let peers: Vec<String> = Device::all()
            .iter()
            .filter(|d| d.kind() == dev.kind() && d.kind() != DeviceKind::Cpu)
            .map(Device::id)
            .collect();
        if peers.len() >= 2 {
            worlds.push((format!("comm_{}gpus", peers.len()), peers));
        }
        if !args.comm_devices.is_empty() {
            worlds = vec![(
                format!("comm_{}ranks", args.comm_devices.len()),
                args.comm_devices.clone(),
            )];
        }
        for (name, devices) in worlds {
            comm_row(&name, &devices, args.kernels.as_deref(), &mut rows, &mut ok);
        }
    }
    for &n in &args.threads {
        let (status, detail) = match threads_check(n, &dev) {
            Ok(Ok(d)) => ("PASS", d),
            Ok(Err(d)) => ("FAIL", d),
            Err(e) => ("ERROR", e.to_string()),
        };
        ok &= status == "PASS";
        println!("comm_{n}threads {status:<5} {detail}");
        rows.push(Row {
            what: format!("comm_{n}threads"),
            status: status.into(),
            detail,
        });
    }
    if !args.threads.is_empty() {
        litmus_rows(&dev, args.litmus_iters, &mut rows, &mut ok);
    }
    let mut results = Vec::new();
    if args.threads_bench && !args.threads.is_empty() {
        match copy_gbs(&dev) {
            Ok(copy) => {
                for &n in &args.threads {
                    match threads_bench(n, &dev, &copy) {
                        Ok(figures) => {
                            for (name, unit, v) in figures {
                                println!("bench {name:<40} {v:>10.2} {unit}");
                                rows.push(Row {
                                    what: format!("bench {name}"),
                                    status: format!("{v:.2} {unit}"),
                                    detail: String::new(),
                                });
                                results.push((name, unit, v));
                            }
                        }
                        Err(e) => {
                            ok = false;
                            rows.push(Row {
                                what: format!("bench comm_{n}threads"),
                                status: "ERROR".into(),
                                detail: e.to_string(),
                            });
                        }
                    }
                }
            }
            Err(e) => {
                ok = false;
                rows.push(Row {
                    what: "bench copy".into(),
                    status: "ERROR".into(),
                    detail: e.to_string(),
                });
            }
        }
    }
    if args.bench && dev.kind() != DeviceKind::Cpu {
        results.extend(benchmarks(&dev, &mut rows));
    }
    if let Some(path) = &args.json {
        let bench: Vec<serde_json::Value> = results
            .iter()
            .map(|(n, u, v)| serde_json::json!({"name": n, "unit": u, "value": v}))
            .collect();
        let report = serde_json::json!({
            "device": dev.name(),
            "suite_ok": ok,
            "bench": bench,
        });
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| (1, format!("cannot encode the report: {e}")))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| (1, format!("cannot write {}: {e}", path.display())))?;
    }
    dev.synchronize().map_err(fail)?;
    print_table(&rows);
    Ok(ok)
}

fn main() -> ExitCode {
    // Tessera's messages (the `log` facade), filtered by TESSERA_LOG.
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("TESSERA_LOG", "warn")).init();
    let args = match parse_args(std::env::args_os().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("gpu_check: {e}");
            return ExitCode::from(1);
        }
    };
    match run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err((code, e)) => {
            eprintln!("gpu_check: {e}");
            ExitCode::from(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Args, String> {
        parse_args(s.split_whitespace())
    }

    #[test]
    fn arguments() {
        let a = parse("--kernels k --device cuda:1 --no-comm --case bf16 --case f64").unwrap();
        assert_eq!(a.kernels, Some(PathBuf::from("k")));
        assert_eq!(a.device.as_deref(), Some("cuda:1"));
        assert!(a.bench && !a.comm && !a.comm_rank);
        assert_eq!(a.cases, ["bf16", "f64"]);
        let a = parse("--comm-devices cuda:0,cuda:1").unwrap();
        assert_eq!(a.comm_devices, ["cuda:0", "cuda:1"]);
        let a = parse("--comm-rank --no-bench").unwrap();
        assert!(a.comm_rank && !a.bench && a.comm && a.cases.is_empty());
        let a = parse("--kernels k --target sm_90a --check-artifacts").unwrap();
        assert_eq!(a.check_target.as_deref(), Some("sm_90a"));
        for bad in ["--check-artifacts", "--case", "--bogus", "stray"] {
            assert!(parse(bad).is_err(), "{bad} was accepted");
        }
    }
}
