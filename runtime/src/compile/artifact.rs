//! Compiled kernels as the runtime stores and loads them, with or without LLVM.
//!
//! A [`KernelBinary`] is what a GPU driver needs to run one kernel: the PTX text or
//! HSACO code object plus the launch facts (entry symbol, threads per block, static
//! shared memory). It has a small versioned, checksummed binary form
//! ([`KernelBinary::to_bytes`]), used both as the payload of the on-disk JIT cache
//! ([`crate::disk_cache`]) and as the file format of precompiled (AOT) artifacts.
//!
//! Every compiled kernel is identified by a [`CacheKey`] over the kernel's optimized IR
//! text, the target (`sm_90`, `gfx942`, ...), [`COMPILER_VERSION`] and the
//! [`KernelOptions`]: see [`kernel_key`]. The IR comes from tracing the kernel, which
//! needs no LLVM, so a runtime built without the `jit` feature computes the same key
//! as the compiler that wrote the artifact and finds the file by name in an
//! [`ArtifactStore`]: `<dir>/<kernel>-<key hex>.tkb` (plus, for people,
//! `<kernel>-<key hex>.ptx` or `.hsaco` with the raw binary).

use std::fs;
use std::path::{Path, PathBuf};
use tessera_ir::Function;
use tessera_ir::ParamFacts;

use sha2::{Digest, Sha256};

use crate::Error;
use crate::disk_cache::{CacheKey, DiskCache};

/// The compiler version that goes into every key: the runtime and tessera-codegen
/// share the workspace version, so a runtime without LLVM knows it too.
pub const COMPILER_VERSION: &str = concat!("tessera-", env!("CARGO_PKG_VERSION"));

pub use crate::backend::{DYNAMIC_SHARED_PAST, KernelBinary};

/// First bytes of a serialized [`KernelBinary`] (format version 1).
const MAGIC: &[u8; 8] = b"TSRKBIN1";

/// Options that change the compiled code (the runtime's mirror of
/// `tessera::aot::CompileOptions`, available without LLVM).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelOptions {
    /// Warps (wavefronts) per program instance: a power of two from 1 to 16.
    pub num_warps: u32,
    /// Loop iterations whose `dot` operand tiles are in flight at once (1 to 8;
    /// `None`: the target's default, 3 on NVIDIA and 2 on AMD).
    pub num_stages: Option<u32>,
    /// Compiled for a world whose ranks span nodes: a communicating kernel reaches
    /// off-node peers through the vendor's engine (NVSHMEM on NVIDIA, rocSHMEM on
    /// AMD; `tessera::aot::CommEngine`). Launches on such a world set it.
    pub off_node: bool,
    /// The code generator; `None`: the device's choice ([`KernelBackend::for_device`]).
    pub backend: Option<KernelBackend>,
    /// Warp specialization of TMA-fed `dot` loops on sm_90a
    /// (`tessera::aot::CompileOptions::warp_specialize`); `None`: the compiler's
    /// choice.
    pub warp_specialize: Option<bool>,
    /// Thread-block clusters (`tessera::aot::CompileOptions::cluster`): `[1, 1, 1]`
    /// for none.
    pub cluster: [u32; 3],
    /// Consumer groups of a warp-specialized persistent kernel
    /// (`tessera::aot::CompileOptions::consumer_groups`; 2: ping-pong); `None`:
    /// the compiler's choice.
    pub consumer_groups: Option<u32>,
}

impl Default for KernelOptions {
    fn default() -> Self {
        KernelOptions {
            num_warps: 4,
            num_stages: None,
            off_node: false,
            backend: None,
            warp_specialize: None,
            cluster: [1, 1, 1],
            consumer_groups: None,
        }
    }
}

/// Which code generator compiles a kernel for an NVIDIA GPU.
///
/// - [`KernelBackend::Llvm`]: Tessera's own lowering through LLVM to PTX (or AMDGCN);
///   every GPU, every op, communication included.
/// - [`KernelBackend::TileIr`]: NVIDIA's Tile IR, compiled by `tileiras` into a cubin
///   (`tessera::codegen::tileir`): CUDA GPUs of compute capability 8.0 to 12.1, the
///   only path to Blackwell's tensor memory and `tcgen05` instructions. Communicating
///   kernels run there on one-node worlds (a world across nodes stays on LLVM, for
///   NVSHMEM); a kernel with one of the few ops Tile IR lacks is not compiled there
///   (a launch that asks for it fails with the op and its place in the source).
///
/// A launch picks one with [`crate::LaunchOptions::backend`], else with
/// `TESSERA_KERNEL_BACKEND` (`llvm` or `tileir`), else the device chooses
/// ([`KernelBackend::for_device`]). Both are an autotuning dimension: time a kernel
/// under each of [`KernelBackend::available`] and keep the faster
/// ([`crate::autotune`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelBackend {
    /// Tessera's LLVM lowering (PTX for NVIDIA, AMDGCN for AMD).
    Llvm,
    /// NVIDIA's Tile IR and `tileiras` (CUDA GPUs only).
    TileIr,
}

impl std::fmt::Display for KernelBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KernelBackend::Llvm => "llvm",
            KernelBackend::TileIr => "tileir",
        })
    }
}

impl std::str::FromStr for KernelBackend {
    type Err = String;
    fn from_str(s: &str) -> Result<KernelBackend, String> {
        match s {
            "llvm" => Ok(KernelBackend::Llvm),
            "tileir" => Ok(KernelBackend::TileIr),
            _ => Err(format!(
                "`{s}` is not a kernel backend (expected llvm or tileir)"
            )),
        }
    }
}

impl KernelBackend {
    /// What a launch on `device` uses when nothing asks: Tile IR on CUDA GPUs of
    /// compute capability 10.0 and later (Blackwell: the LLVM lowering has no
    /// `tcgen05` path), falling back to LLVM for a kernel Tile IR cannot express;
    /// LLVM everywhere else.
    pub fn for_device(device: &crate::Device) -> KernelBackend {
        match device.properties().compute_capability {
            Some((major, _)) if major >= 10 && device.kind() == crate::DeviceKind::Cuda => {
                KernelBackend::TileIr
            }
            _ => KernelBackend::Llvm,
        }
    }

    /// The backends a launch on `device` can take: both on a CUDA GPU that `tileiras`
    /// compiles for (with a CUDA 13.0 driver or newer), else LLVM alone. What an
    /// autotuner crosses its configurations with.
    pub fn available(device: &crate::Device) -> Vec<KernelBackend> {
        let mut v = vec![KernelBackend::Llvm];
        if tile_ir_target(device).is_ok() {
            v.push(KernelBackend::TileIr);
        }
        v
    }
}

/// The oldest CUDA driver that loads `tileiras` 13.x cubins: CUDA 13.0 (r580)
/// (`tessera_codegen::tileir::MIN_DRIVER`, repeated here for builds without LLVM).
pub const TILE_IR_MIN_DRIVER: (u32, u32) = (13, 0);

/// The Tile IR target of `device` (`tileir-sm_90`, `tileir-sm_100`, ...): the target
/// name of its kernels' keys and binaries; an error saying why when it has none (not a
/// CUDA GPU, a compute capability `tileiras` does not know, a driver older than
/// [`TILE_IR_MIN_DRIVER`]).
pub fn tile_ir_target(device: &crate::Device) -> Result<String, String> {
    const GPUS: [&str; 12] = [
        "sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100", "sm_103", "sm_107",
        "sm_110", "sm_120", "sm_121",
    ];
    let props = device.properties();
    let (Some((major, minor)), true) = (
        props.compute_capability,
        device.kind() == crate::DeviceKind::Cuda,
    ) else {
        return Err(format!(
            "Tile IR kernels run on CUDA GPUs; {device} is not one"
        ));
    };
    let gpu = format!("sm_{major}{minor}");
    if !GPUS.contains(&gpu.as_str()) {
        return Err(format!(
            "tileiras does not compile for compute capability {major}.{minor} ({})",
            props.name
        ));
    }
    match props.driver_version {
        Some(v) if v < TILE_IR_MIN_DRIVER => Err(format!(
            "the CUDA driver is {}.{}; Tile IR cubins need {}.{} (r580) or newer",
            v.0, v.1, TILE_IR_MIN_DRIVER.0, TILE_IR_MIN_DRIVER.1
        )),
        _ => Ok(format!("tileir-{gpu}")),
    }
}

impl KernelOptions {
    /// The stable text that goes into the key.
    pub fn describe(&self) -> String {
        // Tile IR: `tileiras` chooses the warps and the pipeline itself.
        if self.backend == Some(KernelBackend::TileIr) {
            return "backend=tileir".into();
        }
        let mut d = match self.num_stages {
            Some(s) => format!("num_warps={},num_stages={s}", self.num_warps),
            None => format!("num_warps={},num_stages=default", self.num_warps),
        };
        // (Appended only when set: the keys of one-node kernels stay what they were.)
        if self.off_node {
            d.push_str(",off_node");
        }
        if let Some(w) = self.warp_specialize {
            d.push_str(if w {
                ",warp_specialize"
            } else {
                ",no_warp_specialize"
            });
        }
        if self.cluster != [1, 1, 1] {
            let [x, y, z] = self.cluster;
            d.push_str(&format!(",cluster={x}x{y}x{z}"));
        }
        if let Some(g) = self.consumer_groups {
            d.push_str(&format!(",groups={g}"));
        }
        d
    }
}

/// Which parameters a precompiled kernel may assume divisible by 16 (16-byte aligned
/// pointers, integers that are multiples of 16), as the runtime specializes GPU
/// launches (see [`tessera_ir::passes::specialize`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Specialization {
    /// Assume nothing: correct for every launch (but not what a launch looks up).
    None,
    /// Every pointer and integer parameter: what a launch with aligned buffers and
    /// sizes that are multiples of 16 uses (the common case, and what Triton's
    /// launcher assumes in that case).
    AllDivisible,
    /// One flag per parameter, in order.
    Divisible(Vec<bool>),
    /// As `Divisible`, and every tensor descriptor's tensor map built: what an sm_90a
    /// launch looks up when the driver encoded the maps (TMA loads).
    TensorMaps(Vec<bool>),
}

impl Specialization {
    /// Applies it to IR. A flagged pointer is also taken to address a buffer smaller
    /// than 2 GiB ([`tessera_ir::ir::ParamAttrs::within_2gib`]), as runtime launches
    /// with such buffers specialize: a launch with a larger buffer asks for the
    /// specialization without that fact.
    pub fn apply(&self, func: &Function) -> Function {
        let facts = |flags: &[bool], maps: bool| -> Vec<ParamFacts> {
            flags
                .iter()
                .zip(&func.params)
                .map(|(&f, p)| {
                    let mut pf = ParamFacts::new(f, f && func.ty(p.value).elem.is_ptr());
                    pf.tensor_map = maps && is_tensor_map(func, p);
                    pf
                })
                .collect()
        };
        match self {
            Specialization::None => func.clone(),
            Specialization::AllDivisible => {
                tessera_ir::passes::specialize(func, &facts(&vec![true; func.params.len()], false))
            }
            Specialization::Divisible(flags) => {
                tessera_ir::passes::specialize(func, &facts(flags, false))
            }
            Specialization::TensorMaps(flags) => {
                tessera_ir::passes::specialize(func, &facts(flags, true))
            }
        }
    }

    /// Every specialization a launch of `func` can ask for: buffers are always
    /// 16-byte aligned (runtime allocations are), and each integer parameter is or is
    /// not a multiple of 16 (a tensor-map address always is: 0, or a 64-byte aligned
    /// map). With more than four integer parameters only "none" and "all" of them are
    /// listed. A kernel with tensor descriptors also gets each of them with its tensor
    /// maps built.
    pub fn for_launches(func: &Function) -> Vec<Specialization> {
        let plain = Self::for_launches_without_maps(func);
        if !func.params.iter().any(|p| is_tensor_map(func, p)) {
            return plain;
        }
        let mut all = plain.clone();
        all.extend(plain.into_iter().filter_map(|s| match s {
            Specialization::Divisible(f) => Some(Specialization::TensorMaps(f)),
            _ => None,
        }));
        all
    }

    fn for_launches_without_maps(func: &Function) -> Vec<Specialization> {
        let ints: Vec<usize> = func
            .params
            .iter()
            .enumerate()
            .filter(|(_, p)| func.ty(p.value).scalar_type().is_some_and(|s| s.is_int()))
            .filter(|(_, p)| !is_tensor_map(func, p))
            .map(|(i, _)| i)
            .collect();
        let masks: Vec<u32> = if ints.len() <= 4 {
            (0..1u32 << ints.len()).collect()
        } else {
            vec![0, (1u32 << ints.len().min(31)) - 1]
        };
        masks
            .into_iter()
            .map(|m| {
                let mut flags: Vec<bool> = func
                    .params
                    .iter()
                    .map(|p| func.ty(p.value).elem.is_ptr() || is_tensor_map(func, p))
                    .collect();
                for (bit, &i) in ints.iter().enumerate() {
                    flags[i] = m & (1 << bit) != 0;
                }
                Specialization::Divisible(flags)
            })
            .collect()
    }
}

/// Whether `p` is a tensor descriptor's tensor-map address (`<name>_tmap: u64`,
/// `tessera_ir::dsl::KernelParams::tensor_desc`).
fn is_tensor_map(func: &Function, p: &tessera_ir::ir::Param) -> bool {
    p.name.ends_with("_tmap")
        && *func.ty(p.value) == tessera_ir::Type::scalar(tessera_ir::ScalarType::U64)
}

/// The key of kernel IR `ir_text` compiled for `target` with `opts`.
pub fn kernel_key(ir_text: &str, target: &str, opts: &KernelOptions) -> CacheKey {
    CacheKey::new(ir_text, target, COMPILER_VERSION, &opts.describe())
}

/// The key of kernel `K` with comptime arguments `ct` for `target` (`sm_90`,
/// `gfx942`) and `opts`: what [`ArtifactStore::get`] and the runtime look it up by.
/// Traces the kernel (no LLVM needed).
pub fn kernel_key_of<K: crate::Kernel>(
    ct: &K::Comptime,
    target: &str,
    opts: &KernelOptions,
) -> Result<CacheKey, Error> {
    let func = crate::kernel_ir::<K>(ct)?;
    Ok(kernel_key(
        &tessera_ir::printer::print_function(&func),
        target,
        opts,
    ))
}

/// Why bytes are not a valid [`KernelBinary`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid kernel binary: {0}")]
pub struct FormatError(pub String);

impl KernelBinary {
    /// The raw file extension of its binary: `cubin` for Tile IR targets
    /// (`tileir-sm_100`), `ptx` for the other NVIDIA targets, else `hsaco`.
    pub fn extension(&self) -> &'static str {
        extension(&self.target)
    }

    /// The serialized form: `MAGIC`, then name and target (u32 length + UTF-8),
    /// `num_threads` and `shared_bytes` (u32), the binary (u64 length + bytes), all
    /// little-endian, then the SHA-256 of everything before it.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.name.len() + self.binary.len());
        out.extend_from_slice(MAGIC);
        for s in [&self.name, &self.target] {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        }
        out.extend_from_slice(&self.num_threads.to_le_bytes());
        out.extend_from_slice(&self.shared_bytes.to_le_bytes());
        out.extend_from_slice(&(self.binary.len() as u64).to_le_bytes());
        out.extend_from_slice(&self.binary);
        let sum = Sha256::digest(&out);
        out.extend_from_slice(&sum);
        out
    }

    /// Parses [`KernelBinary::to_bytes`]'s output; any truncation, extension or
    /// damaged byte is an error.
    pub fn from_bytes(bytes: &[u8]) -> Result<KernelBinary, FormatError> {
        let bad = |m: &str| FormatError(m.to_string());
        if bytes.len() < MAGIC.len() + 32 {
            return Err(bad("too short"));
        }
        if &bytes[..8] != MAGIC {
            return Err(bad("wrong magic or format version"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 32);
        if Sha256::digest(body).as_slice() != sum {
            return Err(bad("checksum mismatch (truncated or damaged)"));
        }
        let mut r = Reader { b: body, at: 8 };
        let name = r.string()?;
        let target = r.string()?;
        let num_threads = r.u32()?;
        let shared_bytes = r.u32()?;
        let len = usize::try_from(r.u64()?).map_err(|_| bad("binary too large"))?;
        let binary = r.take(len)?.to_vec();
        if r.at != body.len() {
            return Err(bad("trailing bytes"));
        }
        Ok(KernelBinary {
            name,
            target,
            num_threads,
            shared_bytes,
            binary,
        })
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| FormatError("truncated".into()))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, FormatError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, FormatError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn string(&mut self) -> Result<String, FormatError> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| FormatError("bad UTF-8".into()))
    }
}

fn extension(target: &str) -> &'static str {
    if target.starts_with("tileir-") {
        "cubin"
    } else if target.starts_with("sm_") {
        "ptx"
    } else {
        "hsaco"
    }
}

/// A folder of precompiled kernels, written by `tessera::aot::precompile` (or the
/// `aot` example) and read by the runtime, with or without LLVM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactStore {
    dir: PathBuf,
}

impl ArtifactStore {
    /// The store in `dir` (created on the first write).
    pub fn new(dir: impl Into<PathBuf>) -> ArtifactStore {
        ArtifactStore { dir: dir.into() }
    }

    /// The store named by `TESSERA_AOT_DIR` ([`crate::config`]), if set.
    pub fn from_env() -> Result<Option<ArtifactStore>, Error> {
        Ok(crate::config::get()?
            .aot_dir
            .clone()
            .map(ArtifactStore::new))
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file holding kernel `kernel` with key `key`.
    pub fn path(&self, kernel: &str, key: &CacheKey) -> PathBuf {
        self.dir.join(format!("{kernel}-{}.tkb", key.hex()))
    }

    /// Writes `bin` under `key` (atomically), plus the raw `.ptx`/`.hsaco` for
    /// inspection. `kernel` is the kernel's name (the IR function's name). Returns the
    /// `.tkb` file's path.
    pub fn put(&self, kernel: &str, key: &CacheKey, bin: &KernelBinary) -> Result<PathBuf, Error> {
        let path = self.path(kernel, key);
        let io = |p: &Path| {
            let p = p.display().to_string();
            move |e: std::io::Error| Error::Artifact {
                path: p,
                reason: e.to_string(),
            }
        };
        crate::secure_fs::create_private_dir(&self.dir)
            .and_then(|()| crate::secure_fs::check_dir(&self.dir))
            .map_err(io(&self.dir))?;
        crate::secure_fs::atomic_write(&path, &bin.to_bytes()).map_err(io(&path))?;
        let raw = path.with_extension(bin.extension());
        crate::secure_fs::atomic_write(&raw, &bin.binary).map_err(io(&raw))?;
        Ok(path)
    }

    /// The artifact of kernel `kernel` (with IR key `key`) for `target`. A missing
    /// file is [`Error::MissingArtifact`], naming the kernel, the target and the
    /// folder; a damaged one, or one for another target, is [`Error::Artifact`].
    pub fn get(&self, kernel: &str, target: &str, key: &CacheKey) -> Result<KernelBinary, Error> {
        let path = self.path(kernel, key);
        let read = crate::secure_fs::check_dir(&self.dir)
            .and_then(|()| crate::secure_fs::read_entry(&path));
        let bytes = match read {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let others = self.others(kernel);
                return Err(Error::MissingArtifact {
                    kernel: kernel.to_string(),
                    target: target.to_string(),
                    dir: self.dir.display().to_string(),
                    file: path
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    hint: if others == 0 {
                        "no artifact of this kernel is there".into()
                    } else {
                        format!(
                            "{others} artifact(s) of this kernel are there, for other targets, \
                             comptime arguments, options or Tessera versions"
                        )
                    },
                });
            }
            Err(e) => {
                return Err(Error::Artifact {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                });
            }
        };
        let bin = KernelBinary::from_bytes(&bytes).map_err(|e| Error::Artifact {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        if bin.target != target {
            return Err(Error::Artifact {
                path: path.display().to_string(),
                reason: format!("compiled for {}, expected {target}", bin.target),
            });
        }
        Ok(bin)
    }

    /// The artifact of kernel `K` with comptime arguments `ct`, specialized as `spec`,
    /// for `target` and `opts` (traces the kernel to compute its key; no LLVM needed).
    pub fn find<K: crate::Kernel>(
        &self,
        ct: &K::Comptime,
        spec: &Specialization,
        target: &str,
        opts: &KernelOptions,
    ) -> Result<KernelBinary, Error> {
        let func = spec.apply(crate::kernel_ir::<K>(ct)?.as_ref());
        let key = kernel_key(&tessera_ir::printer::print_function(&func), target, opts);
        self.get(&func.name, target, &key)
    }

    fn others(&self, kernel: &str) -> usize {
        let prefix = format!("{kernel}-");
        fs::read_dir(&self.dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter(|e| {
                        let n = e.file_name().to_string_lossy().into_owned();
                        n.starts_with(&prefix) && n.ends_with(".tkb")
                    })
                    .count()
            })
            .unwrap_or(0)
    }
}

/// Where [`cached_or_compile`] found a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A valid entry of the disk cache.
    DiskCache,
    /// Compiled now (and stored in the cache when there is one).
    Compiled,
}

/// The kernel binary under `key` in `cache`, else `compile()`'s, which is then stored.
/// An entry that passes the cache's own checksum but is not a valid [`KernelBinary`]
/// (written by a damaged or foreign writer) is removed and recompiled. A failure to
/// write the cache is not an error (the kernel still runs).
pub fn cached_or_compile(
    cache: Option<&DiskCache>,
    key: &CacheKey,
    compile: impl FnOnce() -> Result<KernelBinary, Error>,
) -> Result<(KernelBinary, Origin), Error> {
    if let Some(c) = cache
        && let Some(payload) = c.get(key)
    {
        match KernelBinary::from_bytes(&payload) {
            Ok(bin) => return Ok((bin, Origin::DiskCache)),
            Err(e) => {
                log::warn!("discarding kernel cache entry {}: {e}", key.hex());
                c.remove(key);
            }
        }
    }
    let bin = compile()?;
    if let Some(c) = cache
        && let Err(e) = c.put(key, &bin.to_bytes())
    {
        log::warn!("{e}");
    }
    Ok((bin, Origin::Compiled))
}

impl crate::Device {
    /// Where precompiled kernels are looked for: the folder given to
    /// [`crate::Device::with_artifacts`], else `TESSERA_AOT_DIR`.
    pub fn artifact_store(&self) -> Result<Option<ArtifactStore>, Error> {
        match &self.artifacts {
            Some(d) => Ok(Some(ArtifactStore::new(d.as_ref().clone()))),
            None => ArtifactStore::from_env(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> KernelBinary {
        KernelBinary {
            name: "vector_add".into(),
            target: "sm_90".into(),
            num_threads: 128,
            shared_bytes: 4096,
            binary: b".version 8.0\n.target sm_90\n".to_vec(),
        }
    }

    use crate::test_util::temp_dir;

    #[test]
    fn round_trip_and_every_truncation_fails() {
        let b = sample();
        let bytes = b.to_bytes();
        assert_eq!(KernelBinary::from_bytes(&bytes), Ok(b));
        for n in 0..bytes.len() {
            assert!(KernelBinary::from_bytes(&bytes[..n]).is_err(), "len {n}");
        }
        let mut flipped = bytes.clone();
        flipped[20] ^= 1;
        assert!(KernelBinary::from_bytes(&flipped).is_err());
    }

    #[test]
    fn store_finds_validates_and_reports_missing() {
        let (_tmp, dir) = temp_dir("store");
        let store = ArtifactStore::new(&dir);
        let opts = KernelOptions::default();
        let key = kernel_key("func @vector_add ...", "sm_90", &opts);
        let err = store
            .get("vector_add", "sm_90", &key)
            .unwrap_err()
            .to_string();
        assert!(err.contains("vector_add") && err.contains("sm_90"), "{err}");
        assert!(err.contains(&dir.display().to_string()), "{err}");
        let path = store.put("vector_add", &key, &sample()).unwrap();
        assert!(path.with_extension("ptx").exists());
        assert_eq!(store.get("vector_add", "sm_90", &key).unwrap(), sample());
        // Another key (other comptime args): missing, with a hint about the other one.
        let key2 = kernel_key("func @vector_add other", "sm_90", &opts);
        let err = store
            .get("vector_add", "sm_90", &key2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("1 artifact(s) of this kernel"), "{err}");
        // A truncated file is an error naming it, not a crash.
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let err = store
            .get("vector_add", "sm_90", &key)
            .unwrap_err()
            .to_string();
        assert!(err.contains("checksum") && err.contains(".tkb"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn corrupt_cached_artifact_is_discarded_and_recompiled() {
        let (_tmp, dir) = temp_dir("cache");
        let cache = DiskCache::new(&dir);
        let key = kernel_key("func @k", "gfx942", &KernelOptions::default());
        let good = KernelBinary {
            target: "gfx942".into(),
            ..sample()
        };
        let mut compiles = 0;
        let mut compile = || {
            compiles += 1;
            Ok(good.clone())
        };
        let (b, o) = cached_or_compile(Some(&cache), &key, &mut compile).unwrap();
        assert_eq!((b, o), (good.clone(), Origin::Compiled));
        let (b, o) = cached_or_compile(Some(&cache), &key, &mut compile).unwrap();
        assert_eq!((b, o), (good.clone(), Origin::DiskCache));
        // A truncated artifact stored under the right key (with a valid cache envelope).
        let bytes = good.to_bytes();
        cache.put(&key, &bytes[..bytes.len() - 10]).unwrap();
        let (b, o) = cached_or_compile(Some(&cache), &key, &mut compile).unwrap();
        assert_eq!((b, o), (good.clone(), Origin::Compiled));
        let (_, o) = cached_or_compile(Some(&cache), &key, &mut compile).unwrap();
        assert_eq!(o, Origin::DiskCache, "the recompiled entry was stored");
        assert_eq!(compiles, 2);
        fs::remove_dir_all(&dir).unwrap();
    }
}
