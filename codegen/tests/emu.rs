//! The SIMT emulator's own checks: kernels built with the IR builder run on
//! `emu-nv` and `emu-amd` and match the reference interpreter; misuse (out-of-bounds
//! accesses) is reported with the op's source location. The cross-backend suite over
//! every example kernel lives in `tests/tests/cross_backend.rs`.

use std::sync::Arc;

use tessera_codegen::CompileOptions;
use tessera_codegen::emu::{self, EmuError};
use tessera_codegen::target::EmuFlavor;
use tessera_ir::interp::{self, HostBuffer, KernelArg, Scalar};
use tessera_ir::ir::{BinaryOp, CmpPred, OpKind, ParamAttrs};
use tessera_ir::{AddrSpace, Elem, Function, FunctionBuilder, ScalarType, Span, Type, ValueId};

const FLAVORS: [EmuFlavor; 2] = [EmuFlavor::Nv, EmuFlavor::Amd];

fn at(line: u32) -> Span {
    Span::new("codegen/tests/emu.rs", line, 5)
}

fn ptr_tile(s: ScalarType, n: u32) -> Type {
    Type {
        elem: Elem::Ptr {
            pointee: s,
            space: AddrSpace::Global,
        },
        shape: vec![n],
    }
}

/// `out[i] = x[i] + y[i]` for `i = pid * n + arange(n)`, masked by `i < len` when
/// `masked` (else out of bounds on a ragged last block), with the load of `x` at
/// line 100 of this file.
fn vadd(n: u32, masked: bool) -> Function {
    let f32t = ScalarType::F32;
    let mut b = FunctionBuilder::new("vadd", at(1));
    let x = b.param("x", Type::global_ptr(f32t), ParamAttrs::default());
    let y = b.param("y", Type::global_ptr(f32t), ParamAttrs::default());
    let out = b.param("out", Type::global_ptr(f32t), ParamAttrs::default());
    let len = b.param("len", Type::scalar(ScalarType::I32), ParamAttrs::default());
    let pid = b
        .op1(OpKind::ProgramId { axis: 0 }, &[], None, at(2))
        .unwrap();
    let nn = b
        .op1(
            OpKind::Const(tessera_ir::ir::ConstValue::Int(n as i64)),
            &[],
            Some(&Type::scalar(ScalarType::I32)),
            at(3),
        )
        .unwrap();
    let base = b
        .op1(OpKind::Binary(BinaryOp::Mul), &[pid, nn], None, at(3))
        .unwrap();
    let ar = b
        .op1(
            OpKind::Arange {
                start: 0,
                end: n as i64,
            },
            &[],
            None,
            at(4),
        )
        .unwrap();
    let bs = b
        .op1(
            OpKind::Splat,
            &[base],
            Some(&Type::tile(ScalarType::I32, &[n])),
            at(4),
        )
        .unwrap();
    let offs = b
        .op1(OpKind::Binary(BinaryOp::Add), &[bs, ar], None, at(4))
        .unwrap();
    let ls = b
        .op1(
            OpKind::Splat,
            &[len],
            Some(&Type::tile(ScalarType::I32, &[n])),
            at(5),
        )
        .unwrap();
    let mask = b
        .op1(OpKind::Cmp(CmpPred::Lt), &[offs, ls], None, at(5))
        .unwrap();
    let ptrs = |b: &mut FunctionBuilder, p: ValueId| {
        let s = b
            .op1(OpKind::Splat, &[p], Some(&ptr_tile(f32t, n)), at(6))
            .unwrap();
        b.op1(OpKind::AddPtr, &[s, offs], None, at(6)).unwrap()
    };
    let (px, py, po) = (ptrs(&mut b, x), ptrs(&mut b, y), ptrs(&mut b, out));
    let load = |b: &mut FunctionBuilder, p: ValueId, line: u32| {
        if masked {
            b.op1(
                OpKind::Load {
                    has_mask: true,
                    has_other: false,
                },
                &[p, mask],
                None,
                at(line),
            )
        } else {
            b.op1(
                OpKind::Load {
                    has_mask: false,
                    has_other: false,
                },
                &[p],
                None,
                at(line),
            )
        }
        .unwrap()
    };
    let vx = load(&mut b, px, 100);
    let vy = load(&mut b, py, 101);
    let s = b
        .op1(OpKind::Binary(BinaryOp::Add), &[vx, vy], None, at(7))
        .unwrap();
    b.op(
        OpKind::Store { has_mask: true },
        &[po, s, mask],
        None,
        at(8),
    )
    .unwrap();
    let f = b.finish();
    tessera_ir::verify::verify(&f).expect("valid IR");
    f
}

fn buf(v: &[f32]) -> Arc<HostBuffer> {
    Arc::new(HostBuffer::from_slice(v))
}

#[test]
fn vector_add_matches_the_interpreter() {
    let len = 1000usize;
    let xs: Vec<f32> = (0..len).map(|i| i as f32 * 0.5 - 7.0).collect();
    let ys: Vec<f32> = (0..len).map(|i| (i * 7 % 13) as f32).collect();
    let f = vadd(256, true);
    let grid = [len.div_ceil(256) as u32, 1, 1];
    let want = buf(&vec![f32::NAN; len]);
    let args = |o: &Arc<HostBuffer>| {
        vec![
            KernelArg::Buffer(buf(&xs)),
            KernelArg::Buffer(buf(&ys)),
            KernelArg::Buffer(o.clone()),
            KernelArg::Scalar(Scalar::I32(len as i32)),
        ]
    };
    interp::run(&f, grid, &args(&want)).unwrap();
    let want = want.to_vec::<f32>().unwrap();
    for flavor in FLAVORS {
        let got = buf(&vec![f32::NAN; len]);
        emu::launch(&f, flavor, &CompileOptions::default(), grid, &args(&got))
            .unwrap_or_else(|e| panic!("{flavor:?}: {e}"));
        let got = got.to_vec::<f32>().unwrap();
        for i in 0..len {
            assert_eq!(
                got[i].to_bits(),
                want[i].to_bits(),
                "{flavor:?} element {i}"
            );
        }
    }
}

#[test]
fn out_of_bounds_names_the_line() {
    let len = 300usize;
    let f = vadd(256, false);
    for flavor in FLAVORS {
        let args = vec![
            KernelArg::Buffer(buf(&vec![1.0; len])),
            KernelArg::Buffer(buf(&vec![2.0; len])),
            KernelArg::Buffer(buf(&vec![0.0; len])),
            KernelArg::Scalar(Scalar::I32(len as i32)),
        ];
        let err = emu::launch(&f, flavor, &CompileOptions::default(), [2, 1, 1], &args)
            .expect_err("out of bounds");
        let msg = err.to_string();
        assert!(
            matches!(&err, EmuError::OutOfBounds { span, op: "load", block: [1, 0, 0], buffer, index, len: 300, .. }
                if span.line == 100 && buffer == "x" && *index >= 300),
            "{flavor:?}: {msg}"
        );
        assert!(msg.contains("codegen/tests/emu.rs:100:5"), "{msg}");
    }
}
