//! `ferrite bench` (not implemented yet).

/// Arguments of `ferrite bench`.
#[derive(clap::Args)]
pub struct BenchArgs {}

/// Run `ferrite bench`; returns the process exit code.
pub fn run(_args: BenchArgs) -> anyhow::Result<i32> {
    anyhow::bail!("ferrite bench is not implemented yet")
}
