//! `ferrite inspect` (not implemented yet).

/// Arguments of `ferrite inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {}

/// Run `ferrite inspect`; returns the process exit code.
pub fn run(_args: InspectArgs) -> anyhow::Result<i32> {
    anyhow::bail!("ferrite inspect is not implemented yet")
}
