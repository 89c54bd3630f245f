//! Records the commit the binary is built from as `FERRITE_BUILD_COMMIT`, for benchmark
//! receipts: a binary copied elsewhere still names its own build, not whatever the source
//! tree holds when it runs. `-dirty` is appended when tracked files differ from the commit;
//! outside a git checkout (a source archive) the value is "unknown".

use std::path::Path;
use std::process::Command;

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let root = Path::new(&manifest).join("../..");
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let commit = match git(&["rev-parse", "HEAD"]) {
        Some(head) if !head.is_empty() => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty { format!("{head}-dirty") } else { head }
        }
        _ => "unknown".to_owned(),
    };
    println!("cargo:rustc-env=FERRITE_BUILD_COMMIT={commit}");
    // Run again when the commit moves (HEAD, its reflog, the index) or any source changes
    // (which may make the tree dirty or clean).
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        for f in ["HEAD", "logs/HEAD", "index"] {
            println!("cargo:rerun-if-changed={dir}/{f}");
        }
    }
    for p in ["crates", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
}
