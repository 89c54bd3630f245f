//! Streaming GGUF output: the file is laid out first (metadata, tensor table, offsets), then
//! each tensor is produced and written in turn, so a conversion holds at most one re-encoded
//! tensor in memory instead of the whole model.
//!
//! The header comes from ferrite-gguf's writer itself, so it follows the same rules as every
//! other file ferrite writes: the writer is given every tensor with placeholder bytes (one
//! shared zero buffer, never read), run once into a sink to learn the file size, and run
//! again with only the header (everything before the data section) let through. The data
//! section then starts at `file size - data length` and each tensor sits at its offset from
//! the writer's tensor table.

use std::io::Write;
use std::path::Path;

use ferrite_gguf::GgufWriter;

use crate::{ConvertError, Layout, Summary, TensorDone};

/// Passes the first `left` bytes through and swallows the rest.
struct HeadOnly<W> {
    inner: W,
    left: u64,
}

impl<W: Write> Write for HeadOnly<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.left) as usize;
        self.inner.write_all(&buf[..n])?;
        self.left -= n as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> ConvertError + '_ {
    move |source| ConvertError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes `layout` to `out` (the file `path`, which errors name), producing each tensor's
/// bytes only when it is written and recording it in `summary`.
pub(crate) fn stream(
    layout: &Layout<'_>,
    out: &mut dyn Write,
    path: &Path,
    summary: &mut Summary,
    progress: &mut dyn FnMut(TensorDone<'_>),
) -> Result<(), ConvertError> {
    let largest = layout.tensors.iter().map(|t| t.n_bytes).max().unwrap_or(0);
    let zeros = vec![0u8; largest as usize];
    let mut w = GgufWriter::new();
    for (k, v) in &layout.metadata {
        w.add_metadata(k.clone(), v.clone())?;
    }
    for t in &layout.tensors {
        w.add_tensor(t.name.clone(), t.ty, &t.dims, &zeros[..t.n_bytes as usize])?;
    }
    let total = w.write_to(std::io::sink())?;
    let infos = w.tensor_infos();
    let data_len = infos.last().map_or(0, |i| {
        (i.offset + i.n_bytes).next_multiple_of(w.alignment())
    });
    let data_start = total - data_len;

    let mut head = HeadOnly {
        inner: &mut *out,
        left: data_start,
    };
    w.write_to(&mut head)?;
    if head.left != 0 {
        return Err(ConvertError::BadTensor {
            tensor: String::new(),
            reason: format!("the header came {} bytes short", head.left),
        });
    }
    let mut pos = data_start;
    for (t, info) in layout.tensors.iter().zip(&infos) {
        let data = layout.data(t)?;
        pad(out, &mut pos, data_start + info.offset).map_err(io(path))?;
        out.write_all(&data).map_err(io(path))?;
        pos += data.len() as u64;
        summary.record(t, layout.tensors.len(), progress);
    }
    pad(out, &mut pos, total).map_err(io(path))?;
    out.flush().map_err(io(path))
}

fn pad(out: &mut dyn Write, pos: &mut u64, target: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while *pos < target {
        let n = (target - *pos).min(ZEROS.len() as u64);
        out.write_all(&ZEROS[..n as usize])?;
        *pos += n;
    }
    Ok(())
}
