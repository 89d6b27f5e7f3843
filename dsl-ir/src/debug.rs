//! Device printing and assertions: [`OpKind::Print`] and [`OpKind::Assert`] become
//! stores into a hidden output buffer, which the host decodes after the launch.
//!
//! [`lower_debug_ops`] runs before any backend (the interpreter, the emulator, the GPU
//! lowering all see the same ops), so every device reports the same records: the
//! kernel gets one more parameter, [`PARAM_NAME`], a `ptr<u64, global>` after the
//! user's parameters (and before a communicating kernel's hidden ones), and each
//! debugging op becomes ordinary IR: a program-wide atomic that reserves a record,
//! a bounds check against the buffer's capacity, and stores of the record's words.
//!
//! # The output buffer (`u64` words)
//!
//! | word | meaning |
//! |---|---|
//! | 0 | the next free record word (a cursor the reservations advance; it may pass the capacity, counting what did not fit) |
//! | 1 | the capacity of the record area, in words (written by the host) |
//! | 2.. | records, back to back |
//!
//! A record is [`RECORD_HEADER`] words, then its payload:
//!
//! | word | meaning |
//! |---|---|
//! | 0 | `site \| words << 32`: `1 +` the op's index in [`DebugSites::sites`], the record's length |
//! | 1 | `program_id(0) \| program_id(1) << 32` |
//! | 2 | `program_id(2)` |
//! | 3.. | `print`: each operand's elements (row-major), zero-extended bits, one word each; `assert`: the first failing element's flat index, the number of failing elements |
//!
//! A record is written only when it fits; a program's records appear in its program
//! order, and programs' records interleave in the order they reserved them (as GPU
//! `printf` output does).

use std::fmt::Write as _;

use crate::ir::{
    AtomicOp, BinaryOp, CmpPred, Function, MemOrder, MemScope, Op, OpKind, Param, ParamAttrs,
    ReduceOp, Region, Span, ValueId,
};
use crate::passes::emit::Emit;
use crate::types::{AddrSpace, Elem, ScalarType, Type};

/// The name of the hidden output-buffer parameter.
pub const PARAM_NAME: &str = "__tessera_debug";
/// Words before the record area: the cursor and the capacity.
pub const BUFFER_HEADER: usize = 2;
/// Words of a record before its payload: site and length, two words of program id.
pub const RECORD_HEADER: usize = 3;
/// Payload words of an assertion record.
const ASSERT_PAYLOAD: usize = 2;

/// One debugging op of a kernel, in the order [`lower_debug_ops`] met them.
#[derive(Clone, Debug, PartialEq)]
pub struct DebugSite {
    /// Where the op is.
    pub span: Span,
    /// What it reports.
    pub kind: SiteKind,
}

/// What a [`DebugSite`] reports.
#[derive(Clone, Debug, PartialEq)]
pub enum SiteKind {
    /// A `print`: its prefix and each operand's element type and shape.
    Print {
        /// Text before the values.
        prefix: String,
        /// Element type and shape (empty: a scalar) of each operand.
        operands: Vec<(ScalarType, Vec<u32>)>,
    },
    /// An `assert`: its message and the condition's shape.
    Assert {
        /// The message.
        message: String,
        /// The condition's shape (empty: a scalar).
        shape: Vec<u32>,
    },
}

impl SiteKind {
    /// The record's length in words.
    fn record_words(&self) -> usize {
        RECORD_HEADER
            + match self {
                SiteKind::Print { operands, .. } => operands.iter().map(|(_, s)| numel(s)).sum(),
                SiteKind::Assert { .. } => ASSERT_PAYLOAD,
            }
    }
}

/// The debugging ops of a kernel, which decode its output buffer.
#[derive(Clone, Debug, PartialEq)]
pub struct DebugSites {
    /// The kernel's name.
    pub kernel: String,
    /// The ops, indexed by `site - 1` of their records.
    pub sites: Vec<DebugSite>,
}

/// A failed `assert`, as the host reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssertFailure {
    /// The kernel.
    pub kernel: String,
    /// The `assert`'s location.
    pub span: Span,
    /// Its message.
    pub message: String,
    /// The program that failed first (in record order).
    pub program: [u32; 3],
    /// The first failing element's index (empty for a scalar condition).
    pub index: Vec<u32>,
    /// How many elements failed in that program.
    pub failing: u64,
    /// How many other failure records the launch wrote.
    pub more: u64,
}

impl std::fmt::Display for AssertFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [x, y, z] = self.program;
        write!(
            f,
            "{}: device assertion failed in kernel `{}`: {} (program ({x}, {y}, {z})",
            self.span, self.kernel, self.message
        )?;
        if !self.index.is_empty() {
            write!(f, ", element {}", fmt_index(&self.index))?;
        }
        if self.failing > 1 {
            write!(f, ", {} failing elements", self.failing)?;
        }
        f.write_str(")")?;
        if self.more > 0 {
            write!(f, "; {} more failed assertion records", self.more)?;
        }
        Ok(())
    }
}

impl std::error::Error for AssertFailure {}

/// What a launch's output buffer holds, decoded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DebugReport {
    /// The `print` lines, in record order, then a line for anything lost.
    pub lines: Vec<String>,
    /// The first failed assertion, if any.
    pub failure: Option<AssertFailure>,
}

/// Replaces every [`OpKind::Print`] and [`OpKind::Assert`] of `f` by stores into a
/// new last parameter, [`PARAM_NAME`] (see the module docs); `None` (and `f`
/// unchanged) when it has none. Run it on verified IR; the result verifies.
pub fn lower_debug_ops(f: &mut Function) -> Result<Option<DebugSites>, String> {
    let mut any = false;
    f.walk(&mut |op| any |= op.kind.is_debug());
    if !any {
        return Ok(None);
    }
    let ptr_ty = Type {
        elem: Elem::Ptr {
            pointee: ScalarType::U64,
            space: AddrSpace::Global,
        },
        shape: vec![],
    };
    let buf = f.new_value(ptr_ty);
    f.values[buf.index()].name = Some(PARAM_NAME.into());
    f.params.push(Param {
        name: PARAM_NAME.into(),
        value: buf,
        attrs: ParamAttrs::default(),
    });
    let mut sites = Vec::new();
    let mut body = std::mem::take(&mut f.body);
    let res = lower_region(f, &mut body, buf, &mut sites);
    f.body = body;
    res?;
    Ok(Some(DebugSites {
        kernel: f.name.clone(),
        sites,
    }))
}

fn lower_region(
    f: &mut Function,
    r: &mut Region,
    buf: ValueId,
    sites: &mut Vec<DebugSite>,
) -> Result<(), String> {
    let ops = std::mem::take(&mut r.ops);
    for mut op in ops {
        if op.kind.is_debug() {
            let mut e = Emit {
                f,
                ops: Vec::new(),
                span: op.span.clone(),
            };
            let site = sites.len() as u64 + 1;
            let kind = e
                .lower(&op, buf, site)
                .map_err(|m| format!("{}: {m}", op.span))?;
            sites.push(DebugSite {
                span: op.span.clone(),
                kind,
            });
            r.ops.append(&mut e.ops);
            continue;
        }
        for sub in &mut op.regions {
            lower_region(f, sub, buf, sites)?;
        }
        r.ops.push(op);
    }
    Ok(())
}

fn numel(shape: &[u32]) -> usize {
    shape.iter().map(|&d| d as usize).product()
}

impl Emit<'_> {
    fn u64(&mut self, v: u64) -> Result<ValueId, String> {
        self.int(ScalarType::U64, &[], v as i64)
    }

    /// `p + off` for a scalar pointer and an `i64` word offset.
    fn offset(&mut self, p: ValueId, off: i64) -> Result<ValueId, String> {
        let o = self.int(ScalarType::I64, &[], off)?;
        self.op1(OpKind::AddPtr, &[p, o], None)
    }

    fn store(&mut self, p: ValueId, v: ValueId) -> Result<(), String> {
        self.op(OpKind::Store { has_mask: false }, &[p, v], None)?;
        Ok(())
    }

    /// The row-major flat index of every element of a tile of `shape` (`i32`).
    fn flat_index(&mut self, shape: &[u32]) -> Result<ValueId, String> {
        let n = numel(shape) as i64;
        let a = self.op1(OpKind::Arange { start: 0, end: n }, &[], None)?;
        if shape.len() == 1 {
            return Ok(a);
        }
        let t = Type::scalar(ScalarType::I32).with_shape(shape);
        self.op1(OpKind::Reshape, &[a], Some(&t))
    }

    /// `v`'s bits zero-extended to `u64` (`true` is 1).
    fn bits(&mut self, v: ValueId) -> Result<ValueId, String> {
        let t = self.f.ty(v).clone();
        let s = t.scalar_type().ok_or("cannot print a pointer")?;
        if s.is_bool() {
            let one = self.int(ScalarType::U64, &t.shape, 1)?;
            let zero = self.int(ScalarType::U64, &t.shape, 0)?;
            return self.op1(OpKind::Select, &[v, one, zero], None);
        }
        let unsigned = match s.size_bytes() {
            1 => ScalarType::U8,
            2 => ScalarType::U16,
            4 => ScalarType::U32,
            _ => ScalarType::U64,
        };
        let u = if s == unsigned {
            v
        } else {
            let ut = Type::scalar(unsigned).with_shape(&t.shape);
            self.op1(OpKind::Bitcast, &[v], Some(&ut))?
        };
        if unsigned == ScalarType::U64 {
            Ok(u)
        } else {
            self.cast(u, ScalarType::U64)
        }
    }

    /// Reserves `words` words and runs `write(rec)` (`rec`: the record's first word)
    /// when they fit; the ops go into an `if`.
    fn record(
        &mut self,
        buf: ValueId,
        site: u64,
        words: usize,
        write: impl FnOnce(&mut Self, ValueId) -> Result<(), String>,
    ) -> Result<(), String> {
        let len = self.u64(words as u64)?;
        let rmw = OpKind::AtomicRmw {
            op: AtomicOp::Add,
            order: MemOrder::Relaxed,
            scope: MemScope::Device,
            has_mask: false,
        };
        let start = self.op1(rmw, &[buf, len], None)?;
        let end = self.bin(BinaryOp::Add, start, len)?;
        let cap_ptr = self.offset(buf, 1)?;
        let load = OpKind::Load {
            has_mask: false,
            has_other: false,
        };
        let cap = self.op1(load, &[cap_ptr], None)?;
        let fits = self.op1(OpKind::Cmp(CmpPred::Le), &[end, cap], None)?;
        // The record's words, inside `if fits`.
        let outer = std::mem::take(&mut self.ops);
        let skip = self.u64(BUFFER_HEADER as u64)?;
        let word = self.bin(BinaryOp::Add, start, skip)?;
        let word = self.cast(word, ScalarType::I64)?;
        let rec = self.op1(OpKind::AddPtr, &[buf, word], None)?;
        let header = self.u64(site | (words as u64) << 32)?;
        self.store(rec, header)?;
        let mut pid = Vec::new();
        for axis in 0..3 {
            let p = self.op1(OpKind::ProgramId { axis }, &[], None)?;
            pid.push(self.cast(p, ScalarType::U64)?);
        }
        let sh = self.u64(32)?;
        let y = self.bin(BinaryOp::Shl, pid[1], sh)?;
        let xy = self.bin(BinaryOp::Or, pid[0], y)?;
        let p1 = self.offset(rec, 1)?;
        self.store(p1, xy)?;
        let p2 = self.offset(rec, 2)?;
        self.store(p2, pid[2])?;
        write(self, rec)?;
        self.ops.push(self.yield_op());
        let then = Region {
            args: Vec::new(),
            ops: std::mem::replace(&mut self.ops, outer),
        };
        let yield_op = self.yield_op();
        self.ops.push(Op {
            kind: OpKind::If,
            operands: vec![fits],
            results: Vec::new(),
            regions: vec![
                then,
                Region {
                    args: Vec::new(),
                    ops: vec![yield_op],
                },
            ],
            span: self.span.clone(),
        });
        Ok(())
    }

    fn lower(&mut self, op: &Op, buf: ValueId, site: u64) -> Result<SiteKind, String> {
        match &op.kind {
            OpKind::Print { prefix } => {
                let mut operands = Vec::new();
                for &v in &op.operands {
                    let t = self.f.ty(v);
                    let s = t.scalar_type().ok_or("`print` cannot print pointers")?;
                    operands.push((s, t.shape.clone()));
                }
                let kind = SiteKind::Print {
                    prefix: prefix.clone(),
                    operands,
                };
                let vals = op.operands.clone();
                self.record(buf, site, kind.record_words(), |e, rec| {
                    let mut at = RECORD_HEADER as i64;
                    for v in vals {
                        let shape = e.f.ty(v).shape.clone();
                        let bits = e.bits(v)?;
                        let base = e.offset(rec, at)?;
                        if shape.is_empty() {
                            e.store(base, bits)?;
                            at += 1;
                            continue;
                        }
                        let pt = e.f.ty(base).with_shape(&shape);
                        let ptrs = e.op1(OpKind::Splat, &[base], Some(&pt))?;
                        let idx = e.flat_index(&shape)?;
                        let ptrs = e.op1(OpKind::AddPtr, &[ptrs, idx], None)?;
                        e.store(ptrs, bits)?;
                        at += numel(&shape) as i64;
                    }
                    Ok(())
                })?;
                Ok(kind)
            }
            OpKind::Assert { message } => {
                let &[cond] = op.operands.as_slice() else {
                    return Err("`assert` takes one condition".into());
                };
                let shape = self.f.ty(cond).shape.clone();
                let i32t = ScalarType::I32;
                let zero = self.int(i32t, &shape, 0)?;
                let one = self.int(i32t, &shape, 1)?;
                let mut count = self.op1(OpKind::Select, &[cond, zero, one], None)?;
                let mut first = self.int(i32t, &[], 0)?;
                if !shape.is_empty() {
                    let n = numel(&shape);
                    let flat = self.flat_index(&shape)?;
                    let none = self.int(i32t, &shape, n as i64)?;
                    let mut idx = self.op1(OpKind::Select, &[cond, none, flat], None)?;
                    if shape.len() > 1 {
                        let t = Type::scalar(i32t).with_shape(&[n as u32]);
                        count = self.op1(OpKind::Reshape, &[count], Some(&t))?;
                        idx = self.op1(OpKind::Reshape, &[idx], Some(&t))?;
                    }
                    let sum = OpKind::Reduce {
                        axis: 0,
                        op: ReduceOp::Sum,
                    };
                    count = self.op1(sum, &[count], None)?;
                    let min = OpKind::Reduce {
                        axis: 0,
                        op: ReduceOp::Min,
                    };
                    first = self.op1(min, &[idx], None)?;
                }
                let z = self.int(i32t, &[], 0)?;
                let failed = self.op1(OpKind::Cmp(CmpPred::Gt), &[count, z], None)?;
                let kind = SiteKind::Assert {
                    message: message.clone(),
                    shape,
                };
                let words = kind.record_words();
                // if failed { reserve and write the record }
                let outer = std::mem::take(&mut self.ops);
                self.record(buf, site, words, |e, rec| {
                    let f = e.cast(first, ScalarType::U64)?;
                    let c = e.cast(count, ScalarType::U64)?;
                    let p = e.offset(rec, RECORD_HEADER as i64)?;
                    e.store(p, f)?;
                    let p = e.offset(rec, RECORD_HEADER as i64 + 1)?;
                    e.store(p, c)
                })?;
                self.ops.push(self.yield_op());
                let then = Region {
                    args: Vec::new(),
                    ops: std::mem::replace(&mut self.ops, outer),
                };
                let yield_op = self.yield_op();
                self.ops.push(Op {
                    kind: OpKind::If,
                    operands: vec![failed],
                    results: Vec::new(),
                    regions: vec![
                        then,
                        Region {
                            args: Vec::new(),
                            ops: vec![yield_op],
                        },
                    ],
                    span: self.span.clone(),
                });
                Ok(kind)
            }
            _ => Err("internal: not a debugging op".into()),
        }
    }
}

/// The multi-index of flat (row-major) element `flat` of `shape`.
fn unflatten(mut flat: usize, shape: &[u32]) -> Vec<u32> {
    let mut idx = vec![0; shape.len()];
    for (i, &d) in shape.iter().enumerate().rev() {
        let d = d.max(1) as usize;
        idx[i] = (flat % d) as u32;
        flat /= d;
    }
    idx
}

fn fmt_index(idx: &[u32]) -> String {
    let v: Vec<String> = idx.iter().map(|i| i.to_string()).collect();
    format!("({})", v.join(", "))
}

/// One element's value from its zero-extended bits.
fn fmt_value(s: ScalarType, bits: u64) -> String {
    use ScalarType as S;
    match s {
        S::I1 => (bits != 0).to_string(),
        S::I8 => (bits as u8 as i8).to_string(),
        S::I16 => (bits as u16 as i16).to_string(),
        S::I32 => (bits as u32 as i32).to_string(),
        S::I64 => (bits as i64).to_string(),
        S::U8 | S::U16 | S::U32 | S::U64 => bits.to_string(),
        S::F16 => format!("{:?}", half::f16::from_bits(bits as u16).to_f32()),
        S::BF16 => format!("{:?}", half::bf16::from_bits(bits as u16).to_f32()),
        S::F32 => format!("{:?}", f32::from_bits(bits as u32)),
        S::F64 => format!("{:?}", f64::from_bits(bits)),
        S::F8E4M3 => format!("{:?}", crate::fp8::F8E4M3::from_bits(bits as u8).to_f32()),
        S::F8E5M2 => format!("{:?}", crate::fp8::F8E5M2::from_bits(bits as u8).to_f32()),
    }
}

impl DebugSites {
    /// The record area's capacity a buffer of `words` words has.
    pub fn capacity(words: usize) -> u64 {
        words.saturating_sub(BUFFER_HEADER) as u64
    }

    /// Decodes a launch's output buffer (all its words, header included): the
    /// `print` lines (`file:line: pid (x, y, z) idx (i, j) prefix values`), a line
    /// saying what did not fit or could not be read, and the first failed assertion.
    pub fn decode(&self, words: &[u64]) -> DebugReport {
        let mut out = DebugReport::default();
        let (Some(&cursor), Some(&cap)) = (words.first(), words.get(1)) else {
            out.lines.push(format!(
                "tessera: kernel `{}`: the device output buffer has no header",
                self.kernel
            ));
            return out;
        };
        let area = &words[BUFFER_HEADER.min(words.len())..];
        let used = cursor.min(cap).min(area.len() as u64) as usize;
        let mut at = 0;
        let mut failures = 0u64;
        while at < used {
            let header = area[at];
            let site = (header & 0xffff_ffff) as usize;
            let len = (header >> 32) as usize;
            let found = site
                .checked_sub(1)
                .and_then(|i| self.sites.get(i))
                .filter(|s| s.kind.record_words() == len && at + len <= used);
            if found.is_none() && cursor > cap && area[at..used].iter().all(|&w| w == 0) {
                // The gap before the first reservation that did not fit.
                break;
            }
            let Some(s) = found else {
                // A record reserved but not written (the launch failed first) reads
                // as zeros; anything else was overwritten: stop there.
                out.lines.push(format!(
                    "tessera: kernel `{}`: device output incomplete from word {at} of {used} (header {header:#x}): the launch failed while writing it, or the kernel wrote over it",
                    self.kernel
                ));
                break;
            };
            let rec = &area[at..at + len];
            at += len;
            let program = [
                (rec[1] & 0xffff_ffff) as u32,
                (rec[1] >> 32) as u32,
                rec[2] as u32,
            ];
            let payload = &rec[RECORD_HEADER..];
            match &s.kind {
                SiteKind::Print { prefix, operands } => {
                    print_lines(&mut out.lines, s, prefix, operands, program, payload);
                }
                SiteKind::Assert { message, shape } => {
                    failures += 1;
                    if out.failure.is_none() {
                        out.failure = Some(AssertFailure {
                            kernel: self.kernel.clone(),
                            span: s.span.clone(),
                            message: message.clone(),
                            program,
                            index: unflatten(payload[0] as usize, shape),
                            failing: payload[1],
                            more: 0,
                        });
                    }
                }
            }
        }
        if let Some(f) = out.failure.as_mut() {
            f.more = failures - 1;
        }
        if cursor > cap {
            out.lines.push(format!(
                "tessera: kernel `{}`: {} words of device output did not fit the {}-word buffer and were dropped (failed assertions among them are not reported)",
                self.kernel,
                cursor.saturating_sub(at as u64),
                cap
            ));
        }
        out
    }
}

fn print_lines(
    lines: &mut Vec<String>,
    site: &DebugSite,
    prefix: &str,
    operands: &[(ScalarType, Vec<u32>)],
    program: [u32; 3],
    payload: &[u64],
) {
    let shape = operands
        .iter()
        .map(|(_, s)| s)
        .find(|s| !s.is_empty())
        .cloned()
        .unwrap_or_default();
    let n = numel(&shape);
    let mut sep = prefix.to_string();
    if !sep.is_empty() && !sep.ends_with(char::is_whitespace) {
        sep.push(' ');
    }
    let loc = format!("{}:{}", site.span.file, site.span.line);
    for e in 0..n {
        let mut line = format!(
            "{loc}: pid ({}, {}, {})",
            program[0], program[1], program[2]
        );
        if !shape.is_empty() {
            let _ = write!(line, " idx {}", fmt_index(&unflatten(e, &shape)));
        }
        line.push(' ');
        line.push_str(&sep);
        let mut at = 0;
        let vals: Vec<String> = operands
            .iter()
            .map(|(s, sh)| {
                let v = if sh.is_empty() {
                    payload[at]
                } else {
                    payload[at + e]
                };
                at += numel(sh);
                fmt_value(*s, v)
            })
            .collect();
        line.push_str(&vals.join(", "));
        lines.push(line.trim_end().to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unflatten_is_row_major() {
        assert_eq!(unflatten(0, &[4, 8]), vec![0, 0]);
        assert_eq!(unflatten(11, &[4, 8]), vec![1, 3]);
        assert_eq!(unflatten(31, &[4, 8]), vec![3, 7]);
        assert_eq!(unflatten(5, &[2, 2, 2]), vec![1, 0, 1]);
    }

    #[test]
    fn values_format_by_type() {
        assert_eq!(fmt_value(ScalarType::I8, 0xff), "-1");
        assert_eq!(fmt_value(ScalarType::I32, 0xffff_fffe), "-2");
        assert_eq!(fmt_value(ScalarType::U16, 0xffff), "65535");
        assert_eq!(fmt_value(ScalarType::F32, 1.5f32.to_bits() as u64), "1.5");
        assert_eq!(fmt_value(ScalarType::F32, f32::NAN.to_bits() as u64), "NaN");
        assert_eq!(
            fmt_value(
                ScalarType::BF16,
                half::bf16::from_f32(-2.0).to_bits() as u64
            ),
            "-2.0"
        );
        assert_eq!(fmt_value(ScalarType::I1, 1), "true");
    }

    #[test]
    fn a_corrupt_buffer_is_reported_not_trusted() {
        let sites = DebugSites {
            kernel: "k".into(),
            sites: vec![DebugSite {
                span: Span::unknown(),
                kind: SiteKind::Print {
                    prefix: "x".into(),
                    operands: vec![(ScalarType::I32, vec![])],
                },
            }],
        };
        // One good record, then garbage.
        let words = [8, 100, 1 | 4 << 32, 2 | 3 << 32, 4, 7, 99, 0, 0, 0];
        let r = sites.decode(&words);
        assert_eq!(r.lines[0], "<unknown>:0: pid (2, 3, 4) x 7");
        assert!(
            r.lines[1].contains("incomplete from word 4"),
            "{:?}",
            r.lines
        );
        // Too small for its header.
        assert!(sites.decode(&[1]).lines[0].contains("no header"));
        // Overflow is counted.
        let r = sites.decode(&[12, 4, 1 | 4 << 32, 0, 0, 5]);
        assert_eq!(r.lines.len(), 2, "{:?}", r.lines);
        assert!(r.lines[1].contains("8 words"), "{:?}", r.lines);
    }
}
