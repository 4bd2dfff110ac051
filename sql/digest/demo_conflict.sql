-- Demo: the conflict that starts before turn 4.
INSERT INTO facts (session_id, type, key, value, status, started_at, updated_at)
VALUES ($1, 'conflict', 'merchant_war', 'War with Merchant Guild over trade routes', 'active', NOW(), NOW())
