//! docs/configuration.md's table of settings is checked against the code, so the reference
//! cannot drift: every field of every section of `Settings` has one row, and each row's
//! flat key, type, default, env var and per-profile values are what `config/` and the code
//! give.

use std::collections::BTreeMap;

use figment::providers::{Format, Toml};
use figment::Figment;
use serde_json::Value;

use crate::config::keys::{self, Sectioned, FLAT_KEYS};
use crate::config::Settings;

const HEADER: &str = "| setting | flat key | type | default | env | demo | test | production |";
const PROFILES: [&str; 3] = ["demo", "test", "production"];

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
        assert_eq!(cells.len(), 8, "a row with {} cells: {line}", cells.len());
        let dup = rows.insert(cells[0].clone(), cells[1..].to_vec());
        assert!(dup.is_none(), "{} has two rows", cells[0]);
    }
    assert!(!rows.is_empty(), "no table under {HEADER:?}");
    rows
}

/// Every `section.field` of `Settings` with its type, read from the structs' definitions
/// (secrets are never serialized, so the source is the one list that holds them all).
fn fields() -> Vec<(String, String)> {
    let src = std::fs::read_to_string(root().join("worker/config/settings.rs")).expect("source");
    let members = |name: &str| -> Vec<(String, String)> {
        let body = src
            .split(&format!("pub struct {name} {{"))
            .nth(1)
            .and_then(|rest| rest.split("\n}").next())
            .unwrap_or_else(|| panic!("{name}'s definition"));
        body.lines()
            .filter_map(|l| l.trim().strip_prefix("pub "))
            .filter_map(|l| l.split_once(':'))
            .map(|(name, ty)| {
                (
                    name.trim().to_string(),
                    ty.trim().trim_end_matches(',').to_string(),
                )
            })
            .collect()
    };
    members("Settings")
        .into_iter()
        .flat_map(|(section, ty)| {
            members(&ty)
                .into_iter()
                .map(move |(field, ty)| (format!("{section}.{field}"), ty))
        })
        .collect()
}

/// A profile's file as `section.field` → value, read as the worker reads it (flat keys too).
fn profile(name: &str) -> BTreeMap<String, Value> {
    let file = root().join(format!("config/{name}.toml"));
    let sections: BTreeMap<String, BTreeMap<String, Value>> =
        Figment::from(Sectioned::file(Toml::file(&file)))
            .extract()
            .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut set = BTreeMap::new();
    for (section, fields) in sections {
        for (field, value) in fields {
            set.insert(format!("{section}.{field}"), value);
        }
    }
    set
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
    for (f, ty) in &fields {
        let row = rows
            .get(f)
            .unwrap_or_else(|| panic!("{f} is not in docs/configuration.md"));
        assert_eq!(&row[1], ty, "{f}'s type");
    }
    for name in rows.keys() {
        assert!(
            fields.iter().any(|(f, _)| f == name),
            "docs/configuration.md names {name}, which the code has not"
        );
    }
    let defaults = serde_json::to_value(Settings::defaults()).expect("settings as JSON");
    for (name, cells) in &rows {
        let flat = FLAT_KEYS.iter().find(|(_, nested)| nested == name);
        assert_eq!(
            flat.map(|(f, _)| *f),
            Some(cells[0].as_str()),
            "{name}'s flat key"
        );
        assert_eq!(
            Some(&cells[3]),
            keys::env_var(name).as_ref(),
            "{name}'s environment variable"
        );
        // Secrets are never serialized: their default can only be unset.
        let code = defaults
            .pointer(&format!("/{}", name.replace('.', "/")))
            .filter(|v| !v.is_null());
        match (cell_value(&cells[2]), code) {
            (None, None) => {}
            (Some(doc), Some(code)) if same(&doc, code) => {}
            (doc, code) => panic!("{name}: the reference says {doc:?}, the code {code:?}"),
        }
    }
    for (i, name) in PROFILES.iter().enumerate() {
        let set = profile(name);
        for (setting, cells) in &rows {
            let doc = &cells[4 + i];
            match set.get(setting) {
                None => assert!(doc.is_empty(), "{setting}: {name}.toml does not set it"),
                Some(v) => {
                    let d = cell_value(doc).unwrap_or(Value::Null);
                    assert!(
                        same(&d, v),
                        "{setting} in {name}.toml is {v}, the reference {doc:?}"
                    );
                }
            }
        }
        for setting in set.keys() {
            assert!(
                rows.contains_key(setting),
                "{name}.toml sets {setting}, not in the reference"
            );
        }
    }
}
