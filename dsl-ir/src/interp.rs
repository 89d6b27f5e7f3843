//! Placeholder with the interpreter's public API (replaced by the real interpreter).
#![allow(missing_docs, dead_code, unused_variables)]
use crate::ir::Function;
use crate::types::ScalarType;
use std::sync::Arc;
pub struct HostBuffer {
    elem: ScalarType,
    len: usize,
}
impl HostBuffer {
    pub fn new(elem: ScalarType, len: usize) -> HostBuffer {
        HostBuffer { elem, len }
    }
    pub fn from_bytes(elem: ScalarType, b: &[u8]) -> HostBuffer {
        HostBuffer {
            elem,
            len: b.len() / elem.size_bytes(),
        }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn elem(&self) -> ScalarType {
        self.elem
    }
    pub fn size_bytes(&self) -> usize {
        self.len * self.elem.size_bytes()
    }
    pub fn read_bytes(&self) -> Vec<u8> {
        vec![0; self.size_bytes()]
    }
    pub fn write_bytes(&self, offset: usize, b: &[u8]) -> Result<(), InterpError> {
        Ok(())
    }
}
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    I1(bool),
    I8(i8),
    I16(i16),
    I32(i32),
    I64(i64),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
    F16(half::f16),
    BF16(half::bf16),
    F32(f32),
    F64(f64),
}
pub enum KernelArg {
    Buffer(Arc<HostBuffer>),
    Scalar(Scalar),
}
#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    #[error("x")]
    Unsupported,
}
pub fn run(f: &Function, grid: [u32; 3], args: &[KernelArg]) -> Result<(), InterpError> {
    Ok(())
}
