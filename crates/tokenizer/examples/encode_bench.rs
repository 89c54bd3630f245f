//! Encode throughput of a model's tokenizer on a text file: prints the token count and the
//! median / min / max of several timed encodes, and optionally checks the ids against a
//! reference (a JSON array of ids, e.g. produced by the Python `tokenizers` package).
//!
//! ```text
//! cargo run --release -p ferrite-tokenizer --example encode_bench -- MODEL.gguf TEXT [IDS.json]
//! ```

use std::time::Instant;

use ferrite_gguf::Gguf;
use ferrite_tokenizer::Tokenizer;

const TRIALS: usize = 7;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, text_path, rest @ ..] = args.as_slice() else {
        return Err("usage: encode_bench MODEL.gguf TEXT [IDS.json]".into());
    };
    let t0 = Instant::now();
    let tok = Tokenizer::from_gguf(&Gguf::open(model.as_ref())?)?;
    let load = t0.elapsed();
    let text = std::fs::read_to_string(text_path)?;
    // Warm-up run, also the one whose ids are checked.
    let ids = tok.encode(&text, false, true);
    let mut times: Vec<f64> = (0..TRIALS)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(tok.encode(&text, false, true));
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let median = times[TRIALS / 2];
    println!(
        "{model}: load {:.1} ms; {} tokens, {} bytes; encode median {:.2} ms (min {:.2}, max {:.2}) = {:.2} MB/s",
        load.as_secs_f64() * 1e3,
        ids.len(),
        text.len(),
        median * 1e3,
        times[0] * 1e3,
        times[TRIALS - 1] * 1e3,
        text.len() as f64 / median / 1e6
    );
    if let Some(reference) = rest.first() {
        let want: Vec<u32> = serde_json::from_str(&std::fs::read_to_string(reference)?)?;
        match want.iter().zip(&ids).position(|(a, b)| a != b) {
            None if want.len() == ids.len() => println!("ids identical to {reference}"),
            at => println!(
                "ids DIFFER from {reference}: first at {:?}, lengths {} vs {}",
                at,
                want.len(),
                ids.len()
            ),
        }
    }
    Ok(())
}
