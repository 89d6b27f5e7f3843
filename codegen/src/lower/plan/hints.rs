//! Layout hints for loop-carried values: a value that a `dot` (or a reduction of a
//! `dot`'s result, or an inner loop's hinted value) yields into the next iteration
//! takes that producer's layout, so it crosses the back edge with no conversion.

use tessera_ir::ValueId;
use tessera_ir::ir::{Op, OpKind, Region};

use super::Planner;
use crate::layout::Layout;
use crate::lower::dot;

impl<'a> Planner<'_, 'a, '_> {
    /// Loop-carried values fed by a `dot` get the `dot`'s result layout; so do those
    /// fed by a nested loop's carried value that has a hint (a loop over the sources
    /// of a sequence-parallel attention, around the loop over each one's keys), which
    /// therefore cross both back edges with no conversion. Inner loops first.
    pub(super) fn compute_hints(&mut self, r: &Region) {
        for op in &r.ops {
            for sub in &op.regions {
                self.compute_hints(sub);
            }
            if op.kind == OpKind::For {
                let body = &op.regions[0];
                if let Some(y) = body.ops.last() {
                    for (i, &yv) in y.operands.iter().enumerate() {
                        let def = body.ops.iter().find(|o| o.results.contains(&yv));
                        let Some(&arg) = body.args.get(i + 1) else {
                            continue;
                        };
                        match def {
                            Some(d) if d.kind == OpKind::Dot => {
                                if let Some(l) = dot::mma_layout(self.l, d) {
                                    self.plan.hints.insert(arg, l);
                                }
                            }
                            Some(d) if d.kind == OpKind::For => {
                                // Result `j` of the inner loop is its body's argument
                                // `j + 1`.
                                let j = d.results.iter().position(|&x| x == yv);
                                let inner = j.and_then(|j| d.regions[0].args.get(j + 1));
                                if let Some(&ia) = inner
                                    && let Some(l) = self.plan.hints.get(&ia).cloned()
                                {
                                    self.plan.hints.insert(arg, l);
                                    if let Some(p) = self.plan.parents.get(&ia).cloned() {
                                        self.plan.parents.insert(arg, p);
                                    }
                                }
                            }
                            _ => {
                                if let Some((l, parent)) = self.reduce_hint(body, yv, 0) {
                                    self.plan.hints.insert(arg, l);
                                    self.plan.parents.insert(arg, parent);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The layout for a loop-carried statistic of a `dot` result (FlashAttention's
    /// running row max and sum): a value of `body` computed elementwise from a
    /// reduction along `axis` of a tile that the body computes elementwise from a
    /// `dot` gets that `dot`'s accumulator layout sliced along `axis`, the layout the
    /// reduction produces, so the statistic crosses the back edge and meets the
    /// reduction with no conversion.
    /// Returns the sliced layout and its parent (the accumulator layout).
    fn reduce_hint(&self, body: &Region, v: ValueId, depth: u32) -> Option<(Layout, Layout)> {
        if depth > 8 {
            return None;
        }
        let d = body.ops.iter().find(|o| o.results.contains(&v))?;
        match &d.kind {
            OpKind::Reduce { axis, .. } => {
                let root = Self::dot_root(body, d.operands[0], 0)?;
                let parent = dot::mma_layout(self.l, root)?;
                Some((parent.sliced(*axis as usize), parent))
            }
            OpKind::Binary(_) | OpKind::Unary(_) | OpKind::Fma | OpKind::Select => d
                .operands
                .iter()
                .find_map(|&o| self.reduce_hint(body, o, depth + 1)),
            _ => None,
        }
    }

    /// The `dot` of `body` that `v` is computed from elementwise (same shape), if any.
    fn dot_root(body: &Region, v: ValueId, depth: u32) -> Option<&Op> {
        if depth > 8 {
            return None;
        }
        let d = body.ops.iter().find(|o| o.results.contains(&v))?;
        match &d.kind {
            OpKind::Dot => Some(d),
            OpKind::Binary(_) | OpKind::Unary(_) | OpKind::Fma | OpKind::Select | OpKind::Cast => d
                .operands
                .iter()
                .find_map(|&o| Self::dot_root(body, o, depth + 1)),
            _ => None,
        }
    }
}
