//! Counter-based random numbers: Philox 4x32-10 ([`randint4x`], [`randint`],
//! [`rand`], [`randn`], [`umulhi`]), the stream Triton's `tl.randint4x`/`tl.rand`/
//! `tl.randn` produce for the same seed and offsets.
//!
//! Philox 4x32 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11)
//! maps a 128-bit counter and a 64-bit key to 128 random bits in 10 rounds; each
//! round is two 32x32 -> 64-bit multiplications by `0xD2511F53` and `0xCD9E8D57`
//! whose high halves are XORed into the other words with the key, and the key is
//! bumped by the Weyl constants `0x9E3779B9`, `0xBB67AE85`. Here, as in Triton, the
//! counter is `(offset_lo, offset_hi, 0, 0)` and the key `(seed_lo, seed_hi)`.
//! Everything is ordinary integer arithmetic in the IR (wrapping `u32` multiplies
//! and adds, `umulhi` through `u64`), so every backend produces the same bits.

use super::{DType, Int, LitValue, Scalar, Shape, Tile, emit1, literal_tile, ops::broadcast_value};
use crate::ir::{BinaryOp, CmpPred, OpKind, Span, UnaryOp, ValueId};
use crate::types::{ScalarType, Type};

const ROUND_A: u32 = 0xD251_1F53;
const ROUND_B: u32 = 0xCD9E_8D57;
const KEY_A: u32 = 0x9E37_79B9;
const KEY_B: u32 = 0xBB67_AE85;
const ROUNDS: usize = 10;

/// A seed for the random-number functions: an integer scalar (a kernel parameter)
/// or a Rust integer. Signed seeds are sign-extended to 64 bits, as Triton does.
pub trait Seed {
    /// The seed as a `u64` scalar.
    fn seed_value(self, span: &Span) -> ValueId;
}

impl<I: Int> Seed for Scalar<I> {
    fn seed_value(self, span: &Span) -> ValueId {
        let wide = if I::TY.is_signed_int() {
            ScalarType::I64
        } else {
            ScalarType::U64
        };
        let v = cast(self.id(), wide, &[], span);
        cast(v, ScalarType::U64, &[], span)
    }
}

macro_rules! literal_seed {
    ($($t:ty),*) => {$(
        impl Seed for $t {
            fn seed_value(self, span: &Span) -> ValueId {
                // As Triton: the seed's 64-bit pattern (sign-extended).
                let bits = self as i64 as u64;
                literal_tile::<u64>(LitValue::Int(bits as i128), span.clone()).id()
            }
        }
    )*};
}
literal_seed!(i32, i64, u32, u64);

fn cast(v: ValueId, to: ScalarType, dims: &[u32], span: &Span) -> ValueId {
    let ty = Type::tile(to, dims);
    emit1(OpKind::Cast, &[v], Some(&ty), ty.clone(), span.clone())
}

fn bin(op: BinaryOp, a: ValueId, b: ValueId, s: ScalarType, dims: &[u32], span: &Span) -> ValueId {
    let a = broadcast_value(a, dims, span);
    let b = broadcast_value(b, dims, span);
    let ty = Type::tile(s, dims);
    emit1(OpKind::Binary(op), &[a, b], None, ty, span.clone())
}

fn lit<T: DType>(v: i128, span: &Span) -> ValueId {
    literal_tile::<T>(LitValue::Int(v), span.clone()).id()
}

/// The high 32 bits of the 64-bit product `a * x` (`u32` tiles of shape `dims`).
fn mulhi(a: ValueId, x: ValueId, dims: &[u32], span: &Span) -> ValueId {
    let a = cast(a, ScalarType::U64, &[], span);
    let x = cast(x, ScalarType::U64, dims, span);
    let p = bin(BinaryOp::Mul, x, a, ScalarType::U64, dims, span);
    let hi = bin(
        BinaryOp::Shr,
        p,
        lit::<u64>(32, span),
        ScalarType::U64,
        dims,
        span,
    );
    cast(hi, ScalarType::U32, dims, span)
}

/// The high 32 bits of the 64-bit products `x * y` of `u32` tiles (CUDA's
/// `__umulhi`, Triton's `tl.umulhi`).
#[track_caller]
pub fn umulhi<S: Shape>(x: Tile<u32, S>, y: Tile<u32, S>) -> Tile<u32, S> {
    let span = Span::caller();
    let dims = S::dims();
    let a = cast(x.id(), ScalarType::U64, &dims, &span);
    let b = cast(y.id(), ScalarType::U64, &dims, &span);
    let p = bin(BinaryOp::Mul, a, b, ScalarType::U64, &dims, &span);
    let hi = bin(
        BinaryOp::Shr,
        p,
        lit::<u64>(32, &span),
        ScalarType::U64,
        &dims,
        &span,
    );
    Tile::from_id(cast(hi, ScalarType::U32, &dims, &span))
}

/// Four tiles of random `u32`, one Philox 4x32-10 block per element: counter
/// `(offset_lo, offset_hi, 0, 0)`, key `(seed_lo, seed_hi)` (see the module docs).
/// Bit-identical to Triton's `tl.randint4x(seed, offsets)`.
#[track_caller]
pub fn randint4x<I: Int, S: Shape>(seed: impl Seed, offsets: Tile<I, S>) -> [Tile<u32, S>; 4] {
    let span = Span::caller();
    let dims = S::dims();
    let u32t = ScalarType::U32;
    let seed = seed.seed_value(&span);
    let mut k0 = cast(seed, u32t, &[], &span);
    let hi = bin(
        BinaryOp::Shr,
        seed,
        lit::<u64>(32, &span),
        ScalarType::U64,
        &[],
        &span,
    );
    let mut k1 = cast(hi, u32t, &[], &span);
    let mut c0 = cast(offsets.id(), u32t, &dims, &span);
    let zero = broadcast_value(lit::<u32>(0, &span), &dims, &span);
    let mut c1 = if I::TY.bits() > 32 {
        let h = bin(
            BinaryOp::Shr,
            offsets.id(),
            lit::<I>(32, &span),
            I::TY,
            &dims,
            &span,
        );
        cast(h, u32t, &dims, &span)
    } else {
        zero
    };
    let (mut c2, mut c3) = (zero, zero);
    let (ra, rb) = (
        lit::<u32>(ROUND_A as i128, &span),
        lit::<u32>(ROUND_B as i128, &span),
    );
    let (ka, kb) = (
        lit::<u32>(KEY_A as i128, &span),
        lit::<u32>(KEY_B as i128, &span),
    );
    for _ in 0..ROUNDS {
        let (p0, p2) = (c0, c2);
        let x = bin(
            BinaryOp::Xor,
            mulhi(rb, p2, &dims, &span),
            c1,
            u32t,
            &dims,
            &span,
        );
        c0 = bin(BinaryOp::Xor, x, k0, u32t, &dims, &span);
        let x = bin(
            BinaryOp::Xor,
            mulhi(ra, p0, &dims, &span),
            c3,
            u32t,
            &dims,
            &span,
        );
        c2 = bin(BinaryOp::Xor, x, k1, u32t, &dims, &span);
        c1 = bin(BinaryOp::Mul, p2, rb, u32t, &dims, &span);
        c3 = bin(BinaryOp::Mul, p0, ra, u32t, &dims, &span);
        k0 = bin(BinaryOp::Add, k0, ka, u32t, &[], &span);
        k1 = bin(BinaryOp::Add, k1, kb, u32t, &[], &span);
    }
    [c0, c1, c2, c3].map(Tile::from_id)
}

/// One tile of random `u32`: the first of [`randint4x`] (Triton's `tl.randint`).
#[track_caller]
pub fn randint<I: Int, S: Shape>(seed: impl Seed, offsets: Tile<I, S>) -> Tile<u32, S> {
    let [r, ..] = randint4x(seed, offsets);
    r
}

/// Random `u32` to `f32` in `[0, 1)` as Triton's `uint_to_uniform_float`: the bits
/// as `i32`, negative values complemented, times `4.6566127342e-10` (about 2^-31).
fn uniform<S: Shape>(r: Tile<u32, S>, span: &Span) -> ValueId {
    let dims = S::dims();
    let x = cast(r.id(), ScalarType::I32, &dims, span);
    let zero = broadcast_value(lit::<i32>(0, span), &dims, span);
    let bt = Type::tile(ScalarType::I1, &dims);
    let neg = emit1(OpKind::Cmp(CmpPred::Lt), &[x, zero], None, bt, span.clone());
    let it = Type::tile(ScalarType::I32, &dims);
    let inv = emit1(
        OpKind::Unary(UnaryOp::Not),
        &[x],
        None,
        it.clone(),
        span.clone(),
    );
    let x = emit1(OpKind::Select, &[neg, inv, x], None, it, span.clone());
    let f = cast(x, ScalarType::F32, &dims, span);
    let scale = literal_tile::<f32>(LitValue::Float(4.656_612_734_2e-10), span.clone()).id();
    bin(BinaryOp::Mul, f, scale, ScalarType::F32, &dims, span)
}

/// A tile of random `f32` uniform in `[0, 1)`, bit-identical to Triton's
/// `tl.rand(seed, offsets)`.
#[track_caller]
pub fn rand<I: Int, S: Shape>(seed: impl Seed, offsets: Tile<I, S>) -> Tile<f32, S> {
    let span = Span::caller();
    let r = randint(seed, offsets);
    Tile::from_id(uniform(r, &span))
}

/// A tile of random `f32` from the standard normal distribution, Triton's
/// `tl.randn(seed, offsets)`: the Box-Muller transform `sqrt(-2 ln u1) cos(2π u2)`
/// of the first two [`randint4x`] streams (`u1` at least `1e-7`). The same as Triton
/// up to the accuracy of `log`, `sqrt` and `cos` on each backend.
#[track_caller]
pub fn randn<I: Int, S: Shape>(seed: impl Seed, offsets: Tile<I, S>) -> Tile<f32, S> {
    let span = Span::caller();
    let [a, b, ..] = randint4x(seed, offsets);
    let dims = S::dims();
    let f32t = ScalarType::F32;
    let flit = |x: f64| literal_tile::<f32>(LitValue::Float(x), span.clone()).id();
    let unary = |u: UnaryOp, v: ValueId| {
        let ty = Type::tile(f32t, &dims);
        emit1(OpKind::Unary(u), &[v], None, ty, span.clone())
    };
    let u1 = bin(
        BinaryOp::Max,
        uniform(a, &span),
        flit(1.0e-7),
        f32t,
        &dims,
        &span,
    );
    let u2 = uniform(b, &span);
    let th = bin(
        BinaryOp::Mul,
        u2,
        flit(std::f64::consts::TAU),
        f32t,
        &dims,
        &span,
    );
    let l = bin(
        BinaryOp::Mul,
        unary(UnaryOp::Log, u1),
        flit(-2.0),
        f32t,
        &dims,
        &span,
    );
    let r = unary(UnaryOp::Sqrt, l);
    Tile::from_id(bin(
        BinaryOp::Mul,
        r,
        unary(UnaryOp::Cos, th),
        f32t,
        &dims,
        &span,
    ))
}
