-- Is the character public (anyone may talk to it)? $1 character id.
SELECT EXISTS (SELECT 1 FROM user_characters WHERE id = $1 AND public)
