//! Device top-k selection (`topk_f32`) against the host's selection of the same row
//! (`ferrite_engine::Candidates::from_row`, the CPU sampler's order): the same ids and logit
//! bits, the same first NaN, the log-sum-exp within rounding (rows without NaN: a row with
//! one is refused whole); rows with ties across the
//! cut (lowest ids win), signed zeros, infinities, NaN, rows shorter than k, a Gemma-sized
//! vocabulary. Then a whole model sampling top-k through `eval_candidates` picks the same
//! tokens as the host sampler on the copied-back rows, seed for seed.

use ferrite_cuda::{CudaModel, CudaSession, TOPK_MAX};
use ferrite_engine::{Candidates, Sampler, SamplerConfig};

use crate::{backend, pseudo, synth};

fn rows() -> Vec<(String, Vec<f32>)> {
    let mut v = crate::greedy::rows();
    let mut ties = pseudo(49152, 8);
    for i in (100..49152).step_by(97) {
        ties[i] = 3.0;
    }
    v.push(("500 ties across every cut".into(), ties));
    v.push(("gemma-sized".into(), pseudo(262144, 9)));
    v.push(("all -inf".into(), vec![f32::NEG_INFINITY; 300]));
    v
}

#[test]
fn device_top_k_selects_what_the_host_selects() {
    let Some(b) = backend() else { return };
    for (what, row) in rows() {
        for k in [1, 2, 40, 64, 255, TOPK_MAX] {
            let got = b.top_candidates_host(&row, k).unwrap();
            let want = Candidates::from_row(&row, k);
            assert_eq!(got.first_nan, want.first_nan, "{what} k={k}: first NaN");
            let bits =
                |c: &[(u32, f32)]| c.iter().map(|&(i, l)| (i, l.to_bits())).collect::<Vec<_>>();
            assert_eq!(bits(&got.best), bits(&want.best), "{what} k={k}: selection");
            if want.first_nan.is_some() {
                // The row is refused whole; the host's log-sum-exp is NaN, the device's
                // skips NaN: neither is used.
                continue;
            }
            // The device sums in f64, so it is held to the f64 definition; the host's vector
            // log-sum-exp (f32 lanes per 64-value chunk) has its own bound and tests in
            // `ferrite_quant::kernels::log_sum_exp`.
            let exact = ferrite_quant::kernels::log_sum_exp_ref(&row);
            let d = (got.lse - exact).abs();
            assert!(
                d <= 1e-9 * exact.abs().max(1.0)
                    || (got.lse.is_nan() && want.lse.is_nan())
                    || got.lse == want.lse,
                "{what} k={k}: lse {} vs the f64 definition's {exact}",
                got.lse
            );
        }
        println!("top-k {what}: ok for k in 1..={TOPK_MAX}");
    }
    assert!(b.launch_counts()["topk_f32"] > 0);
}

#[test]
fn top_k_sampling_on_the_device_picks_the_host_tokens() {
    let Some(b) = backend() else { return };
    let m = synth::model(&synth::llama_small());
    let cm = CudaModel::load(b.clone(), &m).unwrap();
    let mut host = CudaSession::new(&cm, 64).unwrap();
    let mut dev = CudaSession::new(&cm, 64).unwrap();
    for cfg in [
        SamplerConfig {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            seed: 17,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temperature: 1.5,
            top_k: TOPK_MAX,
            min_p: 0.01,
            n_logprobs: 5,
            seed: 3,
            ..SamplerConfig::default()
        },
    ] {
        host.truncate(0);
        dev.truncate(0);
        let mut hs = Sampler::new(cfg.clone()).unwrap();
        let mut ds = Sampler::new(cfg.clone()).unwrap();
        let need = ds.candidates_needed().unwrap();
        let prompt: Vec<u32> = (0..9).map(|i| (i * 41 + 3) % 301).collect();
        let (mut th, mut td) = (prompt.clone(), prompt);
        for step in 0..24 {
            let row = host.eval(&th).unwrap();
            let a = hs.sample(&row, &[]).unwrap();
            let c = dev.eval_candidates(&td, need).unwrap();
            assert_eq!(c.n_vocab, row.len());
            let b = ds
                .sample_candidates(&Candidates {
                    best: c.best,
                    lse: c.lse,
                    first_nan: c.first_nan,
                    n_vocab: c.n_vocab,
                })
                .unwrap();
            assert_eq!(a.token, b.token, "{cfg:?} step {step}");
            assert!((a.logprob - b.logprob).abs() <= 1e-5, "step {step} logprob");
            th = vec![a.token];
            td = vec![b.token];
        }
        println!("top-k sampling {cfg:?}: 24 steps, same tokens");
    }
}
