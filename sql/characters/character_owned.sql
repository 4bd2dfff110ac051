-- Whether the user may talk to the character: their own, or a public one (anything else is
-- reported like a missing one). $1 character, $2 user.
SELECT EXISTS (SELECT 1 FROM user_characters WHERE id = $1 AND (user_id = $2 OR public))
