//! Item `speed`: median prefill and decode tokens/s of one CPU session, judged against the
//! `--baseline` receipt's figures with `bench --compare`'s rule (more than 10 % slower is a
//! regression, 5–10 % is reported as worth investigating). Only a baseline of the same model
//! file and CPU is comparable; without one the figures are recorded and the item is blocked.
//! Speed is measured only after the correctness items of the same run; nothing here may
//! judge speed without a baseline.

use std::time::Instant;

use ferrite_model::{KvType, Outputs, Precision, Session};

use super::{Env, Outcome, Proof, Target, argmax};
use crate::bench::compare::{REGRESSION, Verdict, slowdown, verdict};

/// The figures compared, all higher-is-better.
const METRICS: [&str; 2] = ["prefill_tps_median", "decode_tps_median"];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn measure(env: &Env, t: &Target) -> anyhow::Result<Proof> {
    let l = t.cpu(env, Precision::Default)?;
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    let mut prompt = l.tokenizer.encode(&text, true, false);
    prompt.truncate(64);
    let (decode, trials) = if env.quick { (16, 3) } else { (64, 5) };
    let mut s = Session::new(&l.model, &l.pool, 256, KvType::F16)?;
    // One untimed pass warms the caches and the thread pool.
    s.eval(&prompt, Outputs::Last)?;
    let (mut prefill_tps, mut decode_tps) = (Vec::new(), Vec::new());
    for _ in 0..trials {
        s.reset();
        let t0 = Instant::now();
        let mut next = argmax(s.eval(&prompt, Outputs::Last)?.data);
        prefill_tps.push(prompt.len() as f64 / t0.elapsed().as_secs_f64());
        let t1 = Instant::now();
        for _ in 0..decode {
            next = argmax(s.eval(&[next], Outputs::Last)?.data);
        }
        decode_tps.push(f64::from(decode) / t1.elapsed().as_secs_f64());
    }
    Ok(Proof::new(true, "")
        .figure("prefill_tps_median", median(prefill_tps))
        .figure("decode_tps_median", median(decode_tps))
        .count("prompt_tokens", prompt.len())
        .count("decode_tokens", decode as usize)
        .count("trials", trials))
}

/// Judges `new` against `old` figure by figure.
fn judge(old: &std::collections::BTreeMap<String, f64>, new: &Proof) -> Proof {
    let mut worst = Verdict::Ok;
    let mut parts = Vec::new();
    for m in METRICS {
        let (Some(&o), Some(&n)) = (old.get(m), new.figures.get(m)) else {
            return Proof::new(false, format!("{m} missing from a receipt"));
        };
        let v = slowdown(o, n, true).map_or(Verdict::Investigate, verdict);
        worst = worst.max(v);
        parts.push(format!("{m} {o:.1} -> {n:.1} ({})", v.name()));
    }
    let mut p = Proof::new(worst != Verdict::Regression, parts.join(", "));
    p.figures = new.figures.clone();
    p.counts = new.counts.clone();
    p.figures.insert("regression_threshold".into(), REGRESSION);
    p
}

/// Item `speed`.
pub fn run(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    let measured = measure(env, t)?;
    let Some(baseline) = &env.baseline else {
        return Ok(Outcome::Blocked {
            reason: "no --baseline receipt given".into(),
            measured: Some(measured),
        });
    };
    let cpu = crate::bench::receipt::cpu_model();
    let old = baseline.items.iter().find(|i| {
        i.item == "speed"
            && i.verdict != "failed"
            && i.model_sha256 == t.sha256
            && !i.figures.is_empty()
    });
    let Some(old) = old.filter(|_| baseline.machine.cpu_model == cpu) else {
        return Ok(Outcome::Blocked {
            reason: "the --baseline receipt has no speed figures of this model file on this CPU"
                .into(),
            measured: Some(measured),
        });
    };
    let mut slowed = Proof::new(true, "");
    for m in METRICS {
        if let Some(&v) = measured.figures.get(m) {
            slowed.figures.insert(m.to_owned(), v * 0.8);
        }
    }
    let planted = judge(&old.figures, &slowed);
    let real = judge(&old.figures, &measured);
    Ok(Outcome::Judged { planted, real })
}
