//! Every runtime statement against the migrated schema: the worker loads its SQL from
//! `sql/` as text, so without this a renamed or retyped column would first fail in a
//! running worker. Postgres parses and plans each statement on `prepare`, which checks
//! every table, column, function and parameter type it names.

use crate::common;

use std::path::{Path, PathBuf};

use kvmem::memory::columns::{self, Columns};
use sqlx::{Executor, PgPool};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The statements a source file loads: each `include_str!` of a `.sql` file, resolved from
/// its folder, or the files a `concat!` joins into one statement.
fn included_sql(source: &Path) -> Vec<Vec<PathBuf>> {
    let text = std::fs::read_to_string(source).unwrap();
    let dir = source.parent().unwrap();
    let mut units = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let rest = &text[at..];
        let next_concat = rest.find("concat!(");
        let next_include = rest.find("include_str!(");
        match (next_concat, next_include) {
            (Some(c), Some(i)) if c < i => {
                let start = at + c + "concat!(".len();
                let end = start + closing_paren(&text[start..]);
                let joined = sql_paths(dir, &text[start..end], source);
                if !joined.is_empty() {
                    units.push(joined);
                }
                at = end;
            }
            (_, Some(i)) => {
                let start = at + i;
                let end = start
                    + "include_str!(".len()
                    + closing_paren(&text[start + "include_str!(".len()..]);
                units.extend(
                    sql_paths(dir, &text[start..end], source)
                        .into_iter()
                        .map(|p| vec![p]),
                );
                at = end;
            }
            _ => break,
        }
    }
    units
}

/// Where the parenthesis opened just before `text` closes.
fn closing_paren(text: &str) -> usize {
    let mut depth = 1;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced parenthesis");
}

/// The `.sql` paths of the `include_str!`s in `text`, resolved from `dir`.
fn sql_paths(dir: &Path, text: &str, source: &Path) -> Vec<PathBuf> {
    text.split("include_str!(")
        .skip(1)
        .filter_map(|arg| {
            let body = arg.trim_start().strip_prefix('"')?;
            let path = &body[..body.find('"')?];
            path.ends_with(".sql").then(|| {
                dir.join(path)
                    .canonicalize()
                    .unwrap_or_else(|e| panic!("{} includes {path}: {e}", source.display()))
            })
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn sql_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sql_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "sql") {
            out.push(path.canonicalize().unwrap());
        }
    }
}

/// `sql/api`, `sql/views` and `sql/memory/api.sql` are scripts of several statements that
/// `db::migrate` runs whole; the migration in this test already ran them.
fn run_by_migrate(path: &Path) -> bool {
    let rel = path
        .strip_prefix(Path::new(ROOT).canonicalize().unwrap())
        .unwrap();
    rel.starts_with("sql/api")
        || rel.starts_with("sql/views")
        || rel == Path::new("sql/memory/api.sql")
}

#[sqlx::test(migrations = false)]
async fn every_statement_the_worker_loads_prepares_against_the_migrated_schema(pool: PgPool) {
    common::migrate(&pool).await;
    let mut sources = Vec::new();
    rust_files(&Path::new(ROOT).join("worker"), &mut sources);
    let mut units: Vec<Vec<PathBuf>> = sources.iter().flat_map(|s| included_sql(s)).collect();
    units.sort();
    units.dedup();
    let loaded: Vec<&PathBuf> = units.iter().flatten().collect();

    let mut on_disk = Vec::new();
    sql_files(&Path::new(ROOT).join("sql"), &mut on_disk);
    on_disk.sort();
    let unused: Vec<_> = on_disk.iter().filter(|p| !loaded.contains(p)).collect();
    assert!(
        unused.is_empty(),
        "sql files no worker code loads: {unused:?}"
    );

    let mut failures = Vec::new();
    let mut prepared = 0;
    let mut prepared_wide = 0;
    for unit in units
        .iter()
        .filter(|u| !u.iter().any(|p| run_by_migrate(p)))
    {
        let sql: String = unit
            .iter()
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect();
        match (&pool).prepare(sql.as_str()).await {
            Ok(_) => prepared += 1,
            Err(e) => failures.push(format!("{unit:?}: {e}")),
        }
        // A statement over message vectors runs on the 768-wide columns too.
        if sql.contains(columns::MARK) {
            let wide = Columns::WIDE.sql(Box::leak(sql.into_boxed_str()));
            match (&pool).prepare(wide).await {
                Ok(_) => prepared_wide += 1,
                Err(e) => failures.push(format!("{unit:?}, 768 wide: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The scan itself could silently find nothing (a moved folder, a new macro form).
    assert!(prepared > 100, "only {prepared} statements found");
    assert!(
        prepared_wide >= 16,
        "only {prepared_wide} statements over message vectors found"
    );
}
