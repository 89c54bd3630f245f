//! Device greedy choice (`argmax_f32`) against the CPU sampler's greedy rule on rows with
//! the cases that rule settles: ties (lowest id), -0 against +0 (total order), infinities,
//! NaN (an error at the first NaN's index), lengths that do not fill the block; and a whole
//! model's greedy decode picking the same tokens through `eval_greedy` as through `eval`.

use ferrite_cuda::{CudaModel, CudaSession};
use ferrite_engine::{SampleError, Sampler, SamplerConfig};

use crate::model::argmax;
use crate::{backend, pseudo, synth};

pub(crate) fn rows() -> Vec<(String, Vec<f32>)> {
    let mut v = Vec::new();
    for n in [1, 7, 301, 1024, 1025, 49152] {
        v.push((format!("random {n}"), pseudo(n, n as u64)));
    }
    let mut tie = pseudo(49152, 3);
    for i in [40000, 777, 31000] {
        tie[i] = 5.0;
    }
    v.push(("three-way tie".into(), tie));
    v.push(("all equal".into(), vec![0.25; 5000]));
    v.push(("-0 and +0".into(), vec![-0.0, -1.0, 0.0, -0.0, 0.0]));
    v.push(("only -0".into(), vec![-2.0, -0.0, -0.0]));
    let mut inf = pseudo(3000, 4);
    inf[2999] = f32::INFINITY;
    inf[5] = f32::NEG_INFINITY;
    v.push(("+inf last".into(), inf));
    v.push(("all -inf but one".into(), {
        let mut r = vec![f32::NEG_INFINITY; 2048];
        r[1500] = -1e30;
        r
    }));
    let mut nan = pseudo(49152, 5);
    nan[20000] = f32::NAN;
    nan[7] = f32::NAN;
    v.push(("NaN at 7 and 20000".into(), nan));
    v
}

#[test]
fn device_greedy_follows_the_cpu_sampler() {
    let Some(b) = backend() else { return };
    for (what, row) in rows() {
        let got = b.argmax_host(&row).unwrap();
        let mut s = Sampler::new(SamplerConfig::default()).unwrap();
        match s.sample(&row, &[]) {
            Ok(want) => {
                assert_eq!(got.first_nan, None, "{what}");
                assert_eq!(got.token, want.token, "{what}: token");
                let d = (got.logprob - want.logprob).abs();
                assert!(
                    d <= 1e-6 || (got.logprob.is_nan() && want.logprob.is_nan()),
                    "{what}: logprob {} vs {}",
                    got.logprob,
                    want.logprob
                );
            }
            Err(SampleError::NanLogit { index }) => {
                assert_eq!(got.first_nan, Some(index), "{what}: first NaN");
            }
            Err(e) => panic!("{what}: CPU sampler {e}"),
        }
        println!("greedy {what}: {got:?}");
    }
}

#[test]
fn eval_greedy_picks_what_eval_picks() {
    let Some(b) = backend() else { return };
    let m = synth::model(&synth::llama_small());
    let cm = CudaModel::load(b.clone(), &m).unwrap();
    let mut a = CudaSession::new(&cm, 64).unwrap();
    let mut g = CudaSession::new(&cm, 64).unwrap();
    let prompt: Vec<u32> = (0..9).map(|i| (i * 37 + 11) % 301).collect();
    let mut ta = argmax(&a.eval(&prompt).unwrap()) as u32;
    let mut tg = g.eval_greedy(&prompt).unwrap().token;
    for step in 0..24 {
        assert_eq!(ta, tg, "step {step}");
        ta = argmax(&a.eval(&[ta]).unwrap()) as u32;
        tg = g.eval_greedy(&[tg]).unwrap().token;
    }
    assert!(b.launch_counts()["argmax_f32"] > 0);
}
