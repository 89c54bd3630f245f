//! Item `build` (static): what the binary says about itself. Nothing is run against a
//! reference, so the verdict is `static`, never `passed`.

use super::{Env, Outcome, Proof, Target};

/// Item `build`.
pub fn run(_: &Env, _: &Target) -> anyhow::Result<Outcome> {
    let debug = cfg!(debug_assertions);
    let level = ferrite_quant::simd_level();
    Ok(Outcome::Static(
        Proof::new(
            !debug,
            format!(
                "{} build; SIMD level {level} chosen at run time",
                if debug {
                    "debug (unoptimized)"
                } else {
                    "release"
                }
            ),
        )
        .count("debug_assertions", usize::from(debug)),
    ))
}
