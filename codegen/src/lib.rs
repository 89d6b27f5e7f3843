//! # tessera-codegen
//!
//! Lowering of tile IR to GPU targets (PTX, AMDGCN) and the host emulator. The
//! lowering lands with the GPU codegen work; this crate currently only names the
//! targets it will support.

/// A compilation target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// NVIDIA PTX for a compute capability (e.g. 80, 90).
    Nvptx { sm: u32 },
    /// AMD GCN/CDNA/RDNA code object for a gfx architecture name (e.g. "gfx942").
    Amdgpu { arch: &'static str },
}
