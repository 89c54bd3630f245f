//! `--lookup` and `--draft-model` of `ferrite run` and `ferrite bench`: loading a draft
//! model, refusing one whose vocabulary is not the target's, and building the proposer
//! (always with the adaptive draft length). Owns no generation: what it builds can change
//! how many tokens a forward pass yields, never which tokens.

use anyhow::{Context, bail};
use ferrite_engine::speculate::{Adaptive, AdaptiveStats, Draft, Lookup, Proposer, check_vocab};
use ferrite_model::{LoadOptions, Model, Session};
use ferrite_tokenizer::Tokenizer;

use super::Loaded;

/// Loads `--draft-model` for `loaded`'s model: resolved as `-m` is, at the target's
/// precision, refused unless its vocabulary is the target's (same tokens, same ids, same
/// logit rows) and on the CPU backend.
pub fn load_draft(loaded: &Loaded, name: &str) -> anyhow::Result<Model> {
    check_cuda_speculation(loaded.cuda.is_some(), "--draft-model")?;
    let path = crate::models::resolve(name)?;
    let model = Model::load(
        &path,
        LoadOptions {
            precision: loaded.model.precision(),
        },
    )
    .with_context(|| format!("loading the draft model {}", path.display()))?;
    let tokenizer = Tokenizer::from_gguf(model.gguf())
        .with_context(|| format!("building the tokenizer of {}", path.display()))?;
    check_vocab(
        &loaded.tokenizer,
        loaded.model.config().n_vocab,
        &tokenizer,
        model.config().n_vocab,
    )
    .with_context(|| {
        format!(
            "--draft-model {} cannot draft for {}: the two models must share one vocabulary",
            path.display(),
            loaded.path.display()
        )
    })?;
    model.pack_weights(&loaded.pool);
    Ok(model)
}

/// Refuses speculation (`flag`) on the CUDA backend: its session evaluates a draft one
/// token at a time, so verifying would be slower than plain decoding while looking like
/// speculation.
pub fn check_cuda_speculation(cuda: bool, flag: &str) -> anyhow::Result<()> {
    if cuda {
        bail!(
            "{flag} runs on the CPU backend only (the CUDA backend has no batched verify \
             step yet); add --backend cpu"
        );
    }
    Ok(())
}

/// The proposer of a run: prompt lookup or a draft model, with the adaptive draft length.
pub enum Speculator<'a> {
    /// `--lookup`.
    Lookup(Adaptive<Lookup>),
    /// `--draft-model`, drafting in a session of its own on the target's threads (boxed:
    /// a session is large beside a lookup index).
    Draft(Box<Adaptive<Draft<Session<'a>>>>),
}

impl<'a> Speculator<'a> {
    /// The proposer `--lookup` (when `lookup`) or `--draft-model` (when `draft` is given)
    /// asks for, proposing at most `draft_max` tokens a step; `None` for neither.
    pub fn new(
        loaded: &'a Loaded,
        lookup: bool,
        draft: Option<&'a Model>,
        draft_max: usize,
    ) -> anyhow::Result<Option<Speculator<'a>>> {
        if lookup {
            check_cuda_speculation(loaded.cuda.is_some(), "--lookup")?;
            let inner = Lookup::new(draft_max)?;
            return Ok(Some(Speculator::Lookup(Adaptive::new(inner, draft_max))));
        }
        let Some(model) = draft else {
            return Ok(None);
        };
        let ctx = loaded.ctx.min(model.config().ctx_train);
        ferrite_model::check_kv_memory(model.config(), loaded.kv, 1, ctx)
            .with_context(|| format!("the draft model's --ctx {ctx}"))?;
        let session = Session::new(model, &loaded.pool, ctx, loaded.kv)?;
        Ok(Some(Speculator::Draft(Box::new(Adaptive::new(
            Draft::new(session),
            draft_max,
        )))))
    }

    /// The proposer to hand the generation loop.
    pub fn proposer(&mut self) -> &mut dyn Proposer {
        match self {
            Speculator::Lookup(p) => p,
            Speculator::Draft(p) => p.as_mut(),
        }
    }

    /// What the report lines call it.
    pub fn name(&self) -> &'static str {
        match self {
            Speculator::Lookup(_) => "lookup",
            Speculator::Draft(_) => "draft",
        }
    }

    /// What the adaptive draft length did so far.
    pub fn adaptive(&self) -> AdaptiveStats {
        match self {
            Speculator::Lookup(p) => p.stats(),
            Speculator::Draft(p) => p.stats(),
        }
    }

    /// A note when the draft model failed and stopped proposing (the output is unaffected).
    pub fn failure(&self) -> Option<String> {
        match self {
            Speculator::Lookup(_) => None,
            Speculator::Draft(p) => p.inner().failure().map(|e| {
                format!("the draft model failed and stopped proposing ({e}); decoded plainly")
            }),
        }
    }
}
