//! Oracles: the output's own parse (serde_json) and hand checks of each keyword's rule;
//! the walks pick among the allowed tokens pseudo-randomly, so each test covers many texts.

use super::*;
use serde_json::json;

/// Ids 0..=255 are the bytes, then a few multi-byte tokens, a special token, and the end.
const MULTI: [&str; 6] = ["{\"", "\": ", ", \"", "abc", "  ", "</tool_call>"];
const SPECIAL: u32 = 256 + MULTI.len() as u32;
const EOS: u32 = SPECIAL + 1;

fn bytes_of(id: u32) -> Vec<u8> {
    match id {
        0..=255 => vec![id as u8],
        _ if id < SPECIAL => MULTI[id as usize - 256].as_bytes().to_vec(),
        _ => Vec::new(),
    }
}

fn vocab() -> Vocab {
    let mut tokens: Vec<Token> = (0..SPECIAL).map(|id| Token::Text(bytes_of(id))).collect();
    tokens.push(Token::Special("<|im_end|>".into()));
    tokens.push(Token::Special("<eos>".into()));
    Vocab::new(tokens, &[EOS]).unwrap()
}

/// A text of `c`, choosing among the allowed tokens with a small LCG; ends as soon as it
/// may once `after` tokens are out.
fn walk(v: &Vocab, c: &Constraint, seed: u64, after: usize) -> String {
    let mut m = Matcher::new(v, c).unwrap();
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut out = Vec::new();
    for step in 0..3000 {
        let allowed = m.allowed().unwrap().to_list();
        assert!(!allowed.is_empty(), "no token allowed after {out:?}");
        let may_end = allowed.contains(&EOS);
        if may_end && (step >= after || allowed.len() == 1) {
            assert!(m.is_accepting());
            return String::from_utf8(out).unwrap();
        }
        let text: Vec<u32> = allowed.into_iter().filter(|&t| t != EOS).collect();
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let t = text[(state >> 33) as usize % text.len()];
        assert_ne!(t, SPECIAL, "a special token is never text");
        m.accept(t).unwrap();
        out.extend(bytes_of(t));
    }
    panic!("no end in 3000 tokens: {:?}", String::from_utf8_lossy(&out));
}

fn json_walks(schema: Value, check: impl Fn(&Value) -> bool) {
    let v = vocab();
    let c = Constraint::json_schema(&schema).unwrap();
    for seed in 0..12 {
        let text = walk(&v, &c, seed, 8);
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert!(check(&value), "{schema} let through {text}");
    }
}

#[test]
fn pattern_holds() {
    json_walks(
        json!({"type": "string", "pattern": "^[0-9]{3}-[a-z]{2}$"}),
        |v| {
            let s = v.as_str().unwrap().as_bytes();
            s.len() == 6
                && s[..3].iter().all(u8::is_ascii_digit)
                && s[3] == b'-'
                && s[4..].iter().all(u8::is_ascii_lowercase)
        },
    );
}

#[test]
fn min_length_holds() {
    json_walks(
        json!({"type": "string", "minLength": 5, "maxLength": 7}),
        |v| (5..=7).contains(&v.as_str().unwrap().chars().count()),
    );
}

#[test]
fn format_holds() {
    json_walks(json!({"type": "string", "format": "date"}), |v| {
        let s = v.as_str().unwrap().as_bytes();
        s.len() == 10
            && [4, 7].iter().all(|&i| s[i] == b'-')
            && s.iter()
                .enumerate()
                .all(|(i, b)| i == 4 || i == 7 || b.is_ascii_digit())
    });
}

#[test]
fn minimum_holds() {
    json_walks(json!({"type": "number", "minimum": 2.5}), |v| {
        v.as_f64().unwrap() >= 2.5
    });
    json_walks(
        json!({"type": "integer", "minimum": -3, "maximum": 40}),
        |v| (-3..=40).contains(&v.as_i64().unwrap()),
    );
}

#[test]
fn objects_are_compact_and_whole() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"},
        "b": {"type": "boolean"}}, "required": ["a", "b"], "additionalProperties": false});
    json_walks(schema.clone(), |v| v["a"].is_i64() && v["b"].is_boolean());
    let v = vocab();
    let c = Constraint::json_schema(&schema).unwrap();
    for seed in 0..6 {
        let text = walk(&v, &c, seed, 0);
        assert!(text.starts_with("{\"a\": "), "{text}");
        assert!(text.contains(", \"b\": "), "{text}");
    }
    // Whitespace never comes where a schema's separators do not put it: no padding.
    let any = Constraint::json_schema(&json!({"type": "object"})).unwrap();
    let mut m = Matcher::new(&v, &any).unwrap();
    m.accept(u32::from(b'{')).unwrap();
    for b in [b' ', b'\n', b'\t'] {
        assert!(!m.allows(u32::from(b)).unwrap(), "{b} after '{{'");
    }
}

#[test]
fn unenforceable_keywords_are_refused_by_name() {
    let e = Constraint::json_schema(&json!({"type": "array", "uniqueItems": true})).unwrap_err();
    assert!(e.to_string().contains("uniqueItems"), "{e}");
    let e = Constraint::json_schema(&json!({"type": "string", "format": "color"})).unwrap_err();
    assert!(e.to_string().contains("color"), "{e}");
    // A request's own llguidance options never loosen the check.
    let lenient = json!({"type": "array", "uniqueItems": true, "x-guidance": {"lenient": true}});
    assert!(Constraint::json_schema(&lenient).is_err());
    assert!(Constraint::json_schema(&json!("string")).is_err());
    assert!(Constraint::regex("(unclosed").is_err());
    assert!(Constraint::lark("start: undefined_rule").is_err());
    assert!(Constraint::lark("  ").is_err());
}

#[test]
fn end_of_generation_only_when_whole() {
    let v = vocab();
    let mut m = Matcher::new(&v, &Constraint::regex("ab").unwrap()).unwrap();
    assert!(!m.allows(EOS).unwrap());
    assert!(m.accept(EOS).is_err());
    let mut m = Matcher::new(&v, &Constraint::regex("ab").unwrap()).unwrap();
    m.accept(u32::from(b'a')).unwrap();
    assert!(!m.is_accepting());
    m.accept(u32::from(b'b')).unwrap();
    assert_eq!(m.allowed().unwrap().to_list(), [EOS]);
    m.reset().unwrap();
    assert!(m.allows(u32::from(b'a')).unwrap());
}

#[test]
fn mask_sets_refused_and_padded_logits_to_minus_infinity() {
    let v = vocab();
    let mut m = Matcher::new(&v, &Constraint::lark("start: \"ab\" | \"abc\"").unwrap()).unwrap();
    let mut row = vec![1.0f32; v.size() + 3];
    assert_eq!(m.mask(&mut row).unwrap(), 2); // "a" and "abc"
    let kept: Vec<usize> = (0..row.len()).filter(|&i| row[i].is_finite()).collect();
    assert_eq!(kept, [usize::from(b'a'), 259]);
    assert!(matches!(
        m.allows(EOS + 9),
        Err(GrammarError::UnknownToken(_))
    ));
}

fn feed(v: &Vocab, c: &Constraint, text: &str) -> Result<bool, GrammarError> {
    let mut m = Matcher::new(v, c)?;
    for b in text.bytes() {
        m.accept(u32::from(b))?;
    }
    Ok(m.is_accepting())
}

#[test]
fn framed_calls_take_one_alternative() {
    let v = vocab();
    let a = json!({"type": "object", "properties": {"name": {"const": "a"}}, "required": ["name"],
        "additionalProperties": false});
    let b = json!({"type": "object", "properties": {"name": {"const": "b"}}, "required": ["name"],
        "additionalProperties": false});
    let plain = Constraint::framed_json("<tool_call>\n", &[a, b], "\n</tool_call>").unwrap();
    assert_eq!(
        feed(&v, &plain, "<tool_call>\n{\"name\": \"b\"}\n</tool_call>"),
        Ok(true)
    );
    assert!(feed(&v, &plain, "<tool_call>\n{\"name\": \"c\"}").is_err());
    assert!(feed(&v, &plain, "<think>").is_err());
    for seed in 0..6 {
        let text = walk(&v, &plain, seed, 0);
        let inner = text
            .strip_prefix("<tool_call>\n")
            .unwrap()
            .strip_suffix("\n</tool_call>");
        let call: Value = serde_json::from_str(inner.unwrap()).unwrap();
        assert!(call["name"] == "a" || call["name"] == "b", "{text}");
    }
}

#[test]
fn reasoning_runs_free_to_its_close_then_the_constraint_holds() {
    let v = vocab();
    let c = Constraint::regex("[0-9]+")
        .unwrap()
        .after_reasoning("</think>")
        .unwrap();
    assert_eq!(feed(&v, &c, "why { < / not</think>\n\n42"), Ok(true));
    assert_eq!(feed(&v, &c, "</think>7"), Ok(true));
    // The first close ends the reasoning; blanks after it are bounded.
    assert!(feed(&v, &c, "a</think>b</think>1").is_err());
    assert!(feed(&v, &c, "a</think>\n\n\n1").is_err());
    assert_eq!(feed(&v, &c, "no close 42"), Ok(false));
    let json = Constraint::json_object()
        .after_reasoning("</think>")
        .unwrap();
    assert_eq!(feed(&v, &json, "hm</think>\n{\"k\": 1}"), Ok(true));
    assert!(Constraint::json_object().after_reasoning("").is_err());
    assert!(json.accepts(b"</think>{}"));
    assert!(!json.accepts(b"</think>{"));
    assert!(json.admits_prefix(b"</think>{") && !json.admits_prefix(b"</think>}"));
}

#[test]
fn gbnf_grammars_read_as_their_lark_rewrite() {
    let g = r#"
        # a list of small words
        root   ::= "[" ws item ("," ws item){0,2} "]"
        item   ::= [a-z]+ | "\"" [^"\\]* "\""
        ws     ::= " "?
    "#;
    let c = Constraint::gbnf(g).unwrap();
    for ok in ["[ab]", "[ ab, cd,x]", "[\"Q /\"]"] {
        assert!(c.accepts(ok.as_bytes()), "{ok}");
    }
    for no in ["[]", "[a,b,c,d]", "[A]", "[a"] {
        assert!(!c.accepts(no.as_bytes()), "{no}");
    }
    let any = Constraint::gbnf("root ::= . \"!\"").unwrap();
    assert!(any.accepts("\n!".as_bytes()) && any.accepts("é!".as_bytes()));
    for bad in [
        "item ::= \"a\"",
        "root ::= \"a",
        "root ::= [a",
        "\"a\" root ::= x",
        "root ::= a{x}",
    ] {
        let e = Constraint::gbnf(bad).unwrap_err();
        assert!(
            e.to_string().contains("GBNF") || e.to_string().contains("g_a"),
            "{bad}: {e}"
        );
    }
}

/// Regression: JSON mode's numbers were unbounded, and a real model ran on in digits to its
/// token limit (its output forced compact, where it wanted blanks). Oracle: the grammar's own
/// refusal one digit or one blank past each bound, and serde_json parsing whole texts that
/// use every kind of value, compact and pretty-printed.
#[test]
fn json_mode_numbers_end_and_every_text_parses() {
    let c = Constraint::json_object();
    let with = |number: &str| format!("{{\"n\": {number}");
    for (kept, past) in [
        (
            "1".repeat(json::INT_DIGITS),
            "1".repeat(json::INT_DIGITS + 1),
        ),
        (
            format!("0.{}", "5".repeat(json::FRACTION_DIGITS)),
            format!("0.{}", "5".repeat(json::FRACTION_DIGITS + 1)),
        ),
        (
            format!("-2e+{}", "9".repeat(json::EXPONENT_DIGITS)),
            format!("-2e+{}", "9".repeat(json::EXPONENT_DIGITS + 1)),
        ),
    ] {
        assert!(c.admits_prefix(with(&kept).as_bytes()), "{kept}");
        assert!(!c.admits_prefix(with(&past).as_bytes()), "{past}");
        let whole = format!("{}}}", with(&kept));
        assert!(c.accepts(whole.as_bytes()), "{whole}");
        serde_json::from_str::<Value>(&whole).unwrap_or_else(|e| panic!("{whole}: {e}"));
    }
    let every = r#"{"a": [1, -0.5e+10, "x\u00e9\ud83d\ude00\n", true, false, null, {}, []], "b": {"c": {"d": 0}}}"#;
    assert!(c.accepts(every.as_bytes()), "{every}");
    assert!(serde_json::from_str::<Value>(every).unwrap().is_object());
    // Compact or pretty-printed, as a model writes it, with runs of blanks up to the bound.
    let run = " ".repeat(json::MAX_BLANKS);
    for ok in [
        "{\"a\":1,\"b\":[]}".to_string(),
        "\n{\n  \"a\": [\n    1,\n    {}\n  ]\n}".to_string(),
        format!("{run}{{{run}\"a\"{run}:{run}[{run}1{run},{run}2{run}]{run}}}"),
    ] {
        assert!(c.accepts(ok.as_bytes()), "{ok:?}");
        assert!(serde_json::from_str::<Value>(&ok).unwrap().is_object());
    }
    // Refused: a lone surrogate (serde_json refuses it too), a leading zero, a value that is
    // not an object, blanks after it, and a run of blanks one past the bound anywhere.
    let past = format!("{run} ");
    for no in [
        r#"{"a": "\ud800"}"#.to_string(),
        r#"{"a": 01}"#.to_string(),
        "[1]".to_string(),
        "{} ".to_string(),
        format!("{past}{{}}"),
        format!("{{{past}}}"),
        format!("{{\"a\"{past}: 1}}"),
        format!("{{\"a\": [1,{past}2]}}"),
    ] {
        assert!(!c.accepts(no.as_bytes()), "{no:?}");
    }
    assert!(!c.admits_prefix(format!("{{\"a\": 1{past}").as_bytes()));
}

/// Regression: an object schema without `additionalProperties: false` let a real model add
/// keys of its own. Objects that list properties are closed wherever they sit, unless the
/// schema opens them; data (`const`) is never rewritten; the members of an `allOf` keep
/// each other's keys. Oracle: the grammar's acceptance of texts written by hand.
#[test]
fn listed_properties_close_an_object_unless_the_schema_opens_it() {
    let accepts = |schema: Value, text: &str| {
        Constraint::json_schema(&schema)
            .unwrap()
            .accepts(text.as_bytes())
    };
    let a = json!({"a": {"type": "integer"}});
    assert!(accepts(json!({"properties": a}), r#"{"a": 1}"#));
    assert!(!accepts(json!({"properties": a}), r#"{"a": 1, "x": 2}"#));
    let nested = [
        json!({"properties": {"o": {"properties": a}}}),
        json!({"type": "array", "items": {"properties": a}}),
        json!({"anyOf": [{"properties": a}, {"type": "string"}]}),
        json!({"$defs": {"t": {"properties": a}}, "$ref": "#/$defs/t"}),
    ];
    for (schema, whole) in nested.into_iter().zip([
        r#"{"o": {"a": 1}}"#,
        r#"[{"a": 1}]"#,
        r#"{"a": 1}"#,
        r#"{"a": 1}"#,
    ]) {
        assert!(accepts(schema.clone(), whole), "{schema} {whole}");
        let extra = whole.replacen("\"a\": 1", "\"a\": 1, \"x\": 2", 1);
        assert!(
            !accepts(schema.clone(), &extra),
            "{schema} let through {extra}"
        );
    }
    let open = json!({"properties": a, "additionalProperties": true});
    assert!(accepts(open, r#"{"a": 1, "x": [2]}"#));
    let typed = json!({"properties": a, "additionalProperties": {"type": "integer"}});
    assert!(accepts(typed.clone(), r#"{"a": 1, "x": 2}"#));
    assert!(!accepts(typed, r#"{"a": 1, "x": "2"}"#));
    assert!(accepts(json!({"type": "object"}), r#"{"x": 2}"#));
    let data = json!({"properties": {"k": {"const": {"properties": {"p": 1}, "q": 2}}}});
    assert!(accepts(data, r#"{"k": {"properties": {"p": 1}, "q": 2}}"#));
    let both = json!({"allOf": [{"properties": a}, {"properties": {"b": {"type": "integer"}}}]});
    assert!(accepts(both, r#"{"a": 1, "b": 2}"#));
}

/// A control token is named as llguidance's Lark lexes one, `<` … `>` without blanks or
/// angle brackets inside; anything else is refused when the grammar is made (by
/// llguidance itself, which this test pins).
#[test]
fn one_of_names_control_tokens_only_as_lark_lexes_them() {
    let with = |name: &str| {
        Constraint::one_of(&[vec![Group::always(vec![
            Piece::Special(name.into()),
            Piece::Text("x".into()),
        ])]])
    };
    assert!(with("<|channel|>").is_ok());
    assert!(with("<｜tool▁sep｜>").is_ok());
    for bad in ["<| channel |>", "<<x>", "<>", "channel", "<x"] {
        assert!(
            matches!(with(bad), Err(GrammarError::Invalid(_))),
            "{bad:?}"
        );
    }
    // The text form of the token is not the token.
    assert!(!with("<|channel|>").unwrap().accepts(b"<|channel|>x"));
}
