//! The HUD: the character's self-state in one line, present on every turn and removed from
//! the KV afterwards, so it informs each reply without piling up in the cache.

use sqlx::{FromRow, PgPool};

use crate::context::tokens::TokenCount;

/// Shown when the character row cannot be read; the turn still runs.
pub const MINIMAL_HUD: &str = "HUD: status unavailable";

/// One row of seed 000's HUD query.
#[derive(Debug, Clone, FromRow, PartialEq)]
pub struct HudRow {
    pub name: String,
    pub persona: String,
    pub current_health: i32,
    pub max_health: i32,
    pub wallet: i64,
    pub stress_level: i32,
    pub team_trust: i32,
    pub adherence: i32,
    pub equipment: String,
}

/// Reads the HUD fields, scoped by character and user.
pub async fn fetch(
    pool: &PgPool,
    character_id: i64,
    user_id: &str,
) -> Result<Option<HudRow>, sqlx::Error> {
    sqlx::query_as::<_, HudRow>(include_str!("../../sql/hud/fetch.sql"))
        .bind(character_id)
        .bind(user_id)
        .fetch_optional(pool)
        .await
}

/// Seed 000's exact rendering.
pub fn render(row: &HudRow) -> String {
    render_with_equipment(row, &row.equipment)
}

fn render_with_equipment(row: &HudRow, equipment: &str) -> String {
    format!(
        "HUD: HP {}/{} • Credits: {} • Stress: {} • Trust: {} • Adherence: {}% • Equip: {}",
        row.current_health,
        row.max_health,
        row.wallet,
        row.stress_level,
        row.team_trust,
        row.adherence,
        equipment
    )
}

/// Renders within `max_tokens`. Over budget, the equipment name (the only free text) is
/// shortened first, character by character; if the numbers alone are still too long the
/// line is cut at a token boundary. Both steps are deterministic.
pub fn render_within(row: &HudRow, max_tokens: usize, tok: &dyn TokenCount) -> String {
    let full = render(row);
    if tok.count(&full) <= max_tokens {
        return full;
    }
    let chars: Vec<char> = row.equipment.chars().collect();
    for keep in (0..chars.len()).rev() {
        let short: String = chars[..keep].iter().collect::<String>() + "…";
        let line = render_with_equipment(row, &short);
        if tok.count(&line) <= max_tokens {
            return line;
        }
    }
    tok.truncate(&render_with_equipment(row, "…"), max_tokens)
}

/// The HUD line for a turn, never failing: errors and missing rows give the minimal HUD.
pub fn line_or_minimal(
    fetched: &Result<Option<HudRow>, sqlx::Error>,
    max_tokens: usize,
    tok: &dyn TokenCount,
) -> String {
    match fetched {
        Ok(Some(row)) => render_within(row, max_tokens, tok),
        Ok(None) => {
            tracing::error!("HUD: character not found for this user; using the minimal HUD");
            MINIMAL_HUD.to_string()
        }
        Err(e) => {
            tracing::error!(error = %e, "HUD query failed; using the minimal HUD");
            MINIMAL_HUD.to_string()
        }
    }
}
