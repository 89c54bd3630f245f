//! The grammar of the schema of any object (JSON mode's) against serde_json: every prefix
//! of a valid object is accepted and only the whole is complete; hand-picked invalid texts
//! fail; and random objects, serialized compact and pretty, then mutated a byte at a time,
//! are complete exactly when serde_json parses them as an object within the grammar's
//! bounds.

use std::sync::LazyLock;

use super::*;
use crate::rng::Rng;
use serde_json::Value;

static ANY_OBJECT: LazyLock<JsonSchema> = LazyLock::new(JsonSchema::any_object);

fn complete(text: &[u8]) -> bool {
    SchemaPrefix::new()
        .feed(&ANY_OBJECT, text)
        .is_some_and(|p| p.is_complete())
}

fn assert_prefixes_then_complete(text: &str) {
    let bytes = text.as_bytes();
    let mut p = SchemaPrefix::new();
    for (i, &b) in bytes.iter().enumerate() {
        assert!(!p.is_complete(), "{text:?} complete after {i} bytes");
        p = p
            .feed(&ANY_OBJECT, &[b])
            .unwrap_or_else(|| panic!("{text:?} refused at byte {i}"));
    }
    assert!(p.is_complete(), "{text:?} not complete");
}

#[test]
fn valid_objects_and_all_their_prefixes() {
    for text in [
        "{}",
        " \n{ }",
        r#"{"a":1}"#,
        r#"{"a": -0.5e+10, "b": [true, false, null, 0, 12, 3.25, 1E5, -7e-3], "c": {}}"#,
        r#"{"s": "tab\t quote\" slash\/ back\\ \u00e9\uABCD", "k\"ey": ""}"#,
        "{\"utf8\": \"h\u{e9}llo \u{1f600}\"}",
        r#"{"nested": [[[], {}], [{"x": [1, [2, [3]]]}]]}"#,
        "{\n  \"pretty\": [\n    1,\n    2\n  ]\n}",
    ] {
        assert!(
            serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object()),
            "bad oracle case {text:?}"
        );
        assert_prefixes_then_complete(text);
    }
}

#[test]
fn invalid_texts_are_refused_or_never_complete() {
    for text in [
        "[1]",
        "1",
        "\"a\"",
        "{a:1}",
        r#"{"a" 1}"#,
        r#"{"a":1,}"#,
        r#"{"a":[1,]}"#,
        r#"{"a":01}"#,
        r#"{"a":1.}"#,
        r#"{"a":.5}"#,
        r#"{"a":-}"#,
        r#"{"a":1e}"#,
        r#"{"a":+1}"#,
        r#"{"a":tru}"#,
        r#"{"a":nul}"#,
        r#"{"a":True}"#,
        "{\"a\":\"\u{1}\"}",
        "{\"a\":\"line\nbreak\"}",
        r#"{"a":"\q"}"#,
        r#"{"a":"\u12G4"}"#,
        r#"{"a":1]"#,
        r#"{"a":[1}"#,
        "{} ",
        "{}{}",
        r#"{"a":1"#,
    ] {
        assert!(!complete(text.as_bytes()), "{text:?} accepted");
    }
}

#[test]
fn nesting_and_whitespace_are_bounded() {
    let deep = |d: usize| format!("{{\"a\":{}{}}}", "[".repeat(d - 1), "]".repeat(d - 1));
    assert!(complete(deep(MAX_DEPTH).as_bytes()));
    assert!(!complete(deep(MAX_DEPTH + 1).as_bytes()));
    let spaced = |n: usize| format!("{{{}}}", " ".repeat(n));
    assert!(complete(spaced(MAX_WHITESPACE as usize).as_bytes()));
    assert!(!complete(spaced(MAX_WHITESPACE as usize + 1).as_bytes()));
    // The bound is per run: tokens between runs reset it.
    let runs = format!(
        "{{{0}\"a\"{0}:{0}1{0}}}",
        " ".repeat(MAX_WHITESPACE as usize)
    );
    assert!(complete(runs.as_bytes()));
}

/// A random JSON value of ASCII text (so a one-byte mutation keeps the text UTF-8).
fn random_value(rng: &mut Rng, depth: usize) -> Value {
    let pick = |rng: &mut Rng, n: u64| (rng.next_u64() % n) as usize;
    let text = |rng: &mut Rng| -> String {
        const CHARS: &[u8] = b"ab z\"\\/\t\n\x01-09eE{}[],:";
        (0..pick(rng, 6))
            .map(|_| CHARS[pick(rng, CHARS.len() as u64)] as char)
            .collect()
    };
    match if depth >= 4 {
        pick(rng, 5)
    } else {
        pick(rng, 7)
    } {
        0 => Value::Bool(pick(rng, 2) == 0),
        1 => Value::Null,
        2 => serde_json::json!(rng.next_u64() as i64 >> pick(rng, 64)),
        3 => serde_json::json!((rng.next_f64() - 0.5) * 10f64.powi(pick(rng, 40) as i32 - 20)),
        4 => Value::String(text(rng)),
        5 => Value::Array(
            (0..pick(rng, 4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => random_object(rng, depth + 1),
    }
}

fn random_object(rng: &mut Rng, depth: usize) -> Value {
    let n = (rng.next_u64() % 4) as usize;
    Value::Object(
        (0..n)
            .map(|i| (format!("k{i}"), random_value(rng, depth)))
            .collect(),
    )
}

/// What the grammar must say of `text`: serde_json's verdict, within the grammar's bounds.
fn expected(text: &[u8]) -> bool {
    if !serde_json::from_slice::<Value>(text).is_ok_and(|v| v.is_object()) {
        return false;
    }
    let trailing_space = text.last().is_some_and(u8::is_ascii_whitespace);
    let depth_ok = {
        let (mut depth, mut max, mut in_str, mut esc) = (0i32, 0, false, false);
        for &b in text {
            match (in_str, esc, b) {
                (true, true, _) => esc = false,
                (true, false, b'\\') => esc = true,
                (true, false, b'"') | (false, _, b'"') => in_str = !in_str,
                (false, _, b'{' | b'[') => {
                    depth += 1;
                    max = max.max(depth);
                }
                (false, _, b'}' | b']') => depth -= 1,
                _ => {}
            }
        }
        max <= MAX_DEPTH as i32
    };
    !trailing_space && depth_ok
}

#[test]
fn random_objects_and_mutations_agree_with_serde_json() {
    const MUTATIONS: &[u8] = b"{}[],:\" \\-+0123456789.eEtrunlsx\n\t";
    let mut rng = Rng::new(7);
    let (mut valid, mut agreed_invalid) = (0, 0);
    for _ in 0..3000 {
        let value = random_object(&mut rng, 0);
        for text in [
            serde_json::to_vec(&value).unwrap(),
            serde_json::to_vec_pretty(&value).unwrap(),
        ] {
            assert_prefixes_then_complete(std::str::from_utf8(&text).unwrap());
            valid += 1;
            let mut mutated = text.clone();
            let at = (rng.next_u64() % mutated.len() as u64) as usize;
            mutated[at] = MUTATIONS[(rng.next_u64() % MUTATIONS.len() as u64) as usize];
            let want = expected(&mutated);
            assert_eq!(
                complete(&mutated),
                want,
                "{:?}",
                String::from_utf8_lossy(&mutated)
            );
            agreed_invalid += usize::from(!want);
        }
    }
    assert!(
        valid >= 6000 && agreed_invalid > 1000,
        "{valid} {agreed_invalid}"
    );
}

/// Texts where serde_json and RFC 8259's syntax part: the grammar takes serde_json's side.
#[test]
fn escapes_and_numbers_stay_where_serde_json_parses_them() {
    let value = |v: &str| format!(r#"{{"a": {v}}}"#);
    let big = |digits: usize| format!("1{}", "0".repeat(digits - 1));
    let taken = [
        r#""\ud83d\ude00""#.to_string(),
        r#""\uD83D\uDE00 and \uDBFF\uDFFF""#.to_string(),
        r#""\ud7ff\ue000\u0041""#.to_string(),
        "1e307".into(),
        "9.99e307".into(),
        "-1e-400".into(),
        "0.5e308".into(),
        "1e-99999".into(),
        "0e0".into(),
        big(308),
        format!("{}.5e-1", big(300)),
    ];
    let refused = [
        r#""\ud83d""#.to_string(),
        r#""\ud83dx""#.to_string(),
        r#""\ud83d\u0041""#.to_string(),
        r#""\ud83d\ud83d""#.to_string(),
        r#""\ude00""#.to_string(),
        r#""\uDC00\ud83d""#.to_string(),
        "1e400".into(),
        "-1e309".into(),
        "18e307".into(),
        "1.8e308".into(),
        big(310),
        format!("{}e0", big(309)),
    ];
    for v in &taken {
        let text = value(v);
        assert!(
            serde_json::from_str::<Value>(&text).is_ok(),
            "oracle: {text}"
        );
        assert_prefixes_then_complete(&text);
    }
    for v in &refused {
        let text = value(v);
        assert!(!complete(text.as_bytes()), "{text}");
    }
    // serde_json refuses the lone surrogates and the overflowing numbers. The one it parses
    // is 10^308 with its 309 digits written out, which the grammar refuses to stay clear of
    // the bound.
    let parsed: Vec<&String> = refused
        .iter()
        .filter(|v| serde_json::from_str::<Value>(&value(v)).is_ok())
        .collect();
    assert_eq!(parsed, [&format!("{}e0", big(309))]);
}
