//! `ferrite run --save-session/--load-session` with the real SmolLM2 on CPU. Oracles: a raw
//! prompt restored from its own session file generates exactly what it generated fresh
//! (greedy, bit-exact restore) while reusing all but the last prompt token; loading leaves
//! the file intact (the same continuation twice); a file of another setting (context size)
//! or a damaged file is reported and the run still succeeds from scratch.

mod common;

use std::path::Path;

use common::{run, text};

const MODEL: &str = "smollm2-135m-instruct";

/// The settings of every run here: greedy, short and on the CPU, so runs compare exactly.
const SETTINGS: [&str; 8] = [
    "--backend",
    "cpu",
    "--temp",
    "0",
    "--threads",
    "2",
    "--max-tokens",
    "12",
];

fn ferrite_run(extra: &[&str]) -> (String, String) {
    let model = common::pull(MODEL);
    let args = [&["run", "-m", s(&model)][..], &SETTINGS, extra].concat();
    let out = run(&args);
    assert!(out.status.success(), "{}", text(&out));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn restored_raw_prompt_generates_the_same_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("a.kvsnap");
    let prompt = "The three primary colors are red, yellow and";
    let (fresh, err) = ferrite_run(&[
        "--raw",
        "--ctx",
        "256",
        "-p",
        prompt,
        "--save-session",
        s(&f),
    ]);
    assert!(err.contains("session: saved"), "{err}");
    let (restored, err) = ferrite_run(&[
        "--raw",
        "--ctx",
        "256",
        "-p",
        prompt,
        "--load-session",
        s(&f),
    ]);
    assert_eq!(restored, fresh);
    let reused: Vec<usize> = err
        .lines()
        .find_map(|l| l.strip_prefix("session: reusing "))
        .map(|l| l.split(' ').filter_map(|w| w.parse().ok()).collect())
        .unwrap_or_default();
    assert_eq!(reused.len(), 2, "{err}");
    assert_eq!(
        reused[0] + 1,
        reused[1],
        "all but the last prompt token are reused: {err}"
    );

    // Another context size: reported, not used, and the run still answers the same.
    let (other, err) = ferrite_run(&[
        "--raw",
        "--ctx",
        "512",
        "-p",
        prompt,
        "--load-session",
        s(&f),
    ]);
    assert!(
        err.contains("not using session file") && err.contains("context size"),
        "{err}"
    );
    assert_eq!(other, fresh);
    // A damaged file: the same.
    let mut bytes = std::fs::read(&f).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 1;
    let bad = dir.path().join("bad.kvsnap");
    std::fs::write(&bad, &bytes).unwrap();
    let (plain, err) = ferrite_run(&[
        "--raw",
        "--ctx",
        "256",
        "-p",
        prompt,
        "--load-session",
        s(&bad),
    ]);
    assert!(err.contains("checksum"), "{err}");
    assert_eq!(plain, fresh);
}

#[test]
fn a_saved_chat_continues_the_same_way_each_time_it_is_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("chat.kvsnap");
    ferrite_run(&[
        "--ctx",
        "512",
        "-p",
        "Name a fruit.",
        "--save-session",
        s(&f),
    ]);
    let next = [
        "--ctx",
        "512",
        "-p",
        "And a vegetable?",
        "--load-session",
        s(&f),
    ];
    let (a, err) = ferrite_run(&next);
    assert!(err.contains("session: restored"), "{err}");
    // The saved conversation is the start of the new prompt, so most of it is reused.
    let reused: usize = err
        .lines()
        .find_map(|l| l.strip_prefix("session: reusing "))
        .and_then(|l| l.split(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert!(reused > 20, "{err}");
    let (b, _) = ferrite_run(&next);
    assert_eq!(a, b);
    assert!(f.is_file());
}

/// Runs the chat (`--chat`), feeding `input` as typed lines; returns what it printed.
fn repl(model: &Path, input: &str) -> String {
    let args = [
        &["run", "-m", s(model), "--chat", "--ctx", "512"][..],
        &SETTINGS,
    ]
    .concat();
    let out = common::run_stdin(&args, input);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The chat REPL's `/save` writes the same file as `--save-session` after the same turn
/// (byte for byte), and after `/load` it answers like `--load-session`.
#[test]
fn chat_save_and_load_match_the_session_flags() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::pull(MODEL);
    let (from_repl, from_flag) = (dir.path().join("r.kvsnap"), dir.path().join("f.kvsnap"));
    repl(
        &model,
        &format!("Name a fruit.\n/save {}\n/exit\n", s(&from_repl)),
    );
    ferrite_run(&[
        "--ctx",
        "512",
        "-p",
        "Name a fruit.",
        "--save-session",
        s(&from_flag),
    ]);
    assert_eq!(
        std::fs::read(&from_repl).unwrap(),
        std::fs::read(&from_flag).unwrap()
    );
    let (want, _) = ferrite_run(&[
        "--ctx",
        "512",
        "-p",
        "And a vegetable?",
        "--load-session",
        s(&from_flag),
    ]);
    let got = repl(
        &model,
        &format!("/load {}\nAnd a vegetable?\n/exit\n", s(&from_repl)),
    );
    assert!(!want.trim().is_empty());
    assert!(got.contains(want.trim()), "REPL:\n{got}\nflags:\n{want}");
}
