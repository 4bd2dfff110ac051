-- Queues one turn through the public SQL API.
SELECT kvmem_enqueue_turn($1, $2, $3, $4, $5, $6, $7)
