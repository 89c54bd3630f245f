//! `tokenizer.json` + `tokenizer_config.json` → GGUF `tokenizer.*` metadata, as llama.cpp's
//! converter writes it for byte-level BPE (`tokenizer.ggml.model = "gpt2"`).
//!
//! - Tokens are the vocabulary by id, padded to `vocab_size` with `[PAD{i}]` (type unused).
//!   Added tokens are control tokens when marked special or when they look special
//!   (`<|...|>`), else user-defined; everything else is normal.
//! - `tokenizer.ggml.pre` names the pre-tokenizer. llama.cpp finds it by hashing the ids of a
//!   test string; without running the tokenizer this module reads it off the
//!   `pre_tokenizer` description instead, and refuses anything it cannot name, because a
//!   wrong pre-tokenizer changes ids silently.
//! - Special ids come from `tokenizer_config.json`'s `*_token` strings looked up among the
//!   added tokens, then from `config.json`'s `*_token_id`; `add_bos`/`add_eos` from the
//!   post-processor, then from `tokenizer_config.json`.
//! - The chat template is `tokenizer_config.json`'s `chat_template`, else
//!   `chat_template.jinja`, else `chat_template.json`.

use std::collections::HashMap;
use std::path::Path;

use ferrite_gguf::{Array, Value};
use serde_json::{Map, Value as Json};

use crate::{ConvertError, spm};

/// The published pre-tokenizer regexes, by the name ferrite's tokenizer and llama.cpp use.
const KNOWN_SPLITS: [(&str, &str); 2] = [
    (
        "llama-bpe",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    (
        "qwen2",
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
];

const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

fn err(msg: impl Into<String>) -> ConvertError {
    ConvertError::Tokenizer(msg.into())
}

pub(crate) fn read_json(path: &Path) -> Result<Option<Json>, ConvertError> {
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| ConvertError::Io {
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| ConvertError::Json {
            path: path.display().to_string(),
            reason: e.to_string(),
        })
}

/// The tokenizer metadata for the model directory `dir`, whose config says `n_vocab`.
pub(crate) fn metadata(
    dir: &Path,
    config: &Map<String, Json>,
    n_vocab: usize,
    add_space_prefix_key: bool,
    sentencepiece: bool,
) -> Result<Vec<(String, Value)>, ConvertError> {
    let tok_path = dir.join("tokenizer.json");
    let tok = read_json(&tok_path)?;
    let tok_cfg =
        read_json(&dir.join("tokenizer_config.json"))?.unwrap_or_else(|| Json::Object(Map::new()));
    let spm_path = dir.join("tokenizer.model");
    if sentencepiece && spm_path.is_file() {
        // As llama.cpp: a SentencePiece model wins over tokenizer.json; no merges.
        let mut m = spm::base_metadata(dir, &spm_path, &tok_cfg, n_vocab)?;
        let tok = tok.unwrap_or_else(|| Json::Object(Map::new()));
        finish(
            dir,
            &tok,
            &tok_cfg,
            config,
            n_vocab,
            add_space_prefix_key,
            &mut m,
        )?;
        return Ok(m);
    }
    let Some(tok) = tok else {
        return Err(ConvertError::MissingFile {
            path: tok_path.display().to_string(),
        });
    };
    let model = tok
        .get("model")
        .ok_or_else(|| err("tokenizer.json has no model"))?;
    let kind = model.get("type").and_then(Json::as_str).unwrap_or("BPE");
    if kind != "BPE" {
        return Err(err(format!("model type {kind:?} (only byte-level BPE)")));
    }
    let pre = pre_tokenizer(&tok)?;
    let (tokens, types) = vocabulary(&tok, model, n_vocab)?;
    let merges = merges(model)?;
    let str_list = |items: Vec<String>| Value::Array(Array::String(items.into_iter().collect()));
    let mut m = vec![
        (
            "tokenizer.ggml.model".to_owned(),
            Value::String("gpt2".into()),
        ),
        ("tokenizer.ggml.pre".to_owned(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".to_owned(), str_list(tokens)),
        (
            "tokenizer.ggml.token_type".to_owned(),
            Value::Array(Array::I32(types)),
        ),
        ("tokenizer.ggml.merges".to_owned(), str_list(merges)),
    ];
    finish(
        dir,
        &tok,
        &tok_cfg,
        config,
        n_vocab,
        add_space_prefix_key,
        &mut m,
    )?;
    Ok(m)
}

/// The entries both tokenizer kinds share: special ids, add flags, space prefix, template.
fn finish(
    dir: &Path,
    tok: &Json,
    tok_cfg: &Json,
    config: &Map<String, Json>,
    n_vocab: usize,
    add_space_prefix_key: bool,
    m: &mut Vec<(String, Value)>,
) -> Result<(), ConvertError> {
    special_ids(tok, tok_cfg, config, n_vocab, m);
    add_flags(tok, tok_cfg, m);
    if add_space_prefix_key && let Some(Json::Bool(b)) = tok_cfg.get("add_prefix_space") {
        m.push(("tokenizer.ggml.add_space_prefix".into(), Value::Bool(*b)));
    }
    chat_templates(dir, tok_cfg, m)
}

/// Names the pre-tokenizer from its `tokenizer.json` description.
fn pre_tokenizer(tok: &Json) -> Result<&'static str, ConvertError> {
    let pre = tok.get("pre_tokenizer").unwrap_or(&Json::Null);
    let parts: Vec<&Json> = match pre.get("type").and_then(Json::as_str) {
        Some("Sequence") => pre
            .get("pretokenizers")
            .and_then(Json::as_array)
            .map(|a| a.iter().collect())
            .unwrap_or_default(),
        Some(_) => vec![pre],
        None => vec![],
    };
    let ty = |p: &Json| {
        p.get("type")
            .and_then(Json::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let byte_level_regex = |p: &Json| p.get("use_regex").and_then(Json::as_bool).unwrap_or(true);
    let types: Vec<String> = parts.iter().map(|p| ty(p)).collect();
    let shape: Vec<&str> = types.iter().map(String::as_str).collect();
    let found = match shape.as_slice() {
        ["ByteLevel"] if byte_level_regex(parts[0]) => Some("gpt-2"),
        ["Digits", "ByteLevel"]
            if parts[0].get("individual_digits").and_then(Json::as_bool) == Some(true)
                && byte_level_regex(parts[1]) =>
        {
            Some("smollm")
        }
        ["Split", "ByteLevel"] if !byte_level_regex(parts[1]) => {
            let regex = parts[0]
                .get("pattern")
                .and_then(|p| p.get("Regex"))
                .and_then(Json::as_str);
            KNOWN_SPLITS
                .iter()
                .find(|(_, r)| Some(*r) == regex)
                .map(|(name, _)| *name)
        }
        _ => None,
    };
    found.ok_or_else(|| {
        err(format!(
            "pre-tokenizer {} is not one ferrite knows (gpt-2, smollm, llama-bpe, qwen2)",
            serde_json::to_string(pre).unwrap_or_default()
        ))
    })
}

/// llama.cpp's heuristic for added tokens that should be control tokens though not marked.
pub(crate) fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<｜") && t.ends_with("｜>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

fn vocabulary(
    tok: &Json,
    model: &Json,
    n_vocab: usize,
) -> Result<(Vec<String>, Vec<i32>), ConvertError> {
    let vocab = model
        .get("vocab")
        .and_then(Json::as_object)
        .ok_or_else(|| err("model.vocab is not an object"))?;
    let mut by_id: Vec<Option<(String, i32)>> = vec![None; n_vocab];
    let mut put = |text: &str, id: &Json, ty: i32| -> Result<(), ConvertError> {
        let id = id
            .as_u64()
            .and_then(|i| usize::try_from(i).ok())
            .ok_or_else(|| err(format!("token {text:?} has a bad id {id}")))?;
        let slot = by_id.get_mut(id).ok_or_else(|| {
            err(format!(
                "token {text:?} has id {id}, beyond config vocab_size {n_vocab}"
            ))
        })?;
        *slot = Some((text.to_owned(), ty));
        Ok(())
    };
    for (text, id) in vocab {
        put(text, id, NORMAL)?;
    }
    for added in tok
        .get("added_tokens")
        .and_then(Json::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let text = added
            .get("content")
            .and_then(Json::as_str)
            .ok_or_else(|| err("added token without content"))?;
        let special = added.get("special").and_then(Json::as_bool) == Some(true);
        let ty = if special || looks_special(text) {
            CONTROL
        } else {
            USER_DEFINED
        };
        put(text, added.get("id").unwrap_or(&Json::Null), ty)?;
    }
    Ok(by_id
        .into_iter()
        .enumerate()
        .map(|(i, slot)| slot.unwrap_or_else(|| (format!("[PAD{i}]"), UNUSED)))
        .unzip())
}

/// Merges as `"left right"` strings; the pair form (transformers ≥ 4.45) is joined with a
/// space, spaces inside a part written as U+0120 as llama.cpp does.
fn merges(model: &Json) -> Result<Vec<String>, ConvertError> {
    let Some(items) = model.get("merges").and_then(Json::as_array) else {
        return Ok(Vec::new());
    };
    items
        .iter()
        .map(|m| match m {
            Json::String(s) => Ok(s.clone()),
            Json::Array(pair) => match pair.as_slice() {
                [Json::String(a), Json::String(b)] => {
                    let enc = |s: &str| s.replace(' ', "\u{120}");
                    Ok(format!("{} {}", enc(a), enc(b)))
                }
                _ => Err(err(format!("bad merge {m}"))),
            },
            _ => Err(err(format!("bad merge {m}"))),
        })
        .collect()
}

/// The content of a `tokenizer_config.json` `*_token` entry (a string or `{content}`).
fn token_content<'a>(cfg: &'a Json, key: &str) -> Option<&'a str> {
    match cfg.get(key)? {
        Json::String(s) => Some(s),
        Json::Object(o) => o.get("content").and_then(Json::as_str),
        _ => None,
    }
}

fn special_ids(
    tok: &Json,
    tok_cfg: &Json,
    config: &Map<String, Json>,
    n_vocab: usize,
    m: &mut Vec<(String, Value)>,
) {
    let added: HashMap<&str, u64> = tok
        .get("added_tokens")
        .and_then(Json::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter_map(|a| Some((a.get("content")?.as_str()?, a.get("id")?.as_u64()?)))
        .collect();
    let kinds = [
        ("bos", "bos_token_id"),
        ("eos", "eos_token_id"),
        ("unk", "unknown_token_id"),
        ("sep", "seperator_token_id"),
        ("pad", "padding_token_id"),
        ("mask", "mask_token_id"),
    ];
    for (typ, key) in kinds {
        let from_tokenizer =
            token_content(tok_cfg, &format!("{typ}_token")).and_then(|c| added.get(c).copied());
        let from_config = || {
            config
                .get(&format!("{typ}_token_id"))
                .and_then(Json::as_u64)
        };
        if let Some(id) = from_tokenizer.or_else(from_config)
            && id < n_vocab as u64
        {
            m.push((format!("tokenizer.ggml.{key}"), Value::U32(id as u32)));
        }
    }
}

/// `add_bos`/`add_eos`: a `TemplateProcessing` post-processor decides where it exists
/// (first/last special token equal to bos/eos), a `ByteLevel` one means neither; the
/// `tokenizer_config.json` flags fill in what the post-processor leaves open.
fn add_flags(tok: &Json, tok_cfg: &Json, m: &mut Vec<(String, Value)>) {
    let mut bos: Option<bool> = None;
    let mut eos: Option<bool> = None;
    let bos_text = token_content(tok_cfg, "bos_token");
    let eos_text = token_content(tok_cfg, "eos_token");
    if let Some(pp) = tok.get("post_processor").filter(|p| !p.is_null()) {
        let list: Vec<&Json> = match pp.get("processors").and_then(Json::as_array) {
            Some(a) => a.iter().collect(),
            None => vec![pp],
        };
        for p in list {
            match p.get("type").and_then(Json::as_str) {
                Some("ByteLevel") => {
                    bos.get_or_insert(false);
                    eos.get_or_insert(false);
                }
                Some("TemplateProcessing") => {
                    let single = p.get("single").and_then(Json::as_array);
                    let special = |t: Option<&Json>| {
                        t.and_then(|t| t.get("SpecialToken"))
                            .and_then(|s| s.get("id"))
                            .and_then(Json::as_str)
                            .map(str::to_owned)
                    };
                    if let Some(single) = single.filter(|s| s.len() > 1) {
                        if let Some(first) = special(single.first()) {
                            bos = Some(Some(first.as_str()) == bos_text);
                        }
                        if let Some(last) = special(single.last()) {
                            eos = Some(Some(last.as_str()) == eos_text);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let flag = |key: &str| tok_cfg.get(key).and_then(Json::as_bool);
    if let Some(b) = bos.or_else(|| flag("add_bos_token")) {
        m.push(("tokenizer.ggml.add_bos_token".into(), Value::Bool(b)));
    }
    if let Some(e) = eos.or_else(|| flag("add_eos_token")) {
        m.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(e)));
    }
}

fn chat_templates(
    dir: &Path,
    tok_cfg: &Json,
    m: &mut Vec<(String, Value)>,
) -> Result<(), ConvertError> {
    let jinja = dir.join("chat_template.jinja");
    let template = match tok_cfg.get("chat_template") {
        Some(t) if !t.is_null() => Some(t.clone()),
        _ if jinja.is_file() => Some(Json::String(std::fs::read_to_string(&jinja).map_err(
            |source| ConvertError::Io {
                path: jinja.display().to_string(),
                source,
            },
        )?)),
        _ => read_json(&dir.join("chat_template.json"))?
            .and_then(|j| j.get("chat_template").cloned()),
    };
    match template {
        None => {}
        Some(Json::String(s)) => m.push(("tokenizer.chat_template".into(), Value::String(s))),
        // A list of named templates: `default` is the chat template, others are named.
        Some(Json::Array(list)) => {
            for item in list {
                let name = item.get("name").and_then(Json::as_str);
                let text = item.get("template").and_then(Json::as_str);
                let (Some(name), Some(text)) = (name, text) else {
                    return Err(err("chat_template list entry without name/template"));
                };
                let key = if name == "default" {
                    "tokenizer.chat_template".to_owned()
                } else {
                    format!("tokenizer.chat_template.{name}")
                };
                m.push((key, Value::String(text.to_owned())));
            }
        }
        Some(other) => return Err(err(format!("chat_template has type {other}"))),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pre(json: &str) -> Result<&'static str, ConvertError> {
        let tok: Json = serde_json::from_str(&format!(r#"{{"pre_tokenizer":{json}}}"#)).unwrap();
        pre_tokenizer(&tok)
    }

    #[test]
    fn names_known_pre_tokenizers_and_refuses_others() {
        assert_eq!(
            pre(r#"{"type":"ByteLevel","use_regex":true}"#).unwrap(),
            "gpt-2"
        );
        let split = |regex: &str| {
            format!(
                r#"{{"type":"Sequence","pretokenizers":[{{"type":"Split","pattern":{{"Regex":{}}},"behavior":"Isolated"}},{{"type":"ByteLevel","use_regex":false}}]}}"#,
                serde_json::to_string(regex).unwrap()
            )
        };
        assert_eq!(pre(&split(KNOWN_SPLITS[1].1)).unwrap(), "qwen2");
        assert_eq!(pre(&split(KNOWN_SPLITS[0].1)).unwrap(), "llama-bpe");
        assert!(pre(&split(r"\w+")).is_err());
        assert!(pre(r#"{"type":"Metaspace"}"#).is_err());
        assert!(pre("null").is_err());
    }

    #[test]
    fn merges_in_both_forms() {
        let m: Json = serde_json::from_str(r#"{"merges":["a b",["c d","e"]]}"#).unwrap();
        assert_eq!(merges(&m).unwrap(), ["a b", "c\u{120}d e"]);
    }

    #[test]
    fn special_looking_tokens() {
        assert!(looks_special("<|im_start|>"));
        assert!(!looks_special("<b>"));
    }
}
