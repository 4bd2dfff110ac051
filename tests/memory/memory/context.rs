//! Context in the lexical leg: a turn carries its neighbours' words, and a neighbour is only
//! ever a turn of the same user's same session, never another user's (even under the same
//! session id) nor another session's.

use super::*;

/// alice's session s1 around a trip; her session s2, between its turns in time, about
/// Porto; bob's own session s1 (the same id), between alice's turns in time, about Porto.
async fn import_neighbours(svc: &MemoryService) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("neighbours.jsonl");
    let lines = [
        (
            "alice",
            "s1",
            "a-1",
            "Alice",
            "We booked the trip to Lisbon for May.",
            "10:00",
        ),
        (
            "alice",
            "s1",
            "a-2",
            "Bot",
            "The flights were cheap this time.",
            "10:01",
        ),
        (
            "alice",
            "s2",
            "a-4",
            "Alice",
            "My aunt in Porto sent a postcard.",
            "10:02",
        ),
        (
            "bob",
            "s1",
            "b-1",
            "Bob",
            "Porto has the best bakeries in town.",
            "10:03",
        ),
        (
            "alice",
            "s1",
            "a-3",
            "Alice",
            "Anyway, see you soon.",
            "10:10",
        ),
        (
            "alice",
            "s1",
            "a-5",
            "Bot",
            "Take care until then.",
            "10:11",
        ),
        ("alice", "s1", "a-6", "Alice", "Good night.", "10:12"),
    ];
    let text: Vec<String> = lines
        .iter()
        .map(|(u, s, m, sp, t, at)| {
            serde_json::json!({"user_id": u, "session_id": s, "message_id": m, "speaker": sp,
                "text": t, "at": format!("2024-05-03T{at}:00Z")})
            .to_string()
        })
        .collect();
    std::fs::write(&file, text.join("\n")).unwrap();
    let report = import::import_file(svc, &file, ExtractMode::None, true, false)
        .await
        .unwrap();
    assert_eq!(report.imported, lines.len());
}

/// Each hit's BM25 share by message id.
fn parts(res: &search::SearchResponse) -> std::collections::HashMap<String, f64> {
    res.hits
        .iter()
        .map(|h| {
            let id = h.source_message_ids[0].clone();
            (id, h.components.bm25.unwrap_or(0.0))
        })
        .collect()
}

#[sqlx::test(migrations = false)]
async fn a_turn_reads_its_own_sessions_neighbours_and_no_one_elses(pool: PgPool) {
    let svc = service(&pool).await;
    import_neighbours(&svc).await;

    // The trip's turn is found by its words; the reply after it carries them, as does the
    // turn two after (within the reach); the other session's turn, though between them in
    // time, does not, nor does the turn three after.
    let res = search::search(&svc, &req("alice", "Lisbon trip", RankerKind::Hybrid))
        .await
        .unwrap();
    let p = parts(&res);
    assert!(p.keys().all(|id| id.starts_with("a-")), "{p:?}");
    assert!(p["a-1"] > 0.0, "{p:?}");
    assert!(p["a-2"] > 0.0 && p["a-3"] > 0.0, "{p:?}");
    // A neighbour's word counts less than an own one.
    assert!(p["a-1"] > p["a-2"], "{p:?}");
    assert_eq!(p["a-4"], 0.0, "another session's turn: {p:?}");
    assert_eq!(p["a-5"], 0.0, "three turns away: {p:?}");

    // Porto is said in alice's other session and by bob in his session of the same id,
    // both between the turns of alice's s1 in time: s1's turns get none of the words.
    let res = search::search(&svc, &req("alice", "Porto", RankerKind::Hybrid))
        .await
        .unwrap();
    let p = parts(&res);
    assert!(p.keys().all(|id| id.starts_with("a-")), "{p:?}");
    assert!(p["a-4"] > 0.0, "{p:?}");
    for id in ["a-1", "a-2", "a-3", "a-5", "a-6"] {
        assert_eq!(p[id], 0.0, "{id}: {p:?}");
    }

    // bob's turn sits between alice's trip turns under the same session id: it reads none
    // of their words.
    let res = search::search(&svc, &req("bob", "Lisbon trip", RankerKind::Hybrid))
        .await
        .unwrap();
    let p = parts(&res);
    assert_eq!(p.keys().collect::<Vec<_>>(), ["b-1"], "{p:?}");
    assert_eq!(p["b-1"], 0.0, "{p:?}");
}
