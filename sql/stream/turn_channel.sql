-- A turn's stream channel, as the SQL API names it. $1 turn id.
SELECT kvmem_turn_channel($1)
