//! Tessera's configuration: every `TESSERA_*` environment variable, typed and read
//! once.
//!
//! [`get`] reads the environment on first use and keeps the result for the life of
//! the process; [`set`] replaces it (a program that configures itself in code, a
//! test). A value that does not parse is an error naming the variable and what it
//! accepts ([`crate::Error::Config`]), returned by every call that needs the
//! configuration, never silently a default. Only this module reads `TESSERA_*`
//! variables (the world's launch variables excepted: `WORLD_SIZE`, `RANK`,
//! `TESSERA_BOOTSTRAP`, ... are read by [`crate::World::launched`], since a launcher sets
//! them for each process); the compiler and IR crates take their settings as
//! arguments. [`VARIABLES`] lists them all, as the README's table does.
//!
//! **Durations** have one syntax everywhere: a number with an optional unit, `ms`,
//! `s`, `m` or `h` (`30`, `0.5`, `250ms`, `2m`); a bare number is seconds. **Sizes**
//! are a number of bytes with an optional `K`, `M` or `G` suffix (powers of 1024):
//! `268435456`, `256M`. **Switches** are `1`/`on`/`true`/`yes` or
//! `0`/`off`/`false`/`no`. Empty values count as unset.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::error::Error;

/// One configuration variable, for documentation and the README's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variable {
    /// Its name.
    pub name: &'static str,
    /// What it accepts.
    pub accepts: &'static str,
    /// What it does, and its default.
    pub meaning: &'static str,
}

/// Every variable Tessera reads, in the README's order.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "TESSERA_DEVICE",
        accepts: "`cpu`, `interp`, `emu-nv`, `emu-amd`, `emu-sm90a`, `emu-gfx950`, `emu-gfx1100`, `emu-gfx1200`, `cuda[:N]`, `hip[:N]`",
        meaning: "the device of `Device::best()` (default: CUDA device 0, else HIP device 0, else the CPU; `interp` is the reference interpreter)",
    },
    Variable {
        name: "TESSERA_SANITIZE",
        accepts: "a switch",
        meaning: "the sanitizer for kernels compiled for the CPU: every access the program makes is reported as the interpreter reports it, including loads whose values a mask discards (loads are then not fused); without it every access that happens is still checked against its buffer (default: on in debug builds, off in release builds; the interpreter always checks)",
    },
    Variable {
        name: "TESSERA_CPU_TARGET",
        accepts: "`native`, `x86-64-v2`, `x86-64-v3` or `x86-64-v4`",
        meaning: "the CPU that kernels compiled for the host (the CPU device, the emulators) are generated for: this machine's own, or an x86-64 feature level it can execute (a test run covers the code a machine with fewer extensions gets; results are the same at every level; default `native`)",
    },
    Variable {
        name: "TESSERA_CPU_JIT",
        accepts: "`background` or `wait`",
        meaning: "how the CPU device launches a kernel whose compiled code is not ready (neither compiled in this process nor in the disk cache): `background` runs its programs on the interpreter while LLVM compiles it on another thread, and those left when the code is ready run compiled (a first launch takes about the shorter of the two; a kernel whose programs wait for each other, or a rank's launch in a world, waits instead); `wait` compiles first, so every program runs compiled code (the test suite tests the compiled code so; default `background`)",
    },
    Variable {
        name: "TESSERA_LAUNCH_TIMEOUT",
        accepts: "a duration",
        meaning: "how long a launch on the CPU or the emulator may run before every loop stops and it fails naming the loop (`Device::with_launch_timeout` in code; default: unbounded)",
    },
    Variable {
        name: "TESSERA_WAIT_TIMEOUT",
        accepts: "a duration",
        meaning: "how long a device-side wait, host barrier or bootstrap may take (`World::timeout` in code; default 30 s)",
    },
    Variable {
        name: "TESSERA_EMU_TIMEOUT",
        accepts: "a duration",
        meaning: "how long an emulated barrier may wait before it is reported (default 60 s)",
    },
    Variable {
        name: "TESSERA_HEAP_BYTES",
        accepts: "a size",
        meaning: "bytes of each rank's symmetric heap (`World::heap_bytes` in code; default 256M)",
    },
    Variable {
        name: "TESSERA_AOT_DIR",
        accepts: "a folder",
        meaning: "precompiled artifacts (`ArtifactStore`), looked up before the JIT (`Device::with_artifacts` in code)",
    },
    Variable {
        name: "TESSERA_CACHE_DIR",
        accepts: "a folder, or `off`",
        meaning: "the on-disk JIT kernel cache (default: the user's cache folder, `~/.cache/tessera` on Linux)",
    },
    Variable {
        name: "TESSERA_DUMP",
        accepts: "a comma-separated list of `ir`, `layout`, `llvm`, `ptx`, `amdgcn`, `emu-llvm`, `tileir`, or `all`",
        meaning: "compilation stages to write to `TESSERA_DUMP_DIR` (`emu-llvm`: the emulator's LLVM module, to standard error; `tileir`: the Tile IR bytecode, `.tilebc`)",
    },
    Variable {
        name: "TESSERA_DUMP_DIR",
        accepts: "a folder",
        meaning: "where dumps go (default `tessera-dump`)",
    },
    Variable {
        name: "TESSERA_LLD",
        accepts: "a program",
        meaning: "the `ld.lld` that links AMD code objects (default: `ld.lld-22`, `/usr/lib/llvm-22/bin/ld.lld`, `ld.lld` on `PATH`)",
    },
    Variable {
        name: "TESSERA_TILEIRAS",
        accepts: "a program",
        meaning: "NVIDIA's `tileiras`, which compiles Tile IR kernels (default: `tileiras` on `PATH`, then the workspace's `.tools/bin`)",
    },
    Variable {
        name: "TESSERA_KERNEL_BACKEND",
        accepts: "`llvm` or `tileir`",
        meaning: "the code generator of GPU launches that do not choose one (`LaunchOptions::backend`); default: the device's choice (`KernelBackend::for_device`: Tile IR on compute capability 10.0 and later, else LLVM)",
    },
    Variable {
        name: "TESSERA_AUTOTUNE",
        accepts: "a switch",
        meaning: "`off`: autotuned launches use their first configuration without timing (default on)",
    },
    Variable {
        name: "TESSERA_GREEN_CONTEXTS",
        accepts: "a switch",
        meaning: "`off`: the parts of a CUDA GPU shared by several ranks (`Device::partition`, `World::local(n).on(&gpu)`) are streams with sized launches, not green contexts (default on, where the driver has them: CUDA 12.4+)",
    },
    Variable {
        name: "TESSERA_LOG",
        accepts: "a log filter (`warn`, `info`, `tessera=debug`, ...)",
        meaning: "what the examples' logger prints (Tessera logs through the `log` facade; default `warn`)",
    },
    Variable {
        name: "TESSERA_TRANSPORT",
        accepts: "`shm`, `mpi` or `nvshmem`",
        meaning: "how a launched process reaches its peers: `shm`, shared memory on one node; `mpi`, MPI one-sided communication, any number of nodes (feature `mpi`; default: `mpi` under `mpirun`/`srun` without `WORLD_SIZE`, else `shm`); `nvshmem`, GPU ranks on NVSHMEM, any number of nodes (`World::nvshmem`); read by `World::launched`",
    },
    Variable {
        name: "TESSERA_MPI_SHARED",
        accepts: "`0` or `1`",
        meaning: "under the MPI transport, whether the ranks of a node share their heaps (`MPI_Win_allocate_shared`; default `1`, unless Open MPI's one-sided components exclude `sm`); `0` reaches every peer through MPI calls; read by `World::mpi`",
    },
    Variable {
        name: "TESSERA_BOOTSTRAP",
        accepts: "a socket path, or `@name` (abstract)",
        meaning: "the bootstrap socket of a launched world (default: from `MASTER_ADDR`/`MASTER_PORT`); read by `World::launched`",
    },
    Variable {
        name: "TESSERA_BOOTSTRAP_SECRET",
        accepts: "text",
        meaning: "what every rank must present to join a launched world (set by `spawn_local`; required by an NVSHMEM world, whose rendezvous is over TCP); read by `World::launched` and `World::nvshmem`",
    },
    Variable {
        name: "TESSERA_RENDEZVOUS_PORT",
        accepts: "a TCP port",
        meaning: "the port of an NVSHMEM world's TCP rendezvous on `MASTER_ADDR` (default `MASTER_PORT + 1`: torchrun's own store holds `MASTER_PORT`); read by `World::nvshmem`",
    },
    Variable {
        name: "TESSERA_NVSHMEM_HOME",
        accepts: "a folder",
        meaning: "an NVSHMEM installation (holding `lib/libnvshmem_device_sm_XX.bc`), whose device library kernels compiled for off-node peers link (`CommEngine::Nvshmem`; default: NVIDIA's Debian package folders, `/usr/local/nvshmem`, `/opt/nvidia/nvshmem`; `scripts/setup.sh` installs one in `.tools/nvshmem`); read by the compiler",
    },
    Variable {
        name: "TESSERA_ROCSHMEM_BITCODE",
        accepts: "a file",
        meaning: "rocSHMEM's device library as LLVM bitcode, for AMD kernels that reach off-node peers (`CommEngine::Rocshmem`; not finished: compiling with it fails naming what is missing); read by the compiler",
    },
];

/// Which compilation stages to dump.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DumpStages {
    stages: Vec<String>,
}

impl DumpStages {
    /// The stages that may be named.
    pub const KNOWN: &'static [&'static str] = &[
        "ir", "layout", "llvm", "ptx", "amdgcn", "emu-llvm", "tileir", "all",
    ];

    /// These stages (each one of [`DumpStages::KNOWN`]).
    pub fn new<S: AsRef<str>>(stages: &[S]) -> Result<DumpStages, Error> {
        let mut out = Vec::new();
        for s in stages {
            let s = s.as_ref().trim().to_ascii_lowercase();
            if s.is_empty() {
                continue;
            }
            if !Self::KNOWN.contains(&s.as_str()) {
                return Err(Error::Config(format!(
                    "unknown dump stage `{s}` (expected {})",
                    Self::KNOWN.join(", ")
                )));
            }
            out.push(s);
        }
        Ok(DumpStages { stages: out })
    }

    /// Whether `stage` is dumped (named, or `all`).
    pub fn contains(&self, stage: &str) -> bool {
        self.stages.iter().any(|s| s == stage || s == "all")
    }

    /// Whether nothing is dumped.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }
}

/// How the CPU device launches a kernel whose compiled code is not ready
/// (`TESSERA_CPU_JIT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpuJit {
    /// The interpreter runs programs while LLVM compiles the kernel on another
    /// thread; the programs left when the code is ready run compiled.
    #[default]
    Background,
    /// The launch compiles first: every program runs compiled code.
    Wait,
}

/// Where compiled kernels are cached on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheDir {
    /// The user's cache folder (`$XDG_CACHE_HOME/tessera`, `~/.cache/tessera`).
    Default,
    /// This folder.
    At(PathBuf),
    /// No disk cache.
    Off,
}

/// The configuration (see the [module docs](self)). Fields left `None` take the
/// defaults [`VARIABLES`] names.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// `TESSERA_DEVICE`.
    pub device: Option<String>,
    /// `TESSERA_LAUNCH_TIMEOUT`.
    pub launch_timeout: Option<Duration>,
    /// `TESSERA_WAIT_TIMEOUT`.
    pub wait_timeout: Duration,
    /// `TESSERA_EMU_TIMEOUT`.
    pub emu_barrier_timeout: Duration,
    /// `TESSERA_HEAP_BYTES`.
    pub heap_bytes: usize,
    /// `TESSERA_AOT_DIR`.
    pub aot_dir: Option<PathBuf>,
    /// `TESSERA_CACHE_DIR`.
    pub cache_dir: CacheDir,
    /// `TESSERA_DUMP`.
    pub dump: DumpStages,
    /// `TESSERA_DUMP_DIR`.
    pub dump_dir: PathBuf,
    /// `TESSERA_LLD`.
    pub lld: Option<PathBuf>,
    /// `TESSERA_TILEIRAS`.
    pub tileiras: Option<PathBuf>,
    /// `TESSERA_KERNEL_BACKEND` (`None`: the device's choice).
    pub kernel_backend: Option<crate::KernelBackend>,
    /// `TESSERA_AUTOTUNE`.
    pub autotune: bool,
    /// `TESSERA_GREEN_CONTEXTS`.
    pub green_contexts: bool,
    /// `TESSERA_SANITIZE`.
    pub sanitize: bool,
    /// `TESSERA_CPU_TARGET` (`None`: `native`).
    pub cpu_target: Option<String>,
    /// `TESSERA_CPU_JIT`.
    pub cpu_jit: CpuJit,
}

impl Default for Config {
    /// The configuration with no variable set.
    fn default() -> Config {
        Config {
            device: None,
            launch_timeout: None,
            wait_timeout: Duration::from_secs(30),
            emu_barrier_timeout: Duration::from_secs(60),
            heap_bytes: 256 << 20,
            aot_dir: None,
            cache_dir: CacheDir::Default,
            dump: DumpStages::default(),
            dump_dir: PathBuf::from("tessera-dump"),
            lld: None,
            tileiras: None,
            kernel_backend: None,
            autotune: true,
            green_contexts: true,
            sanitize: cfg!(debug_assertions),
            cpu_target: None,
            cpu_jit: CpuJit::Background,
        }
    }
}

/// Parses a duration (see the [module docs](self)): `30`, `0.5`, `250ms`, `2m`.
/// `None` for anything else, zero and negative values included.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    // The unit is the trailing letters (`1e-3` is a number of seconds).
    let split = t.trim_end_matches(|c: char| c.is_ascii_alphabetic()).len();
    let (num, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    let v: f64 = num.trim().parse().ok()?;
    if !v.is_finite() || v <= 0.0 {
        return None;
    }
    Duration::try_from_secs_f64(v * scale)
        .ok()
        .filter(|d| !d.is_zero())
}

/// Parses a size in bytes (see the [module docs](self)): `4096`, `256M`, `1G`.
pub fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 10),
        Some((i, 'M' | 'm')) => (&t[..i], 20),
        Some((i, 'G' | 'g')) => (&t[..i], 30),
        _ => (t, 0),
    };
    let n: usize = num.trim().parse().ok()?;
    n.checked_mul(1usize << shift).filter(|&b| b > 0)
}

/// Parses a switch (see the [module docs](self)).
pub fn parse_switch(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Some(true),
        "0" | "off" | "false" | "no" => Some(false),
        _ => None,
    }
}

impl Config {
    /// Chooses the CPU that host code is generated for (`TESSERA_CPU_TARGET`), before
    /// the first kernel is compiled for the CPU device or an emulator.
    #[cfg(feature = "jit")]
    pub(crate) fn choose_host_cpu(&self) -> Result<(), Error> {
        match &self.cpu_target {
            Some(level) => tessera_codegen::host_cpu::set_host_cpu(level)
                .map_err(|m| Error::Config(format!("TESSERA_CPU_TARGET=`{level}`: {m}"))),
            None => Ok(()),
        }
    }

    /// The configuration the environment gives (read now).
    pub fn from_env() -> Result<Config, Error> {
        Config::from_vars(|k| std::env::var(k).ok())
    }

    /// The configuration `var` gives (`var(name)`: the variable's value, if set).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Config, Error> {
        let get = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        let bad = |k: &str, v: &str, accepts: &str| {
            Error::Config(format!("{k}=`{v}`: expected {accepts}"))
        };
        let duration = |k: &str| -> Result<Option<Duration>, Error> {
            get(k)
                .map(|v| {
                    parse_duration(&v).ok_or_else(|| {
                        bad(
                            k,
                            &v,
                            "a positive duration: a number of seconds (30, 0.5) or a number with a unit (250ms, 2m)",
                        )
                    })
                })
                .transpose()
        };
        let d = Config::default();
        if let Some(v) = get("TESSERA_EMU_TIMEOUT_MS") {
            return Err(Error::Config(format!(
                "TESSERA_EMU_TIMEOUT_MS=`{v}`: the variable is now TESSERA_EMU_TIMEOUT, a duration (e.g. {v}ms)"
            )));
        }
        let dump = match get("TESSERA_DUMP") {
            Some(v) => {
                let parts: Vec<&str> = v.split(',').collect();
                DumpStages::new(&parts).map_err(|e| match e {
                    Error::Config(m) => Error::Config(format!("TESSERA_DUMP=`{v}`: {m}")),
                    e => e,
                })?
            }
            None => DumpStages::default(),
        };
        let cache_dir = match get("TESSERA_CACHE_DIR") {
            Some(v) if v.trim().eq_ignore_ascii_case("off") => CacheDir::Off,
            Some(v) => CacheDir::At(PathBuf::from(v)),
            None => CacheDir::Default,
        };
        Ok(Config {
            device: get("TESSERA_DEVICE").map(|v| v.trim().to_string()),
            launch_timeout: duration("TESSERA_LAUNCH_TIMEOUT")?,
            wait_timeout: duration("TESSERA_WAIT_TIMEOUT")?.unwrap_or(d.wait_timeout),
            emu_barrier_timeout: duration("TESSERA_EMU_TIMEOUT")?
                .unwrap_or(d.emu_barrier_timeout),
            heap_bytes: match get("TESSERA_HEAP_BYTES") {
                Some(v) => parse_size(&v).ok_or_else(|| {
                    bad(
                        "TESSERA_HEAP_BYTES",
                        &v,
                        "a positive number of bytes, with an optional K, M or G suffix (268435456, 256M)",
                    )
                })?,
                None => d.heap_bytes,
            },
            aot_dir: get("TESSERA_AOT_DIR").map(PathBuf::from),
            cache_dir,
            dump,
            dump_dir: get("TESSERA_DUMP_DIR")
                .map(PathBuf::from)
                .unwrap_or(d.dump_dir),
            lld: get("TESSERA_LLD").map(PathBuf::from),
            tileiras: get("TESSERA_TILEIRAS").map(PathBuf::from),
            kernel_backend: match get("TESSERA_KERNEL_BACKEND") {
                Some(v) => Some(
                    v.trim()
                        .parse()
                        .map_err(|_| bad("TESSERA_KERNEL_BACKEND", &v, "`llvm` or `tileir`"))?,
                ),
                None => None,
            },
            autotune: match get("TESSERA_AUTOTUNE") {
                Some(v) => parse_switch(&v).ok_or_else(|| {
                    bad(
                        "TESSERA_AUTOTUNE",
                        &v,
                        "a switch: 1, on, true, yes or 0, off, false, no",
                    )
                })?,
                None => d.autotune,
            },
            green_contexts: match get("TESSERA_GREEN_CONTEXTS") {
                Some(v) => parse_switch(&v).ok_or_else(|| {
                    bad(
                        "TESSERA_GREEN_CONTEXTS",
                        &v,
                        "a switch: 1, on, true, yes or 0, off, false, no",
                    )
                })?,
                None => d.green_contexts,
            },
            sanitize: match get("TESSERA_SANITIZE") {
                Some(v) => parse_switch(&v).ok_or_else(|| {
                    bad(
                        "TESSERA_SANITIZE",
                        &v,
                        "a switch: 1, on, true, yes or 0, off, false, no",
                    )
                })?,
                None => d.sanitize,
            },
            cpu_target: match get("TESSERA_CPU_TARGET") {
                Some(v) => {
                    let v = v.trim().to_string();
                    const LEVELS: [&str; 4] = ["native", "x86-64-v2", "x86-64-v3", "x86-64-v4"];
                    if !LEVELS.contains(&v.as_str()) {
                        return Err(bad(
                            "TESSERA_CPU_TARGET",
                            &v,
                            "one of native, x86-64-v2, x86-64-v3, x86-64-v4",
                        ));
                    }
                    Some(v)
                }
                None => None,
            },
            cpu_jit: match get("TESSERA_CPU_JIT").map(|v| v.trim().to_ascii_lowercase()) {
                Some(v) if v == "background" => CpuJit::Background,
                Some(v) if v == "wait" => CpuJit::Wait,
                Some(v) => return Err(bad("TESSERA_CPU_JIT", &v, "`background` or `wait`")),
                None => d.cpu_jit,
            },
        })
    }
}

/// The configuration, or why the environment gives none (read on first use).
enum Loaded {
    Ok(Arc<Config>),
    Err(String),
}

static CONFIG: RwLock<Option<Loaded>> = RwLock::new(None);

/// The process's configuration: read from the environment on first use, or the
/// one given to [`set`]. An unusable variable is an error (every call returns it).
pub fn get() -> Result<Arc<Config>, Error> {
    let loaded = |l: &Loaded| match l {
        Loaded::Ok(c) => Ok(c.clone()),
        Loaded::Err(m) => Err(Error::Config(m.clone())),
    };
    if let Some(l) = CONFIG.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        return loaded(l);
    }
    let mut g = CONFIG.write().unwrap_or_else(|e| e.into_inner());
    let l = g.get_or_insert_with(|| match Config::from_env() {
        Ok(c) => Loaded::Ok(Arc::new(c)),
        Err(Error::Config(m)) => Loaded::Err(m),
        Err(e) => Loaded::Err(e.to_string()),
    });
    loaded(l)
}

/// Replaces the process's configuration (for every later [`get`]).
pub fn set(config: Config) {
    *CONFIG.write().unwrap_or_else(|e| e.into_inner()) = Some(Loaded::Ok(Arc::new(config)));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn durations_have_one_syntax() {
        let s = Duration::from_secs_f64;
        assert_eq!(parse_duration("30"), Some(s(30.0)));
        assert_eq!(parse_duration(" 0.5 "), Some(s(0.5)));
        assert_eq!(parse_duration("250ms"), Some(s(0.25)));
        assert_eq!(parse_duration("2m"), Some(s(120.0)));
        assert_eq!(parse_duration("1h"), Some(s(3600.0)));
        assert_eq!(parse_duration("1e-3"), Some(s(0.001)));
        for bad in [
            "",
            "0",
            "-1",
            "abc",
            "5 parsecs",
            "inf",
            "NaN",
            "1e300",
            "s",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn sizes_and_switches() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("256M"), Some(256 << 20));
        assert_eq!(parse_size("2k"), Some(2048));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        for bad in ["", "0", "-5", "1.5M", "12Q", "99999999999999999999G"] {
            assert_eq!(parse_size(bad), None, "{bad:?}");
        }
        assert_eq!(parse_switch("ON"), Some(true));
        assert_eq!(parse_switch("0"), Some(false));
        assert_eq!(parse_switch("maybe"), None);
    }

    #[test]
    fn unset_is_the_default_and_values_parse() {
        assert_eq!(Config::from_vars(vars(&[])).unwrap(), Config::default());
        // Blank values count as unset.
        assert_eq!(
            Config::from_vars(vars(&[("TESSERA_WAIT_TIMEOUT", "  ")])).unwrap(),
            Config::default()
        );
        let c = Config::from_vars(vars(&[
            ("TESSERA_DEVICE", " emu-nv "),
            ("TESSERA_LAUNCH_TIMEOUT", "1.5"),
            ("TESSERA_WAIT_TIMEOUT", "400ms"),
            ("TESSERA_EMU_TIMEOUT", "2m"),
            ("TESSERA_HEAP_BYTES", "64M"),
            ("TESSERA_AOT_DIR", "/art"),
            ("TESSERA_CACHE_DIR", "off"),
            ("TESSERA_DUMP", "ir, PTX"),
            ("TESSERA_DUMP_DIR", "d"),
            ("TESSERA_LLD", "/bin/lld"),
            ("TESSERA_TILEIRAS", "/opt/tileiras"),
            ("TESSERA_KERNEL_BACKEND", " tileir "),
            ("TESSERA_AUTOTUNE", "off"),
            ("TESSERA_GREEN_CONTEXTS", "no"),
            ("TESSERA_CPU_JIT", " Wait"),
        ]))
        .unwrap();
        assert_eq!(c.cpu_jit, CpuJit::Wait);
        assert_eq!(c.device.as_deref(), Some("emu-nv"));
        assert_eq!(c.launch_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(c.wait_timeout, Duration::from_millis(400));
        assert_eq!(c.emu_barrier_timeout, Duration::from_secs(120));
        assert_eq!(c.heap_bytes, 64 << 20);
        assert_eq!(c.aot_dir, Some(PathBuf::from("/art")));
        assert_eq!(c.cache_dir, CacheDir::Off);
        assert!(c.dump.contains("ir") && c.dump.contains("ptx") && !c.dump.contains("llvm"));
        assert_eq!(c.dump_dir, PathBuf::from("d"));
        assert_eq!(c.lld, Some(PathBuf::from("/bin/lld")));
        assert_eq!(c.tileiras, Some(PathBuf::from("/opt/tileiras")));
        assert_eq!(c.kernel_backend, Some(crate::KernelBackend::TileIr));
        assert!(!c.autotune);
        assert!(!c.green_contexts);
        let c = Config::from_vars(vars(&[("TESSERA_CACHE_DIR", "/c")])).unwrap();
        assert_eq!(c.cache_dir, CacheDir::At(PathBuf::from("/c")));
    }

    #[test]
    fn an_unusable_value_is_an_error_naming_the_variable() {
        for (k, v, says) in [
            ("TESSERA_LAUNCH_TIMEOUT", "abc", "a positive duration"),
            ("TESSERA_WAIT_TIMEOUT", "-2", "a positive duration"),
            ("TESSERA_EMU_TIMEOUT", "5 days", "a positive duration"),
            ("TESSERA_HEAP_BYTES", "lots", "a positive number of bytes"),
            ("TESSERA_AUTOTUNE", "sometimes", "a switch"),
            ("TESSERA_GREEN_CONTEXTS", "maybe", "a switch"),
            ("TESSERA_DUMP", "ir,asm", "unknown dump stage `asm`"),
            ("TESSERA_EMU_TIMEOUT_MS", "500", "now TESSERA_EMU_TIMEOUT"),
            ("TESSERA_CPU_TARGET", "avx9", "one of native, x86-64-v2"),
            ("TESSERA_CPU_JIT", "lazy", "`background` or `wait`"),
            ("TESSERA_KERNEL_BACKEND", "ptx", "`llvm` or `tileir`"),
        ] {
            let e = Config::from_vars(vars(&[(k, v)])).unwrap_err();
            let s = e.to_string();
            assert!(matches!(e, Error::Config(_)), "{s}");
            assert!(
                s.contains(&format!("{k}=`{v}`")) && s.contains(says),
                "{k}={v}: {s}"
            );
        }
    }

    #[test]
    fn every_field_has_a_variable() {
        let names: Vec<&str> = VARIABLES.iter().map(|v| v.name).collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "a variable listed twice");
        // Each variable `from_vars` reads is in the table.
        let read = std::sync::Mutex::new(Vec::new());
        let _ = Config::from_vars(|k| {
            read.lock().unwrap().push(k.to_string());
            None
        });
        for k in read.into_inner().unwrap() {
            assert!(
                names.contains(&k.as_str()) || k == "TESSERA_EMU_TIMEOUT_MS",
                "{k} is read but not in VARIABLES"
            );
        }
    }
}
