//! The runtime's error type.

use tessera_ir::BuildError;
use tessera_ir::interp::InterpError;
use tessera_ir::verify::VerifyError;

/// An error of the compiler crate (`tessera_codegen`, feature `jit`), boxed so that
/// [`Error`] has the same variants with and without the feature: reach its own type
/// with `downcast_ref` (`tessera::codegen::emu::EmuError`,
/// `tessera::codegen::CodegenError`).
pub type CompilerError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong building, compiling or launching a kernel. Its
/// variants are the same with and without the `jit` feature (those only the compiler
/// produces never occur without it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Tracing the kernel body failed (an op with invalid operands, a comptime value
    /// assigned in a runtime loop, ...). The message starts with the user's
    /// file:line:col.
    #[error("cannot build kernel `{kernel}`: {source}")]
    Build {
        /// The kernel.
        kernel: String,
        /// The first error, with its span.
        #[source]
        source: BuildError,
    },
    /// The traced IR is invalid, reported with the op's span: a mistake of the
    /// kernel's that only the verifier sees (`source.user`: a write through a
    /// read-only parameter by way of a peer's copy), else a bug in Tessera.
    #[error("{}", verify_message(kernel, source))]
    Verify {
        /// The kernel.
        kernel: String,
        /// What the verifier found.
        #[source]
        source: VerifyError,
    },
    /// The kernel failed while running (out-of-bounds access, division by zero, ...).
    #[error("{0}")]
    Exec(Box<InterpError>),
    /// The kernel failed on the SIMT emulator (out-of-bounds access, barrier
    /// divergence, shared-memory race, ...), naming the op's file:line:col, block and
    /// thread: a `tessera::codegen::emu::EmuError`.
    #[error("{0}")]
    Emu(CompilerError),
    /// A communication failure outside a kernel: a mismatched symmetric allocation, a
    /// full heap, a rank that never reached a host barrier, a rank that failed.
    #[error("communication error on rank {rank}: {message}")]
    Comm {
        /// The rank that reports it.
        rank: u32,
        /// What went wrong.
        message: String,
    },
    /// A communicating kernel's wait failed on a GPU (timed out, or was released by
    /// another rank's failure), decoded from the rank's device-side error record:
    /// names the wait's file:line:col, rank, expected and observed values (with or
    /// without the `jit` feature: the record's layout is IR-level).
    #[error("{0}")]
    CommFault(Box<tessera_ir::comm::CommFault>),
    /// A `device_assert` failed: names its file:line:col, message, program and
    /// first failing element. The kernel ran to completion.
    #[error("{0}")]
    DeviceAssert(Box<tessera_ir::debug::AssertFailure>),
    /// A configuration value (an environment variable) that cannot be used; the
    /// message names it.
    #[error("configuration error: {0}")]
    Config(String),
    /// The launch itself is invalid (grid size, buffer from another device, ...).
    #[error("invalid launch of kernel `{kernel}`: {reason}")]
    Launch {
        /// The kernel.
        kernel: String,
        /// Why.
        reason: String,
    },
    /// A stream, event or buffer used wrongly: with another device than its own, or
    /// an event timed before it was recorded.
    #[error("{0}")]
    Usage(String),
    /// `TESSERA_DEVICE` names no known device.
    #[error(
        "unknown device `{0}` (expected one of: cpu, interp, emu-nv, emu-amd, emu-sm90a, emu-gfx950, emu-gfx1100, emu-gfx1200, cuda[:N], hip[:N])"
    )]
    UnknownDevice(String),
    /// The requested device exists in Tessera's vocabulary but cannot be used here.
    #[error("device `{device}` is not available: {reason}")]
    DeviceUnavailable {
        /// The device name.
        device: String,
        /// Why.
        reason: String,
    },
    /// A GPU driver call failed. `what` names the operation, and the kernel when there
    /// is one (e.g. "launching kernel `softmax`"); `message` is the driver's error.
    #[error("{device}: {what} failed: {message}")]
    Driver {
        /// The device (`cuda:0`, `hip:1`).
        device: String,
        /// The operation.
        what: String,
        /// The driver's error (name and description).
        message: String,
    },
    /// No precompiled artifact for a kernel on a device whose runtime cannot compile
    /// (built without the `jit` feature).
    #[error(
        "no precompiled artifact for kernel `{kernel}` on {target}: {file} is not in {dir} \
         ({hint}); precompile it with `tessera::aot::precompile` or the `aot` example, \
         or build with the `jit` feature"
    )]
    MissingArtifact {
        /// The kernel.
        kernel: String,
        /// The target (`sm_90`, `gfx942`).
        target: String,
        /// The folder searched.
        dir: String,
        /// The file expected there.
        file: String,
        /// What else is there.
        hint: String,
    },
    /// A precompiled artifact could not be read or is invalid.
    #[error("kernel artifact {path}: {reason}")]
    Artifact {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor descriptor that does not describe its buffer.
    #[error("invalid tensor descriptor: {0}")]
    Descriptor(String),
    /// A buffer operation with mismatched sizes.
    #[error("buffer size mismatch: {0}")]
    BufferSize(String),
    /// Memory for a buffer, a copy of one or a symmetric heap could not be allocated:
    /// more bytes than the address space holds (or than `usize` counts), than the
    /// system grants (host memory of the CPU device, the interpreter and the
    /// emulators), or than the GPU has free (the driver's out-of-memory error).
    #[error(
        "out of memory on {device}: cannot allocate {bytes} bytes{}",
        if *.bytes == u64::MAX { " or more" } else { "" }
    )]
    OutOfMemory {
        /// The size asked for, in bytes; `u64::MAX` stands for that many or more (an
        /// element count whose size overflows 64 bits).
        bytes: u64,
        /// The device (`cpu`, `interp`, `emu-nv`, `cuda:0`, ...).
        device: String,
    },
    /// Compiling the kernel for a GPU failed: a `tessera::codegen::CodegenError`.
    #[error(transparent)]
    Codegen(CompilerError),
    /// Writing a dump file failed.
    #[error("cannot write the {what} dump to {path}: {source}")]
    Dump {
        /// Which stage.
        what: String,
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A call of the library's collectives or fused plans (`Rank::all_reduce`,
    /// `AgGemm::run`, ...) failed: names the caller's file:line:col (the user's call
    /// into the library) and the call, then the error inside the library (which
    /// kernel, wait or argument, on which rank). Match on [`Error::inner`], which
    /// looks through it. An error that only reports another rank's failure (a wait
    /// released because another rank failed or left) is returned as it is, so that
    /// `World::run` still reports the failing rank's own error first.
    #[error("{}:{}:{}: `{call}` failed: {source}", at.file(), at.line(), at.column())]
    Collective {
        /// The call (`all_reduce`, `AgGemm::run`).
        call: &'static str,
        /// Where the user's code called it.
        at: &'static std::panic::Location<'static>,
        /// What failed inside it.
        #[source]
        source: Box<Error>,
    },
}

impl From<InterpError> for Error {
    fn from(e: InterpError) -> Error {
        Error::Exec(Box::new(e))
    }
}

impl Error {
    /// The error itself, or for an [`Error::Collective`] the library's error inside
    /// it: what to match on.
    pub fn inner(&self) -> &Error {
        let mut e = self;
        while let Error::Collective { source, .. } = e {
            e = source;
        }
        e
    }

    /// [`Error::inner`], by value.
    pub fn into_inner(self) -> Error {
        let mut e = self;
        while let Error::Collective { source, .. } = e {
            e = *source;
        }
        e
    }

    /// Wraps an error of the library call `call` as an [`Error::Collective`] naming
    /// the caller of the `#[track_caller]` function that calls this (the user's call
    /// site, when every library function between has `#[track_caller]`).
    #[track_caller]
    pub(crate) fn in_call(call: &'static str) -> impl FnOnce(Error) -> Error {
        let at = std::panic::Location::caller();
        move |source| Error::Collective {
            call,
            at,
            source: Box::new(source),
        }
    }

    /// Whether the error only reports another rank's failure (what `World::run`
    /// reports after every rank's own error).
    pub(crate) fn reports_another_rank(&self) -> bool {
        match self.inner() {
            Error::Exec(ie) => matches!(**ie, InterpError::Aborted { .. }),
            Error::Comm { message, .. } => message.starts_with("abandoned"),
            #[cfg(feature = "jit")]
            Error::Emu(ee) => matches!(
                ee.downcast_ref::<tessera_codegen::emu::EmuError>(),
                Some(tessera_codegen::emu::EmuError::Comm(f))
                    if matches!(**f, tessera_ir::comm::CommFault::Aborted { .. })
            ),
            Error::CommFault(f) => matches!(**f, tessera_ir::comm::CommFault::Aborted { .. }),
            _ => false,
        }
    }
}

#[cfg(feature = "jit")]
impl From<tessera_codegen::CodegenError> for Error {
    fn from(e: tessera_codegen::CodegenError) -> Error {
        Error::Codegen(Box::new(e))
    }
}

/// [`Error::Verify`]'s message.
fn verify_message(kernel: &str, source: &tessera_ir::verify::VerifyError) -> String {
    if source.user {
        format!("cannot build kernel `{kernel}`: {source}")
    } else {
        format!("internal error: kernel `{kernel}` failed IR verification: {source}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The compiler's variants exist in every build (this test compiles with and
    /// without `jit`), carrying any error, which keeps its own type.
    #[test]
    fn the_compiler_variants_exist_without_the_compiler() {
        #[derive(Debug, thiserror::Error)]
        #[error("inner")]
        struct Inner;
        for e in [Error::Emu(Box::new(Inner)), Error::Codegen(Box::new(Inner))] {
            assert_eq!(e.to_string(), "inner");
            let (Error::Emu(b) | Error::Codegen(b)) = e else {
                unreachable!()
            };
            assert!(b.downcast_ref::<Inner>().is_some());
        }
    }
}
