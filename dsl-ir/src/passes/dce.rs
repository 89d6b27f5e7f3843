//! Dead-code elimination: [`dce`] removes unused ops whose removal cannot change
//! behaviour.

use crate::ir::{Function, Op, OpKind, Region};

/// Removes ops whose results are unused and whose removal cannot change behaviour;
/// returns whether anything changed:
///
/// - pure ops (see [`OpKind::is_pure`]) with no used result, repeatedly (a chain of
///   dead ops goes in one call);
/// - `for` and `if` ops with no used result whose regions hold only pure ops,
///   terminators and such `for`/`if` ops (no loads, stores, atomics, barriers or
///   `while`). A `for` always terminates, so deleting it is safe.
///
/// Never removed: ops with side effects, loads (they may fault), `while` (it may not
/// terminate), terminators, region arguments, and unused results of kept loops.
pub fn dce(f: &mut Function) -> bool {
    let mut uses = vec![0u32; f.values.len()];
    fn count(r: &Region, uses: &mut [u32]) {
        for op in &r.ops {
            for &o in &op.operands {
                uses[o.index()] += 1;
            }
            for sub in &op.regions {
                count(sub, uses);
            }
        }
    }
    count(&f.body, &mut uses);
    let mut changed = false;
    dce_region(&mut f.body, &mut uses, &mut changed);
    changed
}

/// True when the regions hold nothing that has an effect or may not terminate.
fn regions_removable(regions: &[Region]) -> bool {
    regions.iter().all(|r| {
        r.ops.iter().all(|op| match op.kind {
            OpKind::For | OpKind::If => regions_removable(&op.regions),
            OpKind::Yield => true,
            ref k => k.is_pure(),
        })
    })
}

fn uncount(op: &Op, uses: &mut [u32]) {
    for &o in &op.operands {
        uses[o.index()] -= 1;
    }
    for sub in &op.regions {
        for inner in &sub.ops {
            uncount(inner, uses);
        }
    }
}

fn dce_region(r: &mut Region, uses: &mut [u32], changed: &mut bool) {
    let mut i = r.ops.len();
    while i > 0 {
        i -= 1;
        let op = &mut r.ops[i];
        for sub in op.regions.iter_mut().rev() {
            dce_region(sub, uses, changed);
        }
        let unused = op.results.iter().all(|v| uses[v.index()] == 0);
        let removable = match op.kind {
            OpKind::For | OpKind::If => regions_removable(&op.regions),
            ref k => k.is_pure(),
        };
        if unused && removable {
            let op = r.ops.remove(i);
            uncount(&op, uses);
            *changed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::builder::FunctionBuilder;
    use crate::ir::{AtomicOp, BinaryOp, CmpPred, MemOrder, MemScope, OpKind, ParamAttrs};
    use crate::passes::tests::*;
    use crate::types::{ScalarType, Type};

    #[test]
    fn dce_keeps_effects_and_removes_dead_code() {
        let i32t = st(ScalarType::I32);
        let mut b = FunctionBuilder::new("k", sp());
        let p = b.param(
            "p",
            Type::global_ptr(ScalarType::I32),
            ParamAttrs::default(),
        );
        let x = b.param("x", i32t.clone(), ParamAttrs::default());
        // A dead chain of pure ops.
        let d1 = bin(&mut b, BinaryOp::Add, x, x);
        let d2 = bin(&mut b, BinaryOp::Mul, d1, x);
        let _d3 = b
            .op1(OpKind::Cmp(CmpPred::Lt), &[d2, x], None, sp())
            .unwrap();
        // A dead load (kept: may fault), an atomic with unused result (kept).
        b.op1(
            OpKind::Load {
                has_mask: false,
                has_other: false,
            },
            &[p],
            None,
            sp(),
        )
        .unwrap();
        b.op1(
            OpKind::AtomicRmw {
                op: AtomicOp::Add,
                order: MemOrder::Relaxed,
                scope: MemScope::Device,
                has_mask: false,
            },
            &[p, x],
            None,
            sp(),
        )
        .unwrap();
        let zero = b.const_i32(0, sp()).unwrap();
        let one = b.const_i32(1, sp()).unwrap();
        // Loop with a store, unused results: kept.
        let args = b.open_region(&[i32t.clone(), i32t.clone()]);
        let q = b.op1(OpKind::AddPtr, &[p, args[0]], None, sp()).unwrap();
        b.op(OpKind::Store { has_mask: false }, &[q, args[1]], None, sp())
            .unwrap();
        let dead_in = bin(&mut b, BinaryOp::Mul, args[0], args[0]);
        let _ = dead_in;
        b.push_op(OpKind::Yield, vec![args[1]], vec![], vec![], sp());
        let body = b.close_region();
        b.push_op(
            OpKind::For,
            vec![zero, x, one, x],
            vec![i32t.clone()],
            vec![body],
            sp(),
        );
        // Pure loop with unused results: removed.
        let args = b.open_region(&[i32t.clone(), i32t.clone()]);
        let s = bin(&mut b, BinaryOp::Add, args[0], args[1]);
        b.push_op(OpKind::Yield, vec![s], vec![], vec![], sp());
        let body = b.close_region();
        b.push_op(
            OpKind::For,
            vec![zero, x, one, x],
            vec![i32t.clone()],
            vec![body],
            sp(),
        );
        // Pure while with unused results: kept (may not terminate).
        let before = b.open_region(std::slice::from_ref(&i32t));
        let c = b
            .op1(OpKind::Cmp(CmpPred::Lt), &[before[0], x], None, sp())
            .unwrap();
        b.push_op(OpKind::Condition, vec![c, before[0]], vec![], vec![], sp());
        let before_r = b.close_region();
        let after = b.open_region(std::slice::from_ref(&i32t));
        b.push_op(OpKind::Yield, vec![after[0]], vec![], vec![], sp());
        let after_r = b.close_region();
        b.push_op(
            OpKind::While,
            vec![zero],
            vec![i32t],
            vec![before_r, after_r],
            sp(),
        );
        b.push_op(OpKind::Barrier, vec![], vec![], vec![], sp());
        let f = opt(b.finish());
        assert_eq!(count(&f, "for"), 1);
        assert_eq!(count(&f, "store"), 1);
        assert_eq!(count(&f, "while"), 1);
        assert_eq!(count(&f, "load"), 1);
        assert_eq!(count(&f, "atomic_rmw"), 1);
        assert_eq!(count(&f, "barrier"), 1);
        assert_eq!(count(&f, "mul"), 0, "dead ops removed, also inside loops");
        assert_eq!(count(&f, "add"), 0);
        assert_eq!(count(&f, "cmp"), 1, "the while's condition stays");
    }
}
