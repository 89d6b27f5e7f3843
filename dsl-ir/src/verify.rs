//! The verifier: checks that a [`Function`] is well formed before it is printed,
//! interpreted, optimized or compiled.
//!
//! Checked:
//!
//! - **SSA**: every value is defined exactly once (as a parameter, a region argument or
//!   an op result) and every operand is visible where it is used. A value is visible in
//!   its region after its definition and in every region nested there; region arguments
//!   are visible in their region; parameters everywhere. A value defined inside a
//!   region is not visible after the op that owns the region, nor in sibling regions.
//! - **Types**: the results of every op without regions have the count and types that
//!   [`infer_result_types`] computes from the operand types (the actual result type is
//!   the hint of `const`, `splat`, `broadcast`, `reshape` and `cast`); every shape obeys
//!   [`check_shape`]; parameters are scalars or scalar pointers.
//! - **Structured control flow**: `for`, `if` and `while` have the regions, region
//!   arguments, terminators and result types their documentation in [`OpKind`] gives;
//!   terminators appear only as the last op of a nested region (the body has none).
//!
//! Not checked: that a `barrier` is reached by all threads (e.g. not inside an `if`
//! whose condition differs between threads); that a `for` step is positive at run time.

use crate::infer::{check_shape, infer_result_types};
use crate::ir::{Function, Op, OpKind, Region, Span, ValueId};
use crate::types::{Elem, ScalarType, Type};

/// A verifier finding: the span of the offending op (or of the kernel), the kernel's
/// name and a message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{span}: in kernel `{kernel}`: {message}")]
pub struct VerifyError {
    /// Where: the span of the offending op, or of the kernel for parameter errors.
    pub span: Span,
    /// The kernel's name.
    pub kernel: String,
    /// What is wrong.
    pub message: String,
    /// The kernel's own mistake that the verifier is the first to see (a write
    /// through a read-only parameter, say through a peer's copy of it), not a bug in
    /// Tessera's tracing or passes.
    pub user: bool,
}

/// Verifies `f`, returning the first error found (in program order).
pub fn verify(f: &Function) -> Result<(), VerifyError> {
    match verify_all(f).into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Verifies `f`, returning every error found (empty when `f` is well formed).
pub fn verify_all(f: &Function) -> Vec<VerifyError> {
    let mut v = Verifier::new(f);
    v.run();
    v.errors
}

/// Where a region sits, which decides the terminator it must end with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RegionRole {
    /// The kernel body: no terminator.
    Body,
    /// Ends in `yield`.
    Yield,
    /// The before-region of a `while`: ends in `condition`.
    Condition,
}

struct Verifier<'a> {
    f: &'a Function,
    errors: Vec<VerifyError>,
    /// Whether a value has a definition anywhere in the function (pre-pass).
    has_def: Vec<bool>,
    /// Whether a value's definition has been seen so far in the walk.
    defined: Vec<bool>,
    /// Whether a value is visible at the current point of the walk.
    visible: Vec<bool>,
    /// Values defined in each open region, to hide them when it closes.
    scopes: Vec<Vec<ValueId>>,
}

impl<'a> Verifier<'a> {
    fn new(f: &'a Function) -> Self {
        let n = f.values.len();
        let mut has_def = vec![false; n];
        let mut mark = |v: ValueId| {
            if let Some(d) = has_def.get_mut(v.index()) {
                *d = true;
            }
        };
        for p in &f.params {
            mark(p.value);
        }
        fn go(r: &Region, mark: &mut impl FnMut(ValueId)) {
            for &a in &r.args {
                mark(a);
            }
            for op in &r.ops {
                for &res in &op.results {
                    mark(res);
                }
                for sub in &op.regions {
                    go(sub, mark);
                }
            }
        }
        go(&f.body, &mut mark);
        Verifier {
            f,
            errors: Vec::new(),
            has_def,
            defined: vec![false; n],
            visible: vec![false; n],
            scopes: vec![Vec::new()],
        }
    }

    fn err(&mut self, span: &Span, message: impl Into<String>) {
        self.errors.push(VerifyError {
            span: span.clone(),
            kernel: self.f.name.clone(),
            message: message.into(),
            user: false,
        });
    }

    fn exists(&self, v: ValueId) -> bool {
        v.index() < self.f.values.len()
    }

    /// Records a definition of `v` (a parameter, region argument or result); `what`
    /// names it for messages. Returns false when `v` is not in the value table.
    fn define(&mut self, v: ValueId, span: &Span, what: &str) -> bool {
        if !self.exists(v) {
            self.err(
                span,
                format!(
                    "{what} {v} is not in the value table ({} values)",
                    self.f.values.len()
                ),
            );
            return false;
        }
        if self.defined[v.index()] {
            self.err(span, format!("{what} {v} is defined more than once"));
        }
        self.defined[v.index()] = true;
        self.visible[v.index()] = true;
        self.scopes
            .last_mut()
            .expect("a scope is always open")
            .push(v);
        if let Err(m) = check_shape(&self.f.ty(v).shape) {
            self.err(span, format!("{what} {v}: {m}"));
        }
        true
    }

    fn run(&mut self) {
        let f = self.f;
        for p in &f.params {
            let what = format!("parameter `{}`", p.name);
            if self.define(p.value, &f.span, &what) {
                let t = f.ty(p.value);
                if !t.is_scalar() {
                    self.err(
                        &f.span,
                        format!("{what} must be a scalar or a scalar pointer, got {t}"),
                    );
                } else if t.scalar_type().is_some_and(ScalarType::is_fp8) {
                    self.err(
                        &f.span,
                        format!(
                            "{what}: an 8-bit float scalar parameter is not supported; pass an f32 and cast it"
                        ),
                    );
                }
            }
        }
        if !f.body.args.is_empty() {
            self.err(&f.span, "the kernel body must not have region arguments");
        }
        self.region(&f.body, RegionRole::Body, &f.span);
        self.readonly_writes();
    }

    /// Refuses writes (stores, atomics, signals, descriptor stores) through pointers
    /// derived from a `readonly` parameter (`&Global`/`&Symmetric`): through a peer's
    /// copy (`x.on(p)`) or any pointer computed from it. A launch only borrows such a
    /// buffer shared (`&Buffer`), so the host may hold other references to it that a
    /// write would break. Pointers are derived through pointer arithmetic and shape
    /// ops; a pointer loaded from memory derives from nothing here, and pointers
    /// carried through loops or yielded from `if`s (which the DSL never makes, only
    /// textual IR) are not followed.
    fn readonly_writes(&mut self) {
        let f = self.f;
        let mut origin: Vec<Option<usize>> = vec![None; f.values.len()];
        for (i, p) in f.params.iter().enumerate() {
            if p.attrs.readonly
                && let Some(o) = origin.get_mut(p.value.index())
            {
                *o = Some(i);
            }
        }
        fn walk(
            r: &Region,
            f: &Function,
            origin: &mut [Option<usize>],
            found: &mut Vec<(Span, String)>,
        ) {
            let of =
                |origin: &[Option<usize>], v: ValueId| origin.get(v.index()).copied().flatten();
            for op in &r.ops {
                let writes = matches!(
                    op.kind,
                    OpKind::Store { .. }
                        | OpKind::AtomicRmw { .. }
                        | OpKind::AtomicCas { .. }
                        | OpKind::Signal { .. }
                        | OpKind::DescStore { .. }
                );
                if writes
                    && let Some(&ptr) = op.operands.first()
                    && let Some(p) = of(origin, ptr)
                {
                    found.push((
                        op.span.clone(),
                        format!(
                            "`{}` writes through `{}`, a read-only parameter (declared `&`, not `&mut`), here through a pointer derived from it (a peer's copy or an offset); declare it `&mut` to write",
                            op.kind.mnemonic(),
                            f.params[p].name
                        ),
                    ));
                }
                let reads = matches!(
                    op.kind,
                    OpKind::Load { .. }
                        | OpKind::DescLoad { .. }
                        | OpKind::AtomicRmw { .. }
                        | OpKind::AtomicCas { .. }
                        | OpKind::WaitUntil { .. }
                );
                if !reads && let Some(p) = op.operands.iter().find_map(|&v| of(origin, v)) {
                    for &res in &op.results {
                        if matches!(f.ty(res).elem, Elem::Ptr { .. })
                            && let Some(o) = origin.get_mut(res.index())
                        {
                            *o = Some(p);
                        }
                    }
                }
                for sub in &op.regions {
                    walk(sub, f, origin, found);
                }
            }
        }
        let mut found = Vec::new();
        walk(&f.body, f, &mut origin, &mut found);
        for (span, message) in found {
            self.err(&span, message);
            if let Some(e) = self.errors.last_mut() {
                e.user = true;
            }
        }
    }

    /// Walks a region whose scope the caller has already opened (args defined).
    fn region_ops(&mut self, r: &'a Region, role: RegionRole, owner: &Span) {
        let n = r.ops.len();
        for (i, op) in r.ops.iter().enumerate() {
            let last = i + 1 == n;
            if op.kind.is_terminator() {
                match role {
                    RegionRole::Body => self.err(
                        &op.span,
                        format!(
                            "terminator `{}` is not allowed in the kernel body",
                            op.kind.mnemonic()
                        ),
                    ),
                    _ if !last => self.err(
                        &op.span,
                        format!(
                            "terminator `{}` must be the last op of its region",
                            op.kind.mnemonic()
                        ),
                    ),
                    _ => {}
                }
            }
            self.op(op);
        }
        let want = match role {
            RegionRole::Body => return,
            RegionRole::Yield => OpKind::Yield,
            RegionRole::Condition => OpKind::Condition,
        };
        match r.ops.last() {
            Some(op) if op.kind == want => {}
            Some(op) if op.kind.is_terminator() => self.err(
                &op.span,
                format!(
                    "this region must end in `{}`, not `{}`",
                    want.mnemonic(),
                    op.kind.mnemonic()
                ),
            ),
            Some(op) => self.err(
                &op.span,
                format!(
                    "region must end in `{}`, but its last op is `{}`",
                    want.mnemonic(),
                    op.kind.mnemonic()
                ),
            ),
            None => self.err(
                owner,
                format!("empty region: it must end in `{}`", want.mnemonic()),
            ),
        }
    }

    fn region(&mut self, r: &'a Region, role: RegionRole, owner: &Span) {
        self.scopes.push(Vec::new());
        for (i, &a) in r.args.iter().enumerate() {
            self.define(a, owner, &format!("region argument #{i}"));
        }
        self.region_ops(r, role, owner);
        for v in self.scopes.pop().expect("pushed above") {
            self.visible[v.index()] = false;
        }
    }

    /// Checks that every operand is visible; returns their types if all exist.
    fn operands(&mut self, op: &'a Op) -> Option<Vec<&'a Type>> {
        let f = self.f;
        let mut ok = true;
        for (i, &v) in op.operands.iter().enumerate() {
            let m = op.kind.mnemonic();
            if !self.exists(v) {
                self.err(
                    &op.span,
                    format!("operand #{i} ({v}) of `{m}` is not in the value table"),
                );
                ok = false;
            } else if !self.visible[v.index()] {
                let why = if !self.has_def[v.index()] {
                    "is never defined"
                } else if self.defined[v.index()] {
                    "is not visible here: it is defined inside a region that does not \
                     enclose this use"
                } else {
                    "is used before its definition"
                };
                self.err(&op.span, format!("operand #{i} ({v}) of `{m}` {why}"));
            }
        }
        ok.then(|| op.operands.iter().map(|&v| f.ty(v)).collect())
    }

    fn op(&mut self, op: &'a Op) {
        let m = op.kind.mnemonic();
        let tys = self.operands(op);
        // Region ops check their regions before their results come into scope.
        let n_regions = match op.kind {
            OpKind::For => 1,
            OpKind::If | OpKind::While => 2,
            _ => 0,
        };
        if op.regions.len() != n_regions {
            self.err(
                &op.span,
                format!(
                    "`{m}` must have {n_regions} region(s), has {}",
                    op.regions.len()
                ),
            );
        }
        let results_exist = op.results.iter().all(|&r| self.exists(r));
        match op.kind {
            OpKind::For | OpKind::If | OpKind::While => {
                if op.regions.len() == n_regions {
                    self.region_op(op, tys.as_deref(), results_exist);
                }
            }
            OpKind::Yield | OpKind::Condition => {
                if !op.results.is_empty() {
                    self.err(&op.span, format!("terminator `{m}` must not have results"));
                }
                // The operands are checked against the parent by `region_op`.
            }
            _ => {
                if let (Some(tys), true) = (&tys, results_exist) {
                    self.plain_op(op, tys);
                }
            }
        }
        for (i, &r) in op.results.iter().enumerate() {
            self.define(r, &op.span, &format!("result #{i} of `{m}`"));
        }
    }

    fn plain_op(&mut self, op: &Op, tys: &[&Type]) {
        let f = self.f;
        let m = op.kind.mnemonic();
        let hint = match op.kind {
            OpKind::Const(_)
            | OpKind::Splat
            | OpKind::Broadcast
            | OpKind::Reshape
            | OpKind::Cast
            | OpKind::Bitcast
            | OpKind::LocalAlloc { .. }
            | OpKind::DescLoad { .. } => op.results.first().map(|&r| f.ty(r)),
            _ => None,
        };
        match infer_result_types(&op.kind, tys, hint) {
            Err(msg) => self.err(&op.span, format!("invalid `{m}`: {msg}")),
            Ok(want) => {
                if want.len() != op.results.len() {
                    self.err(
                        &op.span,
                        format!(
                            "`{m}` must have {} result(s), has {}",
                            want.len(),
                            op.results.len()
                        ),
                    );
                    return;
                }
                for (i, (w, &r)) in want.iter().zip(&op.results).enumerate() {
                    let got = f.ty(r);
                    if got != w {
                        self.err(
                            &op.span,
                            format!(
                                "result #{i} of `{m}` has type {got}, but its operands give {w}"
                            ),
                        );
                    }
                }
            }
        }
    }

    /// Types of the operands of the terminator ending `r`, if it is one of `kind` and
    /// all its operands exist.
    fn terminator_types(&self, r: &'a Region, kind: &OpKind) -> Option<(&'a Op, Vec<&'a Type>)> {
        let f = self.f;
        let t = r.ops.last().filter(|op| op.kind == *kind)?;
        if t.operands.iter().all(|&v| self.exists(v)) {
            Some((t, t.operands.iter().map(|&v| f.ty(v)).collect()))
        } else {
            None
        }
    }

    /// Checks that region `ri` of `op` has arguments of types `want`.
    fn check_args(&mut self, op: &Op, ri: usize, want: &[&Type], what: &str) {
        let f = self.f;
        let r = &op.regions[ri];
        let m = op.kind.mnemonic();
        if r.args.len() != want.len() {
            self.err(
                &op.span,
                format!(
                    "region #{ri} of `{m}` must have {} argument(s) ({what}), has {}",
                    want.len(),
                    r.args.len()
                ),
            );
            return;
        }
        for (i, (&a, w)) in r.args.iter().zip(want).enumerate() {
            if self.exists(a) && f.ty(a) != *w {
                self.err(
                    &op.span,
                    format!(
                        "argument #{i} of region #{ri} of `{m}` has type {}, expected {w} ({what})",
                        f.ty(a)
                    ),
                );
            }
        }
    }

    /// Checks the operand types of the terminator of region `ri` against `want`.
    fn check_terminator(
        &mut self,
        op: &'a Op,
        ri: usize,
        kind: &OpKind,
        want: &[&Type],
        what: &str,
    ) {
        let Some((t, got)) = self.terminator_types(&op.regions[ri], kind) else {
            return;
        };
        let tm = kind.mnemonic();
        if got.len() != want.len() {
            self.err(
                &t.span,
                format!(
                    "`{tm}` must have {} operand(s) ({what}), has {}",
                    want.len(),
                    got.len()
                ),
            );
            return;
        }
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            if g != w {
                self.err(
                    &t.span,
                    format!(
                        "operand #{i} ({}) of `{tm}` has type {g}, expected {w} ({what})",
                        t.operands[i]
                    ),
                );
            }
        }
    }

    fn region_op(&mut self, op: &'a Op, tys: Option<&[&'a Type]>, results_exist: bool) {
        let f = self.f;
        let m = op.kind.mnemonic();
        let res: Option<Vec<&'a Type>> =
            results_exist.then(|| op.results.iter().map(|&r| f.ty(r)).collect());
        match op.kind {
            OpKind::For => {
                if op.operands.len() < 3 {
                    self.err(
                        &op.span,
                        format!(
                            "`for` takes lb, ub, step and init values: at least 3 operands, got {}",
                            op.operands.len()
                        ),
                    );
                    self.region(&op.regions[0], RegionRole::Yield, &op.span);
                    return;
                }
                let mut iv_ty = None;
                if let Some(tys) = tys {
                    let bound = tys[0];
                    let ok_ty = |t: &Type| {
                        t.is_scalar()
                            && matches!(
                                t.elem,
                                Elem::Scalar(ScalarType::I32) | Elem::Scalar(ScalarType::I64)
                            )
                    };
                    let names = ["lower bound", "upper bound", "step"];
                    for i in 0..3 {
                        if !ok_ty(tys[i]) {
                            self.err(
                                &op.span,
                                format!(
                                    "operand #{i} ({}) of `for`, the {}, must be a scalar i32 or i64, got {}",
                                    op.operands[i], names[i], tys[i]
                                ),
                            );
                        } else if tys[i] != bound && ok_ty(bound) {
                            self.err(
                                &op.span,
                                format!(
                                    "operand #{i} ({}) of `for`, the {}, has type {}, but the lower bound has type {bound}: bounds must share one type",
                                    op.operands[i], names[i], tys[i]
                                ),
                            );
                        }
                    }
                    if ok_ty(bound) {
                        iv_ty = Some(bound);
                    }
                    let inits = &tys[3..];
                    if let Some(res) = &res {
                        self.check_results(op, inits, res, "the init values");
                    }
                    if let Some(iv) = iv_ty {
                        let mut want = vec![iv];
                        want.extend_from_slice(inits);
                        self.check_args(
                            op,
                            0,
                            &want,
                            "the induction variable, then the init types",
                        );
                    }
                    self.check_terminator(op, 0, &OpKind::Yield, inits, "the init types");
                }
                self.region(&op.regions[0], RegionRole::Yield, &op.span);
            }
            OpKind::If => {
                if op.operands.len() != 1 {
                    self.err(
                        &op.span,
                        format!(
                            "`if` takes 1 operand (the condition), got {}",
                            op.operands.len()
                        ),
                    );
                } else if let Some(tys) = tys
                    && *tys[0] != Type::scalar(ScalarType::I1)
                {
                    self.err(
                        &op.span,
                        format!(
                            "operand #0 ({}) of `if`, the condition, must be a scalar i1, got {}",
                            op.operands[0], tys[0]
                        ),
                    );
                }
                for ri in 0..2 {
                    self.check_args(op, ri, &[], "`if` regions take no arguments");
                    if let Some(res) = &res {
                        self.check_terminator(op, ri, &OpKind::Yield, res, "the result types");
                    }
                    self.region(&op.regions[ri], RegionRole::Yield, &op.span);
                }
            }
            OpKind::While => {
                if let Some(tys) = tys {
                    self.check_args(op, 0, tys, "the init types");
                    self.check_terminator(op, 1, &OpKind::Yield, tys, "the init types");
                }
                if let Some(res) = &res {
                    self.check_args(op, 1, res, "the result types");
                    if let Some((t, got)) =
                        self.terminator_types(&op.regions[0], &OpKind::Condition)
                    {
                        if got.is_empty() {
                            self.err(&t.span, "`condition` needs a condition operand");
                        } else {
                            if *got[0] != Type::scalar(ScalarType::I1) {
                                self.err(
                                    &t.span,
                                    format!(
                                        "operand #0 ({}) of `condition` must be a scalar i1, got {}",
                                        t.operands[0], got[0]
                                    ),
                                );
                            }
                            let fwd = &got[1..];
                            if fwd.len() != res.len() {
                                self.err(
                                    &t.span,
                                    format!(
                                        "`condition` forwards {} value(s), but `while` has {} result(s)",
                                        fwd.len(),
                                        res.len()
                                    ),
                                );
                            } else {
                                for (i, (g, w)) in fwd.iter().zip(res).enumerate() {
                                    if g != w {
                                        self.err(
                                            &t.span,
                                            format!(
                                                "operand #{} ({}) of `condition` has type {g}, expected {w} (result #{i} of `while`)",
                                                i + 1,
                                                t.operands[i + 1]
                                            ),
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
                self.region(&op.regions[0], RegionRole::Condition, &op.span);
                self.region(&op.regions[1], RegionRole::Yield, &op.span);
            }
            _ => unreachable!("`{m}` has no regions"),
        }
    }

    fn check_results(&mut self, op: &Op, want: &[&Type], got: &[&Type], what: &str) {
        let m = op.kind.mnemonic();
        if want.len() != got.len() {
            self.err(
                &op.span,
                format!(
                    "`{m}` must have {} result(s) ({what}), has {}",
                    want.len(),
                    got.len()
                ),
            );
            return;
        }
        for (i, (w, g)) in want.iter().zip(got).enumerate() {
            if w != g {
                self.err(
                    &op.span,
                    format!("result #{i} of `{m}` has type {g}, expected {w} ({what})"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::FunctionBuilder;
    use crate::ir::{BinaryOp, CmpPred, ConstValue, ParamAttrs};

    fn sp(line: u32) -> Span {
        Span::new("k.rs", line, 1)
    }

    fn i32t() -> Type {
        Type::scalar(ScalarType::I32)
    }

    fn f32t() -> Type {
        Type::scalar(ScalarType::F32)
    }

    /// A kernel with a `for` (carrying an f32) holding an `if`, a `while`, loads and
    /// stores: everything the verifier accepts.
    fn valid() -> Function {
        let mut b = FunctionBuilder::new("k", sp(1));
        let p = b.param(
            "p",
            Type::global_ptr(ScalarType::F32),
            ParamAttrs::default(),
        );
        let n = b.param("n", i32t(), ParamAttrs::default());
        let zero = b.const_i32(0, sp(2)).unwrap();
        let one = b.const_i32(1, sp(3)).unwrap();
        let fz = b.constant(ConstValue::Float(0.0), f32t(), sp(4)).unwrap();
        let args = b.open_region(&[i32t(), f32t()]);
        let (iv, acc) = (args[0], args[1]);
        let c = b
            .op1(OpKind::Cmp(CmpPred::Lt), &[iv, n], None, sp(5))
            .unwrap();
        b.open_region(&[]);
        let q = b.op1(OpKind::AddPtr, &[p, iv], None, sp(6)).unwrap();
        let x = b
            .op1(
                OpKind::Load {
                    has_mask: false,
                    has_other: false,
                },
                &[q],
                None,
                sp(7),
            )
            .unwrap();
        let s = b
            .op1(OpKind::Binary(BinaryOp::Add), &[acc, x], None, sp(8))
            .unwrap();
        b.push_op(OpKind::Yield, vec![s], vec![], vec![], sp(9));
        let then_r = b.close_region();
        b.open_region(&[]);
        // Values of enclosing regions are visible here.
        b.push_op(OpKind::Yield, vec![acc], vec![], vec![], sp(10));
        let else_r = b.close_region();
        let r = b.push_op(
            OpKind::If,
            vec![c],
            vec![f32t()],
            vec![then_r, else_r],
            sp(11),
        );
        b.push_op(OpKind::Yield, vec![r[0]], vec![], vec![], sp(12));
        let body = b.close_region();
        let res = b.push_op(
            OpKind::For,
            vec![zero, n, one, fz],
            vec![f32t()],
            vec![body],
            sp(13),
        );
        // while (i < n) { i = i + 1 }
        let before = b.open_region(&[i32t()]);
        let c = b
            .op1(OpKind::Cmp(CmpPred::Lt), &[before[0], n], None, sp(14))
            .unwrap();
        b.push_op(
            OpKind::Condition,
            vec![c, before[0]],
            vec![],
            vec![],
            sp(15),
        );
        let before_r = b.close_region();
        let after = b.open_region(&[i32t()]);
        let i2 = b
            .op1(
                OpKind::Binary(BinaryOp::Add),
                &[after[0], one],
                None,
                sp(16),
            )
            .unwrap();
        b.push_op(OpKind::Yield, vec![i2], vec![], vec![], sp(17));
        let after_r = b.close_region();
        let w = b.push_op(
            OpKind::While,
            vec![zero],
            vec![i32t()],
            vec![before_r, after_r],
            sp(18),
        );
        let q = b.op1(OpKind::AddPtr, &[p, w[0]], None, sp(19)).unwrap();
        b.op(
            OpKind::Store { has_mask: false },
            &[q, res[0]],
            None,
            sp(20),
        )
        .unwrap();
        b.push_op(OpKind::Barrier, vec![], vec![], vec![], sp(21));
        b.finish()
    }

    /// Verifies and expects the first error at `line`, containing `msg`.
    #[track_caller]
    fn expect_err(f: &Function, line: u32, msg: &str) {
        let errs = verify_all(f);
        assert!(!errs.is_empty(), "expected an error containing {msg:?}");
        let e = &errs[0];
        assert_eq!(e.span.line, line, "wrong span for {e}");
        assert!(
            e.message.contains(msg),
            "message {:?} lacks {msg:?}",
            e.message
        );
        assert_eq!(verify(f).unwrap_err(), *e);
    }

    #[test]
    fn accepts_valid_nested_regions() {
        let f = valid();
        assert_eq!(verify_all(&f), vec![]);
        verify(&f).unwrap();
    }

    #[test]
    fn display_names_span_and_kernel() {
        let e = VerifyError {
            span: sp(3),
            kernel: "k".into(),
            message: "boom".into(),
            user: false,
        };
        assert_eq!(e.to_string(), "k.rs:3:1: in kernel `k`: boom");
    }

    #[test]
    fn rejects_undefined_and_out_of_table_values() {
        let mut f = valid();
        let ghost = f.new_value(i32t());
        f.body.ops[3].operands[1] = ghost;
        expect_err(&f, 13, "is never defined");
        f.body.ops[3].operands[1] = ValueId(10_000);
        expect_err(
            &f,
            13,
            "operand #1 (%10000) of `for` is not in the value table",
        );
    }

    #[test]
    fn rejects_double_definition() {
        let mut f = valid();
        let zero = f.body.ops[0].results[0];
        f.body.ops[1].results[0] = zero;
        expect_err(&f, 3, "result #0 of `const` %2 is defined more than once");
    }

    #[test]
    fn eight_bit_floats_are_storage_and_dot_types_only() {
        use crate::infer::infer_result_types;
        use crate::ir::{BinaryOp, ReduceOp};
        let e4 = Type::tile(ScalarType::F8E4M3, &[16, 16]);
        let e5 = Type::tile(ScalarType::F8E5M2, &[16, 16]);
        let f32t = Type::tile(ScalarType::F32, &[16, 16]);
        let add = infer_result_types(&OpKind::Binary(BinaryOp::Add), &[&e4, &e4], None);
        assert!(add.unwrap_err().contains("not defined on f8e4m3"));
        let red = infer_result_types(
            &OpKind::Reduce {
                axis: 0,
                op: ReduceOp::Max,
            },
            &[&e5],
            None,
        );
        assert!(red.unwrap_err().contains("cast to f16 or f32"));
        // Casts: to and from f16/bf16/f32 and between the formats; not integers or f64.
        for (from, to, ok) in [
            (ScalarType::F32, ScalarType::F8E4M3, true),
            (ScalarType::BF16, ScalarType::F8E5M2, true),
            (ScalarType::F8E4M3, ScalarType::F8E5M2, true),
            (ScalarType::F8E5M2, ScalarType::F16, true),
            (ScalarType::I32, ScalarType::F8E4M3, false),
            (ScalarType::F8E4M3, ScalarType::I8, false),
            (ScalarType::F64, ScalarType::F8E5M2, false),
        ] {
            let src = Type::tile(from, &[4]);
            let r = infer_result_types(&OpKind::Cast, &[&src], Some(&Type::tile(to, &[4])));
            assert_eq!(r.is_ok(), ok, "{from} -> {to}: {r:?}");
        }
        let d = infer_result_types(&OpKind::Dot, &[&e4, &e4, &f32t], None).expect("dot");
        assert_eq!(d, vec![f32t.clone()]);
        assert!(infer_result_types(&OpKind::Dot, &[&e4, &e5, &f32t], None).is_err());
        // A scalar parameter of an 8-bit float type is reported.
        let mut b = FunctionBuilder::new("k", sp(1));
        b.param("x", Type::scalar(ScalarType::F8E4M3), ParamAttrs::default());
        let errs = verify_all(&b.finish());
        assert!(
            errs[0].message.contains("8-bit float scalar parameter"),
            "{errs:?}"
        );
    }
}
