//! `dot_scaled` as plain ops, for the backends without block-scaled matrix
//! instructions (the SIMT lowering on every GPU target, the emulators, the CPU
//! device): each operand decoded exactly to f32 and multiplied by its block's scale,
//! then an f32 `dot`. This is the op's definition ([`OpKind::DotScaled`]), so the
//! expanded kernel computes what the interpreter computes for the op itself.

use crate::ir::{BinaryOp, CmpPred, Function, Op, OpKind, Region, ScaledFormat, ValueId};
use crate::passes::emit::Emit;
use crate::types::{ScalarType, Type};

/// Whether `f` has a `dot_scaled`.
fn has_dot_scaled(f: &Function) -> bool {
    let mut any = false;
    f.walk(&mut |op| any |= matches!(op.kind, OpKind::DotScaled { .. }));
    any
}

/// `f` with every `dot_scaled` expanded into decoding ops and an f32 `dot`; `None`
/// when it has none. An error names the op's place when its operands do not fit
/// (the verifier refuses such a kernel first).
pub fn expand_dot_scaled(f: &Function) -> Result<Option<Function>, String> {
    if !has_dot_scaled(f) {
        return Ok(None);
    }
    let mut g = f.clone();
    let mut body = std::mem::take(&mut g.body);
    let res = expand_region(&mut g, &mut body);
    g.body = body;
    res.map(|()| Some(g))
}

fn expand_region(f: &mut Function, r: &mut Region) -> Result<(), String> {
    let ops = std::mem::take(&mut r.ops);
    for mut op in ops {
        if let OpKind::DotScaled { format } = op.kind {
            let mut e = Emit {
                f,
                ops: Vec::new(),
                span: op.span.clone(),
            };
            e.dot_scaled(format, &op)
                .map_err(|m| format!("{}: dot_scaled: {m}", op.span))?;
            r.ops.append(&mut e.ops);
            continue;
        }
        for sub in &mut op.regions {
            expand_region(f, sub)?;
        }
        r.ops.push(op);
    }
    Ok(())
}

impl Emit<'_> {
    fn shape(&self, v: ValueId) -> Vec<u32> {
        self.f.ty(v).shape.clone()
    }

    fn reshape(&mut self, v: ValueId, s: ScalarType, shape: &[u32]) -> Result<ValueId, String> {
        self.op1(OpKind::Reshape, &[v], Some(&Type::tile(s, shape)))
    }

    fn broadcast(&mut self, v: ValueId, s: ScalarType, shape: &[u32]) -> Result<ValueId, String> {
        self.op1(OpKind::Broadcast, &[v], Some(&Type::tile(s, shape)))
    }

    fn bitcast(&mut self, v: ValueId, to: ScalarType) -> Result<ValueId, String> {
        let t = Type::tile(to, &self.shape(v));
        self.op1(OpKind::Bitcast, &[v], Some(&t))
    }

    fn eq_int(&mut self, v: ValueId, c: i64) -> Result<ValueId, String> {
        let t = self.f.ty(v).clone();
        let s = t.scalar_type().ok_or("a pointer")?;
        let c = self.int(s, &t.shape, c)?;
        self.op1(OpKind::Cmp(CmpPred::Eq), &[v, c], None)
    }

    fn select(&mut self, c: ValueId, a: ValueId, b: ValueId) -> Result<ValueId, String> {
        self.op1(OpKind::Select, &[c, a, b], None)
    }

    /// `v op c` with `c` splat to `v`'s shape.
    fn bin_c(&mut self, op: BinaryOp, v: ValueId, c: i64) -> Result<ValueId, String> {
        let t = self.f.ty(v).clone();
        let c = self.int(t.scalar_type().ok_or("a pointer")?, &t.shape, c)?;
        self.bin(op, v, c)
    }

    /// The E2M1 values of the packed `u8` tile `v` (`R x C/2`), as f32 `R x C`: the
    /// low nibble first.
    fn unpack_e2m1(&mut self, v: ValueId) -> Result<ValueId, String> {
        let sh = self.shape(v);
        let (rows, half) = (sh[0], sh[1]);
        let three = [rows, half, 2];
        let x = self.op1(OpKind::ExpandDims { axis: 2 }, &[v], None)?;
        let x = self.broadcast(x, ScalarType::U8, &three)?;
        let x = self.cast(x, ScalarType::I32)?;
        // The shift of element `2i + j` is `4j`.
        let j = self.op1(
            OpKind::Arange { start: 0, end: 2 },
            &[],
            Some(&Type::tile(ScalarType::I32, &[2])),
        )?;
        let j = self.bin_c(BinaryOp::Mul, j, 4)?;
        let j = self.reshape(j, ScalarType::I32, &[1, 1, 2])?;
        let j = self.broadcast(j, ScalarType::I32, &three)?;
        let n = self.bin(BinaryOp::Shr, x, j)?;
        let n = self.bin_c(BinaryOp::And, n, 0xF)?;
        // `s.ee.m`, bias 1: 0.5 * m for e = 0, else 2^(e-1) * (1 + m/2), as f32 bits.
        let mag = self.bin_c(BinaryOp::And, n, 7)?;
        let e = self.bin_c(BinaryOp::Shr, mag, 1)?;
        let m = self.bin_c(BinaryOp::And, mag, 1)?;
        let sub = self.bin_c(BinaryOp::Mul, m, 0x3F00_0000)?;
        let exp = self.bin_c(BinaryOp::Add, e, 126)?;
        let exp = self.bin_c(BinaryOp::Shl, exp, 23)?;
        let man = self.bin_c(BinaryOp::Shl, m, 22)?;
        let norm = self.bin(BinaryOp::Or, exp, man)?;
        let zero_e = self.eq_int(e, 0)?;
        let bits = self.select(zero_e, sub, norm)?;
        let sign = self.bin_c(BinaryOp::Shr, n, 3)?;
        let sign = self.bin_c(BinaryOp::Shl, sign, 31)?;
        let bits = self.bin(BinaryOp::Or, bits, sign)?;
        let f = self.bitcast(bits, ScalarType::F32)?;
        self.reshape(f, ScalarType::F32, &[rows, half * 2])
    }

    /// The elements of operand `v` of `format`, as f32.
    fn decode(&mut self, format: ScaledFormat, v: ValueId) -> Result<ValueId, String> {
        match format {
            ScaledFormat::E2M1 => self.unpack_e2m1(v),
            ScaledFormat::E4M3 | ScaledFormat::E5M2 => self.cast(v, ScalarType::F32),
        }
    }

    /// The scales `v` (`u8` E8M0 or `f8e4m3`) as f32: E8M0 `e` is `2^(e-127)` (f32
    /// bits `e << 23`; `2^-127` is the subnormal `0x0040_0000`; `0xFF` is NaN).
    fn scales(&mut self, v: ValueId) -> Result<ValueId, String> {
        if self.f.ty(v).scalar_type() == Some(ScalarType::F8E4M3) {
            return self.cast(v, ScalarType::F32);
        }
        let sh = self.shape(v);
        let e = self.cast(v, ScalarType::I32)?;
        let bits = self.bin_c(BinaryOp::Shl, e, 23)?;
        let (is0, is_nan) = (self.eq_int(e, 0)?, self.eq_int(e, 0xFF)?);
        let tiny = self.int(ScalarType::I32, &sh, 0x0040_0000)?;
        let nan = self.int(ScalarType::I32, &sh, 0x7FC0_0000)?;
        let bits = self.select(is0, tiny, bits)?;
        let bits = self.select(is_nan, nan, bits)?;
        self.bitcast(bits, ScalarType::F32)
    }

    fn dot_scaled(&mut self, format: ScaledFormat, op: &Op) -> Result<(), String> {
        let [a, sa, b, sb, acc] = op.operands[..] else {
            return Err("expected 5 operands".into());
        };
        let r = *op.results.first().ok_or("no result")?;
        let (af, bf) = (self.decode(format, a)?, self.decode(format, b)?);
        let (m, k) = (self.shape(af)[0], self.shape(af)[1]);
        let n = self.shape(bf)[1];
        let ks = self.shape(sa)[1];
        if ks == 0 || k % ks != 0 {
            return Err("the scales do not divide K".into());
        }
        let v = k / ks;
        // Each scale over its block of `v` elements along K.
        let (sa, sb) = (self.scales(sa)?, self.scales(sb)?);
        let sa = self.op1(OpKind::ExpandDims { axis: 2 }, &[sa], None)?;
        let sa = self.broadcast(sa, ScalarType::F32, &[m, ks, v])?;
        let sa = self.reshape(sa, ScalarType::F32, &[m, k])?;
        let sb = self.op1(OpKind::ExpandDims { axis: 1 }, &[sb], None)?;
        let sb = self.broadcast(sb, ScalarType::F32, &[ks, v, n])?;
        let sb = self.reshape(sb, ScalarType::F32, &[k, n])?;
        let a2 = self.bin(BinaryOp::Mul, af, sa)?;
        let b2 = self.bin(BinaryOp::Mul, bf, sb)?;
        self.ops.push(Op {
            kind: OpKind::Dot,
            operands: vec![a2, b2, acc],
            results: vec![r],
            regions: Vec::new(),
            span: self.span.clone(),
        });
        Ok(())
    }
}
