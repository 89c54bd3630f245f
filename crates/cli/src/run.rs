//! `ferrite run` (not implemented yet).

/// Arguments of `ferrite run`.
#[derive(clap::Args)]
pub struct RunArgs {}

/// Run `ferrite run`; returns the process exit code.
pub fn run(_args: RunArgs) -> anyhow::Result<i32> {
    anyhow::bail!("ferrite run is not implemented yet")
}
