//! A request's `messages` read as a dialogue: a front-end sends the whole history on every
//! request, and kvmem keeps its own, so the messages become exchanges to match (or import)
//! and the message to queue.

use serde_json::Value;

use super::error::RequestError;

/// A request's `messages` read as a dialogue: the exchanges before its message, and the
/// message. System and developer messages are set aside (they are not dialogue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dialogue {
    /// (message, reply) per exchange, oldest first. A run of user messages is one message
    /// and a run of assistant messages one reply, joined by a blank line; a reply before any
    /// user message (a character's greeting) answers an empty message.
    pub history: Vec<(String, String)>,
    /// The run of user messages that ends the dialogue, joined as in `history`.
    pub message: String,
    /// The last user message alone: what a request naming its session sends.
    pub last: String,
}

/// Reads `(role, content)` pairs. Messages after the last user message are not read: kvmem
/// does not continue a reply the client began.
pub fn read<'a>(
    messages: impl Iterator<Item = (&'a str, &'a Value)>,
    max_chars: usize,
) -> Result<Dialogue, RequestError> {
    let mut turns: Vec<(bool, String)> = Vec::new();
    for (index, (role, content)) in messages.enumerate() {
        let is_user = match role {
            "user" => true,
            "assistant" => false,
            "system" | "developer" => continue,
            other => {
                return Err(RequestError::Role {
                    index,
                    role: other.to_string(),
                })
            }
        };
        let text = text(index, content, is_user)?;
        checked(index, &text, max_chars)?;
        turns.push((is_user, text));
    }
    let end = turns
        .iter()
        .rposition(|(is_user, _)| *is_user)
        .ok_or(RequestError::NoUserMessage)?;
    let start = turns[..end]
        .iter()
        .rposition(|(is_user, _)| !*is_user)
        .map_or(0, |i| i + 1);
    let message = turns[start..=end]
        .iter()
        .map(|(_, t)| t.as_str())
        .collect::<Vec<_>>()
        .join("\n\n");
    Ok(Dialogue {
        history: exchanges(&turns[..start]),
        message,
        last: turns[end].1.clone(),
    })
}

/// One message's text within `http.max_message_chars`, and holding only what a Postgres
/// `text` and a prompt can: a NUL is named apart, as the SQL API's refusal names it.
fn checked(index: usize, text: &str, max_chars: usize) -> Result<(), RequestError> {
    let chars = text.chars().count();
    if chars > max_chars {
        return Err(RequestError::MessageTooLong {
            index,
            chars,
            limit: max_chars,
        });
    }
    if text.contains('\0') {
        return Err(RequestError::Nul { index });
    }
    if text
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    {
        return Err(RequestError::Control { index });
    }
    Ok(())
}

/// Groups alternating runs into (message, reply) exchanges.
fn exchanges(turns: &[(bool, String)]) -> Vec<(String, String)> {
    let mut out: Vec<(Vec<&str>, Vec<&str>)> = Vec::new();
    for (is_user, text) in turns {
        match out.last_mut() {
            Some((_, reply)) if *is_user && reply.is_empty() => {}
            Some((_, reply)) if !*is_user => {
                reply.push(text);
                continue;
            }
            _ => out.push((Vec::new(), Vec::new())),
        }
        let (message, reply) = out.last_mut().expect("pushed above");
        if *is_user {
            message.push(text);
        } else {
            reply.push(text);
        }
    }
    out.into_iter()
        .map(|(m, r)| (m.join("\n\n"), r.join("\n\n")))
        .collect()
}

/// A message's text: a string, or OpenAI's content parts when all are text (joined). An
/// assistant message may have no content (it called a tool): it reads as empty.
fn text(index: usize, content: &Value, is_user: bool) -> Result<String, RequestError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Null if !is_user => Ok(String::new()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match (p["type"].as_str(), p["text"].as_str()) {
                (Some("text"), Some(t)) => Ok(t),
                _ => Err(RequestError::NotText { index }),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|t| t.concat()),
        _ => Err(RequestError::NotString),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dialogue(messages: Value) -> Result<Dialogue, RequestError> {
        let list = messages.as_array().unwrap().clone();
        let pairs: Vec<(String, Value)> = list
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap().to_string(),
                    m["content"].clone(),
                )
            })
            .collect();
        read(pairs.iter().map(|(r, c)| (r.as_str(), c)), 32_000)
    }

    fn pair(m: &str, r: &str) -> (String, String) {
        (m.to_string(), r.to_string())
    }

    #[test]
    fn a_front_ends_history_reads_as_exchanges() {
        let d = dialogue(json!([
            {"role": "system", "content": "Be brief."},
            {"role": "assistant", "content": "Welcome aboard."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
            {"role": "user", "content": "One"},
            {"role": "user", "content": "Two"},
            {"role": "assistant", "content": "A"},
            {"role": "assistant", "content": "B"},
            {"role": "user", "content": "Three"},
            {"role": "user", "content": "Four"},
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            d.history,
            vec![
                pair("", "Welcome aboard."),
                pair("Hi", "Hello"),
                pair("One\n\nTwo", "A\n\nB")
            ]
        );
        assert_eq!(d.message, "Three\n\nFour");
        assert_eq!(d.last, "Four");
    }

    #[test]
    fn a_request_without_a_user_message_or_with_a_tool_message_is_refused() {
        assert!(dialogue(json!([{"role": "assistant", "content": "x"}])).is_err());
        let tool = json!([{"role": "tool", "content": "x"}, {"role": "user", "content": "y"}]);
        let e = dialogue(tool).unwrap_err().to_string();
        assert!(e.contains("messages[0]"), "{e}");
    }
}
