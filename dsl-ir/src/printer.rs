//! The stable text form of the IR (printing side; [`crate::parser`] reads it back).
//!
//! The format is MLIR-like, one op per line, two spaces of indentation per region level:
//!
//! ```text
//! kernel @add(%x: ptr<f32> {readonly, div=16}, %out: ptr<f32>, %n: i32) loc("k.rs":3:1) {
//!   %0 = program_id 0 : i32 loc("k.rs":4:13)
//!   %1 = arange 0, 1024 : <1024xi32>
//!   %2 = splat %x : <1024xptr<f32>>
//!   %3 = addptr %2, %1 : <1024xptr<f32>>
//!   %4 = load %3 : <1024xf32>
//!   %5, %6 = for %0, %n, %0 iter(%4) : i32, <1024xf32> {
//!   ^(%7: i32, %8: <1024xf32>):
//!     %9 = exp %8 : <1024xf32>
//!     yield %7, %9
//!   }
//! }
//! ```
//!
//! Rules:
//!
//! - Values are renumbered `%0, %1, ...` in the order they are defined as printed (op
//!   results, then the arguments of each of its regions, then the ops inside).
//!   Parameters print by their user name, reduced to `[A-Za-z0-9_]`, prefixed with `_`
//!   when it would start with a digit, and suffixed `_1`, `_2`, ... when taken.
//! - An op is `results = mnemonic attributes operands [: result types] [loc] [regions]`.
//!   Only result types are printed: operand types are those of their definitions.
//!   Ops without results print no `:`.
//! - Attributes: `program_id 0`, `num_programs 1`, `const 1.5`, `arange 0, 128`,
//!   `expand_dims axis=1`, `permute order=[1, 0]`, `cmp lt`,
//!   `atomic_rmw add acq_rel device`, `atomic_cas relaxed block`, `reduce sum axis=0`,
//!   `scan max axis=1 reverse`, `dot_scaled e2m1`. Binary and unary ops print their own mnemonic (`add`,
//!   `exp`, ...).
//! - Mask flags of `load`, `store`, `atomic_rmw`, `atomic_cas` follow from the number of
//!   operands (`load %p` / `load %p, %mask` / `load %p, %mask, %other`).
//! - `for` prints its bounds and step, then `iter(...)` with the initial iteration
//!   values. Regions follow on the op's line as `{ ... }`, separated by `else` (for `if`)
//!   or `do` (for `while`). A region with arguments starts with the line
//!   `^(%a: type, ...):` at the op's indentation.
//! - Constants: integers in decimal (unsigned types print the unsigned value), booleans
//!   as `true`/`false`, floats in the shortest form that reads back bit-exactly and
//!   always contains a `.` or an exponent; `inf`, `-inf`, `nan` (the canonical quiet
//!   NaN) and `nan(0x7ff8000000000001)` (any other NaN, by its `f64` bits).
//! - Locations print as a trailing ` loc("file":line:col)`; [`Span::unknown`] prints
//!   none. The file is a string with `\\`, `\"`, `\n`, `\r`, `\t` and `\u{..}` escapes.
//!
//! Printing never panics, even on malformed IR: a value that no op or parameter defines
//! prints as `%!N` (its raw id), a missing type as `?` (neither reads back).

use std::collections::{HashMap, HashSet};
use std::fmt::{self, Write as _};

use crate::ir::{ConstValue, Function, Op, OpKind, Region, Span, ValueId};

/// Prints `f` in the stable text form described in the [module docs](self).
pub fn print_function(f: &Function) -> String {
    let names = Names::new(f);
    let mut p = Printer {
        f,
        names: &names,
        out: String::new(),
        notes: None,
    };
    p.function();
    p.out
}

/// [`print_function`] with `notes(op)` printed as `// ` comment lines before each
/// op, at its indentation (the text still parses: the parser skips comments).
pub fn print_function_with_notes(f: &Function, notes: &dyn Fn(&Op) -> Vec<String>) -> String {
    let names = Names::new(f);
    let mut p = Printer {
        f,
        names: &names,
        out: String::new(),
        notes: Some(notes),
    };
    p.function();
    p.out
}

/// Prints one op (and its regions) of `f` at indentation 0, numbering values as
/// [`print_function`] does, so the text matches the op's line in the whole print.
/// Useful in diagnostics. The text ends with a newline.
pub fn print_op(f: &Function, op: &Op) -> String {
    let names = Names::new(f);
    let mut p = Printer {
        f,
        names: &names,
        out: String::new(),
        notes: None,
    };
    p.op(op, 0);
    p.out
}

impl fmt::Display for Function {
    /// The text form of [`print_function`].
    fn fmt(&self, out: &mut fmt::Formatter<'_>) -> fmt::Result {
        out.write_str(&print_function(self))
    }
}

/// Reduces a parameter name to identifier characters; never empty, never starting with
/// a digit (numbers are reserved for the other values).
pub(crate) fn sanitize_name(name: &str) -> String {
    let mut s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert(0, '_');
    }
    s
}

/// The printed name of every value (without the `%`).
struct Names {
    map: HashMap<ValueId, String>,
}

impl Names {
    fn new(f: &Function) -> Names {
        let mut map = HashMap::new();
        let mut taken = HashSet::new();
        for p in &f.params {
            if map.contains_key(&p.value) {
                continue;
            }
            let base = sanitize_name(&p.name);
            let mut name = base.clone();
            let mut k = 1u32;
            while taken.contains(&name) {
                name = format!("{base}_{k}");
                k += 1;
            }
            taken.insert(name.clone());
            map.insert(p.value, name);
        }
        let mut next = 0u32;
        number_region(&f.body, &mut map, &mut next);
        Names { map }
    }

    fn get(&self, v: ValueId) -> String {
        match self.map.get(&v) {
            Some(n) => format!("%{n}"),
            None => format!("%!{}", v.0),
        }
    }
}

fn number_region(r: &Region, map: &mut HashMap<ValueId, String>, next: &mut u32) {
    let def = |v: ValueId, map: &mut HashMap<ValueId, String>, next: &mut u32| {
        map.entry(v).or_insert_with(|| {
            let n = next.to_string();
            *next += 1;
            n
        });
    };
    for &a in &r.args {
        def(a, map, next);
    }
    for op in &r.ops {
        for &v in &op.results {
            def(v, map, next);
        }
        for sub in &op.regions {
            number_region(sub, map, next);
        }
    }
}

struct Printer<'a> {
    f: &'a Function,
    names: &'a Names,
    out: String,
    /// Comment lines to print before an op.
    notes: Option<Notes<'a>>,
}

type Notes<'a> = &'a dyn Fn(&Op) -> Vec<String>;

impl Printer<'_> {
    fn ty(&self, v: ValueId) -> String {
        match self.f.values.get(v.index()) {
            Some(d) => d.ty.to_string(),
            None => "?".to_string(),
        }
    }

    fn function(&mut self) {
        let f = self.f;
        self.out.push_str("kernel @");
        self.out.push_str(&symbol(&f.name));
        self.out.push('(');
        for (i, p) in f.params.iter().enumerate() {
            if i > 0 {
                self.out.push_str(", ");
            }
            let s = format!("{}: {}", self.names.get(p.value), self.ty(p.value));
            self.out.push_str(&s);
            let mut attrs = Vec::new();
            if p.attrs.readonly {
                attrs.push("readonly".to_string());
            }
            if let Some(d) = p.attrs.divisibility {
                attrs.push(format!("div={d}"));
            }
            if p.attrs.tensor_map {
                attrs.push("tensor_map".to_string());
            }
            if p.attrs.within_2gib {
                attrs.push("within_2gib".to_string());
            }
            if p.attrs.equal_to_one {
                attrs.push("equal_to_1".to_string());
            }
            if p.attrs.no_specialize {
                attrs.push("no_specialize".to_string());
            }
            if !attrs.is_empty() {
                let _ = write!(self.out, " {{{}}}", attrs.join(", "));
            }
        }
        self.out.push(')');
        self.loc(&f.span);
        self.out.push_str(" {\n");
        self.region_body(&f.body, 0);
        self.out.push_str("}\n");
    }

    /// The region's argument line and ops; `indent` is the enclosing op's level.
    fn region_body(&mut self, r: &Region, indent: usize) {
        if !r.args.is_empty() {
            push_indent(&mut self.out, indent);
            self.out.push_str("^(");
            for (i, &a) in r.args.iter().enumerate() {
                if i > 0 {
                    self.out.push_str(", ");
                }
                let s = format!("{}: {}", self.names.get(a), self.ty(a));
                self.out.push_str(&s);
            }
            self.out.push_str("):\n");
        }
        for op in &r.ops {
            self.op(op, indent + 1);
        }
    }

    fn values(&self, vs: &[ValueId]) -> String {
        let v: Vec<String> = vs.iter().map(|&v| self.names.get(v)).collect();
        v.join(", ")
    }

    fn op(&mut self, op: &Op, indent: usize) {
        if let Some(notes) = self.notes {
            for n in notes(op) {
                for line in n.lines() {
                    push_indent(&mut self.out, indent);
                    self.out.push_str("// ");
                    self.out.push_str(line);
                    self.out.push('\n');
                }
            }
        }
        push_indent(&mut self.out, indent);
        if !op.results.is_empty() {
            let r = self.values(&op.results);
            self.out.push_str(&r);
            self.out.push_str(" = ");
        }
        self.out.push_str(op.kind.mnemonic());
        let attrs = self.attrs(op);
        if !attrs.is_empty() {
            self.out.push(' ');
            self.out.push_str(&attrs);
        }
        if matches!(op.kind, OpKind::For) && op.operands.len() > 3 {
            let (bounds, inits) = op.operands.split_at(3);
            let s = format!(" {} iter({})", self.values(bounds), self.values(inits));
            self.out.push_str(&s);
        } else if !op.operands.is_empty() {
            self.out.push(' ');
            let s = self.values(&op.operands);
            self.out.push_str(&s);
        }
        if !op.results.is_empty() {
            let tys: Vec<String> = op.results.iter().map(|&v| self.ty(v)).collect();
            self.out.push_str(" : ");
            self.out.push_str(&tys.join(", "));
        }
        self.loc(&op.span);
        if op.regions.is_empty() {
            self.out.push('\n');
            return;
        }
        let sep = match op.kind {
            OpKind::If => " else",
            OpKind::While => " do",
            _ => "",
        };
        for (i, r) in op.regions.iter().enumerate() {
            if i > 0 {
                push_indent(&mut self.out, indent);
                self.out.push('}');
                self.out.push_str(sep);
            }
            self.out.push_str(" {\n");
            self.region_body(r, indent);
        }
        push_indent(&mut self.out, indent);
        self.out.push_str("}\n");
    }

    /// The attribute words of an op (before its operands), without leading space.
    fn attrs(&self, op: &Op) -> String {
        match &op.kind {
            OpKind::ProgramId { axis } | OpKind::NumPrograms { axis } => axis.to_string(),
            OpKind::Const(c) => {
                let unsigned = op
                    .results
                    .first()
                    .and_then(|&v| self.f.values.get(v.index()))
                    .and_then(|d| d.ty.scalar_type())
                    .is_some_and(|s| s.is_unsigned_int());
                const_literal(c, unsigned)
            }
            OpKind::Arange { start, end } => format!("{start}, {end}"),
            OpKind::LocalAlloc { len } => len.to_string(),
            OpKind::Print { prefix } => quote_string(prefix),
            OpKind::Assert { message } => quote_string(message),
            OpKind::ExpandDims { axis } => format!("axis={axis}"),
            OpKind::DescLoad { rank, .. } | OpKind::DescStore { rank } => format!("rank={rank}"),
            OpKind::Permute { order } => {
                let o: Vec<String> = order.iter().map(|d| d.to_string()).collect();
                format!("order=[{}]", o.join(", "))
            }
            OpKind::Hint { kind, values } => {
                let v: Vec<String> = values.iter().map(|d| d.to_string()).collect();
                format!("{}=[{}]", kind.name(), v.join(", "))
            }
            OpKind::Cmp(p) => p.name().to_string(),
            OpKind::AtomicRmw {
                op, order, scope, ..
            } => format!("{} {} {}", op.name(), order.name(), scope.name()),
            OpKind::AtomicCas { order, scope, .. } => {
                format!("{} {}", order.name(), scope.name())
            }
            OpKind::Signal { op, order, scope } => {
                format!("{} {} {}", op.name(), order.name(), scope.name())
            }
            OpKind::WaitUntil { pred, scope } => format!("{} {}", pred.name(), scope.name()),
            OpKind::Fence { order, scope } => format!("{} {}", order.name(), scope.name()),
            OpKind::Reduce { axis, op } => format!("{} axis={axis}", op.name()),
            OpKind::DotScaled { format } => format.name().to_string(),
            OpKind::Scan { axis, op, reverse } => {
                let mut s = format!("{} axis={axis}", op.name());
                if *reverse {
                    s.push_str(" reverse");
                }
                s
            }
            OpKind::Splat
            | OpKind::Broadcast
            | OpKind::Reshape
            | OpKind::Binary(_)
            | OpKind::Unary(_)
            | OpKind::Fma
            | OpKind::Select
            | OpKind::Cast
            | OpKind::Bitcast
            | OpKind::AddPtr
            | OpKind::Load { .. }
            | OpKind::Store { .. }
            | OpKind::Dot
            | OpKind::For
            | OpKind::If
            | OpKind::While
            | OpKind::Yield
            | OpKind::Condition
            | OpKind::Barrier
            | OpKind::Rank
            | OpKind::WorldSize
            | OpKind::RemotePtr
            | OpKind::BarrierAll => String::new(),
        }
    }

    fn loc(&mut self, span: &Span) {
        if span.is_unknown() {
            return;
        }
        let s = format!(
            " loc({}:{}:{})",
            quote_string(&span.file),
            span.line,
            span.col
        );
        self.out.push_str(&s);
    }
}

fn push_indent(out: &mut String, level: usize) {
    for _ in 0..level {
        out.push_str("  ");
    }
}

/// The literal of a constant; `unsigned` prints negative integers as their `u64` bits.
pub(crate) fn const_literal(c: &ConstValue, unsigned: bool) -> String {
    match *c {
        ConstValue::Bool(b) => b.to_string(),
        ConstValue::Int(i) if unsigned && i < 0 => (i as u64).to_string(),
        ConstValue::Int(i) => i.to_string(),
        ConstValue::Float(x) => float_literal(x),
    }
}

/// A float in the shortest form that reads back to the same bits, always with a `.`
/// or an exponent (or `inf`, `-inf`, `nan`, `nan(0x<bits>)`).
pub(crate) fn float_literal(x: f64) -> String {
    if x.is_nan() {
        if x.to_bits() == f64::NAN.to_bits() {
            "nan".to_string()
        } else {
            format!("nan(0x{:016x})", x.to_bits())
        }
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        // `Debug` prints the shortest round-tripping form, with `.0` or an exponent.
        let s = format!("{x:?}");
        if s.contains(['.', 'e', 'E']) {
            s
        } else {
            format!("{s}.0")
        }
    }
}

/// `name` if it is a plain identifier, else a quoted string.
fn symbol(name: &str) -> String {
    let plain = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        name.to_string()
    } else {
        quote_string(name)
    }
}

/// A double-quoted string with `\\`, `\"`, `\n`, `\r`, `\t` and `\u{..}` (other control
/// characters) escapes.
pub(crate) fn quote_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::FunctionBuilder;
    use crate::ir::{BinaryOp, CmpPred, ParamAttrs, ReduceOp};
    use crate::parser::parse_function;
    use crate::types::{ScalarType, Type};

    fn vector_add() -> Function {
        use ScalarType::*;
        let file = "examples/vector_add.rs";
        let mut b = FunctionBuilder::new("add", Span::new(file, 10, 1));
        let ro = ParamAttrs {
            readonly: true,
            within_2gib: false,
            tensor_map: false,
            divisibility: Some(16),
            ..ParamAttrs::default()
        };
        let x = b.param("x", Type::global_ptr(F32), ro);
        let y = b.param("y", Type::global_ptr(F32), ParamAttrs::default());
        let out = b.param("out", Type::global_ptr(F32), ParamAttrs::default());
        let n = b.param("n", Type::scalar(I32), ParamAttrs::default());
        let u = Span::unknown;
        let t = Type::tile(I32, &[1024]);
        let pid = b
            .op1(
                OpKind::ProgramId { axis: 0 },
                &[],
                None,
                Span::new(file, 12, 16),
            )
            .unwrap();
        let bs = b.const_i32(1024, u()).unwrap();
        let base = b
            .op1(OpKind::Binary(BinaryOp::Mul), &[pid, bs], None, u())
            .unwrap();
        let r = b
            .op1(
                OpKind::Arange {
                    start: 0,
                    end: 1024,
                },
                &[],
                None,
                u(),
            )
            .unwrap();
        let sb = b.op1(OpKind::Splat, &[base], Some(&t), u()).unwrap();
        let off = b
            .op1(OpKind::Binary(BinaryOp::Add), &[sb, r], None, u())
            .unwrap();
        let sn = b.op1(OpKind::Splat, &[n], Some(&t), u()).unwrap();
        let m = b
            .op1(OpKind::Cmp(CmpPred::Lt), &[off, sn], None, u())
            .unwrap();
        let load = |b: &mut FunctionBuilder, p: ValueId| {
            let ps = b.op1(OpKind::Splat, &[p], Some(&t), u()).unwrap();
            let pp = b.op1(OpKind::AddPtr, &[ps, off], None, u()).unwrap();
            let kind = OpKind::Load {
                has_mask: true,
                has_other: false,
            };
            (
                pp,
                b.op1(kind, &[pp, m], None, Span::new(file, 14, 17))
                    .unwrap(),
            )
        };
        let (_, vx) = load(&mut b, x);
        let (_, vy) = load(&mut b, y);
        let (po, _) = load(&mut b, out);
        let s = b
            .op1(OpKind::Binary(BinaryOp::Add), &[vx, vy], None, u())
            .unwrap();
        b.op(
            OpKind::Store { has_mask: true },
            &[po, s, m],
            None,
            Span::new(file, 16, 5),
        )
        .unwrap();
        b.finish()
    }

    #[test]
    fn vector_add_text() {
        let f = vector_add();
        let expected = r#"kernel @add(%x: ptr<f32> {readonly, div=16}, %y: ptr<f32>, %out: ptr<f32>, %n: i32) loc("examples/vector_add.rs":10:1) {
  %0 = program_id 0 : i32 loc("examples/vector_add.rs":12:16)
  %1 = const 1024 : i32
  %2 = mul %0, %1 : i32
  %3 = arange 0, 1024 : <1024xi32>
  %4 = splat %2 : <1024xi32>
  %5 = add %4, %3 : <1024xi32>
  %6 = splat %n : <1024xi32>
  %7 = cmp lt %5, %6 : <1024xi1>
  %8 = splat %x : <1024xptr<f32>>
  %9 = addptr %8, %5 : <1024xptr<f32>>
  %10 = load %9, %7 : <1024xf32> loc("examples/vector_add.rs":14:17)
  %11 = splat %y : <1024xptr<f32>>
  %12 = addptr %11, %5 : <1024xptr<f32>>
  %13 = load %12, %7 : <1024xf32> loc("examples/vector_add.rs":14:17)
  %14 = splat %out : <1024xptr<f32>>
  %15 = addptr %14, %5 : <1024xptr<f32>>
  %16 = load %15, %7 : <1024xf32> loc("examples/vector_add.rs":14:17)
  %17 = add %10, %13 : <1024xf32>
  store %15, %17, %7 loc("examples/vector_add.rs":16:5)
}
"#;
        assert_eq!(print_function(&f), expected);
        assert_eq!(f.to_string(), expected);
        let g = parse_function(expected).unwrap();
        assert_eq!(print_function(&g), expected);
    }

    #[test]
    fn control_flow_text() {
        use ScalarType::*;
        let mut b = FunctionBuilder::new("loops", Span::unknown());
        let n = b.param("n", Type::scalar(I32), ParamAttrs::default());
        let u = Span::unknown;
        let zero = b.const_i32(0, u()).unwrap();
        let one = b.const_i32(1, u()).unwrap();
        let z4 = b
            .constant(ConstValue::Float(0.0), Type::tile(F32, &[4]), u())
            .unwrap();
        let args = b.open_region(&[Type::scalar(I32), Type::tile(F32, &[4])]);
        let c = b
            .op1(OpKind::Cmp(CmpPred::Gt), &[args[0], zero], None, u())
            .unwrap();
        b.open_region(&[]);
        let e = b
            .op1(
                OpKind::Unary(crate::ir::UnaryOp::Exp),
                &[args[1]],
                None,
                u(),
            )
            .unwrap();
        b.push_op(OpKind::Yield, vec![e], vec![], vec![], u());
        let then_r = b.close_region();
        b.open_region(&[]);
        b.push_op(OpKind::Yield, vec![args[1]], vec![], vec![], u());
        let else_r = b.close_region();
        let r = b.push_op(
            OpKind::If,
            vec![c],
            vec![Type::tile(F32, &[4])],
            vec![then_r, else_r],
            Span::new("k.rs", 7, 9),
        );
        b.push_op(OpKind::Yield, vec![r[0]], vec![], vec![], u());
        let body = b.close_region();
        let fr = b.push_op(
            OpKind::For,
            vec![zero, n, one, z4],
            vec![Type::tile(F32, &[4])],
            vec![body],
            u(),
        );
        let red = OpKind::Reduce {
            axis: 0,
            op: ReduceOp::Sum,
        };
        let s = b.op1(red, &[fr[0]], None, u()).unwrap();
        let w = b.open_region(&[Type::scalar(F32)]);
        let c = b
            .op1(OpKind::Cmp(CmpPred::Lt), &[w[0], s], None, u())
            .unwrap();
        b.push_op(OpKind::Condition, vec![c, w[0]], vec![], vec![], u());
        let before = b.close_region();
        let w = b.open_region(&[Type::scalar(F32)]);
        b.push_op(OpKind::Yield, vec![w[0]], vec![], vec![], u());
        let after = b.close_region();
        b.push_op(
            OpKind::While,
            vec![s],
            vec![Type::scalar(F32)],
            vec![before, after],
            u(),
        );
        let f = b.finish();
        let expected = r#"kernel @loops(%n: i32) {
  %0 = const 0 : i32
  %1 = const 1 : i32
  %2 = const 0.0 : <4xf32>
  %3 = for %0, %n, %1 iter(%2) : <4xf32> {
  ^(%4: i32, %5: <4xf32>):
    %6 = cmp gt %4, %0 : i1
    %7 = if %6 : <4xf32> loc("k.rs":7:9) {
      %8 = exp %5 : <4xf32>
      yield %8
    } else {
      yield %5
    }
    yield %7
  }
  %9 = reduce sum axis=0 %3 : f32
  %10 = while %9 : f32 {
  ^(%11: f32):
    %12 = cmp lt %11, %9 : i1
    condition %12, %11
  } do {
  ^(%13: f32):
    yield %13
  }
}
"#;
        assert_eq!(print_function(&f), expected);
        let g = parse_function(expected).unwrap();
        assert_eq!(print_function(&g), expected);
        // `print_op` prints one op with the whole function's numbering.
        let op = &f.body.ops[3];
        assert_eq!(
            print_op(&f, op).lines().next(),
            Some("%3 = for %0, %n, %1 iter(%2) : <4xf32> {")
        );
    }

    #[test]
    fn float_literals() {
        assert_eq!(float_literal(1.0), "1.0");
        assert_eq!(float_literal(-0.0), "-0.0");
        assert_eq!(float_literal(0.1), "0.1");
        assert_eq!(float_literal(1e-7), "1e-7");
        assert_eq!(float_literal(1e16), "1e16");
        assert_eq!(float_literal(f64::INFINITY), "inf");
        assert_eq!(float_literal(f64::NEG_INFINITY), "-inf");
        assert_eq!(float_literal(f64::NAN), "nan");
        assert_eq!(
            float_literal(f64::from_bits(0x7ff8_0000_0000_0001)),
            "nan(0x7ff8000000000001)"
        );
        for x in [
            0.1,
            1.0 / 3.0,
            f64::MIN_POSITIVE,
            5e-324,
            f64::MAX,
            -123.456e-200,
            half::f16::MAX.to_f64(),
            half::bf16::from_f64(0.1).to_f64(),
        ] {
            let s = float_literal(x);
            assert!(s.contains(['.', 'e']), "{s}");
            assert_eq!(s.parse::<f64>().map(f64::to_bits), Ok(x.to_bits()), "{s}");
        }
        assert_eq!(
            const_literal(&ConstValue::Int(-1), true),
            "18446744073709551615"
        );
        assert_eq!(const_literal(&ConstValue::Int(-1), false), "-1");
        assert_eq!(const_literal(&ConstValue::Bool(false), false), "false");
    }

    #[test]
    fn names_and_strings() {
        assert_eq!(sanitize_name("x"), "x");
        assert_eq!(sanitize_name("a.b-c"), "a_b_c");
        assert_eq!(sanitize_name("1st"), "_1st");
        assert_eq!(sanitize_name(""), "_");
        assert_eq!(sanitize_name("ü"), "_");
        assert_eq!(quote_string("a\"b\\c\nd\u{7f}"), r#""a\"b\\c\nd\u{7f}""#);
        assert_eq!(symbol("k_1"), "k_1");
        assert_eq!(symbol("a::b"), r#""a::b""#);
        assert_eq!(symbol("1k"), r#""1k""#);
    }

    #[test]
    fn malformed_ir_prints_without_panicking() {
        let mut f = Function::new("bad", Span::unknown());
        let v = f.new_value(Type::scalar(ScalarType::I32));
        f.body.ops.push(Op {
            kind: OpKind::Binary(BinaryOp::Add),
            operands: vec![ValueId(99), v],
            results: vec![ValueId(7)],
            regions: vec![Region::default()],
            span: Span::unknown(),
        });
        f.body.ops.push(Op {
            kind: OpKind::Load {
                has_mask: false,
                has_other: false,
            },
            operands: vec![],
            results: vec![],
            regions: vec![],
            span: Span::unknown(),
        });
        let text = print_function(&f);
        assert_eq!(
            text,
            "kernel @bad() {\n  %0 = add %!99, %!0 : ? {\n  }\n  load\n}\n"
        );
        assert!(parse_function(&text).is_err());
    }
}
