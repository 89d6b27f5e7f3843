//! The compiled CPU executor (feature `jit`): kernels compiled for the host
//! ([`tessera_codegen::cpu`], through the kernel's compile cache), one task per
//! program instance on rayon's pool; communicating kernels too, as a rank of the
//! device's world.
//!
//! Contract: every buffer argument is host memory. A kernel the CPU device does not
//! compile (`CpuError::Unsupported`: atomics, tensor descriptors, ranks on other
//! nodes, overlapping buffers) runs on the interpreter instead, with the same
//! results. With `TESSERA_CPU_JIT=background` a kernel whose code is not compiled
//! yet starts on the interpreter while LLVM compiles it ([`in_turns`]): each
//! program runs once, on one or the other.

use std::sync::Arc;
use std::time::Duration;

use tessera_codegen::cpu::{self, CpuError, CpuLaunch};
use tessera_ir::interp::{self, KernelArg};

use super::{Executor, Job, host_args};
use crate::compile::Compiled;
use crate::error::Error;

/// The compiled CPU device.
pub(crate) struct Cpu;

impl Executor for Cpu {
    fn launch(&self, job: &Job<'_>) -> Result<(), Error> {
        let kargs = host_args(job)?;
        let (device, compiled) = (job.device, job.compiled);
        let world = device.comm.as_ref().map(|c| c.interp_world());
        let config = crate::config::get()?;
        config.choose_host_cpu()?;
        let checks = if device.unchecked {
            // SAFETY: the handle comes from `Device::unchecked`, whose (unsafe) caller
            // vouches for every access.
            unsafe { cpu::Checks::unchecked() }
        } else {
            cpu::Checks::from(config.sanitize)
        };
        let in_turns = device.cpu_jit.unwrap_or(config.cpu_jit)
            == crate::config::CpuJit::Background
            && world.is_none()
            && !compiled.func.uses_blocking()
            && compiled.cpu_ready(checks).is_none();
        let ran = if in_turns {
            cpu_in_turns(compiled, checks, job.grid, &kargs, job.watchdog)?
        } else {
            match compiled.cpu_kernel(checks) {
                Ok(k) => cpu::launch_with(
                    &k,
                    &CpuLaunch {
                        grid: job.grid,
                        args: &kargs,
                        world: world.as_ref(),
                        timeout: job.watchdog,
                        claim: None,
                    },
                ),
                Err(e) => Err(e),
            }
        };
        match ran {
            Ok(()) => Ok(()),
            Err(CpuError::Unsupported { message, .. }) => {
                log::info!(
                    "kernel `{}` runs on the interpreter: {message}",
                    compiled.func.name
                );
                super::interp::run(job, &kargs, world.as_ref())
            }
            Err(CpuError::Exec(e)) => Err(e.into()),
            Err(e) => Err(Error::Codegen(Box::new(e))),
        }
    }
}

/// A launch on the CPU device of a kernel whose compiled code is not ready
/// (`TESSERA_CPU_JIT=background`): the interpreter takes the programs in order while
/// LLVM compiles the kernel on another thread, and once that has ended the programs
/// left run compiled. Programs do not wait for each other (the caller checks), so
/// any split runs each once with the results of either; an interpreter failure is
/// returned as is (every later program id is higher). What is left to run comes back
/// as the compiled launch's outcome, for the caller's usual handling (a kernel the
/// CPU device does not compile: the interpreter runs the rest).
#[allow(clippy::result_large_err)] // (the compiled launch's error, as `cpu::launch_with`'s)
fn cpu_in_turns(
    compiled: &Arc<Compiled>,
    checks: cpu::Checks,
    dims: [u32; 3],
    kargs: &[KernelArg],
    watchdog: Option<Duration>,
) -> Result<Result<(), CpuError>, Error> {
    let done = compiled.cpu_compiling(checks);
    in_turns(
        &compiled.func,
        dims,
        kargs,
        watchdog,
        &|| done.load(std::sync::atomic::Ordering::Acquire),
        || compiled.cpu_kernel(checks),
    )
}

/// How long the interpreter keeps every core while a kernel compiles (see
/// [`in_turns`]).
const SHARE_AFTER: Duration = Duration::from_millis(10);

/// About what LLVM takes to compile a kernel for the CPU (40–140 ms for the kernels
/// of BENCHMARKS.md's first-launch table on one core).
const COMPILE_GUESS: Duration = Duration::from_millis(50);

/// [`cpu_in_turns`] with what it waits for made explicit: `ready()` says whether
/// the compiler has ended (checked before the interpreter takes each program), and
/// `kernel()` gives its outcome then.
#[allow(clippy::result_large_err)] // (the compiled launch's error, as `cpu::launch_with`'s)
fn in_turns(
    func: &tessera_ir::Function,
    dims: [u32; 3],
    kargs: &[KernelArg],
    watchdog: Option<Duration>,
    ready: &(dyn Fn() -> bool + Sync),
    kernel: impl FnOnce() -> Result<Arc<cpu::CpuKernel>, CpuError>,
) -> Result<Result<(), CpuError>, Error> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let started = std::time::Instant::now();
    let total = dims.iter().map(|&g| u64::from(g)).product::<u64>();
    let next = AtomicU64::new(0);
    let take = || {
        let lin = next.fetch_add(1, Ordering::Relaxed);
        (lin < total).then_some(lin)
    };
    // Once the interpreter has had the machine for `SHARE_AFTER`, its last worker
    // stops if the programs left look longer than a compilation (`COMPILE_GUESS`, at
    // the rate so far), leaving a core to the compiler (which runs below the
    // launch's threads): a short launch keeps every core, a long one gets its
    // compiled code sooner.
    let workers = rayon::current_num_threads();
    let interpreting = |worker: Option<usize>| {
        let elapsed = started.elapsed();
        if workers < 2 || worker != Some(workers - 1) || elapsed < SHARE_AFTER {
            return true;
        }
        let done = next.load(Ordering::Relaxed).clamp(1, total);
        let left = elapsed.as_secs_f64() * (total - done) as f64 / done as f64;
        left < COMPILE_GUESS.as_secs_f64()
    };
    interp::run_claimed(func, dims, kargs, watchdog, &|| {
        if ready() || !interpreting(rayon::current_thread_index()) {
            None
        } else {
            take()
        }
    })?;
    if next.load(Ordering::Relaxed) >= total {
        return Ok(Ok(()));
    }
    let left = watchdog.map(|t| {
        t.saturating_sub(started.elapsed())
            .max(Duration::from_millis(1))
    });
    let rest_interpreted = |message: String| {
        log::info!("kernel `{}` runs on the interpreter: {message}", func.name);
        interp::run_claimed(func, dims, kargs, left, &take).map_err(CpuError::Exec)
    };
    Ok(match kernel() {
        Ok(k) => match cpu::launch_with(
            &k,
            &CpuLaunch {
                grid: dims,
                args: kargs,
                timeout: left,
                claim: Some(&take),
                ..Default::default()
            },
        ) {
            Err(CpuError::Unsupported { message, .. }) => rest_interpreted(message),
            r => r,
        },
        Err(CpuError::Unsupported { message, .. }) => rest_interpreted(message),
        Err(e) => Err(e),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use tessera_ir::interp::{HostBuffer, KernelArg, Scalar};

    /// `out[i] += x[i]` over tiles of 64: a program run twice, or not at all, shows.
    const ACCUMULATE: &str = r#"kernel @acc(%x: ptr<f32> {readonly}, %out: ptr<f32>, %n: i32) loc("t.rs":1:1) {
  %0 = program_id 0 : i32 loc("t.rs":2:1)
  %1 = const 64 : i32 loc("t.rs":2:1)
  %2 = mul %0, %1 : i32 loc("t.rs":2:1)
  %3 = arange 0, 64 : <64xi32> loc("t.rs":2:1)
  %4 = splat %2 : <64xi32> loc("t.rs":2:1)
  %5 = add %4, %3 : <64xi32> loc("t.rs":2:1)
  %6 = splat %n : <64xi32> loc("t.rs":3:1)
  %7 = cmp lt %5, %6 : <64xi1> loc("t.rs":3:1)
  %8 = splat %x : <64xptr<f32>> loc("t.rs":4:1)
  %9 = addptr %8, %5 : <64xptr<f32>> loc("t.rs":4:1)
  %10 = load %9, %7 : <64xf32> loc("t.rs":4:1)
  %11 = splat %out : <64xptr<f32>> loc("t.rs":5:1)
  %12 = addptr %11, %5 : <64xptr<f32>> loc("t.rs":5:1)
  %13 = load %12, %7 : <64xf32> loc("t.rs":5:1)
  %14 = add %10, %13 : <64xf32> loc("t.rs":5:1)
  store %12, %14, %7 loc("t.rs":5:1)
}"#;

    /// The compiler "ends" after the interpreter has asked `after` times; each
    /// element of `out` must then hold its start plus `x` exactly once.
    #[test]
    #[allow(clippy::result_large_err)]
    fn every_program_runs_once_whenever_the_compiler_ends() {
        let f = tessera_ir::parser::parse_function(ACCUMULATE).expect("parses");
        let n: usize = 64 * 37 + 5;
        let xs: Vec<f32> = (0..n).map(|i| (i % 11) as f32 + 0.5).collect();
        let start: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 100.0).collect();
        for after in [0u64, 1, 2, 10, 37, 38, 1000] {
            let out = Arc::new(HostBuffer::from_slice(&start));
            let args = [
                KernelArg::Buffer(Arc::new(HostBuffer::from_slice(&xs))),
                KernelArg::Buffer(Arc::clone(&out)),
                KernelArg::Scalar(Scalar::I32(n as i32)),
            ];
            let asked = AtomicU64::new(0);
            let compiled = AtomicU64::new(0);
            let r = in_turns(
                &f,
                [n.div_ceil(64) as u32, 1, 1],
                &args,
                None,
                &|| asked.fetch_add(1, Ordering::Relaxed) >= after,
                || {
                    compiled.fetch_add(1, Ordering::Relaxed);
                    tessera_codegen::cpu::compile(&f, tessera_codegen::cpu::Checks::BOUNDS)
                },
            );
            assert!(matches!(r, Ok(Ok(()))), "ready after {after}: {r:?}");
            let got = out.to_vec::<f32>().unwrap();
            for i in 0..n {
                assert_eq!(got[i], start[i] + xs[i], "ready after {after}: [{i}]");
            }
            // The compiled code ran the rest whenever the interpreter left some.
            let all_interpreted = after >= 38;
            assert_eq!(
                compiled.load(Ordering::Relaxed),
                u64::from(!all_interpreted),
                "ready after {after}"
            );
        }
    }
}
