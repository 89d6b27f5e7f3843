//! Tests of the reference interpreter against plain-Rust references.

use std::sync::Arc;

use half::{bf16, f16};

use super::*;
use crate::FunctionBuilder;
use crate::ir::{
    AtomicOp, BinaryOp, CmpPred, ConstValue, Function, MemOrder, MemScope, OpKind, ParamAttrs,
    ReduceOp, Span, UnaryOp, ValueId,
};
use crate::types::{AddrSpace, Elem, ScalarType as S, Type};

/// xorshift64* PRNG, deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1), never exactly zero.
    fn f32(&mut self) -> f32 {
        let x = (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
        if x == 0.0 { 0.5 } else { x }
    }
    fn vec_f32(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// A kernel under construction, with helpers that unwrap builder errors.
struct K {
    b: FunctionBuilder,
    span: Span,
}

fn ptr_ty(st: S, shape: &[u32]) -> Type {
    Type {
        elem: Elem::Ptr {
            pointee: st,
            space: AddrSpace::Global,
        },
        shape: shape.to_vec(),
    }
}

impl K {
    fn new(name: &str) -> K {
        K {
            b: FunctionBuilder::new(name, Span::new("tests/kernel.rs", 1, 1)),
            span: Span::new("tests/kernel.rs", 2, 5),
        }
    }
    fn at(&mut self, line: u32, col: u32) -> &mut K {
        self.span = Span::new("tests/kernel.rs", line, col);
        self
    }
    fn ty(&self, v: ValueId) -> Type {
        self.b.ty(v).clone()
    }
    fn ptr(&mut self, name: &str, st: S) -> ValueId {
        self.b.param(name, ptr_ty(st, &[]), ParamAttrs::default())
    }
    fn scalar(&mut self, name: &str, st: S) -> ValueId {
        self.b.param(name, Type::scalar(st), ParamAttrs::default())
    }
    fn op(&mut self, kind: OpKind, operands: &[ValueId], hint: Option<Type>) -> ValueId {
        let sp = self.span.clone();
        self.b.op1(kind, operands, hint.as_ref(), sp).unwrap()
    }
    fn op0(&mut self, kind: OpKind, operands: &[ValueId]) {
        let sp = self.span.clone();
        assert!(self.b.op(kind, operands, None, sp).unwrap().is_empty());
    }
    fn cst(&mut self, c: ConstValue, ty: Type) -> ValueId {
        self.op(OpKind::Const(c), &[], Some(ty))
    }
    fn i32(&mut self, v: i32) -> ValueId {
        self.cst(ConstValue::Int(v as i64), Type::scalar(S::I32))
    }
    fn pid(&mut self, axis: u8) -> ValueId {
        self.op(OpKind::ProgramId { axis }, &[], None)
    }
    fn arange(&mut self, n: u32) -> ValueId {
        self.op(
            OpKind::Arange {
                start: 0,
                end: n as i64,
            },
            &[],
            None,
        )
    }
    fn splat(&mut self, v: ValueId, shape: &[u32]) -> ValueId {
        let t = self.ty(v).with_shape(shape);
        self.op(OpKind::Splat, &[v], Some(t))
    }
    fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
        self.op(OpKind::Binary(op), &[a, b], None)
    }
    fn add(&mut self, a: ValueId, b: ValueId) -> ValueId {
        self.bin(BinaryOp::Add, a, b)
    }
    fn mul(&mut self, a: ValueId, b: ValueId) -> ValueId {
        self.bin(BinaryOp::Mul, a, b)
    }
    fn cmp(&mut self, p: CmpPred, a: ValueId, b: ValueId) -> ValueId {
        self.op(OpKind::Cmp(p), &[a, b], None)
    }
    fn addptr(&mut self, p: ValueId, o: ValueId) -> ValueId {
        let shape = self.ty(o).shape;
        let p = if self.ty(p).shape != shape {
            self.splat(p, &shape)
        } else {
            p
        };
        self.op(OpKind::AddPtr, &[p, o], None)
    }
    fn load(&mut self, p: ValueId, mask: Option<ValueId>, other: Option<ValueId>) -> ValueId {
        let mut ops = vec![p];
        ops.extend(mask);
        ops.extend(other);
        self.op(
            OpKind::Load {
                has_mask: mask.is_some(),
                has_other: other.is_some(),
            },
            &ops,
            None,
        )
    }
    fn store(&mut self, p: ValueId, v: ValueId, mask: Option<ValueId>) {
        let mut ops = vec![p, v];
        ops.extend(mask);
        self.op0(
            OpKind::Store {
                has_mask: mask.is_some(),
            },
            &ops,
        );
    }
    fn expand(&mut self, v: ValueId, axis: u8) -> ValueId {
        self.op(OpKind::ExpandDims { axis }, &[v], None)
    }
    fn broadcast(&mut self, v: ValueId, shape: &[u32]) -> ValueId {
        let t = self.ty(v).with_shape(shape);
        self.op(OpKind::Broadcast, &[v], Some(t))
    }
    /// `[r, c]` i32 offsets `(r0 + i) * stride + (c0 + j)`.
    fn offs2d(&mut self, r0: ValueId, c0: ValueId, r: u32, c: u32, stride: ValueId) -> ValueId {
        let ar = self.arange(r);
        let r0s = self.splat(r0, &[r]);
        let rows = self.add(r0s, ar);
        let rows = self.expand(rows, 1);
        let st = self.splat(stride, &[r, 1]);
        let rows = self.mul(rows, st);
        let rows = self.broadcast(rows, &[r, c]);
        let ac = self.arange(c);
        let c0s = self.splat(c0, &[c]);
        let cols = self.add(c0s, ac);
        let cols = self.expand(cols, 0);
        let cols = self.broadcast(cols, &[r, c]);
        self.add(rows, cols)
    }
    /// Row-major element indices of a tile of `shape` (rank 1 or 2).
    fn iota(&mut self, shape: &[u32]) -> ValueId {
        match shape {
            [n] => self.arange(*n),
            [r, c] => {
                let z = self.i32(0);
                let s = self.i32(*c as i32);
                self.offs2d(z, z, *r, *c, s)
            }
            _ => panic!("rank"),
        }
    }
    fn yield_(&mut self, vals: &[ValueId]) {
        let sp = self.span.clone();
        self.b
            .push_op(OpKind::Yield, vals.to_vec(), vec![], vec![], sp);
    }
    fn for_loop(
        &mut self,
        lb: ValueId,
        ub: ValueId,
        step: ValueId,
        inits: &[ValueId],
        body: impl FnOnce(&mut K, ValueId, &[ValueId]) -> Vec<ValueId>,
    ) -> Vec<ValueId> {
        let mut tys = vec![self.ty(lb)];
        let init_tys: Vec<Type> = inits.iter().map(|&v| self.ty(v)).collect();
        tys.extend(init_tys.iter().cloned());
        let args = self.b.open_region(&tys);
        let ys = body(self, args[0], &args[1..]);
        self.yield_(&ys);
        let r = self.b.close_region();
        let mut ops = vec![lb, ub, step];
        ops.extend_from_slice(inits);
        let sp = self.span.clone();
        self.b.push_op(OpKind::For, ops, init_tys, vec![r], sp)
    }
    fn if_(
        &mut self,
        cond: ValueId,
        tys: &[Type],
        then: impl FnOnce(&mut K) -> Vec<ValueId>,
        els: impl FnOnce(&mut K) -> Vec<ValueId>,
    ) -> Vec<ValueId> {
        self.b.open_region(&[]);
        let t = then(self);
        self.yield_(&t);
        let rt = self.b.close_region();
        self.b.open_region(&[]);
        let e = els(self);
        self.yield_(&e);
        let re = self.b.close_region();
        let sp = self.span.clone();
        self.b
            .push_op(OpKind::If, vec![cond], tys.to_vec(), vec![rt, re], sp)
    }
    fn while_(
        &mut self,
        inits: &[ValueId],
        before: impl FnOnce(&mut K, &[ValueId]) -> (ValueId, Vec<ValueId>),
        after: impl FnOnce(&mut K, &[ValueId]) -> Vec<ValueId>,
    ) -> Vec<ValueId> {
        let tys: Vec<Type> = inits.iter().map(|&v| self.ty(v)).collect();
        let args = self.b.open_region(&tys);
        let (c, fwd) = before(self, &args);
        let fwd_tys: Vec<Type> = fwd.iter().map(|&v| self.ty(v)).collect();
        let mut ops = vec![c];
        ops.extend(fwd);
        let sp = self.span.clone();
        self.b.push_op(OpKind::Condition, ops, vec![], vec![], sp);
        let rb = self.b.close_region();
        let args = self.b.open_region(&fwd_tys);
        let ys = after(self, &args);
        self.yield_(&ys);
        let ra = self.b.close_region();
        let sp = self.span.clone();
        self.b
            .push_op(OpKind::While, inits.to_vec(), fwd_tys, vec![rb, ra], sp)
    }
    fn finish(self) -> Function {
        self.b.finish()
    }
}

fn buf<T: Element>(v: &[T]) -> Arc<HostBuffer> {
    Arc::new(HostBuffer::from_slice(v))
}

fn arg<T: Element>(v: &[T]) -> KernelArg {
    KernelArg::Buffer(buf(v))
}

/// `out = f(in0, in1, ...)` on whole tiles: inputs of `in_shape`, output of `out_shape`,
/// loaded and stored row-major, one program.
fn map_kernel(
    in_tys: &[S],
    in_shape: &[u32],
    out_ty: S,
    out_shape: &[u32],
    f: impl FnOnce(&mut K, &[ValueId]) -> ValueId,
) -> Function {
    let mut k = K::new("map");
    let ps: Vec<ValueId> = in_tys
        .iter()
        .enumerate()
        .map(|(i, &t)| k.ptr(&format!("in{i}"), t))
        .collect();
    let out = k.ptr("out", out_ty);
    let io = k.iota(in_shape);
    let xs: Vec<ValueId> = ps
        .iter()
        .map(|&p| {
            let pp = k.addptr(p, io);
            k.load(pp, None, None)
        })
        .collect();
    let y = f(&mut k, &xs);
    let oo = k.iota(out_shape);
    let op = k.addptr(out, oo);
    k.store(op, y, None);
    k.finish()
}

/// Runs a map kernel on one program; returns the output elements.
fn run_map<O: Element>(f: &Function, inputs: Vec<KernelArg>, out_len: usize) -> Vec<O> {
    let out = Arc::new(HostBuffer::new(O::TY, out_len));
    let mut args = inputs;
    args.push(KernelArg::Buffer(out.clone()));
    run(f, [1, 1, 1], &args).unwrap();
    out.to_vec::<O>().unwrap()
}

/// The vector-add kernel: `z[i] = x[i] + y[i]` for `i < n`, masked when `masked`.
fn vector_add(block: u32, masked: bool) -> Function {
    let mut k = K::new("vector_add");
    let x = k.ptr("x", S::F32);
    let y = k.ptr("y", S::F32);
    let z = k.ptr("z", S::F32);
    let n = k.scalar("n", S::I32);
    k.at(10, 5);
    let pid = k.pid(0);
    let bs = k.i32(block as i32);
    let start = k.mul(pid, bs);
    let ar = k.arange(block);
    let st = k.splat(start, &[block]);
    let offs = k.add(st, ar);
    let ns = k.splat(n, &[block]);
    let mask = k.cmp(CmpPred::Lt, offs, ns);
    let mask = masked.then_some(mask);
    let xp = k.addptr(x, offs);
    let yp = k.addptr(y, offs);
    let zp = k.addptr(z, offs);
    k.at(12, 9);
    let xv = k.load(xp, mask, None);
    k.at(13, 9);
    let yv = k.load(yp, mask, None);
    k.at(14, 5);
    let s = k.add(xv, yv);
    k.at(15, 5);
    k.store(zp, s, mask);
    k.finish()
}

fn vadd_args(x: &[f32], y: &[f32], z: &Arc<HostBuffer>, n: i32) -> Vec<KernelArg> {
    vec![
        arg(x),
        arg(y),
        KernelArg::Buffer(z.clone()),
        KernelArg::Scalar(Scalar::I32(n)),
    ]
}

#[test]
fn host_buffer_is_send_sync_and_round_trips() {
    fn f<T: Send + Sync>() {}
    f::<HostBuffer>();
    f::<KernelArg>();
    let b = HostBuffer::from_slice(&[1.5f32, -2.0, 3.25]);
    assert_eq!(b.len(), 3);
    assert_eq!(b.size_bytes(), 12);
    assert_eq!(b.elem(), S::F32);
    let bytes = b.read_bytes().unwrap();
    assert_eq!(bytes.len(), 12);
    let c = HostBuffer::from_bytes(S::F32, &bytes).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![1.5, -2.0, 3.25]);
    c.write_bytes(1, &7.0f32.to_ne_bytes()).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![1.5, 7.0, 3.25]);
    assert!(c.write_bytes(3, &[0; 4]).is_err());
    assert!(c.write_bytes(2, &[0; 5]).is_err());
    assert!(HostBuffer::from_bytes(S::F32, &[0; 5]).is_err());
    assert!(c.to_vec::<i32>().is_err());
    // Unaligned byte writes across word boundaries.
    let d = HostBuffer::new(S::U8, 21);
    let src: Vec<u8> = (1..=19).collect();
    d.write_bytes(1, &src).unwrap();
    let mut want = vec![0u8; 21];
    want[1..20].copy_from_slice(&src);
    assert_eq!(d.read_bytes().unwrap(), want);
}

#[test]
fn vector_add_ragged_tail() {
    let mut rng = Rng(42);
    for &(n, block) in &[(3000usize, 256u32), (1024, 1024), (1, 64), (777, 128)] {
        let x = rng.vec_f32(n);
        let y = rng.vec_f32(n);
        let z = buf(&vec![f32::NAN; n]);
        let f = vector_add(block, true);
        let grid = n.div_ceil(block as usize) as u32;
        run(&f, [grid, 1, 1], &vadd_args(&x, &y, &z, n as i32)).unwrap();
        let got = z.to_vec::<f32>().unwrap();
        for i in 0..n {
            assert_eq!(got[i], x[i] + y[i], "element {i} (n {n})");
        }
    }
}

#[test]
fn out_of_bounds_load() {
    let n = 1000;
    let x = vec![1.0f32; n];
    let z = Arc::new(HostBuffer::new(S::F32, 1024));
    let f = vector_add(256, false);
    let e = run(
        &f,
        [4, 1, 1],
        &vadd_args(&x, &vec![1.0; 1024], &z, n as i32),
    )
    .unwrap_err();
    assert_eq!(
        e,
        InterpError::OutOfBounds {
            kernel: "vector_add".into(),
            op: "load",
            span: Span::new("tests/kernel.rs", 12, 9),
            program_id: [3, 0, 0],
            index: 1000,
            lane: vec![232],
            buffer: "x".into(),
            len: 1000,
        }
    );
    assert_eq!(
        e.to_string(),
        "tests/kernel.rs:12:9: out-of-bounds load in kernel `vector_add`: index 1000 of \
         buffer `x` (len 1000) at program_id (3, 0, 0), tile element [232]"
    );
}

#[test]
fn out_of_bounds_store() {
    let x = vec![1.0f32; 1024];
    let z = Arc::new(HostBuffer::new(S::F32, 1000));
    let f = vector_add(256, false);
    let e = run(&f, [4, 1, 1], &vadd_args(&x, &x, &z, 1000)).unwrap_err();
    match e {
        InterpError::OutOfBounds {
            op,
            span,
            program_id,
            index,
            lane,
            buffer,
            len,
            ..
        } => {
            assert_eq!(op, "store");
            assert_eq!(span, Span::new("tests/kernel.rs", 15, 5));
            assert_eq!(program_id, [3, 0, 0]);
            assert_eq!(index, 1000);
            assert_eq!(lane, vec![232]);
            assert_eq!(buffer, "z");
            assert_eq!(len, 1000);
        }
        e => panic!("unexpected {e}"),
    }
}

#[test]
fn lowest_failing_program_is_reported() {
    // Every program reads past the end; program 0 must be reported, whatever the order.
    let f = vector_add(256, false);
    let x = vec![1.0f32; 100];
    let z = Arc::new(HostBuffer::new(S::F32, 1 << 16));
    for _ in 0..5 {
        let e = run(&f, [256, 1, 1], &vadd_args(&x, &x, &z, 0)).unwrap_err();
        match e {
            InterpError::OutOfBounds {
                program_id, index, ..
            } => {
                assert_eq!(program_id, [0, 0, 0]);
                assert_eq!(index, 100);
            }
            e => panic!("unexpected {e}"),
        }
    }
}

#[test]
fn masked_off_lanes_are_not_checked() {
    // Offsets -8..8 with mask `offs >= 0`: negative lanes are masked off and yield
    // `other`; a store masked the same way writes only valid lanes.
    let mut k = K::new("masked");
    let x = k.ptr("x", S::I32);
    let out = k.ptr("out", S::I32);
    let ar = k.arange(16);
    let m8 = k.i32(-8);
    let m8 = k.splat(m8, &[16]);
    let offs = k.add(ar, m8);
    let zero = k.i32(0);
    let zs = k.splat(zero, &[16]);
    let mask = k.cmp(CmpPred::Ge, offs, zs);
    let other = k.cst(ConstValue::Int(-1), Type::tile(S::I32, &[16]));
    let xp = k.addptr(x, offs);
    let v = k.load(xp, Some(mask), Some(other));
    let v2 = k.load(xp, Some(mask), None);
    let s = k.add(v, v2);
    let op = k.addptr(out, offs);
    k.store(op, s, Some(mask));
    let op2 = k.addptr(out, ar);
    let _ = op2;
    let f = k.finish();
    let xs: Vec<i32> = (10..18).collect();
    let o = buf(&[0i32; 8]);
    run(&f, [1, 1, 1], &[arg(&xs), KernelArg::Buffer(o.clone())]).unwrap();
    assert_eq!(
        o.to_vec::<i32>().unwrap(),
        (20..36).step_by(2).collect::<Vec<_>>()
    );
}

#[test]
fn integer_division_semantics_and_by_zero() {
    let f = map_kernel(&[S::I32, S::I32], &[8], S::I32, &[8], |k, x| {
        k.bin(BinaryOp::Div, x[0], x[1])
    });
    let a = [7, -7, 7, -7, i32::MIN, 5, 0, 9];
    let b = [2, 2, -2, -2, -1, 7, 3, 1];
    let got: Vec<i32> = run_map(&f, vec![arg(&a), arg(&b)], 8);
    assert_eq!(got, vec![3, -3, -3, 3, i32::MIN, 0, 0, 9]);
    let g = map_kernel(&[S::I32, S::I32], &[8], S::I32, &[8], |k, x| {
        k.bin(BinaryOp::Rem, x[0], x[1])
    });
    let got: Vec<i32> = run_map(&g, vec![arg(&a), arg(&b)], 8);
    assert_eq!(got, vec![1, -1, 1, -1, 0, 5, 0, 0]);
    // Division by zero at lane 3.
    let b0 = [1, 1, 1, 0, 1, 0, 1, 1];
    let out = Arc::new(HostBuffer::new(S::I32, 8));
    let e = run(&f, [1, 1, 1], &[arg(&a), arg(&b0), KernelArg::Buffer(out)]).unwrap_err();
    match &e {
        InterpError::DivisionByZero {
            kernel,
            op,
            span,
            lane,
            program_id,
        } => {
            assert_eq!(kernel, "map");
            assert_eq!(*op, "div");
            assert_eq!(*span, Span::new("tests/kernel.rs", 2, 5));
            assert_eq!(*lane, vec![3]);
            assert_eq!(*program_id, [0, 0, 0]);
        }
        e => panic!("unexpected {e}"),
    }
    assert!(
        e.to_string()
            .starts_with("tests/kernel.rs:2:5: integer division by zero")
    );
    // Unsigned and u64 remainders by zero too.
    let h = map_kernel(&[S::U64, S::U64], &[2], S::U64, &[2], |k, x| {
        k.bin(BinaryOp::Rem, x[0], x[1])
    });
    let out = Arc::new(HostBuffer::new(S::U64, 2));
    let e = run(
        &h,
        [1, 1, 1],
        &[arg(&[1u64, 2]), arg(&[0u64, 1]), KernelArg::Buffer(out)],
    );
    assert!(matches!(e, Err(InterpError::DivisionByZero { .. })));
}

#[test]
fn integer_wrapping_and_shifts() {
    let f = map_kernel(&[S::I8, S::I8], &[4], S::I8, &[4], |k, x| {
        let s = k.add(x[0], x[1]);
        let m = k.mul(s, x[1]);
        k.bin(BinaryOp::Shl, m, x[1])
    });
    let a = [127i8, -128, 3, 1];
    let b = [1i8, -1, 9, -1];
    let got: Vec<i8> = run_map(&f, vec![arg(&a), arg(&b)], 4);
    let want: Vec<i8> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| x.wrapping_add(y).wrapping_mul(y).wrapping_shl(y as u32))
        .collect();
    assert_eq!(got, want);
    let g = map_kernel(&[S::I32, S::I32], &[4], S::I32, &[4], |k, x| {
        k.bin(BinaryOp::Shr, x[0], x[1])
    });
    let got: Vec<i32> = run_map(&g, vec![arg(&[-16, -16, 16, 1]), arg(&[2, 34, -30, 31])], 4);
    assert_eq!(got, vec![-4, -4, 4, 0]);
    let h = map_kernel(&[S::U32, S::U32], &[2], S::U32, &[2], |k, x| {
        k.bin(BinaryOp::Shr, x[0], x[1])
    });
    let got: Vec<u32> = run_map(&h, vec![arg(&[0x8000_0000u32, 7]), arg(&[4u32, 33])], 2);
    assert_eq!(got, vec![0x0800_0000, 3]);
    let u = map_kernel(&[S::I32], &[4], S::I32, &[4], |k, x| {
        k.op(OpKind::Unary(UnaryOp::Abs), &[x[0]], None)
    });
    let got: Vec<i32> = run_map(&u, vec![arg(&[i32::MIN, -3, 4, 0])], 4);
    assert_eq!(got, vec![i32::MIN, 3, 4, 0]);
}

#[test]
fn for_loop_sum() {
    // out[0] = sum of iv over lb..ub by step, plus init 100.
    fn kernel() -> Function {
        let mut k = K::new("sum");
        let out = k.ptr("out", S::I64);
        let lb = k.scalar("lb", S::I64);
        let ub = k.scalar("ub", S::I64);
        let step = k.scalar("step", S::I64);
        let init = k.cst(ConstValue::Int(100), Type::scalar(S::I64));
        let r = k.for_loop(lb, ub, step, &[init], |k, iv, it| vec![k.add(it[0], iv)]);
        let z = k.arange(1);
        let op = k.addptr(out, z);
        let r1 = k.splat(r[0], &[1]);
        k.store(op, r1, None);
        k.finish()
    }
    let f = kernel();
    for &(lb, ub, step) in &[(0i64, 1000i64, 1i64), (5, 5, 1), (10, 0, 1), (-7, 50, 3)] {
        let out = Arc::new(HostBuffer::new(S::I64, 1));
        let args = [
            KernelArg::Buffer(out.clone()),
            KernelArg::Scalar(Scalar::I64(lb)),
            KernelArg::Scalar(Scalar::I64(ub)),
            KernelArg::Scalar(Scalar::I64(step)),
        ];
        run(&f, [1, 1, 1], &args).unwrap();
        let want = 100 + (lb..ub).step_by(step as usize).sum::<i64>();
        assert_eq!(
            out.to_vec::<i64>().unwrap()[0],
            want,
            "{lb}..{ub} by {step}"
        );
    }
    let out = Arc::new(HostBuffer::new(S::I64, 1));
    let e = run(
        &f,
        [1, 1, 1],
        &[
            KernelArg::Buffer(out),
            Scalar::I64(0).into(),
            Scalar::I64(10).into(),
            Scalar::I64(0).into(),
        ],
    )
    .unwrap_err();
    assert!(
        matches!(e, InterpError::Unsupported { op: "for", .. }),
        "{e}"
    );
}

#[test]
fn if_and_while() {
    // x = n; while x < 1000 { x = x * 2 + 1 }; r = if x % 2 == 1 { x } else { -x }
    let mut k = K::new("ctl");
    let out = k.ptr("out", S::I32);
    let n = k.scalar("n", S::I32);
    let w = k.while_(
        &[n],
        |k, a| {
            let lim = k.i32(1000);
            let c = k.cmp(CmpPred::Lt, a[0], lim);
            (c, vec![a[0]])
        },
        |k, a| {
            let two = k.i32(2);
            let one = k.i32(1);
            let m = k.mul(a[0], two);
            vec![k.add(m, one)]
        },
    );
    let two = k.i32(2);
    let one = k.i32(1);
    let r = k.bin(BinaryOp::Rem, w[0], two);
    let odd = k.cmp(CmpPred::Eq, r, one);
    let res = k.if_(
        odd,
        &[Type::scalar(S::I32)],
        |_| vec![w[0]],
        |k| vec![k.op(OpKind::Unary(UnaryOp::Neg), &[w[0]], None)],
    );
    let z = k.arange(1);
    let op = k.addptr(out, z);
    let r1 = k.splat(res[0], &[1]);
    k.store(op, r1, None);
    let f = k.finish();
    for n in [0i32, 1, 2, 999, 1000, 5000] {
        let mut x = n;
        while x < 1000 {
            x = x * 2 + 1;
        }
        let want = if x % 2 == 1 { x } else { -x };
        let o = Arc::new(HostBuffer::new(S::I32, 1));
        run(
            &f,
            [1, 1, 1],
            &[KernelArg::Buffer(o.clone()), Scalar::I32(n).into()],
        )
        .unwrap();
        assert_eq!(o.to_vec::<i32>().unwrap()[0], want, "n = {n}");
    }
}

fn dot_ref(a: &[f32], b: &[f32], c: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = c.to_vec();
    for i in 0..m {
        for j in 0..n {
            let mut s = out[i * n + j];
            for kk in 0..k {
                s += a[i * k + kk] * b[kk * n + j];
            }
            out[i * n + j] = s;
        }
    }
    out
}

#[test]
fn dot_f32_and_f16() {
    let (m, kd, n) = (16u32, 8u32, 32u32);
    let mut rng = Rng(7);
    let a = rng.vec_f32((m * kd) as usize);
    let b = rng.vec_f32((kd * n) as usize);
    let c = rng.vec_f32((m * n) as usize);
    let dot_kernel = |t: S| {
        let mut k = K::new("dot");
        let pa = k.ptr("a", t);
        let pb = k.ptr("b", t);
        let pc = k.ptr("c", S::F32);
        let out = k.ptr("out", S::F32);
        let ia = k.iota(&[m, kd]);
        let ib = k.iota(&[kd, n]);
        let ic = k.iota(&[m, n]);
        let pa = k.addptr(pa, ia);
        let pb = k.addptr(pb, ib);
        let pc = k.addptr(pc, ic);
        let po = k.addptr(out, ic);
        let av = k.load(pa, None, None);
        let bv = k.load(pb, None, None);
        let cv = k.load(pc, None, None);
        let d = k.op(OpKind::Dot, &[av, bv, cv], None);
        k.store(po, d, None);
        k.finish()
    };
    let (mu, ku, nu) = (m as usize, kd as usize, n as usize);
    let f = dot_kernel(S::F32);
    let got: Vec<f32> = run_map(&f, vec![arg(&a), arg(&b), arg(&c)], mu * nu);
    assert_eq!(got, dot_ref(&a, &b, &c, mu, ku, nu));
    let ah: Vec<f16> = a.iter().map(|&x| f16::from_f32(x)).collect();
    let bh: Vec<f16> = b.iter().map(|&x| f16::from_f32(x)).collect();
    let a32: Vec<f32> = ah.iter().map(|x| x.to_f32()).collect();
    let b32: Vec<f32> = bh.iter().map(|x| x.to_f32()).collect();
    let f = dot_kernel(S::F16);
    let got: Vec<f32> = run_map(&f, vec![arg(&ah), arg(&bh), arg(&c)], mu * nu);
    assert_eq!(got, dot_ref(&a32, &b32, &c, mu, ku, nu));
}

#[test]
fn reduce_and_scan_every_op_both_axes() {
    let (r, c) = (4u32, 8u32);
    let (ru, cu) = (r as usize, c as usize);
    let mut rng = Rng(99);
    let xi: Vec<i32> = (0..ru * cu)
        .map(|_| (rng.next() % 2001) as i32 - 1000)
        .collect();
    let xf: Vec<f32> = rng.vec_f32(ru * cu);
    fn comb_i(op: ReduceOp, a: i32, b: i32) -> i32 {
        match op {
            ReduceOp::Sum => a.wrapping_add(b),
            ReduceOp::Prod => a.wrapping_mul(b),
            ReduceOp::Min => a.min(b),
            ReduceOp::Max => a.max(b),
            ReduceOp::And => a & b,
            ReduceOp::Or => a | b,
            ReduceOp::Xor => a ^ b,
        }
    }
    fn comb_f(op: ReduceOp, a: f32, b: f32) -> f32 {
        match op {
            ReduceOp::Sum => a + b,
            ReduceOp::Prod => a * b,
            ReduceOp::Min => a.min(b),
            ReduceOp::Max => a.max(b),
            _ => unreachable!(),
        }
    }
    // Reference: element (i, j) of the [r, c] tile; reduce/scan along `axis`.
    fn reference<T: Copy>(
        x: &[T],
        (r, c): (usize, usize),
        axis: usize,
        scan: Option<bool>,
        f: impl Fn(T, T) -> T,
    ) -> Vec<T> {
        let at = |i: usize, j: usize| x[i * c + j];
        let (outer, n) = if axis == 0 { (c, r) } else { (r, c) };
        let get = |o: usize, k: usize| if axis == 0 { at(k, o) } else { at(o, k) };
        match scan {
            None => (0..outer)
                .map(|o| (1..n).fold(get(o, 0), |acc, k| f(acc, get(o, k))))
                .collect(),
            Some(rev) => {
                let mut out = x.to_vec();
                for o in 0..outer {
                    let order: Vec<usize> = if rev {
                        (0..n).rev().collect()
                    } else {
                        (0..n).collect()
                    };
                    let mut acc = get(o, order[0]);
                    for (s, &k) in order.iter().enumerate() {
                        if s > 0 {
                            acc = f(acc, get(o, k));
                        }
                        let idx = if axis == 0 { k * c + o } else { o * c + k };
                        out[idx] = acc;
                    }
                }
                out
            }
        }
    }
    for axis in 0..2u8 {
        for scan in [None, Some(false), Some(true)] {
            let out_shape: Vec<u32> = match scan {
                None if axis == 0 => vec![c],
                None => vec![r],
                Some(_) => vec![r, c],
            };
            let out_len = out_shape.iter().product::<u32>() as usize;
            let kind = |op| match scan {
                None => OpKind::Reduce { axis, op },
                Some(reverse) => OpKind::Scan { axis, op, reverse },
            };
            for op in ReduceOp::ALL {
                let f = map_kernel(&[S::I32], &[r, c], S::I32, &out_shape, |k, x| {
                    k.op(kind(op), &[x[0]], None)
                });
                let got: Vec<i32> = run_map(&f, vec![arg(&xi)], out_len);
                let want = reference(&xi, (ru, cu), axis as usize, scan, |a, b| comb_i(op, a, b));
                assert_eq!(got, want, "i32 {op:?} axis {axis} scan {scan:?}");
                if matches!(op, ReduceOp::And | ReduceOp::Or | ReduceOp::Xor) {
                    continue;
                }
                let f = map_kernel(&[S::F32], &[r, c], S::F32, &out_shape, |k, x| {
                    k.op(kind(op), &[x[0]], None)
                });
                let got: Vec<f32> = run_map(&f, vec![arg(&xf)], out_len);
                let want = reference(&xf, (ru, cu), axis as usize, scan, |a, b| comb_f(op, a, b));
                assert_eq!(got, want, "f32 {op:?} axis {axis} scan {scan:?}");
            }
        }
    }
}

#[test]
fn structural_ops() {
    // permute (transpose), reshape, broadcast of a column.
    let x: Vec<i32> = (0..32).collect();
    let f = map_kernel(&[S::I32], &[4, 8], S::I32, &[8, 4], |k, v| {
        k.op(OpKind::Permute { order: vec![1, 0] }, &[v[0]], None)
    });
    let got: Vec<i32> = run_map(&f, vec![arg(&x)], 32);
    let want: Vec<i32> = (0..32).map(|i| (i % 4) * 8 + i / 4).collect();
    assert_eq!(got, want);
    let f = map_kernel(&[S::I32], &[4, 8], S::I32, &[8, 4], |k, v| {
        k.op(OpKind::Reshape, &[v[0]], Some(Type::tile(S::I32, &[8, 4])))
    });
    let got: Vec<i32> = run_map(&f, vec![arg(&x)], 32);
    assert_eq!(got, x);
    let f = map_kernel(&[S::I32], &[4], S::I32, &[4, 8], |k, v| {
        let e = k.expand(v[0], 1);
        k.broadcast(e, &[4, 8])
    });
    let got: Vec<i32> = run_map(&f, vec![arg(&x[..4])], 32);
    let want: Vec<i32> = (0..32).map(|i| i / 8).collect();
    assert_eq!(got, want);
    // select
    let f = map_kernel(&[S::F32, S::F32], &[4], S::F32, &[4], |k, v| {
        let c = k.cmp(CmpPred::Gt, v[0], v[1]);
        k.op(OpKind::Select, &[c, v[0], v[1]], None)
    });
    let got: Vec<f32> = run_map(
        &f,
        vec![
            arg(&[1.0f32, 5.0, -1.0, 2.0]),
            arg(&[2.0f32, 3.0, 0.0, 2.0]),
        ],
        4,
    );
    assert_eq!(got, vec![2.0, 5.0, 0.0, 2.0]);
}

#[test]
fn cast_edge_cases() {
    let xs = [
        f32::NAN,
        1e10,
        -1e10,
        3.7,
        -3.7,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.5,
    ];
    let to = |t: S| {
        map_kernel(&[S::F32], &[8], t, &[8], |k, x| {
            k.op(OpKind::Cast, &[x[0]], Some(Type::tile(t, &[8])))
        })
    };
    let got: Vec<i32> = run_map(&to(S::I32), vec![arg(&xs)], 8);
    assert_eq!(
        got,
        vec![0, i32::MAX, i32::MIN, 3, -3, i32::MAX, i32::MIN, 0]
    );
    let got: Vec<u8> = run_map(&to(S::U8), vec![arg(&xs)], 8);
    assert_eq!(got, vec![0, 255, 0, 3, 0, 255, 0, 0]);
    let got: Vec<bool> = run_map(&to(S::I1), vec![arg(&xs)], 8);
    assert_eq!(got, vec![true; 8]);
    // f32 -> f16: ties to even, overflow to infinity, subnormals.
    let hs = [
        1.0 + 2f32.powi(-11),
        1.0 + 3.0 * 2f32.powi(-11),
        65520.0,
        65519.0,
        2f32.powi(-25),
        2f32.powi(-25) * 1.5,
        -0.0,
        f32::NAN,
    ];
    let got: Vec<f16> = run_map(&to(S::F16), vec![arg(&hs)], 8);
    let want = [
        1.0,
        1.0 + 2f32.powi(-9),
        f32::INFINITY,
        65504.0,
        0.0,
        2f32.powi(-24),
        -0.0,
    ];
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.to_f32().to_bits(), w.to_bits());
    }
    assert!(got[7].is_nan());
    // f64 -> f16 without double rounding; i64/u64 -> bf16 likewise.
    let d = [
        1.0 + 2f64.powi(-11) + 2f64.powi(-40),
        -(1.0 + 2f64.powi(-11)),
    ];
    let f = map_kernel(&[S::F64], &[2], S::F16, &[2], |k, x| {
        k.op(OpKind::Cast, &[x[0]], Some(Type::tile(S::F16, &[2])))
    });
    let got: Vec<f16> = run_map(&f, vec![arg(&d)], 2);
    assert_eq!(got[0].to_f32(), 1.0 + 2f32.powi(-10));
    assert_eq!(got[1].to_f32(), -1.0);
    let big = [(1u64 << 60) + (1 << 52) + 1, (1u64 << 60) + (1 << 52)];
    let f = map_kernel(&[S::U64], &[2], S::BF16, &[2], |k, x| {
        k.op(OpKind::Cast, &[x[0]], Some(Type::tile(S::BF16, &[2])))
    });
    let got: Vec<bf16> = run_map(&f, vec![arg(&big)], 2);
    assert_eq!(got[0].to_f64(), 2f64.powi(60) * (1.0 + 2f64.powi(-7)));
    assert_eq!(got[1].to_f64(), 2f64.powi(60));
    // int -> int: truncation and sign/zero extension; i1 -> int/float.
    let f = map_kernel(&[S::I32], &[4], S::U8, &[4], |k, x| {
        k.op(OpKind::Cast, &[x[0]], Some(Type::tile(S::U8, &[4])))
    });
    let got: Vec<u8> = run_map(&f, vec![arg(&[-1i32, 256, 257, 0x7f])], 4);
    assert_eq!(got, vec![255, 0, 1, 0x7f]);
    let f = map_kernel(&[S::I8], &[2], S::U64, &[2], |k, x| {
        k.op(OpKind::Cast, &[x[0]], Some(Type::tile(S::U64, &[2])))
    });
    let got: Vec<u64> = run_map(&f, vec![arg(&[-1i8, 5])], 2);
    assert_eq!(got, vec![u64::MAX, 5]);
    let f = map_kernel(&[S::I1], &[2], S::F32, &[2], |k, x| {
        k.op(OpKind::Cast, &[x[0]], Some(Type::tile(S::F32, &[2])))
    });
    let got: Vec<f32> = run_map(&f, vec![arg(&[true, false])], 2);
    assert_eq!(got, vec![1.0, 0.0]);
    // u32 -> f32 rounds to nearest even.
    let f = map_kernel(&[S::U32], &[2], S::F32, &[2], |k, x| {
        k.op(OpKind::Cast, &[x[0]], Some(Type::tile(S::F32, &[2])))
    });
    let got: Vec<f32> = run_map(&f, vec![arg(&[16_777_217u32, u32::MAX])], 2);
    assert_eq!(got, vec![16_777_216.0, 4_294_967_296.0]);
}

#[test]
fn half_precision_rounds_per_op() {
    // (1 + 2^-11) + 2^-11 in f16: each add rounds to even (1.0), so the result is 1.0
    // although the exact sum 1 + 2^-10 is representable.
    let e = f16::from_f32(2f32.powi(-11));
    let f = map_kernel(&[S::F16, S::F16], &[2], S::F16, &[2], |k, x| {
        let s = k.add(x[0], x[1]);
        k.add(s, x[1])
    });
    let got: Vec<f16> = run_map(
        &f,
        vec![arg(&[f16::ONE, f16::ONE]), arg(&[e, f16::ZERO])],
        2,
    );
    assert_eq!(got, vec![f16::ONE, f16::ONE]);
    let eb = bf16::from_f32(2f32.powi(-8));
    let f = map_kernel(&[S::BF16, S::BF16], &[2], S::BF16, &[2], |k, x| {
        let s = k.add(x[0], x[1]);
        let s = k.add(s, x[1]);
        k.mul(s, x[0])
    });
    let got: Vec<bf16> = run_map(
        &f,
        vec![arg(&[bf16::ONE, bf16::ONE]), arg(&[eb, bf16::ZERO])],
        2,
    );
    assert_eq!(got, vec![bf16::ONE, bf16::ONE]);
    // f16 sum reduction rounds after every step.
    let xs = [f16::ONE, e, e, e];
    let f = map_kernel(&[S::F16], &[4], S::F16, &[1], |k, x| {
        let r = k.op(
            OpKind::Reduce {
                axis: 0,
                op: ReduceOp::Sum,
            },
            &[x[0]],
            None,
        );
        k.splat(r, &[1])
    });
    let got: Vec<f16> = run_map(&f, vec![arg(&xs)], 1);
    assert_eq!(got[0], f16::ONE);
    // fma rounds once: 1 * (1 + 2^-11) + 2^-24 rounds up, unlike mul then add.
    let t = f16::from_f32(1.0 + 2f32.powi(-10));
    let f = map_kernel(&[S::F16, S::F16, S::F16], &[1], S::F16, &[1], |k, x| {
        k.op(OpKind::Fma, &[x[0], x[1], x[2]], None)
    });
    let h = f16::from_f32(2f32.powi(-11));
    let tiny = f16::from_f32(2f32.powi(-24));
    // (1 + 2^-11) is not representable; use (1 + 2^-10) * (1 - 2^-11)...: simpler:
    // a = 1 + 2^-10, b = 1, c = 2^-11 + 2^-24 → exact 1 + 2^-10 + 2^-11 + 2^-24,
    // just above the tie between 1 + 2^-10 and 1 + 2^-9: rounds up.
    let c = f16::from_f32(h.to_f32() + tiny.to_f32());
    let got: Vec<f16> = run_map(&f, vec![arg(&[t]), arg(&[f16::ONE]), arg(&[c])], 1);
    assert_eq!(got[0].to_f32(), 1.0 + 2f32.powi(-9));
}

#[test]
fn float_min_max_propagate_nan() {
    let a = [f32::NAN, 1.0, -0.0, 0.0, 2.0, 1.0, 1.0, 1.0];
    let b = [1.0, f32::NAN, 0.0, -0.0, 3.0, 1.0, 1.0, 1.0];
    let mk = |op| {
        map_kernel(&[S::F32, S::F32], &[8], S::F32, &[8], move |k, x| {
            k.bin(op, x[0], x[1])
        })
    };
    let mn: Vec<f32> = run_map(&mk(BinaryOp::Min), vec![arg(&a[..]), arg(&b[..])], 8);
    let mx: Vec<f32> = run_map(&mk(BinaryOp::Max), vec![arg(&a[..]), arg(&b[..])], 8);
    assert!(mn[0].is_nan() && mn[1].is_nan() && mx[0].is_nan() && mx[1].is_nan());
    assert_eq!(mn[2].to_bits(), (-0.0f32).to_bits());
    assert_eq!(mn[3].to_bits(), (-0.0f32).to_bits());
    assert_eq!(mx[2].to_bits(), 0.0f32.to_bits());
    assert_eq!(mx[3].to_bits(), 0.0f32.to_bits());
    assert_eq!((mn[4], mx[4]), (2.0, 3.0));
    // Comparisons are ordered; `ne` is true with NaN.
    let ne = map_kernel(&[S::F32, S::F32], &[8], S::I1, &[8], |k, x| {
        k.cmp(CmpPred::Ne, x[0], x[1])
    });
    let got: Vec<bool> = run_map(&ne, vec![arg(&a[..]), arg(&b[..])], 8);
    assert_eq!(got[..5], [true, true, false, false, true]);
    let lt = map_kernel(&[S::F32, S::F32], &[8], S::I1, &[8], |k, x| {
        k.cmp(CmpPred::Le, x[0], x[1])
    });
    let got: Vec<bool> = run_map(&lt, vec![arg(&a[..]), arg(&b[..])], 8);
    assert_eq!(got[..5], [false, false, true, true, true]);
}

#[test]
fn unary_math() {
    let xs = [0.25f32, 1.0, 2.5, -0.75];
    let ops = [
        (UnaryOp::Exp, f64::exp as fn(f64) -> f64),
        (UnaryOp::Log, |x: f64| x.abs().ln()),
        (UnaryOp::Sqrt, |x: f64| x.abs().sqrt()),
        (UnaryOp::Rsqrt, |x: f64| 1.0 / x.abs().sqrt()),
        (UnaryOp::Tanh, f64::tanh),
        (UnaryOp::Erf, libm::erf),
        (UnaryOp::Sin, f64::sin),
        (UnaryOp::Floor, f64::floor),
        (UnaryOp::Ceil, f64::ceil),
        (UnaryOp::Exp2, f64::exp2),
    ];
    for (op, r) in ops {
        let needs_pos = matches!(op, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt);
        let f = map_kernel(&[S::F32], &[4], S::F32, &[4], |k, x| {
            let x = if needs_pos {
                k.op(OpKind::Unary(UnaryOp::Abs), &[x[0]], None)
            } else {
                x[0]
            };
            k.op(OpKind::Unary(op), &[x], None)
        });
        let got: Vec<f32> = run_map(&f, vec![arg(&xs)], 4);
        for (g, &x) in got.iter().zip(&xs) {
            let w = r(x as f64);
            assert!(
                ((*g as f64) - w).abs() <= 1e-6 * w.abs().max(1.0),
                "{op:?}({x}) = {g}, want {w}"
            );
        }
    }
}

#[test]
fn atomics_from_many_programs() {
    // 64 programs x 32 lanes add 1 to counter[0] (i32 and f32), max into m[0] and
    // exchange; one CAS per program on a lock word.
    let mut k = K::new("atomics");
    let ci = k.ptr("ci", S::I32);
    let cf = k.ptr("cf", S::F32);
    let mx = k.ptr("mx", S::U64);
    let pid = k.pid(0);
    let zero = k.cst(ConstValue::Int(0), Type::tile(S::I32, &[32]));
    let pi = k.addptr(ci, zero);
    let pf = k.addptr(cf, zero);
    let pm = k.addptr(mx, zero);
    let one = k.cst(ConstValue::Int(1), Type::tile(S::I32, &[32]));
    let onef = k.cst(ConstValue::Float(1.0), Type::tile(S::F32, &[32]));
    let rmw = |op| OpKind::AtomicRmw {
        op,
        order: MemOrder::AcqRel,
        scope: MemScope::Device,
        has_mask: false,
    };
    k.op(rmw(AtomicOp::Add), &[pi, one], None);
    k.op(rmw(AtomicOp::Add), &[pf, onef], None);
    let ar = k.arange(32);
    let ps = k.splat(pid, &[32]);
    let v = k.mul(ps, ar);
    let v = k.op(OpKind::Cast, &[v], Some(Type::tile(S::U64, &[32])));
    k.op(rmw(AtomicOp::Max), &[pm, v], None);
    let f = k.finish();
    let ci = buf(&[5i32]);
    let cf = buf(&[0.5f32]);
    let mxb = buf(&[0u64]);
    run(
        &f,
        [64, 1, 1],
        &[
            KernelArg::Buffer(ci.clone()),
            KernelArg::Buffer(cf.clone()),
            KernelArg::Buffer(mxb.clone()),
        ],
    )
    .unwrap();
    assert_eq!(ci.to_vec::<i32>().unwrap(), vec![5 + 64 * 32]);
    assert_eq!(cf.to_vec::<f32>().unwrap(), vec![0.5 + 2048.0]);
    assert_eq!(mxb.to_vec::<u64>().unwrap(), vec![63 * 31]);

    // CAS: each program tries to swap slot[pid % 4] from 0 to pid + 1; the old values
    // returned are stored. Exactly one program per slot succeeds.
    let mut k = K::new("cas");
    let slot = k.ptr("slot", S::I32);
    let olds = k.ptr("olds", S::I32);
    let pid = k.pid(0);
    let four = k.i32(4);
    let s = k.bin(BinaryOp::Rem, pid, four);
    let s1 = k.splat(s, &[1]);
    let p = k.addptr(slot, s1);
    let exp = k.cst(ConstValue::Int(0), Type::tile(S::I32, &[1]));
    let one = k.i32(1);
    let d = k.add(pid, one);
    let d1 = k.splat(d, &[1]);
    let old = k.op(
        OpKind::AtomicCas {
            order: MemOrder::Relaxed,
            scope: MemScope::Device,
            has_mask: false,
        },
        &[p, exp, d1],
        None,
    );
    let pid1 = k.splat(pid, &[1]);
    let po = k.addptr(olds, pid1);
    k.store(po, old, None);
    let f = k.finish();
    let slots = buf(&[0i32; 4]);
    let olds = buf(&[-1i32; 32]);
    run(
        &f,
        [32, 1, 1],
        &[
            KernelArg::Buffer(slots.clone()),
            KernelArg::Buffer(olds.clone()),
        ],
    )
    .unwrap();
    let sv = slots.to_vec::<i32>().unwrap();
    let ov = olds.to_vec::<i32>().unwrap();
    for (s, &won) in sv.iter().enumerate() {
        let winners: Vec<usize> = (0..32).filter(|&p| p % 4 == s && ov[p] == 0).collect();
        assert_eq!(winners.len(), 1);
        assert_eq!(won, winners[0] as i32 + 1);
        for p in (0..32).filter(|&p| p % 4 == s && ov[p] != 0) {
            assert_eq!(ov[p], won);
        }
    }
}

#[test]
fn arg_mismatch_errors() {
    let f = vector_add(64, true);
    let x = [1.0f32; 64];
    let z = Arc::new(HostBuffer::new(S::F32, 64));
    let param = |e: InterpError| match e {
        InterpError::ArgMismatch { param, .. } => param,
        e => panic!("unexpected {e}"),
    };
    let e = run(&f, [1, 1, 1], &[arg(&x), arg(&x)]).unwrap_err();
    assert_eq!(param(e), "<count>");
    let mut a = vadd_args(&x, &x, &z, 64);
    a[1] = arg(&[1i32; 64]);
    let e = run(&f, [1, 1, 1], &a).unwrap_err();
    assert!(e.to_string().contains("parameter `y`"), "{e}");
    assert_eq!(param(e), "y");
    let mut a = vadd_args(&x, &x, &z, 64);
    a[3] = Scalar::I64(64).into();
    assert_eq!(param(run(&f, [1, 1, 1], &a).unwrap_err()), "n");
    let mut a = vadd_args(&x, &x, &z, 64);
    a[3] = arg(&x);
    assert_eq!(param(run(&f, [1, 1, 1], &a).unwrap_err()), "n");
    let mut a = vadd_args(&x, &x, &z, 64);
    a[0] = Scalar::F32(1.0).into();
    assert_eq!(param(run(&f, [1, 1, 1], &a).unwrap_err()), "x");
    // An empty grid runs nothing.
    run(&f, [0, 1, 1], &vadd_args(&x, &x, &z, 64)).unwrap();
}

#[test]
fn three_d_grid_and_num_programs() {
    // out[linear pid] = pid_x + 10 * pid_y + 100 * pid_z + 1000 * num_programs(2)
    let mut k = K::new("grid");
    let out = k.ptr("out", S::I32);
    let (x, y, z) = (k.pid(0), k.pid(1), k.pid(2));
    let nx = k.op(OpKind::NumPrograms { axis: 0 }, &[], None);
    let ny = k.op(OpKind::NumPrograms { axis: 1 }, &[], None);
    let nz = k.op(OpKind::NumPrograms { axis: 2 }, &[], None);
    let lin = k.mul(z, ny);
    let lin = k.add(lin, y);
    let lin = k.mul(lin, nx);
    let lin = k.add(lin, x);
    let c10 = k.i32(10);
    let c100 = k.i32(100);
    let c1000 = k.i32(1000);
    let v = k.mul(y, c10);
    let v = k.add(v, x);
    let w = k.mul(z, c100);
    let v = k.add(v, w);
    let w = k.mul(nz, c1000);
    let v = k.add(v, w);
    let l1 = k.splat(lin, &[1]);
    let p = k.addptr(out, l1);
    let v1 = k.splat(v, &[1]);
    k.store(p, v1, None);
    let f = k.finish();
    let o = Arc::new(HostBuffer::new(S::I32, 2 * 3 * 4));
    run(&f, [2, 3, 4], &[KernelArg::Buffer(o.clone())]).unwrap();
    let got = o.to_vec::<i32>().unwrap();
    for zz in 0..4 {
        for yy in 0..3 {
            for xx in 0..2 {
                assert_eq!(
                    got[(zz * 3 + yy) * 2 + xx] as usize,
                    xx + 10 * yy + 100 * zz + 4000
                );
            }
        }
    }
}

/// Tiled matmul `c = a · b` (`m x k` times `k x n`, f32), block `bm x bn x bk`.
fn matmul_kernel(bm: u32, bn: u32, bk: u32) -> Function {
    let mut k = K::new("matmul");
    let a = k.ptr("a", S::F32);
    let b = k.ptr("b", S::F32);
    let c = k.ptr("c", S::F32);
    let kd = k.scalar("k", S::I32);
    let n = k.scalar("n", S::I32);
    let pm = k.pid(0);
    let pn = k.pid(1);
    let cbm = k.i32(bm as i32);
    let cbn = k.i32(bn as i32);
    let r0 = k.mul(pm, cbm);
    let c0 = k.mul(pn, cbn);
    let zero = k.i32(0);
    let step = k.i32(bk as i32);
    let acc = k.cst(ConstValue::Float(0.0), Type::tile(S::F32, &[bm, bn]));
    let res = k.for_loop(zero, kd, step, &[acc], |k, kk, it| {
        let ao = k.offs2d(r0, kk, bm, bk, kd);
        let bo = k.offs2d(kk, c0, bk, bn, n);
        let ap = k.addptr(a, ao);
        let bp = k.addptr(b, bo);
        let av = k.load(ap, None, None);
        let bv = k.load(bp, None, None);
        vec![k.op(OpKind::Dot, &[av, bv, it[0]], None)]
    });
    let co = k.offs2d(r0, c0, bm, bn, n);
    let cp = k.addptr(c, co);
    k.store(cp, res[0], None);
    k.finish()
}

#[test]
fn tiled_matmul_matches_reference() {
    let (m, kd, n) = (128usize, 64usize, 128usize);
    let mut rng = Rng(5);
    let a = rng.vec_f32(m * kd);
    let b = rng.vec_f32(kd * n);
    let f = matmul_kernel(64, 64, 32);
    let c = Arc::new(HostBuffer::new(S::F32, m * n));
    let args = [
        arg(&a),
        arg(&b),
        KernelArg::Buffer(c.clone()),
        Scalar::I32(kd as i32).into(),
        Scalar::I32(n as i32).into(),
    ];
    run(&f, [(m / 64) as u32, (n / 64) as u32, 1], &args).unwrap();
    let got = c.to_vec::<f32>().unwrap();
    let want = dot_ref(&a, &b, &vec![0.0; m * n], m, kd, n);
    assert_eq!(got, want);
}

#[test]
fn splats_in_every_position() {
    // Splats used by two-splat binaries, by broadcasting ops, and stored directly.
    let mut k = K::new("splats");
    let out = k.ptr("out", S::I32);
    let out2 = k.ptr("out2", S::I32);
    let a = k.i32(3);
    let b = k.i32(4);
    let sa = k.splat(a, &[8]);
    let sb = k.splat(b, &[8]);
    let s = k.add(sa, sb);
    let ar = k.arange(8);
    let t = k.mul(ar, sa);
    let u = k.add(s, t);
    let sc = k.splat(b, &[8]);
    let lt = k.cmp(CmpPred::Lt, ar, sc);
    let o = k.addptr(out, ar);
    k.store(o, u, Some(lt));
    let o2 = k.addptr(out2, ar);
    let sd = k.splat(a, &[8]);
    k.store(o2, sd, None);
    let f = k.finish();
    let o = buf(&[-1i32; 8]);
    let o2 = buf(&[-1i32; 8]);
    run(
        &f,
        [1, 1, 1],
        &[KernelArg::Buffer(o.clone()), KernelArg::Buffer(o2.clone())],
    )
    .unwrap();
    assert_eq!(
        o.to_vec::<i32>().unwrap(),
        vec![7, 10, 13, 16, -1, -1, -1, -1]
    );
    assert_eq!(o2.to_vec::<i32>().unwrap(), vec![3; 8]);
}

/// Another rank's memory that applies puts at once and counts the engine's calls.
struct Counted {
    mem: std::sync::Mutex<Vec<u8>>,
    gets: std::sync::atomic::AtomicUsize,
    puts: std::sync::atomic::AtomicUsize,
}

impl RemoteMemory for Counted {
    fn len(&self) -> usize {
        self.mem.lock().unwrap().len()
    }
    fn get(&self, offset: usize, out: &mut [u8]) -> Result<(), String> {
        self.gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        out.copy_from_slice(&self.mem.lock().unwrap()[offset..offset + out.len()]);
        Ok(())
    }
    fn put(&self, offset: usize, data: &[u8]) -> Result<(), String> {
        self.puts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.mem.lock().unwrap()[offset..offset + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn compare_and_swap(&self, _: usize, _: usize, _: u64, _: u64) -> Result<u64, String> {
        Err("no atomics here".into())
    }
    fn fetch_add_u64(&self, _: usize, _: u64) -> Result<u64, String> {
        Err("no atomics here".into())
    }
    fn quiet(&self) -> Result<(), String> {
        Ok(())
    }
}

#[test]
fn a_ragged_tile_reaches_another_rank_in_one_transfer() {
    // The last tile of a 5-element buffer: 16 lanes, 11 masked off past the end. On
    // another rank's memory the 5 lanes are one get and one put (not one per lane).
    let mut k = K::new("ragged");
    let x = k.ptr("x", S::I32);
    let out = k.ptr("out", S::I32);
    let ar = k.arange(16);
    let five = k.i32(5);
    let fives = k.splat(five, &[16]);
    let mask = k.cmp(CmpPred::Lt, ar, fives);
    let xp = k.addptr(x, ar);
    let v = k.load(xp, Some(mask), None);
    let one = k.i32(1);
    let ones = k.splat(one, &[16]);
    let w = k.add(v, ones);
    let op = k.addptr(out, ar);
    k.store(op, w, Some(mask));
    let f = k.finish();
    let remote = |vals: &[i32]| {
        let mem = Arc::new(Counted {
            // Whole 8-byte words of memory (views start and end on them).
            mem: std::sync::Mutex::new(
                vals.iter()
                    .flat_map(|v| v.to_ne_bytes())
                    .chain([0; 4])
                    .collect(),
            ),
            gets: Default::default(),
            puts: Default::default(),
        });
        let b = HostBuffer::remote(mem.clone(), 0, S::I32, vals.len()).unwrap();
        (mem, Arc::new(b))
    };
    let (xm, xb) = remote(&[3, -1, 7, 40, 9]);
    let (om, ob) = remote(&[0; 5]);
    run(
        &f,
        [1, 1, 1],
        &[KernelArg::Buffer(xb), KernelArg::Buffer(ob.clone())],
    )
    .unwrap();
    assert_eq!(ob.to_vec::<i32>().unwrap(), [4, 0, 8, 41, 10]);
    assert_eq!(
        xm.gets.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "gets of the ragged tile"
    );
    assert_eq!(
        om.puts.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "puts of the ragged tile"
    );
}
