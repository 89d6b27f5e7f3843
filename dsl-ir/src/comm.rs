//! The device-side ABI of communicating kernels, shared by the lowering and the
//! emulator (`tessera_codegen`, which re-exports this module as its `comm`) and the
//! runtime's launchers. It needs no LLVM: a runtime built without the compiler
//! decodes a failed wait's record into a [`CommFault`] naming its source line.
//!
//! # Hidden parameters
//!
//! A kernel whose IR uses communication ops ([`Function::uses_comm`]) takes four
//! parameters after the user's, in this order ([`HIDDEN_PARAMS`]):
//!
//! | # | name | LLVM type | value |
//! |---|---|---|---|
//! | 0 | `rank` | `i32` | this rank, `0..world_size` |
//! | 1 | `world_size` | `i32` | number of ranks |
//! | 2 | `heap_bases` | `ptr addrspace(global)` to `u64` | `world_size` entries: every rank's symmetric-heap base address **as this rank's device sees it** (peer mappings) |
//! | 3 | `timeout_ns` | `i64` | how long a `wait_until` / `barrier_all` polls before failing, in nanoseconds |
//!
//! Kernels that do not communicate have exactly the user's parameters (their code is
//! unchanged). Heap bases must be at least [`HEAP_ALIGN`]-byte aligned: `remote_ptr`
//! keeps the alignment facts of the local pointer (so remote tiles move with wide
//! accesses), which holds because every heap has the same layout.
//! [`HiddenArgs::values`] builds the values a launcher appends.
//!
//! # Control words
//!
//! Every heap starts with [`ctrl::WORDS`] `u64` control words
//! ([`crate::interp::ctrl`]): `BARRIER` (rank 0's is the `barrier_all` arrival
//! counter) and `ABORT` (nonzero = `1 + failed rank`; every wait polls its own rank's
//! word and gives up when it is set). The compiled code adds an *error record* in
//! words [`ERR_SITE`]..=[`ERR_PROGRAM`] of the failing rank's heap, written by the
//! first program that gives up (a compare-and-swap on [`ERR_SITE`] elects it):
//!
//! | word | meaning |
//! |---|---|
//! | [`ERR_SITE`] | `1 +` the op's index in [`comm_sites`] (0: no record) |
//! | [`ERR_KIND`] | [`KIND_TIMEOUT`] or [`KIND_ABORTED`] (another rank failed first) |
//! | [`ERR_EXPECTED`] | the value waited for (`barrier_all`: the arrival count) |
//! | [`ERR_OBSERVED`] | the last value read |
//! | [`ERR_PROGRAM`] | the program's linear id (`x + gx * (y + gy * z)`) |
//!
//! [`ERR_KIND`] is an addition to a plain (site, expected, observed, program) record:
//! it lets a host tell a root cause (a timeout) from a consequence (a wait released
//! because another rank failed), so a world reports the former.
//!
//! On a timeout the program also sets `ABORT = 1 + rank` on every rank (first failure
//! wins), releasing the peers' waits. The launcher reads the record after the launch
//! and turns it into a [`CommFault`] ([`decode_record`]).

use std::time::Duration;

use crate::interp::ctrl;
use crate::ir::{CmpPred, OpKind};
use crate::{Function, Span};

/// The hidden parameters appended to a communicating kernel: (name, LLVM type).
pub const HIDDEN_PARAMS: [(&str, &str); 4] = [
    ("rank", "i32"),
    ("world_size", "i32"),
    (
        "heap_bases",
        "ptr (global address space) to world_size x u64",
    ),
    ("timeout_ns", "i64"),
];

/// Minimum alignment of every rank's heap base (bytes).
pub const HEAP_ALIGN: u64 = 256;

/// Error record: `1 +` the failed op's index in [`comm_sites`].
pub const ERR_SITE: usize = 2;
/// Error record: [`KIND_TIMEOUT`] or [`KIND_ABORTED`].
pub const ERR_KIND: usize = 3;
/// Error record: the expected value.
pub const ERR_EXPECTED: usize = 4;
/// Error record: the observed value.
pub const ERR_OBSERVED: usize = 5;
/// Error record: the program's linear id.
pub const ERR_PROGRAM: usize = 6;
/// [`ERR_KIND`]: the wait timed out.
pub const KIND_TIMEOUT: u64 = 1;
/// [`ERR_KIND`]: the wait gave up because another rank failed (`ABORT` was set).
pub const KIND_ABORTED: u64 = 2;

const _: () = assert!(ERR_PROGRAM < ctrl::WORDS && ctrl::ABORT < ERR_SITE);

/// Off-node peers (kernels compiled for an engine such as NVSHMEM): the heap-base
/// table entry of a peer that mapped memory cannot reach is this rank's own base plus
/// `(peer + 1) << OFF_NODE_SHIFT`, so `remote_ptr` (which adds `bases[peer] -
/// bases[rank]`) yields this rank's symmetric address with the peer in its top byte:
/// the address an engine's `put`/`get` take, and the peer to send it to. Device and
/// host virtual addresses are below 2^57, so a tag never collides with an address,
/// and a world with an engine has at most 255 ranks per tag byte
/// ([`MAX_TAGGED_RANKS`]).
pub const OFF_NODE_SHIFT: u32 = 56;

/// The variable naming an NVSHMEM installation (its `lib/` holds the device bitcode
/// and the host library): read by the compiler and the runtime.
pub const NVSHMEM_HOME_VAR: &str = "TESSERA_NVSHMEM_HOME";

/// Where NVSHMEM is looked for when [`NVSHMEM_HOME_VAR`] is not set: NVIDIA's Debian
/// packages (CUDA 12 and 13) and the usual prefixes (each searched in `lib/`, then
/// itself).
pub const NVSHMEM_SEARCH_PATH: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/nvshmem/12",
    "/usr/lib/x86_64-linux-gnu/nvshmem/13",
    "/usr/lib/aarch64-linux-gnu/nvshmem/12",
    "/usr/lib/aarch64-linux-gnu/nvshmem/13",
    "/usr/local/nvshmem",
    "/opt/nvidia/nvshmem",
];

/// The folders searched for NVSHMEM's files, in order: `$TESSERA_NVSHMEM_HOME/lib`
/// and `$TESSERA_NVSHMEM_HOME` when it is set, else those of [`NVSHMEM_SEARCH_PATH`].
pub fn nvshmem_dirs() -> Vec<std::path::PathBuf> {
    let roots: Vec<std::path::PathBuf> = match std::env::var_os(NVSHMEM_HOME_VAR) {
        Some(h) if !h.is_empty() => vec![h.into()],
        _ => NVSHMEM_SEARCH_PATH.iter().map(Into::into).collect(),
    };
    roots.into_iter().flat_map(|r| [r.join("lib"), r]).collect()
}

/// The most ranks a table with off-node tags can name.
pub const MAX_TAGGED_RANKS: usize = 255;

/// The heap-base table rank `rank` passes to a kernel compiled for an off-node
/// engine: `bases[r]` where `on_node(r)` holds, else the tagged entry of
/// [`OFF_NODE_SHIFT`]. `None` when the world is too large to tag or `rank` is outside
/// it.
pub fn tagged_bases(
    bases: &[u64],
    rank: usize,
    on_node: impl Fn(usize) -> bool,
) -> Option<Vec<u64>> {
    if bases.len() > MAX_TAGGED_RANKS || rank >= bases.len() {
        return None;
    }
    let me = bases[rank];
    Some(
        bases
            .iter()
            .enumerate()
            .map(|(r, &b)| {
                if r == rank || on_node(r) {
                    b
                } else {
                    me.wrapping_add(((r as u64) + 1) << OFF_NODE_SHIFT)
                }
            })
            .collect(),
    )
}

/// The values of the hidden parameters of one launch on one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HiddenArgs {
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world_size: u32,
    /// Device address of the table of `world_size` heap bases (`u64` each).
    pub heap_bases: u64,
    /// Wait timeout.
    pub timeout: Duration,
}

/// One hidden argument's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HiddenValue {
    /// A 32-bit value.
    U32(u32),
    /// A 64-bit value (addresses, the timeout).
    U64(u64),
}

impl HiddenArgs {
    /// The values to append after the user's arguments, in [`HIDDEN_PARAMS`] order.
    pub fn values(&self) -> [HiddenValue; 4] {
        let ns = u64::try_from(self.timeout.as_nanos()).unwrap_or(u64::MAX);
        [
            HiddenValue::U32(self.rank),
            HiddenValue::U32(self.world_size),
            HiddenValue::U64(self.heap_bases),
            // The kernel compares i64 differences: keep the timeout positive.
            HiddenValue::U64(ns.min(i64::MAX as u64)),
        ]
    }
}

/// The communication ops that can fail at run time (`wait_until`, `barrier_all`,
/// `remote_ptr`, `signal`, ... : every comm op), in a pre-order walk of the kernel:
/// (span, mnemonic). An error record's [`ERR_SITE`] is `1 +` an index here.
pub fn comm_sites(f: &Function) -> Vec<(Span, &'static str)> {
    let mut v = Vec::new();
    f.walk(&mut |op| {
        if op.kind.is_comm() {
            v.push((op.span.clone(), op.kind.mnemonic()));
        }
    });
    v
}

/// The comparison of the `wait_until` at site `i`, if it is one.
fn site_pred(f: &Function, i: usize) -> Option<CmpPred> {
    let mut k = 0;
    let mut out = None;
    f.walk(&mut |op| {
        if op.kind.is_comm() {
            if k == i
                && let OpKind::WaitUntil { pred, .. } = op.kind
            {
                out = Some(pred);
            }
            k += 1;
        }
    });
    out
}

/// A wait that failed on the device, decoded from a rank's error record.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CommFault {
    /// A `wait_until` or `barrier_all` timed out.
    #[error(
        "{span}: `{op}` in kernel `{kernel}` timed out after {:.3} s on rank {rank}, program {program}: waited for observed {pred} {expected}, last observed {observed}",
        timeout.as_secs_f64()
    )]
    Timeout {
        /// The kernel.
        kernel: String,
        /// The op's mnemonic.
        op: &'static str,
        /// Its source location.
        span: Span,
        /// The rank.
        rank: u32,
        /// The program's linear id.
        program: u64,
        /// The comparison (`>=` for `barrier_all`).
        pred: &'static str,
        /// The value waited for.
        expected: u64,
        /// The last value read.
        observed: u64,
        /// The timeout.
        timeout: Duration,
    },
    /// A wait gave up because another rank failed first.
    #[error(
        "{span}: `{op}` in kernel `{kernel}` on rank {rank}, program {program} was abandoned: rank {failed_rank} failed"
    )]
    Aborted {
        /// The kernel.
        kernel: String,
        /// The op's mnemonic.
        op: &'static str,
        /// Its source location.
        span: Span,
        /// The rank.
        rank: u32,
        /// The program's linear id.
        program: u64,
        /// The rank that failed first.
        failed_rank: u32,
    },
}

/// Decodes a rank's control words (at least `ERR_PROGRAM + 1` of them) after a launch
/// of `f`: `None` when no program of the launch gave up.
pub fn decode_record(
    f: &Function,
    rank: u32,
    words: &[u64],
    timeout: Duration,
) -> Option<CommFault> {
    let site = *words.get(ERR_SITE)?;
    if site == 0 || words.len() <= ERR_PROGRAM {
        return None;
    }
    let sites = comm_sites(f);
    let idx = (site - 1) as usize;
    let (span, op) = sites
        .get(idx)
        .cloned()
        .unwrap_or_else(|| (f.span.clone(), "kernel"));
    let program = words[ERR_PROGRAM];
    if words[ERR_KIND] == KIND_ABORTED {
        let abort = words[ctrl::ABORT];
        return Some(CommFault::Aborted {
            kernel: f.name.clone(),
            op,
            span,
            rank,
            program,
            failed_rank: abort.saturating_sub(1) as u32,
        });
    }
    Some(CommFault::Timeout {
        kernel: f.name.clone(),
        op,
        span,
        rank,
        program,
        pred: site_pred(f, idx).map_or(">=", CmpPred::symbol),
        expected: words[ERR_EXPECTED],
        observed: words[ERR_OBSERVED],
        timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{MemScope, ParamAttrs};
    use crate::{FunctionBuilder, ScalarType, Type};

    fn sp(line: u32) -> Span {
        Span::new("k.rs", line, 9)
    }

    /// `rank` (line 2), `wait_until ge` (line 3), `barrier_all` (line 4).
    fn kernel(with_comm: bool) -> Function {
        let mut b = FunctionBuilder::new("k", sp(1));
        let sig = b.param(
            "sig",
            Type::global_ptr(ScalarType::U64),
            ParamAttrs::default(),
        );
        if with_comm {
            b.op1(OpKind::Rank, &[], None, sp(2)).unwrap();
            let v = b
                .constant(
                    crate::ir::ConstValue::Int(7),
                    Type::scalar(ScalarType::U64),
                    sp(3),
                )
                .unwrap();
            let w = OpKind::WaitUntil {
                pred: CmpPred::Ge,
                scope: MemScope::System,
            };
            b.op1(w, &[sig, v], None, sp(3)).unwrap();
            b.op(OpKind::BarrierAll, &[], None, sp(4)).unwrap();
        }
        b.finish()
    }

    #[test]
    fn sites_are_the_comm_ops_in_order() {
        let f = kernel(true);
        let s = comm_sites(&f);
        let names: Vec<_> = s.iter().map(|(sp, op)| (sp.line, *op)).collect();
        assert_eq!(
            names,
            vec![(2, "rank"), (3, "wait_until"), (4, "barrier_all")]
        );
        assert!(comm_sites(&kernel(false)).is_empty());
    }

    #[test]
    fn records_decode_to_faults() {
        let f = kernel(true);
        let t = Duration::from_millis(1500);
        let mut w = [0u64; ctrl::WORDS];
        assert_eq!(decode_record(&f, 1, &w, t), None);
        w[ERR_SITE] = 2;
        w[ERR_KIND] = KIND_TIMEOUT;
        w[ERR_EXPECTED] = 7;
        w[ERR_OBSERVED] = 3;
        w[ERR_PROGRAM] = 5;
        let e = decode_record(&f, 1, &w, t).expect("a record");
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "k.rs:3:9: `wait_until` in kernel `k` timed out after 1.500 s on rank 1, program 5"
            ),
            "{msg}"
        );
        assert!(msg.contains("observed >= 7, last observed 3"), "{msg}");
        w[ERR_SITE] = 3;
        w[ERR_KIND] = KIND_ABORTED;
        w[ctrl::ABORT] = 3;
        let e = decode_record(&f, 0, &w, t).expect("a record");
        assert!(matches!(
            e,
            CommFault::Aborted {
                op: "barrier_all",
                failed_rank: 2,
                rank: 0,
                ..
            }
        ));
    }

    #[test]
    fn hidden_values_follow_the_abi() {
        let h = HiddenArgs {
            rank: 3,
            world_size: 4,
            heap_bases: 0x1000,
            timeout: Duration::from_secs(2),
        };
        assert_eq!(
            h.values(),
            [
                HiddenValue::U32(3),
                HiddenValue::U32(4),
                HiddenValue::U64(0x1000),
                HiddenValue::U64(2_000_000_000)
            ]
        );
        let forever = HiddenArgs {
            timeout: Duration::MAX,
            ..h
        };
        assert_eq!(forever.values()[3], HiddenValue::U64(i64::MAX as u64));
    }
}
