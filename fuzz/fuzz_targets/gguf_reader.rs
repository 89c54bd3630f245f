//! Feeds arbitrary bytes to the GGUF reader. The reader must return `Ok` or a `GgufError`,
//! never panic, and never allocate more than the input could back (libFuzzer's
//! `-rss_limit_mb` catches the latter).

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = ferrite_gguf::Gguf::from_bytes(data.to_vec()) {
        // Touch everything a consumer would, so a bad invariant shows up as a panic here.
        for t in g.tensors() {
            assert_eq!(g.tensor_data(t).len() as u64, t.n_bytes);
            let _ = t.n_elements();
        }
        for (key, value) in g.metadata() {
            let _ = (g.get_u64(key), g.get_f32(key), g.get_str_array(key), value.type_name());
        }
    }
});
