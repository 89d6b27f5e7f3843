//! The SIMT emulator's host runtime: the same SIMT LLVM IR the GPU targets get runs
//! on the host, with the GPU's meaning for barriers, warp shuffles and matrix
//! instructions supplied here.
//!
//! - [`team`]: the threads of a block as OS threads; barriers and warp collectives
//!   that report divergence and timeouts instead of hanging;
//! - [`mma`]: the matrix instructions with the vendors' fragment layouts, written
//!   independently of the lowering so a wrong layout computes a wrong product.

pub mod mma;
pub mod team;
