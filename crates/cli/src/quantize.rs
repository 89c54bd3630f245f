//! `ferrite quantize IN.gguf OUT.gguf --type TYPE`: rewrite a model with another type mix.
//!
//! Owns the command line, the progress bar (stderr) and the summary table (stdout); the type
//! rule and the conversion are `ferrite-quantize`'s (documented in docs/quantize.md).

use std::path::{Path, PathBuf};

use anyhow::Context;
use ferrite_gguf::Gguf;
use ferrite_quantize::{Mix, Progress, QuantizeOptions, Summary, quantize_file};

/// Arguments of `ferrite quantize`.
#[derive(clap::Args)]
pub struct QuantizeArgs {
    /// Input model: a .gguf path or a known model name.
    input: String,
    /// Output .gguf file (written to a temporary file next to it, then renamed).
    output: PathBuf,
    /// Type mix: q8_0, q4_0, q4_1, q5_0, q5_1, q4_k_m, q5_k_m, q6_k, f16, bf16 or f32.
    #[arg(long = "type", value_name = "TYPE")]
    ty: String,
    /// Worker threads (default: all cores).
    #[arg(long, value_parser = crate::backend::threads_arg())]
    threads: Option<usize>,
    /// Allow dequantizing already-quantized tensors and quantizing them again (loses more
    /// precision than quantizing from F32/F16/BF16).
    #[arg(long)]
    allow_requantize: bool,
}

const MIB: f64 = 1024.0 * 1024.0;

/// Run `ferrite quantize`; returns the process exit code.
pub fn run(args: QuantizeArgs) -> anyhow::Result<i32> {
    // Parsed here, not by clap, so a bad name is one `error:` line with exit code 1.
    let mix: Mix = args.ty.parse()?;
    let path = crate::models::resolve(&args.input)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
        .max(1);
    let opts = QuantizeOptions {
        mix,
        threads,
        allow_requantize: args.allow_requantize,
    };
    quantize_path(&path, &args.output, &opts)?;
    Ok(0)
}

/// Quantizes the GGUF at `path` into `output` with a progress bar, then prints the table.
pub fn quantize_path(path: &Path, output: &Path, opts: &QuantizeOptions) -> anyhow::Result<()> {
    crate::outputs::check_not_an_input("output", output, &[("model", path)])?;
    let input = Gguf::open(path).with_context(|| format!("reading {}", path.display()))?;
    let (mix, threads) = (opts.mix, opts.threads);
    let total: u64 = input.tensors().iter().map(|t| t.n_bytes).sum();
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(total),
        indicatif::ProgressDrawTarget::stderr(),
    );
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
        )
        .context("progress bar template")?,
    );
    let summary = quantize_file(&input, output, opts, &mut |p| match p {
        Progress::Tensor {
            name,
            ty,
            done_bytes,
            ..
        } => {
            bar.set_position(done_bytes);
            bar.set_message(format!("{name} -> {ty}"));
        }
        Progress::Writing => bar.set_message(format!("writing {}", output.display())),
        _ => {}
    });
    bar.finish_and_clear();
    let summary = summary?;
    print!("{}", table(&summary));
    for (name, wanted, used) in &summary.fallbacks {
        eprintln!("note: {name}: row length does not fit {wanted} blocks, used {used}");
    }
    eprintln!(
        "wrote {} ({mix}, {:.1} MiB from {:.1} MiB of tensors) in {:.1} s, {:.1} MB/s of input, \
         {threads} threads",
        output.display(),
        summary.output_bytes as f64 / MIB,
        summary.input_bytes as f64 / MIB,
        summary.elapsed.as_secs_f64(),
        summary.input_bytes as f64 / 1e6 / summary.convert_time.as_secs_f64().max(1e-9),
    );
    Ok(())
}

/// The per-type table: tensors, elements, MiB and bits per weight, then a total row.
fn table(s: &Summary) -> String {
    let mut out = format!(
        "{:<6} {:>8} {:>14} {:>10} {:>7}\n",
        "type", "tensors", "elements", "MiB", "bpw"
    );
    let row = |name: &str, tensors: usize, elements: u64, bytes: u64| {
        format!(
            "{name:<6} {tensors:>8} {elements:>14} {:>10.2} {:>7.3}\n",
            bytes as f64 / MIB,
            bytes as f64 * 8.0 / elements.max(1) as f64
        )
    };
    let (mut n, mut e, mut b) = (0, 0, 0);
    for t in &s.types {
        out += &row(t.ty.name(), t.tensors, t.elements, t.bytes);
        (n, e, b) = (n + t.tensors, e + t.elements, b + t.bytes);
    }
    out += &row("total", n, e, b);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_gguf::GgmlType;
    use ferrite_quantize::TypeTotals;

    #[test]
    fn table_totals_rows_and_reports_bits_per_weight() {
        let s = Summary {
            mix: Mix::Q8_0,
            types: vec![
                TypeTotals {
                    ty: GgmlType::F32,
                    tensors: 2,
                    elements: 100,
                    bytes: 400,
                },
                TypeTotals {
                    ty: GgmlType::Q8_0,
                    tensors: 1,
                    elements: 64,
                    bytes: 68,
                },
            ],
            converted: 1,
            copied: 2,
            fallbacks: Vec::new(),
            input_bytes: 656,
            output_bytes: 1000,
            convert_time: std::time::Duration::from_millis(1),
            elapsed: std::time::Duration::from_millis(2),
        };
        let t = table(&s);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(
            lines[1].starts_with("F32") && lines[1].ends_with("32.000"),
            "{t}"
        );
        assert!(
            lines[2].starts_with("Q8_0") && lines[2].ends_with("8.500"),
            "{t}"
        );
        assert!(
            lines[3].starts_with("total") && lines[3].contains(" 3 "),
            "{t}"
        );
    }
}
