//! The rule that a command never writes over a file it reads: an output path (`--csv`,
//! `--tsv`, `--dump-logprobs`, `--save-session` and the chat's `/save`, the output of
//! `quantize` and `synth`) that names the model or another input of the same command is
//! refused before anything is written.
//!
//! Without it, `ferrite run -m M --dump-logprobs M` truncated the memory-mapped model under
//! the running process (which then died of SIGBUS, leaving an empty file), and the commands
//! that write through a temporary file and a rename replaced the input with their output.
//!
//! Files are compared by identity (device and inode, following links), not by name, so
//! `./m.gguf`, an absolute path, a symbolic link or a hard link to the input are all caught.

use std::path::Path;

use anyhow::bail;

/// Fails when `output` (given as `flag`) is the same file as one of `inputs`, each named by
/// what it is to the command (`"model"`, `"fixture"`, ...). An output that does not exist yet
/// cannot be an input.
pub fn check_not_an_input(
    flag: &str,
    output: &Path,
    inputs: &[(&str, &Path)],
) -> anyhow::Result<()> {
    for (what, input) in inputs {
        if same_file(output, input) {
            bail!(
                "{flag} {} is the {what} this command reads ({}); writing it would destroy it, \
                 so choose another path",
                output.display(),
                input.display()
            );
        }
    }
    Ok(())
}

/// Whether `a` and `b` both exist and are the same file.
fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        ma.dev() == mb.dev() && ma.ino() == mb.ino()
    }
    #[cfg(not(unix))]
    {
        // No inode to compare: resolved paths catch every spelling of the name and links.
        let _ = (ma, mb);
        matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_an_input_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, b"GGUF").unwrap();
        let inputs = [("model", model.as_path())];
        let refused = |out: &Path| {
            let err = check_not_an_input("--csv", out, &inputs).unwrap_err();
            assert!(err.to_string().contains("is the model"), "{err}");
        };
        refused(&model);
        refused(&dir.path().join(".").join("m.gguf"));
        #[cfg(unix)]
        {
            let link = dir.path().join("link.gguf");
            std::os::unix::fs::symlink(&model, &link).unwrap();
            refused(&link);
            let hard = dir.path().join("hard.gguf");
            std::fs::hard_link(&model, &hard).unwrap();
            refused(&hard);
        }
        // Another file, a file not yet written, and a copy are all fine.
        let copy = dir.path().join("copy.gguf");
        std::fs::copy(&model, &copy).unwrap();
        check_not_an_input("--csv", &copy, &inputs).unwrap();
        check_not_an_input("--csv", &dir.path().join("new.csv"), &inputs).unwrap();
        assert_eq!(std::fs::read(&model).unwrap(), b"GGUF");
    }
}
