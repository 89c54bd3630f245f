//! `ferrite tokenize` and `ferrite gate tokenizer|template` (not implemented yet).

/// Arguments of `ferrite tokenize`.
#[derive(clap::Args)]
pub struct TokenizeArgs {}

/// Arguments of `ferrite gate`.
#[derive(clap::Args)]
pub struct GateArgs {}

/// Run `ferrite tokenize`; returns the process exit code.
pub fn run_tokenize(_args: TokenizeArgs) -> anyhow::Result<i32> {
    anyhow::bail!("ferrite tokenize is not implemented yet")
}

/// Run `ferrite gate`; returns the process exit code.
pub fn run_gate(_args: GateArgs) -> anyhow::Result<i32> {
    anyhow::bail!("ferrite gate is not implemented yet")
}
