//! Pointer provenance: which kernel parameters' buffers a global pointer value may
//! point into, for checking targets (the emulator) to check each access against the
//! buffer it was derived from rather than against every buffer of the launch.
//!
//! Every global pointer of a kernel derives from its pointer parameters: `addptr` and
//! the shape ops (`splat`, `broadcast`, `expand_dims`, `reshape`, `permute`, `hint`)
//! keep their operand's buffer, `remote_ptr` moves it to a peer's copy of the same
//! symmetric buffer, and a `select` or a value carried through `for`, `while` or `if`
//! may point into any buffer of its incoming values (a *mixed* provenance: the access
//! is checked against that set of buffers). The analysis iterates to a fixpoint over
//! the loops' carried values. A global pointer of any other origin has no provenance
//! ([`analyze`] gives `None`): its accesses are checked against every buffer.
//!
//! The same rules as the compiled CPU device's (`lower::host`), which keeps one
//! parameter per pointer (its `Prov`).

use std::collections::BTreeSet;
use std::sync::Arc;

use tessera_ir::ir::{Function, Op, OpKind, Region};
use tessera_ir::{AddrSpace, Elem, ValueId};

/// The buffers a global pointer may point into: kernel parameters (indices into
/// [`Function::params`], ascending, at least one) and whether it may point into
/// another rank's copy of them (it went through `remote_ptr`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Provenance {
    /// The parameters, ascending: one unless the pointer's provenance is mixed.
    pub params: Vec<u32>,
    /// Any rank's copy of those parameters' symmetric buffers (a `remote_ptr`);
    /// otherwise this rank's own buffers only.
    pub remote: bool,
}

/// A value's state in the analysis.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum State {
    /// Not reached yet (or not a pointer).
    Unset,
    /// Derived from these parameters (through `remote_ptr` when `remote`).
    Known { params: BTreeSet<u32>, remote: bool },
    /// Of unknown origin.
    Unknown,
}

impl State {
    fn merge(&self, o: &State) -> State {
        match (self, o) {
            (State::Unset, x) | (x, State::Unset) => x.clone(),
            (State::Unknown, _) | (_, State::Unknown) => State::Unknown,
            (
                State::Known {
                    params: a,
                    remote: ra,
                },
                State::Known {
                    params: b,
                    remote: rb,
                },
            ) => State::Known {
                params: a.union(b).copied().collect(),
                remote: *ra || *rb,
            },
        }
    }
}

struct Walk<'a> {
    f: &'a Function,
    st: Vec<State>,
    changed: bool,
}

impl Walk<'_> {
    fn get(&self, v: ValueId) -> State {
        self.st.get(v.index()).cloned().unwrap_or(State::Unset)
    }

    /// Merges `s` into `v`'s state.
    fn join(&mut self, v: ValueId, s: &State) {
        let Some(cur) = self.st.get(v.index()) else {
            return;
        };
        let m = cur.merge(s);
        if m != *cur {
            self.st[v.index()] = m;
            self.changed = true;
        }
    }

    fn region(&mut self, r: &Region) {
        for op in &r.ops {
            self.op(op);
        }
    }

    fn op(&mut self, op: &Op) {
        let first = |w: &Self| op.operands.first().map_or(State::Unset, |&v| w.get(v));
        match &op.kind {
            OpKind::AddPtr
            | OpKind::Splat
            | OpKind::Broadcast
            | OpKind::ExpandDims { .. }
            | OpKind::Reshape
            | OpKind::Permute { .. }
            | OpKind::Hint { .. } => {
                let s = first(self);
                for &r in &op.results {
                    self.join(r, &s);
                }
            }
            OpKind::Select => {
                if let (Some(&a), Some(&b), Some(&r)) =
                    (op.operands.get(1), op.operands.get(2), op.results.first())
                {
                    let s = self.get(a).merge(&self.get(b));
                    self.join(r, &s);
                }
            }
            OpKind::RemotePtr => {
                let s = match first(self) {
                    State::Known { params, .. } => State::Known {
                        params,
                        remote: true,
                    },
                    s => s,
                };
                for &r in &op.results {
                    self.join(r, &s);
                }
            }
            OpKind::For => {
                // Operands: lb, ub, step, inits; region args: iv, iters.
                let Some(body) = op.regions.first() else {
                    return;
                };
                for (i, &a) in body.args.iter().skip(1).enumerate() {
                    if let Some(&init) = op.operands.get(3 + i) {
                        let s = self.get(init);
                        self.join(a, &s);
                    }
                }
                self.region(body);
                for (i, &y) in yields(body).iter().enumerate() {
                    let s = self.get(y);
                    if let Some(&a) = body.args.get(1 + i) {
                        self.join(a, &s);
                    }
                    if let Some(&r) = op.results.get(i) {
                        self.join(r, &s);
                    }
                }
                // Zero trips: the inits.
                for (i, &r) in op.results.iter().enumerate() {
                    if let Some(&init) = op.operands.get(3 + i) {
                        let s = self.get(init);
                        self.join(r, &s);
                    }
                }
            }
            OpKind::While => {
                // Region 0 takes the carried values (inits, then region 1's yields)
                // and forwards values through its `condition` to region 1 and the
                // results.
                let (Some(before), Some(after)) = (op.regions.first(), op.regions.get(1)) else {
                    return;
                };
                for (i, &a) in before.args.iter().enumerate() {
                    if let Some(&init) = op.operands.get(i) {
                        let s = self.get(init);
                        self.join(a, &s);
                    }
                }
                self.region(before);
                let fwd: Vec<ValueId> = before
                    .ops
                    .last()
                    .filter(|o| o.kind == OpKind::Condition)
                    .map_or_else(Vec::new, |o| o.operands.iter().skip(1).copied().collect());
                for (i, &v) in fwd.iter().enumerate() {
                    let s = self.get(v);
                    if let Some(&a) = after.args.get(i) {
                        self.join(a, &s);
                    }
                    if let Some(&r) = op.results.get(i) {
                        self.join(r, &s);
                    }
                }
                self.region(after);
                for (i, &y) in yields(after).iter().enumerate() {
                    let s = self.get(y);
                    if let Some(&a) = before.args.get(i) {
                        self.join(a, &s);
                    }
                }
            }
            OpKind::If => {
                for r in &op.regions {
                    self.region(r);
                    for (i, &y) in yields(r).iter().enumerate() {
                        if let Some(&res) = op.results.get(i) {
                            let s = self.get(y);
                            self.join(res, &s);
                        }
                    }
                }
            }
            _ => {
                for r in &op.regions {
                    self.region(r);
                }
                // A global pointer made any other way: of unknown origin.
                for &r in &op.results {
                    if is_global_ptr(self.f, r) {
                        self.join(r, &State::Unknown);
                    }
                }
            }
        }
    }
}

fn yields(r: &Region) -> &[ValueId] {
    r.ops
        .last()
        .filter(|o| o.kind == OpKind::Yield)
        .map_or(&[], |o| &o.operands[..])
}

fn is_global_ptr(f: &Function, v: ValueId) -> bool {
    f.values.get(v.index()).is_some_and(|d| {
        matches!(
            d.ty.elem,
            Elem::Ptr {
                space: AddrSpace::Global,
                ..
            }
        )
    })
}

/// The provenance of every value of `f` (indexed by [`ValueId::index`]): `Some` for a
/// global pointer derived from pointer parameters only, `None` otherwise.
pub fn analyze(f: &Function) -> Vec<Option<Arc<Provenance>>> {
    let mut w = Walk {
        f,
        st: vec![State::Unset; f.values.len()],
        changed: false,
    };
    for (k, p) in f.params.iter().enumerate() {
        if is_global_ptr(f, p.value) {
            w.join(
                p.value,
                &State::Known {
                    params: BTreeSet::from([k as u32]),
                    remote: false,
                },
            );
        }
    }
    // Each pass only grows states in a finite lattice; the bound is a safeguard.
    for _ in 0..64 {
        w.changed = false;
        w.region(&f.body);
        if !w.changed {
            break;
        }
    }
    let mut memo: std::collections::HashMap<State, Arc<Provenance>> = Default::default();
    w.st.iter()
        .zip(&f.values)
        .map(|(s, d)| match s {
            State::Known { params, remote }
                if matches!(
                    d.ty.elem,
                    Elem::Ptr {
                        space: AddrSpace::Global,
                        ..
                    }
                ) =>
            {
                let p = memo.entry(s.clone()).or_insert_with(|| {
                    Arc::new(Provenance {
                        params: params.iter().copied().collect(),
                        remote: *remote,
                    })
                });
                Some(p.clone())
            }
            _ => None,
        })
        .collect()
}

/// The pointer operand through which `op` accesses memory, if it is an access
/// (`load`, `store`, atomics, `signal`, `wait_until`, tensor-descriptor accesses).
pub fn accessed_pointer(op: &Op) -> Option<ValueId> {
    match op.kind {
        OpKind::Load { .. }
        | OpKind::Store { .. }
        | OpKind::AtomicRmw { .. }
        | OpKind::AtomicCas { .. }
        | OpKind::Signal { .. }
        | OpKind::WaitUntil { .. }
        | OpKind::DescLoad { .. }
        | OpKind::DescStore { .. } => op.operands.first().copied(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The provenance of each access's pointer, in program order.
    fn accesses(src: &str) -> Vec<Option<(Vec<u32>, bool)>> {
        let f = tessera_ir::parser::parse_function(src).expect("valid IR");
        let p = analyze(&f);
        let mut out = Vec::new();
        f.walk(&mut |op| {
            if let Some(v) = accessed_pointer(op) {
                out.push(p[v.index()].as_ref().map(|p| (p.params.clone(), p.remote)));
            }
        });
        out
    }

    #[test]
    fn pointers_keep_the_parameter_they_derive_from() {
        let got = accesses(
            r#"kernel @k(%x: ptr<f32>, %y: ptr<f32>, %out: ptr<f32>, %n: i32) {
  %0 = arange 0, 64 : <64xi32>
  %1 = splat %x : <64xptr<f32>>
  %2 = addptr %1, %0 : <64xptr<f32>>
  %3 = load %2 : <64xf32>
  %4 = const 0 : i32
  %5 = cmp lt %4, %n : i1
  %6 = select %5, %x, %y : ptr<f32>
  %7 = addptr %6, %n : ptr<f32>
  %8 = load %7 : f32
  %9 = const 1 : i32
  %10 = for %4, %n, %9 iter(%out) : ptr<f32> {
  ^(%11: i32, %12: ptr<f32>):
    %13 = addptr %12, %11 : ptr<f32>
    store %13, %8
    %14 = select %5, %12, %x : ptr<f32>
    yield %14
  }
  %15 = remote_ptr %y, %4 : ptr<f32>
  store %15, %8
  store %10, %8
}
"#,
        );
        assert_eq!(
            got,
            vec![
                Some((vec![0], false)),
                // A select between two parameters' pointers: either buffer.
                Some((vec![0, 1], false)),
                // Carried through the loop, where a later iteration selects `x`.
                Some((vec![0, 2], false)),
                Some((vec![1], true)),
                Some((vec![0, 2], false)),
            ]
        );
    }

    #[test]
    fn while_and_if_carry_every_incoming_buffer() {
        let got = accesses(
            r#"kernel @k(%x: ptr<f32>, %y: ptr<f32>, %out: ptr<f32>, %n: i32) {
  %0 = const 0 : i32
  %1 = cmp lt %0, %n : i1
  %2 = while %x : ptr<f32> {
  ^(%3: ptr<f32>):
    %4 = load %3 : f32
    condition %1, %3
  } do {
  ^(%5: ptr<f32>):
    %6 = addptr %y, %n : ptr<f32>
    yield %6
  }
  %7 = load %2 : f32
  %8 = if %1 : ptr<f32> {
    yield %out
  } else {
    yield %x
  }
  store %8, %7
}
"#,
        );
        assert_eq!(
            got,
            vec![
                // The carried value: `x`, then what the after-region yields (`y`).
                Some((vec![0, 1], false)),
                Some((vec![0, 1], false)),
                Some((vec![0, 2], false)),
            ]
        );
    }
}
