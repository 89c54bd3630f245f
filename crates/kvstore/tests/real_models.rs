//! Disk round trips on the two real models (CPU): a session restored from a snapshot file at
//! several prefix lengths continues with logits bit-identical to a fresh computation of the
//! whole prompt, including prefixes on both sides of Gemma 3's 512-token sliding window and
//! one token before the end. Skips (printing why) when the models are not in the cache,
//! unless FERRITE_TEST_MODELS=1.

use ferrite_cpu::ThreadPool;
use ferrite_kvstore::{Compat, model_sha256, read_snapshot, write_snapshot};
use ferrite_model::{KvType, LoadOptions, Model, Outputs, Session};

fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 200 + (i * 7919 + salt) % 3000)
        .collect()
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn check(file: &str, n: usize, prefixes: &[usize]) {
    let Some(path) = ferrite_testkit::real_model(file) else {
        return;
    };
    let model = Model::load(&path, LoadOptions::default()).unwrap();
    let pool = ThreadPool::new(2).unwrap();
    let ctx = 1024;
    let all = prompt(n, 13);
    let mut fresh = Session::new(&model, &pool, ctx, KvType::F16).unwrap();
    let want = bits(fresh.eval(&all, Outputs::Last).unwrap().last().unwrap());
    let sha = model_sha256(&path, None).unwrap();
    let compat = Compat::for_session(&model, sha, KvType::F16, ctx);
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s.kvsnap");
    let bytes = write_snapshot(&snap, &compat, &fresh.export_state(n).unwrap(), b"").unwrap();
    let mut s = Session::new(&model, &pool, ctx, KvType::F16).unwrap();
    for &p in prefixes {
        // Read the file anew each time: restoring the same file repeatedly must work.
        let restored = read_snapshot(&snap, &compat).unwrap();
        s.import_state(&restored.state, p).unwrap();
        let got = bits(s.eval(&all[p..], Outputs::Last).unwrap().last().unwrap());
        assert!(got == want, "{file}: prefix {p} of {n} differs");
    }
    // The whole state carries the final logits: no evaluation needed.
    let restored = read_snapshot(&snap, &compat).unwrap();
    s.import_state(&restored.state, n).unwrap();
    assert_eq!(bits(s.next_logits().unwrap()), want);
    assert!(snap.is_file());
    println!(
        "ran: {file} sha256={} n={n} prefixes={prefixes:?} snapshot={bytes} bytes",
        sha.iter().map(|b| format!("{b:02x}")).collect::<String>()
    );
}

#[test]
fn smollm2_restores_bit_identically() {
    check(ferrite_testkit::SMOLLM2, 300, &[1, 150, 299]);
}

#[test]
fn gemma3_restores_bit_identically_across_the_sliding_window() {
    check(ferrite_testkit::GEMMA3, 600, &[300, 511, 513, 599]);
}
