//! `kvmem migrate --status`: which migrations the database holds, which this binary would
//! apply, and which a newer release applied (with whether this binary may run on them), so
//! an operator sees where a fleet's upgrade stands before restarting anything.

use std::fmt::Write;

use sqlx::PgPool;

use crate::db::{DbError, SchemaState};

/// Reads the schema's state (migrating nothing) and renders it.
pub async fn status(pool: &PgPool) -> Result<String, DbError> {
    Ok(render(&SchemaState::read(pool).await?))
}

/// One line per migration, then a verdict naming what to do.
pub fn render(state: &SchemaState) -> String {
    let mut out = String::new();
    for m in &state.applied {
        let how = if m.success { "" } else { "  FAILED half-way" };
        let _ = writeln!(
            out,
            "applied  {}  {}  {}{how}",
            m.version,
            m.installed_on.format("%Y-%m-%d %H:%M:%S"),
            m.description
        );
    }
    for (version, description) in &state.pending {
        let kind = kind(description);
        let _ = writeln!(
            out,
            "pending  {version}  {:19}  {description}  ({kind})",
            ""
        );
    }
    for m in &state.newer {
        let _ = writeln!(
            out,
            "newer    {}  {}  {}  ({})",
            m.version,
            m.installed_on.format("%Y-%m-%d %H:%M:%S"),
            m.description,
            kind(&m.description)
        );
    }
    let _ = writeln!(out, "{}", verdict(state));
    out
}

/// Whether the previous release's workers run on a schema with this migration applied.
fn kind(description: &str) -> &'static str {
    if crate::db::is_additive(description) {
        "additive"
    } else {
        "NOT additive"
    }
}

fn verdict(state: &SchemaState) -> String {
    if let Err(e) = state.check_runnable() {
        return format!("schema: this binary does not run on it: {e}");
    }
    match (state.pending.len(), state.newer.len()) {
        (0, 0) => "schema: current (every migration of this binary is applied)".into(),
        (0, n) => format!(
            "schema: newer than this binary by {n} additive migration(s): its workers and \
             commands run on it"
        ),
        (n, _) => format!(
            "schema: behind this binary by {n} migration(s): `kvmem migrate` applies them \
             (read-only commands refuse until then)"
        ),
    }
}
