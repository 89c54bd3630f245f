//! `ferrite serve` (not implemented yet).

/// Arguments of `ferrite serve`.
#[derive(clap::Args)]
pub struct ServeArgs {}

/// Run `ferrite serve`; returns the process exit code.
pub fn run(_args: ServeArgs) -> anyhow::Result<i32> {
    anyhow::bail!("ferrite serve is not implemented yet")
}
