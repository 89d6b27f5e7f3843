//! Optimization passes on verified IR: canonicalization with constant folding
//! ([`canonicalize`](fn@canonicalize)), common-subexpression elimination
//! ([`cse`](fn@cse)) and dead-code elimination ([`dce`](fn@dce)); [`optimize`] runs
//! them to a fixed point.
//!
//! Every rewrite preserves the semantics documented on [`OpKind`](crate::ir::OpKind)
//! exactly: integer arithmetic wraps, shift amounts are taken modulo the bit width,
//! floats behave as in Rust (including NaN and signed zeros). Folds whose result the
//! documentation leaves open are not done: integer division or remainder by zero or of
//! `MIN` by `-1`, `min`/`max` of two zeros of different signs, ordering comparisons of
//! `i1`, casts from or to `i1`, transcendental functions, and conversions whose result
//! depends on whether the conversion rounds once or twice.
//!
//! The passes leave unused entries in [`Function::values`]; that is fine (the printer
//! renumbers values).
//!
//! Each pass has its own file: `canonicalize.rs` (rewrites and the folding driver),
//! `fold.rs` (the constant evaluators it calls), `cse.rs` and `dce.rs`;
//! `specialize.rs` (launch facts as parameter attributes) and `scaled.rs`
//! ([`expand_dot_scaled`], for the backends without block-scaled instructions);
//! `emit.rs` builds ops inside a pass; this file
//! holds the driver, [`replace_all_uses`] and what the passes share. The tests of a
//! pass sit with it; `tests.rs` holds the shared test helpers and the tests of
//! [`optimize`] and [`replace_all_uses`].

use std::collections::HashMap;

use crate::ir::{Function, Region, ValueId};

mod canonicalize;
mod cse;
mod dce;
pub(crate) mod emit;
mod fold;
mod scaled;
mod specialize;
#[cfg(test)]
mod tests;

pub use canonicalize::canonicalize;
pub use cse::cse;
pub use dce::dce;
pub use scaled::expand_dot_scaled;
pub use specialize::specialize;

/// Most rounds of [`optimize`] before it stops even without a fixed point.
pub const MAX_OPTIMIZE_ROUNDS: usize = 32;

/// Runs [`canonicalize`](fn@canonicalize), [`cse`](fn@cse) and [`dce`](fn@dce) until
/// none changes anything (at most [`MAX_OPTIMIZE_ROUNDS`] rounds).
pub fn optimize(f: &mut Function) {
    for _ in 0..MAX_OPTIMIZE_ROUNDS {
        let mut changed = canonicalize(f);
        changed |= cse(f);
        changed |= dce(f);
        if !changed {
            break;
        }
    }
}

/// Rewrites every use (operand) of `old` into `new`, in all regions; returns how many
/// operands changed. Definitions are left alone.
pub fn replace_all_uses(f: &mut Function, old: ValueId, new: ValueId) -> usize {
    fn go(r: &mut Region, old: ValueId, new: ValueId) -> usize {
        let mut n = 0;
        for op in &mut r.ops {
            for o in &mut op.operands {
                if *o == old {
                    *o = new;
                    n += 1;
                }
            }
            for sub in &mut op.regions {
                n += go(sub, old, new);
            }
        }
        n
    }
    go(&mut f.body, old, new)
}

/// Follows `map` from `v` to the value that replaces it.
fn resolve(map: &HashMap<ValueId, ValueId>, mut v: ValueId) -> ValueId {
    while let Some(&n) = map.get(&v) {
        v = n;
    }
    v
}
