//! Item `quant-dequant`: every format of `quant/MANIFEST.json` dequantized and compared bit
//! for bit with gguf-py's float32 output (the oracle of crates/quant/tests/fixtures.rs).
//! The planted defect flips one nibble of the first Q4_K block. A format the manifest lists
//! that this build cannot dequantize is a failure, never a skip.

use anyhow::Context;
use ferrite_gguf::GgmlType;
use serde_json::Value;

use super::{Env, Outcome, Proof, Target};

/// One format's vectors.
struct Vectors {
    ty: GgmlType,
    bin: Vec<u8>,
    want: Vec<f32>,
}

fn load(env: &Env) -> anyhow::Result<Vec<Vectors>> {
    let manifest = env.fixtures.file_or_repo("quant/MANIFEST.json")?;
    let dir = manifest
        .parent()
        .context("quant manifest has no directory")?;
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&manifest)?)
        .with_context(|| format!("parsing {}", manifest.display()))?;
    let types = v
        .get("types")
        .and_then(Value::as_array)
        .filter(|t| !t.is_empty())
        .with_context(|| format!("{} lists no formats", manifest.display()))?;
    types
        .iter()
        .map(|t| {
            let name = t
                .get("type")
                .and_then(Value::as_str)
                .context("format without a type")?;
            let ty = GgmlType::from_name(name).with_context(|| format!("unknown format {name}"))?;
            let file = |key: &str| -> anyhow::Result<Vec<u8>> {
                let f = dir.join(t.get(key).and_then(Value::as_str).context("file name")?);
                std::fs::read(&f).with_context(|| format!("reading {}", f.display()))
            };
            let bin = file("bin")?;
            let want = file("f32")?
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            Ok(Vectors { ty, bin, want })
        })
        .collect()
}

/// Compares every format; `dequantize` is the component under test.
fn compare(env: &Env, sets: &[Vectors], plant: bool) -> Proof {
    let mut values = 0;
    for v in sets {
        let mut bin = v.bin.clone();
        if plant && v.ty == GgmlType::Q4_K {
            // After d, dmin (2 bytes each) and 12 scale bytes come the quants.
            if let Some(b) = bin.get_mut(16) {
                *b ^= 0x01;
            }
        }
        let mut got = vec![0f32; v.want.len()];
        if let Err(e) = (env.parts.dequantize)(v.ty, &bin, &mut got) {
            return Proof::new(false, format!("{}: {e}", v.ty));
        }
        if let Some(i) = got
            .iter()
            .zip(&v.want)
            .position(|(a, b)| a.to_bits() != b.to_bits())
        {
            return Proof::new(
                false,
                format!(
                    "{}: value {i} is {:e}, expected {:e}",
                    v.ty, got[i], v.want[i]
                ),
            );
        }
        values += got.len();
    }
    Proof::new(
        true,
        format!("{} formats, {values} values bit-exact", sets.len()),
    )
    .count("formats", sets.len())
    .count("values", values)
}

/// Item `quant-dequant`.
pub fn run(env: &Env, _: &Target) -> anyhow::Result<Outcome> {
    let sets = load(env)?;
    if !sets.iter().any(|v| v.ty == GgmlType::Q4_K) {
        return Ok(Outcome::blocked(
            "the quant fixtures hold no Q4_K block to plant a defect in",
        ));
    }
    let planted = compare(env, &sets, true);
    let real = compare(env, &sets, false);
    Ok(Outcome::Judged { planted, real })
}
