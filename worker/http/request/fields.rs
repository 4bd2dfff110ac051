//! A chat request's OpenAI fields beyond the message: the sampling ones kvmem honours,
//! turned into the turn's options (`turns.options`), the ones it cannot honour refused
//! with a 400 that names them, and the system message. Any other field is ignored, as
//! OpenAI ignores fields it does not know.

use serde_json::{json, Map, Value};

use super::error::RequestError;

/// What a request asks of its turn besides the message.
#[derive(Debug, Clone, PartialEq)]
pub struct Fields {
    /// The turn's options, in the shape `kvmem_check_turn_options` admits; `None` when the
    /// request sets no sampling field, so such a turn samples as configured.
    pub options: Option<Value>,
    /// The request's system (or developer) messages, joined; `None` without any.
    pub system: Option<String>,
}

/// The longest persona a character takes (`characters::MAX_PERSONA_CHARS`, which the HTTP
/// layer holds this to): its base prompt is built from it on every turn.
pub const MAX_PERSONA_CHARS: usize = 8_000;

impl Fields {
    /// The system message as the character's persona (`http.system_message = persona`),
    /// held to what an edit of the character is held to: it is one, by another door.
    pub fn persona(&self) -> Result<Option<&str>, RequestError> {
        let Some(system) = self.system.as_deref() else {
            return Ok(None);
        };
        let control = |c: char| c.is_control() && !matches!(c, '\n' | '\r' | '\t');
        if system.chars().count() > MAX_PERSONA_CHARS || system.chars().any(control) {
            return Err(RequestError::Persona {
                limit: MAX_PERSONA_CHARS,
            });
        }
        Ok(Some(system))
    }
}

/// Reads `body` (the request's JSON object). Refusals come first, so a request kvmem
/// cannot answer as asked never queues a turn.
pub fn read(body: &Value) -> Result<Fields, RequestError> {
    refuse(body)?;
    Ok(Fields {
        options: options(body)?,
        system: system(body)?,
    })
}

/// `n > 1`, tools, `tool_choice`, a structured `response_format` and `logprobs`: kvmem
/// makes one plain-text reply per turn, so a request for anything else gets 400 rather
/// than a reply that silently is not what it asked for.
fn refuse(body: &Value) -> Result<(), RequestError> {
    let given = |k: &str| body.get(k).filter(|v| !v.is_null());
    if let Some(n) = given("n") {
        if n.as_u64() != Some(1) {
            return Err(refused(
                "n",
                "kvmem makes one reply per request; n must be 1",
            ));
        }
    }
    if given("tools").is_some_and(|t| t.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(refused("tools", "kvmem does not call tools"));
    }
    if given("functions").is_some_and(|t| t.as_array().is_none_or(|a| !a.is_empty())) {
        return Err(refused("functions", "kvmem does not call functions"));
    }
    if given("tool_choice").is_some_and(|c| c != "none") {
        return Err(refused("tool_choice", "kvmem does not call tools"));
    }
    if given("response_format").is_some_and(|f| f != &json!({"type": "text"})) {
        return Err(refused(
            "response_format",
            "kvmem replies in plain text only; response_format may only be {\"type\": \"text\"}",
        ));
    }
    if given("logprobs").is_some_and(|l| l != &Value::Bool(false)) {
        return Err(refused(
            "logprobs",
            "kvmem does not return log probabilities",
        ));
    }
    Ok(())
}

fn refused(field: &'static str, why: &'static str) -> RequestError {
    RequestError::Unsupported { field, why }
}

fn invalid(field: &'static str, why: &'static str) -> RequestError {
    RequestError::Invalid { field, why }
}

/// `temperature`, `top_p`, `seed`, `stop`, and `max_completion_tokens` or `max_tokens`
/// (the smaller when both), checked against the ranges the SQL function enforces. A seed
/// of -1 is llama.cpp's "unset": the configured seed.
fn options(body: &Value) -> Result<Option<Value>, RequestError> {
    let given = |k: &str| body.get(k).filter(|v| !v.is_null());
    let mut out = Map::new();
    if let Some(t) = given("temperature") {
        let t = t.as_f64().filter(|t| (0.0..=2.0).contains(t));
        let t = t.ok_or_else(|| invalid("temperature", "must be a number from 0 to 2"))?;
        out.insert("temperature".into(), json!(t));
    }
    if let Some(p) = given("top_p") {
        let p = p.as_f64().filter(|p| *p > 0.0 && *p <= 1.0);
        let p = p.ok_or_else(|| invalid("top_p", "must be a number above 0, at most 1"))?;
        out.insert("top_p".into(), json!(p));
    }
    if let Some(s) = given("seed").filter(|s| s.as_i64() != Some(-1)) {
        let s = s.as_u64().filter(|s| *s <= u32::MAX as u64);
        let s = s.ok_or_else(|| invalid("seed", "must be a whole number from 0 to 4294967295"))?;
        out.insert("seed".into(), json!(s));
    }
    if let Some(stop) = given("stop") {
        let list = match stop {
            Value::String(s) => vec![s.clone()],
            Value::Array(a) => a
                .iter()
                .map(|s| s.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| invalid("stop", "must be a string or a list of strings"))?,
            _ => return Err(invalid("stop", "must be a string or a list of strings")),
        };
        if list.len() > 16
            || list
                .iter()
                .any(|s| s.is_empty() || s.chars().count() > MAX_STOP_CHARS)
        {
            return Err(invalid(
                "stop",
                "at most 16 strings, none empty, each of at most 64 characters",
            ));
        }
        if !list.is_empty() {
            out.insert("stop".into(), json!(list));
        }
    }
    let mut max = None::<u64>;
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(m) = given(key) {
            let m = m.as_u64().filter(|m| (1..=i32::MAX as u64).contains(m));
            let m = m.ok_or_else(|| invalid(key, "must be a whole number of at least 1"))?;
            max = Some(max.map_or(m, |x| x.min(m)));
        }
    }
    if let Some(m) = max {
        out.insert("max_tokens".into(), json!(m));
    }
    Ok((!out.is_empty()).then_some(Value::Object(out)))
}

/// The longest stop string: the worker scans every generated piece for each one, and
/// kvmem_check_turn_options holds the SQL API to the same bound.
pub const MAX_STOP_CHARS: usize = 64;

/// The text of the `system` and `developer` messages, in order.
fn system(body: &Value) -> Result<Option<String>, RequestError> {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Ok(None);
    };
    let mut parts = Vec::new();
    for m in messages {
        if !matches!(m["role"].as_str(), Some("system" | "developer")) {
            continue;
        }
        parts.push(
            text_of(&m["content"])
                .ok_or_else(|| invalid("messages", "a system message's content must be text"))?,
        );
    }
    let text = parts.join("\n\n");
    Ok((!text.trim().is_empty()).then_some(text))
}

/// A message's text: a string, or the text parts of a list of content parts.
fn text_of(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| (p["type"] == "text").then(|| p["text"].as_str()).flatten())
            .collect::<Option<Vec<_>>>()
            .map(|t| t.concat()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(body: &Value) -> Fields {
        match read(body) {
            Ok(f) => f,
            Err(e) => panic!("refused: {e}"),
        }
    }

    fn err(body: Value) -> String {
        read(&body).expect_err("refused").to_string()
    }

    #[test]
    fn fields_kvmem_cannot_honour_are_refused_by_name() {
        for (field, value) in [
            ("n", json!(2)),
            ("tools", json!([{"type": "function"}])),
            ("tool_choice", json!("auto")),
            ("response_format", json!({"type": "json_object"})),
            ("logprobs", json!(true)),
        ] {
            let msg = err(json!({ field: value }));
            assert!(msg.contains(&format!("`{field}`")), "{field}: {msg}");
        }
        let fine = json!({"n": 1, "tools": [], "tool_choice": "none", "logprobs": false,
                          "response_format": {"type": "text"}, "frequency_penalty": 0.5});
        assert!(ok(&fine).options.is_none());
    }

    #[test]
    fn sampling_fields_become_the_turns_options() {
        let f = ok(
            &json!({"temperature": 0.7, "top_p": 0.9, "seed": 42, "stop": "END",
                           "max_tokens": 50, "max_completion_tokens": 20}),
        );
        assert_eq!(
            f.options,
            Some(
                json!({"temperature": 0.7, "top_p": 0.9, "seed": 42, "stop": ["END"],
                        "max_tokens": 20})
            )
        );
        assert!(ok(&json!({"seed": -1})).options.is_none());
        for (field, value) in [
            ("temperature", json!(3)),
            ("top_p", json!(0)),
            ("seed", json!(-2)),
            ("stop", json!([""])),
            ("max_tokens", json!(0)),
            ("max_completion_tokens", json!("ten")),
        ] {
            let msg = err(json!({ field: value }));
            assert!(msg.contains(&format!("`{field}`")), "{field}: {msg}");
        }
    }

    #[test]
    fn system_messages_are_joined() {
        let body = json!({"messages": [
            {"role": "system", "content": "You are Ada."},
            {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": "hi"}
        ]});
        assert_eq!(
            ok(&body).system.as_deref(),
            Some("You are Ada.\n\nBe brief.")
        );
        assert!(ok(&json!({"messages": []})).system.is_none());
    }
}
