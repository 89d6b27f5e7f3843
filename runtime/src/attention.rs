//! FlashAttention-2 forward: `O = softmax(scale · Q Kᵀ + mask) V` per head, without
//! materializing the `seq_q x seq_k` scores.
//!
//! [`attention_fwd`] takes `BM` query rows per program and walks the keys `BN` at a
//! time with the online softmax of FlashAttention-2: a running row maximum `m` and
//! row sum `l` in f32, the output accumulator rescaled by `2^(m_old - m_new)` when the
//! maximum grows, and one division by `l` at the end. Scores are kept in the log2
//! domain (`scale · log2(e)` is folded into one multiply, then `exp2`), as
//! FlashAttention and Triton's tutorial do. `Q Kᵀ` and `P V` are `dot`s: the matrix
//! units on every GPU target (`wgmma` on sm_90a), f32 accumulators, `P` rounded to
//! the input type before `P V`.
//!
//! Layout: `q` is `[heads][seq_q][HD]` and `k`, `v` are `[heads][seq_k][HD]`,
//! row-major, `o` like `q`; program `(i, h)` computes rows `i*BM ..` of head `h`
//! (`heads` = batch × heads). Sequence lengths need not be multiples of the tiles
//! (rows and keys past them are masked). With `causal = 1`, query `i` attends to keys
//! `j <= i` (the mask aligned at the top left); the loop stops at the diagonal.
//!
//! [`reference()`] is the same computation in f64, for tests and examples.

use crate::prelude::*;

/// `log2(e)`: multiplies the softmax scale so the kernel can use `exp2`.
pub const LOG2_E: f32 = std::f32::consts::LOG2_E;

/// FlashAttention-2 forward for one `BM`-row block of one head (see the module docs).
/// `scale_log2` is the softmax scale times [`LOG2_E`]; `causal` is 0 or 1.
#[kernel]
#[allow(clippy::too_many_arguments)]
pub fn attention_fwd<T: DotInput<Acc = f32>, const BM: usize, const BN: usize, const HD: usize>(
    q: &Global<T>,
    k: &Global<T>,
    v: &Global<T>,
    o: &mut Global<T>,
    seq_q: i32,
    seq_k: i32,
    scale_log2: f32,
    causal: i32,
) {
    let pid = program_id(0);
    let head = program_id(1);
    let q_base = head * seq_q * HD as i32;
    let kv_base = head * seq_k * HD as i32;
    let rm = (pid * BM + arange::<BM>()).expand_dims::<1>(); // BM x 1
    let dc = arange::<HD>().expand_dims::<0>(); // 1 x HD
    let dr = arange::<HD>().expand_dims::<1>(); // HD x 1
    let qt = q.load(
        q_base + rm * HD as i32 + dc,
        rm.lt(seq_q) & dc.lt(HD as i32),
    );
    let mut m_i = full::<f32, S1<BM>>(-1.0e30);
    let mut l_i = zeros::<f32, S1<BM>>();
    let mut acc = zeros::<f32, S2<BM, HD>>();
    // Causal: keys up to the block's last row; else all of them.
    let not_causal = 1 - causal;
    let hi = seq_k.minimum((pid + 1) * BM as i32 + not_causal * seq_k);
    // Row `i` sees key `j` when `j <= i` (causal) or always (`i + seq_k > j`).
    let last_key = rm + not_causal * seq_k; // BM x 1
    for n0 in (0..hi).step_by(BN) {
        let rn = n0 + arange::<BN>();
        let kc = rn.expand_dims::<0>(); // 1 x BN
        let kr = rn.expand_dims::<1>(); // BN x 1
        let kt = k.load(
            kv_base + kc * HD as i32 + dr,
            kc.lt(seq_k) & dr.lt(HD as i32),
        ); // HD x BN
        let s = dot(qt, kt, zeros::<f32, S2<BM, BN>>()) * scale_log2;
        let s = select(last_key.ge(kc) & kc.lt(seq_k), s, -1.0e30f32);
        let m_new = m_i.maximum(s.max::<1>());
        let p = (s - m_new.expand_dims::<1>()).exp2();
        let alpha = (m_i - m_new).exp2();
        l_i = l_i * alpha + p.sum::<1>();
        let vt = v.load(
            kv_base + kr * HD as i32 + dc,
            kr.lt(seq_k) & dc.lt(HD as i32),
        ); // BN x HD
        acc = dot(p.cast::<T>(), vt, acc * alpha.expand_dims::<1>());
        m_i = m_new;
    }
    let out = acc / l_i.expand_dims::<1>();
    o.store(
        q_base + rm * HD as i32 + dc,
        out.cast::<T>(),
        rm.lt(seq_q) & dc.lt(HD as i32),
    );
}

/// Attention in f64 from the inputs (as f64): `o[h][i] = Σ_j softmax_j(scale q·k_j) v_j`
/// over the keys row `i` sees (`j <= i` when `causal`). Shapes as [`attention_fwd`].
#[allow(clippy::too_many_arguments)]
pub fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    heads: usize,
    seq_q: usize,
    seq_k: usize,
    hd: usize,
    scale: f64,
    causal: bool,
) -> Vec<f64> {
    let mut o = vec![0.0; heads * seq_q * hd];
    for h in 0..heads {
        let (qh, kh, vh) = (
            &q[h * seq_q * hd..],
            &k[h * seq_k * hd..],
            &v[h * seq_k * hd..],
        );
        for i in 0..seq_q {
            let keys = if causal { (i + 1).min(seq_k) } else { seq_k };
            let s: Vec<f64> = (0..keys)
                .map(|j| {
                    (0..hd)
                        .map(|c| qh[i * hd + c] * kh[j * hd + c])
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let l: f64 = e.iter().sum();
            for c in 0..hd {
                let acc: f64 = (0..keys).map(|j| e[j] * vh[j * hd + c]).sum();
                o[(h * seq_q + i) * hd + c] = acc / l;
            }
        }
    }
    o
}
