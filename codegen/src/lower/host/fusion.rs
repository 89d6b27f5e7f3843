//! Which elementwise ops the host lowering fuses into their user ([`fusible`]): an
//! op whose only user is in its own region, with no effect in between that could
//! change what it reads, is computed where the user reads an element.

use super::*;

/// Which values may be computed where they are read ([`V::F`]) rather than
/// materialized, and what that assumes of the buffers.
pub(super) struct Fusion {
    /// Per value: fusible.
    pub(super) ok: Vec<bool>,
    /// Parameter pairs `(read, written)` whose buffers must not overlap: a fused load
    /// from the first is evaluated after (or while) a store to the second runs.
    pub(super) disjoint: Vec<(usize, usize)>,
}

/// Per value: whether it may be computed where it is read ([`V::F`]) rather than
/// materialized. That is the result of an elementwise op (not an integer division,
/// whose check must happen once, nor pointer arithmetic) or of a load from a
/// parameter's buffer, whose every use is by one op in the region that defines it (so
/// it is never recomputed per element by several consumers, nor per iteration of a
/// loop nested in its region). A load is read where the chain of fused ops it feeds
/// ends (its *sink*), so between it and that sink no op may write memory, except
/// stores into other parameters' buffers (recorded in [`Fusion::disjoint`]).
pub(super) fn fusible(f: &Function, prov: &[Prov]) -> Fusion {
    /// What an op does to memory.
    #[derive(Clone, Copy, PartialEq)]
    enum Eff {
        Pure,
        /// A store through pointers into this buffer.
        Store(Prov),
        Other,
    }
    struct Walk<'f> {
        f: &'f Function,
        prov: &'f [Prov],
        /// Per value: the region defining it (`usize::MAX`: a parameter or region
        /// argument, never fused).
        def: Vec<usize>,
        /// Per value: the op defining it.
        def_op: Vec<usize>,
        /// Per value: its only user so far, `(region, op)`.
        user: Vec<Option<(usize, usize)>>,
        ok: Vec<bool>,
        /// Per value: a load from parameter `k`'s buffer.
        load: Vec<Option<usize>>,
        /// Per op (in walk order): its effect and first result.
        eff: Vec<Eff>,
        result: Vec<Option<ValueId>>,
        regions: usize,
        ops: usize,
    }
    impl Walk<'_> {
        fn region(&mut self, r: &Region) {
            let me = self.regions;
            for op in &r.ops {
                self.ops += 1;
                let user = (me, self.ops);
                for &v in &op.operands {
                    let i = v.index();
                    match self.user[i] {
                        _ if self.def[i] != me => self.ok[i] = false,
                        None => self.user[i] = Some(user),
                        Some(u) if u == user => {}
                        Some(_) => self.ok[i] = false,
                    }
                }
                let float = |v: ValueId| self.f.ty(v).elem.scalar().is_some_and(|s| s.is_float());
                let elementwise = match &op.kind {
                    OpKind::Binary(BinaryOp::Div | BinaryOp::Rem) => float(op.operands[0]),
                    OpKind::Binary(_)
                    | OpKind::Unary(_)
                    | OpKind::Fma
                    | OpKind::Cmp(_)
                    | OpKind::Select
                    | OpKind::Cast
                    | OpKind::Bitcast => true,
                    _ => false,
                };
                let load = match (&op.kind, op.operands.first(), op.results.first()) {
                    (OpKind::Load { .. }, Some(&p), Some(&res))
                        if !self.f.ty(res).shape.is_empty() =>
                    {
                        match self.prov[p.index()] {
                            Prov::Param(k) => Some(k),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                let eff = match &op.kind {
                    OpKind::Store { .. } => Eff::Store(self.prov[op.operands[0].index()]),
                    OpKind::DescStore { .. }
                    | OpKind::AtomicRmw { .. }
                    | OpKind::AtomicCas { .. }
                    | OpKind::LocalAlloc { .. }
                    | OpKind::Signal { .. }
                    | OpKind::WaitUntil { .. }
                    | OpKind::Fence { .. }
                    | OpKind::BarrierAll
                    | OpKind::Print { .. }
                    | OpKind::Assert { .. } => Eff::Other,
                    _ => Eff::Pure,
                };
                self.eff.push(eff);
                self.result.push(op.results.first().copied());
                for &res in &op.results {
                    self.def[res.index()] = me;
                    self.def_op[res.index()] = self.ops;
                    self.ok[res.index()] = elementwise || load.is_some();
                    self.load[res.index()] = load;
                }
                for sub in &op.regions {
                    self.regions += 1;
                    for &a in &sub.args {
                        self.def[a.index()] = usize::MAX;
                    }
                    self.region(sub);
                }
            }
        }
    }
    let n = f.values.len();
    let mut w = Walk {
        f,
        prov,
        def: vec![usize::MAX; n],
        def_op: vec![0; n],
        user: vec![None; n],
        ok: vec![false; n],
        load: vec![None; n],
        // Op numbers start at 1.
        eff: vec![Eff::Pure],
        result: vec![None],
        regions: 0,
        ops: 0,
    };
    w.region(&f.body);
    let mut ok: Vec<bool> = (0..n).map(|i| w.ok[i] && w.user[i].is_some()).collect();
    let mut disjoint = Vec::new();
    for v in 0..n {
        let (Some(k), true) = (w.load[v], ok[v]) else {
            continue;
        };
        // The sink: follow single users through fusible elementwise ops.
        let mut sink = w.user[v].map_or(0, |u| u.1);
        while let Some(r) = w.result[sink] {
            match (ok[r.index()], w.user[r.index()]) {
                (true, Some(u)) => sink = u.1,
                _ => break,
            }
        }
        let mut pairs = Vec::new();
        let clear = (w.def_op[v] + 1..=sink).all(|i| match w.eff[i] {
            Eff::Pure => true,
            Eff::Store(Prov::Param(j)) if j != k => {
                pairs.push((k, j));
                true
            }
            _ => false,
        });
        if clear {
            disjoint.extend(pairs);
        } else {
            ok[v] = false;
        }
    }
    disjoint.sort_unstable();
    disjoint.dedup();
    Fusion { ok, disjoint }
}
