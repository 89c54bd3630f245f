//! `ferrite score` (not implemented yet).

/// Arguments of `ferrite score`.
#[derive(clap::Args)]
pub struct ScoreArgs {}

/// Run `ferrite score`; returns the process exit code.
pub fn run(_args: ScoreArgs) -> anyhow::Result<i32> {
    anyhow::bail!("ferrite score is not implemented yet")
}
