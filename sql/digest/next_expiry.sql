-- The earliest moment a stored digest expires (wakes the rebuilder).
SELECT min(next_expiry_at) FROM state_digest WHERE next_expiry_at IS NOT NULL
