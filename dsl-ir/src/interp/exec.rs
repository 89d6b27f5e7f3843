//! The evaluator's driver: argument checking, the parallel grid of program
//! instances, and the plan of each region made once per launch. One program
//! instance runs in `prog.rs`.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use super::InterpError;
use super::buffer::HostBuffer;
use super::comm::{CommWorld, MAX_RESIDENT};
use super::prog::{Exec, Plan};
use super::value::{Data, KernelArg, PtrTile, Slots};
use crate::ir::{Function, ValueId};
use crate::types::Elem;

/// Runs kernel `f` on every program instance of `grid` with launch arguments `args`.
///
/// Arguments are checked against the parameters first (count, buffer element type
/// against the pointee type, scalar type), then all program instances run in parallel.
/// On failure the error of the lowest failing program id is returned (see the
/// [module docs](super)).
pub fn run(f: &Function, grid: [u32; 3], args: &[KernelArg]) -> Result<(), InterpError> {
    run_in_world(f, grid, args, None)
}

/// [`run`] as one rank of `world` (see the [module docs](super) on communication);
/// `None` runs as rank 0 of a world of one. When a program instance fails, the world
/// is aborted (every rank's waits stop) before the error is returned.
pub fn run_in_world(
    f: &Function,
    grid: [u32; 3],
    args: &[KernelArg],
    world: Option<&CommWorld>,
) -> Result<(), InterpError> {
    run_limited(f, grid, args, world, None)
}

/// [`run_in_world`] with a watchdog: once the launch has run for `timeout`, every
/// program stops at its next loop test (`for`, `while`) and the launch fails with
/// [`InterpError::LaunchTimeout`] naming the loop. `None`: no limit.
pub fn run_limited(
    f: &Function,
    grid: [u32; 3],
    args: &[KernelArg],
    world: Option<&CommWorld>,
    timeout: Option<std::time::Duration>,
) -> Result<(), InterpError> {
    drive(f, grid, args, world, timeout, None)
}

/// [`run_limited`] over the program instances `claim` hands out (their linear ids,
/// `x` fastest), until it returns `None`: the interpreter and compiled code can take
/// turns at one launch's programs (the CPU device runs a kernel's first launch so
/// while LLVM compiles it). Each id must be handed out once. A kernel whose programs
/// wait for each other (`wait_until`, `barrier_all`) is refused: they must all be
/// resident at once. On failure the error of the lowest failing id run here is
/// returned.
pub fn run_claimed(
    f: &Function,
    grid: [u32; 3],
    args: &[KernelArg],
    timeout: Option<std::time::Duration>,
    claim: &(dyn Fn() -> Option<u64> + Sync),
) -> Result<(), InterpError> {
    if f.uses_blocking() {
        return Err(InterpError::Unsupported {
            kernel: f.name.clone(),
            op: "launch",
            span: f.span.clone(),
            message: "the programs of a kernel that waits cannot be run in turns".into(),
        });
    }
    drive(f, grid, args, None, timeout, Some(claim))
}

fn drive(
    f: &Function,
    grid: [u32; 3],
    args: &[KernelArg],
    world: Option<&CommWorld>,
    timeout: Option<std::time::Duration>,
    claim: Option<&(dyn Fn() -> Option<u64> + Sync)>,
) -> Result<(), InterpError> {
    let world = world.cloned().unwrap_or_else(CommWorld::single);
    let bound = check_args(f, args, &world)?;
    let total = grid
        .iter()
        .try_fold(1u64, |n, &g| n.checked_mul(g as u64))
        .ok_or_else(|| InterpError::GridTooLarge {
            kernel: f.name.clone(),
            grid,
        })?;
    if total == 0 {
        return Ok(());
    }
    let blocking = f.uses_blocking();
    if blocking && total > MAX_RESIDENT {
        return Err(InterpError::TooManyPrograms {
            kernel: f.name.clone(),
            span: f.span.clone(),
            programs: total,
            limit: MAX_RESIDENT,
        });
    }
    let ex = Exec {
        f,
        grid,
        bufs: bound.bufs,
        remote_base: bound.remote_base,
        slot_names: bound.slot_names,
        params: bound.params,
        plan: Plan::new(f),
        world,
        best: AtomicU64::new(u64::MAX),
        err: Mutex::new(None),
        watchdog: timeout.map(|t| (std::time::Instant::now() + t, t)),
    };
    let nvalues = f.values.len();
    if let Some(claim) = claim {
        // One loop a worker, each taking the next program as it finishes one.
        (0..rayon::current_num_threads())
            .into_par_iter()
            .for_each_init(
                || vec![None; nvalues],
                |env, _| {
                    while let Some(lin) = claim() {
                        if lin < total {
                            ex.run_program(env, lin);
                        }
                    }
                },
            );
    } else if blocking {
        // Every program instance on its own thread: they may wait for each other.
        std::thread::scope(|s| {
            for lin in 0..total {
                let ex = &ex;
                s.spawn(move || ex.run_program(&mut vec![None; nvalues], lin));
            }
        });
    } else {
        (0..total)
            .into_par_iter()
            .for_each_init(|| vec![None; nvalues], |env, lin| ex.run_program(env, lin));
    }
    let err = ex.err.into_inner().unwrap_or_else(|e| e.into_inner());
    // The kernel's writes through a communication engine are complete when the
    // launch is, whether it failed or not.
    let quiet = ex.world.quiet();
    match err {
        Some((_, e)) => Err(e),
        None => quiet,
    }
}

/// Buffers by slot (parameters first, then every rank's copy of each symmetric
/// parameter), the remote slot base of each parameter slot, slot names, and the
/// initial values of the parameters.
struct Bound<'a> {
    bufs: Vec<Option<&'a HostBuffer>>,
    remote_base: Vec<Option<u32>>,
    slot_names: Vec<String>,
    params: Vec<(ValueId, Data)>,
}

fn check_args<'a>(
    f: &Function,
    args: &'a [KernelArg],
    world: &CommWorld,
) -> Result<Bound<'a>, InterpError> {
    let mismatch = |param: &str, message: String| InterpError::ArgMismatch {
        kernel: f.name.clone(),
        span: f.span.clone(),
        param: param.to_string(),
        message,
    };
    if args.len() != f.params.len() {
        return Err(mismatch(
            "<count>",
            format!(
                "expected {} argument(s), got {}",
                f.params.len(),
                args.len()
            ),
        ));
    }
    let mut bufs = Vec::with_capacity(args.len());
    let mut params = Vec::with_capacity(args.len());
    let mut remote: Vec<(usize, &'a [Arc<HostBuffer>])> = Vec::new();
    for (i, (p, a)) in f.params.iter().zip(args).enumerate() {
        let ty = f
            .values
            .get(p.value.index())
            .map(|v| &v.ty)
            .ok_or_else(|| mismatch(&p.name, "parameter has no value".into()))?;
        if !ty.is_scalar() {
            return Err(mismatch(
                &p.name,
                format!("tile parameters ({ty}) are not supported"),
            ));
        }
        match (ty.elem, a) {
            (Elem::Ptr { pointee, .. }, KernelArg::Buffer(b)) => {
                if b.elem() != pointee {
                    return Err(mismatch(
                        &p.name,
                        format!(
                            "expected a buffer of {pointee} for {ty}, got a buffer of {}",
                            b.elem()
                        ),
                    ));
                }
                bufs.push(Some(&**b));
                params.push((
                    p.value,
                    Data::Ptr(PtrTile {
                        slots: Slots::Uniform(i as u32),
                        offs: vec![0],
                    }),
                ));
            }
            (Elem::Ptr { pointee, .. }, KernelArg::Symmetric(copies)) => {
                if copies.len() != world.size as usize {
                    return Err(mismatch(
                        &p.name,
                        format!(
                            "a symmetric buffer with {} copies in a world of {} rank(s)",
                            copies.len(),
                            world.size
                        ),
                    ));
                }
                let local = &copies[world.rank as usize];
                if let Some(b) = copies.iter().find(|b| b.elem() != pointee) {
                    return Err(mismatch(
                        &p.name,
                        format!(
                            "expected a buffer of {pointee} for {ty}, got a buffer of {}",
                            b.elem()
                        ),
                    ));
                }
                bufs.push(Some(&**local));
                remote.push((i, copies));
                params.push((
                    p.value,
                    Data::Ptr(PtrTile {
                        slots: Slots::Uniform(i as u32),
                        offs: vec![0],
                    }),
                ));
            }
            (Elem::Ptr { .. }, KernelArg::Scalar(s)) => {
                return Err(mismatch(
                    &p.name,
                    format!("expected a buffer for {ty}, got scalar {s}"),
                ));
            }
            (Elem::Scalar(st), KernelArg::Scalar(s)) => {
                if s.ty() != st {
                    return Err(mismatch(
                        &p.name,
                        format!("expected a scalar of type {st}, got {s}"),
                    ));
                }
                bufs.push(None);
                params.push((p.value, s.to_data()));
            }
            (Elem::Scalar(st), KernelArg::Buffer(_) | KernelArg::Symmetric(_)) => {
                return Err(mismatch(
                    &p.name,
                    format!("expected a scalar of type {st}, got a buffer"),
                ));
            }
        }
    }
    let mut slot_names: Vec<String> = f.params.iter().map(|p| p.name.clone()).collect();
    let mut remote_base = vec![None; bufs.len()];
    for (i, copies) in remote {
        remote_base[i] = Some(bufs.len() as u32);
        for (r, b) in copies.iter().enumerate() {
            bufs.push(Some(&**b));
            slot_names.push(format!("{} (rank {r}'s copy)", f.params[i].name));
        }
    }
    Ok(Bound {
        bufs,
        remote_base,
        slot_names,
        params,
    })
}
