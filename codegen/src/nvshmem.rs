//! NVSHMEM's device library: finding its bitcode and linking it into a kernel.
//!
//! A communicating kernel compiled with [`crate::CommEngine::Nvshmem`] for an NVIDIA
//! target calls NVSHMEM's device functions for off-node peers
//! ([`crate::lower::engine`]). [`link`] links NVSHMEM's device bitcode
//! (`libnvshmem_device_sm_XX.bc`, shipped in NVSHMEM's `lib/` folder, and in the
//! `nvidia-nvshmem-cu12`/`-cu13` Python wheels under `nvidia/nvshmem/lib`) into the
//! kernel's module before it is optimized; the library's functions become internal,
//! so LLVM keeps only those the kernel calls. Its globals keep their names
//! (`nvshmemi_device_state_d` and the like): after loading the module, the host
//! initializes them with `nvshmemx_cumodule_init`.
//!
//! Where the library is: `$TESSERA_NVSHMEM_HOME` (an NVSHMEM installation: the folder
//! holding `lib/`, or `lib/` itself), else the usual install folders
//! ([`SEARCH_PATH`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::{Linkage, Module};
use inkwell::passes::PassBuilderOptions;

use crate::CodegenError;

/// The PTX ISA version (times 10) of a module with NVSHMEM linked in: its device
/// library's code uses instructions of PTX 8.6 (`fence.acquire`/`.release`,
/// `ld.mmio`), so such kernels need CUDA 12.8 drivers or later.
pub const PTX_ISA: u64 = 86;

/// The variable naming an NVSHMEM installation.
pub const HOME_VAR: &str = tessera_ir::comm::NVSHMEM_HOME_VAR;

/// Where NVSHMEM is looked for when [`HOME_VAR`] is not set: NVIDIA's Debian packages
/// (CUDA 12 and 13) and the usual prefixes.
pub const SEARCH_PATH: &[&str] = tessera_ir::comm::NVSHMEM_SEARCH_PATH;

/// The device library's file name for compute capability `sm`: NVSHMEM ships one
/// bitcode per family (sm_70, sm_80, sm_89, sm_90, sm_100).
pub fn bitcode_name(sm: u32) -> Result<String, CodegenError> {
    let family = match sm {
        100.. => 100,
        90..=99 => 90,
        89 => 89,
        80..=88 => 80,
        70..=79 => 70,
        _ => {
            return Err(CodegenError::Options(format!(
                "NVSHMEM's device library needs sm_70 or newer, not sm_{sm}"
            )));
        }
    };
    Ok(format!("libnvshmem_device_sm_{family}.bc"))
}

/// The folders searched for the device library, in order.
pub fn search_dirs() -> Vec<PathBuf> {
    tessera_ir::comm::nvshmem_dirs()
}

/// The path of the device bitcode for `sm`, or an error naming where it was looked
/// for and how to provide it.
pub fn device_bitcode(sm: u32) -> Result<PathBuf, CodegenError> {
    let name = bitcode_name(sm)?;
    let dirs = search_dirs();
    if let Some(p) = dirs.iter().map(|d| d.join(&name)).find(|p| p.is_file()) {
        return Ok(p);
    }
    let looked: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    Err(CodegenError::Tool {
        tool: "NVSHMEM".into(),
        message: format!(
            "{name} (NVSHMEM's device library) was not found in {}: set {HOME_VAR} to an NVSHMEM installation (for example the `nvidia/nvshmem` folder the pip package nvidia-nvshmem-cu12 installs in site-packages)",
            looked.join(", ")
        ),
    })
}

/// Links NVSHMEM's device library for `sm` into `module` (whose entry point is
/// `kernel`); the library's functions become internal.
pub fn link(module: &Module<'_>, sm: u32, kernel: &str) -> Result<(), CodegenError> {
    let path = device_bitcode(sm)?;
    link_file(module, &path, kernel)
}

type Pruned = Arc<Vec<u8>>;

/// The device library at each path, pruned to what the lowering may call
/// ([`crate::lower::engine::NVSHMEM_FUNCTIONS`] and what they call), as bitcode:
/// parsing and linking the whole library (50 MB, thousands of functions) for every
/// kernel would cost seconds each time.
fn pruned(path: &Path) -> Result<Pruned, CodegenError> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, Pruned>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = map.get(path) {
        return Ok(b.clone());
    }
    let err = |message: String| CodegenError::Tool {
        tool: "NVSHMEM".into(),
        message: format!("{}: {message}", path.display()),
    };
    let ctx = Context::create();
    let lib = Module::parse_bitcode_from_path(path, &ctx)
        .map_err(|e| err(format!("not readable as LLVM bitcode: {e}")))?;
    let wanted = crate::lower::engine::NVSHMEM_FUNCTIONS;
    for f in lib.get_functions() {
        let name = f.get_name().to_string_lossy();
        if f.count_basic_blocks() > 0 && !wanted.iter().any(|w| *w == name) {
            f.set_linkage(Linkage::Internal);
        }
    }
    let machine = crate::machine::target_machine_with(crate::Target::nvptx(90), "+ptx86")
        .map_err(|e| err(format!("no NVPTX target machine: {e}")))?;
    lib.run_passes("globaldce", &machine, PassBuilderOptions::create())
        .map_err(|e| err(format!("pruning failed: {e}")))?;
    let bytes: Pruned = Arc::new(lib.write_bitcode_to_memory().as_slice().to_vec());
    map.insert(path.to_path_buf(), bytes.clone());
    Ok(bytes)
}

/// [`link`] with an explicit bitcode file.
pub fn link_file(module: &Module<'_>, path: &Path, kernel: &str) -> Result<(), CodegenError> {
    let err = |message: String| CodegenError::Tool {
        tool: "NVSHMEM".into(),
        message: format!("{}: {message}", path.display()),
    };
    let bytes = pruned(path)?;
    let buf = MemoryBuffer::create_from_memory_range_copy(&bytes, "nvshmem_device");
    let lib = Module::parse_bitcode_from_buffer(&buf, module.get_context())
        .map_err(|e| err(format!("the pruned library does not parse: {e}")))?;
    // The library's own triple and layout are NVPTX's; ours win.
    lib.set_triple(&module.get_triple());
    if let Some(dl) = module
        .get_data_layout()
        .as_str()
        .to_str()
        .ok()
        .filter(|s| !s.is_empty())
    {
        lib.set_data_layout(&inkwell::targets::TargetData::create(dl).get_data_layout());
    }
    let ours: Vec<String> = module
        .get_functions()
        .filter(|f| f.count_basic_blocks() > 0)
        .map(|f| f.get_name().to_string_lossy().into_owned())
        .collect();
    module
        .link_in_module(lib)
        .map_err(|e| err(format!("linking failed: {e}")))?;
    for f in module.get_functions() {
        let name = f.get_name().to_string_lossy();
        if f.count_basic_blocks() > 0 && name != kernel && !ours.iter().any(|o| *o == name) {
            f.set_linkage(Linkage::Internal);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families() {
        assert_eq!(bitcode_name(90).expect("90"), "libnvshmem_device_sm_90.bc");
        assert_eq!(bitcode_name(86).expect("86"), "libnvshmem_device_sm_80.bc");
        assert_eq!(bitcode_name(89).expect("89"), "libnvshmem_device_sm_89.bc");
        assert_eq!(
            bitcode_name(120).expect("120"),
            "libnvshmem_device_sm_100.bc"
        );
        assert!(bitcode_name(60).is_err());
    }

    #[test]
    fn a_library_that_is_not_bitcode_is_a_clean_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let bad = dir.path().join("libnvshmem_device_sm_90.bc");
        std::fs::write(&bad, b"not bitcode").expect("write");
        let ctx = inkwell::context::Context::create();
        let m = ctx.create_module("k");
        match link_file(&m, &bad, "k") {
            Err(CodegenError::Tool { message, .. }) => {
                assert!(
                    message.contains("not readable as LLVM bitcode"),
                    "{message}"
                )
            }
            other => panic!("expected a tool error, got {other:?}"),
        }
        match link_file(&m, &dir.path().join("absent.bc"), "k") {
            Err(CodegenError::Tool { .. }) => {}
            other => panic!("expected a tool error, got {other:?}"),
        }
    }
}
