//! A reader that closes ferrite's stdout early (`… | head`) ends the run with success and no
//! panic report: exit code 0, not 101.

mod common;

use std::io::Read;
use std::process::Stdio;

#[test]
fn closed_stdout_pipe_is_not_a_panic() {
    let model = common::pull("smollm2-135m-instruct");
    let text = std::fs::read_to_string(ferrite_testkit::nll_text()).unwrap();
    // ~35 KB of text gives a JSON listing far larger than a pipe buffer (64 KiB).
    let mut child = common::ferrite()
        .args(["tokenize", "-m", model.to_str().unwrap(), "--json", &text])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}
