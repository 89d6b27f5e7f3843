//! Compiled CPU kernels as relocatable objects: written with the facts a launch needs
//! (an [`Artifact`], what a disk cache keeps between processes) and linked into the
//! process by LLVM's ORC JIT (`LLJIT`, JITLink), so that a kernel compiled by an
//! earlier process runs without LLVM's optimizer or code generator.
//!
//! An artifact is little-endian: [`MAGIC`], the entry symbol, the scratch bytes, the
//! disjoint parameter pairs, the remote parameters, the failure sites, then the
//! object file. Reading one checks every length against what is left, so a damaged
//! artifact is an error, never a panic or an out-of-bounds read; its object is then
//! linked, and linking checks the object's structure. (The disk cache's own
//! checksum and trust model, the same as for GPU kernels, keep out foreign entries:
//! linking runs whatever code the object holds.)

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char};
use std::sync::{Mutex, OnceLock};

use inkwell::llvm_sys::error::{LLVMDisposeErrorMessage, LLVMErrorRef, LLVMGetErrorMessage};
use inkwell::llvm_sys::orc2::lljit::{
    LLVMOrcCreateLLJIT, LLVMOrcLLJITAddObjectFile, LLVMOrcLLJITGetGlobalPrefix,
    LLVMOrcLLJITGetMainJITDylib, LLVMOrcLLJITLookup, LLVMOrcLLJITMangleAndIntern, LLVMOrcLLJITRef,
};
use inkwell::llvm_sys::orc2::{
    LLVMJITEvaluatedSymbol, LLVMJITSymbolFlags, LLVMJITSymbolGenericFlags, LLVMOrcAbsoluteSymbols,
    LLVMOrcCSymbolMapPair, LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess,
    LLVMOrcDefinitionGeneratorRef, LLVMOrcDisposeMaterializationUnit, LLVMOrcJITDylibAddGenerator,
    LLVMOrcJITDylibDefine,
};
use tessera_ir::Span;
use tessera_ir::ir::CmpPred;

use crate::lower::host::{HostSite, SiteKind};

/// First bytes of an artifact (format version 1).
const MAGIC: &[u8; 8] = b"TSRCPUO1";

/// A compiled kernel's object file and launch facts.
#[derive(Debug)]
pub(super) struct Artifact {
    /// The kernel's entry symbol (unique to its IR and code identity, so that any
    /// number of artifacts link into one process).
    pub entry: String,
    pub scratch_bytes: u64,
    pub disjoint: Vec<(usize, usize)>,
    pub remote: Vec<usize>,
    pub sites: Vec<HostSite>,
    /// The relocatable object (ELF on Linux).
    pub object: Vec<u8>,
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_u64(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn pred_code(p: CmpPred) -> u8 {
    CmpPred::ALL.iter().position(|&q| q == p).unwrap_or(0) as u8
}

impl Artifact {
    /// The artifact's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.object.len() + 64 * self.sites.len() + 64);
        out.extend_from_slice(MAGIC);
        put_str(&mut out, &self.entry);
        put_u64(&mut out, self.scratch_bytes);
        put_u64(&mut out, self.disjoint.len() as u64);
        for &(a, b) in &self.disjoint {
            put_u64(&mut out, a as u64);
            put_u64(&mut out, b as u64);
        }
        put_u64(&mut out, self.remote.len() as u64);
        for &k in &self.remote {
            put_u64(&mut out, k as u64);
        }
        put_u64(&mut out, self.sites.len() as u64);
        for s in &self.sites {
            match &s.kind {
                SiteKind::Access { param, remote } => {
                    out.push(0);
                    put_u64(&mut out, param.map_or(u64::MAX, |k| k as u64));
                    out.push(*remote as u8);
                }
                SiteKind::Peer => out.push(1),
                SiteKind::Wait(p) => {
                    out.push(2);
                    out.push(p.map_or(u8::MAX, pred_code));
                }
                SiteKind::DivZero => out.push(3),
                SiteKind::Step => out.push(4),
                SiteKind::Loop => out.push(5),
            }
            put_str(&mut out, s.op);
            put_str(&mut out, &s.span.file);
            put_u32(&mut out, s.span.line);
            put_u32(&mut out, s.span.col);
            put_u64(&mut out, s.shape.len() as u64);
            for &d in &s.shape {
                put_u32(&mut out, d);
            }
        }
        put_u64(&mut out, self.object.len() as u64);
        out.extend_from_slice(&self.object);
        out
    }

    /// Reads an artifact written by [`Artifact::to_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Artifact, String> {
        let mut r = Reader { b: bytes };
        if r.take(MAGIC.len())? != MAGIC {
            return Err("not a compiled CPU kernel (bad magic)".into());
        }
        let entry = r.string()?;
        let scratch_bytes = r.u64()?;
        let n = r.count(16)?;
        let mut disjoint = Vec::with_capacity(n);
        for _ in 0..n {
            disjoint.push((r.index()?, r.index()?));
        }
        let n = r.count(8)?;
        let mut remote = Vec::with_capacity(n);
        for _ in 0..n {
            remote.push(r.index()?);
        }
        let n = r.count(1)?;
        let mut sites = Vec::with_capacity(n);
        for _ in 0..n {
            let kind = match r.u8()? {
                0 => {
                    let param = match r.u64()? {
                        u64::MAX => None,
                        k => Some(usize::try_from(k).map_err(|_| "bad parameter index")?),
                    };
                    let remote = r.u8()? != 0;
                    SiteKind::Access { param, remote }
                }
                1 => SiteKind::Peer,
                2 => SiteKind::Wait(match r.u8()? {
                    u8::MAX => None,
                    k => Some(
                        *CmpPred::ALL
                            .get(k as usize)
                            .ok_or("bad comparison in a wait site")?,
                    ),
                }),
                3 => SiteKind::DivZero,
                4 => SiteKind::Step,
                5 => SiteKind::Loop,
                k => return Err(format!("bad site kind {k}")),
            };
            let op = intern(&r.string()?);
            let file = r.string()?;
            let (line, col) = (r.u32()?, r.u32()?);
            let d = r.count(4)?;
            let mut shape = Vec::with_capacity(d);
            for _ in 0..d {
                shape.push(r.u32()?);
            }
            sites.push(HostSite {
                kind,
                op,
                span: Span {
                    file: file.into(),
                    line,
                    col,
                },
                shape,
            });
        }
        let n = r.count(1)?;
        let object = r.take(n)?.to_vec();
        if !r.b.is_empty() {
            return Err(format!("{} bytes past the object", r.b.len()));
        }
        Ok(Artifact {
            entry,
            scratch_bytes,
            disjoint,
            remote,
            sites,
            object,
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.b.len() {
            return Err(format!(
                "truncated: {n} bytes wanted, {} left",
                self.b.len()
            ));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn index(&mut self) -> Result<usize, String> {
        usize::try_from(self.u64()?).map_err(|_| "bad index".to_string())
    }
    /// A count of items of at least `each` bytes: no more than the bytes left allow
    /// (so a damaged count cannot ask for a huge allocation).
    fn count(&mut self, each: usize) -> Result<usize, String> {
        let n = self.u64()?;
        match usize::try_from(n) {
            Ok(n) if n.saturating_mul(each) <= self.b.len() => Ok(n),
            _ => Err(format!("bad count {n}")),
        }
    }
    fn string(&mut self) -> Result<String, String> {
        let n = self.count(1)?;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| "bad UTF-8".to_string())
    }
}

/// The op mnemonics of loaded sites, each leaked once (sites name their op by a
/// `&'static str`, as the interpreter's errors do; the set is the IR's op names).
fn intern(s: &str) -> &'static str {
    static NAMES: OnceLock<Mutex<Vec<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(n) = names.iter().find(|n| **n == s) {
        return n;
    }
    let n: &'static str = Box::leak(s.to_owned().into_boxed_str());
    names.push(n);
    n
}

/// The process's JIT for compiled CPU kernels, and the entries it has linked.
struct Jit {
    jit: LLVMOrcLLJITRef,
    linked: HashMap<String, usize>,
}

// SAFETY: LLJIT is thread-safe; the map is only reached under the mutex around it.
unsafe impl Send for Jit {}

fn take_error(err: LLVMErrorRef) -> Result<(), String> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: `err` is a live error, consumed by `LLVMGetErrorMessage`; the message
    // is copied before it is disposed.
    unsafe {
        let m = LLVMGetErrorMessage(err);
        let s = CStr::from_ptr(m).to_string_lossy().into_owned();
        LLVMDisposeErrorMessage(m);
        Err(s)
    }
}

impl Jit {
    /// An LLJIT for the host whose main library resolves the runtime functions the
    /// lowering calls (`symbols`) and the process's own (libm, libc).
    fn new(symbols: &[(&str, usize)]) -> Result<Jit, String> {
        let mut jit: LLVMOrcLLJITRef = std::ptr::null_mut();
        // SAFETY: a null builder asks for the defaults (the host's target); `jit` is
        // written on success.
        take_error(unsafe { LLVMOrcCreateLLJIT(&mut jit, std::ptr::null_mut()) })?;
        // SAFETY: `jit` is live; the names are interned by the JIT's pool (the pairs
        // hand their references to the materialization unit, which the dylib takes);
        // each address is the runtime function the lowering declares under that
        // name, alive for the whole process.
        unsafe {
            let main = LLVMOrcLLJITGetMainJITDylib(jit);
            let mut pairs = Vec::with_capacity(symbols.len());
            for &(name, addr) in symbols {
                let c = CString::new(name).map_err(|e| e.to_string())?;
                pairs.push(LLVMOrcCSymbolMapPair {
                    Name: LLVMOrcLLJITMangleAndIntern(jit, c.as_ptr()),
                    Sym: LLVMJITEvaluatedSymbol {
                        Address: addr as u64,
                        Flags: LLVMJITSymbolFlags {
                            GenericFlags:
                                LLVMJITSymbolGenericFlags::LLVMJITSymbolGenericFlagsExported as u8
                                    | LLVMJITSymbolGenericFlags::LLVMJITSymbolGenericFlagsCallable
                                        as u8,
                            TargetFlags: 0,
                        },
                    },
                });
            }
            let mu = LLVMOrcAbsoluteSymbols(pairs.as_mut_ptr(), pairs.len());
            let err = LLVMOrcJITDylibDefine(main, mu);
            if !err.is_null() {
                LLVMOrcDisposeMaterializationUnit(mu);
                take_error(err)?;
            }
            let mut generator: LLVMOrcDefinitionGeneratorRef = std::ptr::null_mut();
            take_error(LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
                &mut generator,
                LLVMOrcLLJITGetGlobalPrefix(jit),
                None,
                std::ptr::null_mut(),
            ))?;
            LLVMOrcJITDylibAddGenerator(main, generator);
        }
        Ok(Jit {
            jit,
            linked: HashMap::new(),
        })
    }

    /// Links `object` (once per entry) and returns the address of `entry`.
    fn link(&mut self, object: &[u8], entry: &str) -> Result<usize, String> {
        if let Some(&a) = self.linked.get(entry) {
            return Ok(a);
        }
        let name = CString::new(entry).map_err(|e| e.to_string())?;
        let mut addr = 0u64;
        // SAFETY: the buffer copies `object`; LLJIT takes it (and frees it when the
        // add fails). The lookup links the object and returns the entry's address.
        unsafe {
            let buf = inkwell::llvm_sys::core::LLVMCreateMemoryBufferWithMemoryRangeCopy(
                object.as_ptr().cast::<c_char>(),
                object.len(),
                name.as_ptr(),
            );
            take_error(LLVMOrcLLJITAddObjectFile(
                self.jit,
                LLVMOrcLLJITGetMainJITDylib(self.jit),
                buf,
            ))?;
            take_error(LLVMOrcLLJITLookup(self.jit, &mut addr, name.as_ptr()))?;
        }
        if addr == 0 {
            return Err(format!("the object defines no `{entry}`"));
        }
        self.linked.insert(entry.to_string(), addr as usize);
        Ok(addr as usize)
    }
}

/// The process's JIT, made on first use (`symbols`: the runtime functions compiled
/// code calls).
fn jit(
    symbols: impl FnOnce() -> Vec<(&'static str, usize)>,
) -> std::sync::MutexGuard<'static, Result<Jit, String>> {
    static JIT: OnceLock<Mutex<Result<Jit, String>>> = OnceLock::new();
    JIT.get_or_init(|| Mutex::new(Jit::new(&symbols())))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Makes the process's JIT now (see [`super::prepare`]).
pub(super) fn prepare(symbols: impl FnOnce() -> Vec<(&'static str, usize)>) {
    drop(jit(symbols));
}

/// Links `object` into the process (once per entry symbol; code is never freed) and
/// returns the address of `entry`.
pub(super) fn link(
    object: &[u8],
    entry: &str,
    symbols: impl FnOnce() -> Vec<(&'static str, usize)>,
) -> Result<usize, String> {
    match &mut *jit(symbols) {
        Ok(j) => j.link(object, entry),
        Err(e) => Err(format!("no JIT for the host: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Artifact {
        Artifact {
            entry: "tessera_cpu_0123".into(),
            scratch_bytes: 4096,
            disjoint: vec![(0, 2), (1, 2)],
            remote: vec![1],
            sites: vec![
                HostSite {
                    kind: SiteKind::Access {
                        param: Some(2),
                        remote: true,
                    },
                    op: "store",
                    span: Span::new("src/k.rs", 12, 5),
                    shape: vec![64, 16],
                },
                HostSite {
                    kind: SiteKind::Access {
                        param: None,
                        remote: false,
                    },
                    op: "load",
                    span: Span::new("src/k.rs", 3, 1),
                    shape: vec![],
                },
                HostSite {
                    kind: SiteKind::Wait(Some(CmpPred::Ge)),
                    op: "wait_until",
                    span: Span::new("a.rs", 1, 2),
                    shape: vec![1],
                },
                HostSite {
                    kind: SiteKind::Wait(None),
                    op: "barrier_all",
                    span: Span::new("a.rs", 9, 9),
                    shape: vec![1],
                },
            ]
            .into_iter()
            .chain(
                [
                    SiteKind::Peer,
                    SiteKind::DivZero,
                    SiteKind::Step,
                    SiteKind::Loop,
                ]
                .map(|kind| HostSite {
                    kind,
                    op: "for",
                    span: Span::new("b.rs", 7, 3),
                    shape: vec![8],
                }),
            )
            .collect(),
            object: (0..1000u32).map(|i| (i * 7) as u8).collect(),
        }
    }

    #[test]
    fn an_artifact_reads_back_as_written() {
        let a = sample();
        let b = Artifact::from_bytes(&a.to_bytes()).unwrap();
        assert_eq!(b.entry, a.entry);
        assert_eq!(b.scratch_bytes, a.scratch_bytes);
        assert_eq!(b.disjoint, a.disjoint);
        assert_eq!(b.remote, a.remote);
        assert_eq!(b.object, a.object);
        assert_eq!(format!("{:?}", b.sites), format!("{:?}", a.sites));
    }

    #[test]
    fn every_truncation_and_extension_of_an_artifact_is_an_error() {
        let bytes = sample().to_bytes();
        for n in 0..bytes.len() {
            assert!(Artifact::from_bytes(&bytes[..n]).is_err(), "cut at {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Artifact::from_bytes(&longer).is_err());
        // A count far past the bytes left is refused before anything is allocated.
        let mut huge = bytes;
        let at = MAGIC.len() + 8 + "tessera_cpu_0123".len() + 8;
        huge[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(
            Artifact::from_bytes(&huge)
                .unwrap_err()
                .contains("bad count")
        );
    }
}
