//! The official openai and anthropic Python SDKs against `ferrite serve` (tests/python/).
//!
//! The test makes a virtual environment under the cargo target's test tmpdir (kept between
//! runs) and installs both SDKs with pip from the package index. It prints `skipped: …` only
//! when Python or its venv module is missing; once a venv exists, a failing pip or SDK check
//! fails the test.

mod common;
mod server_util;

use std::path::{Path, PathBuf};
use std::process::Command;

const MODEL: &str = "smollm2-135m-instruct";

fn venv() -> Result<PathBuf, String> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sdk-venv");
    let python = dir.join("bin/python");
    let ready = |p: &Path| {
        Command::new(p)
            .args(["-c", "import openai, anthropic"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if python.is_file() && ready(&python) {
        return Ok(python);
    }
    let made = Command::new("python3")
        .args(["-m", "venv", "--clear"])
        .arg(&dir)
        .output()
        .map_err(|e| format!("python3 not runnable: {e}"))?;
    if !made.status.success() {
        return Err(format!(
            "python3 -m venv failed: {}",
            String::from_utf8_lossy(&made.stderr)
        ));
    }
    let pip = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "openai",
            "anthropic",
        ])
        .output()
        .expect("running pip in the new venv");
    assert!(
        pip.status.success(),
        "pip install openai anthropic failed:\n{}",
        common::text(&pip)
    );
    assert!(ready(&python), "SDKs not importable after pip install");
    Ok(python)
}

#[test]
fn python_sdks_against_the_server() {
    let python = match venv() {
        Ok(p) => p,
        Err(reason) => {
            println!("skipped: {reason}");
            return;
        }
    };
    let model = common::pull(MODEL);
    let server = server_util::Server::start(&[
        "-m",
        model.to_str().unwrap(),
        "--ctx",
        "512",
        "--parallel",
        "2",
        "--threads",
        "2",
        "--api-key",
        "sdk-key",
    ]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/python/test_sdk.py");
    let out = Command::new(&python)
        .arg(&script)
        .env("FERRITE_BASE_URL", format!("http://{}", server.addr))
        .env("FERRITE_MODEL", MODEL)
        .env("FERRITE_API_KEY", "sdk-key")
        .output()
        .expect("running the SDK script");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "SDK checks failed:\n{}\nserver log:\n{}",
        common::text(&out),
        server.log()
    );
}
