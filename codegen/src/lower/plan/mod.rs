//! Plans: what the SIMT lowering decides about a kernel before it emits anything,
//! kept as data.
//!
//! [`build`] runs the planning steps in order over the kernel (after
//! [`crate::pipeline`]) and returns a [`Plan`], which the lowering reads and never
//! changes:
//!
//! 1. `hints.rs`: layouts for loop-carried values, so they cross the back edge in the
//!    layout their producer makes: a `dot`'s accumulator layout, or the sliced layout
//!    of a running row statistic of one ([`Plan::hints`], [`Plan::parents`]);
//! 2. `staging.rs`: shared memory for the `local_alloc` arrays ([`Plan::locals`]) and
//!    for the `dot`s whose operands a loop keeps in the `dot`'s own arrays: carried
//!    operands ([`Plan::staged`]) and loop-invariant ones ([`Plan::invariant`]);
//! 3. `ring.rs` (called by staging for each loop, on targets with asynchronous
//!    copies): the rings of arrays that `cp.async` or TMA copies fill ahead of a
//!    loop's `dot` ([`Plan::async_dots`], [`Plan::async_loads`], [`Plan::async_args`]),
//!    and on sm_90a whether one such loop is warp-specialized ([`Plan::warp_spec`]:
//!    at the kernel's top level, or inside a top-level loop over tiles of a
//!    persistent kernel), with `cluster.rs` deciding which of its operands a
//!    thread-block cluster multicasts.
//!
//! Shared memory is laid out in the order planned: the local arrays, then each
//! `dot`'s arrays or ring ([`Plan::pipe_dots`], [`Plan::pipe_bytes`] in all), then
//! the scratch of conversions and reductions, which the lowering sizes as it goes
//! (`smem.rs`). [`Plan::notes`] states each decision at its op; `TESSERA_DUMP=layout`
//! ([`super::lower_with_layouts`]) prints them with the layouts, and the layout
//! filetests (`tests/filetests/layout/`) check them.

use std::collections::{HashMap, HashSet};

use tessera_ir::ir::{Op, OpKind};
use tessera_ir::{Function, Span, ValueId};

use super::Lowerer;
use crate::layout::Layout;

mod cluster;
mod hints;
mod ring;
mod staging;

pub(crate) use ring::{AsyncDot, AsyncSlot};

/// The lowering's decisions about one kernel, made before it emits code.
///
/// Ops are keyed by address: a plan belongs to the [`Function`] it was built from.
#[derive(Default)]
pub(crate) struct Plan<'a> {
    /// Layouts for loop-carried values (region arguments of `for` bodies).
    pub hints: HashMap<ValueId, Layout>,
    /// For hinted values that are slices of a `dot`'s accumulator: that accumulator
    /// layout (broadcasting back to it is a register renaming).
    pub parents: HashMap<ValueId, Layout>,
    /// Where each `local_alloc` array starts, past the start of shared memory.
    pub locals: HashMap<*const Op, u32>,
    /// Loop-carried `dot` operands kept in the `dot`'s shared arrays instead of
    /// registers: the region argument, the `dot` and the operand index.
    pub staged: HashMap<ValueId, (&'a Op, usize)>,
    /// Operands of matrix-path `dot`s in a loop that are defined before the loop:
    /// written into the `dot`'s own arrays once, before the loop (`(dot, which)`).
    pub invariant: HashSet<(*const Op, usize)>,
    /// Where each of those `dot`s' arrays (or ring) start, past the start of shared
    /// memory.
    pub pipe_dots: HashMap<*const Op, u32>,
    /// Loop `dot`s whose staged operands alternate between two copies of their
    /// arrays (`staging.rs`): where the second copy starts. Iteration `i` reads copy
    /// `i % 2` while the next iteration's tiles are written into the other, so the
    /// iteration needs one barrier (after those writes) instead of two.
    pub double: HashMap<*const Op, u32>,
    /// Shared memory the planned arrays take (scratch comes after).
    pub pipe_bytes: u32,
    /// The staging box of the TMA stores (`desc_store`) of a kernel that stores in a
    /// loop (a persistent kernel's epilogue): its own shared memory, so a store's
    /// read of it may go on past the store (its wait is deferred to the next store,
    /// or the kernel's end) while the next tile computes (`tma.rs`).
    pub store_staging: Option<u32>,
    /// `dot`s whose operands arrive by asynchronous copies into a ring of arrays.
    pub async_dots: HashMap<*const Op, AsyncDot>,
    /// The loads that become asynchronous copies: their `dot`, operand, and slot.
    pub async_loads: HashMap<ValueId, (&'a Op, usize, AsyncSlot)>,
    /// Region arguments of those pipelines (they hold nothing in registers).
    pub async_args: HashSet<ValueId>,
    /// The first planned array's op, blamed when shared memory runs out.
    pub first_array: Option<Span>,
    /// The loop whose TMA ring is warp-specialized, if any (`ring.rs`).
    pub warp_spec: Option<WarpSpec>,
}

/// A warp-specialized ring loop (sm_90a): the block gets a producer warpgroup past
/// its `num_warps` consumer warps. Before the loop every thread runs the kernel (it
/// is scalars and the prologue's copies); at the loop the producer warpgroup gives
/// registers back (`setmaxnreg.dec`) and one thread of it runs the loop's `slice`
/// only, each iteration waiting for the consumers to release the slot it refills
/// (the `empty` mbarriers, one per slot after the ring's `bars`, `num_warps`
/// arrivals each) and issuing the copies on the slot's full mbarrier; then it
/// leaves. The consumers take registers (`setmaxnreg.inc`), run the loop without
/// its copies, waiting for each slot's full mbarrier, one lane per warp arriving on
/// the empty mbarrier of the slot whose `wgmma` groups retired, and run the rest
/// of the kernel, with named barrier 1 of their `num_warps * warp size` threads
/// for the block barrier.
pub(crate) struct WarpSpec {
    /// The `for`.
    pub for_op: *const Op,
    /// Its ring's `dot`.
    pub dot: *const Op,
    /// The body's ops the producer lowers: the ring's loads and what computes
    /// their coordinates and predicates.
    pub slice: HashSet<*const Op>,
    /// Byte offset of the empty mbarriers.
    pub empty: u32,
    /// Per operand (A, B): the clustered axes along which the blocks of a cluster
    /// share its copies, multicast (`cluster.rs`; 0: each block copies its own).
    pub multicast: [u8; 2],
    /// A persistent kernel: the top-level `for` (walking the tiles) whose body holds
    /// the ring's loop, where the block splits; the producer runs its own copy of
    /// that loop, lowering `outer_slice` of its body (the scalars the ring's loop
    /// needs) and the ring's loop, issuing every fill of each tile itself (the
    /// prologue's loads are not lowered), its ring position carried across tiles
    /// like the consumers' (`spec.rs`).
    pub outer: Option<*const Op>,
    /// The body ops of `outer` the producer lowers.
    pub outer_slice: HashSet<*const Op>,
    /// Consumer groups (`plan_groups`): 1, or 2 in a persistent kernel whose
    /// consumers ping-pong. Each group is `num_warps` warps lowered as the kernel's
    /// block (thread and warp numbers within the group, its own named barrier,
    /// scratch and store staging box); group `g` computes the tiles `g, g + 2, ...`
    /// of the block's walk, the producer filling the ring for every tile in order,
    /// and skips the other group's fills; the groups' main loops take turns on
    /// two named barriers, so one group's `wgmma`s run while the other stores its
    /// tile (`spec.rs`).
    pub groups: u32,
}

impl WarpSpec {
    /// Whether any operand is multicast in the cluster.
    pub fn multicasts(&self) -> bool {
        self.multicast != [0, 0]
    }

    /// The cluster ranks (a bit each) whose copies land in the block of rank `rank`
    /// (itself included): the union of its operands' groups, whose consumers
    /// release each slot to it.
    pub fn neighbours(&self, cluster: [u32; 3], rank: u32) -> u32 {
        tessera_ir::cluster::groups(cluster, &self.multicast, rank)
    }
}

/// Builds the plan of `l`'s kernel (see the module docs for the steps).
pub(super) fn build<'a>(l: &Lowerer<'a, '_>) -> Plan<'a> {
    let mut p = Planner {
        l,
        plan: Plan::default(),
    };
    let f = l.f;
    p.compute_hints(&f.body);
    p.plan_locals();
    p.plan_staging(&f.body);
    p.plan_store_staging();
    p.plan_groups();
    p.plan
}

/// A plan being built: the lowerer is read for the target's facts (matrix
/// instructions, staging sizes, what an asynchronous copy can do), never changed.
struct Planner<'p, 'a, 'ctx> {
    l: &'p Lowerer<'a, 'ctx>,
    plan: Plan<'a>,
}

const OPERAND: [&str; 2] = ["A", "B"];

impl Planner<'_, '_, '_> {
    /// Reserves the TMA stores' staging box ([`Plan::store_staging`]) when a TMA
    /// `desc_store` (those left after descriptor expansion are TMA's) sits in a
    /// loop of a kernel that does not communicate (whose every exit is the end).
    fn plan_store_staging(&mut self) {
        let f = self.l.f;
        if f.uses_comm() {
            return;
        }
        fn go(r: &tessera_ir::ir::Region, f: &Function, depth: u32, max: &mut u32) {
            for op in &r.ops {
                if depth > 0
                    && let OpKind::DescStore { rank } = op.kind
                    && let Ok(d) = tessera_ir::ir::DescOperands::new(rank)
                {
                    let t = f.ty(op.operands[d.extra()]);
                    let e = t.scalar_type().map_or(0, |s| s.size_bytes() as u32);
                    *max = (*max).max(e * t.shape.iter().product::<u32>());
                }
                let inner = depth + u32::from(matches!(op.kind, OpKind::For | OpKind::While));
                for sub in &op.regions {
                    go(sub, f, inner, max);
                }
            }
        }
        let mut bytes = 0;
        go(&f.body, f, 0, &mut bytes);
        if bytes > 0 {
            let align = self.l.smem_align();
            let at = self.plan.pipe_bytes.next_multiple_of(align);
            self.plan.store_staging = Some(at);
            self.plan.pipe_bytes = (at + bytes).next_multiple_of(align);
        }
    }
}

impl Planner<'_, '_, '_> {
    /// Whether a persistent warp-specialized kernel's consumers ping-pong
    /// ([`WarpSpec::groups`]): `CompileOptions::consumer_groups` (`Some(1)`: never),
    /// where the block's warps are one warpgroup (its layouts are one group's), a
    /// second group fits the block, no operand is multicast, and shared memory
    /// holds nothing a group would share besides the ring (each group has its own
    /// store staging box and scratch). The compiler's choice (`None`) also wants
    /// the accumulator in at most 128 registers per thread and the second staging
    /// box within the target's shared memory.
    fn plan_groups(&mut self) {
        let l = self.l;
        let Some(w) = self.plan.warp_spec.as_ref() else {
            return;
        };
        if l.consumer_groups == Some(1)
            || w.outer.is_none()
            || w.multicasts()
            || l.nw != 4
            || (2 * l.nw + 4) * l.ws > 1024
            || !self.plan.locals.is_empty()
            || !self.plan.invariant.is_empty()
            || self.plan.pipe_dots.keys().any(|&d| d != w.dot)
        {
            return;
        }
        if l.consumer_groups.is_none() {
            // Accumulator registers per thread.
            let mut acc = u32::MAX;
            l.f.walk(&mut |o| {
                if std::ptr::eq(o, w.dot) {
                    acc = l.f.ty(o.results[0]).shape.iter().product::<u32>() / (l.nw * l.ws);
                }
            });
            let staging = self
                .plan
                .store_staging
                .map_or(0, |at| self.plan.pipe_bytes - at);
            if acc > 128 || self.plan.pipe_bytes + staging > l.target().shared_memory_limit() {
                return;
            }
        }
        if let Some(w) = self.plan.warp_spec.as_mut() {
            w.groups = 2;
        }
    }
}

impl Plan<'_> {
    /// One line per decision, at the op it concerns, in program order: arrays in
    /// shared memory, operands kept there, rings and the loads that fill them, and
    /// the layouts of loop-carried values.
    pub(super) fn notes(&self, f: &Function) -> HashMap<*const Op, Vec<String>> {
        let mut notes: HashMap<*const Op, Vec<String>> = HashMap::new();
        let mut first = true;
        f.walk(&mut |op| {
            let key = op as *const Op;
            let mut out = Vec::new();
            if std::mem::take(&mut first) && self.pipe_bytes > 0 {
                out.push(format!(
                    "plan: {} bytes of shared arrays before the scratch",
                    self.pipe_bytes
                ));
            }
            if let Some(off) = self.locals.get(&key) {
                out.push(format!("plan: this array at shared byte {off}"));
            }
            if op.kind == OpKind::For {
                if let Some(w) = self.warp_spec.as_ref().filter(|w| w.outer == Some(key)) {
                    out.push(format!(
                        "plan: persistent and warp-specialized: the block splits before this loop; the producer walks the same tiles ({} ops of the body), issuing every fill of its ring loop, the ring's position carried across tiles",
                        w.outer_slice.len()
                    ));
                    if w.groups > 1 {
                        out.push(format!(
                            "plan: ping-pong: {} consumer groups take alternate tiles, each skipping the other's fills, their main loops taking turns",
                            w.groups
                        ));
                    }
                }
                if let Some(w) = self.warp_spec.as_ref().filter(|w| w.for_op == key) {
                    out.push(format!(
                        "plan: warp-specialized: a producer warpgroup issues the ring's copies ({} ops of the body), the consumer warps release each slot on its empty mbarrier (at byte {})",
                        w.slice.len(),
                        w.empty
                    ));
                }
                let body = &op.regions[0];
                for (j, a) in body.args.iter().enumerate().skip(1) {
                    let which = j - 1;
                    if let Some(l) = self.hints.get(a) {
                        out.push(format!("plan: carried value {which} in layout {l}"));
                    }
                    if let Some((_, w)) = self.staged.get(a) {
                        out.push(format!(
                            "plan: carried value {which} kept in its dot's shared arrays (operand {})",
                            OPERAND[*w]
                        ));
                    } else if self.async_args.contains(a) {
                        out.push(format!(
                            "plan: carried value {which} stays in its ring (nothing in registers)"
                        ));
                    }
                }
            }
            if op.kind == OpKind::Dot {
                if let Some(off) = self.pipe_dots.get(&key) {
                    out.push(format!("plan: this dot's shared arrays at byte {off}"));
                }
                for (w, name) in OPERAND.iter().enumerate() {
                    if self.invariant.contains(&(key, w)) {
                        out.push(format!(
                            "plan: operand {name} written into them once, before the loop"
                        ));
                    }
                }
                if let Some(r) = self.async_dots.get(&key) {
                    let mut s = format!(
                        "plan: a ring of {} slots of {} bytes, {} iteration(s) ahead",
                        r.slots, r.slot_bytes, r.ahead
                    );
                    if r.tma > 0 {
                        s += &format!(
                            ", {} operand(s) by TMA with mbarriers at byte {}",
                            r.tma, r.bars
                        );
                    }
                    if let Some(j) = r.overlap {
                        s += &format!(
                            ", the accumulator (carried value {}) left in flight",
                            j - 1
                        );
                    }
                    out.push(s);
                }
            }
            if let Some(&v) = op.results.first()
                && let Some((_, w, slot)) = self.async_loads.get(&v)
            {
                let slot = match slot {
                    AsyncSlot::Fixed(s) => format!("slot {s}"),
                    AsyncSlot::Next => "the slot being filled".to_string(),
                };
                out.push(format!(
                    "plan: copied asynchronously into {slot} of its dot's ring (operand {})",
                    OPERAND[*w]
                ));
            }
            if !out.is_empty() {
                notes.entry(key).or_default().extend(out);
            }
        });
        notes
    }
}
