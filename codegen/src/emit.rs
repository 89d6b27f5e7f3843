//! LLVM IR to PTX text or an HSACO code object.
//!
//! [`emit_module`] does everything after the lowering (the compile driver,
//! `driver.rs`, lowers the kernel and hands its module here):
//!
//! 1. verify the module (a failure is a Tessera bug: [`CodegenError::Llvm`]);
//! 2. create the target machine (triple, CPU and features from [`Target`]) and set the
//!    module's triple and data layout;
//! 3. run LLVM's `default<O3>` pipeline (new pass manager) and keep the optimized IR;
//! 4. NVIDIA: emit assembly, which is the PTX (NVPTX cannot emit objects);
//!    AMD: emit an object, link it with `ld.lld -shared` into an HSACO code object, and
//!    emit the AMDGCN assembly as well (from a copy of the module, since code
//!    generation rewrites the module it runs on).

use std::path::{Path, PathBuf};
use std::process::Command;

use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::FileType;

pub use crate::machine::{target_machine, target_machine_with};
use crate::{CodegenError, Target, Vendor};

/// The output of [`emit_module`].
#[derive(Clone, Debug)]
pub struct Emitted {
    /// What a driver loads: PTX text (NVIDIA) or an HSACO code object (AMD).
    pub binary: Vec<u8>,
    /// The PTX, or the AMDGCN assembly.
    pub asm: String,
    /// The LLVM IR after the `default<O3>` pipeline.
    pub llvm_ir: String,
}

/// Verifies, optimizes and emits an LLVM module holding a kernel for `target`.
/// `kernel` names the kernel in error messages. The module is optimized in place.
pub fn emit_module(
    module: &Module<'_>,
    target: Target,
    kernel: &str,
) -> Result<Emitted, CodegenError> {
    emit_module_with(module, target, kernel, None)
}

/// [`emit_module`] with at least PTX ISA `min_ptx` (times 10) on NVIDIA targets.
pub(crate) fn emit_module_with(
    module: &Module<'_>,
    target: Target,
    kernel: &str,
    min_ptx: Option<u64>,
) -> Result<Emitted, CodegenError> {
    let llvm_err = |what: &str, message: String| CodegenError::Llvm {
        kernel: kernel.to_string(),
        target,
        message: format!("{what}: {message}"),
    };
    module
        .verify()
        .map_err(|m| llvm_err("invalid LLVM IR", m.to_string()))?;
    // A lowering that emitted instructions of a newer PTX ISA asked for it (the only
    // such today: `mma.sync` on 8-bit floats, 8.4).
    // Linking NVSHMEM's device library asks for its version too.
    let newer_ptx = module
        .get_flag(crate::lower::arch::PTX_ISA_FLAG)
        .map(|_| crate::lower::arch::PTX_ISA_FP8_MMA)
        .into_iter()
        .chain(min_ptx)
        .max();
    let features = match newer_ptx {
        Some(v) if !target.is_emu() && matches!(target.vendor(), Vendor::Nvidia) => {
            format!("+ptx{v}")
        }
        _ => target.features().to_string(),
    };
    let machine =
        target_machine_with(target, &features).map_err(|m| llvm_err("target machine", m))?;
    if let Target::Amdgpu(arch) = target
        && module.get_flag("amdhsa_code_object_version").is_none()
    {
        // The code object version (module flag `amdhsa_code_object_version`, the
        // version times 100), else LLVM's default (6 in LLVM 22).
        let v = module
            .get_context()
            .i32_type()
            .const_int(arch.code_object_version() as u64 * 100, false);
        module.add_basic_value_flag(
            "amdhsa_code_object_version",
            inkwell::module::FlagBehavior::Error,
            v,
        );
    }
    module.set_triple(&machine.get_triple());
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    // A linked device library (NVSHMEM's) brings thousands of functions the kernel
    // never calls: they are internal, and `globaldce` drops them before the
    // optimization pipeline would spend its time on them.
    let pipeline = if min_ptx.is_some() {
        "globaldce,default<O3>"
    } else {
        "default<O3>"
    };
    module
        .run_passes(pipeline, &machine, PassBuilderOptions::create())
        .map_err(|m| llvm_err("optimization pipeline", m.to_string()))?;
    let llvm_ir = module.print_to_string().to_string();
    let emit = |m: &Module<'_>, ty: FileType| {
        machine
            .write_to_memory_buffer(m, ty)
            .map(|b| b.as_slice().to_vec())
            .map_err(|e| llvm_err("code generation", e.to_string()))
    };
    if target.is_emu() {
        // The emulator's kernel as a host object (the emulator itself JIT-compiles).
        let asm = String::from_utf8(emit(&module.clone(), FileType::Assembly)?)
            .map_err(|_| llvm_err("code generation", "the assembly is not UTF-8".into()))?;
        let binary = emit(module, FileType::Object)?;
        return Ok(Emitted {
            binary,
            asm,
            llvm_ir,
        });
    }
    match target.vendor() {
        Vendor::Nvidia => {
            let ptx = emit(module, FileType::Assembly)?;
            let asm = String::from_utf8(ptx.clone())
                .map_err(|_| llvm_err("code generation", "the PTX is not UTF-8".into()))?;
            Ok(Emitted {
                binary: ptx,
                asm,
                llvm_ir,
            })
        }
        Vendor::Amd => {
            // Code generation runs IR-level lowering passes on the module it is given,
            // so each output is emitted from its own copy.
            let asm_module = module.clone();
            let asm = emit(&asm_module, FileType::Assembly)?;
            let asm = String::from_utf8(asm)
                .map_err(|_| llvm_err("code generation", "the assembly is not UTF-8".into()))?;
            let object = emit(module, FileType::Object)?;
            let binary = link_hsaco(&object)?;
            Ok(Emitted {
                binary,
                asm,
                llvm_ir,
            })
        }
    }
}

/// The `ld.lld` [`use_lld`] named, if any.
static LLD: std::sync::RwLock<Option<PathBuf>> = std::sync::RwLock::new(None);

/// Links HSACOs with `lld` from now on (`None`: look for one, see [`find_lld`]). The
/// runtime passes its `TESSERA_LLD` setting here.
pub fn use_lld(lld: Option<PathBuf>) {
    *LLD.write().unwrap_or_else(|e| e.into_inner()) = lld;
}

/// The `ld.lld` to link HSACOs with: the one given to [`use_lld`], else `ld.lld-22`,
/// `/usr/lib/llvm-22/bin/ld.lld` or `ld.lld` found on `PATH`.
pub fn find_lld() -> Result<PathBuf, CodegenError> {
    let chosen = LLD.read().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(p) = chosen {
        return if p.is_file() || p.components().count() == 1 {
            Ok(p)
        } else {
            Err(CodegenError::Tool {
                tool: "ld.lld".into(),
                message: format!("{} (TESSERA_LLD) does not exist", p.display()),
            })
        };
    }
    let fixed = Path::new("/usr/lib/llvm-22/bin/ld.lld");
    if let Some(p) = find_on_path("ld.lld-22") {
        return Ok(p);
    }
    if fixed.is_file() {
        return Ok(fixed.to_path_buf());
    }
    find_on_path("ld.lld").ok_or_else(|| CodegenError::Tool {
        tool: "ld.lld".into(),
        message: "not found (looked for ld.lld-22 on PATH, \
                  /usr/lib/llvm-22/bin/ld.lld and ld.lld on PATH); \
                  install it with `bash scripts/setup.sh`"
            .into(),
    })
}

/// The first executable file called `name` in a directory of `PATH`.
pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Links an AMDGPU object into an HSACO code object with `ld.lld -shared`.
pub fn link_hsaco(object: &[u8]) -> Result<Vec<u8>, CodegenError> {
    link_hsaco_with(&find_lld()?, object)
}

/// [`link_hsaco`] with a given `ld.lld`.
pub fn link_hsaco_with(lld: &Path, object: &[u8]) -> Result<Vec<u8>, CodegenError> {
    let dir = TempDir::new("lld")?;
    let obj = dir.path().join("kernel.o");
    let out = dir.path().join("kernel.hsaco");
    std::fs::write(&obj, object).map_err(|e| tool_io("ld.lld", &obj, e))?;
    let res = Command::new(lld)
        .arg("-shared")
        .arg(&obj)
        .arg("-o")
        .arg(&out)
        .output()
        .map_err(|e| CodegenError::Tool {
            tool: "ld.lld".into(),
            message: format!("cannot run {}: {e}", lld.display()),
        })?;
    if !res.status.success() {
        return Err(CodegenError::Tool {
            tool: "ld.lld".into(),
            message: format!(
                "{} exited with {}: {}",
                lld.display(),
                res.status,
                String::from_utf8_lossy(&res.stderr).trim()
            ),
        });
    }
    std::fs::read(&out).map_err(|e| tool_io("ld.lld", &out, e))
}

pub(crate) fn tool_io(tool: &str, path: &Path, e: std::io::Error) -> CodegenError {
    CodegenError::Tool {
        tool: tool.into(),
        message: format!("{}: {e}", path.display()),
    }
}

/// A private folder under the system's temporary folder (`tessera-<what>-` and a
/// random suffix), removed with its contents on drop.
pub(crate) struct TempDir(tempfile::TempDir);

impl TempDir {
    pub(crate) fn new(what: &str) -> Result<TempDir, CodegenError> {
        tempfile::Builder::new()
            .prefix(&format!("tessera-{what}-"))
            .tempdir()
            .map(TempDir)
            .map_err(|e| tool_io(what, &std::env::temp_dir(), e))
    }

    pub(crate) fn path(&self) -> &Path {
        self.0.path()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AmdArch;
    use inkwell::context::Context;
    use inkwell::memory_buffer::MemoryBuffer;

    /// A hand-written kernel (`out[tid] = x[tid] + 1`) in the target's dialect, built
    /// without the lowering.
    fn hand_kernel(target: Target) -> String {
        let (cc, tid, attrs) = match target.vendor() {
            Vendor::Nvidia => (
                "ptx_kernel",
                "call i32 @llvm.nvvm.read.ptx.sreg.tid.x()",
                "declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()",
            ),
            Vendor::Amd => (
                "amdgpu_kernel",
                "call i32 @llvm.amdgcn.workitem.id.x()",
                "declare i32 @llvm.amdgcn.workitem.id.x()",
            ),
        };
        format!(
            r#"
define {cc} void @hand(ptr addrspace(1) noalias readonly %x, ptr addrspace(1) noalias %out) {{
entry:
  %tid = {tid}
  %i = zext i32 %tid to i64
  %px = getelementptr inbounds float, ptr addrspace(1) %x, i64 %i
  %v = load float, ptr addrspace(1) %px, align 4
  %w = fadd float %v, 1.0
  %po = getelementptr inbounds float, ptr addrspace(1) %out, i64 %i
  store float %w, ptr addrspace(1) %po, align 4
  ret void
}}
{attrs}
"#
        )
    }

    fn emit_hand(target: Target) -> Emitted {
        let ctx = Context::create();
        let buf =
            MemoryBuffer::create_from_memory_range_copy(hand_kernel(target).as_bytes(), "hand");
        let module = ctx.create_module_from_ir(buf).expect("parses");
        emit_module(&module, target, "hand").expect("emits")
    }

    #[test]
    fn ptx_from_a_hand_built_module() {
        for sm in [80, 90] {
            let out = emit_hand(Target::nvptx(sm));
            assert!(out.asm.contains(&format!(".target sm_{sm}")), "{}", out.asm);
            assert!(out.asm.contains(".entry hand("), "{}", out.asm);
            assert!(out.asm.contains("add.rn.f32"), "{}", out.asm);
            assert_eq!(out.binary, out.asm.as_bytes());
            assert!(
                out.llvm_ir
                    .contains("target triple = \"nvptx64-nvidia-cuda\"")
            );
        }
    }

    #[test]
    fn hsaco_from_a_hand_built_module() {
        for arch in [AmdArch::Gfx90a, AmdArch::Gfx942, AmdArch::Gfx1100] {
            let out = emit_hand(Target::Amdgpu(arch));
            assert_eq!(&out.binary[..4], b"\x7fELF", "{arch:?}");
            assert!(out.asm.contains("hand:"), "{}", out.asm);
            assert!(out.asm.contains(".amdhsa_next_free_vgpr"), "{}", out.asm);
            assert!(out.asm.contains(arch.name()), "{}", out.asm);
            assert!(out.llvm_ir.contains("amdgcn-amd-amdhsa"));
        }
    }

    #[test]
    fn invalid_ir_is_an_llvm_error() {
        let ctx = Context::create();
        let module = ctx.create_module("bad");
        let f = module.add_function("bad", ctx.void_type().fn_type(&[], false), None);
        ctx.append_basic_block(f, "entry"); // no terminator
        let err = emit_module(&module, Target::nvptx(80), "bad").unwrap_err();
        assert!(
            matches!(&err, CodegenError::Llvm { message, .. } if message.contains("invalid LLVM IR")),
            "{err}"
        );
    }

    #[test]
    fn link_failures_are_tool_errors() {
        let err = link_hsaco_with(Path::new("/nonexistent/ld.lld"), b"x").unwrap_err();
        assert!(matches!(err, CodegenError::Tool { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/ld.lld"), "{err}");
        let lld = find_lld().expect("ld.lld is installed (bash scripts/setup.sh)");
        let err = link_hsaco_with(&lld, b"not an object").unwrap_err();
        assert!(
            matches!(&err, CodegenError::Tool { message, .. } if message.contains("exited with")),
            "{err}"
        );
    }
}
