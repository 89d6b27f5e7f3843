//! Offline validators for compiled kernels, for tests and benchmarks: `ptxas` (register
//! and spill report, cubin), SASS disassembly, AMDGPU disassembly and resource usage,
//! and NVIDIA's Tile IR tools (`tileiras`, `tileirdisasm`). None of them needs a GPU.
//!
//! Tools are looked up on `PATH`, then in the workspace's `.tools/bin` (where
//! `bash scripts/setup.sh` puts `ptxas`, `nvdisasm` and `cuobjdump`), then in
//! `/usr/lib/llvm-22/bin`. A missing tool is a [`CodegenError::Tool`] that says how to
//! install it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::emit::{TempDir, find_on_path, tool_io};
use crate::{AmdArch, CodegenError};

/// The workspace's `.tools/bin`, as seen from this crate's sources.
fn workspace_tools() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin")
}

/// Finds the first of `names` (in order): on `PATH`, in `<workspace>/.tools/bin`, in
/// `/usr/lib/llvm-22/bin`.
pub fn find_tool(names: &[&str]) -> Result<PathBuf, CodegenError> {
    for name in names {
        if let Some(p) = find_on_path(name) {
            return Ok(p);
        }
        for dir in [workspace_tools(), PathBuf::from("/usr/lib/llvm-22/bin")] {
            let p = dir.join(name);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(CodegenError::Tool {
        tool: names.first().copied().unwrap_or("?").to_string(),
        message: format!(
            "not found (looked for {} on PATH, in {} and in /usr/lib/llvm-22/bin); \
             install the tools with `bash scripts/setup.sh`",
            names.join(", "),
            workspace_tools().display()
        ),
    })
}

/// Runs `tool` with `args`; its stdout and stderr on success, an error with its
/// stderr otherwise.
fn run(tool: &Path, args: &[&OsStr]) -> Result<(String, String), CodegenError> {
    let name = tool
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let out = Command::new(tool)
        .args(args)
        .output()
        .map_err(|e| CodegenError::Tool {
            tool: name.clone(),
            message: format!("cannot run {}: {e}", tool.display()),
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    if !out.status.success() {
        return Err(CodegenError::Tool {
            tool: name,
            message: format!("exited with {}: {}{}", out.status, stderr.trim(), {
                let s = stdout.trim();
                if s.is_empty() {
                    String::new()
                } else {
                    format!("\n{s}")
                }
            }),
        });
    }
    Ok((stdout, stderr))
}

/// What `ptxas -v` reports for a PTX module (summed or maximized over its entry
/// points), and the cubin it produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PtxasReport {
    /// Registers per thread (the largest over the entry points).
    pub registers: u32,
    /// Bytes of register spill stores (summed over the functions).
    pub spill_stores_bytes: u32,
    /// Bytes of register spill loads (summed over the functions).
    pub spill_loads_bytes: u32,
    /// Bytes of stack frame (summed over the functions).
    pub stack_frame_bytes: u32,
    /// Static shared memory in bytes (the largest over the entry points).
    pub shared_bytes: u32,
    /// The assembled cubin.
    pub cubin: Vec<u8>,
    /// The complete `-v` output.
    pub log: String,
}

/// Assembles `ptx` with `ptxas -v -arch=<arch>` (`arch` like `sm_90`). When the PTX's
/// `.target` is the architecture-specific variant of `arch` (`sm_90a` for `sm_90`),
/// that variant is used.
pub fn ptxas(ptx: &str, arch: &str) -> Result<PtxasReport, CodegenError> {
    let tool = find_tool(&["ptxas"])?;
    let arch = match ptx_target(ptx) {
        Some(t) if t.len() == arch.len() + 1 && t.starts_with(arch) && t.ends_with('a') => t,
        _ => arch,
    };
    let dir = TempDir::new("ptxas")?;
    let input = dir.path().join("kernel.ptx");
    let output = dir.path().join("kernel.cubin");
    std::fs::write(&input, ptx).map_err(|e| tool_io("ptxas", &input, e))?;
    let arch_flag = format!("-arch={arch}");
    let (stdout, stderr) = run(
        &tool,
        &[
            OsStr::new("-v"),
            OsStr::new(&arch_flag),
            OsStr::new("-o"),
            output.as_os_str(),
            input.as_os_str(),
        ],
    )?;
    let cubin = std::fs::read(&output).map_err(|e| tool_io("ptxas", &output, e))?;
    let mut report = parse_ptxas_log(&format!("{stderr}{stdout}"));
    report.cubin = cubin;
    Ok(report)
}

/// The `.target` of a PTX module (the first word after the directive).
fn ptx_target(ptx: &str) -> Option<&str> {
    ptx.lines()
        .find_map(|l| l.trim().strip_prefix(".target"))
        .and_then(|rest| rest.split([' ', '\t', ',']).find(|w| !w.is_empty()))
}

/// The number right before `unit` in `line` (`"14 registers"` → 14).
fn number_before(line: &str, unit: &str) -> Option<u32> {
    let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
    words
        .windows(2)
        .find(|w| w[1].starts_with(unit))
        .and_then(|w| w[0].parse().ok())
}

/// Parses `ptxas -v` output (everything but the cubin).
pub fn parse_ptxas_log(log: &str) -> PtxasReport {
    let mut r = PtxasReport {
        log: log.to_string(),
        ..PtxasReport::default()
    };
    for line in log.lines() {
        if line.contains("bytes stack frame") {
            let bytes = |what: &str| {
                line.split(',')
                    .find(|p| p.contains(what))
                    .and_then(|p| p.split_whitespace().next())
                    .and_then(|n| n.parse::<u32>().ok())
                    .unwrap_or(0)
            };
            r.stack_frame_bytes += bytes("stack frame");
            r.spill_stores_bytes += bytes("spill stores");
            r.spill_loads_bytes += bytes("spill loads");
        } else if line.contains("Used") {
            if let Some(n) = number_before(line, "registers") {
                r.registers = r.registers.max(n);
            }
            if let Some(n) = line
                .split(',')
                .find(|p| p.contains("bytes smem"))
                .and_then(|p| p.split_whitespace().next())
                .and_then(|n| n.parse().ok())
            {
                r.shared_bytes = r.shared_bytes.max(n);
            }
        }
    }
    r
}

/// The SASS of a cubin, from `cuobjdump -sass` (or `nvdisasm` when cuobjdump is
/// missing).
pub fn sass(cubin: &[u8]) -> Result<String, CodegenError> {
    let dir = TempDir::new("sass")?;
    let input = dir.path().join("kernel.cubin");
    std::fs::write(&input, cubin).map_err(|e| tool_io("cuobjdump", &input, e))?;
    match find_tool(&["cuobjdump"]) {
        Ok(tool) => run(&tool, &[OsStr::new("-sass"), input.as_os_str()]).map(|o| o.0),
        Err(missing) => {
            let Ok(tool) = find_tool(&["nvdisasm"]) else {
                return Err(missing);
            };
            run(&tool, &[input.as_os_str()]).map(|o| o.0)
        }
    }
}

/// `llvm-objdump` 22 (AMDGPU disassembly needs a recent one).
fn llvm_tool(name: &str) -> Result<PathBuf, CodegenError> {
    let suffixed = format!("{name}-22");
    let fixed = Path::new("/usr/lib/llvm-22/bin").join(name);
    if let Some(p) = find_on_path(&suffixed) {
        return Ok(p);
    }
    if fixed.is_file() {
        return Ok(fixed);
    }
    find_tool(&[name])
}

/// Disassembles an HSACO code object with `llvm-objdump -d --mcpu=<arch>`.
pub fn amdgpu_disasm(hsaco: &[u8], arch: AmdArch) -> Result<String, CodegenError> {
    let tool = llvm_tool("llvm-objdump")?;
    let dir = TempDir::new("objdump")?;
    let input = dir.path().join("kernel.hsaco");
    std::fs::write(&input, hsaco).map_err(|e| tool_io("llvm-objdump", &input, e))?;
    let mcpu = format!("--mcpu={}", arch.name());
    let (out, _) = run(
        &tool,
        &[OsStr::new("-d"), OsStr::new(&mcpu), input.as_os_str()],
    )?;
    Ok(out)
}

/// Resource usage of one AMDGPU kernel, from the code object's metadata note.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AmdgpuResources {
    /// The kernel's name.
    pub name: String,
    /// Vector registers per lane (`.vgpr_count`).
    pub vgprs: u32,
    /// Accumulation registers per lane on CDNA (`.agpr_count`).
    pub agprs: u32,
    /// Scalar registers (`.sgpr_count`).
    pub sgprs: u32,
    /// Static LDS bytes (`.group_segment_fixed_size`).
    pub lds_bytes: u32,
    /// Scratch bytes per lane (`.private_segment_fixed_size`).
    pub scratch_bytes: u32,
    /// Spilled VGPRs (`.vgpr_spill_count`).
    pub vgpr_spills: u32,
    /// Spilled SGPRs (`.sgpr_spill_count`).
    pub sgpr_spills: u32,
}

/// The resource usage of every kernel in an HSACO, read from its AMDGPU metadata note
/// with `llvm-readobj --notes`.
pub fn amdgpu_resources(hsaco: &[u8]) -> Result<Vec<AmdgpuResources>, CodegenError> {
    let tool = llvm_tool("llvm-readobj")?;
    let dir = TempDir::new("readobj")?;
    let input = dir.path().join("kernel.hsaco");
    std::fs::write(&input, hsaco).map_err(|e| tool_io("llvm-readobj", &input, e))?;
    let (out, _) = run(&tool, &[OsStr::new("--notes"), input.as_os_str()])?;
    let kernels = parse_amdgpu_notes(&out);
    if kernels.is_empty() {
        return Err(CodegenError::Tool {
            tool: "llvm-readobj".into(),
            message: "the code object has no AMDGPU kernel metadata".into(),
        });
    }
    Ok(kernels)
}

/// The code object version of an HSACO, read from its AMDGPU metadata note
/// (`amdhsa.version: [ 1, m ]` is version `3 + m`) with `llvm-readobj --notes`.
pub fn amdgpu_code_object_version(hsaco: &[u8]) -> Result<u32, CodegenError> {
    let tool = llvm_tool("llvm-readobj")?;
    let dir = TempDir::new("readobj")?;
    let input = dir.path().join("kernel.hsaco");
    std::fs::write(&input, hsaco).map_err(|e| tool_io("llvm-readobj", &input, e))?;
    let (out, _) = run(&tool, &[OsStr::new("--notes"), input.as_os_str()])?;
    parse_amdhsa_version(&out).ok_or_else(|| CodegenError::Tool {
        tool: "llvm-readobj".into(),
        message: "the code object has no amdhsa.version in its metadata note".into(),
    })
}

/// The code object version from `llvm-readobj --notes` output (`amdhsa.version:`
/// followed by `[ 1, m ]` on the same line or as two list items).
pub fn parse_amdhsa_version(notes: &str) -> Option<u32> {
    let at = notes.find("amdhsa.version:")?;
    let nums: Vec<u32> = notes[at + "amdhsa.version:".len()..]
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .take(2)
        .map(|s| s.parse().ok())
        .collect::<Option<_>>()?;
    match nums[..] {
        [1, minor] => Some(3 + minor),
        _ => None,
    }
}

/// Parses the `amdhsa.kernels` list of `llvm-readobj --notes` output.
pub fn parse_amdgpu_notes(notes: &str) -> Vec<AmdgpuResources> {
    let mut kernels = Vec::new();
    let mut in_kernels = false;
    for line in notes.lines() {
        if line.starts_with("amdhsa.kernels:") {
            in_kernels = true;
            continue;
        }
        if !in_kernels {
            continue;
        }
        if !line.starts_with(' ') && !line.is_empty() {
            // The next top-level key ends the list.
            in_kernels = false;
            continue;
        }
        // A new kernel is a list item at the first indentation level ("  - .key: v").
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let (item, entry) = match trimmed.strip_prefix("- ") {
            Some(rest) => (indent <= 2, rest),
            None => (false, trimmed),
        };
        if item {
            kernels.push(AmdgpuResources::default());
        }
        // Only the kernel's own keys (indent 4, or the item's line), not its args.
        if !(item || indent == 4) {
            continue;
        }
        let Some(k) = kernels.last_mut() else {
            continue;
        };
        let Some((key, value)) = entry.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let n = || value.parse::<u32>().unwrap_or(0);
        match key.trim() {
            ".name" => k.name = value.to_string(),
            ".vgpr_count" => k.vgprs = n(),
            ".agpr_count" => k.agprs = n(),
            ".sgpr_count" => k.sgprs = n(),
            ".group_segment_fixed_size" => k.lds_bytes = n(),
            ".private_segment_fixed_size" => k.scratch_bytes = n(),
            ".vgpr_spill_count" => k.vgpr_spills = n(),
            ".sgpr_spill_count" => k.sgpr_spills = n(),
            _ => {}
        }
    }
    kernels
}

/// The `tileiras` [`use_tileiras`] named, if any.
static TILEIRAS: std::sync::RwLock<Option<PathBuf>> = std::sync::RwLock::new(None);

/// Compiles Tile IR with `tileiras` from now on (`None`: look for one as for the other
/// tools, see [`find_tool`]). The runtime passes its `TESSERA_TILEIRAS` setting here.
pub fn use_tileiras(tileiras: Option<PathBuf>) {
    *TILEIRAS.write().unwrap_or_else(|e| e.into_inner()) = tileiras;
}

/// The `tileiras` to run: the one given to [`use_tileiras`], else the first found by
/// [`find_tool`].
pub fn find_tileiras() -> Result<PathBuf, CodegenError> {
    let chosen = TILEIRAS.read().unwrap_or_else(|e| e.into_inner()).clone();
    match chosen {
        Some(p) if p.is_file() => Ok(p),
        Some(p) => Err(CodegenError::Tool {
            tool: "tileiras".into(),
            message: format!("{} (TESSERA_TILEIRAS) does not exist", p.display()),
        }),
        None => find_tool(&["tileiras"]),
    }
}

/// The Tile IR bytecode versions `tileiras` reads (`tileiras --list-versions`: one
/// `major.minor` a line), oldest first.
pub fn tileiras_versions() -> Result<Vec<(u32, u32)>, CodegenError> {
    let tool = find_tileiras()?;
    let (out, _) = run(&tool, &[OsStr::new("--list-versions")])?;
    let versions = parse_versions(&out);
    if versions.is_empty() {
        return Err(CodegenError::Tool {
            tool: "tileiras".into(),
            message: format!(
                "{} --list-versions listed no bytecode version (a tileiras older than 13.2?): {}",
                tool.display(),
                out.trim()
            ),
        });
    }
    Ok(versions)
}

/// The `major.minor` lines of `text`, sorted (anything else is skipped).
pub fn parse_versions(text: &str) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> = text
        .lines()
        .filter_map(|l| {
            let (a, b) = l.trim().split_once('.')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Compiles Tile IR `bytecode` with `tileiras --gpu-name <gpu>` (`sm_80` .. `sm_121`)
/// into a cubin.
pub fn tileiras(bytecode: &[u8], gpu: &str) -> Result<Vec<u8>, CodegenError> {
    let tool = find_tileiras()?;
    let dir = TempDir::new("tileiras")?;
    let input = dir.path().join("kernel.tilebc");
    let output = dir.path().join("kernel.cubin");
    std::fs::write(&input, bytecode).map_err(|e| tool_io("tileiras", &input, e))?;
    run(
        &tool,
        &[
            OsStr::new("--gpu-name"),
            OsStr::new(gpu),
            OsStr::new("-o"),
            output.as_os_str(),
            input.as_os_str(),
        ],
    )?;
    std::fs::read(&output).map_err(|e| tool_io("tileiras", &output, e))
}

/// Tile IR `bytecode` read back as text by `tileirdisasm` (which verifies it).
pub fn tileirdisasm(bytecode: &[u8]) -> Result<String, CodegenError> {
    let tool = find_tool(&["tileirdisasm"])?;
    let dir = TempDir::new("tileirdisasm")?;
    let input = dir.path().join("kernel.tilebc");
    std::fs::write(&input, bytecode).map_err(|e| tool_io("tileirdisasm", &input, e))?;
    Ok(run(&tool, &[input.as_os_str()])?.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-written kernel with a shared-memory array and a barrier.
    const PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64

.shared .align 4 .b8 sh[1024];

.visible .entry hand(
	.param .u64 hand_param_0,
	.param .u64 hand_param_1
)
{
	.reg .b32 	%r<8>;
	.reg .b64 	%rd<8>;

	ld.param.u64 	%rd1, [hand_param_0];
	ld.param.u64 	%rd2, [hand_param_1];
	cvta.to.global.u64 	%rd1, %rd1;
	cvta.to.global.u64 	%rd2, %rd2;
	mov.u32 	%r1, %tid.x;
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd1, %rd3;
	ld.global.f32 	%r2, [%rd4];
	mov.u32 	%r3, sh;
	shl.b32 	%r4, %r1, 2;
	add.s32 	%r5, %r3, %r4;
	st.shared.f32 	[%r5], %r2;
	bar.sync 	0;
	ld.shared.f32 	%r6, [sh];
	add.s64 	%rd5, %rd2, %rd3;
	st.global.f32 	[%rd5], %r6;
	ret;
}
"#;

    #[test]
    fn ptxas_reports_a_hand_written_kernel() {
        for arch in ["sm_80", "sm_90"] {
            let r = ptxas(PTX, arch).expect("ptxas (bash scripts/setup.sh)");
            assert!(r.registers > 0 && r.registers < 32, "{}", r.log);
            assert_eq!(r.shared_bytes, 1024, "{}", r.log);
            assert_eq!((r.spill_stores_bytes, r.spill_loads_bytes), (0, 0));
            assert!(r.cubin.starts_with(b"\x7fELF"));
            let sass = sass(&r.cubin).expect("cuobjdump");
            assert!(sass.contains("Function : hand"), "{sass}");
            assert!(sass.contains("BAR.SYNC"), "{sass}");
        }
    }

    #[test]
    fn ptxas_errors_carry_its_message() {
        let err = ptxas(&PTX.replace("bar.sync", "bar.snyc"), "sm_80").unwrap_err();
        assert!(
            matches!(&err, CodegenError::Tool { tool, message } if tool == "ptxas" && message.contains("snyc")),
            "{err}"
        );
    }

    #[test]
    fn ptxas_log_parsing() {
        let log = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
            ptxas info    : Function properties for k\n\
            \x20   8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n\
            ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 384 bytes cmem[0]\n";
        let r = parse_ptxas_log(log);
        assert_eq!(
            (r.registers, r.shared_bytes, r.stack_frame_bytes),
            (40, 1024, 8)
        );
        assert_eq!((r.spill_stores_bytes, r.spill_loads_bytes), (8, 12));
        assert_eq!(ptx_target(".version 8.0\n.target sm_90a\n"), Some("sm_90a"));
    }

    #[test]
    fn amdgpu_tools_on_a_hand_built_kernel() {
        use inkwell::context::Context;
        use inkwell::memory_buffer::MemoryBuffer;
        let ir = r#"
@sh = internal addrspace(3) global [256 x float] poison, align 4
define amdgpu_kernel void @hand(ptr addrspace(1) noalias readonly %x, ptr addrspace(1) noalias %out) {
entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  %i = zext i32 %tid to i64
  %px = getelementptr inbounds float, ptr addrspace(1) %x, i64 %i
  %v = load float, ptr addrspace(1) %px, align 4
  %ps = getelementptr inbounds float, ptr addrspace(3) @sh, i64 %i
  store float %v, ptr addrspace(3) %ps
  call void @llvm.amdgcn.s.barrier()
  %w = load float, ptr addrspace(3) @sh
  %po = getelementptr inbounds float, ptr addrspace(1) %out, i64 %i
  store float %w, ptr addrspace(1) %po, align 4
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
declare void @llvm.amdgcn.s.barrier()
"#;
        for arch in [AmdArch::Gfx90a, AmdArch::Gfx942, AmdArch::Gfx1100] {
            let ctx = Context::create();
            let buf = MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), "hand");
            let module = ctx.create_module_from_ir(buf).expect("parses");
            let target = crate::Target::Amdgpu(arch);
            let out = crate::emit::emit_module(&module, target, "hand").expect("emits");
            let dis = amdgpu_disasm(&out.binary, arch).expect("llvm-objdump");
            assert!(dis.contains("<hand>:"), "{dis}");
            assert!(dis.contains("s_barrier"), "{dis}");
            assert!(dis.contains("s_endpgm"), "{dis}");
            let res = amdgpu_resources(&out.binary).expect("llvm-readobj");
            assert_eq!(res.len(), 1, "{res:?}");
            let r = &res[0];
            assert_eq!(r.name, "hand");
            assert_eq!(r.lds_bytes, 1024, "{r:?}");
            assert!(r.vgprs > 0 && r.sgprs > 0, "{r:?}");
            assert_eq!((r.vgpr_spills, r.sgpr_spills, r.scratch_bytes), (0, 0, 0));
        }
    }

    #[test]
    fn missing_tools_name_the_setup_script() {
        let err = find_tool(&["tessera-no-such-tool"]).unwrap_err();
        assert!(err.to_string().contains("bash scripts/setup.sh"), "{err}");
    }
}
