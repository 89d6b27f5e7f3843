//! Snapshots of the IR (after verification and optimization) of every example kernel,
//! as the examples launch them. Review a changed snapshot like a code change.

// Each example is included as a module; they share `examples/common`.
#![allow(clippy::duplicate_mod)]

#[path = "../../examples/layernorm.rs"]
#[allow(dead_code)]
mod layernorm;
#[path = "../../examples/matmul.rs"]
#[allow(dead_code)]
mod matmul;
#[path = "../../examples/ping_pong.rs"]
#[allow(dead_code)]
mod ping_pong;
#[path = "../../examples/softmax.rs"]
#[allow(dead_code)]
mod softmax;
#[path = "../../examples/vector_add.rs"]
#[allow(dead_code)]
mod vector_add;

use tessera::ir::printer::print_function;
use tessera::kernel_ir;
use tessera::prelude::*;

fn ir<K: Kernel<Comptime = ()>>() -> String {
    print_function(&kernel_ir::<K>(&()).expect("kernel builds"))
}

#[test]
fn vector_add_ir() {
    insta::assert_snapshot!(ir::<vector_add::vector_add<1024>>());
}

#[test]
fn ping_pong_ir() {
    insta::assert_snapshot!(ir::<ping_pong::ring_pass<1024>>());
}

#[test]
fn softmax_ir() {
    insta::assert_snapshot!("softmax_f32", ir::<softmax::softmax<f32, 4, 1024>>());
    insta::assert_snapshot!("softmax_f16", ir::<softmax::softmax<f16, 4, 1024>>());
}

#[test]
fn matmul_ir() {
    insta::assert_snapshot!("matmul_f32", ir::<matmul::matmul<f32, 64, 64, 32>>());
    insta::assert_snapshot!("matmul_f16", ir::<matmul::matmul<f16, 64, 64, 32>>());
}

#[test]
fn layernorm_ir() {
    insta::assert_snapshot!(ir::<layernorm::layernorm<f32, 256>>());
}

/// The printed IR parses back to the same text: the snapshots hold a stable form.
#[test]
fn example_ir_round_trips() {
    for text in [
        ir::<vector_add::vector_add<1024>>(),
        ir::<softmax::softmax<f16, 4, 1024>>(),
        ir::<matmul::matmul<f16, 64, 64, 32>>(),
        ir::<layernorm::layernorm<f32, 256>>(),
    ] {
        let parsed = tessera::ir::parser::parse_function(&text).expect("parses");
        tessera::ir::verify::verify(&parsed).expect("verifies");
        assert_eq!(print_function(&parsed), text);
    }
}
