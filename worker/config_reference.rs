//! docs/configuration.md's table of settings is checked against the code, so the reference
//! cannot drift: every field of `Settings` has one row, and each row's default, env var and
//! per-profile values are what `config/` and the code give.

use std::collections::BTreeMap;

use figment::providers::{Format, Toml};
use figment::Figment;
use serde_json::Value;

use crate::config::Settings;

const HEADER: &str = "| setting | type | default | env | demo | test | production |";
const PROFILES: [&str; 3] = ["demo", "test", "production"];
/// Read from the environment under their own names (the core specification's).
const PLAIN_ENV: &[&str] = &[
    "kv_only_enabled",
    "kv_tail_tokens",
    "n_ctx",
    "reply_max_tokens",
    "digest_max_tokens",
    "hud_max_tokens",
    "model_sha",
    "kv_compress",
    "database_url",
    "memory_max_tokens",
    "summary_max_tokens",
];

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The reference's rows: setting → its cells after the name (type, default, env, profiles).
fn reference() -> BTreeMap<String, Vec<String>> {
    let page = std::fs::read_to_string(root().join("docs/configuration.md")).expect("the page");
    let mut lines = page.lines().skip_while(|l| l.trim() != HEADER).skip(2);
    let mut rows = BTreeMap::new();
    for line in lines.by_ref().take_while(|l| l.starts_with('|')) {
        let inner = line.trim();
        let inner = inner.strip_prefix('|').unwrap_or(inner);
        let inner = inner.strip_suffix('|').unwrap_or(inner);
        let cells: Vec<String> = inner
            .split('|')
            .map(|c| c.trim().trim_matches('`').to_string())
            .collect();
        assert_eq!(cells.len(), 7, "a row with {} cells: {line}", cells.len());
        let dup = rows.insert(cells[0].clone(), cells[1..].to_vec());
        assert!(dup.is_none(), "{} has two rows", cells[0]);
    }
    assert!(!rows.is_empty(), "no table under {HEADER:?}");
    rows
}

/// The fields of `Settings`, read from its definition (secrets are never serialized, so
/// the struct's source is the one list that holds them all).
fn fields() -> Vec<String> {
    let src = std::fs::read_to_string(root().join("worker/config.rs")).expect("config.rs");
    let body = src
        .split("pub struct Settings {")
        .nth(1)
        .and_then(|rest| rest.split("\n}").next())
        .expect("Settings' definition");
    body.lines()
        .filter_map(|l| l.trim().strip_prefix("pub "))
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim().to_string()))
        .collect()
}

/// A cell written as TOML writes the value (`unset` for none).
fn cell_value(cell: &str) -> Option<Value> {
    if cell == "unset" {
        return None;
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let cell = cell.replace("$HOME", &home);
    Some(
        Figment::from(Toml::string(&format!("v = {cell}")))
            .extract_inner::<Value>("v")
            .unwrap_or_else(|e| panic!("{cell:?} is not a TOML value: {e}")),
    )
}

fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-6 * x.abs().max(1.0),
        _ => a == b,
    }
}

#[test]
fn the_configuration_reference_matches_the_code() {
    let rows = reference();
    let fields = fields();
    for f in &fields {
        assert!(rows.contains_key(f), "{f} is not in docs/configuration.md");
    }
    for name in rows.keys() {
        assert!(
            fields.contains(name),
            "docs/configuration.md names {name}, which the code has not"
        );
    }
    let defaults = serde_json::to_value(Settings::defaults()).expect("settings as JSON");
    for (name, cells) in &rows {
        let env = if PLAIN_ENV.contains(&name.as_str()) {
            name.to_uppercase()
        } else {
            format!("KVMEM_{}", name.to_uppercase())
        };
        assert_eq!(cells[2], env, "{name}'s environment variable");
        // Secrets are never serialized: their default can only be unset.
        let code = defaults.get(name).filter(|v| !v.is_null());
        match (cell_value(&cells[1]), code) {
            (None, None) => {}
            (Some(doc), Some(code)) if same(&doc, code) => {}
            (doc, code) => panic!("{name}: the reference says {doc:?}, the code {code:?}"),
        }
    }
    for (i, profile) in PROFILES.iter().enumerate() {
        let file = root().join(format!("config/{profile}.toml"));
        let set: BTreeMap<String, Value> = Figment::from(Toml::file(&file))
            .extract()
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (name, cells) in &rows {
            let doc = &cells[3 + i];
            match set.get(name) {
                None => assert!(doc.is_empty(), "{name}: {profile}.toml does not set it"),
                Some(v) => {
                    let d = cell_value(doc).unwrap_or(Value::Null);
                    assert!(
                        same(&d, v),
                        "{name} in {profile}.toml is {v}, the reference {doc:?}"
                    );
                }
            }
        }
        for name in set.keys() {
            assert!(
                rows.contains_key(name),
                "{profile}.toml sets {name}, not in the reference"
            );
        }
    }
}
