//! Identity cannot be claimed: in each `http.identity` mode, bob, holding bob's own valid
//! credential (the backend's sources, the proxy's header, bob's key), names alice through
//! every other source on every route. Each attempt is refused (400 where a backend's
//! sources disagree, 403 where the mode makes one source authoritative), nothing of alice's
//! comes back, and the same request without the claim is served as bob. Keys are created,
//! listed and revoked through the CLI, and stored only hashed.

use crate::common;

use std::sync::Arc;

use common::*;
use kvmem::queue;
use reqwest::{Method, RequestBuilder};
use serde_json::{json, Value};
use sqlx::PgPool;

const SECRET: &str = "alice's locker code is 4417";
const A_SESSION: &str = "sess-alice-id";
const B_SESSION: &str = "sess-bob-id";
const PROXY_HEADER: &str = "x-proxy-user";
const TOKEN: &str = "service-token-1";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Request,
    Header,
    Key,
}

/// How bob authenticates in a mode, and where a request names alice besides.
struct Bob {
    mode: Mode,
    key: String,
}

impl Bob {
    /// Bob's own credential on `req`; `claim` names a user through every source bob does
    /// not own in this mode (None: no claim).
    fn on(&self, req: RequestBuilder, claim: Option<&str>) -> RequestBuilder {
        match (self.mode, claim) {
            // A backend sends bob in the query and the body; the claim comes by header.
            (Mode::Request, Some(c)) => req.header("x-user-id", c),
            (Mode::Request, None) => req,
            (Mode::Header, _) => req.header(PROXY_HEADER, "bob"),
            (Mode::Key, _) => req.bearer_auth(&self.key),
        }
    }

    /// The user the body and the query carry: bob's own as a backend; the claim otherwise.
    fn named(&self, claim: Option<&'static str>) -> Option<&'static str> {
        match self.mode {
            Mode::Request => Some("bob"),
            _ => claim,
        }
    }
}

/// One route: method, path (with `{user}` for the query's user), and the JSON body (with
/// `"{user}"` where the body names the user).
struct Route {
    method: Method,
    path: &'static str,
    body: Option<Value>,
}

fn routes(b_char: i64) -> Vec<Route> {
    let chat = json!({"session_id": B_SESSION, "character_id": b_char, "user": "{user}",
                      "messages": [{"role": "user", "content": "what is the locker code?"}]});
    vec![
        Route {
            method: Method::POST,
            path: "/v1/chat/completions",
            body: Some(chat),
        },
        Route {
            method: Method::GET,
            path: "/v1/models?user={user}",
            body: None,
        },
        Route {
            method: Method::GET,
            path: "/v1/memory/search?user={user}&q=locker%20code",
            body: None,
        },
        Route {
            method: Method::GET,
            path: "/v1/memory?user={user}",
            body: None,
        },
        Route {
            method: Method::POST,
            path: "/v1/memory/refresh?user={user}",
            body: None,
        },
        Route {
            method: Method::GET,
            path: "/v1/memory/summary?user={user}&character=CHAR",
            body: None,
        },
        Route {
            method: Method::GET,
            path: "/v1/memory/todos?user={user}&character=CHAR",
            body: None,
        },
        Route {
            method: Method::GET,
            path: "/v1/rotate-hint?sid=SID&user={user}",
            body: None,
        },
        Route {
            method: Method::GET,
            path: "/v1/characters?user={user}",
            body: None,
        },
        Route {
            method: Method::POST,
            path: "/v1/characters",
            body: Some(json!({"user": "{user}", "name": "Spare"})),
        },
        Route {
            method: Method::PATCH,
            path: "/v1/characters/CHAR",
            body: Some(json!({"user": "{user}", "persona": "rewritten"})),
        },
        Route {
            method: Method::DELETE,
            path: "/v1/characters/CHAR?user={user}",
            body: None,
        },
        Route {
            method: Method::POST,
            path: "/v1/erase",
            body: Some(json!({"user": "{user}", "session_id": "SID"})),
        },
    ]
}

/// `route` as bob with `claim` (or none), against alice's session and character where
/// the route takes one, so a request served as alice would show alice's data.
fn request(
    client: &reqwest::Client,
    base: &str,
    route: &Route,
    bob: &Bob,
    claim: Option<&'static str>,
    a_char: i64,
) -> RequestBuilder {
    let user = bob.named(claim);
    let fill = |s: &str| {
        let s = s
            .replace("CHAR", &a_char.to_string())
            .replace("SID", A_SESSION);
        match user {
            Some(u) => s.replace("{user}", u),
            None => s
                .replace("user={user}&", "")
                .replace("?user={user}", "")
                .replace("&user={user}", ""),
        }
    };
    let mut req = client.request(route.method.clone(), format!("{base}{}", fill(route.path)));
    if let Some(body) = &route.body {
        let mut body: Value = serde_json::from_str(&fill(&body.to_string())).unwrap();
        if user.is_none() {
            body.as_object_mut().unwrap().remove("user");
        }
        req = req.json(&body);
    }
    bob.on(req, claim)
}

async fn serve_mode(pool: &PgPool, mode: Mode) -> Served {
    let overrides = match mode {
        Mode::Request => json!({}),
        Mode::Header => json!({"http_identity": "header", "http_user_header": PROXY_HEADER}),
        Mode::Key => json!({"http_identity": "key", "http_token": TOKEN}),
    };
    let s = settings(overrides);
    let config = kvmem::memory::MemoryConfig::from_settings(&s).unwrap();
    let memory = kvmem::system::memory_service_on(pool.clone(), config, None);
    let worker = echo_deps(pool, s.clone(), "w-identity");
    let state = crate::common::http_state(pool.clone(), Arc::new(s), "ab".repeat(32))
        .with_memory(Arc::new(memory))
        .with_snapshots(
            kvmem::system::snapshot_store(
                &settings(json!({"kv_dir": std::env::temp_dir().join("kvmem-identity-kv")})),
                &kvmem::metrics::Metrics::new(),
            )
            .unwrap(),
        );
    serve(state, Some(worker)).await
}

fn no_leak(what: &str, text: &str) {
    assert!(!text.contains("4417"), "{what} leaks alice's data: {text}");
}

#[sqlx::test(migrations = false)]
async fn no_route_serves_a_user_the_caller_only_claims(pool: PgPool) {
    migrate(&pool).await;
    let a_char = character(&pool, "alice", "Ada").await;
    let b_char = character(&pool, "bob", "Bo").await;
    queue::enqueue(&pool, A_SESSION, "alice", a_char, SECRET, None)
        .await
        .unwrap();
    drain(&echo_deps(&pool, settings(json!({})), "w-fill")).await;
    let (_, key) = kvmem::keys::create(&pool, "bob", "laptop").await.unwrap();
    let client = reqwest::Client::new();

    for mode in [Mode::Request, Mode::Header, Mode::Key] {
        let server = serve_mode(&pool, mode).await;
        let bob = Bob {
            mode,
            key: key.clone(),
        };
        let refused = if mode == Mode::Request { 400 } else { 403 };
        for route in routes(b_char) {
            let what = format!("{mode:?} {} {}", route.method, route.path);
            let turns_before: i64 = sqlx::query_scalar("SELECT count(*) FROM turns")
                .fetch_one(&pool)
                .await
                .unwrap();
            let r = request(&client, &server.base, &route, &bob, Some("alice"), a_char)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), refused, "{what} with alice claimed");
            no_leak(&what, &r.text().await.unwrap());
            let turns_after: i64 = sqlx::query_scalar("SELECT count(*) FROM turns")
                .fetch_one(&pool)
                .await
                .unwrap();
            assert_eq!(
                turns_before, turns_after,
                "{what}: a refused request queued"
            );

            // Without the claim: served as bob, who has no such session or character of
            // alice's to see (404 where the route takes alice's, else 200), and no leak.
            let r = request(&client, &server.base, &route, &bob, None, a_char)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            assert!(
                matches!(status, 200 | 201 | 404),
                "{what} as bob alone: {status}"
            );
            no_leak(&format!("{what} as bob"), &r.text().await.unwrap());
        }
        drop(server);
    }

    // Alice's data is all still there: nothing above erased or changed it.
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM turns WHERE user_id = 'alice'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 1);
    let persona: String = sqlx::query_scalar("SELECT persona FROM user_characters WHERE id = $1")
        .bind(a_char)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_ne!(persona, "rewritten", "alice's character is untouched");
}

#[sqlx::test(migrations = false)]
async fn each_mode_takes_the_user_only_from_its_sources(pool: PgPool) {
    migrate(&pool).await;
    character(&pool, "alice", "Ada").await;
    character(&pool, "bob", "Bo").await;
    let client = reqwest::Client::new();
    let models = |base: &str| client.get(format!("{base}/v1/models"));
    let names = |v: Value| -> Vec<String> {
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    };

    // A backend: the body, the query or the header, and two that agree are one.
    let server = serve_mode(&pool, Mode::Request).await;
    let r = models(&server.base)
        .header("x-user-id", "bob")
        .send()
        .await
        .unwrap();
    assert_eq!(names(r.json().await.unwrap()), ["Bo"]);
    let r = models(&server.base)
        .query(&[("user", "bob")])
        .header("x-user-id", "bob")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "agreeing sources are one user");
    let r = models(&server.base).send().await.unwrap();
    assert_eq!(
        names(r.json().await.unwrap()),
        Vec::<String>::new(),
        "no user: the public ones, none here"
    );
    let long = "u".repeat(300);
    let r = models(&server.base)
        .query(&[("user", long.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        400,
        "a user id past the limit is the caller's error"
    );
    assert!(r.text().await.unwrap().contains("limit"));
    drop(server);

    // A proxy: the header alone; a body or query user, even with no header, is refused.
    let server = serve_mode(&pool, Mode::Header).await;
    let r = models(&server.base)
        .header(PROXY_HEADER, "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(names(r.json().await.unwrap()), ["Ada"]);
    let r = models(&server.base)
        .query(&[("user", "alice")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a query user without the proxy's header");
    let r = models(&server.base)
        .query(&[("user", "alice")])
        .header(PROXY_HEADER, "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the same user in both");
    let r = models(&server.base)
        .header("x-user-id", "alice")
        .send()
        .await
        .unwrap();
    assert_eq!(
        names(r.json().await.unwrap()),
        Vec::<String>::new(),
        "the default header means nothing to a proxy's server: no user, no own characters"
    );
    drop(server);

    // Keys: a key is its user; the service token serves a backend; a revoked or unknown
    // key, or none, is 401; a user's key cannot read the fleet's metrics.
    let url = db_url(&pool).await;
    let out = kvmem_command(&url)
        .args(["keys", "create", "--user", "alice", "--label", "phone"])
        .output()
        .unwrap();
    assert_success(&out);
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(key.starts_with(kvmem::keys::KEY_PREFIX), "{key}");
    let server = serve_mode(&pool, Mode::Key).await;
    let r = models(&server.base).bearer_auth(&key).send().await.unwrap();
    assert_eq!(names(r.json().await.unwrap()), ["Ada"]);
    let r = models(&server.base)
        .bearer_auth(TOKEN)
        .query(&[("user", "bob")])
        .send()
        .await
        .unwrap();
    assert_eq!(
        names(r.json().await.unwrap()),
        ["Bo"],
        "the service token as a backend"
    );
    let r = client
        .get(format!("{}/metrics", server.base))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    for wrong in [format!("{key}0"), String::new()] {
        let r = models(&server.base)
            .bearer_auth(&wrong)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{wrong:?}");
    }
    let r = models(&server.base).send().await.unwrap();
    assert_eq!(r.status(), 401, "no credential");

    // Stored hashed: no column of the key's row holds the key or its secret part.
    let row: String = sqlx::query_scalar("SELECT to_jsonb(k)::text FROM api_keys k")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        !row.contains(&key[kvmem::keys::KEY_PREFIX.len() + 8..]),
        "{row}"
    );
    let out = kvmem_command(&url)
        .args(["keys", "list", "--user", "alice", "--json"])
        .output()
        .unwrap();
    assert_success(&out);
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["label"], "phone");
    assert!(
        !listed.to_string().contains(&key),
        "list never shows the key"
    );
    let id = listed[0]["id"].as_i64().unwrap();
    let out = kvmem_command(&url)
        .args(["keys", "revoke", &id.to_string()])
        .output()
        .unwrap();
    assert_success(&out);
    let r = models(&server.base).bearer_auth(&key).send().await.unwrap();
    assert_eq!(r.status(), 401, "a revoked key");
    let out = kvmem_command(&url)
        .args(["keys", "revoke", "999999"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no key with id 999999"));
}
