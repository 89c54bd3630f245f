//! `ferrite gate`: evidence that a build is good on this machine and model. `gate
//! tokenizer|template` compare one fixture file exactly; `gate release` runs the declared
//! release gate (manifest.json) and writes a receipt; `gate compare` shows what changed
//! between two receipts.
//!
//! This module only dispatches. The gate never shells out to `cargo test`: every item calls
//! the library crates in-process, and the gate must never report an item it did not run as
//! passed.

mod fixture;
mod fixtures;
mod items;
mod manifest;
mod receipt;
mod release;

/// Arguments of `ferrite gate`.
#[derive(clap::Args)]
pub struct GateArgs {
    #[command(subcommand)]
    kind: GateKind,
}

#[derive(clap::Subcommand)]
enum GateKind {
    /// Check ids, ids with special tokens and decoded text against a tokenizer fixture.
    Tokenizer(fixture::GateFileArgs),
    /// Check rendered chat templates and their ids against a chat fixture.
    Template(fixture::GateFileArgs),
    /// Run the release gate's items and write a receipt.
    Release(release::ReleaseArgs),
    /// Show what changed between two release-gate receipts.
    Compare(receipt::CompareArgs),
}

/// Run `ferrite gate`; returns the process exit code.
pub fn run(args: GateArgs) -> anyhow::Result<i32> {
    match args.kind {
        GateKind::Tokenizer(f) => fixture::run_file(fixture::FixtureKind::Tokenizer, &f),
        GateKind::Template(f) => fixture::run_file(fixture::FixtureKind::Template, &f),
        GateKind::Release(r) => release::run(r),
        GateKind::Compare(c) => receipt::run_compare(&c),
    }
}
