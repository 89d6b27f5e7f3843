//! The 8-bit floats of the OCP 8-bit floating point specification (OFP8, the formats
//! of NVIDIA's and AMD's 8-bit float instructions): [`F8E4M3`] (E4M3FN: no infinities,
//! one NaN per sign, ±448) and [`F8E5M2`] (IEEE-style: infinities and NaNs, ±57344).
//!
//! They are storage types: a value is its byte ([`F8E4M3::from_bits`],
//! [`F8E4M3::to_bits`]), converted exactly to `f32`/`f64` and from them by rounding
//! to nearest even and saturating to the largest finite value, NaN to NaN: CUDA's
//! `__NV_SATFINITE` conversion and PTX's `cvt.rn.satfinite`, which Tessera's lowering
//! (on every target) and its interpreter apply, bit for bit. There is no arithmetic on
//! them.
//!
//! | | [`F8E4M3`] | [`F8E5M2`] |
//! |---|---|---|
//! | bits (sign.exponent.mantissa) | 1.4.3 | 1.5.2 |
//! | exponent bias | 7 | 15 |
//! | largest finite ([`F8E4M3::MAX`]) | 448 = `S.1111.110` | 57344 = `S.11110.11` |
//! | smallest positive normal | 2⁻⁶ | 2⁻¹⁴ |
//! | smallest positive subnormal | 2⁻⁹ | 2⁻¹⁶ |
//! | infinities | none | `S.11111.00` |
//! | NaN | `S.1111.111` | `S.11111.{01,10,11}` |

use std::cmp::Ordering;
use std::fmt;

/// The parameters of one format.
#[derive(Clone, Copy)]
struct Format {
    /// Mantissa (trailing significand) bits.
    mbits: u32,
    /// Exponent bias.
    bias: i32,
    /// The largest unbiased exponent of a finite value.
    emax: i32,
    /// The magnitude bits of the largest finite value.
    max_bits: u8,
    /// Whether the all-ones exponent field holds infinities (`.0…0`) and NaNs (every
    /// other mantissa), as in IEEE 754 (E5M2); otherwise only the all-ones encoding is
    /// a NaN and the others are finite (E4M3FN).
    ieee_specials: bool,
}

const E4M3: Format = Format {
    mbits: 3,
    bias: 7,
    emax: 8,
    max_bits: 0x7e,
    ieee_specials: false,
};

const E5M2: Format = Format {
    mbits: 2,
    bias: 15,
    emax: 15,
    max_bits: 0x7b,
    ieee_specials: true,
};

/// `2^k` as an f64 (`-1022 <= k <= 1023`).
const fn pow2(k: i32) -> f64 {
    f64::from_bits(((1023 + k) as u64) << 52)
}

/// The magnitude bits (sign cleared) of the NaN that `x`, a NaN with f64 bits `bits`,
/// converts to: E4M3's only NaN; for E5M2, `0x7e` with the top two mantissa bits of
/// the input ORed in (a quiet NaN gives `0x7e`), as CUDA's conversion does.
const fn nan_bits(f: Format, bits: u64) -> u8 {
    if f.ieee_specials {
        0x7e | ((bits >> 50) & 3) as u8
    } else {
        0x7f
    }
}

/// `x` rounded to the format: nearest, ties to even; finite values beyond the largest
/// finite value and infinities saturate to it; NaN to NaN.
const fn encode(f: Format, x: f64) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 56) & 0x80) as u8;
    let abs = bits & !(1 << 63);
    if abs > 0x7ff0_0000_0000_0000 {
        return sign | nan_bits(f, bits);
    }
    // `abs` is `sig * 2^(e - 52)` (f64 subnormals and zero: exponent field 0).
    let field = (abs >> 52) as i32;
    let (sig, e) = if field == 0 {
        (abs, -1022)
    } else {
        ((abs & ((1 << 52) - 1)) | (1 << 52), field - 1023)
    };
    if e > f.emax {
        // At least 2^(emax + 1), infinity included: beyond every finite value.
        return sign | f.max_bits;
    }
    // The spacing of the format's values around `x` is 2^q; `n` is `x / 2^q`
    // rounded to nearest even, the significand of the result in units of 2^q.
    let emin = 1 - f.bias;
    let eq = if e < emin { emin } else { e };
    let q = eq - f.mbits as i32;
    let shift = (52 + q - e) as u32; // >= 52 - mbits: always a right shift.
    let n = if shift >= 64 {
        // `x / 2^q < 2^53 / 2^64`: rounds to zero.
        0
    } else {
        let n = sig >> shift;
        let rest = sig & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        if rest > half || (rest == half && n & 1 == 1) {
            n + 1
        } else {
            n
        }
    };
    // The encoding is `(eq + bias - 1) << mbits` plus `n`: for a normal, `n` carries
    // the implicit bit into the exponent field (and a rounding carry into the next
    // binade); for a subnormal (`eq == emin`, so the first term is 0) `n` is the
    // mantissa itself, and `n == 2^mbits` is the smallest normal.
    let mag = (((eq + f.bias - 1) as u64) << f.mbits) + n;
    if mag > f.max_bits as u64 {
        // Rounded up past the largest finite value (onto an infinity or a NaN).
        sign | f.max_bits
    } else {
        sign | mag as u8
    }
}

/// True when `b` is a NaN.
const fn is_nan(f: Format, b: u8) -> bool {
    let m = b & 0x7f;
    if f.ieee_specials {
        m > f.max_bits + 1
    } else {
        m == 0x7f
    }
}

/// True when `b` is an infinity (E5M2 only).
const fn is_infinite(f: Format, b: u8) -> bool {
    f.ieee_specials && b & 0x7f == f.max_bits + 1
}

/// The exact value of `b` as an f64 (NaNs: the quiet NaN with `b`'s sign).
const fn decode(f: Format, b: u8) -> f64 {
    let negative = b & 0x80 != 0;
    if is_nan(f, b) {
        return f64::from_bits(0x7ff8_0000_0000_0000 | ((negative as u64) << 63));
    }
    let mag = if is_infinite(f, b) {
        f64::INFINITY
    } else {
        let field = ((b & 0x7f) >> f.mbits) as i32;
        let mant = (b & ((1 << f.mbits) - 1)) as u32;
        let emin = 1 - f.bias;
        // value = significand * 2^(exponent - mbits), exact in f64.
        let (significand, exponent) = if field == 0 {
            (mant, emin)
        } else {
            (mant | (1 << f.mbits), field - f.bias)
        };
        significand as f64 * pow2(exponent - f.mbits as i32)
    };
    if negative { -mag } else { mag }
}

/// The exact value of `b` as an f32 (NaNs: the quiet NaN with `b`'s sign).
const fn decode_f32(f: Format, b: u8) -> f32 {
    if is_nan(f, b) {
        // Built from the bits: `as` need not keep a NaN's sign.
        return f32::from_bits(0x7fc0_0000 | (((b >> 7) as u32) << 31));
    }
    // Exact: every value of both formats is an f32.
    decode(f, b) as f32
}

/// `x` rounded to the format (see [`encode`]); a NaN is converted from its own bits:
/// a cast to f64 would be free to change its payload.
const fn encode_f32(f: Format, x: f32) -> u8 {
    if x.is_nan() {
        let bits = x.to_bits();
        // The mantissa bits in f64's places (all that `nan_bits` reads).
        let wide = ((bits & 0x7f_ffff) as u64) << 29;
        return ((bits >> 24) & 0x80) as u8 | nan_bits(f, wide);
    }
    // Exact for every non-NaN f32.
    encode(f, x as f64)
}

/// The OCP 8-bit float E4M3 (`float8_e4m3fn` in PyTorch's and DLPack's words,
/// `__nv_fp8_e4m3` in CUDA's): sign, 4 exponent bits (bias 7), 3 mantissa bits.
///
/// It has **no infinities** (so no `INFINITY` constant): the exponent field `1111`
/// holds finite values up to [`F8E4M3::MAX`] = 448 = `0.1111.110`, and only
/// `S.1111.111` is a NaN. Conversions saturate out-of-range values and infinities to
/// ±448.
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct F8E4M3(u8);

/// The OCP 8-bit float E5M2 (`float8_e5m2`, CUDA's `__nv_fp8_e5m2`): sign, 5 exponent
/// bits (bias 15), 2 mantissa bits; IEEE-style specials: infinities `S.11111.00`,
/// NaNs `S.11111.{01,10,11}`.
///
/// Conversions saturate out-of-range values *and infinities* to ±[`F8E5M2::MAX`] =
/// 57344 (CUDA's `satfinite`, which Tessera's kernels apply on every device);
/// [`F8E5M2::INFINITY`] is only reached through [`F8E5M2::from_bits`].
#[derive(Clone, Copy, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct F8E5M2(u8);

/// The methods, constants and traits of an 8-bit float type `$t` of format `$fmt`.
macro_rules! fp8_impls {
    ($t:ident, $fmt:ident) => {
        impl $t {
            /// The value with these bits (sign, exponent, mantissa from the top).
            pub const fn from_bits(bits: u8) -> $t {
                $t(bits)
            }

            /// The bits of the value.
            pub const fn to_bits(self) -> u8 {
                self.0
            }

            /// `x` rounded to nearest, ties to even; finite values beyond
            #[doc = concat!("[`", stringify!($t), "::MAX`]")]
            /// (in magnitude) and infinities saturate to
            #[doc = concat!("±[`", stringify!($t), "::MAX`]")]
            /// (CUDA's `satfinite`); a NaN converts to a NaN of the same sign.
            pub const fn from_f32(x: f32) -> $t {
                $t(encode_f32($fmt, x))
            }

            /// `x` rounded as by
            #[doc = concat!("[`", stringify!($t), "::from_f32`]")]
            /// (once, from the f64 value: no double rounding).
            pub const fn from_f64(x: f64) -> $t {
                $t(encode($fmt, x))
            }

            /// The value as an f32 (exact; a NaN gives the quiet NaN of its sign).
            pub const fn to_f32(self) -> f32 {
                decode_f32($fmt, self.0)
            }

            /// The value as an f64 (exact; a NaN gives the quiet NaN of its sign).
            pub const fn to_f64(self) -> f64 {
                decode($fmt, self.0)
            }

            /// True for a NaN.
            pub const fn is_nan(self) -> bool {
                is_nan($fmt, self.0)
            }

            /// True for ±infinity.
            pub const fn is_infinite(self) -> bool {
                is_infinite($fmt, self.0)
            }

            /// True when neither a NaN nor infinite.
            pub const fn is_finite(self) -> bool {
                !self.is_nan() && !self.is_infinite()
            }

            /// True when the sign bit is set (negative numbers, `-0`, negative NaNs).
            pub const fn is_sign_negative(self) -> bool {
                self.0 & 0x80 != 0
            }

            /// True when the sign bit is clear.
            pub const fn is_sign_positive(self) -> bool {
                !self.is_sign_negative()
            }

            /// The largest finite value.
            pub const MAX: $t = $t($fmt.max_bits);
            /// The smallest (most negative) finite value, `-MAX`.
            pub const MIN: $t = $t(0x80 | $fmt.max_bits);
            /// The smallest positive normal value, `2^(1 - bias)`.
            pub const MIN_POSITIVE: $t = $t(1 << $fmt.mbits);
            /// The smallest positive (subnormal) value, `2^(1 - bias - mantissa bits)`.
            pub const MIN_POSITIVE_SUBNORMAL: $t = $t(1);
            /// The largest subnormal value.
            pub const MAX_SUBNORMAL: $t = $t((1 << $fmt.mbits) - 1);
            /// The difference between 1 and the next larger value, `2^-(mantissa bits)`.
            pub const EPSILON: $t = $t((($fmt.bias - $fmt.mbits as i32) as u8) << $fmt.mbits);
            /// A NaN (the one CUDA's conversion gives for f32's quiet NaN).
            pub const NAN: $t = $t(nan_bits($fmt, f64::NAN.to_bits()));
            /// `+0`.
            pub const ZERO: $t = $t(0);
            /// `-0`.
            pub const NEG_ZERO: $t = $t(0x80);
            /// `1`.
            pub const ONE: $t = $t(($fmt.bias as u8) << $fmt.mbits);
            /// `-1`.
            pub const NEG_ONE: $t = $t(0x80 | (($fmt.bias as u8) << $fmt.mbits));
        }

        /// IEEE equality: a NaN equals nothing, `+0 == -0`.
        impl PartialEq for $t {
            fn eq(&self, other: &$t) -> bool {
                self.to_f32() == other.to_f32()
            }
        }

        /// IEEE order: NaNs are unordered, `+0` and `-0` are equal.
        impl PartialOrd for $t {
            fn partial_cmp(&self, other: &$t) -> Option<Ordering> {
                self.to_f32().partial_cmp(&other.to_f32())
            }
        }

        /// The value, as f32's `Debug` writes it (`448.0`, `NaN`).
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.to_f32(), f)
            }
        }

        /// The value, as f32's `Display` writes it (with the formatter's precision).
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.to_f32(), f)
            }
        }

        /// Exact.
        impl From<$t> for f32 {
            fn from(x: $t) -> f32 {
                x.to_f32()
            }
        }

        /// Exact.
        impl From<$t> for f64 {
            fn from(x: $t) -> f64 {
                x.to_f64()
            }
        }
    };
}

fp8_impls!(F8E4M3, E4M3);
fp8_impls!(F8E5M2, E5M2);

impl F8E5M2 {
    /// `+∞` (`0.11111.00`).
    pub const INFINITY: F8E5M2 = F8E5M2(0x7c);
    /// `-∞` (`1.11111.00`).
    pub const NEG_INFINITY: F8E5M2 = F8E5M2(0xfc);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One format as the OCP specification defines it, independently of the code
    /// above: its field widths, and which encodings of the all-ones exponent are
    /// special.
    struct Spec {
        ebits: u32,
        mbits: u32,
        /// E5M2 (IEEE-style: infinities and NaNs in the top binade); E4M3FN has only
        /// `S.1111.111`.
        ieee: bool,
    }

    const SPEC_E4M3: Spec = Spec {
        ebits: 4,
        mbits: 3,
        ieee: false,
    };
    const SPEC_E5M2: Spec = Spec {
        ebits: 5,
        mbits: 2,
        ieee: true,
    };

    /// The value of the encoding `b`: `(-1)^S · 2^(E - bias) · (1 + M / 2^m)`, and
    /// `(-1)^S · 2^(1 - bias) · (M / 2^m)` for `E == 0`; `None` for a NaN.
    fn spec_value(s: &Spec, b: u8) -> Option<f64> {
        let bias = (1i32 << (s.ebits - 1)) - 1;
        let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = i32::from(b >> s.mbits) & ((1 << s.ebits) - 1);
        let m = f64::from(b & ((1u8 << s.mbits) - 1));
        let top = (1 << s.ebits) - 1;
        let frac = m / f64::from(1u32 << s.mbits);
        if s.ieee && e == top {
            return if m == 0.0 {
                Some(sign * f64::INFINITY)
            } else {
                None
            };
        }
        if !s.ieee && e == top && m == f64::from((1u32 << s.mbits) - 1) {
            return None;
        }
        Some(if e == 0 {
            sign * 2f64.powi(1 - bias) * frac
        } else {
            sign * 2f64.powi(e - bias) * (1.0 + frac)
        })
    }

    /// The finite values of a format as `(magnitude, bits)`, positive encodings only
    /// (`+0` included), in increasing order.
    fn finite_magnitudes(s: &Spec) -> Vec<(f64, u8)> {
        let mut v: Vec<(f64, u8)> = (0..=0x7fu8)
            .filter_map(|b| spec_value(s, b).filter(|x| x.is_finite()).map(|x| (x, b)))
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    }

    /// The reference rounding: the nearest finite value (ties: the one with an even
    /// encoding), with the sign of `x`; NaN is `None`. The nearest *finite* value is
    /// the saturating conversion: beyond the largest finite value it is that value.
    fn spec_round(s: &Spec, x: f64) -> Option<u8> {
        if x.is_nan() {
            return None;
        }
        let a = x.abs();
        let mags = finite_magnitudes(s);
        let &(max, max_bits) = mags.last().expect("values");
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        if a >= max {
            // (Also where `a - v` would round to the same distance for every `v`.)
            return Some(max_bits | sign);
        }
        let mut best = (f64::INFINITY, 0u8);
        for (v, b) in mags {
            let d = (v - a).abs();
            if d < best.0 || (d == best.0 && b & 1 == 0) {
                best = (d, b);
            }
        }
        Some(best.1 | sign)
    }

    /// A small deterministic generator (xorshift64*), so the random inputs are the same
    /// in every run.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
    }

    /// Runs `$body` with `$T` the type and `$spec` its specification, for both formats.
    macro_rules! both {
        (|$T:ident, $spec:ident| $body:block) => {{
            {
                type $T = F8E4M3;
                let $spec = &SPEC_E4M3;
                $body
            }
            {
                type $T = F8E5M2;
                let $spec = &SPEC_E5M2;
                $body
            }
        }};
    }

    #[test]
    fn every_encoding_decodes_to_its_ocp_value() {
        both!(|T, spec| {
            for b in 0..=255u8 {
                let x = T::from_bits(b);
                assert_eq!(x.to_bits(), b);
                let (f, d) = (x.to_f32(), x.to_f64());
                match spec_value(spec, b) {
                    None => {
                        assert!(x.is_nan() && !x.is_infinite() && !x.is_finite(), "{b:#04x}");
                        assert!(f.is_nan() && d.is_nan(), "{b:#04x}");
                        let neg = b & 0x80 != 0;
                        assert_eq!(f.is_sign_negative(), neg, "{b:#04x}");
                        assert_eq!(d.is_sign_negative(), neg, "{b:#04x}");
                    }
                    Some(v) => {
                        assert!(!x.is_nan(), "{b:#04x}");
                        assert_eq!(x.is_infinite(), v.is_infinite(), "{b:#04x}");
                        assert_eq!(x.is_finite(), v.is_finite(), "{b:#04x}");
                        // Bit equality: the sign of zero too.
                        assert_eq!(d.to_bits(), v.to_bits(), "{b:#04x}: {d} vs {v}");
                        assert_eq!(f.to_bits(), (v as f32).to_bits(), "{b:#04x}");
                        assert_eq!(f64::from(f), v, "{b:#04x}: not exact in f32");
                        assert_eq!(f32::from(x).to_bits(), f.to_bits());
                        assert_eq!(f64::from(x).to_bits(), d.to_bits());
                        assert_eq!(x.is_sign_negative(), b & 0x80 != 0);
                        assert_eq!(x.is_sign_positive(), b & 0x80 == 0);
                    }
                }
            }
        });
        // The NaN encodings, counted: E4M3FN has one per sign, E5M2 three.
        let nans = |f: fn(u8) -> bool| (0..=255u8).filter(|&b| f(b)).count();
        assert_eq!(nans(|b| F8E4M3::from_bits(b).is_nan()), 2);
        assert_eq!(nans(|b| F8E5M2::from_bits(b).is_nan()), 6);
        assert_eq!(nans(|b| F8E4M3::from_bits(b).is_infinite()), 0);
        assert_eq!(nans(|b| F8E5M2::from_bits(b).is_infinite()), 2);
    }

    /// E5M2 is f16 with its low byte cut off: the same value as the f16 of the bits
    /// shifted up (a second, independent decoder).
    #[test]
    fn e5m2_is_the_top_byte_of_f16() {
        for b in 0..=255u8 {
            let h = half::f16::from_bits(u16::from(b) << 8);
            let x = F8E5M2::from_bits(b);
            if h.is_nan() {
                assert!(x.is_nan());
            } else {
                assert_eq!(x.to_f32().to_bits(), h.to_f32().to_bits(), "{b:#04x}");
            }
        }
    }

    #[test]
    fn constants_are_the_ocp_values() {
        let v = |x: F8E4M3| x.to_f64();
        assert_eq!(v(F8E4M3::MAX), 448.0);
        assert_eq!(v(F8E4M3::MIN), -448.0);
        assert_eq!(v(F8E4M3::MIN_POSITIVE), 2f64.powi(-6));
        assert_eq!(v(F8E4M3::MIN_POSITIVE_SUBNORMAL), 2f64.powi(-9));
        assert_eq!(v(F8E4M3::MAX_SUBNORMAL), 7.0 * 2f64.powi(-9));
        assert_eq!(v(F8E4M3::EPSILON), 0.125);
        assert_eq!(v(F8E4M3::ONE), 1.0);
        assert_eq!(v(F8E4M3::NEG_ONE), -1.0);
        assert_eq!(F8E4M3::NAN.to_bits(), 0x7f);
        assert_eq!(F8E4M3::MAX.to_bits(), 0x7e);
        let w = |x: F8E5M2| x.to_f64();
        assert_eq!(w(F8E5M2::MAX), 57344.0);
        assert_eq!(w(F8E5M2::MIN), -57344.0);
        assert_eq!(w(F8E5M2::MIN_POSITIVE), 2f64.powi(-14));
        assert_eq!(w(F8E5M2::MIN_POSITIVE_SUBNORMAL), 2f64.powi(-16));
        assert_eq!(w(F8E5M2::MAX_SUBNORMAL), 3.0 * 2f64.powi(-16));
        assert_eq!(w(F8E5M2::EPSILON), 0.25);
        assert_eq!(w(F8E5M2::ONE), 1.0);
        assert_eq!(w(F8E5M2::NEG_ONE), -1.0);
        assert_eq!(w(F8E5M2::INFINITY), f64::INFINITY);
        assert_eq!(w(F8E5M2::NEG_INFINITY), f64::NEG_INFINITY);
        assert!(F8E5M2::INFINITY.is_infinite() && !F8E5M2::INFINITY.is_finite());
        assert_eq!(F8E5M2::NAN.to_bits(), 0x7e);
        assert_eq!(F8E5M2::MAX.to_bits(), 0x7b);
        both!(|T, spec| {
            assert!(T::NAN.is_nan());
            assert!(T::MAX.is_finite() && T::MIN.is_finite());
            assert_eq!(T::ZERO.to_bits(), 0);
            assert_eq!(T::NEG_ZERO.to_bits(), 0x80);
            assert_eq!(T::ZERO.to_f64().to_bits(), 0f64.to_bits());
            assert_eq!(T::NEG_ZERO.to_f64().to_bits(), (-0f64).to_bits());
            assert_eq!(T::default().to_bits(), 0);
            // Against the specification's table: the extremes of the finite values.
            let mags = finite_magnitudes(spec);
            let normals: Vec<f64> = (0..=0x7fu8)
                .filter(|b| b >> spec.mbits != 0)
                .filter_map(|b| spec_value(spec, b))
                .collect();
            assert_eq!(T::MAX.to_f64(), mags.last().expect("values").0);
            assert_eq!(T::MIN.to_f64(), -mags.last().expect("values").0);
            assert_eq!(T::MIN_POSITIVE_SUBNORMAL.to_f64(), mags[1].0);
            assert_eq!(
                T::MIN_POSITIVE.to_f64(),
                normals.iter().copied().fold(f64::INFINITY, f64::min)
            );
            // EPSILON: the gap between 1 and the next value.
            let next = T::from_bits(T::ONE.to_bits() + 1).to_f64();
            assert_eq!(T::EPSILON.to_f64(), next - 1.0);
        });
    }

    #[test]
    fn every_finite_value_round_trips() {
        both!(|T, _spec| {
            for b in 0..=255u8 {
                let x = T::from_bits(b);
                if x.is_finite() {
                    assert_eq!(T::from_f32(x.to_f32()).to_bits(), b, "{b:#04x}");
                    assert_eq!(T::from_f64(x.to_f64()).to_bits(), b, "{b:#04x}");
                }
            }
        });
    }

    /// Every midpoint between neighbouring values (ties: to the even encoding), a
    /// hair either side of it, and random f32 and f64 over every exponent, against
    /// the nearest-finite-value reference.
    #[test]
    fn conversions_round_to_nearest_even_and_saturate() {
        both!(|T, spec| {
            let mags = finite_magnitudes(spec);
            let mut xs: Vec<f64> = Vec::new();
            for w in mags.windows(2) {
                let mid = (w[0].0 + w[1].0) / 2.0;
                xs.extend([mid, mid.next_up(), mid.next_down(), w[0].0, w[1].0]);
            }
            let max = mags.last().expect("values").0;
            let ulp = max - mags[mags.len() - 2].0;
            xs.extend([max + ulp / 2.0, max + ulp, 1e300, f64::MAX, f64::INFINITY]);
            xs.extend([f64::MIN_POSITIVE, 5e-324, 0.0, mags[1].0 / 2.0]);
            let mut r = Rng(0x9e37_79b9_7f4a_7c15);
            for _ in 0..20_000 {
                // Exponents well past both ends of the formats.
                let e = (r.next() % 80) as i32 - 40;
                let m = 1.0 + (r.next() >> 11) as f64 / (1u64 << 53) as f64;
                xs.push(m * 2f64.powi(e));
            }
            let negated: Vec<f64> = xs.iter().map(|x| -x).collect();
            xs.extend(negated);
            for &x in &xs {
                let want = spec_round(spec, x).expect("not NaN");
                assert_eq!(T::from_f64(x).to_bits(), want, "from_f64({x:e})");
                let xf = x as f32;
                let want = spec_round(spec, f64::from(xf)).expect("not NaN");
                assert_eq!(T::from_f32(xf).to_bits(), want, "from_f32({xf:e})");
            }
            // Random f32 bit patterns (every NaN aside).
            for _ in 0..50_000 {
                let xf = f32::from_bits(r.next() as u32);
                if let Some(want) = spec_round(spec, f64::from(xf)) {
                    assert_eq!(T::from_f32(xf).to_bits(), want, "from_f32({xf:e})");
                }
            }
        });
    }

    #[test]
    fn ties_go_to_the_even_encoding() {
        let e4 = |x: f32| F8E4M3::from_f32(x).to_f32();
        assert_eq!(e4(1.0625), 1.0); // 1 + 1/16: between 1 (even) and 1.125.
        assert_eq!(e4(1.1875), 1.25); // between 1.125 and 1.25 (even).
        assert_eq!(e4(2f32.powi(-10)), 0.0); // half the smallest subnormal.
        assert_eq!(e4(3.0 * 2f32.powi(-10)), 2f32.powi(-8)); // 1.5 subnormals: 2.
        assert_eq!(e4(-2f32.powi(-10)).to_bits(), (-0f32).to_bits());
        assert_eq!(e4(2f32.powi(-10).next_up()), 2f32.powi(-9));
        assert_eq!(e4(15.0 * 2f32.powi(-10)), 2f32.powi(-6)); // 7.5 subnormals: normal.
        assert_eq!(e4(248.0), 256.0); // between 240 (odd) and 256: a carry into the exponent.
        assert_eq!(e4(232.0), 224.0); // between 224 (even) and 240.
        let e5 = |x: f32| F8E5M2::from_f32(x).to_f32();
        assert_eq!(e5(1.125), 1.0);
        assert_eq!(e5(1.375), 1.5);
        assert_eq!(e5(2f32.powi(-17)), 0.0);
        assert_eq!(e5(3.0 * 2f32.powi(-17)), 2f32.powi(-15));
        assert_eq!(e5(7.0 * 2f32.powi(-17)), 2f32.powi(-14));
    }

    #[test]
    fn out_of_range_values_and_infinities_saturate() {
        for x in [
            448.0,
            449.0,
            463.99,
            464.0,
            464.0001,
            480.0,
            1e9,
            f32::MAX,
            f32::INFINITY,
        ] {
            assert_eq!(F8E4M3::from_f32(x).to_bits(), 0x7e, "{x}");
            assert_eq!(F8E4M3::from_f32(-x).to_bits(), 0xfe, "{x}");
            assert_eq!(F8E4M3::from_f64(f64::from(x)).to_bits(), 0x7e, "{x}");
        }
        assert_eq!(F8E4M3::from_f64(f64::INFINITY).to_bits(), 0x7e);
        assert_eq!(F8E4M3::from_f32(447.0).to_f32(), 448.0);
        assert_eq!(F8E4M3::from_f32(431.0).to_f32(), 416.0);
        for x in [
            57344.0,
            59000.0,
            61439.99,
            61440.0,
            65536.0,
            1e30,
            f32::INFINITY,
        ] {
            assert_eq!(F8E5M2::from_f32(x).to_bits(), 0x7b, "{x}");
            assert_eq!(F8E5M2::from_f32(-x).to_bits(), 0xfb, "{x}");
            assert_eq!(F8E5M2::from_f64(f64::from(x)).to_bits(), 0x7b, "{x}");
        }
        assert_eq!(F8E5M2::from_f64(f64::NEG_INFINITY).to_bits(), 0xfb);
    }

    #[test]
    fn nans_convert_to_nans_of_their_sign() {
        assert_eq!(F8E4M3::from_f32(f32::NAN).to_bits(), 0x7f);
        assert_eq!(F8E4M3::from_f32(-f32::NAN).to_bits(), 0xff);
        assert_eq!(F8E4M3::from_f64(-f64::NAN).to_bits(), 0xff);
        assert_eq!(F8E5M2::from_f32(f32::NAN).to_bits(), 0x7e);
        assert_eq!(F8E5M2::from_f32(-f32::NAN).to_bits(), 0xfe);
        // E5M2 keeps the second mantissa bit of the input (CUDA's conversion):
        // signalling NaNs with and without it.
        assert_eq!(
            F8E5M2::from_f32(f32::from_bits(0x7fa0_0000)).to_bits(),
            0x7f
        );
        assert_eq!(
            F8E5M2::from_f32(f32::from_bits(0x7f80_0001)).to_bits(),
            0x7e
        );
        assert_eq!(
            F8E5M2::from_f32(f32::from_bits(0xffe0_0000)).to_bits(),
            0xff
        );
        assert_eq!(
            F8E5M2::from_f64(f64::from_bits(0x7ff4_0000_0000_0000)).to_bits(),
            0x7f
        );
        assert_eq!(
            F8E4M3::from_f32(f32::from_bits(0x7f80_0001)).to_bits(),
            0x7f
        );
        let mut r = Rng(7);
        for _ in 0..10_000 {
            let bits = (r.next() as u32) | 0x7f80_0001;
            let x = f32::from_bits(bits);
            assert!(x.is_nan());
            for b in [F8E4M3::from_f32(x).to_bits(), F8E5M2::from_f32(x).to_bits()] {
                assert_eq!(b & 0x80 != 0, x.is_sign_negative());
            }
            assert!(F8E4M3::from_f32(x).is_nan() && F8E5M2::from_f32(x).is_nan());
            let e5 = F8E5M2::from_f32(x).to_bits();
            assert_eq!(e5 & 0x7f, 0x7e | ((bits >> 21) & 3) as u8, "{bits:#x}");
        }
    }

    /// `==` and `<` are IEEE's: NaN is unordered and unequal to itself, the zeros are
    /// equal; over every pair of encodings, the same answers as for the f32 values.
    #[test]
    fn comparisons_are_ieee() {
        both!(|T, _spec| {
            assert_ne!(T::NAN, T::NAN);
            assert_eq!(T::ZERO, T::NEG_ZERO);
            assert_eq!(T::NAN.partial_cmp(&T::ONE), None);
            for a in 0..=255u8 {
                for b in 0..=255u8 {
                    let (x, y) = (T::from_bits(a), T::from_bits(b));
                    let (fx, fy) = (spec_value(_spec, a), spec_value(_spec, b));
                    let want = match (fx, fy) {
                        (Some(p), Some(q)) => p.partial_cmp(&q),
                        _ => None,
                    };
                    assert_eq!(x.partial_cmp(&y), want, "{a:#04x} {b:#04x}");
                    assert_eq!(x == y, want == Some(Ordering::Equal), "{a:#04x} {b:#04x}");
                }
            }
        });
    }

    #[test]
    fn formatting_writes_the_value() {
        assert_eq!(F8E4M3::MAX.to_string(), "448");
        assert_eq!(format!("{:?}", F8E4M3::MAX), "448.0");
        assert_eq!(format!("{:.2}", F8E5M2::EPSILON), "0.25");
        assert_eq!(F8E5M2::NEG_INFINITY.to_string(), "-inf");
        assert_eq!(format!("{:?}", F8E4M3::NAN), "NaN");
    }

    #[test]
    fn bytes_cast_to_values_in_place() {
        assert_eq!(std::mem::size_of::<F8E4M3>(), 1);
        assert_eq!(std::mem::size_of::<F8E5M2>(), 1);
        let bytes: Vec<u8> = (0..=255).collect();
        let e4: &[F8E4M3] = bytemuck::cast_slice(&bytes);
        let e5: &[F8E5M2] = bytemuck::cast_slice(&bytes);
        for (i, (x, y)) in e4.iter().zip(e5).enumerate() {
            assert_eq!(usize::from(x.to_bits()), i);
            assert_eq!(usize::from(y.to_bits()), i);
        }
        let zeroed: F8E5M2 = bytemuck::Zeroable::zeroed();
        assert_eq!(zeroed.to_bits(), 0);
    }

    /// The conversions are `const`: constants can be computed with them.
    #[test]
    fn conversions_are_const() {
        const HALF: F8E4M3 = F8E4M3::from_f32(0.5);
        const BACK: f32 = HALF.to_f32();
        const BIG: F8E5M2 = F8E5M2::from_f64(1e6);
        assert_eq!(BACK, 0.5);
        assert_eq!(BIG.to_bits(), F8E5M2::MAX.to_bits());
    }
}
