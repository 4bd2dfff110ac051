-- Demo: the scene's character.
INSERT INTO user_characters (user_id, name, persona, current_health, max_health, wallet,
    stress_level, team_trust, mental_health, battle_focus, primary_equipment_id)
VALUES ($1, 'Captain Vega', 'A calm starship captain who speaks in short sentences.',
        82, 100, 1250, 35, 70, 60, 65, $2) RETURNING id
