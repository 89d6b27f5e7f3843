//! Block-scaled formats (the OCP Microscaling formats MXFP8 and MXFP4, and NVIDIA's
//! NVFP4): the element and scale types of [`crate::dsl::dot_scaled`].
//!
//! A block-scaled matrix stores narrow elements and, for every `V` consecutive
//! elements along `K`, one scale; the value of an element is `element * scale`.
//!
//! | format | elements | scale | `V` |
//! |---|---|---|---|
//! | MXFP8 | [`crate::fp8::F8E4M3`] or [`crate::fp8::F8E5M2`] | [`E8M0`] | 32 |
//! | MXFP4 | [`E2M1x2`] (two per byte) | [`E8M0`] | 32 |
//! | NVFP4 | [`E2M1x2`] (two per byte) | [`crate::fp8::F8E4M3`] (non-negative) | 16 |
//!
//! - [`E2M1x2`]: two FP4 E2M1 values in a byte, the first (lower index along the
//!   row) in the low nibble. E2M1 is `s.ee.m` with bias 1: the magnitudes 0, 0.5, 1,
//!   1.5, 2, 3, 4, 6; no infinities or NaNs.
//! - [`E8M0`]: an unsigned power of two, `2^(bits - 127)` (so `2^-127` to `2^127`),
//!   `0xFF` is NaN.
//!
//! Both are storage types: in a kernel they are `u8` tiles (their IR type), loaded and
//! stored as bytes and read by `dot_scaled`, which decodes them exactly.

use std::fmt;

/// Two FP4 E2M1 values in a byte: the first in the low nibble (see the module docs).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct E2M1x2(pub u8);

/// An E8M0 scale: `2^(bits - 127)`, `0xFF` NaN (see the module docs).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct E8M0(pub u8);

/// The value of the E2M1 nibble `n` (its low 4 bits), exactly.
pub fn e2m1_to_f32(n: u8) -> f32 {
    const MAG: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    let m = MAG[usize::from(n & 7)];
    if n & 8 != 0 { -m } else { m }
}

/// The E2M1 nibble nearest to `x` (ties to the even encoding), saturating to ±6; NaN
/// becomes +0 (E2M1 has no NaN).
pub fn e2m1_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return 0;
    }
    let sign = if x.is_sign_negative() { 8 } else { 0 };
    let a = x.abs();
    // The midpoints between neighbouring magnitudes; at a tie, the even code wins.
    const MID: [(f32, bool); 7] = [
        (0.25, false),
        (0.75, true),
        (1.25, false),
        (1.75, true),
        (2.5, false),
        (3.5, true),
        (5.0, false),
    ];
    let mut code = 7;
    for (i, &(mid, up_at_tie)) in MID.iter().enumerate() {
        if a < mid || (a == mid && !up_at_tie) {
            code = i as u8;
            break;
        }
    }
    sign | code
}

impl E2M1x2 {
    /// The pair `(first, second)` from two nibbles.
    pub const fn from_nibbles(first: u8, second: u8) -> E2M1x2 {
        E2M1x2((first & 0xF) | (second << 4))
    }

    /// The pair nearest to `(first, second)` ([`e2m1_from_f32`]).
    pub fn from_f32s(first: f32, second: f32) -> E2M1x2 {
        E2M1x2::from_nibbles(e2m1_from_f32(first), e2m1_from_f32(second))
    }

    /// The two values, exactly.
    pub fn to_f32s(self) -> (f32, f32) {
        (e2m1_to_f32(self.0), e2m1_to_f32(self.0 >> 4))
    }
}

impl E8M0 {
    /// The NaN encoding.
    pub const NAN: E8M0 = E8M0(0xFF);

    /// `2^e`, with `e` clamped to E8M0's range, -127 to 127.
    pub fn pow2(e: i32) -> E8M0 {
        E8M0((e.clamp(-127, 127) + 127) as u8)
    }

    /// The scale, exactly (`2^-127` is an f32 subnormal); NaN for `0xFF`.
    pub fn to_f32(self) -> f32 {
        match self.0 {
            0xFF => f32::NAN,
            0 => f32::from_bits(0x0040_0000),
            e => f32::from_bits(u32::from(e) << 23),
        }
    }
}

impl fmt::Debug for E2M1x2 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = self.to_f32s();
        write!(f, "E2M1x2({a}, {b})")
    }
}

impl fmt::Debug for E8M0 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0xFF => f.write_str("E8M0(NaN)"),
            e => write!(f, "E8M0(2^{})", i32::from(e) - 127),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_e2m1_code_round_trips_and_rounding_is_nearest_even() {
        for n in 0..16u8 {
            let x = e2m1_to_f32(n);
            let back = e2m1_from_f32(x);
            // -0 keeps its sign; every other value its code.
            assert_eq!(back, n, "{n:#x} = {x}");
        }
        for (x, want) in [
            (0.2, 0.0),
            (0.25, 0.0),
            (0.3, 0.5),
            (0.75, 1.0),
            (1.25, 1.0),
            (1.75, 2.0),
            (2.5, 2.0),
            (3.5, 4.0),
            (5.0, 4.0),
            (5.5, 6.0),
            (100.0, 6.0),
            (-2.6, -3.0),
        ] {
            assert_eq!(e2m1_to_f32(e2m1_from_f32(x)), want, "{x}");
        }
        assert_eq!(e2m1_from_f32(f32::NAN), 0);
        let p = E2M1x2::from_f32s(1.5, -6.0);
        assert_eq!((p.0 & 0xF, p.0 >> 4), (3, 0xF));
        assert_eq!(p.to_f32s(), (1.5, -6.0));
    }

    #[test]
    fn e8m0_is_a_power_of_two() {
        assert_eq!(E8M0::pow2(0).to_f32(), 1.0);
        assert_eq!(E8M0::pow2(-3).to_f32(), 0.125);
        assert_eq!(E8M0::pow2(127).to_f32(), 2f32.powi(127));
        assert_eq!(
            (E8M0::pow2(300), E8M0::pow2(-300)),
            (E8M0::pow2(127), E8M0(0))
        );
        assert_eq!(E8M0(0).to_f32(), 2f32.powi(-127));
        assert!(E8M0::NAN.to_f32().is_nan());
        for e in 1..255u8 {
            assert_eq!(E8M0(e).to_f32(), 2f64.powi(i32::from(e) - 127) as f32);
        }
    }
}
