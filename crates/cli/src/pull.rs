//! `ferrite pull` (not implemented yet).

/// Arguments of `ferrite pull`.
#[derive(clap::Args)]
pub struct PullArgs {}

/// Run `ferrite pull`; returns the process exit code.
pub fn run(_args: PullArgs) -> anyhow::Result<i32> {
    anyhow::bail!("ferrite pull is not implemented yet")
}
