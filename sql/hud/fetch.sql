-- Seed 000's HUD query, scoped by character AND user: one user never sees another's own
-- character; a public one is everyone's (its stats are the character's, not a user's).
-- $1 character id, $2 user id.
SELECT uc.name,
       uc.persona,
       uc.current_health,
       uc.max_health,
       uc.wallet,
       uc.stress_level,
       uc.team_trust,
       round(GREATEST(0, LEAST(100,
           (100 - uc.stress_level * 0.3)
           + (uc.team_trust - 50) * 0.1
           + (uc.mental_health - 50) * 0.2
           + (uc.battle_focus - 50) * 0.15
       )))::integer AS adherence,
       COALESCE(e.equipment_name, 'Unarmed') AS equipment
  FROM user_characters uc
  LEFT JOIN equipment e ON uc.primary_equipment_id = e.id
 WHERE uc.id = $1 AND (uc.user_id = $2 OR uc.public)
