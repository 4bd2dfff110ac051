-- Is the character the user's? $1 user, $2 character id.
SELECT EXISTS (SELECT 1 FROM user_characters WHERE id = $2 AND user_id = $1)
