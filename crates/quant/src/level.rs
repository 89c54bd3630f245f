//! Run-time SIMD level selection.
//!
//! The level is detected once (`is_x86_feature_detected!` on x86-64; NEON is part of every
//! AArch64 CPU) at first use. The environment variable `FERRITE_SIMD=scalar|avx2|avx512`
//! (`scalar|neon` on AArch64), read once at that same moment, can lower it
//! (for A/B runs and to exercise fallbacks); asking for a level the CPU lacks falls back to
//! the best level the CPU has, because running an unsupported instruction would crash.

use std::fmt;
use std::sync::OnceLock;

/// Name of the environment variable that overrides the detected level.
pub const SIMD_ENV: &str = "FERRITE_SIMD";

/// A family of kernels, from the portable reference to the widest vectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Portable Rust, the reference path.
    Scalar,
    /// AArch64 Advanced SIMD (128-bit vectors, 4 f32 lanes). It exists only on AArch64 and
    /// sits below the x86 levels, which are never available there, so "lower" stays a
    /// total order on every target.
    #[cfg(target_arch = "aarch64")]
    Neon,
    /// x86-64 AVX2 with FMA and F16C (256-bit vectors).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL plus the AVX2 set (512-bit vectors).
    Avx512,
}

impl SimdLevel {
    /// Every level, lowest first.
    #[cfg(not(target_arch = "aarch64"))]
    pub const ALL: [SimdLevel; 3] = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512];

    /// Every level, lowest first.
    #[cfg(target_arch = "aarch64")]
    pub const ALL: [SimdLevel; 4] = [
        SimdLevel::Scalar,
        SimdLevel::Neon,
        SimdLevel::Avx2,
        SimdLevel::Avx512,
    ];

    /// The lower-case name used by `FERRITE_SIMD` and `Display`.
    pub const fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => "neon",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    /// Parses a level name (case-insensitive).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Whether this CPU can run the level's kernels. Cheap: the CPU is probed once per
    /// process (kernels call this on every dispatch).
    pub fn is_available(self) -> bool {
        self <= Self::detect()
    }

    /// The best level this CPU supports (probed once, then cached).
    pub fn detect() -> Self {
        static DETECTED: std::sync::OnceLock<SimdLevel> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "aarch64")]
            if std::arch::is_aarch64_feature_detected!("neon") {
                return SimdLevel::Neon;
            }
            if has_avx2() && has_avx512() {
                SimdLevel::Avx512
            } else if has_avx2() {
                SimdLevel::Avx2
            } else {
                SimdLevel::Scalar
            }
        })
    }
}

impl fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx2() -> bool {
    false
}

#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

#[cfg(not(target_arch = "x86_64"))]
fn has_avx512() -> bool {
    false
}

/// The level to use given the override text (if any) and the detected level: an override
/// can only lower the level; an unknown name is ignored.
pub(crate) fn select(requested: Option<&str>, detected: SimdLevel) -> SimdLevel {
    match requested.and_then(SimdLevel::from_name) {
        Some(req) => req.min(detected),
        None => detected,
    }
}

/// The kernel level in use for this process: detected once, lowered by `FERRITE_SIMD`.
pub fn simd_level() -> SimdLevel {
    static LEVEL: OnceLock<SimdLevel> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let env = std::env::var(SIMD_ENV).ok();
        select(env.as_deref(), SimdLevel::detect())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_lowers_but_never_raises() {
        assert_eq!(select(Some("scalar"), SimdLevel::Avx512), SimdLevel::Scalar);
        assert_eq!(select(Some("AVX2"), SimdLevel::Avx512), SimdLevel::Avx2);
        assert_eq!(select(Some("avx512"), SimdLevel::Avx2), SimdLevel::Avx2);
        assert_eq!(select(Some("bogus"), SimdLevel::Avx2), SimdLevel::Avx2);
        assert_eq!(select(None, SimdLevel::Avx512), SimdLevel::Avx512);
    }

    #[cfg(target_arch = "aarch64")]
    #[test]
    fn neon_is_detected_and_only_lowered_to_scalar() {
        assert_eq!(SimdLevel::detect(), SimdLevel::Neon);
        assert!(!SimdLevel::Avx2.is_available());
        assert_eq!(select(Some("NEON"), SimdLevel::Neon), SimdLevel::Neon);
        assert_eq!(select(Some("scalar"), SimdLevel::Neon), SimdLevel::Scalar);
        assert_eq!(select(Some("avx512"), SimdLevel::Neon), SimdLevel::Neon);
    }

    #[test]
    fn display_names_round_trip() {
        for l in SimdLevel::ALL {
            assert_eq!(SimdLevel::from_name(&l.to_string()), Some(l));
        }
        println!("simd level in use: {}", simd_level());
        assert!(simd_level().is_available());
    }
}
