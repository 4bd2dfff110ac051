//! A structure-aware chat request: fuzzer-chosen messages, roles, content parts, ids,
//! sampling fields and headers, built into a JSON body. Raw bytes rarely make a body that
//! types as a request with messages; this reaches the dialogue, the bounds and the
//! sampling checks on every input, with lengths and numbers drawn near each limit.

use arbitrary::Arbitrary;
use serde_json::{json, Map, Value};

use crate::chat::{Headers, Rules};

#[derive(Arbitrary, Debug)]
pub struct ChatPlan {
    messages: Vec<Message>,
    model: Option<Text>,
    user: Option<Text>,
    session_id: Option<Text>,
    character_id: Option<Json>,
    stream: Option<Json>,
    include_usage: Option<bool>,
    fields: Vec<(Field, Json)>,
    stop: Option<Stop>,
    headers: PlanHeaders,
    max_message_chars: u8,
    marker: Marker,
    /// Wrap the body in an extra field nested this deep (a body serde types as a request
    /// but not as JSON past 128 levels).
    nesting: u8,
}

#[derive(Arbitrary, Debug)]
struct Message {
    role: Role,
    content: Content,
    /// An extra key beside role and content (a `name`, a tool call id).
    extra: Option<(Text, Json)>,
}

#[derive(Arbitrary, Debug)]
enum Role {
    User,
    Assistant,
    System,
    Developer,
    Tool,
    Other(String),
    Missing,
}

#[derive(Arbitrary, Debug)]
enum Content {
    Text(Text),
    Parts(Vec<Part>),
    Null,
    Missing,
    Other(Json),
}

#[derive(Arbitrary, Debug)]
struct Part {
    kind: PartKind,
    text: Option<Json>,
}

#[derive(Arbitrary, Debug)]
enum PartKind {
    Text,
    ImageUrl,
    Other(String),
    Missing,
}

/// Text near the bounds: as given, one character repeated (ids around 256 bytes, stop
/// strings around 64 characters, messages around the limit), or with a control character.
#[derive(Arbitrary, Debug)]
enum Text {
    Given(String),
    Repeat(char, u16),
    Around(Bound, i8, char),
    Control(String, u8),
    Marked(String),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Bound {
    Id,
    Stop,
    Message,
    Persona,
}

#[derive(Arbitrary, Debug)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Edge(Edge),
    Text(Text),
    List(Vec<Json>),
    Object(Vec<(String, Json)>),
}

/// The numbers each sampling check turns on.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Edge {
    Zero,
    One,
    Two,
    MinusOne,
    MinusTwo,
    U32Max,
    U32MaxPlusOne,
    I32Max,
    I32MaxPlusOne,
    SevenPointZero,
    Half,
    JustOverTwo,
    TinyPositive,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Field {
    Temperature,
    TopP,
    Seed,
    MaxTokens,
    MaxCompletionTokens,
    N,
    Tools,
    Functions,
    ToolChoice,
    ResponseFormat,
    Logprobs,
    FrequencyPenalty,
}

#[derive(Arbitrary, Debug)]
enum Stop {
    One(Text),
    List(Vec<Text>),
    Other(Json),
}

#[derive(Arbitrary, Debug)]
struct PlanHeaders {
    session: Option<Text>,
    key: Option<Text>,
    character: Option<Text>,
    timeout_ms: Option<Text>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Marker {
    None,
    Shipped,
    Short,
}

impl ChatPlan {
    /// The body, the headers and the settings this plan asks for.
    pub fn build(&self) -> (Vec<u8>, Headers, Rules) {
        let mut body = Map::new();
        let messages = self.messages.iter().map(Message::json).collect();
        body.insert("messages".into(), Value::Array(messages));
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                body.insert(k.into(), v);
            }
        };
        put(
            "model",
            self.model.as_ref().map(|t| Value::String(t.text())),
        );
        put("user", self.user.as_ref().map(|t| Value::String(t.text())));
        put(
            "session_id",
            self.session_id.as_ref().map(|t| Value::String(t.text())),
        );
        put("character_id", self.character_id.as_ref().map(Json::json));
        put("stream", self.stream.as_ref().map(Json::json));
        put(
            "stream_options",
            self.include_usage.map(|u| json!({ "include_usage": u })),
        );
        put("stop", self.stop.as_ref().map(Stop::json));
        for (field, value) in &self.fields {
            put(field.name(), Some(value.json()));
        }
        let mut text = serde_json::to_string(&Value::Object(body)).expect("serializes");
        if self.nesting > 0 {
            // Written out by hand: serde_json would refuse to build what it cannot parse.
            let depth = usize::from(self.nesting) * 2;
            let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            text.insert_str(1, &format!("\"deep\":{deep},"));
        }
        let h = &self.headers;
        let headers = Headers {
            session: h.session.as_ref().map(Text::text),
            key: h.key.as_ref().map(Text::text),
            character: h.character.as_ref().map(Text::text),
            timeout_ms: h.timeout_ms.as_ref().map(Text::text),
        };
        let rules = Rules {
            max_message_chars: usize::from(self.max_message_chars),
            task_marker: match self.marker {
                Marker::None => String::new(),
                Marker::Shipped => "### Task:".into(),
                Marker::Short => "t".into(),
            },
            timeout_ms: 1_000,
            max_timeout_ms: 60_000,
        };
        (text.into_bytes(), headers, rules)
    }
}

impl Message {
    fn json(&self) -> Value {
        let mut m = Map::new();
        let role = match &self.role {
            Role::User => Some("user".to_string()),
            Role::Assistant => Some("assistant".into()),
            Role::System => Some("system".into()),
            Role::Developer => Some("developer".into()),
            Role::Tool => Some("tool".into()),
            Role::Other(r) => Some(r.clone()),
            Role::Missing => None,
        };
        if let Some(role) = role {
            m.insert("role".into(), Value::String(role));
        }
        let content = match &self.content {
            Content::Text(t) => Some(Value::String(t.text())),
            Content::Parts(parts) => Some(Value::Array(parts.iter().map(Part::json).collect())),
            Content::Null => Some(Value::Null),
            Content::Missing => None,
            Content::Other(j) => Some(j.json()),
        };
        if let Some(content) = content {
            m.insert("content".into(), content);
        }
        if let Some((k, v)) = &self.extra {
            m.entry(k.text()).or_insert_with(|| v.json());
        }
        Value::Object(m)
    }
}

impl Part {
    fn json(&self) -> Value {
        let mut p = Map::new();
        let kind = match &self.kind {
            PartKind::Text => Some("text".to_string()),
            PartKind::ImageUrl => Some("image_url".into()),
            PartKind::Other(k) => Some(k.clone()),
            PartKind::Missing => None,
        };
        if let Some(kind) = kind {
            p.insert("type".into(), Value::String(kind));
        }
        if let Some(text) = &self.text {
            p.insert("text".into(), text.json());
        }
        Value::Object(p)
    }
}

impl Text {
    fn text(&self) -> String {
        match self {
            Text::Given(s) => s.clone(),
            Text::Repeat(c, n) => c.to_string().repeat(usize::from(*n % 1024)),
            Text::Around(bound, off, c) => {
                let at = match bound {
                    Bound::Id => 256,
                    Bound::Stop => 64,
                    Bound::Message => 16,
                    Bound::Persona => 8_000,
                };
                let n = (at + i64::from(*off % 4)).max(0) as usize;
                c.to_string().repeat(n)
            }
            Text::Control(s, c) => format!("{s}{}", char::from(*c % 0x20)),
            Text::Marked(s) => format!("### Task: {s}"),
        }
    }
}

impl Json {
    fn json(&self) -> Value {
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => json!(b),
            Json::Int(i) => json!(i),
            Json::UInt(u) => json!(u),
            Json::Float(f) => json!(f),
            Json::Edge(e) => e.json(),
            Json::Text(t) => Value::String(t.text()),
            Json::List(l) => Value::Array(l.iter().map(Json::json).collect()),
            Json::Object(o) => {
                Value::Object(o.iter().map(|(k, v)| (k.clone(), v.json())).collect())
            }
        }
    }
}

impl Edge {
    fn json(self) -> Value {
        match self {
            Edge::Zero => json!(0),
            Edge::One => json!(1),
            Edge::Two => json!(2),
            Edge::MinusOne => json!(-1),
            Edge::MinusTwo => json!(-2),
            Edge::U32Max => json!(u32::MAX),
            Edge::U32MaxPlusOne => json!(u64::from(u32::MAX) + 1),
            Edge::I32Max => json!(i32::MAX),
            Edge::I32MaxPlusOne => json!(i64::from(i32::MAX) + 1),
            Edge::SevenPointZero => json!(7.0),
            Edge::Half => json!(0.5),
            Edge::JustOverTwo => json!(2.000_000_000_000_001),
            Edge::TinyPositive => json!(f64::MIN_POSITIVE),
        }
    }
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Temperature => "temperature",
            Field::TopP => "top_p",
            Field::Seed => "seed",
            Field::MaxTokens => "max_tokens",
            Field::MaxCompletionTokens => "max_completion_tokens",
            Field::N => "n",
            Field::Tools => "tools",
            Field::Functions => "functions",
            Field::ToolChoice => "tool_choice",
            Field::ResponseFormat => "response_format",
            Field::Logprobs => "logprobs",
            Field::FrequencyPenalty => "frequency_penalty",
        }
    }
}

impl Stop {
    fn json(&self) -> Value {
        match self {
            Stop::One(t) => Value::String(t.text()),
            Stop::List(l) => Value::Array(l.iter().map(|t| Value::String(t.text())).collect()),
            Stop::Other(j) => j.json(),
        }
    }
}
