//! The engine's KV cache type: a CPU engine keeps the type it is given and says so on its
//! backend line; a CUDA engine refuses any type but f16 with a configuration error, before
//! it touches a device (so this runs on machines without one). Needs SmolLM2 (skipped with
//! a `skipped:` line when absent; a failure with FERRITE_TEST_MODELS=1).

use ferrite_engine::{Engine, EngineBackend, EngineConfig, EngineError};
use ferrite_model::KvType;

fn config(path: std::path::PathBuf, backend: EngineBackend, kv: KvType) -> EngineConfig {
    EngineConfig {
        model_path: path,
        model_id: "smollm2".into(),
        aliases: Vec::new(),
        n_ctx: 64,
        parallel: 1,
        threads: 2,
        queue_limit: 4,
        prefill_chunk: 8,
        prefix_cache: Default::default(),
        backend,
        kv,
        speculation: None,
    }
}

#[test]
fn cpu_engines_keep_q8_and_cuda_engines_refuse_it() {
    let Some(path) = ferrite_testkit::real_model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let engine = Engine::start(config(path.clone(), EngineBackend::Cpu, KvType::Q8))
        .expect("a CPU engine with a q8 cache starts");
    assert!(
        engine.backend_line().ends_with(" kv=q8"),
        "{}",
        engine.backend_line()
    );
    match Engine::start(config(path, EngineBackend::Cuda, KvType::Q8)) {
        Err(EngineError::Config(why)) => assert!(why.contains("f16 KV cache"), "{why}"),
        other => panic!("expected the q8 refusal, got {:?}", other.map(|_| ())),
    }
}
