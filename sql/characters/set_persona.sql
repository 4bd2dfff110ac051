-- A chat request's system message becomes the character's persona (http.system_message =
-- persona), exactly as an edit of the row would: the next turn's base prompt is built from
-- it, and a snapshot made under the old one is refused and rebuilt. Only the caller's own
-- character, and only when the text changed, so a repeated system prompt writes nothing.
UPDATE user_characters
   SET persona = $3, updated_at = now()
 WHERE id = $1 AND user_id = $2 AND persona IS DISTINCT FROM $3
