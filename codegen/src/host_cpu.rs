//! The CPU that host code (the compiled CPU device, the SIMT emulator) is generated
//! for: this machine's own (`native`, the default), or an x86-64 feature level that
//! this machine can execute.
//!
//! Results must not depend on the level: every conversion and every subnormal is
//! handled the same way with or without the host's vector extensions (see
//! `Cx::host` in the lowering). Compiling for a lower level is how a test run on one
//! machine covers the code another machine would get; `scripts/test.sh` runs the
//! bit-exact and cross-backend suites at each level the machine can execute
//! (`TESSERA_CPU_TARGET`).
//!
//! The level is chosen once per process, before the first host compilation
//! ([`set_host_cpu`]); compiled kernels are cached for the life of the process, so a
//! second, different choice is refused rather than mixed.

use std::sync::OnceLock;

use inkwell::targets::TargetMachine;

/// The CPU name and LLVM target features host code is generated for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostCpu {
    /// The level it was chosen by (`native`, `x86-64-v2`, ...).
    pub level: String,
    /// LLVM's CPU name.
    pub name: String,
    /// LLVM's target features (`+avx2,+fma,...`; empty: the CPU's own).
    pub features: String,
}

/// The levels [`set_host_cpu`] takes, each with the host features it needs.
pub const LEVELS: &[(&str, &[&str])] = &[
    ("native", &[]),
    (
        "x86-64-v2",
        &["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cx16"],
    ),
    (
        "x86-64-v3",
        &[
            "sse4.2", "popcnt", "avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe",
        ],
    ),
    (
        "x86-64-v4",
        &[
            "avx2", "fma", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl",
        ],
    ),
];

static CHOSEN: OnceLock<HostCpu> = OnceLock::new();

/// This machine's CPU and features, as LLVM reports them.
fn native() -> HostCpu {
    HostCpu {
        level: "native".into(),
        name: TargetMachine::get_host_cpu_name().to_string(),
        features: TargetMachine::get_host_cpu_features().to_string(),
    }
}

/// The features this machine has (`+avx2` → `avx2`).
fn host_features() -> Vec<String> {
    TargetMachine::get_host_cpu_features()
        .to_string()
        .split(',')
        .filter_map(|f| f.strip_prefix('+').map(str::to_string))
        .collect()
}

/// Resolves `level` (one of [`LEVELS`]) on this machine: an error names a level that
/// is not known, one for another architecture, or the features this machine lacks.
pub fn resolve(level: &str) -> Result<HostCpu, String> {
    let level = level.trim();
    let Some((_, needs)) = LEVELS.iter().find(|(l, _)| *l == level) else {
        let known: Vec<&str> = LEVELS.iter().map(|(l, _)| *l).collect();
        return Err(format!(
            "unknown CPU level `{level}` (expected one of {})",
            known.join(", ")
        ));
    };
    if level == "native" {
        return Ok(native());
    }
    if !cfg!(target_arch = "x86_64") {
        return Err(format!(
            "CPU level `{level}` is an x86-64 level; this machine is {}",
            std::env::consts::ARCH
        ));
    }
    let have = host_features();
    let missing: Vec<&str> = needs
        .iter()
        .copied()
        .filter(|f| !have.iter().any(|h| h == f))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "CPU level `{level}` needs {}, which this CPU lacks",
            missing.join(", ")
        ));
    }
    Ok(HostCpu {
        level: level.into(),
        name: level.into(),
        features: String::new(),
    })
}

/// Chooses the level host code is generated for, for the rest of the process.
/// Choosing the one already chosen is a no-op; another one is an error, as is one
/// [`resolve`] refuses. Without a call, [`host_cpu`] is `native`.
pub fn set_host_cpu(level: &str) -> Result<(), String> {
    let want = resolve(level)?;
    let got = CHOSEN.get_or_init(|| want.clone());
    if got.level != want.level {
        return Err(format!(
            "host code is already generated for CPU level `{}` in this process; `{}` cannot be chosen after it",
            got.level, want.level
        ));
    }
    Ok(())
}

/// The CPU host code is generated for ([`set_host_cpu`]'s choice, else `native`).
pub fn host_cpu() -> &'static HostCpu {
    CHOSEN.get_or_init(native)
}

/// Whether host code has 512-bit vector registers (32 of them) to work with.
pub(crate) fn wide_vectors() -> bool {
    let c = host_cpu();
    if c.level == "native" {
        c.features.split(',').any(|f| f == "+avx512f")
    } else {
        c.level == "x86-64-v4"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_foreign_levels_are_errors() {
        let e = resolve("x86-64-v9").unwrap_err();
        assert!(e.contains("unknown CPU level `x86-64-v9`"), "{e}");
        assert!(e.contains("x86-64-v3"), "{e}");
        assert_eq!(resolve(" native ").map(|c| c.level), Ok("native".into()));
    }

    #[test]
    fn a_second_level_in_one_process_is_refused() {
        // (This test binary generates host code for `native`, the default.)
        set_host_cpu("native").expect("the default again");
        assert_eq!(host_cpu().level, "native");
        if resolve("x86-64-v2").is_ok() {
            let e = set_host_cpu("x86-64-v2").unwrap_err();
            assert!(
                e.contains("already generated for CPU level `native`"),
                "{e}"
            );
        }
        assert_eq!(host_cpu().level, "native");
    }

    #[test]
    fn a_level_needs_its_features() {
        let have = host_features();
        for (level, needs) in LEVELS.iter().skip(1) {
            let ok = needs.iter().all(|f| have.iter().any(|h| h == f));
            match resolve(level) {
                Ok(c) => {
                    assert!(ok, "{level} accepted without {needs:?}");
                    assert_eq!(c.name, *level);
                }
                Err(e) => {
                    assert!(!ok || !cfg!(target_arch = "x86_64"), "{level}: {e}");
                    assert!(e.contains("lacks") || e.contains("x86-64 level"), "{e}");
                }
            }
        }
    }
}
