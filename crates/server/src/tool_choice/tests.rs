//! Parsing each API's tool choice, and the grammar of forced calls. Oracle for the
//! grammars: llguidance itself, fed call objects written by hand in their markup.

use super::*;

fn weather() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
        "required": ["city"]
    }}})
}

fn clock() -> Value {
    json!({"type": "function", "function": {"name": "get_time"}})
}

fn output(starts_in_reasoning: bool) -> OutputConfig {
    OutputConfig {
        reasoning: ReasoningFormat::Think,
        starts_in_reasoning,
        tools: None,
    }
}

fn held(tools: &[Value], choice: &ToolChoice, in_reasoning: bool) -> Constraint {
    let format = |f: ForcedCall| f.format(&mut output(in_reasoning), &|_| false);
    match forced_call(tools, choice).map(|f| f.map(format)) {
        Ok(Some(Ok(OutputFormat::Held(c)))) => (*c).clone(),
        other => panic!("{choice:?}: {other:?}"),
    }
}

fn schema(tools: &[Value], choice: ToolChoice) -> Constraint {
    held(tools, &choice, false)
}

/// The texts around a call object and its key of the arguments, of a JSON framing.
fn json_markup(f: Framing) -> Option<(&'static str, &'static str, &'static str)> {
    match f.markup {
        Markup::Json {
            before,
            after,
            arguments,
        } => Some((before, after, arguments)),
        Markup::Tagged { .. } | Markup::Harmony | Markup::DeepSeek => None,
    }
}

/// `call` in Hermes markup.
fn hermes(call: &str) -> String {
    let (before, after, _) = json_markup(Framing::of(ToolSyntax::Hermes)).unwrap();
    format!("{before}{call}{after}")
}

/// Whether `call` in its markup is a whole text of `c`.
fn whole(c: &Constraint, call: &str) -> bool {
    c.accepts(hermes(call).as_bytes())
}

#[test]
fn each_api_spells_its_choices() {
    let ok = [
        (openai_chat(None), ToolChoice::Auto),
        (openai_chat(Some(&json!("none"))), ToolChoice::None),
        (openai_chat(Some(&json!("required"))), ToolChoice::Required),
        (
            openai_chat(Some(
                &json!({"type": "function", "function": {"name": "f"}}),
            )),
            ToolChoice::Named("f".into()),
        ),
        (
            responses(Some(&json!({"type": "function", "name": "f"}))),
            ToolChoice::Named("f".into()),
        ),
        (responses(Some(&json!("auto"))), ToolChoice::Auto),
        (anthropic(None), ToolChoice::Auto),
        (
            anthropic(Some(&json!({"type": "any"}))),
            ToolChoice::Required,
        ),
        (anthropic(Some(&json!({"type": "none"}))), ToolChoice::None),
        (
            anthropic(Some(&json!({"type": "tool", "name": "f"}))),
            ToolChoice::Named("f".into()),
        ),
    ];
    for (got, want) in ok {
        assert_eq!(got.unwrap(), want);
    }
    let bad = [
        openai_chat(Some(&json!("sometimes"))),
        openai_chat(Some(&json!({"type": "function", "name": "f"}))),
        openai_chat(Some(&json!(3))),
        responses(Some(
            &json!({"type": "function", "function": {"name": "f"}}),
        )),
        anthropic(Some(&json!("any"))),
        anthropic(Some(&json!({"type": "tool"}))),
    ];
    for got in bad {
        let e = got.unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"), "{e:?}");
    }
}

#[test]
fn a_named_choice_holds_the_call_to_its_tool_and_parameters() {
    let tools = [weather(), clock()];
    let s = schema(&tools, ToolChoice::Named("get_weather".into()));
    assert!(whole(
        &s,
        r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#
    ));
    assert!(whole(
        &s,
        r#"{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}"#
    ));
    for text in [
        // Compact JSON only: no padding a model could run out of tokens in.
        r#"{"name":"get_weather","arguments":{"city":"Oslo"}}"#,
        r#"{"name": "get_weather",  "arguments": {"city": "Oslo"}}"#,
        r#" {"name": "get_weather", "arguments": {"city": "Oslo"}}"#,
        r#"{"name": "get_time", "arguments": {}}"#,
        r#"{"name": "get_weather", "arguments": {}}"#,
        r#"{"name": "get_weather", "arguments": {"city": 3}}"#,
        r#"{"name": "get_weather", "arguments": {"city": "x", "unit": "k"}}"#,
        r#"{"arguments": {"city": "x"}, "name": "get_weather"}"#,
        r#"{"name": "get_weather"}"#,
    ] {
        assert!(!whole(&s, text), "{text}");
    }
    // A tool without parameters takes any object.
    let s = schema(&tools, ToolChoice::Named("get_time".into()));
    assert!(whole(
        &s,
        r#"{"name": "get_time", "arguments": {"tz": ["utc"]}}"#
    ));
    assert!(!whole(&s, r#"{"name": "get_time", "arguments": []}"#));
}

#[test]
fn a_required_call_names_one_of_the_tools_with_its_own_parameters() {
    for tools in [vec![weather(), clock()], vec![clock(), weather()]] {
        let s = schema(&tools, ToolChoice::Required);
        assert!(whole(
            &s,
            r#"{"name": "get_time", "arguments": {"any": [1]}}"#
        ));
        assert!(whole(
            &s,
            r#"{"name": "get_weather", "arguments": {"city": "Rome"}}"#
        ));
        assert!(!whole(
            &s,
            r#"{"name": "get_weather", "arguments": {"any": 1}}"#
        ));
        assert!(!whole(&s, r#"{"name": "get_date", "arguments": {}}"#));
    }
    let s = schema(&[weather()], ToolChoice::Required);
    assert!(!whole(
        &s,
        r#"{"name": "get_weather", "arguments": {"any": 1}}"#
    ));
}

#[test]
fn tools_whose_definitions_clash_keep_their_own() {
    let with_point = |name: &str, x: &str| {
        json!({"type": "function", "function": {"name": name, "parameters": {
            "$defs": {"P": {"type": "object", "properties": {x: {"type": "number"}}, "required": [x]}},
            "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"]}}})
    };
    // The same definition in both: shared, and held.
    let s = schema(
        &[with_point("a", "x"), with_point("b", "x")],
        ToolChoice::Required,
    );
    assert!(whole(&s, r#"{"name": "b", "arguments": {"p": {"x": 1}}}"#));
    assert!(!whole(&s, r#"{"name": "b", "arguments": {"p": {"y": 1}}}"#));
    // Two definitions of one name: each call is held to its own tool's.
    let s = schema(
        &[with_point("a", "x"), with_point("b", "y")],
        ToolChoice::Required,
    );
    assert!(whole(&s, r#"{"name": "b", "arguments": {"p": {"y": 1}}}"#));
    assert!(whole(&s, r#"{"name": "a", "arguments": {"p": {"x": 1}}}"#));
    assert!(!whole(&s, r#"{"name": "b", "arguments": {"p": {"x": 1}}}"#));
    assert!(!whole(&s, r#"{"name": "b", "arguments": 1}"#));
}

#[test]
fn reasoning_the_prompt_opened_runs_free_before_the_call() {
    let tools = [weather()];
    let call = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
    let c = held(&tools, &ToolChoice::Required, true);
    let text = format!("sunny? {{ maybe</think>\n\n{}", hermes(call));
    assert!(c.accepts(text.as_bytes()));
    assert!(!c.accepts(hermes(call).as_bytes()));
    // Without an open block the call comes first.
    assert!(!held(&tools, &ToolChoice::Required, false).accepts(text.as_bytes()));
}

#[test]
fn parameters_keep_their_local_references() {
    let tool = json!({"type": "function", "function": {"name": "plot", "parameters": {
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
        "type": "object",
        "properties": {"at": {"$ref": "#/$defs/Point"}},
        "required": ["at"]
    }}});
    let s = schema(&[tool], ToolChoice::Named("plot".into()));
    assert!(whole(
        &s,
        r#"{"name": "plot", "arguments": {"at": {"x": 1.5}}}"#
    ));
    assert!(!whole(
        &s,
        r#"{"name": "plot", "arguments": {"at": {"y": 1.5}}}"#
    ));
}

#[test]
fn choices_that_cannot_be_met_are_refused_by_name() {
    let cases = [
        (
            vec![weather()],
            ToolChoice::Named("nope".into()),
            "tool_choice",
            "'nope'",
        ),
        (
            Vec::new(),
            ToolChoice::Required,
            "tool_choice",
            "no 'tools'",
        ),
        (
            vec![
                json!({"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}}}}),
            ],
            ToolChoice::Required,
            "tools",
            "\"uniqueItems\"",
        ),
    ];
    for (tools, choice, param, says) in cases {
        let e = forced_call(&tools, &choice).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(param), "{e:?}");
        assert!(e.message.contains(says), "{e:?}");
    }
    assert_eq!(forced_call(&[weather()], &ToolChoice::Auto).unwrap(), None);
    assert_eq!(forced_call(&[weather()], &ToolChoice::None).unwrap(), None);
}

/// The forced grammar of `tools` for a model that writes `syntax`, and the syntax the
/// call is then written and parsed in; no marker is a control token.
fn forced_in(tools: &[Value], syntax: ToolSyntax) -> (Constraint, OutputConfig) {
    forced_over(tools, syntax, &|_| false)
}

/// [`forced_in`] over a vocabulary that holds the markers `is_control` says as control
/// tokens.
fn forced_over(
    tools: &[Value],
    syntax: ToolSyntax,
    is_control: &dyn Fn(&str) -> bool,
) -> (Constraint, OutputConfig) {
    let mut out = OutputConfig {
        tools: Some(syntax),
        ..output(false)
    };
    let forced = forced_call(tools, &ToolChoice::Required).unwrap().unwrap();
    match forced.format(&mut out, is_control).unwrap() {
        OutputFormat::Held(c) => ((*c).clone(), out),
        other => panic!("{other:?}"),
    }
}

/// The calls `text` parses to in `out`'s syntax: (name, arguments) of each whole call, and
/// the content left beside them.
fn parsed(out: OutputConfig, text: &str) -> (Vec<(String, Value)>, String) {
    use ferrite_engine::output::{Collected, OutputParser};
    let mut parser = OutputParser::new(out);
    let mut got = Collected::default();
    got.extend(parser.push(text, false));
    got.extend(parser.finish().events);
    let calls = got
        .calls
        .iter()
        .filter(|c| c.complete)
        .map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap()))
        .collect();
    (calls, got.content)
}

/// Oracle: the output parser itself. A call written as each syntax's framing says is a
/// whole text of the forced grammar and parses back, in that syntax, to the same call;
/// the other syntaxes' key is refused.
#[test]
fn forced_calls_are_written_in_the_models_own_syntax_and_parse_back() {
    for syntax in ToolSyntax::ALL {
        let f = Framing::of(syntax);
        assert_eq!(f.syntax, syntax);
        if syntax == ToolSyntax::Harmony {
            // Control tokens are no text: see the harmony test.
            continue;
        }
        let (c, out) = forced_in(&[weather()], syntax);
        assert_eq!(out.tools, Some(f.syntax), "{syntax:?}");
        let text = match json_markup(f) {
            Some((before, after, arguments)) => {
                if syntax == ToolSyntax::Llama3 {
                    assert_eq!(
                        arguments, "parameters",
                        "as Llama 3.1's template writes calls"
                    );
                }
                let call = format!(
                    "{{\"name\": \"get_weather\", \"{arguments}\": {{\"city\": \"Oslo\"}}}}"
                );
                let text = format!("{before}{call}{after}");
                let other = if arguments == "arguments" {
                    "parameters"
                } else {
                    "arguments"
                };
                assert!(
                    !c.accepts(text.replace(arguments, other).as_bytes()),
                    "{syntax:?}"
                );
                text
            }
            None if syntax == ToolSyntax::DeepSeek => {
                deepseek_text("get_weather", r#"{"city": "Oslo"}"#)
            }
            None => tagged_text(syntax, "get_weather", &[("city", "\"Oslo\"")]),
        };
        assert!(c.accepts(text.as_bytes()), "{syntax:?}: {text}");
        let (calls, content) = parsed(out, &text);
        assert_eq!(
            calls,
            [("get_weather".to_string(), json!({"city": "Oslo"}))],
            "{syntax:?}: {text}"
        );
        assert_eq!(content.trim(), "", "{syntax:?}");
    }
}

/// A call in the tagged markup of Qwen3-Coder or GLM 4.5, written by hand as their chat
/// templates write one (values given as JSON text).
fn tagged_text(syntax: ToolSyntax, name: &str, params: &[(&str, &str)]) -> String {
    let mut text = match syntax {
        ToolSyntax::Qwen3Coder => format!("<tool_call>\n<function={name}>\n"),
        ToolSyntax::Glm45 => format!("<tool_call>{name}\n"),
        other => panic!("{other:?} is not tagged"),
    };
    for (k, v) in params {
        text += &match syntax {
            ToolSyntax::Qwen3Coder => format!("<parameter={k}>\n{v}\n</parameter>\n"),
            _ => format!("<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"),
        };
    }
    text += match syntax {
        ToolSyntax::Qwen3Coder => "</function>\n</tool_call>",
        _ => "</tool_call>",
    };
    text
}

/// Oracle: the parameters schema, applied by hand. Tagged calls hold each value to its
/// property's schema, required parameters present, optional ones at most once, in the
/// schema's order, no other keys; a tool without parameters takes none. Parameters that
/// tags cannot hold make the call Hermes markup.
#[test]
fn tagged_calls_hold_each_parameter_to_its_schema() {
    for syntax in [ToolSyntax::Qwen3Coder, ToolSyntax::Glm45] {
        let (c, out) = forced_in(&[weather(), clock()], syntax);
        let t = |name, params: &[(&str, &str)]| tagged_text(syntax, name, params);
        let good = [
            t("get_weather", &[("city", "\"Oslo\"")]),
            t(
                "get_weather",
                &[("city", "\"a</parameter>b\""), ("unit", "\"f\"")],
            ),
            t("get_time", &[]),
        ];
        for text in &good {
            assert!(c.accepts(text.as_bytes()), "{syntax:?}: {text}");
        }
        let (calls, _) = parsed(out, &good[1]);
        assert_eq!(calls[0].1, json!({"city": "a</parameter>b", "unit": "f"}));
        let bad = [
            t("get_weather", &[]),
            t("get_weather", &[("city", "Oslo")]),
            t("get_weather", &[("city", "\"Oslo\""), ("unit", "\"k\"")]),
            t("get_weather", &[("unit", "\"c\""), ("city", "\"Oslo\"")]),
            t("get_weather", &[("city", "\"Oslo\""), ("days", "3")]),
            t("get_weather", &[("city", "\"Oslo\""), ("city", "\"Rome\"")]),
            t(
                "get_weather",
                &[("city", "\"Oslo\""), ("unit", "\"c\""), ("unit", "\"f\"")],
            ),
            t("get_time", &[("city", "\"Oslo\"")]),
            t("get_news", &[]),
        ];
        for text in &bad {
            assert!(!c.accepts(text.as_bytes()), "{syntax:?}: {text}");
        }
        let defs = json!({"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"$ref": "#/$defs/x"}},
            "$defs": {"x": {"type": "integer"}}}}});
        let (c, out) = forced_in(&[defs], syntax);
        assert_eq!(out.tools, Some(ToolSyntax::Hermes), "{syntax:?}");
        assert!(whole(&c, r#"{"name": "f", "arguments": {"x": 1}}"#));
    }
}

/// `text` as ids of a toy vocabulary: the 256 bytes, then `specials` as control tokens
/// (each occurrence of one in the text is that token).
fn toy_ids(text: &str, specials: &[&str]) -> Vec<u32> {
    let mut ids = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        match specials.iter().position(|s| rest.starts_with(s)) {
            Some(i) => {
                ids.push(256 + i as u32);
                rest = &rest[specials[i].len()..];
            }
            None => {
                ids.push(u32::from(rest.as_bytes()[0]));
                rest = &rest[1..];
            }
        }
    }
    ids
}

/// A harmony call is a message to the function with its markers as control tokens.
/// Oracles: the harmony format, fed token by token over a toy vocabulary (the 256 bytes,
/// then the control tokens), and the harmony parser reading the call back.
#[test]
fn a_harmony_call_is_written_with_control_tokens() {
    use ferrite_engine::grammar::{Matcher, Token, Vocab};
    const SPECIALS: [&str; 4] = ["<|channel|>", "<|constrain|>", "<|message|>", "<|call|>"];
    let mut tokens: Vec<Token> = (0..=255).map(|b| Token::Text(vec![b])).collect();
    tokens.extend(SPECIALS.map(|s| Token::Special(s.into())));
    let call = 256 + 3;
    let vocab = Vocab::new(tokens, &[call]).unwrap();
    let (c, out) = forced_in(&[weather(), clock()], ToolSyntax::Harmony);
    assert_eq!(out.tools, Some(ToolSyntax::Harmony));
    let ids = |text: &str| toy_ids(text, &SPECIALS);
    let takes = |ids: &[u32]| {
        let mut m = Matcher::new(&vocab, &c).unwrap();
        ids.iter().all(|&t| m.accept(t).is_ok()) && m.allows(call).unwrap()
    };
    let good = r#"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}"#;
    assert!(takes(&ids(good)), "{good}");
    assert!(takes(&ids(
        "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}"
    )));
    for bad in [
        r#"<|channel|>commentary to=functions.get_news <|constrain|>json<|message|>{}"#,
        r#"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"town": "Oslo"}"#,
        r#"<|channel|>final<|message|>{"city": "Oslo"}"#,
    ] {
        assert!(!takes(&ids(bad)), "{bad}");
    }
    // The markers written as text are not the control tokens.
    let as_text: Vec<u32> = good.bytes().map(u32::from).collect();
    assert!(!takes(&as_text));
    let (calls, content) = parsed(out, good);
    assert_eq!(
        calls,
        [("get_weather".to_string(), json!({"city": "Oslo"}))]
    );
    assert_eq!(content, "");
}

/// A DeepSeek V3/R1 call written by hand as its chat template writes one.
fn deepseek_text(name: &str, arguments: &str) -> String {
    format!(
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n\
         {arguments}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    )
}

/// A DeepSeek call's markers are control tokens where the model's vocabulary holds them as
/// such, text otherwise. Oracles: the call format as the template writes it (by hand,
/// bad cases beside), fed byte by byte where the markers are text and token by token over
/// a toy vocabulary (the 256 bytes, then the markers) where they are control tokens; the
/// DeepSeek parser reading the call back.
#[test]
fn a_deepseek_call_names_its_markers_as_the_vocabulary_holds_them() {
    use ferrite_engine::grammar::{Matcher, Token, Vocab};
    const MARKERS: [&str; 5] = [
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁sep｜>",
    ];
    let good = [
        deepseek_text("get_weather", r#"{"city": "Oslo"}"#),
        deepseek_text(
            "get_weather",
            r#"{"city": "a<｜tool▁call▁end｜>b", "unit": "f"}"#,
        ),
        deepseek_text("get_time", "{}"),
    ];
    let bad = [
        deepseek_text("get_news", "{}"),
        deepseek_text("get_weather", r#"{"town": "Oslo"}"#),
        deepseek_text("get_weather", r#"{"city":  "Oslo"}"#),
        deepseek_text("get_weather", r#" {"city": "Oslo"}"#),
        // V3.1's unfenced call, and the fence left out.
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>\
         <｜tool▁calls▁end｜>"
            .to_string(),
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n{}\
         <｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            .to_string(),
        // Unclosed, and two calls where one is forced.
        deepseek_text("get_time", "{}").replace("<｜tool▁calls▁end｜>", ""),
        deepseek_text("get_time", "{}").replace(
            "<｜tool▁calls▁end｜>",
            &deepseek_text("get_time", "{}")["<｜tool▁calls▁begin｜>".len()..],
        ),
    ];
    let tools = [weather(), clock()];
    // Markers as text: the grammar over bytes.
    let (c, out) = forced_in(&tools, ToolSyntax::DeepSeek);
    assert_eq!(out.tools, Some(ToolSyntax::DeepSeek));
    for text in &good {
        assert!(c.accepts(text.as_bytes()), "{text}");
    }
    for text in &bad {
        assert!(!c.accepts(text.as_bytes()), "{text}");
    }
    let (calls, content) = parsed(out, &good[1]);
    assert_eq!(
        calls,
        [(
            "get_weather".to_string(),
            json!({"city": "a<｜tool▁call▁end｜>b", "unit": "f"})
        )]
    );
    assert_eq!(content, "");
    // Markers as control tokens: the grammar names them, token by token.
    let mut tokens: Vec<Token> = (0..=255).map(|b| Token::Text(vec![b])).collect();
    tokens.extend(MARKERS.map(|m| Token::Special(m.into())));
    tokens.push(Token::Special("<｜end▁of▁sentence｜>".into()));
    let eos = tokens.len() as u32 - 1;
    let vocab = Vocab::new(tokens, &[eos]).unwrap();
    let (c, out) = forced_over(&tools, ToolSyntax::DeepSeek, &|m| MARKERS.contains(&m));
    let ids = |text: &str| toy_ids(text, &MARKERS);
    let takes = |ids: &[u32]| {
        let mut m = Matcher::new(&vocab, &c).unwrap();
        ids.iter().all(|&t| m.accept(t).is_ok()) && m.allows(eos).unwrap()
    };
    // A marker inside a JSON string is text, never the control token.
    for text in &good[..1] {
        assert!(takes(&ids(text)), "{text}");
    }
    assert!(takes(&ids(&deepseek_text("get_time", "{}"))));
    for text in &bad {
        assert!(!takes(&ids(text)), "{text}");
    }
    // The markers spelt as text are not the control tokens.
    let as_text: Vec<u32> = good[0].bytes().map(u32::from).collect();
    assert!(!takes(&as_text));
    let (calls, _) = parsed(out, &good[0]);
    assert_eq!(
        calls,
        [("get_weather".to_string(), json!({"city": "Oslo"}))]
    );
}
