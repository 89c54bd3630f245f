//! Run-time SIMD level selection.
//!
//! The level is detected once (`is_x86_feature_detected!`) at first use. The environment
//! variable `FERRITE_SIMD=scalar|avx2|avx512`, read once at that same moment, can lower it
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
    /// x86-64 AVX2 with FMA and F16C (256-bit vectors).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL plus the AVX2 set (512-bit vectors).
    Avx512,
}

impl SimdLevel {
    /// Every level, lowest first.
    pub const ALL: [SimdLevel; 3] = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512];

    /// The lower-case name used by `FERRITE_SIMD` and `Display`.
    pub const fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
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

    #[test]
    fn display_names_round_trip() {
        for l in SimdLevel::ALL {
            assert_eq!(SimdLevel::from_name(&l.to_string()), Some(l));
        }
        println!("simd level in use: {}", simd_level());
        assert!(simd_level().is_available());
    }
}
