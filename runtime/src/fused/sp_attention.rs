//! Sequence-parallel attention: FlashAttention-2 forward over a sequence sharded
//! across the ranks of a world, with the keys and values gathered inside the kernel.
//!
//! Rank `r` holds rows `r*sq ..` of the queries and rows `r*sk ..` of the keys and
//! values (`[heads][rows][HD]` row-major each) and computes its queries' output over
//! every rank's keys. [`sp_attention_kernel`] fuses the all-gather of `K` and `V`
//! into the attention:
//!
//! 1. each program pushes chunks of `BN` local key/value rows to every peer (`put`
//!    into the peer's symmetric `kv_full`, to `rank+1` first so that the ranks form a
//!    ring at each step) and signals each chunk to that peer;
//! 2. each program then takes query tiles: it attends to the local keys first (no
//!    waiting), then to the peers' in the order they arrive (`rank-1` first), waiting
//!    for each chunk's signal only when it reaches that chunk;
//! 3. a closing barrier of the team: a rank reads only its own `kv_full`, which its
//!    peers write, so the next run's pushes must wait until every rank is done
//!    reading this run's.
//!
//! The online softmax does not depend on the order of the key blocks except through
//! rounding, so the result equals single-device attention over the gathered
//! sequence up to f32 rounding. With `causal`, query `i` of rank `r` (global row
//! `r*sq + i`) attends to global keys `j <= r*sq + i`: blocks past a tile's last row
//! are skipped, and a chunk a tile never reads is never waited for.
//!
//! [`SpAttention`] is the plan (its symmetric workspace allocated once per rank, run
//! any number of times); [`AllGatherThenAttention`] is the unfused sequence it is
//! compared with (the collectives library's all-gather of `K` and `V`, then
//! [`crate::attention::attention_fwd`]-style attention over the gathered keys).

use crate::fused::{MAX_PROGRAMS, check_len, comm_err, programs_for};
use crate::prelude::*;
use crate::{Error, Rank};

/// Query rows per program tile.
pub const BM: usize = 64;
/// Keys per block (and rows per pushed chunk).
pub const BN: usize = 64;

/// One block of the online softmax: the scores of `qt` against `kt` (`HD x BN`,
/// scaled to the log2 domain), masked by `ok`, folded into the running row maximum
/// `m_i`, row sum `l_i` and output accumulator `acc` with the values `vt`.
#[helper]
#[allow(clippy::too_many_arguments)]
fn attend_block<T: DotInput<Acc = f32>, const BM: usize, const BN: usize, const HD: usize>(
    qt: Tile<T, S2<BM, HD>>,
    kt: Tile<T, S2<HD, BN>>,
    vt: Tile<T, S2<BN, HD>>,
    ok: Tile<bool, S2<BM, BN>>,
    scale_log2: Scalar<f32>,
    m_i: Tile<f32, S1<BM>>,
    l_i: Tile<f32, S1<BM>>,
    acc: Tile<f32, S2<BM, HD>>,
) -> (Tile<f32, S1<BM>>, Tile<f32, S1<BM>>, Tile<f32, S2<BM, HD>>) {
    let s = dot(qt, kt, zeros::<f32, S2<BM, BN>>()) * scale_log2;
    let s = select(ok, s, -1.0e30f32);
    let m_new = m_i.maximum(s.max::<1>());
    let p = (s - m_new.expand_dims::<1>()).exp2();
    let alpha = (m_i - m_new).exp2();
    let l_new = l_i * alpha + p.sum::<1>();
    let acc = dot(p.cast::<T>(), vt, acc * alpha.expand_dims::<1>());
    (m_new, l_new, acc)
}

/// Sequence-parallel attention, one rank's part (see the module docs).
///
/// `q`, `o`: this rank's `[heads][sq][HD]` queries and output; `k`, `v`: its
/// `[heads][sk][HD]` keys and values. `kv_full` (symmetric, `2 * world_size * heads *
/// sk * HD`) receives every peer's keys, then values, at `[source][head][row]`; `sig`
/// holds `world_size * heads * nchunk + 1` words (`nchunk = ceil(sk / BN)`): word
/// `(s*heads + h)*nchunk + c` is set to `epoch` once chunk `c` of head `h` of rank
/// `s` is here; the last word is the closing barrier's. `causal` is 0 or 1.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn sp_attention_kernel<
    T: DotInput<Acc = f32>,
    const BM: usize,
    const BN: usize,
    const HD: usize,
>(
    q: &Global<T>,
    k: &Global<T>,
    v: &Global<T>,
    o: &mut Global<T>,
    kv_full: &mut Symmetric<T>,
    sig: &mut Symmetric<u64>,
    heads: i32,
    sq: i32,
    sk: i32,
    scale_log2: f32,
    causal: i32,
    epoch: u64,
) {
    let me = rank();
    let ws = world_size();
    let pid = program_id(0);
    let np = num_programs(0);
    let nchunk = (sk + (BN as i32 - 1)) / BN as i32;
    let nqt = (sq + (BM as i32 - 1)) / BM as i32;
    let dc = arange::<HD>().expand_dims::<0>(); // 1 x HD
    let dr = arange::<HD>().expand_dims::<1>(); // HD x 1
    let plane = ws * heads * sk * HD as i32; // where the values start in `kv_full`

    // 1. Push this rank's keys and values, chunk by chunk, to every peer.
    for t in (pid..heads * nchunk).step_by(np) {
        let h = t / nchunk;
        let r = ((t % nchunk) * BN as i32 + arange::<BN>()).expand_dims::<1>(); // BN x 1
        let mask = r.lt(sk) & dc.lt(HD as i32);
        let src = (h * sk + r) * HD as i32 + dc;
        let kb = k.load(src, mask);
        let vb = v.load(src, mask);
        let dst = ((me * heads + h) * sk + r) * HD as i32 + dc;
        for i in 1..ws {
            let peer = (me + i) % ws;
            kv_full.put_nbi(peer, dst, kb, mask);
            kv_full.put_nbi(peer, plane + dst, vb, mask);
        }
        for i in 1..ws {
            sig.signal((me + i) % ws, me * heads * nchunk + t, epoch, SignalOp::Set);
        }
    }

    // 2. Query tiles: local keys first, then each peer's as its chunks arrive.
    let not_causal = 1 - causal;
    for t in (pid..heads * nqt).step_by(np) {
        let h = t / nqt;
        let rm = ((t % nqt) * BM as i32 + arange::<BM>()).expand_dims::<1>(); // BM x 1
        let q_off = (h * sq + rm) * HD as i32 + dc;
        let q_mask = rm.lt(sq) & dc.lt(HD as i32);
        let qt = q.load(q_off, q_mask);
        // The global row of each query, and the last global key a row sees.
        let last_key = me * sq + rm + not_causal * ws * sk; // BM x 1
        let tile_last = me * sq + ((t % nqt) + 1) * BM as i32 - 1 + not_causal * ws * sk;
        let mut m_i = full::<f32, S1<BM>>(-1.0e30);
        let mut l_i = zeros::<f32, S1<BM>>();
        let mut acc = zeros::<f32, S2<BM, HD>>();
        // The local keys: here already. Global key `me*sk + j` for local row `j`;
        // the tile sees those up to `tile_last`.
        let hi = sk.minimum((tile_last - me * sk + 1).maximum(0));
        for n0 in (0..hi).step_by(BN) {
            let rn = n0 + arange::<BN>();
            let kc = rn.expand_dims::<0>(); // 1 x BN
            let kr = rn.expand_dims::<1>(); // BN x 1
            let kt = k.load((h * sk + kc) * HD as i32 + dr, kc.lt(sk) & dr.lt(HD as i32));
            let vt = v.load((h * sk + kr) * HD as i32 + dc, kr.lt(sk) & dc.lt(HD as i32));
            let ok = last_key.ge(me * sk + kc) & kc.lt(sk);
            let (m, l, a) =
                attend_block::<T, BM, BN, HD>(qt, kt, vt, ok, scale_log2, m_i, l_i, acc);
            m_i = m;
            l_i = l;
            acc = a;
        }
        // The peers' keys, rank-1 first (the order the ring delivers them), each
        // block once its chunk's signal says it is here.
        for i in 1..ws {
            let s = (me + ws - i) % ws;
            let hi = sk.minimum((tile_last - s * sk + 1).maximum(0));
            let rows = (s * heads + h) * sk; // the source's first row in `kv_full`
            let word = (s * heads + h) * nchunk;
            for n0 in (0..hi).step_by(BN) {
                sig.wait_until(word + n0 / BN as i32, CmpPred::Ge, epoch);
                let rn = n0 + arange::<BN>();
                let kc = rn.expand_dims::<0>(); // 1 x BN
                let kr = rn.expand_dims::<1>(); // BN x 1
                let kt = kv_full.load((rows + kc) * HD as i32 + dr, kc.lt(sk) & dr.lt(HD as i32));
                let vt = kv_full.load(
                    plane + (rows + kr) * HD as i32 + dc,
                    kr.lt(sk) & dc.lt(HD as i32),
                );
                let ok = last_key.ge(s * sk + kc) & kc.lt(sk);
                let (m, l, a) =
                    attend_block::<T, BM, BN, HD>(qt, kt, vt, ok, scale_log2, m_i, l_i, acc);
                m_i = m;
                l_i = l;
                acc = a;
            }
        }
        o.store(q_off, (acc / l_i.expand_dims::<1>()).cast::<T>(), q_mask);
    }

    // Nobody pushes the next run's chunks before every rank is done with these.
    crate::fused::team_barrier(sig, ws * heads * nchunk, crate::fused::arrivals(epoch));
}

/// The unfused counterpart, step 1: every rank's keys and values into every rank's
/// `kv_full` (the rank's own too), `[source][head][row][HD]` keys then values, between
/// two barriers of the team on `sig[0]` (nobody overwrites a peer's `kv_full` while
/// it may still read the previous run's, and everything is there on return).
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn gather_kv_kernel<T: DotInput<Acc = f32>, const BN: usize, const HD: usize>(
    k: &Global<T>,
    v: &Global<T>,
    kv_full: &mut Symmetric<T>,
    sig: &mut Symmetric<u64>,
    heads: i32,
    sk: i32,
    epoch: u64,
) {
    let me = rank();
    let ws = world_size();
    let pid = program_id(0);
    let np = num_programs(0);
    let nchunk = (sk + (BN as i32 - 1)) / BN as i32;
    let dc = arange::<HD>().expand_dims::<0>();
    let plane = ws * heads * sk * HD as i32;
    crate::fused::team_barrier(sig, 0, crate::fused::arrivals(epoch * 2 - 1));
    for t in (pid..heads * nchunk).step_by(np) {
        let h = t / nchunk;
        let r = ((t % nchunk) * BN as i32 + arange::<BN>()).expand_dims::<1>();
        let mask = r.lt(sk) & dc.lt(HD as i32);
        let src = (h * sk + r) * HD as i32 + dc;
        let (kb, vb) = (k.load(src, mask), v.load(src, mask));
        let dst = ((me * heads + h) * sk + r) * HD as i32 + dc;
        for i in 0..ws {
            kv_full.put_nbi((me + i) % ws, dst, kb, mask);
            kv_full.put_nbi((me + i) % ws, plane + dst, vb, mask);
        }
    }
    crate::fused::team_barrier(sig, 0, crate::fused::arrivals(epoch * 2));
}

/// The unfused counterpart, step 2: attention of this rank's queries over the
/// gathered keys and values (one program per `BM`-row tile and head, grid
/// `(ceil(sq/BM), heads)`), the sources in the fused kernel's order (this rank,
/// then rank-1, ...) and with its block code, so the results agree bit for bit.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn gathered_attention_kernel<
    T: DotInput<Acc = f32>,
    const BM: usize,
    const BN: usize,
    const HD: usize,
>(
    q: &Global<T>,
    kv_full: &Symmetric<T>,
    o: &mut Global<T>,
    heads: i32,
    sq: i32,
    sk: i32,
    scale_log2: f32,
    causal: i32,
) {
    let me = rank();
    let ws = world_size();
    let qt_i = program_id(0);
    let h = program_id(1);
    let dc = arange::<HD>().expand_dims::<0>();
    let dr = arange::<HD>().expand_dims::<1>();
    let plane = ws * heads * sk * HD as i32;
    let rm = (qt_i * BM as i32 + arange::<BM>()).expand_dims::<1>();
    let q_off = (h * sq + rm) * HD as i32 + dc;
    let q_mask = rm.lt(sq) & dc.lt(HD as i32);
    let qt = q.load(q_off, q_mask);
    let not_causal = 1 - causal;
    let last_key = me * sq + rm + not_causal * ws * sk;
    let tile_last = me * sq + (qt_i + 1) * BM as i32 - 1 + not_causal * ws * sk;
    let mut m_i = full::<f32, S1<BM>>(-1.0e30);
    let mut l_i = zeros::<f32, S1<BM>>();
    let mut acc = zeros::<f32, S2<BM, HD>>();
    for i in 0..ws {
        let s = (me + ws - i) % ws;
        let hi = sk.minimum((tile_last - s * sk + 1).maximum(0));
        let rows = (s * heads + h) * sk;
        for n0 in (0..hi).step_by(BN) {
            let rn = n0 + arange::<BN>();
            let kc = rn.expand_dims::<0>();
            let kr = rn.expand_dims::<1>();
            let kt = kv_full.load((rows + kc) * HD as i32 + dr, kc.lt(sk) & dr.lt(HD as i32));
            let vt = kv_full.load(
                plane + (rows + kr) * HD as i32 + dc,
                kr.lt(sk) & dc.lt(HD as i32),
            );
            let ok = last_key.ge(s * sk + kc) & kc.lt(sk);
            let (m, l, a) =
                attend_block::<T, BM, BN, HD>(qt, kt, vt, ok, scale_log2, m_i, l_i, acc);
            m_i = m;
            l_i = l;
            acc = a;
        }
    }
    o.store(q_off, (acc / l_i.expand_dims::<1>()).cast::<T>(), q_mask);
}

/// The shape of a sequence-parallel attention: per rank, `heads` heads of `sq` query
/// rows and `sk` key/value rows, head dimension `HD` (a const parameter of the
/// plans), causal or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpShape {
    /// Heads (batch × heads).
    pub heads: usize,
    /// Query rows per rank.
    pub sq: usize,
    /// Key and value rows per rank.
    pub sk: usize,
    /// Query `i` of rank `r` sees global keys `j <= r*sq + i` (else every key).
    pub causal: bool,
}

fn check(rank: &Rank, what: &str, s: &SpShape, hd: usize) -> Result<(), Error> {
    let ws = rank.size() as usize;
    let err = |m: String| comm_err(rank, format!("{what}: {m}"));
    if s.heads == 0 || s.sq == 0 || s.sk == 0 {
        return Err(err(format!("needs a nonempty shape, got {s:?}")));
    }
    if s.causal && s.sq != s.sk {
        // Every query then sees at least its own position's key.
        return Err(err(format!(
            "causal attention needs as many query as key rows per rank, got {} and {}",
            s.sq, s.sk
        )));
    }
    let big = 2 * ws * s.heads * s.sk.max(s.sq) * hd;
    if i32::try_from(big).is_err() {
        return Err(err(format!("{big} elements do not fit in i32 offsets")));
    }
    Ok(())
}

/// Sequence-parallel attention with the keys and values gathered inside the kernel
/// ([`sp_attention_kernel`]): a plan built once per rank (collective), run any
/// number of times. `HD` is the head dimension (64 or 128).
pub struct SpAttention<T: crate::fused::GemmElem, const HD: usize> {
    shape: SpShape,
    kv_full: SymBuffer<T>,
    sig: SymBuffer<u64>,
    epoch: u64,
    programs: u32,
}

impl<T: crate::fused::GemmElem, const HD: usize> std::fmt::Debug for SpAttention<T, HD> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SpAttention<{}, {HD}>({:?}, {} programs, epoch {})",
            T::TY,
            self.shape,
            self.programs,
            self.epoch
        )
    }
}

impl<T: crate::fused::GemmElem, const HD: usize> SpAttention<T, HD> {
    /// Plans it for `shape` (collective: every rank calls it with the same shape, in
    /// the same order as its other symmetric allocations): allocates the gathered
    /// keys and values and the signal words.
    #[track_caller]
    pub fn new(rank: &Rank, shape: SpShape) -> Result<SpAttention<T, HD>, Error> {
        Self::new_impl(rank, shape).map_err(Error::in_call("SpAttention::new"))
    }

    fn new_impl(rank: &Rank, shape: SpShape) -> Result<SpAttention<T, HD>, Error> {
        check(rank, "SpAttention", &shape, HD)?;
        let ws = rank.size() as usize;
        let nchunk = shape.sk.div_ceil(BN);
        let kv_full = rank.alloc::<T>(2 * ws * shape.heads * shape.sk * HD)?;
        let sig = rank.alloc_signals(ws * shape.heads * nchunk + 1)?;
        rank.barrier()?;
        let work = shape.heads * shape.sq.div_ceil(BM).max(nchunk);
        Ok(SpAttention {
            shape,
            kv_full,
            sig,
            epoch: 0,
            programs: programs_for(rank, work, MAX_PROGRAMS),
        })
    }

    /// Runs on every rank (collective): `q` and `o` are this rank's `[heads][sq][HD]`
    /// queries and output, `k` and `v` its `[heads][sk][HD]` keys and values; `scale`
    /// multiplies the scores (usually `1/sqrt(HD)`).
    #[track_caller]
    pub fn run(
        &mut self,
        rank: &Rank,
        q: &Buffer<T>,
        k: &Buffer<T>,
        v: &Buffer<T>,
        o: &mut Buffer<T>,
        scale: f32,
    ) -> Result<(), Error>
    where
        sp_attention_kernel<T, BM, BN, HD>: Kernel<Comptime = ()>,
    {
        self.run_impl(rank, q, k, v, o, scale)
            .map_err(Error::in_call("SpAttention::run"))
    }

    fn run_impl(
        &mut self,
        rank: &Rank,
        q: &Buffer<T>,
        k: &Buffer<T>,
        v: &Buffer<T>,
        o: &mut Buffer<T>,
        scale: f32,
    ) -> Result<(), Error>
    where
        sp_attention_kernel<T, BM, BN, HD>: Kernel<Comptime = ()>,
    {
        let s = self.shape;
        check_len("SpAttention: q", q, s.heads * s.sq * HD)?;
        check_len("SpAttention: k", k, s.heads * s.sk * HD)?;
        check_len("SpAttention: v", v, s.heads * s.sk * HD)?;
        check_len("SpAttention: o", o, s.heads * s.sq * HD)?;
        self.epoch += 1;
        sp_attention_kernel::<T, BM, BN, HD>::launch(
            rank.device(),
            self.programs,
            (
                q,
                k,
                v,
                o,
                &mut self.kv_full,
                &mut self.sig,
                s.heads as i32,
                s.sq as i32,
                s.sk as i32,
                scale * crate::attention::LOG2_E,
                i32::from(s.causal),
                self.epoch,
            ),
        )
    }
}

/// The unfused sequence [`SpAttention`] is compared with: all-gather the keys and
/// values ([`gather_kv_kernel`]), then attention over the gathered sequence
/// ([`gathered_attention_kernel`]).
pub struct AllGatherThenAttention<T: crate::fused::GemmElem, const HD: usize> {
    shape: SpShape,
    kv_full: SymBuffer<T>,
    sig: SymBuffer<u64>,
    epoch: u64,
}

impl<T: crate::fused::GemmElem, const HD: usize> std::fmt::Debug for AllGatherThenAttention<T, HD> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AllGatherThenAttention<{}, {HD}>({:?}, epoch {})",
            T::TY,
            self.shape,
            self.epoch
        )
    }
}

impl<T: crate::fused::GemmElem, const HD: usize> AllGatherThenAttention<T, HD> {
    /// Plans it for `shape` (collective), like [`SpAttention::new`].
    #[track_caller]
    pub fn new(rank: &Rank, shape: SpShape) -> Result<AllGatherThenAttention<T, HD>, Error> {
        Self::new_impl(rank, shape).map_err(Error::in_call("AllGatherThenAttention::new"))
    }

    fn new_impl(rank: &Rank, shape: SpShape) -> Result<AllGatherThenAttention<T, HD>, Error> {
        check(rank, "AllGatherThenAttention", &shape, HD)?;
        let ws = rank.size() as usize;
        let kv_full = rank.alloc::<T>(2 * ws * shape.heads * shape.sk * HD)?;
        let sig = rank.alloc_signals(1)?;
        rank.barrier()?;
        Ok(AllGatherThenAttention {
            shape,
            kv_full,
            sig,
            epoch: 0,
        })
    }

    /// Runs it on every rank (collective), like [`SpAttention::run`].
    #[track_caller]
    pub fn run(
        &mut self,
        rank: &Rank,
        q: &Buffer<T>,
        k: &Buffer<T>,
        v: &Buffer<T>,
        o: &mut Buffer<T>,
        scale: f32,
    ) -> Result<(), Error>
    where
        gather_kv_kernel<T, BN, HD>: Kernel<Comptime = ()>,
        gathered_attention_kernel<T, BM, BN, HD>: Kernel<Comptime = ()>,
    {
        self.run_impl(rank, q, k, v, o, scale)
            .map_err(Error::in_call("AllGatherThenAttention::run"))
    }

    fn run_impl(
        &mut self,
        rank: &Rank,
        q: &Buffer<T>,
        k: &Buffer<T>,
        v: &Buffer<T>,
        o: &mut Buffer<T>,
        scale: f32,
    ) -> Result<(), Error>
    where
        gather_kv_kernel<T, BN, HD>: Kernel<Comptime = ()>,
        gathered_attention_kernel<T, BM, BN, HD>: Kernel<Comptime = ()>,
    {
        let s = self.shape;
        check_len("AllGatherThenAttention: q", q, s.heads * s.sq * HD)?;
        check_len("AllGatherThenAttention: k", k, s.heads * s.sk * HD)?;
        check_len("AllGatherThenAttention: v", v, s.heads * s.sk * HD)?;
        check_len("AllGatherThenAttention: o", o, s.heads * s.sq * HD)?;
        self.epoch += 1;
        let dev = rank.device();
        let work = s.heads * s.sk.div_ceil(BN);
        gather_kv_kernel::<T, BN, HD>::launch(
            dev,
            programs_for(rank, work, MAX_PROGRAMS),
            (
                k,
                v,
                &mut self.kv_full,
                &mut self.sig,
                s.heads as i32,
                s.sk as i32,
                self.epoch,
            ),
        )?;
        gathered_attention_kernel::<T, BM, BN, HD>::launch(
            dev,
            (s.sq.div_ceil(BM), s.heads),
            (
                q,
                &self.kv_full,
                o,
                s.heads as i32,
                s.sq as i32,
                s.sk as i32,
                scale * crate::attention::LOG2_E,
                i32::from(s.causal),
            ),
        )
    }
}

/// Attention in f64 over the whole sequence for rank `rank`'s queries: `q` its
/// `[heads][sq][hd]`, `k_all`/`v_all` every rank's keys and values in rank order
/// (`[ranks][heads][sk][hd]`), as f64. The global key of `k_all[s][h][j]` is
/// `s*sk + j`; with `causal`, query `i` sees global keys `<= rank*sq + i`.
#[allow(clippy::too_many_arguments)]
pub fn reference(
    q: &[f64],
    k_all: &[f64],
    v_all: &[f64],
    rank: usize,
    ranks: usize,
    shape: SpShape,
    hd: usize,
    scale: f64,
) -> Vec<f64> {
    let SpShape {
        heads,
        sq,
        sk,
        causal,
    } = shape;
    let mut o = vec![0.0; heads * sq * hd];
    let row = |s: usize, h: usize, j: usize| ((s * heads + h) * sk + j) * hd;
    for h in 0..heads {
        for i in 0..sq {
            let gi = rank * sq + i;
            let keys: Vec<(usize, usize)> = (0..ranks)
                .flat_map(|s| (0..sk).map(move |j| (s, j)))
                .filter(|&(s, j)| !causal || s * sk + j <= gi)
                .collect();
            let qi = &q[(h * sq + i) * hd..][..hd];
            let sc: Vec<f64> = keys
                .iter()
                .map(|&(s, j)| {
                    let kj = &k_all[row(s, h, j)..][..hd];
                    qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() * scale
                })
                .collect();
            let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = e.iter().sum();
            for c in 0..hd {
                let acc: f64 = keys
                    .iter()
                    .zip(&e)
                    .map(|(&(s, j), w)| w * v_all[row(s, h, j) + c])
                    .sum();
                o[(h * sq + i) * hd + c] = acc / l;
            }
        }
    }
    o
}
