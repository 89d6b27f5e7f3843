//! Timing kernels: warm-up, device time (events on GPUs, the wall clock on the CPU
//! and the emulator), minimum and median, and paired comparisons.
//!
//! ```
//! # use tessera::prelude::*;
//! # use tessera::bench::Bench;
//! # fn main() -> Result<(), tessera::Error> {
//! let dev = Device::cpu();
//! let t = Bench::new().warmup(1).reps(5).run(&dev, || Ok(()))?;
//! assert_eq!(t.samples().len(), 5);
//! assert!(t.min() <= t.median());
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use crate::device::Device;
use crate::error::Error;

/// How to time: warm-up runs (not measured: they compile, fill caches and wake the
/// device), then measured runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bench {
    warmup: usize,
    reps: usize,
}

impl Default for Bench {
    /// Two warm-up runs, ten measured.
    fn default() -> Bench {
        Bench {
            warmup: 2,
            reps: 10,
        }
    }
}

/// The measured times of one piece of work, sorted.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    samples: Vec<Duration>,
}

impl Timing {
    /// A timing of `samples` (any order; at least one).
    pub fn new(mut samples: Vec<Duration>) -> Timing {
        samples.sort();
        Timing { samples }
    }

    /// The measured times, fastest first.
    pub fn samples(&self) -> &[Duration] {
        &self.samples
    }

    /// The fastest run.
    pub fn min(&self) -> Duration {
        self.samples.first().copied().unwrap_or_default()
    }

    /// The median run (the lower middle one for an even count).
    pub fn median(&self) -> Duration {
        self.samples
            .get(self.samples.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or_default()
    }

    /// The slowest run.
    pub fn max(&self) -> Duration {
        self.samples.last().copied().unwrap_or_default()
    }
}

/// Two pieces of work timed in alternation ([`Bench::compare`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The first one's times.
    pub a: Timing,
    /// The second one's times.
    pub b: Timing,
    /// The median over the pairs of `a`'s time over `b`'s (above 1: `a` is slower).
    pub ratio: f64,
}

impl Bench {
    /// The defaults: two warm-up runs, ten measured.
    pub fn new() -> Bench {
        Bench::default()
    }

    /// With `n` warm-up runs.
    pub fn warmup(mut self, n: usize) -> Bench {
        self.warmup = n;
        self
    }

    /// With `n` measured runs (at least one).
    pub fn reps(mut self, n: usize) -> Bench {
        self.reps = n.max(1);
        self
    }

    /// Times `f` on `device`: each measured run is the device time of the work `f`
    /// queues (events around it on a GPU, then waiting for them; the wall clock on
    /// the CPU and the emulator, whose work runs when queued).
    pub fn run(
        &self,
        device: &Device,
        mut f: impl FnMut() -> Result<(), Error>,
    ) -> Result<Timing, Error> {
        for _ in 0..self.warmup {
            f()?;
        }
        device.synchronize()?;
        let mut samples = Vec::with_capacity(self.reps);
        for _ in 0..self.reps {
            samples.push(device.time(&mut f)?.1);
        }
        Ok(Timing::new(samples))
    }

    /// Times `a` and `b` in alternation (`a, b, a, b, ...` after both warm up), so
    /// that drift (clocks, temperature, other load) affects both alike; the ratio is
    /// the median of the per-pair ratios.
    pub fn compare(
        &self,
        device: &Device,
        mut a: impl FnMut() -> Result<(), Error>,
        mut b: impl FnMut() -> Result<(), Error>,
    ) -> Result<Comparison, Error> {
        for _ in 0..self.warmup {
            a()?;
            b()?;
        }
        device.synchronize()?;
        let (mut ta, mut tb, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..self.reps {
            let x = device.time(&mut a)?.1;
            let y = device.time(&mut b)?.1;
            ta.push(x);
            tb.push(y);
            ratios.push(x.as_secs_f64() / y.as_secs_f64().max(1e-12));
        }
        ratios.sort_by(f64::total_cmp);
        Ok(Comparison {
            a: Timing::new(ta),
            b: Timing::new(tb),
            ratio: ratios[(ratios.len() - 1) / 2],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_of_sorted_samples() {
        let ms = Duration::from_millis;
        let t = Timing::new(vec![ms(5), ms(1), ms(3), ms(2)]);
        assert_eq!(t.samples(), &[ms(1), ms(2), ms(3), ms(5)]);
        assert_eq!((t.min(), t.median(), t.max()), (ms(1), ms(2), ms(5)));
        assert_eq!(Timing::new(vec![ms(7)]).median(), ms(7));
    }

    #[test]
    fn runs_warm_up_then_measure_and_pairs_alternate() {
        let dev = Device::cpu();
        let mut calls = 0;
        let t = Bench::new()
            .warmup(3)
            .reps(4)
            .run(&dev, || {
                calls += 1;
                Ok(())
            })
            .unwrap();
        assert_eq!((calls, t.samples().len()), (7, 4));
        let order = std::cell::RefCell::new(String::new());
        let c = Bench::new()
            .warmup(1)
            .reps(3)
            .compare(
                &dev,
                || {
                    order.borrow_mut().push('a');
                    std::thread::sleep(Duration::from_millis(6));
                    Ok(())
                },
                || {
                    order.borrow_mut().push('b');
                    std::thread::sleep(Duration::from_millis(2));
                    Ok(())
                },
            )
            .unwrap();
        assert_eq!(order.into_inner(), "abababab");
        assert!(c.ratio > 1.0, "{c:?}");
        assert!(c.a.min() >= Duration::from_millis(6), "{c:?}");
        // An error stops the timing.
        let e = Bench::new()
            .run(&dev, || Err(Error::Usage("stop".into())))
            .unwrap_err();
        assert_eq!(e.to_string(), "stop");
    }
}
