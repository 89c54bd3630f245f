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
    match forced_call(tools, choice).map(|f| f.map(|f| f.format(&output(in_reasoning)))) {
        Ok(Some(Ok(OutputFormat::Held(c)))) => (*c).clone(),
        other => panic!("{choice:?}: {other:?}"),
    }
}

fn schema(tools: &[Value], choice: ToolChoice) -> Constraint {
    held(tools, &choice, false)
}

/// `call` in Hermes markup.
fn hermes(call: &str) -> String {
    let f = Framing::of(ToolSyntax::Hermes);
    format!("{}{call}{}", f.before, f.after)
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

/// Oracle: the output parser itself. A call written as each syntax's framing says is a
/// whole text of the forced grammar and parses back, in that syntax, to the same call;
/// the other syntaxes' key is refused. Syntaxes without a JSON framing fall back to Hermes.
#[test]
fn forced_calls_are_written_in_the_models_own_syntax_and_parse_back() {
    use ferrite_engine::output::{Collected, OutputParser};
    for syntax in ToolSyntax::ALL {
        let f = Framing::of(syntax);
        if syntax == ToolSyntax::Llama3 {
            assert_eq!(
                f.arguments, "parameters",
                "as Llama 3.1's template writes calls"
            );
        }
        let json_framed = matches!(syntax, ToolSyntax::Llama3 | ToolSyntax::Mistral);
        assert_eq!(
            f.syntax == syntax,
            json_framed || syntax == ToolSyntax::Hermes
        );
        let out = OutputConfig {
            tools: Some(f.syntax),
            ..output(false)
        };
        let c = match forced_call(&[weather()], &ToolChoice::Required)
            .unwrap()
            .unwrap()
            .format(&out)
            .unwrap()
        {
            OutputFormat::Held(c) => c,
            other => panic!("{other:?}"),
        };
        let call = format!(
            "{{\"name\": \"get_weather\", \"{}\": {{\"city\": \"Oslo\"}}}}",
            f.arguments
        );
        let text = format!("{}{call}{}", f.before, f.after);
        assert!(c.accepts(text.as_bytes()), "{syntax:?}: {text}");
        let other = if f.arguments == "arguments" {
            "parameters"
        } else {
            "arguments"
        };
        assert!(
            !c.accepts(text.replace(f.arguments, other).as_bytes()),
            "{syntax:?}"
        );
        let mut parser = OutputParser::new(out);
        let mut got = Collected::default();
        got.extend(parser.push(&text, false));
        got.extend(parser.finish().events);
        assert_eq!(got.calls.len(), 1, "{syntax:?}: {got:?}");
        assert!(
            got.calls[0].complete && got.calls[0].name == "get_weather",
            "{got:?}"
        );
        let args: Value = serde_json::from_str(&got.calls[0].arguments).unwrap();
        assert_eq!(args, json!({"city": "Oslo"}), "{syntax:?}");
        assert_eq!(got.content.trim(), "", "{syntax:?}: {got:?}");
    }
}
