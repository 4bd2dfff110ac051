-- Announces a turn that ended without a reply (failed or dead) on kvmem_turn_done.
SELECT kvmem_notify_turn_done($1, $2, $3)
