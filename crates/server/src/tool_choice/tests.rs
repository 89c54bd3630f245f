//! Parsing each API's tool choice, and the schema of forced calls. Oracle for the schemas:
//! the schema grammar itself, fed call objects written by hand.

use ferrite_engine::json_schema_prefix::SchemaPrefix;

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

fn schema(tools: &[Value], choice: ToolChoice) -> JsonSchema {
    match forced_call(tools, &choice) {
        Ok(Some(OutputFormat::ToolCall(s))) => (*s).clone(),
        other => panic!("{choice:?}: {other:?}"),
    }
}

fn whole(s: &JsonSchema, text: &str) -> bool {
    SchemaPrefix::new()
        .feed(s, text.as_bytes())
        .is_some_and(|p| p.is_complete())
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
        r#"{"name":"get_weather","arguments":{"city":"Oslo","unit":"c"}}"#
    ));
    for text in [
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
fn tools_whose_definitions_clash_take_any_arguments() {
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
    // Two definitions of one name: the arguments are any object.
    let s = schema(
        &[with_point("a", "x"), with_point("b", "y")],
        ToolChoice::Required,
    );
    assert!(whole(&s, r#"{"name": "b", "arguments": {"q": 1}}"#));
    assert!(!whole(&s, r#"{"name": "b", "arguments": 1}"#));
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
                "type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}}}),
            ],
            ToolChoice::Required,
            "tools",
            "\"pattern\"",
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
