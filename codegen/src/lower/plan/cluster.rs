//! TMA multicast in thread-block clusters: which operands of a warp-specialized
//! ring every block of a cluster row loads alike.
//!
//! A launch in clusters of `cx * cy * cz` blocks ([`crate::CompileOptions::cluster`])
//! groups blocks whose `program_id`s differ only within the cluster. An operand
//! block whose coordinates do not depend on `program_id(a)` for a clustered axis
//! `a` (`ca > 1`) is the same for the blocks of the cluster along `a`: one copy,
//! multicast to all of them, does the work of `ca`. [`multicast_axes`] finds those
//! axes from the ops that compute the copy's operands: constants, parameters,
//! `program_id`, `num_programs`, pure scalar arithmetic and the loop's induction
//! variable (whose bounds must be the same across the whole cluster, so that every
//! block of it runs the same iterations). Anything else (a loaded value, an
//! atomic's result) may differ between blocks, and the operand is not multicast.

use std::collections::HashMap;

use tessera_ir::ir::{Op, OpKind};
use tessera_ir::{Function, ValueId};

/// What a value's computation reads of the grid position: a bit per `program_id`
/// axis, or `None` when it may differ between blocks in another way.
type Axes = Option<u8>;

/// The defining op of every op result of `f`, and the induction variable of every
/// `for` with its bound operands.
pub(super) struct Defs<'a> {
    ops: HashMap<ValueId, &'a Op>,
    ivs: HashMap<ValueId, &'a Op>,
    params: Vec<ValueId>,
}

impl<'a> Defs<'a> {
    pub(super) fn new(f: &'a Function) -> Defs<'a> {
        let mut ops = HashMap::new();
        let mut ivs = HashMap::new();
        fn go<'a>(
            r: &'a tessera_ir::ir::Region,
            ops: &mut HashMap<ValueId, &'a Op>,
            ivs: &mut HashMap<ValueId, &'a Op>,
        ) {
            for op in &r.ops {
                for &v in &op.results {
                    ops.insert(v, op);
                }
                if op.kind == OpKind::For
                    && let Some(&iv) = op.regions.first().and_then(|b| b.args.first())
                {
                    ivs.insert(iv, op);
                }
                for sub in &op.regions {
                    go(sub, ops, ivs);
                }
            }
        }
        go(&f.body, &mut ops, &mut ivs);
        Defs {
            ops,
            ivs,
            params: f.params.iter().map(|p| p.value).collect(),
        }
    }

    /// The `program_id` axes `v` depends on (see [`Axes`]).
    pub(super) fn axes(&self, f: &Function, v: ValueId) -> Axes {
        self.axes_depth(f, v, 0)
    }

    fn axes_depth(&self, f: &Function, v: ValueId, depth: u32) -> Axes {
        // (Scalar computations are short; a deep one is not worth following.)
        if depth > 64 {
            return None;
        }
        if self.params.contains(&v) {
            return Some(0);
        }
        let all = |vs: &[ValueId]| {
            vs.iter()
                .try_fold(0u8, |m, &x| Some(m | self.axes_depth(f, x, depth + 1)?))
        };
        if let Some(for_op) = self.ivs.get(&v) {
            // The induction variable: from its bounds and step.
            return all(&for_op.operands[..3.min(for_op.operands.len())]);
        }
        let op = self.ops.get(&v)?;
        match op.kind {
            OpKind::ProgramId { axis } => Some(1 << axis),
            OpKind::NumPrograms { .. } | OpKind::Const(_) => Some(0),
            _ if op.kind.is_pure()
                && op.regions.is_empty()
                && op.results.iter().all(|&r| f.ty(r).shape.is_empty()) =>
            {
                all(&op.operands)
            }
            _ => None,
        }
    }
}

/// The clustered axes (a bit per axis with `cluster[a] > 1`) along which every
/// block of a cluster computes the same operands for all of `ops` (the loads of one
/// ring operand) and the same bounds for loop `for_op`: the axes to multicast the
/// operand along (0: not multicast).
pub(super) fn multicast_axes(
    f: &Function,
    defs: &Defs<'_>,
    cluster: [u32; 3],
    for_op: &Op,
    ops: &[&Op],
) -> u8 {
    let clustered = (0..3)
        .filter(|&a| cluster[a] > 1)
        .fold(0u8, |m, a| m | 1 << a);
    if clustered == 0 {
        return 0;
    }
    let mut used = 0u8;
    for &v in for_op.operands.iter().take(3) {
        match defs.axes(f, v) {
            Some(m) if m & clustered == 0 => {}
            _ => return 0,
        }
    }
    for op in ops {
        for &v in &op.operands {
            match defs.axes(f, v) {
                Some(m) => used |= m,
                None => return 0,
            }
        }
    }
    clustered & !used
}
