//! # tessera-ir
//!
//! The tile IR of Tessera and everything that works on it without a GPU or LLVM:
//!
//! - [`types`] and [`ir`]: scalar/pointer/tile types, SSA values, ops with structured
//!   control flow, every op carrying the user's [`ir::Span`];
//! - [`infer`]: the result-type rule of every op; [`builder`]: appends ops;
//! - [`verify`]: the verifier, whose errors name the op's span;
//! - [`printer`] and [`parser`]: the stable text form that snapshot tests hold;
//! - [`passes`]: canonicalization/constant folding, CSE and DCE; [`debug`]: device
//!   printing and assertions lowered to stores into a hidden buffer;
//! - [`interp`]: the reference interpreter (the semantics every backend must match),
//!   with a sanitizer for out-of-bounds accesses;
//! - [`dsl`]: the typed tracing front-end that `#[kernel]` code calls;
//! - [`fp8`]: the 8-bit float element types, [`fp8::F8E4M3`] and [`fp8::F8E5M2`].

#![warn(missing_docs)]

pub mod builder;
pub mod cluster;
pub mod comm;
pub mod debug;
pub mod dsl;
pub mod fp8;
pub mod infer;
pub mod interp;
pub mod ir;
pub mod mx;
pub mod parser;
pub mod passes;
pub mod printer;
pub mod tensor_desc;
pub mod types;
pub mod verify;

pub use builder::{BuildError, FunctionBuilder};
pub use ir::{Function, Op, OpKind, ParamFacts, Region, Span, ValueId};
pub use types::{AddrSpace, Elem, ScalarType, Type};
