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

/// Runs `f`, printing the error and exiting with status 1 on failure.
pub fn run_main(f: impl FnOnce() -> Result<(), Box<dyn std::error::Error>>) {
    if let Err(e) = f() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
