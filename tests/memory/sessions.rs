//! Chat sessions the memory tests import: one writer of a session file, and the pottery
//! exchange that several tests search.

use kvmem::memory::ingest::import::{self, ExtractMode};
use kvmem::memory::MemoryService;

/// One session of `user`, message ids `{user}-{i}`, a minute apart on 2 March 2024.
pub async fn import_session(
    svc: &MemoryService,
    user: &str,
    lines: &[(&str, &str)],
) -> import::ImportReport {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("session.jsonl");
    let rows: Vec<String> = lines
        .iter()
        .enumerate()
        .map(|(i, (speaker, text))| {
            serde_json::json!({"user_id": user, "session_id": format!("{user}-s1"),
                "message_id": format!("{user}-{i}"), "speaker": speaker, "text": text,
                "at": format!("2024-03-02T{:02}:{:02}:00Z", 10 + i / 60, i % 60)})
            .to_string()
        })
        .collect();
    std::fs::write(&file, rows.join("\n")).unwrap();
    import::import_file(svc, &file, ExtractMode::None, true, false)
        .await
        .unwrap()
}

pub const POTTERY: &[(&str, &str)] = &[
    ("Pri", "Morning! Did the plumber ever show up?"),
    ("Dana", "He did, the sink is fixed. Finally."),
    ("Pri", "How was the pottery class at Clayhouse on Saturday?"),
    ("Dana", "Honestly amazing. Three bowls and a wonky mug."),
    ("Pri", "Send pictures!!"),
    ("Dana", "Later, I'm off to the gym."),
    ("Pri", "My train is late again, the usual."),
];
