//! `ferrite synth` (not implemented yet).

/// Arguments of `ferrite synth`.
#[derive(clap::Args)]
pub struct SynthArgs {}

/// Run `ferrite synth`; returns the process exit code.
pub fn run(_args: SynthArgs) -> anyhow::Result<i32> {
    anyhow::bail!("ferrite synth is not implemented yet")
}
