//! The interpreter executor: tessera-ir's reference interpreter runs every program
//! instance on the host, on the buffers themselves.
//!
//! Contract: every buffer argument is host memory (else a launch error naming the
//! parameter); a communicating kernel runs as its device's rank (the world's
//! [`tessera_ir::interp::CommWorld`]); the device's watchdog bounds the launch. The
//! compiled CPU executor falls back to [`run`] for what it does not compile.

use tessera_ir::interp::{self, CommWorld, KernelArg};

use super::{Executor, Job, host_args};
use crate::error::Error;

/// The reference interpreter.
pub(crate) struct Interp;

impl Executor for Interp {
    fn launch(&self, job: &Job<'_>) -> Result<(), Error> {
        let kargs = host_args(job)?;
        let world = job.device.comm.as_ref().map(|c| c.interp_world());
        run(job, &kargs, world.as_ref())
    }
}

/// Runs `job` on the interpreter with its host arguments `kargs`, as a rank of
/// `world` (`None`: alone).
pub(crate) fn run(
    job: &Job<'_>,
    kargs: &[KernelArg],
    world: Option<&CommWorld>,
) -> Result<(), Error> {
    interp::run_limited(&job.compiled.func, job.grid, kargs, world, job.watchdog)?;
    Ok(())
}
