//! Item `gguf-mutants`: copies of the model file with bytes of the metadata and tensor table
//! flipped or overwritten (the data section only changes weights), each parsed, loaded and,
//! when it loads, run for two tokens. The oracle is a count: a mutant may load or be
//! refused, never panic (crates/model/src/model.rs's mutation test, on the user's own file).
//!
//! Panics are caught and counted with the default panic report silenced for the duration;
//! nothing here may leave that hook replaced.

use std::panic::{AssertUnwindSafe, catch_unwind};

use ferrite_gguf::Gguf;
use ferrite_model::{KvType, LoadOptions, Model, Outputs, Session};

use super::{Env, Outcome, Proof, Target};

/// splitmix64: a fixed, seedable stream, so a receipt's mutants are the same every run.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Mutant `i`: one to three edits inside `[0, header)`.
fn mutate(rng: &mut Mix, base: &[u8], header: usize) -> Vec<u8> {
    let mut b = base.to_vec();
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(header);
        match rng.below(3) {
            0 => b[at] ^= 1 << rng.below(8),
            1 => b[at] = rng.next() as u8,
            _ => {
                let v = [u64::MAX, u64::from(u32::MAX), 1 << 40, 0][rng.below(4)];
                for (slot, byte) in b[at..].iter_mut().zip(v.to_le_bytes()) {
                    *slot = byte;
                }
            }
        }
    }
    b
}

/// Loads a mutant and runs two tokens; `true` when it loaded.
fn load_and_run(bytes: Vec<u8>, pool: &ferrite_cpu::ThreadPool) -> bool {
    let Ok(g) = Gguf::from_bytes(bytes) else {
        return false;
    };
    let Ok(m) = Model::from_gguf(g, LoadOptions::default()) else {
        return false;
    };
    if let Ok(mut s) = Session::new(&m, pool, 8, KvType::F16) {
        let _ = s.eval(&[0, 1], Outputs::Last);
    }
    true
}

/// Counts over `n` mutants; `plant` makes the first one panic as a defective loader would.
fn count(
    base: &[u8],
    header: usize,
    n: usize,
    plant: bool,
    pool: &ferrite_cpu::ThreadPool,
) -> Proof {
    let mut rng = Mix(0x5EED_0D31);
    let (mut loaded, mut refused, mut panics) = (0usize, 0usize, Vec::new());
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for i in 0..n {
        let bytes = mutate(&mut rng, base, header);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            if plant && i == 0 {
                panic!("planted loader defect");
            }
            load_and_run(bytes, pool)
        }));
        match outcome {
            Ok(true) => loaded += 1,
            Ok(false) => refused += 1,
            Err(_) => panics.push(i),
        }
    }
    std::panic::set_hook(previous);
    let detail = match panics.first() {
        None => format!("{n} mutants: {loaded} loaded and ran, {refused} refused, 0 panics"),
        Some(i) => format!(
            "{} of {n} mutants panicked (first: mutant {i})",
            panics.len()
        ),
    };
    Proof::new(panics.is_empty(), detail)
        .count("mutants", n)
        .count("loaded", loaded)
        .count("refused", refused)
        .count("panics", panics.len())
}

/// Item `gguf-mutants`.
pub fn run(env: &Env, t: &Target) -> anyhow::Result<Outcome> {
    let path = t.path()?;
    let header = usize::try_from(Gguf::open(path)?.data_offset())?;
    let base = std::fs::read(path)?;
    anyhow::ensure!(
        header > 0 && header <= base.len(),
        "data offset {header} outside the file"
    );
    let pool = ferrite_cpu::ThreadPool::new(1)?;
    let n = if env.quick { 24 } else { 200 };
    let planted = count(&base, header, 1, true, &pool);
    let real = count(&base, header, n, false, &pool);
    Ok(Outcome::Judged { planted, real })
}
