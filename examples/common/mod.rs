//! Helpers shared by the examples: seeded random inputs and result checks.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A seeded generator; `TESSERA_SEED` overrides the default seed.
pub fn rng() -> (StdRng, u64) {
    let seed = std::env::var("TESSERA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7e55e7a);
    (StdRng::seed_from_u64(seed), seed)
}

/// `n` uniform values in `[lo, hi)`.
pub fn uniform(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

/// [`uniform`], rounded to f16.
pub fn uniform_f16(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<tessera::prelude::f16> {
    uniform(rng, n, lo, hi)
        .into_iter()
        .map(tessera::prelude::f16::from_f32)
        .collect()
}

/// Compares `got` with `want` element-wise: `|got - want| <= tol[i]`. Reports the
/// first mismatches (NaN, the poison value, counts as a mismatch).
pub fn check(name: &str, got: &[f64], want: &[f64], tol: &[f64]) -> Result<(), String> {
    assert_eq!(got.len(), want.len());
    let mut bad = 0usize;
    let mut first = String::new();
    let mut max_err = 0.0f64;
    for i in 0..got.len() {
        let err = (got[i] - want[i]).abs();
        let ok = err <= tol[i]; // false for NaN
        if !ok {
            if bad < 5 {
                first += &format!(
                    "\n  [{i}] got {} want {} (tol {:.3e})",
                    got[i], want[i], tol[i]
                );
            }
            bad += 1;
        } else {
            max_err = max_err.max(err);
        }
    }
    if bad > 0 {
        return Err(format!(
            "{name}: {bad} of {} elements differ:{first}",
            got.len()
        ));
    }
    println!(
        "{name}: {} elements match (max abs error {max_err:.3e})",
        got.len()
    );
    Ok(())
}

/// Installs the examples' logger: Tessera's messages (the `log` facade) go to
/// standard error, filtered by `TESSERA_LOG` (`warn` by default; e.g. `info`,
/// `tessera=debug`).
pub fn init_logger() {
    let env = env_logger::Env::new().filter_or("TESSERA_LOG", "warn");
    // A second call (a test including these helpers) keeps the first logger.
    let _ = env_logger::Builder::from_env(env).try_init();
}

/// Runs `f` (after installing the logger), printing the error and exiting with
/// status 1 on failure.
pub fn run_main(f: impl FnOnce() -> Result<(), Box<dyn std::error::Error>>) {
    init_logger();
    if let Err(e) = f() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Parses `--name value` (or `--name=value`) pairs of unsigned integers from the
/// command line: `spec` lists the accepted names with their defaults and allowed
/// ranges; `--help` prints them and exits. Bad arguments are messages (the caller
/// exits 1), not panics.
pub fn parse_args(
    usage: &str,
    spec: &[(&str, usize, std::ops::RangeInclusive<usize>)],
) -> Result<Vec<usize>, String> {
    match parse_args_from(usage, spec, std::env::args_os().skip(1))? {
        Some(v) => Ok(v),
        None => {
            println!("{}", args_help(usage, spec));
            std::process::exit(0);
        }
    }
}

/// The usage text of [`parse_args`].
pub fn args_help(usage: &str, spec: &[(&str, usize, std::ops::RangeInclusive<usize>)]) -> String {
    let mut h = format!("usage: {usage}");
    for (name, def, range) in spec {
        h += &format!(
            "\n  --{name} N   ({}..={}, default {def})",
            range.start(),
            range.end()
        );
    }
    h
}

/// [`parse_args`] over `args` (without the program name); `None` when `--help` or
/// `-h` asks for the usage.
pub fn parse_args_from(
    usage: &str,
    spec: &[(&str, usize, std::ops::RangeInclusive<usize>)],
    args: impl IntoIterator<Item = impl Into<std::ffi::OsString>>,
) -> Result<Option<Vec<usize>>, String> {
    use lexopt::prelude::*;
    let help = || args_help(usage, spec);
    let mut vals: Vec<usize> = spec.iter().map(|s| s.1).collect();
    let mut p = lexopt::Parser::from_args(args);
    while let Some(arg) = p.next().map_err(|e| format!("{e}\n{}", help()))? {
        match arg {
            Short('h') | Long("help") => return Ok(None),
            Long(name) => {
                let Some(i) = spec.iter().position(|s| s.0 == name) else {
                    return Err(format!("unknown argument `--{name}`\n{}", help()));
                };
                let name = name.to_string();
                let v: String = p
                    .value()
                    .map_err(|e| format!("{e}\n{}", help()))?
                    .string()
                    .map_err(|e| format!("--{name}: {e}"))?;
                let n: usize = v
                    .parse()
                    .map_err(|_| format!("`--{name} {v}`: not a number\n{}", help()))?;
                if !spec[i].2.contains(&n) {
                    return Err(format!(
                        "`--{name} {v}`: must be in {}..={}",
                        spec[i].2.start(),
                        spec[i].2.end()
                    ));
                }
                vals[i] = n;
            }
            other => return Err(format!("{}\n{}", other.unexpected(), help())),
        }
    }
    Ok(Some(vals))
}

/// The device to run communicating ranks on: the best device present
/// (`TESSERA_DEVICE` overrides). Ranks as threads share it ([`rank_world`]): on a GPU
/// each rank gets a part of it (`Device::partition`).
pub fn comm_device() -> tessera::Device {
    match tessera::Device::best() {
        Ok(d) => d,
        Err(e) => {
            println!("note: {e}; running the ranks on the CPU");
            tessera::Device::cpu()
        }
    }
}

/// The world of `ranks` ranks (threads of this process) for an example on `dev`: one
/// rank per GPU where the machine has that many GPUs of `dev`'s kind, else every
/// rank on a part of `dev` (its own stream and share of the SMs, so the ranks' kernels
/// run at once). Says which on a GPU.
pub fn rank_world(ranks: usize, dev: &tessera::Device) -> tessera::World {
    use tessera::DeviceKind;
    if ranks > 1 && matches!(dev.kind(), DeviceKind::Cuda | DeviceKind::Hip) {
        let gpus: Vec<tessera::Device> = tessera::Device::all()
            .into_iter()
            .filter(|d| d.kind() == dev.kind())
            .collect();
        if gpus.len() >= ranks {
            println!(
                "{ranks} ranks, one per GPU: {}",
                gpus[..ranks]
                    .iter()
                    .map(|g| g.id())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return tessera::World::local(ranks).on_each(&gpus[..ranks]);
        }
        println!(
            "note: {ranks} ranks share one GPU, {}: each rank runs on a part of it (its own stream and SMs), \
             so their kernels run at once, but what they exchange is device-local memory traffic, not NVLink: \
             the times are not those of {ranks} GPUs",
            dev.name()
        );
    }
    tessera::World::local(ranks).on(dev)
}

/// The `count` positive integers after `--tune` on the command line (`None` without
/// it); any other argument is an error naming `usage` (e.g. `"--tune N"`).
pub fn tune_args(count: usize, usage: &str) -> Result<Option<Vec<usize>>, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(i) = args.iter().position(|a| a == "--tune") else {
        if args.is_empty() {
            return Ok(None);
        }
        return Err(format!("unknown arguments {args:?} (expected {usage})"));
    };
    (1..=count)
        .map(|j| {
            args.get(i + j)
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{usage}: positive integers"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Checks 16 rows of an `s x s x s` product against f64: `got(i, j)` is `C[i][j]`,
/// `a(i, p)` and `b(p, j)` the operands; within f32 accumulation over `s` terms
/// (their magnitudes summed, times `s` f32 epsilons) plus `rel` of the value (the
/// output's own rounding, 0 for f32).
pub fn check_rows(
    what: &str,
    s: usize,
    a: impl Fn(usize, usize) -> f64,
    b: impl Fn(usize, usize) -> f64,
    got: impl Fn(usize, usize) -> f64,
    rel: f64,
) -> Result<(), String> {
    let (mut g, mut want, mut tol) = (Vec::new(), Vec::new(), Vec::new());
    for i in (0..16).map(|r| (r * 7919 + 13) % s) {
        for j in 0..s {
            let (mut w, mut mag) = (0.0f64, 0.0f64);
            for p in 0..s {
                let v = a(i, p) * b(p, j);
                w += v;
                mag += v.abs();
            }
            g.push(got(i, j));
            want.push(w);
            tol.push(1e-30 + mag * (s as f64) * f32::EPSILON as f64 + w.abs() * rel);
        }
    }
    check(&format!("{what} (tuned, 16 rows)"), &g, &want, &tol)
}

/// Whether `dev` is a GPU (CUDA or HIP), where the examples run their tuned sizes.
pub fn is_gpu(dev: &tessera::Device) -> bool {
    matches!(
        dev.kind(),
        tessera::DeviceKind::Cuda | tessera::DeviceKind::Hip
    )
}

/// Picks the fastest of `configs` for `key` on `dev` with a [`tessera::autotune::Tuner`]
/// named `kernel` (the winner kept in the disk cache), prints the choice as `what`,
/// then times it (median of 10 after 2 warm-ups): the winner and its seconds.
pub fn tune_and_time<C: Clone + std::fmt::Debug>(
    dev: &tessera::Device,
    kernel: &str,
    configs: Vec<C>,
    (what, key): (&str, &str),
    mut launch: impl FnMut(&C) -> Result<(), tessera::Error>,
) -> Result<(C, f64), tessera::Error> {
    let tuner = tessera::autotune::Tuner::new(kernel, configs);
    let t = std::time::Instant::now();
    let (best, how) = tuner.run_explained(dev, key, &mut launch)?;
    println!(
        "{what}: {best:?} ({how:?}, {:.1} s)",
        t.elapsed().as_secs_f64()
    );
    let secs = tessera::bench::Bench::new()
        .warmup(2)
        .reps(10)
        .run(dev, || launch(&best))?
        .median()
        .as_secs_f64();
    Ok((best, secs))
}
