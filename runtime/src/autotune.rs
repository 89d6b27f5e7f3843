//! Autotuning: pick the fastest of several configurations of a kernel (comptime tile
//! sizes, [`crate::LaunchOptions`]) for a shape, once, and reuse the choice.
//!
//! A [`Tuner`] holds the configurations (any `Clone + Debug` type of yours; its
//! `Debug` text names a configuration on disk) and the kernel's name. Its
//! [`Tuner::run`] takes a *shape key* you choose (e.g. `"4096x4096x512 f16"`: the
//! launches that should share a winner) and a closure launching one configuration;
//! the first time a key is seen on a device, every configuration is timed on the
//! device ([`crate::bench::Bench`]: warm-up, then events on GPUs) and the fastest
//! wins. The winner is kept in memory and in the kernel disk cache (the
//! `TESSERA_CACHE_DIR` folder), so later runs and later processes launch it at once.
//! With `TESSERA_AUTOTUNE=off` the first configuration is used and nothing is timed.
//!
//! The closure runs several times while tuning, so it must be safe to repeat (a
//! kernel that overwrites its output, not one that accumulates into it).
//!
//! ```
//! # use tessera::prelude::*;
//! # use tessera::autotune::Tuner;
//! #[kernel]
//! fn scale<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
//!     let offs = program_id(0) * B + arange::<B>();
//!     out.store(offs, x.load(offs, offs.lt(n)) * 2.0, offs.lt(n));
//! }
//!
//! # fn main() -> Result<(), tessera::Error> {
//! #[derive(Clone, Debug)]
//! struct Config { block: usize, warps: u32 }
//! let tuner = Tuner::new("scale", vec![
//!     Config { block: 256, warps: 4 },
//!     Config { block: 1024, warps: 8 },
//! ]);
//! let dev = Device::cpu();
//! let n = 5000;
//! let x = dev.upload(&vec![1.0f32; n])?;
//! let mut out = dev.alloc::<f32>(n)?;
//! let best = tuner.run(&dev, &format!("n={n}"), |c| {
//!     let opts = LaunchOptions::new().num_warps(c.warps);
//!     match c.block {
//!         256 => scale::<256>::launch_with(&dev, n.div_ceil(256), &opts, (&x, &mut out, n as i32)),
//!         _ => scale::<1024>::launch_with(&dev, n.div_ceil(1024), &opts, (&x, &mut out, n as i32)),
//!     }
//! })?;
//! assert!(best.block == 256 || best.block == 1024);
//! assert!(out.download()?.iter().all(|&v| v == 2.0));
//! # Ok(())
//! # }
//! ```

//!
//! **The code generator is a dimension too.** On NVIDIA GPUs a kernel compiles through
//! Tessera's LLVM lowering or NVIDIA's Tile IR ([`crate::KernelBackend`]); which is
//! faster depends on the kernel and the shape. Cross the configurations with
//! [`crate::KernelBackend::available`] (LLVM alone off CUDA GPUs) and launch each
//! with [`crate::LaunchOptions::backend`]:
//!
//! ```
//! # use tessera::prelude::*;
//! # use tessera::autotune::Tuner;
//! # #[kernel]
//! # fn scale<const B: usize>(x: &Global<f32>, out: &mut Global<f32>, n: i32) {
//! #     let offs = program_id(0) * B + arange::<B>();
//! #     out.store(offs, x.load(offs, offs.lt(n)) * 2.0, offs.lt(n));
//! # }
//! # fn main() -> Result<(), tessera::Error> {
//! let dev = Device::cpu();
//! let configs: Vec<(u32, KernelBackend)> = KernelBackend::available(&dev)
//!     .into_iter()
//!     .flat_map(|b| [(4, b), (8, b)])
//!     .collect();
//! let tuner = Tuner::new("scale", configs);
//! let n = 4096;
//! let x = dev.upload(&vec![1.0f32; n])?;
//! let mut out = dev.alloc::<f32>(n)?;
//! let (_warps, backend) = tuner.run(&dev, &format!("n={n}"), |&(warps, backend)| {
//!     let opts = LaunchOptions::new().num_warps(warps).backend(backend);
//!     scale::<1024>::launch_with(&dev, n.div_ceil(1024), &opts, (&x, &mut out, n as i32))
//! })?;
//! assert_eq!(backend, KernelBackend::Llvm); // the only one on the CPU
//! # Ok(())
//! # }
//! ```

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::bench::Bench;
use crate::device::Device;
use crate::disk_cache::{CacheKey, DiskCache};
use crate::error::Error;

/// How a configuration is timed: given the configuration and a function that runs
/// it once (its launch, as [`Tuner::run`]'s closure does it), the time to compare.
pub type Timer<C> = Box<
    dyn Fn(&Device, &C, &mut dyn FnMut() -> Result<(), Error>) -> Result<Duration, Error>
        + Send
        + Sync,
>;

/// Chooses among configurations of a kernel (see the [module docs](self)).
pub struct Tuner<C> {
    kernel: String,
    configs: Vec<C>,
    timer: Timer<C>,
}

impl<C: Debug> std::fmt::Debug for Tuner<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tuner")
            .field("kernel", &self.kernel)
            .field("configs", &self.configs)
            .finish()
    }
}

/// Winners found in this process: (tuning key) -> configuration index.
fn winners() -> &'static Mutex<HashMap<String, usize>> {
    static W: OnceLock<Mutex<HashMap<String, usize>>> = OnceLock::new();
    W.get_or_init(|| Mutex::new(HashMap::new()))
}

/// What tuning found or did, for [`Tuner::run_explained`].
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    /// Tuning is off (`TESSERA_AUTOTUNE=off`): the first configuration.
    Off,
    /// Chosen earlier in this process.
    Memory,
    /// Chosen by an earlier process (read from the disk cache).
    Disk,
    /// Timed now: each configuration's time, in order.
    Timed(Vec<Duration>),
}

impl<C: Clone + Debug> Tuner<C> {
    /// A tuner of `kernel` (a name for the cache: the kernel's, or any text that
    /// identifies what is tuned) over `configs` (at least one), timing each with
    /// the default [`Bench`] (its median).
    pub fn new(kernel: impl Into<String>, configs: Vec<C>) -> Tuner<C> {
        Tuner {
            kernel: kernel.into(),
            configs,
            timer: Box::new(|dev, _, run| {
                Ok(Bench::new().warmup(1).reps(5).run(dev, run)?.median())
            }),
        }
    }

    /// With another way to time a configuration (e.g. more repetitions; or, in a
    /// test, a fake timer).
    pub fn with_timer(
        mut self,
        timer: impl Fn(&Device, &C, &mut dyn FnMut() -> Result<(), Error>) -> Result<Duration, Error>
        + Send
        + Sync
        + 'static,
    ) -> Tuner<C> {
        self.timer = Box::new(timer);
        self
    }

    /// The configurations.
    pub fn configs(&self) -> &[C] {
        &self.configs
    }

    /// Launches the best configuration for `shape_key` on `device` with `launch`
    /// (tuning first if this key was never tuned here or on disk), and returns it.
    pub fn run(
        &self,
        device: &Device,
        shape_key: &str,
        launch: impl FnMut(&C) -> Result<(), Error>,
    ) -> Result<C, Error> {
        self.run_explained(device, shape_key, launch)
            .map(|(c, _)| c)
    }

    /// [`Tuner::run`], also saying how the configuration was chosen.
    pub fn run_explained(
        &self,
        device: &Device,
        shape_key: &str,
        mut launch: impl FnMut(&C) -> Result<(), Error>,
    ) -> Result<(C, Choice), Error> {
        let Some(first) = self.configs.first() else {
            return Err(Error::Usage(format!(
                "autotuning `{}`: no configurations",
                self.kernel
            )));
        };
        let config = crate::config::get()?;
        if !config.autotune {
            launch(first)?;
            return Ok((first.clone(), Choice::Off));
        }
        let names: Vec<String> = self.configs.iter().map(|c| format!("{c:?}")).collect();
        // The device's name and target, the kernel, its configurations and the shape.
        let props = device.properties();
        let key = CacheKey::new(
            &format!("autotune {}\n{}", self.kernel, names.join("\n")),
            &format!("{} {} {}", device.id(), props.name, props.target),
            crate::artifact::COMPILER_VERSION,
            shape_key,
        );
        let remembered = winners()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key.hex())
            .copied();
        let disk = match remembered {
            Some(_) => None,
            None => DiskCache::from_env()?,
        };
        let (index, how) = match remembered {
            Some(i) => (i, Choice::Memory),
            None => match disk.as_ref().and_then(|d| stored_winner(d, &key, &names)) {
                Some(i) => (i, Choice::Disk),
                None => {
                    let mut times = Vec::with_capacity(self.configs.len());
                    for c in &self.configs {
                        times.push((self.timer)(device, c, &mut || launch(c))?);
                    }
                    let best = (0..times.len())
                        .min_by_key(|&i| times[i])
                        .unwrap_or_default();
                    if let Some(d) = &disk
                        && let Err(e) = d.put(&key, names[best].as_bytes())
                    {
                        log::warn!("autotuning `{}`: not saving the winner: {e}", self.kernel);
                    }
                    log::info!(
                        "autotuning `{}` for `{shape_key}` on {}: {} ({:?})",
                        self.kernel,
                        device.id(),
                        names[best],
                        times[best]
                    );
                    (best, Choice::Timed(times))
                }
            },
        };
        winners()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.hex(), index);
        let c = &self.configs[index];
        launch(c)?;
        Ok((c.clone(), how))
    }
}

/// The index of the configuration the disk cache names for `key` (its `Debug` text),
/// if it is one of `names`.
fn stored_winner(disk: &DiskCache, key: &CacheKey, names: &[String]) -> Option<usize> {
    let text = String::from_utf8(disk.get(key)?).ok()?;
    names.iter().position(|n| *n == text)
}
