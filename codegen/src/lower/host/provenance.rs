//! Per value, which parameters a pointer derives from ([`provenance`]): an access
//! through it is checked against those buffers only, and a pointer that may reach
//! a peer's heap is checked against the world's.

use super::*;

/// Where a pointer value points: into parameter `k`'s buffer, into some rank's
/// copy of it, into one of several buffers, or not known yet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Prov {
    Unset,
    Param(usize),
    Remote(usize),
    Mixed,
}

impl Prov {
    pub(super) fn merge(self, o: Prov) -> Prov {
        match (self, o) {
            (Prov::Unset, x) | (x, Prov::Unset) => x,
            (a, b) if a == b => a,
            (Prov::Param(a) | Prov::Remote(a), Prov::Param(b) | Prov::Remote(b)) if a == b => {
                Prov::Remote(a)
            }
            _ => Prov::Mixed,
        }
    }
}

/// Which parameter's buffer every pointer value points into (loop-carried pointers
/// take a second pass).
pub(super) fn provenance(f: &Function) -> Vec<Prov> {
    let mut p = vec![Prov::Unset; f.values.len()];
    for (k, prm) in f.params.iter().enumerate() {
        if matches!(f.ty(prm.value).elem, Elem::Ptr { .. }) {
            p[prm.value.index()] = Prov::Param(k);
        }
    }
    pub(super) fn yields(r: &Region) -> &[ValueId] {
        r.ops
            .last()
            .filter(|o| o.kind == OpKind::Yield)
            .map_or(&[], |o| &o.operands[..])
    }
    pub(super) fn walk(r: &Region, p: &mut Vec<Prov>) {
        for op in &r.ops {
            let get = |p: &Vec<Prov>, v: ValueId| p[v.index()];
            match &op.kind {
                OpKind::AddPtr
                | OpKind::Splat
                | OpKind::Broadcast
                | OpKind::ExpandDims { .. }
                | OpKind::Reshape
                | OpKind::Permute { .. }
                | OpKind::Hint { .. } => {
                    let v = get(p, op.operands[0]);
                    p[op.results[0].index()] = v;
                }
                OpKind::Select => {
                    let v = get(p, op.operands[1]).merge(get(p, op.operands[2]));
                    p[op.results[0].index()] = v;
                }
                OpKind::RemotePtr => {
                    p[op.results[0].index()] = match get(p, op.operands[0]) {
                        Prov::Param(k) | Prov::Remote(k) => Prov::Remote(k),
                        x => x,
                    };
                }
                OpKind::For => {
                    let body = &op.regions[0];
                    for (i, &a) in body.args.iter().skip(1).enumerate() {
                        let v = get(p, a).merge(get(p, op.operands[3 + i]));
                        p[a.index()] = v;
                    }
                    walk(body, p);
                    for (i, &y) in yields(body).iter().enumerate() {
                        if let (Some(&a), Some(&r)) = (body.args.get(1 + i), op.results.get(i)) {
                            let v = get(p, a).merge(get(p, y));
                            p[a.index()] = v;
                            p[r.index()] = v;
                        }
                    }
                }
                OpKind::If => {
                    for r in &op.regions {
                        walk(r, p);
                        for (i, &y) in yields(r).iter().enumerate() {
                            if let Some(&res) = op.results.get(i) {
                                let v = get(p, res).merge(get(p, y));
                                p[res.index()] = v;
                            }
                        }
                    }
                }
                _ => {
                    for r in &op.regions {
                        walk(r, p);
                    }
                }
            }
        }
    }
    walk(&f.body, &mut p);
    walk(&f.body, &mut p);
    p
}
